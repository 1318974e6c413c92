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
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import _validate as v
from ._retry import Backoff, Outage
from ._rows import ts
from .errors import AlkstoreError, InvalidSpec
from .model import Schedule
from .queue import DEFAULT_OPTS, enqueue_params
from .stop import StopToken

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("alkstore_sa")

LEADER_LOCK = "__alkstore_scheduler"
MAX_CATCHUP = 64
# A schedule that cannot fire is retried after 0.5 s, 1 s, 2 s, ... at most a minute apart.
SCHEDULE_RETRY = (0.5, 60.0)
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


@dataclass
class _Failing:
    """A schedule whose fires fail: its failure streak, the schedule version it is about
    (``updated_at``), and when (monotonic) the runner may try it again."""

    outage: Outage
    version: datetime
    retry_at: float = 0.0


class Scheduler:
    """Schedule registration and the leader-elected tick loop of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._failing: dict[str, _Failing] = {}

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
        (logged once per failure streak, left due) does not keep the others from firing."""
        return self._tick(paced=False)

    def _tick(self, *, paced: bool) -> int:
        """``tick``; ``paced`` (the runner) skips the schedules still waiting out their
        retry backoff, so one that cannot fire is not retried at the loop's full speed."""
        backend = self.store.backend
        with self.store.executor() as ex:
            now = backend.read_now(ex, self.store.now())
            rows = backend.schedule_list(ex, {"now": now}, due=True)
        fired = 0
        due = set()
        for row in rows:
            sched = schedule_from_row(row)
            due.add(sched.name)
            failing = self._failing.get(sched.name)
            if failing is not None and failing.version != sched.updated_at:
                # re-registered since it failed (a fix, perhaps): try the new definition now
                failing.version, failing.retry_at = sched.updated_at, 0.0
            if paced and failing is not None and failing.retry_at > time.monotonic():
                continue
            try:
                # a lease per fire: a connection broken by one fire is dropped, not reused
                with self.store.executor() as ex:
                    fired += self._fire(ex, sched, row[8], now)
            except AlkstoreError as exc:
                if failing is None:
                    failing = self._failing[sched.name] = _Failing(
                        Outage(log, f"schedule {sched.name!r}", Backoff(*SCHEDULE_RETRY), level=logging.ERROR),
                        sched.updated_at,
                    )
                failing.retry_at = time.monotonic() + failing.outage.failed("could not fire", exc)
            else:
                if failing is not None:
                    failing.outage.recovered()
                    del self._failing[sched.name]
        for name in set(self._failing) - due:
            del self._failing[name]  # no longer due: fired by another ticker, moved or removed
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
        """Seconds until the next boundary, or None when there are no schedules; a schedule
        waiting out its retry backoff counts at its retry time instead (real seconds)."""
        backend = self.store.backend
        with self.store.executor() as ex:
            now = backend.read_now(ex, self.store.now())
            if not self._failing:
                nxt = backend.next_fire(ex, {})
                return None if nxt is None else max(0.0, nxt - now)
            rows = backend.schedule_list(ex, {}, due=False)
        mono = time.monotonic()
        waits = [
            max(0.0, failing.retry_at - mono) if (failing := self._failing.get(row[0])) else max(0.0, row[8] - now)
            for row in rows
        ]
        return min(waits, default=None)

    def run(self, stop: StopToken, *, lease: v.Duration = 30.0, owner: str | None = None) -> None:
        """Lead (or wait to lead) until ``stop``: renew → fire → sleep, riding out database
        errors (see ``LeaderLoop``). Raises LeadershipLost when the database refused to renew
        the lease, before ticking again."""
        from ._schedule_runner import LeaderLoop

        ttl = v.duration(lease, "lease", inclusive=False)
        LeaderLoop(self, ttl, owner or f"scheduler-{uuid.uuid4().hex}").run(stop)
