"""Queue settings statements (SPEC §14): reading and changing a queue's settings row, the
limit view a limited claim decides by, and the limited claim itself.

The claim every queue uses (``QueueOps.claim``) carries a guard that makes it claim
nothing once the queue has a settings row; the caller then takes ``claim_limited``, which
serializes the claims of that one queue (the settings row's lock on PostgreSQL, SQLite's
writer lock) and hands out at most what the limits leave room for. A queue without
settings never reaches this module on a claim that finds jobs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from .._limits import LimitView, rate_in_force
from ..schema import jobs, queue_claims, queue_settings
from .core import Core
from .sql import ONE, PROCESSING, ZERO, Executor, bp

SETTINGS_COLUMNS = ("paused", "concurrency", "rate_limit", "rate_per")
# What each settings change writes: "rate" is the limit and its window together.
FIELD_COLUMNS = {"paused": ("paused",), "concurrency": ("concurrency",), "rate": ("rate_limit", "rate_per")}
_TYPES: dict[str, Any] = {"paused": sa.Boolean, "concurrency": sa.Integer, "rate_limit": sa.Integer, "rate_per": sa.Double}


class SettingsOps(Core):
    """Queue settings: read, change (with the wake that lets idle workers see it), the limit
    view, and the claim of a queue that has settings."""

    # -- engine hooks ----------------------------------------------------------------------

    @abc.abstractmethod
    def claim_unguarded(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """The claim without the settings guard, run inside the caller's transaction (the
        limited claim decided ``:n`` and ``:now`` already)."""

    @abc.abstractmethod
    def queue_wake(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Wake the consumers of ``:queue`` when the executor's transaction commits."""

    def lock_settings(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        """Take the queue's settings row lock for the rest of the transaction, so claims of
        a limited queue run one at a time; False when the queue has no settings row.

        It must be its own statement: under READ COMMITTED a statement's snapshot is taken
        before it waits for a lock, so counts read by the locking statement itself could
        miss the claims of the transaction it waited for. The statements after it see them.
        """
        sql = self.sql(
            "settings_lock",
            lambda: sa.select(queue_settings.c.queue)
            .where(queue_settings.c.queue == bp("queue", sa.Text))
            .with_for_update(),
        )
        return bool(ex.rows(sql, params))

    # -- reads -----------------------------------------------------------------------------

    def queue_settings_get(self, ex: Executor, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """(paused, concurrency, rate_limit, rate_per) of ``:queue``; None without a row. One
        primary-key probe: also what an empty unlimited claim runs to tell "no jobs" from
        "the guard refused"."""
        sql = self.sql(
            "settings_get",
            lambda: sa.select(*[queue_settings.c[c] for c in SETTINGS_COLUMNS]).where(
                queue_settings.c.queue == bp("queue", sa.Text)
            ),
        )
        rows = ex.rows(sql, params)
        return rows[0] if rows else None

    def queue_settings_all(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """(queue, paused, concurrency, rate_limit, rate_per) of every queue with settings,
        in no order (the caller sorts: see ``Store.queue_settings``)."""
        sql = self.sql(
            "settings_all",
            lambda: sa.select(queue_settings.c.queue, *[queue_settings.c[c] for c in SETTINGS_COLUMNS]),
        )
        return ex.rows(sql, params)

    def limit_view(self, ex: Executor, params: Mapping[str, Any]) -> LimitView | None:
        """The queue's settings with the counts its limits are checked against, at one clock
        reading; None when the queue has no settings. Each count is read only when its limit
        is set (a CASE evaluates its subquery lazily), and each is one index probe or range:
        the live claims through the processing index; the jobs handed out in the rate window
        as the log's newest running total minus the total before the window's first claim."""

        def build() -> sa.Executable:
            s = queue_settings.alias("s")
            c = queue_claims.alias("c")
            now = self.now()
            live = sa.and_(
                jobs.c.queue == s.c.queue,
                jobs.c.state == PROCESSING,
                jobs.c.claim_expires_at > now,
            )

            def when(limit: Any, sub: sa.Select[Any]) -> Any:
                return sa.case((limit.is_(None), sa.null()), else_=sub.scalar_subquery())

            def one(stmt: sa.Select[Any]) -> sa.Select[Any]:
                # a literal LIMIT 1 (OFFSET 0: SQLAlchemy would add an anonymous one on SQLite)
                return stmt.limit(ONE).offset(ZERO)

            mine = c.c.queue == s.c.queue
            # rows of one queue are in claim order by (claimed_at, total): the claim index
            newest = one(sa.select(c.c.total).where(mine).order_by(c.c.claimed_at.desc(), c.c.total.desc()))
            # its time: past ``now`` only when the clock stepped back (see LimitView.log_time)
            newest_at = one(
                sa.select(c.c.claimed_at).where(mine).order_by(c.c.claimed_at.desc(), c.c.total.desc())
            )
            in_window = mine, c.c.claimed_at > now - s.c.rate_per
            first = one(sa.select(c.c.total - c.c.jobs).where(*in_window).order_by(c.c.claimed_at, c.c.total))
            oldest = one(sa.select(c.c.claimed_at).where(*in_window).order_by(c.c.claimed_at, c.c.total))
            return sa.select(
                *[s.c[col] for col in SETTINGS_COLUMNS],
                when(s.c.concurrency, sa.select(sa.func.count()).select_from(jobs).where(live)),
                when(s.c.concurrency, sa.select(sa.func.min(jobs.c.claim_expires_at)).where(live)),
                when(s.c.rate_limit, newest),
                when(s.c.rate_limit, newest_at),
                when(s.c.rate_limit, first),
                when(s.c.rate_limit, oldest),
                now,
            ).where(s.c.queue == bp("queue", sa.Text))

        rows = ex.rows(self.sql("limit_view", build), params)
        if not rows:
            return None
        paused, concurrency, rate_limit, rate_per, live, next_lapse, total, total_at, before, oldest, now = rows[0]
        if not rate_in_force(rate_per):
            # a rate limit without a positive window (a row written by hand; the API sets
            # both or neither, the window at least a millisecond) is not in force: no window
            # counts its claims, and a claim logged for it would never leave the log when
            # there is no window (pruning is by the window)
            rate_limit = None
        return LimitView(
            paused=bool(paused), concurrency=concurrency, rate_limit=rate_limit, rate_per=rate_per,
            live=live or 0, next_lapse=next_lapse,
            recent=0 if before is None else int(total) - int(before), oldest_recent=oldest,
            log_total=int(total or 0), log_newest_at=total_at, now=float(now),
        )

    # -- the limited claim -----------------------------------------------------------------

    def claim_limited(
        self, ex: Executor, params: Mapping[str, Any], clock: Callable[[], float | None]
    ) -> list[tuple[Any, ...]] | None:
        """Claim up to ``:n`` jobs of a queue with settings, within its limits, in one
        transaction that holds the queue's settings lock; None when the queue has no
        settings (any more): the caller claims the ordinary way.

        The claim's time is read once the lock is held (``clock()``: the store's reading,
        None for the database clock), so the claims of one queue get their times in the
        order they hold the lock: the rate window's proof needs exactly that."""
        with ex.transaction():
            if not self.lock_settings(ex, params):
                return None
            params = {**params, "now": clock()}
            view = self.limit_view(ex, params)
            if view is None:
                return None
            # The claim runs even when the limits leave no room (n = 0): its first step, the
            # exhausted reclaims moving to dead (SPEC §5.3), is every claim's, so a job whose
            # last claim lapsed while the queue was paused or full does not stay live
            # (holding its unique key) until the limits let a job through. The view's clock
            # reading is the claim's: claimed_at, the deadline and the rate log all say the
            # same instant.
            room = view.room(int(params["n"]))
            rows = self.claim_unguarded(ex, {**params, "n": room, "now": view.now})
            if rows and view.rate_limit is not None:
                self.log_claims(ex, {
                    "queue": params["queue"], "now": view.log_time, "per": view.rate_per,
                    "jobs": len(rows), "total": view.log_total + len(rows),
                })
        return rows

    def log_claims(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Record a claim of ``:jobs`` jobs at ``:now`` (``:total``: the queue's running
        count with them) in the rate log, and drop the queue's claims that have left the
        window, so the log holds about one window of claims."""
        ex.rowcount(self.sql("claims_prune", self._claims_prune), params)
        ex.rowcount(self.sql("claims_log", self._claims_log), params)

    def _claims_prune(self) -> sa.Delete:
        return sa.delete(queue_claims).where(
            queue_claims.c.queue == bp("queue", sa.Text),
            queue_claims.c.claimed_at <= self.now() - sa.cast(bp("per", sa.Double), sa.Double),
        )

    def _claims_log(self) -> sa.Insert:
        return sa.insert(queue_claims).values(
            queue=bp("queue", sa.Text),
            claimed_at=self.now(),
            jobs=bp("jobs", sa.Integer),
            total=bp("total", sa.BigInteger),
        )

    # -- changes ---------------------------------------------------------------------------

    def queue_settings_update(
        self, ex: Executor, params: Mapping[str, Any], fields: tuple[str, ...], *, wake: bool
    ) -> tuple[Any, ...] | None:
        """Set ``fields`` (of FIELD_COLUMNS) of ``:queue``'s settings to the parameters of
        the same names, in one transaction: a row left with no effect is deleted (the queue
        claims the fast way again), a removed rate limit drops its log, and ``wake`` wakes
        the queue's idle consumers at commit. Returns the settings as stored."""
        columns = [c for f in fields for c in FIELD_COLUMNS[f]]

        def upsert() -> sa.Executable:
            values: dict[str, Any] = {"queue": bp("queue", sa.Text), "updated_at": self.now()}
            for c in SETTINGS_COLUMNS:
                if c in columns:
                    values[c] = sa.cast(bp(c, _TYPES[c]), _TYPES[c])
                else:  # a new row's other settings: none
                    values[c] = sa.false() if c == "paused" else sa.null()
            ins = self.upsert(queue_settings).values(values)
            return ins.on_conflict_do_update(
                index_elements=[queue_settings.c.queue],
                set_={c: ins.excluded[c] for c in [*columns, "updated_at"]},
            )

        idle = self.sql(
            "settings_drop_idle",
            lambda: sa.delete(queue_settings).where(
                queue_settings.c.queue == bp("queue", sa.Text),
                queue_settings.c.paused.is_(sa.false()),
                queue_settings.c.concurrency.is_(None),
                queue_settings.c.rate_limit.is_(None),
            ),
        )
        forget = self.sql(
            "claims_forget",
            lambda: sa.delete(queue_claims).where(queue_claims.c.queue == bp("queue", sa.Text)),
        )
        with ex.transaction():
            ex.rowcount(self.sql("settings_set:" + ",".join(fields), upsert), params)
            ex.rowcount(idle, params)
            if "rate" in fields and params["rate_limit"] is None:
                ex.rowcount(forget, params)
            if wake:
                self.queue_wake(ex, params)
            return self.queue_settings_get(ex, params)
