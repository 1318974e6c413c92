"""The backend interface: one method per queue operation or state transition.

Statements are SQLAlchemy Core expressions, compiled once per backend (dialect + schema)
into driver SQL and cached; operations then run that SQL on an Executor, which is either
one of the store's own driver connections (autocommit, so a single-statement operation is
one round trip) or the caller's SQLAlchemy Connection (the caller's transaction).
Statements shared by both engines live here; each engine overrides what differs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from ..errors import DatabaseError, NotInstalled
from ..schema import (
    DEFAULT_SCHEMA,
    JOB_FIELDS,
    dead_jobs,
    jobs,
    locks,
    schedules,
    stream_events,
    stream_offsets,
    streams,
)

# State values are inlined as literals (never bound): SQLite only uses a partial index
# when the query's WHERE literally implies the index's WHERE.
PENDING: sa.ColumnClause[Any] = sa.literal_column("'pending'")
PROCESSING: sa.ColumnClause[Any] = sa.literal_column("'processing'")
DEAD: sa.ColumnClause[Any] = sa.literal_column("'dead'")
EMPTY_ERRORS: sa.ColumnClause[Any] = sa.literal_column("'[]'")
ZERO: sa.ColumnClause[Any] = sa.literal_column("0")

ONE: sa.ColumnClause[Any] = sa.literal_column("1")
NEXT_DUE_PRIORITIES = 64
EXHAUSTED = "max attempts exceeded"
EXPIRED = "expired"
EXHAUSTED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXHAUSTED}'")
EXPIRED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXPIRED}'")


def bp(name: str, type_: Any) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


class Executor(Protocol):
    """Runs compiled driver SQL with a dict of parameters."""

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int: ...

    def transaction(self) -> AbstractContextManager[None]: ...


LIVE_COLUMNS = [jobs.c[f] for f in JOB_FIELDS] + [jobs.c.state]
DEAD_COLUMNS = [dead_jobs.c[f] for f in JOB_FIELDS] + [DEAD, dead_jobs.c.last_error, dead_jobs.c.died_at]


class Backend(abc.ABC):
    """Dialect-specific SQL for every operation; subclasses fill in what differs."""

    name: ClassVar[str]

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = schema
        self._sql: dict[str, str] = {}
        self.dialect = self.compile_dialect()

    # -- hooks -----------------------------------------------------------------------------

    @abc.abstractmethod
    def compile_dialect(self) -> Dialect:
        """The dialect statements are compiled for (the driver's parameter style)."""

    @abc.abstractmethod
    def target_schema(self) -> str:
        """What the declared ``alkstore`` schema is rendered as."""

    @abc.abstractmethod
    def now(self) -> sa.ColumnElement[float]:
        """The operation's single time reading: the ``now`` parameter, or the database clock."""

    @abc.abstractmethod
    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether a driver error means the alkstore tables are not installed."""

    @abc.abstractmethod
    def append_error(self, errors: Any, attempts: Any) -> sa.ColumnElement[str]:
        """``errors`` (a JSON array as text) with ``{attempt, error, at}`` appended, built in
        SQL so the entry's time is the operation's clock reading."""

    def errors_after(self, src: Any) -> sa.ColumnElement[str]:
        """The history after an op that may carry an error (``:error`` NULL = nothing to add)."""
        return sa.case(
            (bp("error", sa.Text).is_(None), src.c.errors),
            else_=self.append_error(src.c.errors, src.c.attempts),
        )

    @abc.abstractmethod
    def prepare_connection(self, dbapi_conn: Any) -> Any:
        """Put a driver connection in autocommit mode; return what restores it."""

    @abc.abstractmethod
    def restore_connection(self, dbapi_conn: Any, saved: Any) -> None:
        """Undo ``prepare_connection`` before the connection goes back to the engine's pool."""

    # A write transaction on one of the store's own (autocommit) connections.
    BEGIN = "BEGIN"

    def begin(self, dbapi_conn: Any) -> None:
        dbapi_conn.execute(self.BEGIN)

    def commit(self, dbapi_conn: Any) -> None:
        dbapi_conn.execute("COMMIT")

    def rollback(self, dbapi_conn: Any) -> None:
        dbapi_conn.execute("ROLLBACK")

    def is_disconnect(self, exc: BaseException, dbapi_conn: Any) -> bool:
        return False

    @abc.abstractmethod
    def upsert(self, table: sa.Table) -> Any:
        """The dialect's INSERT construct that supports ON CONFLICT."""

    # -- notify / wake ---------------------------------------------------------------------

    @abc.abstractmethod
    def channel_key(self, channel: str) -> str:
        """How a user channel name is addressed by this engine's transport."""

    @abc.abstractmethod
    def wake_key(self, queue: str) -> str:
        """The key a queue's consumers wait on."""

    @abc.abstractmethod
    def stream_wake_key(self, stream: str) -> str:
        """The key a stream's subscribers wait on."""

    @abc.abstractmethod
    def create_hub(self, engine: Any) -> Any:
        """The store's listener (PostgreSQL) or watcher (SQLite)."""

    @abc.abstractmethod
    def notify(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Send ``:payload`` on ``:channel`` (delivered when the executor's transaction commits)."""

    def _with_wake(self, insert: Any) -> sa.Executable:
        """An enqueue INSERT ... RETURNING id, plus whatever wakes the queue on commit."""
        return insert  # type: ignore[no-any-return]

    def limit(self, stmt: sa.Select[Any], key: str) -> sa.Select[Any]:
        """``LIMIT :key`` with a bound limit."""
        return stmt.limit(bp(key, sa.Integer))

    # -- compilation -----------------------------------------------------------------------

    def sql(self, key: str, build: Callable[[], Any]) -> str:
        """Driver SQL for a statement, compiled once per backend and reused."""
        text = self._sql.get(key)
        if text is None:
            compiled = build().compile(
                dialect=self.dialect,
                schema_translate_map={DEFAULT_SCHEMA: self.target_schema()},
                render_schema_translate=True,
            )
            anonymous = [b.key for b in compiled.binds.values() if b.unique]
            if anonymous:  # a literal became an anonymous parameter the executor never passes
                raise AssertionError(f"statement {key!r} has anonymous parameters {anonymous}")
            self._sql[key] = text = compiled.string
        return text

    def translate_error(self, exc: BaseException) -> BaseException:
        """The one place driver exceptions become alkstore errors."""
        orig = getattr(exc, "orig", None) or exc
        if self.is_missing_table(orig):
            err: BaseException = NotInstalled()
        else:
            err = DatabaseError(f"{type(orig).__name__}: {orig}".strip(), orig=orig)
        err.__cause__ = exc
        return err

    # -- shared predicates -----------------------------------------------------------------

    def not_expired(self, t: Any = jobs) -> sa.ColumnElement[bool]:
        return sa.or_(t.c.expires_at.is_(None), t.c.expires_at > self.now())

    def this_claim(self) -> sa.ColumnElement[bool]:
        """The validity predicate: processing under *this* claim, deadline not passed.

        The attempt number identifies the claim (every claim increments it; no other
        transition touches it), so two workers with the same worker_id cannot act on each
        other's claims, and a reclaim invalidates the earlier holder atomically.
        """
        return sa.and_(
            jobs.c.id == bp("id", sa.BigInteger),
            jobs.c.state == PROCESSING,
            jobs.c.attempts == bp("attempts", sa.Integer),
            jobs.c.claim_expires_at > self.now(),
        )

    def dead_values(self, src: Any, last_error: Any, errors: Any = None) -> list[Any]:
        """Columns for an INSERT INTO dead SELECT from a live-shaped source ``src``."""
        cols = [src.c[f] for f in JOB_FIELDS if f != "errors"]
        return cols + [src.c.errors if errors is None else errors, last_error, self.now()]

    DEAD_INSERT_COLUMNS = [f for f in JOB_FIELDS if f != "errors"] + ["errors", "last_error", "died_at"]

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
        sql = self.sql(
            "enqueue",
            lambda: self._with_wake(
                sa.insert(jobs).values(self._enqueue_values(bp("payload", sa.Text))).returning(jobs.c.id)
            ),
        )
        return ex.rows(sql, params)[0][0]

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

    def _claimable(self, t: Any = jobs) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The two candidate scans, each an ordered index range: ready pending rows, and
        processing rows whose claim lapsed with attempts left (reclaims). ``t`` may be an
        alias of the jobs table (shorter SQL: see PostgresBackend.claim)."""
        now = self.now()
        order = (t.c.priority.desc(), t.c.run_at, t.c.id)
        cols = (t.c.id, t.c.priority, t.c.run_at)
        queue = t.c.queue == bp("queue", sa.Text)
        pending = (
            sa.select(*cols)
            .where(queue, t.c.state == PENDING, t.c.run_at <= now, self.not_expired(t))
            .order_by(*order)
        )
        lapsed = (
            sa.select(*cols)
            .where(
                queue,
                t.c.state == PROCESSING,
                t.c.claim_expires_at <= now,
                t.c.attempts < t.c.max_attempts,
                self.not_expired(t),
            )
            .order_by(*order)
        )
        return self.limit(pending, "n"), self.limit(lapsed, "n")

    def _exhausted(self, t: Any = jobs) -> sa.ColumnElement[bool]:
        """Reclaimable rows that already used every attempt: they go dead before a claim."""
        return sa.and_(
            t.c.queue == bp("queue", sa.Text),
            t.c.state == PROCESSING,
            t.c.claim_expires_at <= self.now(),
            t.c.attempts >= t.c.max_attempts,
            self.not_expired(t),
        )

    def _claim_values(self, t: Any = jobs) -> dict[str, Any]:
        now = self.now()
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
        job produce one new job: only one DELETE gets the row.
        """
        take = self.sql(
            "requeue_dead:take",
            lambda: sa.delete(dead_jobs)
            .where(dead_jobs.c.id == bp("id", sa.BigInteger), dead_jobs.c.queue == bp("queue", sa.Text))
            .returning(dead_jobs.c.payload, dead_jobs.c.priority),
        )
        with ex.transaction():
            rows = ex.rows(take, params)
            if not rows:
                return None
            payload, priority = rows[0]
            return self.enqueue(ex, {**params, "payload": payload, "priority": priority})

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

    def next_due(self, ex: Executor, params: Mapping[str, Any]) -> float | None:
        """Seconds until the queue's next pending job becomes ready or its next claim lapses
        (None: neither exists); lets an idle consumer sleep exactly that long.

        The pending side is a loose index scan over the claim index: one probe per distinct
        priority (the first ``run_at`` of each), for the top ``NEXT_DUE_PRIORITIES``
        priorities — never a scan of the backlog.
        """

        def build() -> sa.Executable:
            queue = bp("queue", sa.Text)
            pending = sa.and_(jobs.c.queue == queue, jobs.c.state == PENDING)
            prios = (
                sa.select(sa.func.max(jobs.c.priority).label("p"), ONE.label("depth"))
                .where(pending)
                .cte("prios", recursive=True)
            )
            lower = (
                sa.select(sa.func.max(jobs.c.priority))
                .where(pending, jobs.c.priority < prios.c.p)
                .scalar_subquery()
            )
            prios = prios.union_all(
                sa.select(lower, prios.c.depth + ONE).where(
                    prios.c.p.is_not(None),
                    prios.c.depth < sa.literal_column(str(NEXT_DUE_PRIORITIES)),
                )
            )
            first_run_at = (
                sa.select(sa.func.min(jobs.c.run_at))
                .where(pending, jobs.c.priority == prios.c.p)
                .scalar_subquery()
            )
            next_run = sa.select(sa.func.min(first_run_at)).where(prios.c.p.is_not(None)).scalar_subquery()
            next_lapse = (
                sa.select(sa.func.min(jobs.c.claim_expires_at))
                .where(jobs.c.queue == queue, jobs.c.state == PROCESSING)
                .scalar_subquery()
            )
            return sa.select(next_run, next_lapse, self.now())

        next_run, next_lapse, now = ex.rows(self.sql("next_due", build), params)[0]
        times = [t for t in (next_run, next_lapse) if t is not None]
        return None if not times else max(0.0, min(times) - now)

    def overview(self, ex: Executor, params: Mapping[str, Any]) -> dict[Any, list[Any]]:
        """Per queue: [pending, ready, processing, dead, oldest ready run_at], plus ``now``
        under the key None — one grouped pass over each table (an operator's command)."""

        def live() -> sa.Executable:
            now = self.now()
            ready = sa.and_(jobs.c.state == PENDING, jobs.c.run_at <= now, self.not_expired())

            def count(cond: Any) -> Any:
                return sa.func.coalesce(sa.func.sum(sa.case((cond, ONE), else_=ZERO)), ZERO)

            return sa.select(
                jobs.c.queue,
                count(jobs.c.state == PENDING),
                count(ready),
                count(jobs.c.state == PROCESSING),
                sa.func.min(sa.case((ready, jobs.c.run_at), else_=sa.null())),
                now,
            ).group_by(jobs.c.queue)

        def dead() -> sa.Executable:
            return sa.select(dead_jobs.c.queue, sa.func.count()).group_by(dead_jobs.c.queue)

        result: dict[Any, list[Any]] = {None: [params.get("now")]}
        for queue, pending, ready, processing, oldest, now in ex.rows(self.sql("overview:live", live), params):
            result[queue] = [pending, ready, processing, 0, oldest]
            result[None] = [now]
        for queue, n in ex.rows(self.sql("overview:dead", dead), params):
            result.setdefault(queue, [0, 0, 0, 0, None])[3] = n
        return result

    # -- clock -----------------------------------------------------------------------------

    def read_now(self, ex: Executor, now: float | None) -> float:
        """The operation's time as a number: the injected reading, or one database read."""
        if now is not None:
            return now
        return float(ex.rows(self.sql("now", lambda: sa.select(self.now())), {"now": None})[0][0])

    # -- locks (leases) --------------------------------------------------------------------

    def lock_acquire(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """One atomic upsert: take the lease if it is free, lapsed, or already ours."""

        def build() -> sa.Executable:
            now = self.now()
            ins = self.upsert(locks).values(
                name=bp("name", sa.Text),
                owner=bp("owner", sa.Text),
                acquired_at=now,
                expires_at=now + sa.cast(bp("ttl", sa.Double), sa.Double),
            )
            same_owner = locks.c.owner == ins.excluded.owner
            # re-acquiring a live lease of one's own extends it; a lapsed one starts anew
            still_mine = sa.and_(same_owner, locks.c.expires_at > now)
            return ins.on_conflict_do_update(
                index_elements=[locks.c.name],
                set_={
                    "owner": ins.excluded.owner,
                    "acquired_at": sa.case((still_mine, locks.c.acquired_at), else_=ins.excluded.acquired_at),
                    "expires_at": ins.excluded.expires_at,
                },
                where=sa.or_(locks.c.expires_at <= now, same_owner),
            ).returning(locks.c.owner)

        return len(ex.rows(self.sql("lock_acquire", build), params)) == 1

    def _held(self) -> sa.ColumnElement[bool]:
        return sa.and_(
            locks.c.name == bp("name", sa.Text),
            locks.c.owner == bp("owner", sa.Text),
            locks.c.expires_at > self.now(),
        )

    def lock_renew(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql(
            "lock_renew",
            lambda: sa.update(locks)
            .where(self._held())
            .values(expires_at=self.now() + sa.cast(bp("ttl", sa.Double), sa.Double)),
        )
        return ex.rowcount(sql, params) == 1

    def lock_release(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        return ex.rowcount(self.sql("lock_release", lambda: sa.delete(locks).where(self._held())), params) == 1

    def lock_holder(self, ex: Executor, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        sql = self.sql(
            "lock_holder",
            lambda: sa.select(locks.c.owner, locks.c.acquired_at, locks.c.expires_at).where(
                locks.c.name == bp("name", sa.Text), locks.c.expires_at > self.now()
            ),
        )
        rows = ex.rows(sql, params)
        return rows[0] if rows else None

    # -- schedules -------------------------------------------------------------------------

    SCHEDULE_COLUMNS = [
        schedules.c.name, schedules.c.spec, schedules.c.interval, schedules.c.queue,
        schedules.c.payload, schedules.c.priority, schedules.c.max_attempts, schedules.c.expires,
        schedules.c.next_fire_at, schedules.c.created_at, schedules.c.updated_at,
    ]

    def schedule_upsert(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Create or update by name; the next boundary is kept unless the interval changed."""

        def build() -> sa.Executable:
            ins = self.upsert(schedules).values(
                name=bp("name", sa.Text),
                spec=bp("spec", sa.Text),
                interval=bp("interval", sa.Double),
                queue=bp("queue", sa.Text),
                payload=bp("payload", sa.Text),
                priority=bp("priority", sa.Integer),
                max_attempts=sa.cast(bp("max_attempts", sa.Integer), sa.Integer),
                expires=sa.cast(bp("expires", sa.Double), sa.Double),
                next_fire_at=bp("next_fire_at", sa.Double),
                created_at=bp("now", sa.Double),
                updated_at=bp("now", sa.Double),
            )
            x = ins.excluded
            return ins.on_conflict_do_update(
                index_elements=[schedules.c.name],
                set_={
                    "spec": x.spec, "interval": x.interval, "queue": x.queue, "payload": x.payload,
                    "priority": x.priority, "max_attempts": x.max_attempts, "expires": x.expires,
                    "updated_at": x.updated_at,
                    "next_fire_at": sa.case(
                        (schedules.c.interval == x.interval, schedules.c.next_fire_at),
                        else_=x.next_fire_at,
                    ),
                },
            )

        ex.rowcount(self.sql("schedule_upsert", build), params)

    def schedule_delete(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        sql = self.sql(
            "schedule_delete", lambda: sa.delete(schedules).where(schedules.c.name == bp("name", sa.Text))
        )
        return ex.rowcount(sql, params) == 1

    def schedule_list(self, ex: Executor, params: Mapping[str, Any], *, due: bool) -> list[tuple[Any, ...]]:
        """All schedules by name, or those whose next boundary is <= ``:now``."""

        def build() -> sa.Executable:
            stmt = sa.select(*self.SCHEDULE_COLUMNS).order_by(schedules.c.name)
            if due:
                stmt = stmt.where(schedules.c.next_fire_at <= bp("now", sa.Double))
            return stmt

        return ex.rows(self.sql(f"schedule_list:{due}", build), params)

    def schedule_advance(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Move a schedule's boundary from ``:old`` to ``:next``; False when another ticker
        already did (the UPDATE's row lock holds until the tick's transaction ends)."""
        sql = self.sql(
            "schedule_advance",
            lambda: sa.update(schedules)
            .where(
                schedules.c.name == bp("name", sa.Text),
                schedules.c.next_fire_at == bp("old", sa.Double),
            )
            .values(next_fire_at=bp("next", sa.Double)),
        )
        return ex.rowcount(sql, params) == 1

    def next_fire(self, ex: Executor, params: Mapping[str, Any]) -> float | None:
        sql = self.sql("next_fire", lambda: sa.select(sa.func.min(schedules.c.next_fire_at)))
        return ex.rows(sql, params)[0][0]  # type: ignore[no-any-return]

    # -- streams ---------------------------------------------------------------------------

    def _next_offset(self) -> Any:
        """Increment the stream's counter (created at 1), returning the new offset; the row
        lock it takes is held until the publishing transaction ends."""
        ins = self.upsert(streams).values(name=bp("stream", sa.Text), last_offset=ONE)
        return ins.on_conflict_do_update(
            index_elements=[streams.c.name], set_={"last_offset": streams.c.last_offset + ONE}
        ).returning(streams.c.last_offset)

    @abc.abstractmethod
    def stream_publish(self, ex: Executor, params: Mapping[str, Any]) -> int:
        """Append ``:payload`` to ``:stream`` at the next offset (commit-ordered); the offset."""

    def stream_read(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        def build() -> sa.Executable:
            e = stream_events
            stmt = (
                sa.select(e.c.offset, e.c.payload, e.c.created_at)
                .where(e.c.stream == bp("stream", sa.Text), e.c.offset > bp("after", sa.BigInteger))
                .order_by(e.c.offset)
            )
            return self.limit(stmt, "limit")

        return ex.rows(self.sql("stream_read", build), params)

    def stream_commit(self, ex: Executor, params: Mapping[str, Any]) -> None:
        def build() -> sa.Executable:
            ins = self.upsert(stream_offsets).values(
                stream=bp("stream", sa.Text),
                consumer=bp("consumer", sa.Text),
                offset=bp("offset", sa.BigInteger),
                updated_at=self.now(),
            )
            return ins.on_conflict_do_update(
                index_elements=[stream_offsets.c.stream, stream_offsets.c.consumer],
                set_={"offset": ins.excluded.offset, "updated_at": ins.excluded.updated_at},
            )

        ex.rowcount(self.sql("stream_commit", build), params)

    def stream_offset(self, ex: Executor, params: Mapping[str, Any]) -> int:
        sql = self.sql(
            "stream_offset",
            lambda: sa.select(stream_offsets.c.offset).where(
                stream_offsets.c.stream == bp("stream", sa.Text),
                stream_offsets.c.consumer == bp("consumer", sa.Text),
            ),
        )
        rows = ex.rows(sql, params)
        return int(rows[0][0]) if rows else 0

    def stream_trim(self, ex: Executor, params: Mapping[str, Any]) -> int:
        sql = self.sql(
            "stream_trim",
            lambda: sa.delete(stream_events).where(
                stream_events.c.stream == bp("stream", sa.Text),
                stream_events.c.offset <= bp("offset", sa.BigInteger),
            ),
        )
        return ex.rowcount(sql, params)

    def stream_offsets(self, ex: Executor, params: Mapping[str, Any]) -> dict[str, int]:
        """Last offset of every stream (the SQLite watcher's change detection)."""
        sql = self.sql("stream_offsets", lambda: sa.select(streams.c.name, streams.c.last_offset))
        return {name: int(last) for name, last in ex.rows(sql, params)}

    def stats(self, ex: Executor, params: Mapping[str, Any]) -> tuple[Any, ...]:
        def build() -> sa.Executable:
            now = self.now()
            queue = bp("queue", sa.Text)
            ready = sa.and_(
                jobs.c.queue == queue, jobs.c.state == PENDING, jobs.c.run_at <= now, self.not_expired()
            )

            def scalar(expr: Any, *where: Any, table: Any = jobs) -> Any:
                return sa.select(expr).select_from(table).where(*where).scalar_subquery()

            return sa.select(
                scalar(sa.func.count(), jobs.c.queue == queue, jobs.c.state == PENDING),
                scalar(sa.func.count(), ready),
                scalar(sa.func.min(jobs.c.run_at), ready),
                scalar(sa.func.count(), jobs.c.queue == queue, jobs.c.state == PROCESSING),
                scalar(sa.func.count(), dead_jobs.c.queue == queue, table=dead_jobs),
                now,
            )

        return ex.rows(self.sql("stats", build), params)[0]

