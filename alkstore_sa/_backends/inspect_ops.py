"""Read-only queue views: the next due time, per-queue stats, the operator's overview."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..schema import dead_jobs, jobs
from .core import Core
from .sql import NEXT_DUE_PRIORITIES, ONE, PENDING, PROCESSING, ZERO, Executor, bp


def seconds_until(next_run: float | None, next_lapse: float | None, now: float) -> float | None:
    times = [t for t in (next_run, next_lapse) if t is not None]
    return None if not times else max(0.0, min(times) - now)


class InspectOps(Core):
    """Read-only queue views: the next due time, per-queue stats, the operator's overview."""

    def next_due(self, ex: Executor, params: Mapping[str, Any]) -> float | None:
        """Seconds until a claim would next take or change a row of the queue: a pending job
        becoming ready, or a claim lapsing (None: nothing will); lets an idle consumer sleep
        exactly that long.

        Only rows a claim can act on count: a row that expires before it becomes ready (or
        before its claim lapses) is never claimed, only swept — counting it would make an
        idle worker claim in a loop until ``sweep_expired`` runs. The pending side is a loose
        index scan over the claim index: one probe per distinct priority (the first live
        ``run_at`` of each), for the top ``NEXT_DUE_PRIORITIES`` priorities — never a scan
        of the backlog.
        """
        sql = self.sql("next_due", lambda: self._next_due_select(bp("queue", sa.Text)))
        next_run, next_lapse, now = ex.rows(sql, params)[0]
        return seconds_until(next_run, next_lapse, now)

    def next_due_many(self, ex: Executor, params: Mapping[str, Any]) -> dict[str, float | None]:
        """``next_due`` of each queue of ``:queues``, by name (the worker's queues that
        went idle in one round). Here one ``next_due`` each on ``ex``; PostgreSQL reads
        them all in one statement."""
        return {queue: self.next_due(ex, {**params, "queue": queue}) for queue in params["queues"]}

    def _next_due_select(self, queue: Any, *, nesting: bool = False) -> sa.Select[Any]:
        """(next ready run_at, next lapse, now) of the queue named by ``queue`` (an
        expression); ``nesting``: the priority walk is written inside the select."""
        pending = sa.and_(jobs.c.queue == queue, jobs.c.state == PENDING)
        prios = (
            sa.select(sa.func.max(jobs.c.priority).label("p"), ONE.label("depth"))
            .where(pending)
            .cte("prios", recursive=True, nesting=nesting)
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
        # The index walk of each probe stops at the first row that is still alive when
        # it comes due; expired rows in front of it (unswept) are the only ones it passes.
        first_run_at = (
            sa.select(sa.func.min(jobs.c.run_at))
            .where(pending, jobs.c.priority == prios.c.p, self._alive_at(jobs.c.run_at))
            .scalar_subquery()
        )
        next_run = sa.select(sa.func.min(first_run_at)).where(prios.c.p.is_not(None)).scalar_subquery()
        # A lapsed claim with attempts left is reclaimed, one without is buried by the
        # claim: either way only an unexpired row is touched.
        next_lapse = (
            sa.select(sa.func.min(jobs.c.claim_expires_at))
            .where(
                jobs.c.queue == queue,
                jobs.c.state == PROCESSING,
                self._alive_at(jobs.c.claim_expires_at),
            )
            .scalar_subquery()
        )
        return sa.select(next_run.label("r"), next_lapse.label("l"), self.now().label("t"))

    def _alive_at(self, moment: Any) -> sa.ColumnElement[bool]:
        """Not expired now, nor by ``moment`` (when a claim would next look at the row)."""
        return sa.or_(
            jobs.c.expires_at.is_(None),
            sa.and_(jobs.c.expires_at > self.now(), jobs.c.expires_at > moment),
        )

    def overview(self, ex: Executor, params: Mapping[str, Any]) -> dict[Any, list[Any]]:
        """Per queue: [pending, ready, processing, dead, oldest ready run_at], plus ``now``
        under the key None — one grouped pass over each table (an operator's command), in
        ONE statement: the store's connections run in autocommit, so two statements would
        read two snapshots, and a job that died between them would count as processing
        and as dead."""

        def build() -> sa.Executable:
            now = self.now()
            ready = sa.and_(jobs.c.state == PENDING, jobs.c.run_at <= now, self.not_expired())

            def count(cond: Any) -> Any:
                return sa.func.coalesce(sa.func.sum(sa.case((cond, ONE), else_=ZERO)), ZERO)

            live = sa.select(
                jobs.c.queue,
                count(jobs.c.state == PENDING),
                count(ready),
                count(jobs.c.state == PROCESSING),
                ZERO,
                sa.func.min(sa.case((ready, jobs.c.run_at), else_=sa.null())),
                now,
            ).group_by(jobs.c.queue)
            dead = sa.select(
                dead_jobs.c.queue, ZERO, ZERO, ZERO, sa.func.count(), sa.cast(sa.null(), sa.Double), now
            ).group_by(dead_jobs.c.queue)
            return sa.union_all(live, dead)

        result: dict[Any, list[Any]] = {None: [params.get("now")]}
        # a queue with live and dead jobs comes in two rows: add them up
        for queue, pending, ready, processing, dead, oldest, now in ex.rows(self.sql("overview", build), params):
            row = result.setdefault(queue, [0, 0, 0, 0, None])
            for i, n in enumerate((pending, ready, processing, dead)):
                row[i] += int(n)
            if oldest is not None:
                row[4] = oldest
            result[None] = [now]
        return result

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
