"""Schedule rows: upsert, delete, list, and the conditional boundary advance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..schema import schedules
from .core import Core
from .sql import Executor, bp


class ScheduleOps(Core):
    """Schedule rows: upsert, delete, list, and the conditional boundary advance."""

    # -- schedules -------------------------------------------------------------------------

    SCHEDULE_COLUMNS = [
        schedules.c.name, schedules.c.spec, schedules.c.interval, schedules.c.queue,
        schedules.c.payload, schedules.c.priority, schedules.c.max_attempts, schedules.c.expires,
        schedules.c.next_fire_at, schedules.c.created_at, schedules.c.updated_at, schedules.c.tz,
    ]

    def schedule_upsert(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Create or update by name; the next boundary is kept unless the interval changed
        or, for a cron row (``interval = :cron_interval``), the spec or the zone changed."""

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
                tz=bp("tz", sa.Text),
            )
            x = ins.excluded
            return ins.on_conflict_do_update(
                index_elements=[schedules.c.name],
                set_={
                    "spec": x.spec, "interval": x.interval, "queue": x.queue, "payload": x.payload,
                    "priority": x.priority, "max_attempts": x.max_attempts, "expires": x.expires,
                    "updated_at": x.updated_at, "tz": x.tz,
                    "next_fire_at": sa.case(
                        (
                            sa.and_(
                                schedules.c.interval == x.interval,
                                # @every: the interval alone fixes the boundaries (a zone changes
                                # nothing); cron: the spec and the zone do
                                sa.or_(
                                    x.interval != bp("cron_interval", sa.Double),
                                    sa.and_(schedules.c.spec == x.spec, schedules.c.tz == x.tz),
                                ),
                            ),
                            schedules.c.next_fire_at,
                        ),
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
        """All schedules by name, or those whose next boundary is <= ``:now`` and the cron rows
        an older runner parked (``next_fire_at = interval = :cron_interval``, see scheduler.py)."""

        def build() -> sa.Executable:
            stmt = sa.select(*self.SCHEDULE_COLUMNS).order_by(schedules.c.name)
            if due:
                parked = bp("cron_interval", sa.Double)
                stmt = stmt.where(
                    sa.or_(
                        schedules.c.next_fire_at <= bp("now", sa.Double),
                        sa.and_(schedules.c.next_fire_at == parked, schedules.c.interval == parked),
                    )
                )
            return stmt

        return ex.rows(self.sql(f"schedule_list:{due}", build), params)

    def schedule_fire_lock_wait(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Bound, for the rest of the fire's transaction, how long it waits for a schedule
        row another transaction holds (``:ms``), so a ticker paused mid-fire cannot stall
        the leader. Nothing on SQLite, where a paused writer holds the database's one writer
        lock and every statement waits its busy timeout anyway."""

    def schedule_advance(self, ex: Executor, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Move a schedule's boundary from ``:old`` to ``:next``; the schedule's definition as
        the row holds it under the row lock (queue, payload, priority, max_attempts,
        expires), or None when another ticker already moved it (the UPDATE's row lock holds
        until the tick's transaction ends). The fire enqueues that definition, not the one
        the tick read: a re-registration that keeps the boundary may have committed since."""
        sql = self.sql(
            "schedule_advance",
            lambda: sa.update(schedules)
            .where(
                schedules.c.name == bp("name", sa.Text),
                schedules.c.next_fire_at == bp("old", sa.Double),
            )
            .values(next_fire_at=bp("next", sa.Double))
            .returning(
                schedules.c.queue, schedules.c.payload, schedules.c.priority, schedules.c.max_attempts,
                schedules.c.expires,
            ),
        )
        rows = ex.rows(sql, params)
        return rows[0] if rows else None

    def next_fire(self, ex: Executor, params: Mapping[str, Any]) -> float | None:
        sql = self.sql("next_fire", lambda: sa.select(sa.func.min(schedules.c.next_fire_at)))
        return ex.rows(sql, params)[0][0]  # type: ignore[no-any-return]
