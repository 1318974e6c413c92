"""Read-only pages of jobs and streams for an operator's view (the dashboard, SPEC §15).

Every page is a keyset page with a bound LIMIT, never an OFFSET, over an index that
holds the page's order, so page N costs what page 1 costs whatever the table holds:

- ready / scheduled jobs: claim order (priority DESC, run_at, id), the order of
  ``alkstore_jobs_pending_ix``, one priority at a time (see ``pending_page``). No index
  holds a queue's pending rows in id order, and ordered by id the planner walked the
  primary key filtering on the queue (the whole table, for a small queue beside a
  million-row one);
- processing jobs: id order, from the processing index (a queue's claimed rows are few:
  at most its workers' concurrency); the ``id + 0`` sort key keeps the planner off the
  primary key, which it would otherwise walk from the start of the table;
- dead jobs: id order, ``alkstore_dead_jobs_queue_ix`` (queue, id) for one queue, the
  primary key for every queue.

A listed job's payload is only its start (at least ``:preview`` characters): the job page
reads a job whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..schema import dead_jobs, jobs, stream_offsets, streams
from .core import Core
from .sql import (
    DEAD_COLUMNS,
    LIVE_COLUMNS,
    NOTIFY_READERS_SQL,
    ONE,
    PENDING,
    PROCESSING,
    ZERO,
    Executor,
    bp,
)

PENDING_STATES = ("ready", "scheduled")


# the most bytes one character takes in UTF-8
UTF8_MAX: sa.ColumnClause[Any] = sa.literal_column("4")


class BrowseOps(Core):
    """Keyset pages of a queue's jobs by state, of dead jobs, and stream consumers."""

    def _listed(self, columns: list[Any], table: sa.Table) -> list[Any]:
        """``columns`` with ``table``'s payload cut to its start, at least its first
        ``:preview`` characters: a list shows the start of each payload, and a page of the
        largest ones read whole is ``max_payload_bytes`` fifty times over. The database
        cuts it (PostgreSQL reads only the start of a long stored value). SQLite's text
        functions stop at a NUL byte, which a hand-written UPDATE can put in a TEXT column,
        so there the bytes are cut, as many as ``:preview`` characters can take (the
        reader cuts the characters)."""
        payload = table.c.payload
        preview = bp("preview", sa.Integer)
        if self.name == "sqlite":
            start: Any = sa.cast(sa.func.substr(sa.cast(payload, sa.LargeBinary), ONE, preview * UTF8_MAX), sa.Text)
        else:
            start = sa.func.substr(payload, ONE, preview)
        return [start.label("payload") if c is payload else c for c in columns]

    def _job_columns(self) -> list[Any]:
        """A live row laid out as ``get_job`` reads it (no dead-only fields), its payload
        cut to its start (``_listed``)."""
        return self._listed([*LIVE_COLUMNS, sa.null().label("last_error"), sa.null().label("died_at")], jobs)

    if TYPE_CHECKING:  # the claim's walk of a queue's priorities (QueueOps, in every Backend)

        def _priorities(self, t: Any = jobs, *, nesting: bool = False) -> sa.CTE: ...

    def _pending_range(self, state: str, *where: Any) -> sa.Select[Any]:
        """The queue's pending rows in ``state`` matching ``where``, in claim order, LIMITed."""
        due = jobs.c.run_at <= self.now() if state == "ready" else jobs.c.run_at > self.now()
        stmt = (
            sa.select(*self._job_columns())
            .where(jobs.c.queue == bp("queue", sa.Text), jobs.c.state == PENDING, due, self.not_expired(), *where)
            .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        )
        return self.limit(stmt, "limit")

    def pending_page(
        self, ex: Executor, params: Mapping[str, Any], *, state: str, resume: bool
    ) -> list[tuple[Any, ...]]:
        """Up to ``:limit`` pending jobs of ``:queue`` that are ``state`` (ready: due now;
        scheduled: due later; expired ones waiting for the sweep are neither), in claim
        order; with ``resume``, only those after the key (``:priority``, ``:run_at``,
        ``:after``) in that order.

        One priority at a time, highest first (the claim's walk of the queue's priorities,
        one index probe each), each an index range bounded by the state's ``run_at`` side
        and stopped by the LIMIT: the rows of the other side are never stepped over (read
        as one range across priorities, a scheduled page passed every ready row of each
        priority it crossed). With ``resume``, the key's own priority first: same run_at
        and a higher id, then a later run_at."""
        if state not in PENDING_STATES:
            raise ValueError(f"unknown pending state {state!r}")
        priority = bp("priority", sa.Integer)
        wanted = int(params["limit"])
        rows: list[tuple[Any, ...]] = []

        def take(key: str, build: Any, **override: Any) -> None:
            rows.extend(ex.rows(self.sql(key, build), {**params, **override, "limit": wanted - len(rows)}))

        below: int | None = None
        if resume:
            run_at = bp("run_at", sa.Double)
            take(f"pending_page:{state}:tie", lambda: self._pending_range(
                state, jobs.c.priority == priority, jobs.c.run_at == run_at, jobs.c.id > bp("after", sa.BigInteger)
            ))
            if len(rows) < wanted:
                take(f"pending_page:{state}:later", lambda: self._pending_range(
                    state, jobs.c.priority == priority, jobs.c.run_at > run_at
                ))
            below = int(params["priority"])
        walk = ex.rows(self.sql("pending_page:priorities", lambda: sa.select(self._priorities().c.p)), params)
        for (p,) in walk:
            if len(rows) >= wanted or p is None:
                break
            if below is None or p < below:
                take(f"pending_page:{state}", lambda: self._pending_range(state, jobs.c.priority == priority), priority=p)
        return rows

    def processing_page(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Up to ``:limit`` processing jobs of ``:queue`` with ids above ``:after``, by id."""

        def build() -> sa.Executable:
            stmt = (
                sa.select(*self._job_columns())
                .where(
                    jobs.c.queue == bp("queue", sa.Text),
                    jobs.c.state == PROCESSING,
                    jobs.c.id > bp("after", sa.BigInteger),
                )
                .order_by(jobs.c.id + ZERO)
            )
            return self.limit(stmt, "limit")

        return ex.rows(self.sql("processing_page", build), params)

    def dead_page(
        self, ex: Executor, params: Mapping[str, Any], *, by_queue: bool, ascending: bool
    ) -> list[tuple[Any, ...]]:
        """Up to ``:limit`` dead jobs (of ``:queue`` when ``by_queue``): ids above
        ``:after`` ascending, or below ``:before`` descending."""

        def build() -> sa.Executable:
            stmt = sa.select(*self._listed(DEAD_COLUMNS, dead_jobs))
            if by_queue:
                stmt = stmt.where(dead_jobs.c.queue == bp("queue", sa.Text))
            if ascending:
                stmt = stmt.where(dead_jobs.c.id > bp("after", sa.BigInteger)).order_by(dead_jobs.c.id)
            else:
                stmt = stmt.where(dead_jobs.c.id < bp("before", sa.BigInteger)).order_by(dead_jobs.c.id.desc())
            return self.limit(stmt, "limit")

        return ex.rows(self.sql(f"dead_page:{by_queue}:{ascending}", build), params)

    def stream_overview(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every stream's last offset and every consumer's committed offset, in ONE
        statement: the store's connections run in autocommit, so two statements would read
        two instants, and a consumer that committed past the stream's old end between them
        would stand ahead of its stream. Rows (stream, last_offset, None, None, None) for
        the streams and (stream, None, consumer, offset, updated_at) for the consumers (a
        consumer name is never NULL); not the SQLite watchers' reading places kept in the
        offsets table."""

        def build() -> sa.Executable:
            o = stream_offsets
            ends = sa.select(
                streams.c.name, streams.c.last_offset, sa.cast(sa.null(), sa.Text),
                sa.cast(sa.null(), sa.BigInteger), sa.cast(sa.null(), sa.Double),
            )
            consumers = sa.select(
                o.c.stream, sa.cast(sa.null(), sa.BigInteger), o.c.consumer, o.c.offset, o.c.updated_at
            ).where(o.c.stream != NOTIFY_READERS_SQL)  # SQLite's watchers
            return sa.union_all(ends, consumers)

        return ex.rows(self.sql("stream_overview", build), params)
