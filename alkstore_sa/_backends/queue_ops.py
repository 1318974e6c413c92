"""Queue statements: enqueue, claim, the handle transitions, cancel, reads, dead-letter requeue, sweep."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from .. import _tracing
from .._validate import MAX_DURATION, MIN_LEASE
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
    arg,
    bp,
)

# The first probe of a claim's priority walk: the largest value PostgreSQL's priority column holds.
TOP_PRIORITY: sa.ColumnClause[Any] = sa.literal_column(str(2**31 - 1))
# Priority levels a claim's walk visits one index probe each; past them, its worst case is
# the single ordered scan of the claim index it replaced (see QueueOps._priorities).
WALK_LEVELS: sa.ColumnClause[Any] = sa.literal_column("32")

# A unique enqueue that finds the key held, and then no holder, ran between the holder's
# insert and its removal; each round is a fresh attempt, and this many in a row means
# something keeps enqueueing and acking that key faster than one statement runs.
UNIQUE_ROUNDS = 50


class _Clamp(sa.sql.expression.ColumnElement[Any]):
    """``value`` within the inline bounds ``low`` (optional) and ``high`` (every parameter a
    statement takes is named, so constants are written into it). PostgreSQL's
    GREATEST/LEAST are SQL syntax, resolved through no search_path; SQLite's are its
    multi-argument max/min. Each database orders a value that is no number (NaN on
    PostgreSQL, text on SQLite) above every number: it takes ``high``."""

    inherit_cache = True
    _traverse_internals = [
        ("value", InternalTraversal.dp_clauseelement),
        ("low", InternalTraversal.dp_string),
        ("high", InternalTraversal.dp_string),
    ]

    def __init__(self, value: sa.ColumnElement[Any], low: float | None, high: float, type_: Any) -> None:
        self.value = value
        self.low = None if low is None else repr(low)
        self.high = repr(high)
        self.type = type_


def _render_clamp(element: _Clamp, compiler: Any, least: str, greatest: str, **kw: Any) -> str:
    text = compiler.process(element.value, **kw)
    if element.low is not None:
        text = f"{greatest}({text}, {element.low})"
    return f"{least}({text}, {element.high})"


@compiles(_Clamp)
def _render_clamp_pg(element: _Clamp, compiler: Any, **kw: Any) -> str:
    return _render_clamp(element, compiler, "least", "greatest", **kw)


@compiles(_Clamp, "sqlite")
def _render_clamp_sqlite(element: _Clamp, compiler: Any, **kw: Any) -> str:
    return _render_clamp(element, compiler, "min", "max", **kw)


def lease(stamp: sa.ColumnElement[Any]) -> _Clamp:
    """The lease a claim takes from a job's ``visibility_timeout`` stamp, as
    ``_validate.claim_lease`` computes it: the stamp within [MIN_LEASE, 100 years]. A stamp
    written by hand that is no number takes the ceiling, as an infinite one does."""
    return _Clamp(stamp, MIN_LEASE, MAX_DURATION, sa.Double())


class Requeued(NamedTuple):
    """What a dead-job requeue did: ``moved`` — the dead row became the new job
    ``job_id``; or not — a live job, ``job_id``, holds the dead job's ``unique_key``, and
    nothing was written (the dead row stays). The operator tools say which."""

    job_id: int
    moved: bool
    unique_key: str | None


class _KeyHeld(Exception):
    """Internal: ends a requeue's transaction (undoing its take) when a live job holds the
    dead job's key; never leaves this module."""

    def __init__(self, job_id: int, key: str) -> None:
        self.job_id = job_id
        self.key = key


Turn = tuple[int, "list[tuple[Any, ...]] | None"]
"""One queue's turn: the ``n`` it claimed with, and its rows (None: it has settings)."""


def claim_in_turn(
    turns: Sequence[Mapping[str, Any]],
    budget: int,
    claim: Callable[[Mapping[str, Any]], list[tuple[Any, ...]]],
    has_settings: Callable[[Mapping[str, Any]], bool],
) -> list[Turn]:
    """Claim each turn's queue (its params, with ``:n`` at most what is left of ``budget``)
    until the budget is spent; one result per turn taken. A queue whose guarded claim came
    back empty because it has settings gives None: it is claimed by ``claim_limited``."""
    taken: list[Turn] = []
    for params in turns:
        if budget <= 0:
            break
        n = min(params["n"], budget)
        turn = {**params, "n": n}
        rows = claim(turn)
        if not rows and has_settings(turn):
            taken.append((n, None))
            continue
        taken.append((n, rows))
        budget -= len(rows)
    return taken


