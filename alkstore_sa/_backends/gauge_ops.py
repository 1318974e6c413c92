"""The metrics gauges (SPEC §15): every queue's jobs by state and its oldest ready job, in
ONE statement that counts index entries rather than reading job rows.

A scrape runs this every few seconds, so its cost must not grow with payload sizes. Each
branch is a grouped pass over a partial index whose columns hold what it needs:

- pending jobs: the pending index (queue, priority, run_at, id) splits them into ready
  (``run_at <= now``) and scheduled, and gives the oldest ready ``run_at``. The one thing
  it lacks is the expiry: a job past ``expires_at`` that was not swept yet is neither
  ready nor scheduled. Those are found through the expiry index (its entries only, plus
  the rows of the expired jobs themselves: the ones the next sweep moves) and left out
  by an anti-join on the id, which the pending index holds;
- processing jobs: the processing index; dead jobs: the dead table's queue index.

Counts are exact; the cost is one pass over the entries of those indexes (see
docs/operations.md for what it measured at 1M rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import sqlalchemy as sa

from ..schema import dead_jobs, jobs
from .core import Core
from .sql import ONE, PENDING, PROCESSING, ZERO, Executor

COLUMNS = ("queue", "ready", "scheduled", "processing", "dead", "oldest")


class GaugeOps(Core):
    """The gauges a metrics scrape reads."""

    # Whether the unswept-expired set is computed once before the pending pass. SQLite
    # would otherwise fold it into a per-row lookup of the job's table row (a row read per
    # pending job); PostgreSQL hashes it by itself, and a materialized set would stop it
    # from scanning in parallel.
    materialize_unswept: ClassVar[bool] = False

    def gauges(self, ex: Executor, params: Mapping[str, Any]) -> tuple[float, list[tuple[Any, ...]]]:
        """(now, rows of (queue, ready, scheduled, processing, dead, oldest ready run_at)):
        up to three rows per queue, one per index, each with zeros (and None) for what it
        does not count; the caller adds them up."""

        def build() -> sa.Executable:
            # one reading for the whole statement, computed once (an InitPlan on PostgreSQL)
            # rather than once per row and comparison
            now = sa.select(self.now()).scalar_subquery()

            def grouped(t: Any, *cols: Any) -> sa.Select[Any]:
                named = [c.label(n) for c, n in zip((t.c.queue, *cols), COLUMNS, strict=True)]
                return sa.select(*named).group_by(t.c.queue)

            # the clock expression itself here, not the computed-once reading: the planner
            # sees its value, so it knows the range holds few rows (else it guesses a third
            # of the table, and plans and JIT-compiles the statement for that)
            unswept = (
                sa.select(jobs.c.id)
                .where(jobs.c.state == PENDING, jobs.c.expires_at <= self.now())
                .cte("unswept")
            )
            if self.materialize_unswept:
                unswept = unswept.prefix_with("MATERIALIZED")
            left_out = sa.select(ONE).where(unswept.c.id == jobs.c.id).exists()
            ready = jobs.c.run_at <= now
            pending = grouped(
                jobs,
                sa.func.count(sa.case((ready, ONE))),
                sa.func.count(sa.case((jobs.c.run_at > now, ONE))),
                ZERO,
                ZERO,
                sa.func.min(sa.case((ready, jobs.c.run_at))),
            ).where(jobs.c.state == PENDING, ~left_out)
            processing = grouped(jobs, ZERO, ZERO, sa.func.count(), ZERO, sa.null()).where(
                jobs.c.state == PROCESSING
            )
            dead = grouped(dead_jobs, ZERO, ZERO, ZERO, sa.func.count(), sa.null())
            branches = sa.union_all(pending, processing, dead).subquery("gauges")
            # ``now`` rides on every row: with the database clock, the reading the counts used
            return sa.select(*branches.c, now.label("now"))

        rows = ex.rows(self.sql("gauges", build), params)
        now = rows[0][-1] if rows else self.read_now(ex, params.get("now"))
        return float(now), [tuple(r[:-1]) for r in rows]
