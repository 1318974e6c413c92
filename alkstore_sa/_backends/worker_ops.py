"""Worker registry statements (SPEC §15): a running worker's row, refreshed on an
interval; the live ones; and the cleanup of rows whose worker stopped refreshing.

A row is live until ``expires_at`` (its last refresh plus three refresh intervals, fixed
by the worker that wrote it), so a reader needs no knowledge of each worker's interval and
a SIGKILLed worker disappears on time with nobody removing it; each refresh then deletes
lapsed rows, so the table stays about as large as the set of live workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..schema import workers
from .core import Core
from .sql import Executor, bp

WORKER_COLUMNS = ("id", "hostname", "pid", "queues", "concurrency", "started_at", "last_seen")


class WorkerOps(Core):
    """Record, refresh, list and forget workers."""

    def worker_refresh(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Insert or refresh ``:id``'s row and delete lapsed rows, in one transaction.
        ``started_at`` is kept while the same process (hostname and pid) refreshes the row;
        another process taking the id over is listed from its own start."""
        upsert = self.sql("worker_upsert", self._build_worker_upsert)
        sweep = self.sql(
            "worker_sweep",
            lambda: sa.delete(workers).where(workers.c.expires_at <= self.now()),
        )
        with ex.transaction():
            ex.rowcount(upsert, params)
            ex.rowcount(sweep, {"now": params["now"]})

    def _build_worker_upsert(self) -> sa.Executable:
        now = self.now()
        ins = self.upsert(workers).values(
            id=bp("id", sa.Text),
            hostname=bp("hostname", sa.Text),
            pid=bp("pid", sa.Integer),
            queues=bp("queues", sa.Text),
            concurrency=bp("concurrency", sa.Integer),
            started_at=now,
            last_seen=now,
            expires_at=now + sa.cast(bp("ttl", sa.Double), sa.Double),
        )
        return ins.on_conflict_do_update(
            index_elements=[workers.c.id],
            set_={
                # the row's start is this process's only if this process wrote it: a worker
                # restarted under the same id before its old row lapsed (kill -9, then a
                # systemd restart) must not show the dead process's started_at. The table's
                # own columns here are the row before the update (both dialects).
                "started_at": sa.case(
                    (
                        sa.and_(workers.c.hostname == ins.excluded.hostname, workers.c.pid == ins.excluded.pid),
                        workers.c.started_at,
                    ),
                    else_=ins.excluded.started_at,
                ),
                "hostname": ins.excluded.hostname,
                "pid": ins.excluded.pid,
                "queues": ins.excluded.queues,
                "concurrency": ins.excluded.concurrency,
                "last_seen": ins.excluded.last_seen,
                "expires_at": ins.excluded.expires_at,
            },
        )

    def worker_remove(self, ex: Executor, params: Mapping[str, Any]) -> int:
        """Delete ``:id``'s row if this process (``:hostname``, ``:pid``) wrote it last (a
        worker that stopped cleanly); how many rows went."""
        sql = self.sql(
            "worker_remove",
            lambda: sa.delete(workers).where(
                workers.c.id == bp("id", sa.Text),
                # workers sharing an id share its row: another process's latest refresh
                # means that worker still runs, so its row stays
                workers.c.hostname == bp("hostname", sa.Text),
                workers.c.pid == bp("pid", sa.Integer),
            ),
        )
        return ex.rowcount(sql, params)

    def workers_live(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Rows (in WORKER_COLUMNS order) of the workers whose refresh has not lapsed, oldest
        first."""
        sql = self.sql(
            "workers_live",
            lambda: sa.select(*[workers.c[c] for c in WORKER_COLUMNS])
            .where(workers.c.expires_at > self.now())
            .order_by(workers.c.started_at, workers.c.id),
        )
        return ex.rows(sql, params)
