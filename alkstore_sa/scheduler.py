"""The scheduler (SPEC §7): ``@every`` schedules firing into queues, run by one elected
leader at a time.

Boundaries are the multiples of the interval since the Unix epoch (``@every 1h`` fires at
the top of each hour, UTC). A tick fires each due schedule in its own transaction: the
boundary advance (an UPDATE that row-locks the schedule and checks the boundary it read)
and the enqueue of the fires commit together, so a crash mid-tick refires and a second
ticker cannot double-fire. Missed boundaries replay one by one, at most 64 per schedule
per tick, then the schedule skips forward to the next boundary after now.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from typing import TYPE_CHECKING, Any

from . import _validate as v
from ._rows import ts
from .errors import AlkstoreError, InvalidSpec, LeadershipLost
from .locks import Lock
from .model import Schedule
from .queue import DEFAULT_OPTS, enqueue_params
from .stop import StopToken

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("alkstore_sa")

LEADER_LOCK = "__alkstore_scheduler"
MAX_CATCHUP = 64
_SPEC = re.compile(r"@every ([0-9]+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_spec(spec: object) -> int:
    """Seconds between boundaries of ``@every <n><s|m|h|d>`` (n >= 1); InvalidSpec otherwise."""
    if not isinstance(spec, str):
        raise InvalidSpec(spec)
    match = _SPEC.fullmatch(spec)
    if match is None or int(match.group(1)) < 1:
        raise InvalidSpec(spec)
    seconds = int(match.group(1)) * _UNIT[match.group(2)]
    if seconds > v.MAX_DURATION:
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: the interval exceeds 100 years")
    return seconds


def next_boundary(now: float, interval: float) -> float:
    """The first boundary strictly after ``now``."""
    return (math.floor(now / interval) + 1) * interval


def fires_due(next_fire_at: float, now: float, interval: float) -> int:
    """How many boundaries from ``next_fire_at`` to ``now`` (inclusive) have elapsed."""
    if next_fire_at > now:
        return 0
    return math.floor((now - next_fire_at) / interval) + 1


def schedule_from_row(row: tuple[Any, ...]) -> Schedule:
    name, spec, interval, queue, payload, priority, max_attempts, expires, next_fire, created, updated = row
    return Schedule(
        name=name, spec=spec, interval=float(interval), queue=queue, payload=v.decode_payload(payload),
        priority=priority, max_attempts=max_attempts, expires=None if expires is None else float(expires),
        next_fire_at=ts(next_fire), created_at=ts(created), updated_at=ts(updated),  # type: ignore[arg-type]
    )


class Scheduler:
    """Schedule registration and the leader-elected tick loop of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def schedule(
        self,
        name: str,
        spec: str,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
    ) -> None:
        """Create or update the schedule ``name`` (an unchanged interval keeps its next boundary)."""
        self.store._check_open()
        name = v.name(name, "schedule name")
        interval = parse_spec(spec)
        queue = v.name(queue, "queue name")
        params = {
            "name": name, "spec": spec, "interval": float(interval), "queue": queue,
            "payload": v.encode_payload(payload, self.store.max_payload_bytes),
            "priority": v.int32(priority, "priority"),
            "max_attempts": None if max_attempts is None else v.max_attempts(max_attempts),
            "expires": v.optional_duration(expires, "expires", inclusive=False),
        }
        with self.store.executor() as ex:
            now = self.store.backend.read_now(ex, self.store.now())
            params["now"] = now
            params["next_fire_at"] = next_boundary(now, interval)
            self.store.backend.schedule_upsert(ex, params)

    def unschedule(self, name: str) -> bool:
        self.store._check_open()
        name = v.name(name, "schedule name")
        with self.store.executor() as ex:
            return self.store.backend.schedule_delete(ex, {"name": name})

    def schedules(self) -> list[Schedule]:
        self.store._check_open()
        with self.store.executor() as ex:
            rows = self.store.backend.schedule_list(ex, {}, due=False)
        return [schedule_from_row(r) for r in rows]

    # -- ticking -------------------------------------------------------------------------

    def tick(self) -> int:
        """Fire every due boundary once; returns how many jobs were enqueued. Each schedule
        fires in its own transaction (advance + enqueue commit together), and one that fails
        (logged, left due for the next tick) does not keep the others from firing."""
        backend = self.store.backend
        fired = 0
        with self.store.executor() as ex:
            now = backend.read_now(ex, self.store.now())
            for row in backend.schedule_list(ex, {"now": now}, due=True):
                sched = schedule_from_row(row)
                try:
                    fired += self._fire(ex, sched, row[8], now)
                except AlkstoreError as exc:
                    log.error("schedule %r could not fire (%s); it stays due and is retried next tick", sched.name, exc)
        return fired

    def _fire(self, ex: Any, sched: Schedule, old: float, now: float) -> int:
        count = min(fires_due(old, now, sched.interval), MAX_CATCHUP)
        if count == 0:
            return 0
        backend = self.store.backend
        params = enqueue_params(
            self.store, sched.queue, DEFAULT_OPTS, delay=None, run_at=None, priority=sched.priority,
            max_attempts=sched.max_attempts, expires=sched.expires,
        )
        payload = v.encode_payload(sched.payload, self.store.max_payload_bytes)
        nxt = next_boundary(now, sched.interval)
        with ex.transaction():
            if not backend.schedule_advance(ex, {"name": sched.name, "old": old, "next": nxt}):
                return 0  # another ticker fired these boundaries
            backend.enqueue_many(ex, params, [payload] * count)
        skipped = fires_due(old, now, sched.interval) - count
        if skipped:
            log.warning("schedule %r: %d missed boundaries beyond the catch-up cap were skipped", sched.name, skipped)
        log.debug("schedule %r fired %d time(s) into %r", sched.name, count, sched.queue)
        return count

    def _seconds_to_next_fire(self) -> float | None:
        with self.store.executor() as ex:
            nxt = self.store.backend.next_fire(ex, {})
            if nxt is None:
                return None
            return max(0.0, nxt - self.store.backend.read_now(ex, self.store.now()))

    def run(self, stop: StopToken, *, lease: v.Duration = 30.0, owner: str | None = None) -> None:
        """Lead (or wait to lead) until ``stop``: renew → fire → sleep. Raises
        LeadershipLost when the lease could not be renewed, before ticking again."""
        ttl = v.duration(lease, "lease", inclusive=False)
        owner = owner or f"scheduler-{uuid.uuid4().hex}"
        lock = Lock(self.store, LEADER_LOCK)
        renew_every = ttl / 3
        while not stop.stopped:
            if lock.acquire(owner, ttl):
                break
            stop.wait(renew_every)
        else:
            return
        log.info("scheduler %s leads (lease %.1fs)", owner, ttl)
        try:
            while not stop.stopped:
                if not lock.renew(owner, ttl):
                    raise LeadershipLost(f"scheduler {owner} could not renew its lease")
                self.tick()
                wait = self._seconds_to_next_fire()
                stop.wait(renew_every if wait is None else min(renew_every, wait + 0.001))
        finally:
            if stop.stopped:
                lock.release(owner)
