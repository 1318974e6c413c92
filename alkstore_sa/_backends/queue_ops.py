"""Queue statements: enqueue, claim, the handle transitions, cancel, reads, dead-letter requeue, sweep."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..errors import DatabaseError
from ..schema import dead_jobs, jobs
from .core import Core
from .sql import (
    DEAD_COLUMNS,
    EMPTY_ERRORS,
    LIVE_COLUMNS,
    ONE,
    PENDING,
    PROCESSING,
    ZERO,
    Executor,
    bp,
)

# A unique enqueue that finds the key held, and then no holder, ran between the holder's
# insert and its removal; each round is a fresh attempt, and this many in a row means
# something keeps enqueueing and acking that key faster than one statement runs.
UNIQUE_ROUNDS = 50


class _KeyHeld(Exception):
    """Internal: ends a requeue's transaction (undoing its take) when a live job holds the
    dead job's key; never leaves this module."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id


class QueueOps(Core):
    """Queue statements: enqueue, claim, the handle transitions, cancel, reads, dead-letter requeue, sweep."""

    # -- enqueue ---------------------------------------------------------------------------

    def _enqueue_values(self, payload: Any) -> dict[str, Any]:
        now = self.now()
        return {
            "queue": bp("queue", sa.Text),
            "state": PENDING,
            "payload": payload,
            "priority": bp("priority", sa.Integer),
            "attempts": ZERO,
            "max_attempts": bp("max_attempts", sa.Integer),
            "visibility_timeout": bp("visibility_timeout", sa.Double),
            "backoff_base": bp("backoff_base", sa.Double),
            "dead_letter_retention": sa.cast(bp("dead_letter_retention", sa.Double), sa.Double),
            "created_at": now,
            # delay wins over run_at; neither means now
            "run_at": sa.func.coalesce(
                now + sa.cast(bp("delay", sa.Double), sa.Double),
                sa.cast(bp("run_at", sa.Double), sa.Double),
                now,
            ),
            "expires_at": now + sa.cast(bp("expires", sa.Double), sa.Double),
            "errors": EMPTY_ERRORS,
        }

    def enqueue(self, ex: Executor, params: Mapping[str, Any]) -> int:
        if "unique_key" in params:
            return self.enqueue_unique(ex, params)[0]
        sql = self.sql(
            "enqueue",
            lambda: self._with_wake(
                sa.insert(jobs).values(self._enqueue_values(bp("payload", sa.Text))).returning(jobs.c.id)
            ),
        )
        return ex.rows(sql, params)[0][0]

    def enqueue_unique(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, bool]:
        """Enqueue a job holding ``:unique_key`` unless a live job of the queue holds it:
        ``(id, inserted)`` — the new job's id, or the holder's (nothing written, no wake).

        The partial unique index on live rows decides, so concurrent enqueues of one key
        make one job; an insert that meets an uncommitted holder waits for its transaction
        to end. The holder's id is read after the insert conflicted; a holder acked in
        between is simply gone, and the next round inserts.
        """
        insert = self.sql("enqueue:unique", self._unique_insert)
        held = self.sql(
            "enqueue:held",
            lambda: sa.select(jobs.c.id, sa.false().label("inserted")).where(
                jobs.c.queue == bp("queue", sa.Text), jobs.c.unique_key == bp("unique_key", sa.Text)
            ),
        )
        for _ in range(UNIQUE_ROUNDS):
            rows = ex.rows(insert, params) or ex.rows(held, params)
            if rows:
                return int(rows[0][0]), bool(rows[0][1])
        raise DatabaseError(
            f"enqueue with unique_key {params['unique_key']!r}: the key's live job changed "
            f"{UNIQUE_ROUNDS} times during the enqueue; nothing was written"
        )

    def _unique_insert(self) -> sa.Executable:
        """The enqueue INSERT that yields to a live holder of the key: ``(id, true)`` when
        it inserted, no row when the key is held (PostgreSQL adds the wake and the holder's
        id to the same statement)."""
        values = self._enqueue_values(bp("payload", sa.Text))
        values["unique_key"] = bp("unique_key", sa.Text)
        return (
            self.upsert(jobs)
            .values(values)
            .on_conflict_do_nothing(
                index_elements=[jobs.c.queue, jobs.c.unique_key],
                index_where=jobs.c.unique_key.is_not(None),
            )
            .returning(jobs.c.id, sa.true().label("inserted"))
        )

    @abc.abstractmethod
    def enqueue_many(self, ex: Executor, params: Mapping[str, Any], payloads: list[str]) -> list[int]:
        """Insert one job per payload text in one statement; ids in payload order."""

    def _enqueue_many_from(self, value: Any, order: Any) -> sa.Executable:
        """INSERT … SELECT of one job per ``value`` of a table-valued source, in ``order``."""
        values = self._enqueue_values(value)
        return self._with_wake(
            sa.insert(jobs)
            .from_select(list(values), sa.select(*values.values()).order_by(order))
            .returning(jobs.c.id)
        )

    # -- claim -----------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Move exhausted reclaimables to dead, then claim up to ``:n`` jobs, atomically."""

    def _claimable(self, t: Any = jobs, now: Any = None) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The two candidate scans, each an ordered index range: ready pending rows, and
        processing rows whose claim lapsed with attempts left (reclaims). ``t`` may be an
        alias of the jobs table and ``now`` a reference to the statement's one clock
        reading (shorter SQL: see PostgresBackend.claim)."""
        now = self.now() if now is None else now
        order = (t.c.priority.desc(), t.c.run_at, t.c.id)
        cols = (t.c.id, t.c.priority, t.c.run_at)
        queue = t.c.queue == bp("queue", sa.Text)
        pending = (
            sa.select(*cols)
            .where(queue, t.c.state == PENDING, t.c.run_at <= now, self.not_expired(t, now))
            .order_by(*order)
        )
        lapsed = (
            sa.select(*cols)
            .where(
                queue,
                t.c.state == PROCESSING,
                t.c.claim_expires_at <= now,
                t.c.attempts < t.c.max_attempts,
                self.not_expired(t, now),
            )
            .order_by(*order)
        )
        return self.limit(pending, "n"), self.limit(lapsed, "n")

    def _exhausted(self, t: Any = jobs, now: Any = None) -> sa.ColumnElement[bool]:
        """Reclaimable rows that already used every attempt: they go dead before a claim."""
        now = self.now() if now is None else now
        return sa.and_(
            t.c.queue == bp("queue", sa.Text),
            t.c.state == PROCESSING,
            t.c.claim_expires_at <= now,
            t.c.attempts >= t.c.max_attempts,
            self.not_expired(t, now),
        )

    def _claim_values(self, t: Any = jobs, now: Any = None) -> dict[str, Any]:
        now = self.now() if now is None else now
        return {
            "state": PROCESSING,
            "attempts": t.c.attempts + ONE,
            "claimed_at": now,
            "claim_expires_at": now + t.c.visibility_timeout,
            "worker_id": bp("worker_id", sa.Text),
        }

    # -- handle transitions ----------------------------------------------------------------

    def ack(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql("ack", lambda: sa.delete(jobs).where(self.this_claim()))
        return ex.rowcount(sql, params) == 1

    def heartbeat(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql(
            "heartbeat",
            lambda: sa.update(jobs)
            .where(self.this_claim())
            .values(claim_expires_at=self.now() + sa.cast(bp("extend", sa.Double), sa.Double)),
        )
        return ex.rowcount(sql, params) == 1

    def retry(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql(
            "retry",
            lambda: sa.update(jobs)
            .where(self.this_claim())
            .values(
                state=PENDING,
                run_at=self.now() + sa.cast(bp("delay", sa.Double), sa.Double),
                claim_expires_at=sa.null(),
                errors=self.append_error(jobs.c.errors, jobs.c.attempts),
            ),
        )
        return ex.rowcount(sql, params) == 1

    @abc.abstractmethod
    def bury(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Move one claimed job to dead (fail, or retry at budget), atomically."""

    # -- queue operations ------------------------------------------------------------------

    @abc.abstractmethod
    def ack_batch(self, ex: Executor, params: Mapping[str, Any]) -> int:
        """Delete each of ``:ids`` processing under an unexpired claim in ``:queue``."""

    @abc.abstractmethod
    def ack_claims(self, ex: Executor, params: Mapping[str, Any]) -> int:
        """Delete each job of ``:ids`` still under the claim of the matching ``:attempts``
        (processing, unexpired, in ``:queue``): the batch form of the handle's ack."""

    def _ack_batch(self, id_match: sa.ColumnElement[bool]) -> sa.Executable:
        return sa.delete(jobs).where(
            id_match,
            jobs.c.queue == bp("queue", sa.Text),
            jobs.c.state == PROCESSING,
            jobs.c.claim_expires_at > self.now(),
        )

    def cancel(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql(
            "cancel",
            lambda: sa.delete(jobs).where(
                jobs.c.id == bp("id", sa.BigInteger), jobs.c.queue == bp("queue", sa.Text)
            ),
        )
        return ex.rowcount(sql, params) == 1

    def get_job(self, ex: Executor, params: Mapping[str, Any], *, by_queue: bool) -> tuple[Any, ...] | None:
        def build() -> sa.Executable:
            null = sa.null()
            live = sa.select(*LIVE_COLUMNS, null, null).where(jobs.c.id == bp("id", sa.BigInteger))
            dead = sa.select(*DEAD_COLUMNS).where(dead_jobs.c.id == bp("id", sa.BigInteger))
            if by_queue:
                live = live.where(jobs.c.queue == bp("queue", sa.Text))
                dead = dead.where(dead_jobs.c.queue == bp("queue", sa.Text))
            return sa.union_all(live, dead)

        rows = ex.rows(self.sql(f"get_job:{by_queue}", build), params)
        return rows[0] if rows else None

    def dead_jobs(self, ex: Executor, params: Mapping[str, Any], *, before: bool) -> list[tuple[Any, ...]]:
        def build() -> sa.Executable:
            stmt = sa.select(*DEAD_COLUMNS).where(dead_jobs.c.queue == bp("queue", sa.Text))
            if before:
                stmt = stmt.where(dead_jobs.c.id < bp("before_id", sa.BigInteger))
            return self.limit(stmt.order_by(dead_jobs.c.id.desc()), "limit")

        return ex.rows(self.sql(f"dead_jobs:{before}", build), params)

    def requeue_dead(self, ex: Executor, params: Mapping[str, Any]) -> int | None:
        """Delete a dead row and enqueue its payload afresh, in one transaction.

        Deleting first (with RETURNING) is what makes two racing requeues of the same dead
        job produce one new job: only one DELETE gets the row. The new job takes the dead
        job's unique key; while a live job holds it, the transaction is undone (the dead row
        stays) and the holder's id is returned.
        """
        take = self.sql(
            "requeue_dead:take",
            lambda: sa.delete(dead_jobs)
            .where(dead_jobs.c.id == bp("id", sa.BigInteger), dead_jobs.c.queue == bp("queue", sa.Text))
            .returning(dead_jobs.c.payload, dead_jobs.c.priority, dead_jobs.c.unique_key),
        )
        try:
            with ex.transaction():
                rows = ex.rows(take, params)
                if not rows:
                    return None
                payload, priority, key = rows[0]
                again = {**params, "payload": payload, "priority": priority}
                if key is None:
                    return self.enqueue(ex, again)
                job_id, inserted = self.enqueue_unique(ex, {**again, "unique_key": key})
                if not inserted:
                    raise _KeyHeld(job_id)
                return job_id
        except _KeyHeld as held:
            return held.job_id

    @abc.abstractmethod
    def sweep(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, int]:
        """Move expired rows to dead and purge dead rows past retention; (expired, purged)."""

    def _expired(self) -> sa.ColumnElement[bool]:
        return sa.and_(jobs.c.queue == bp("queue", sa.Text), jobs.c.expires_at <= self.now())

    def _purgeable(self) -> sa.ColumnElement[bool]:
        return sa.and_(
            dead_jobs.c.queue == bp("queue", sa.Text),
            dead_jobs.c.dead_letter_retention.is_not(None),
            dead_jobs.c.died_at + dead_jobs.c.dead_letter_retention <= self.now(),
        )