def split_turns(
    turns: Sequence[Mapping[str, Any]],
    budget: int,
    rows: list[tuple[Any, ...]],
    with_settings: Callable[[list[str]], set[str]],
) -> list[Turn]:
    """The turns of ``claim_in_turn`` read from one statement's ``rows`` that claimed for
    them all (each queue in order up to its ``:n`` and what was left of ``budget``;
    ``PostgresBackend._claim_turns_statement``): the same results, one per turn reached.
    ``with_settings(names)``: which of these queues have settings — asked once, and only
    about the turns that came back empty (an empty turn takes nothing from the budget, so
    which turns are reached does not depend on the answer)."""
    by_queue: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_queue.setdefault(row[1], []).append(row)  # JOB_FIELDS: id, queue, ...
    reached: list[tuple[str, int, list[tuple[Any, ...]]]] = []
    for params in turns:
        if budget <= 0:
            break
        n = min(params["n"], budget)
        got = by_queue.pop(params["queue"], [])
        reached.append((params["queue"], n, got))
        budget -= len(got)
    if by_queue:  # claimed jobs that no turn hands out would run nowhere until they lapse
        raise AssertionError(f"a claim of turns took jobs of queues past its budget: {sorted(by_queue)}")
    empty = [queue for queue, _n, got in reached if not got]
    limited = with_settings(empty) if empty else set()
    return [(n, None if queue in limited else got) for queue, n, got in reached]


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
        tracer = _tracing.tracer
        if tracer is not None and "trace_context" not in params:
            # alkstore_sa.tracing: a PRODUCER span around the insert, which stores the span's
            # context (the tracer always passes ``trace_context``, so this runs once). This
            # method, not ``self.enqueue``: a backend's own enqueue around it (SQLite's, which
            # counts the expiry from the write lock) has already run.
            return tracer.send(params["queue"], params, lambda traced: QueueOps.enqueue(self, ex, traced))
        if "unique_key" in params:
            return self.enqueue_unique(ex, params)[0]
        # A traced enqueue (alkstore_sa.tracing) also stores ``:trace_context``; an untraced
        # one runs a statement that does not name the column at all.
        if "trace_context" in params:
            sql = self.sql("enqueue:traced", lambda: self._enqueue_insert(traced=True))
        else:
            sql = self.sql("enqueue", lambda: self._enqueue_insert(traced=False))
        return ex.rows(sql, params)[0][0]

    def _enqueue_insert(self, *, traced: bool) -> sa.Executable:
        values = self._enqueue_values(bp("payload", sa.Text))
        if traced:
            values["trace_context"] = bp("trace_context", sa.Text)
        return self._with_wake(sa.insert(jobs).values(values).returning(jobs.c.id))

    def enqueue_unique(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, bool]:
        """Enqueue a job holding ``:unique_key`` unless a live job of the queue holds it:
        ``(id, inserted)`` — the new job's id, or the holder's (nothing written, no wake).

        The partial unique index on live rows decides, so concurrent enqueues of one key
        make one job; an insert that meets an uncommitted holder waits for its transaction
        to end. The holder's id is read after the insert conflicted; a holder acked in
        between is simply gone, and the next round inserts.
        """
        traced = "trace_context" in params
        insert = self.sql(
            "enqueue:unique:traced" if traced else "enqueue:unique",
            lambda: self._unique_insert(traced=traced),
        )
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

    def _unique_insert(self, *, traced: bool = False) -> sa.Executable:
        """The enqueue INSERT that yields to a live holder of the key: ``(id, true)`` when
        it inserted, no row when the key is held (PostgreSQL adds the wake and the holder's
        id to the same statement). ``traced``: it also stores ``:trace_context``."""
        values = self._enqueue_values(bp("payload", sa.Text))
        values["unique_key"] = bp("unique_key", sa.Text)
        if traced:
            values["trace_context"] = bp("trace_context", sa.Text)
        return (
            self.upsert(jobs)
            .values(values)
            .on_conflict_do_nothing(
                index_elements=[jobs.c.queue, jobs.c.unique_key],
                index_where=jobs.c.unique_key.is_not(None),
            )
            .returning(jobs.c.id, sa.true().label("inserted"))
        )

    def enqueue_many(self, ex: Executor, params: Mapping[str, Any], payloads: list[str]) -> list[int]:
        """Insert one job per payload text in one statement; ids in payload order."""
        tracer = _tracing.tracer
        if tracer is not None:
            # alkstore_sa.tracing: a PRODUCER span per job, each job storing its span's context
            return tracer.send_many(
                params["queue"], len(payloads), lambda contexts: self.insert_many(ex, params, payloads, contexts)
            )
        return self.insert_many(ex, params, payloads)

    @abc.abstractmethod
    def insert_many(
        self,
        ex: Executor,
        params: Mapping[str, Any],
        payloads: list[str],
        contexts: list[str | None] | None = None,
    ) -> list[int]:
        """The statement of ``enqueue_many``; ``contexts``: each job's trace context,
        parallel to ``payloads`` (a traced enqueue)."""

    def _enqueue_many_from(self, value: Any, order: Any, context: Any = None, source: Any = None) -> sa.Executable:
        """INSERT … SELECT of one job per ``value`` of a table-valued source, in ``order``
        (with its ``context`` as the trace context, when given; ``source``: the FROM
        clause, when the columns come from a join)."""
        values = self._enqueue_values(value)
        if context is not None:
            values["trace_context"] = context
        select = sa.select(*values.values()).order_by(order)
        if source is not None:
            select = select.select_from(source)
        return self._with_wake(
            sa.insert(jobs).from_select(list(values), select).returning(jobs.c.id)
        )

    # -- claim -----------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Move exhausted reclaimables to dead, then claim up to ``:n`` jobs, atomically."""

    @abc.abstractmethod
    def claim_turns(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        """Claim from several queues in turn (``claim_in_turn``'s results): SQLite in one
        transaction, PostgreSQL in one statement (``split_turns``)."""

    def _priorities(
        self, t: Any = jobs, *, nesting: bool = False, now: Any = None, capped: bool = False, queue: Any = None
    ) -> sa.CTE:
        """The distinct priorities of the queue's pending rows, highest first (``pr.p``, at
        depth ``pr.d``), as a loose index scan of the claim index: each step is one probe
        for the next lower priority (``max(priority) < p``), so the walk costs one probe per
        distinct priority, however many rows (delayed ones included) each holds. It starts
        above every priority the column can hold, with that largest value itself (a probe
        that finds nothing, or the jobs at it); its last row is NULL. ``nesting``: written
        where it is used, not in front of the whole statement.

        A claim bounds the walk, so that thousands of distinct priorities (all delayed)
        cost no more than the one ordered scan of the index the walk replaced: with
        ``now``, the probes after ``WALK_LEVELS`` levels look for the next priority that
        has a due row (stepping over the delayed rows in between, as that scan did, each
        row once); ``capped``, the walk stops after ``WALK_LEVELS`` levels, its last row
        then being where the caller's own ordered scan takes over. ``queue``: the queue's
        name as an expression (default: the ``:queue`` parameter)."""
        pending = [t.c.queue == (arg("queue") if queue is None else queue), t.c.state == PENDING]
        pr = sa.select(self.top_priority.label("p"), ZERO.label("d")).cte("pr", recursive=True, nesting=nesting)
        if now is not None:
            pending.append(sa.or_(pr.c.d < WALK_LEVELS, t.c.run_at <= now))
        lower = sa.select(sa.func.max(t.c.priority).label("p")).where(*pending, t.c.priority < pr.c.p)
        more = [pr.c.p.is_not(None)] + ([pr.c.d < WALK_LEVELS] if capped else [])
        return pr.union_all(
            sa.select(lower.scalar_subquery().label("p"), (pr.c.d + ONE).label("d")).where(*more)
        )

    def _ready(self, t: Any, now: Any, queue: Any = None) -> list[sa.ColumnElement[bool]]:
        """Ready pending rows of the queue: due, and not expired."""
        return [
            t.c.queue == (arg("queue") if queue is None else queue),
            t.c.state == PENDING,
            t.c.run_at <= now,
            self.not_expired(t, now),
        ]

    def _claimable(
        self, t: Any = jobs, now: Any = None, queue: Any = None
    ) -> tuple[sa.Select[Any] | sa.CompoundSelect, sa.Select[Any]]:
        """The two candidate scans, each up to ``:n`` rows in claim order: ready pending
        rows, and processing rows whose claim lapsed with attempts left (reclaims). ``t``
        may be an alias of the jobs table and ``now`` a reference to the statement's one
        clock reading (shorter SQL: see PostgresBackend.claim), ``queue`` an expression
        for the queue's name (default: the ``:queue`` parameter).

        The pending side (SQLite's; PostgreSQL's claim reads it its own way) reads the
        claim index once per priority the queue holds (``IN`` the walk of
        ``_priorities``), each read an index range bounded by ``run_at <= now``: delayed
        rows of a higher priority are never stepped over one by one (SQLite walks the
        ``IN`` list in descending order, so the ORDER BY needs no sort). Past the capped
        walk's ``WALK_LEVELS`` levels, one ordered scan below its last level, as before
        the walk (when the walk ended first, that range is empty: one probe)."""
        now = self.now() if now is None else now
        order = (t.c.priority.desc(), t.c.run_at, t.c.id)
        cols = (t.c.id, t.c.priority, t.c.run_at)
        name = arg("queue") if queue is None else queue
        pr = self._priorities(t, capped=True, queue=name)
        # below the walk's lowest level: when the walk ended first, no pending row is there
        floor = sa.select(sa.func.min(pr.c.p)).scalar_subquery()
        walked = sa.select(*cols).where(*self._ready(t, now, name), t.c.priority.in_(sa.select(pr.c.p)))
        rest = sa.select(*cols).where(*self._ready(t, now, name), t.c.priority < floor)
        pending = sa.union_all(
            sa.select(self.limit(walked.order_by(*order), "n").subquery("walked")),
            sa.select(self.limit(rest.order_by(*order), "n").subquery("rest")),
        )
        lapsed = (
            sa.select(*cols)
            .where(
                t.c.queue == name,
                t.c.state == PROCESSING,
                t.c.claim_expires_at <= now,
                t.c.attempts < t.c.max_attempts,
                self.not_expired(t, now),
            )
            .order_by(*order)
        )
        return pending, self.limit(lapsed, "n")

    def _exhausted(self, t: Any = jobs, now: Any = None, queue: Any = None) -> sa.ColumnElement[bool]:
        """Reclaimable rows that already used every attempt: they go dead before a claim.
        ``queue``: a condition on the queue column (default: equal to ``:queue``)."""
        now = self.now() if now is None else now
        return sa.and_(
            (t.c.queue == arg("queue")) if queue is None else queue,
            t.c.state == PROCESSING,
            t.c.claim_expires_at <= now,
            t.c.attempts >= t.c.max_attempts,
            self.not_expired(t, now),
        )

    # The first probe of the priority walk (``_priorities``): above every priority the
    # column holds. PostgreSQL's int4 holds at most TOP_PRIORITY; see SQLiteBackend.
    top_priority: ClassVar[sa.ColumnClause[Any]] = TOP_PRIORITY

    # The most attempts a claim counts, where the column's type bounds it (PostgreSQL's
    # 32-bit integer): see PostgresBackend.
    attempts_ceiling: ClassVar[int | None] = None

    def _counted(self, attempts: sa.ColumnElement[int]) -> sa.ColumnElement[int]:
        """``attempts`` before a claim adds one to it: at most ``attempts_ceiling`` - 1."""
        if self.attempts_ceiling is None:
            return attempts
        return _Clamp(attempts, None, self.attempts_ceiling - 1, sa.Integer())

    def _claim_values(self, t: Any = jobs, now: Any = None) -> dict[str, Any]:
        now = self.now() if now is None else now
        return {
            "state": PROCESSING,
            "attempts": self._counted(t.c.attempts) + ONE,
            "claimed_at": now,
            "claim_expires_at": now + lease(t.c.visibility_timeout),
            "worker_id": arg("worker_id"),
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
    def ack_claims(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[int, int]]:
        """Delete each job of ``:ids`` still under the claim of the matching ``:attempts``
        (processing, unexpired, in ``:queue`` — or in any queue when ``:queue`` is None:
        the claim alone is the single ack's validity predicate): the batch form of the
        handle's ack. Returns the (id, attempts) claims it deleted, so a caller knows which
        acks landed."""

    def _ack_batch(self, id_match: sa.ColumnElement[bool], *, by_queue: bool = True) -> sa.Delete:
        where = [id_match, jobs.c.state == PROCESSING, jobs.c.claim_expires_at > self.now()]
        if by_queue:
            where.append(jobs.c.queue == bp("queue", sa.Text))
        return sa.delete(jobs).where(*where)

    def cancel(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Delete the live job ``:id`` of ``:queue``, pending or processing."""
        return ex.rowcount(self.sql("cancel", lambda: self._cancel()), params) == 1

    def cancel_pending(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Delete the job ``:id`` of ``:queue`` only while it is pending: a claim that lands
        first keeps its job. The state test is in the DELETE itself (never a read before
        it), so the claim and the delete serialize on the row: on PostgreSQL a DELETE that
        waited on the claim's row lock re-checks its WHERE against the claimed row and
        deletes nothing; on SQLite each runs under the one write lock."""
        sql = self.sql("cancel_pending", lambda: self._cancel().where(jobs.c.state == PENDING))
        return ex.rowcount(sql, params) == 1

    def _cancel(self) -> sa.Delete:
        return sa.delete(jobs).where(jobs.c.id == bp("id", sa.BigInteger), jobs.c.queue == bp("queue", sa.Text))

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

    def requeue_dead(self, ex: Executor, params: Mapping[str, Any]) -> Requeued | None:
        """Delete a dead row and enqueue its payload afresh, in one transaction.

        Deleting first (with RETURNING) is what makes two racing requeues of the same dead
        job produce one new job: only one DELETE gets the row. The new job takes the dead
        job's unique key and trace context; while a live job holds the key, the transaction
        is undone (the dead row stays) and the holder's id is returned.
        """
        take = self.sql(
            "requeue_dead:take",
            lambda: sa.delete(dead_jobs)
            .where(dead_jobs.c.id == bp("id", sa.BigInteger), dead_jobs.c.queue == bp("queue", sa.Text))
            .returning(
                dead_jobs.c.payload, dead_jobs.c.priority, dead_jobs.c.unique_key, dead_jobs.c.trace_context
            ),
        )
        try:
            with ex.transaction():
                rows = ex.rows(take, params)
                if not rows:
                    return None
                payload, priority, key, context = rows[0]
                again = {**params, "payload": payload, "priority": priority}
                # the new job keeps the original enqueue's trace context (or none): its
                # executions link to that enqueue, and the requeue makes no span of its own
                again["trace_context"] = context
                if key is None:
                    return Requeued(self.enqueue(ex, again), True, None)
                job_id, inserted = self.enqueue_unique(ex, {**again, "unique_key": key})
                if not inserted:
                    raise _KeyHeld(job_id, key)
                return Requeued(job_id, True, key)
        except _KeyHeld as held:
            return Requeued(held.job_id, False, held.key)

    def delete_dead(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Delete one dead job of ``:queue`` (an operator discarding a dead letter)."""
        sql = self.sql(
            "delete_dead",
            lambda: sa.delete(dead_jobs).where(
                dead_jobs.c.id == bp("id", sa.BigInteger), dead_jobs.c.queue == bp("queue", sa.Text)
            ),
        )
        return ex.rowcount(sql, params) == 1

    @abc.abstractmethod
    def sweep(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, int]:
        """Move expired rows to dead and purge dead rows past retention; (expired, purged)."""

    def _expired(self) -> sa.ColumnElement[bool]:
        return sa.and_(jobs.c.queue == bp("queue", sa.Text), jobs.c.expires_at <= self.now())

    def _purgeable(self) -> sa.ColumnElement[bool]:
        # Each stamp compared as stored, never summed: SQLite's + reads text (which it keeps
        # from a hand-written UPDATE: "7 days") as 0, which purged the job at once; a
        # comparison orders text, like PostgreSQL's NaN, above every number (kept).
        now = self.now()
        return sa.and_(
            dead_jobs.c.queue == bp("queue", sa.Text),
            dead_jobs.c.dead_letter_retention.is_not(None),
            dead_jobs.c.died_at <= now,
            dead_jobs.c.dead_letter_retention <= now - dead_jobs.c.died_at,
        )
