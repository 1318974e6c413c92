"""Lock leases: each operation one atomic statement."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from ..schema import locks
from .core import Core
from .sql import Executor, bp


class LeaseOps(Core):
    """Lock leases: each operation one atomic statement."""

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
