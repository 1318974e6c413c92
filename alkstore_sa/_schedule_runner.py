"""The scheduler's leader loop (SPEC §7): acquire the lease, then renew → fire → sleep,
riding out database errors without ever firing on a lease it may have lost.

The rules (docs/scheduler.md, "Database outages", says the same for operators):

- **Fire only on a lease the database just confirmed**: every tick follows a successful
  acquire or renew in the same round. A runner that cannot renew fires nothing.
- **A renewal the database refuses** (the lease lapsed or another owner took it) raises
  ``LeadershipLost`` before ticking again, as SPEC §7 pins.
- **A renewal that fails** (a dropped connection, a restart: the database did not answer)
  leaves the runner not knowing whether it still leads. It keeps a local estimate of its
  lease's end: the monotonic time just before the last successful acquire/renew was sent
  (before the clock reading it carries), plus the lease — never later than the deadline
  the database stored, barring clock jumps. While the next retry falls inside that
  estimate, it retries the renewal; once it would not, the lease may have lapsed and
  another runner may lead, so it goes back to acquiring like a standby (its own
  still-live lease is re-acquired at once; another owner's is waited out).
- Retries back off from 0.1 s to ``lease / 3``; each failure streak is logged once when
  it starts (WARNING) and once when it ends (INFO).
- On stop the lease is released, best effort: if that fails it lapses on its own.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ._retry import TRANSIENT, Backoff, Outage
from .errors import AlkstoreError, DatabaseError, LeadershipLost
from .locks import Lock
from .scheduler import LEADER_LOCK
from .stop import StopToken

if TYPE_CHECKING:
    from .scheduler import Scheduler

log = logging.getLogger("alkstore_sa")

RETRY_BASE = 0.1  # seconds before the first retry of a failed round


class LeaderLoop:
    """One ``run_schedules`` call: the leadership state and the round loop."""

    def __init__(self, scheduler: Scheduler, ttl: float, owner: str) -> None:
        self.scheduler = scheduler
        self.store = scheduler.store
        self.ttl = ttl
        self.owner = owner
        self.period = ttl / 3  # renewal period of a leader, retry period of a standby
        # a fire stuck behind another transaction's row lock must leave time to renew
        scheduler.fire_lock_wait = min(scheduler.fire_lock_wait, ttl / 6)
        self.lock = Lock._reserved(self.store, LEADER_LOCK)
        self.outage = Outage(log, f"scheduler {owner}", Backoff(RETRY_BASE, self.period))
        self.lease_until: float | None = None  # while leading: the local estimate of the lease's end
        self.led = False
        self._doing = "could not reach the database"

    def run(self, stop: StopToken) -> None:
        if not self._schema_checked(stop):
            return
        try:
            while not stop.stopped:
                try:
                    wait = self._round()
                except TRANSIENT as exc:
                    wait = self._failed(exc)
                else:
                    self.outage.recovered()
                stop.wait(wait)
        finally:
            if stop.stopped and self.led:
                self._release()

    def _schema_checked(self, stop: StopToken) -> bool:
        """Fail fast on a database without the tables (NotInstalled propagates), but wait
        out one that does not answer yet; False when stopped meanwhile."""
        while not stop.stopped:
            try:
                self.store.check_schema()
            except DatabaseError as exc:
                stop.wait(self.outage.failed(self._doing, exc))
                continue
            self.outage.recovered()
            return True
        return False

    def _round(self) -> float:
        """Acquire or renew, and fire if leading; returns the seconds to sleep."""
        sent = time.monotonic()  # before the operation reads the store's clock
        if self.lease_until is None:
            self._doing = "could not acquire the lease"
            if not self.lock.acquire(self.owner, self.ttl):
                return self.period
            self.led = True
            log.info("scheduler %s leads (lease %.1fs)", self.owner, self.ttl)
        else:
            self._doing = "could not renew its lease"
            if not self.lock.renew(self.owner, self.ttl):
                raise LeadershipLost(f"scheduler {self.owner} could not renew its lease")
        self.lease_until = sent + self.ttl
        self._doing = "could not tick"
        self.scheduler._tick(paced=True)
        wait = self.scheduler._seconds_to_next_fire()
        return self.period if wait is None else min(self.period, wait + 0.001)

    def _failed(self, exc: BaseException) -> float:
        """A round failed on the database: the delay before the next, and whether that next
        round may still renew or must acquire again."""
        delay = self.outage.failed(self._doing, exc)
        if self.lease_until is not None and time.monotonic() + delay >= self.lease_until:
            self.lease_until = None
            log.warning(
                "scheduler %s: its lease may have lapsed during the outage; it fires nothing "
                "until it has acquired the lease again", self.owner,
            )
        return delay

    def _release(self) -> None:
        """Give the lease up so a standby takes over at once; twice at most, since the first
        attempt may meet a connection the outage broke."""
        for attempt in (1, 2):
            try:
                self.lock.release(self.owner)
                return
            except DatabaseError as exc:
                if attempt == 2:
                    log.warning(
                        "scheduler %s could not release its lease (%s); it lapses within %.1fs",
                        self.owner, exc, self.ttl,
                    )
            except AlkstoreError as exc:  # closed store, tables gone: nothing more to try
                log.warning("scheduler %s could not release its lease (%s)", self.owner, exc)
                return
