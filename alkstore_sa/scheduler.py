"""The scheduler (SPEC §7, §14): ``@every`` and cron schedules firing into queues, run by
one elected leader at a time.

``@every`` boundaries are the multiples of the interval since the Unix epoch (``@every 1h``
fires at the top of each hour, UTC); cron boundaries are the fire instants of the
expression in the schedule's zone (``cron.py``). A tick fires each due schedule in its own
transaction: the boundary advance (an UPDATE that row-locks the schedule and checks the
boundary it read) and the enqueue of the fires commit together, so a crash mid-tick refires
and a second ticker cannot double-fire. Missed boundaries replay one by one, at most 64 per
schedule per tick (and at most what one enqueue_many batch of its payload carries), then the
schedule skips forward to the next boundary after now.

Older runners: a cron row stores ``interval = CRON_INTERVAL`` (not a real interval: the
last second of year 9999). A runner of a version without cron reads only ``interval`` and
``next_fire_at``: it fires a due cron row once, on its boundary, with its stamps, then
advances it by "one interval" to exactly that instant, parking it. A current runner finds
parked rows (``next_fire_at = interval = CRON_INTERVAL``) as due and moves them to their
next boundary after now without firing: nothing fires twice or off its boundary.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from dataclasses import dataclass
from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from . import _validate as v
from . import cron
from ._retry import Backoff, Outage
from ._rows import number, ts
from .errors import AlkstoreError, InvalidSpec, PayloadError
from .model import Schedule
from .queue import DEFAULT_OPTS, enqueue_params
from .stop import StopToken

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("alkstore_sa")

LEADER_LOCK = "__alkstore_scheduler"
MAX_CATCHUP = 64
# The longest a fire waits for its schedule's row while another transaction holds it (a
# registration, a second ticker: milliseconds; a ticker paused mid-fire: unbounded). Past
# it the fire fails like any other (retried on the schedule's backoff) and the tick goes on
# with the other schedules. A runner waits at most a sixth of its lease.
FIRE_LOCK_WAIT = 5.0
# A schedule that cannot fire is retried after 0.5 s, 1 s, 2 s, ... at most a minute apart.
SCHEDULE_RETRY = (0.5, 60.0)
_SPEC = re.compile(r"@every ([0-9]+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The stored ``interval`` of a cron row, and where an older runner parks one it fired (see
# the module docstring): over MAX_DURATION, so no ``@every`` row has it, and not a whole
# minute, so no cron boundary is it.
CRON_INTERVAL = 253402300799.0  # 9999-12-31T23:59:59Z


def parse_spec(spec: object) -> int:
    """Seconds between boundaries of ``@every <n><s|m|h|d>`` (n >= 1); InvalidSpec otherwise."""
    if not isinstance(spec, str):
        raise InvalidSpec(spec)
    match = _SPEC.fullmatch(spec)
    digits = "" if match is None else match.group(1).lstrip("0")
    if match is None or not digits:
        raise InvalidSpec(spec)
    # (more than 12 digits is past 100 years in any unit; int() refuses thousands of them)
    seconds = int(digits) * _UNIT[match.group(2)] if len(digits) <= 12 else int(v.MAX_DURATION) + 1
    if seconds > v.MAX_DURATION:
        raise InvalidSpec(spec, f"invalid schedule spec {spec!r}: the interval exceeds 100 years")
    return seconds


@dataclass(frozen=True)
class Timing:
    """A schedule's boundaries: every ``interval`` seconds since the epoch, or the fire
    instants of ``cron`` in ``zone``."""

    spec: object
    interval: int | None
    cron: cron.Cron | None
    zone: tzinfo

    def after(self, t: float) -> float:
        """The first boundary strictly after ``t``."""
        if self.cron is None:
            assert self.interval is not None
            return next_boundary(t, self.interval)
        try:
            return cron.next_fire(self.cron, self.zone, t)
        except (ValueError, OverflowError) as exc:  # past year 9999
            raise InvalidSpec(self.spec, f"schedule spec {self.spec!r} has no boundary after {t}: {exc}") from None


def timing(spec: object, tz: object = "UTC") -> Timing:
    """The boundaries of ``spec`` in zone ``tz``; InvalidSpec (``.spec`` = ``spec``) for a bad
    spec or an unknown zone (checked for ``@every`` too, where it changes nothing)."""
    zone = cron.zone(spec, tz)
    if cron.is_cron(spec):
        assert isinstance(spec, str)
        return Timing(spec, None, cron.parse(spec), zone)
    return Timing(spec, parse_spec(spec), None, zone)


def next_boundary(now: float, interval: float) -> float:
    """The first boundary strictly after ``now``."""
    return (math.floor(now / interval) + 1) * interval


def fires_due(next_fire_at: float, now: float, interval: float) -> int:
    """How many boundaries from ``next_fire_at`` to ``now`` (inclusive) have elapsed. One
    written by hand as minus infinity is due as long ago as can be: more than any cap (its
    count overflowed)."""
    if next_fire_at > now:
        return 0
    elapsed = (now - next_fire_at) / interval
    return math.floor(elapsed) + 1 if math.isfinite(elapsed) else _ALWAYS_MORE


# More boundaries than any catch-up fires (fires_due of an infinite gap): well past the cap
_ALWAYS_MORE = 2**63


def _boundary(stored: Any) -> float | None:
    """A stored next_fire_at as a boundary to wait for, or None: one written by hand that is
    no number (NaN on PostgreSQL, text SQLite keeps) is never due — each database orders it
    above every number — and a wait for it was 0 (a busy loop) or raised TypeError."""
    if stored is None:
        return None
    value = number(stored)
    return None if math.isnan(value) else value


def stored_interval(name: str, spec: object, interval: float) -> float:
    """An ``@every`` schedule's stored interval, which a spec gives as 1 s to 100 years. One
    edited by hand outside that (zero, negative, NaN, infinite, or text SQLite keeps, read as
    NaN) cannot fire: zero raised ZeroDivisionError out of the tick, so no schedule after it
    fired; half a second fired the whole catch-up at every tick. InvalidSpec: the schedule
    fails alone, logged as any that cannot fire."""
    if not 1 <= interval <= v.MAX_DURATION:
        raise InvalidSpec(
            spec, f"schedule {name!r}: its stored interval {interval!r} is not 1 s to 100 years "
            "(a row edited by hand?); register the schedule again",
        )
    return interval


def schedule_from_row(row: tuple[Any, ...], *, decode: bool = True) -> Schedule:
    """A schedule row as a Schedule; ``decode=False``: its payload is left None (the
    operator tools show the stored text beside it)."""
    name, spec, interval, queue, payload, priority, max_attempts, expires, next_fire, created, updated, tz = row
    return Schedule(
        name=name, spec=spec, interval=None if interval == CRON_INTERVAL else number(interval), queue=queue,
        payload=v.decode_payload(payload) if decode else None, priority=priority, max_attempts=max_attempts,
        expires=None if expires is None else float(expires), next_fire_at=ts(next_fire),  # type: ignore[arg-type]
        created_at=ts(created), updated_at=ts(updated), tz=tz,  # type: ignore[arg-type]
    )


def _cron_fires(when: Timing, old: float, now: float) -> tuple[int, float, bool]:
    """(fires, next boundary, whether boundaries beyond the cap were skipped) for a cron
    schedule due at ``old``: its boundaries up to ``now`` one by one, at most MAX_CATCHUP,
    then the first boundary after ``now``."""
    count, nxt = 0, old
    while nxt <= now and count < MAX_CATCHUP:
        count += 1
        nxt = when.after(nxt)
    if nxt <= now:
        return count, when.after(now), True
    return count, nxt, False


@dataclass
class _Failing:
    """A schedule whose fires fail: its failure streak, the row it is about (the schedule's
    version, ``updated_at``, and the boundary it was due at), and when (monotonic) the
    runner may try it again."""

    outage: Outage
    version: float  # the schedule's updated_at (epoch seconds)
    boundary: Any  # its next_fire_at as stored when it failed
    retry_at: float = 0.0

    def about(self, row: tuple[Any, ...]) -> bool:
        """Whether ``row`` (a schedule row) is still the one that failed. A row re-registered
        since (a fix, perhaps), or whose boundary moved — another ticker fired it: what held
        its row lock, a ticker paused mid-fire, committed — is tried at once, not after the
        rest of a backoff that may have grown to a minute over a long pause."""
        return self.version == float(row[10]) and self.boundary == row[8]


class Scheduler:
    """Schedule registration and the leader-elected tick loop of one store."""

    def __init__(self, store: Store) -> None:
        self.store = v.store(store)
        self._failing: dict[str, _Failing] = {}
        self.fire_lock_wait = FIRE_LOCK_WAIT  # seconds (PostgreSQL; see FIRE_LOCK_WAIT)

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
        tz: str = "UTC",
    ) -> None:
        """Create or update the schedule ``name``. An unchanged ``@every`` interval keeps its
        next boundary, and so does an unchanged cron spec in an unchanged zone."""
        self.store._check_open()
        name = v.name(name, "schedule name")
        when = timing(spec, tz)
        queue = v.name(queue, "queue name")
        params = {
            "name": name, "spec": spec, "queue": queue, "tz": tz, "cron_interval": CRON_INTERVAL,
            "interval": CRON_INTERVAL if when.interval is None else float(when.interval),
            "payload": v.encode_payload(payload, self.store.max_payload_bytes),
            "priority": v.int32(priority, "priority"),
            "max_attempts": None if max_attempts is None else v.max_attempts(max_attempts),
            "expires": v.optional_lease(expires, "expires"),
        }
        # retried once after a disconnect, like the scheduler's reads: the clock read is a
        # read, and a repeat of an upsert that landed writes the same definition again (an
        # unchanged interval keeps its boundary; a changed one comes from the same reading)
        with self.store.executor(retry=True) as ex:
            now = self.store.backend.read_now(ex, self.store.now())
            params["now"] = now
            params["next_fire_at"] = when.after(now)
            self.store.backend.schedule_upsert(ex, params)

    def unschedule(self, name: str) -> bool:
        self.store._check_open()
        name = v.name(name, "schedule name")
        with self.store.executor() as ex:
            return self.store.backend.schedule_delete(ex, {"name": name})

    def schedules(self) -> list[Schedule]:
        """Every schedule, by name in code point order on both engines (the SQL's ORDER BY
        follows PostgreSQL's collation, which a linguistic locale such as en_US.UTF-8 makes
        blind to case and punctuation: names are exact values). A row whose stored payload
        does not decode (edited by hand) fails the list with a PayloadError naming it."""
        listed = []
        for row in self._rows():
            try:
                listed.append(schedule_from_row(row))
            except PayloadError as exc:
                raise PayloadError(
                    f"schedule {row[0]!r}: {exc} (register it again to replace the payload, or "
                    "unschedule it; `alkstore schedules` lists every schedule with its stored text)"
                ) from None
        return listed

    def stored(self) -> list[tuple[Schedule, str]]:
        """Every schedule, by name, its payload not decoded (None) beside the text as
        stored: what the operator tools list, so that one payload that is not JSON (a row
        edited by hand) hides no schedule."""
        return [(schedule_from_row(r, decode=False), r[4]) for r in self._rows()]

    def _rows(self) -> list[tuple[Any, ...]]:
        """The schedule rows, by name in code point order (see ``schedules``)."""
        self.store._check_open()
        with self.store.executor(retry=True) as ex:  # a read
            rows = self.store.backend.schedule_list(ex, {}, due=False)
        return sorted(rows, key=lambda r: r[0])

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
        with self.store.executor(retry=True) as ex:  # reads (each fire below is a write: never retried)
            now = backend.read_now(ex, self.store.now())
            rows = backend.schedule_list(ex, {"now": now, "cron_interval": CRON_INTERVAL}, due=True)
        fired = 0
        due = set()
        for row in rows:
            name, version = row[0], float(row[10])  # updated_at: the definition's version
            due.add(name)
            failing = self._failing.get(name)
            if failing is not None and not failing.about(row):
                # re-registered or fired by another ticker since it failed: try it now
                failing.version, failing.boundary, failing.retry_at = version, row[8], 0.0
            if paced and failing is not None and failing.retry_at > time.monotonic():
                continue
            try:
                sched = schedule_from_row(row)  # a payload stored malformed fails this one alone
                # a lease per fire: a connection broken by one fire is dropped, not reused
                with self.store.executor() as ex:
                    fired += self._fire(ex, sched, row[8], now)
            except AlkstoreError as exc:
                if failing is None:
                    failing = self._failing[name] = _Failing(
                        Outage(log, f"schedule {name!r}", Backoff(*SCHEDULE_RETRY), level=logging.ERROR),
                        version, row[8],
                    )
                failing.retry_at = time.monotonic() + failing.outage.failed("could not fire", exc)
            else:
                if failing is not None:
                    failing.outage.recovered()
                    del self._failing[name]
        for name in set(self._failing) - due:
            del self._failing[name]  # no longer due: fired by another ticker, moved or removed
        return fired

    def _fire(self, ex: Any, sched: Schedule, old: float, now: float) -> int:
        if sched.interval is not None:
            interval = stored_interval(sched.name, sched.spec, sched.interval)
            due = fires_due(old, now, interval)
            count = min(due, MAX_CATCHUP)
            nxt = next_boundary(now, interval)
            # how many were skipped, or True: some (uncounted: due from minus infinity)
            skipped: int | bool = due - count if due < _ALWAYS_MORE else True
        elif old == CRON_INTERVAL:
            return self._unpark(ex, sched, now)
        else:
            count, nxt, skipped = _cron_fires(timing(sched.spec, sched.tz), old, now)
        if count == 0:
            return 0
        backend = self.store.backend
        with ex.transaction():
            # a ticker paused holding this row must not stall the leader (FIRE_LOCK_WAIT)
            backend.schedule_fire_lock_wait(ex, {"ms": str(max(1, round(self.fire_lock_wait * 1000)))})
            current = backend.schedule_advance(ex, {"name": sched.name, "old": old, "next": nxt})
            if current is None:
                return 0  # another ticker fired these boundaries
            # the definition under the row lock: a re-registration keeping the boundary may
            # have committed since the tick read ``sched`` (a bad one rolls the advance back)
            queue, payload, priority, max_attempts, expires = current
            params = enqueue_params(
                self.store, queue, DEFAULT_OPTS, delay=None, run_at=None, priority=priority,
                max_attempts=max_attempts, expires=None if expires is None else float(expires),
            )
            payload, size = v.encode_sized(v.decode_payload(payload), self.store.max_payload_bytes)
            # the catch-up is one enqueue_many: at most what one batch carries (a large payload
            # times MAX_CATCHUP passed the ~1 GB a statement takes, and the fire failed at
            # every retry); the boundaries beyond are skipped as those beyond the cap are
            room = v.batch_room(size)
            if count > room:
                skipped = True if skipped is True else skipped + count - room
                count = room
            backend.enqueue_many(ex, params, [payload] * count)
        if skipped:
            log.warning(
                "schedule %r: %s missed boundaries beyond the catch-up cap were skipped", sched.name,
                "its" if skipped is True else skipped,  # cron: counting them could take long
            )
        log.debug("schedule %r fired %d time(s) into %r", sched.name, count, queue)
        return count

    def _unpark(self, ex: Any, sched: Schedule, now: float) -> int:
        """A cron row an older runner fired and parked (module docstring): its fired boundary
        is done, later ones are unknown; resume at the next boundary after now."""
        nxt = timing(sched.spec, sched.tz).after(now)
        with ex.transaction():
            if self.store.backend.schedule_advance(ex, {"name": sched.name, "old": CRON_INTERVAL, "next": nxt}) is not None:
                log.warning(
                    "schedule %r was fired by an older alkstore runner, which cannot compute cron "
                    "boundaries; it resumes at %s", sched.name, ts(nxt),
                )
        return 0

    def _seconds_to_next_fire(self) -> float | None:
        """Seconds until the next boundary, or None when there are no schedules; a schedule
        waiting out its retry backoff counts at its retry time instead (real seconds), unless
        its row changed since it failed (``_Failing.about``: the next tick tries it)."""
        backend = self.store.backend
        with self.store.executor(retry=True) as ex:  # reads
            now = backend.read_now(ex, self.store.now())
            if not self._failing:
                nxt = _boundary(backend.next_fire(ex, {}))
                return None if nxt is None else max(0.0, nxt - now)
            rows = backend.schedule_list(ex, {}, due=False)
        mono = time.monotonic()
        waits = []
        for row in rows:
            failing = self._failing.get(row[0])
            if failing is not None and failing.about(row):
                waits.append(max(0.0, failing.retry_at - mono))
            elif (nxt := _boundary(row[8])) is not None:
                waits.append(max(0.0, nxt - now))
        return min(waits, default=None)

    def run(self, stop: StopToken, *, lease: v.Duration = 30.0, owner: str | None = None) -> None:
        """Lead (or wait to lead) until ``stop``: renew → fire → sleep, riding out database
        errors (see ``LeaderLoop``). Raises LeadershipLost when the database refused to renew
        the lease, before ticking again."""
        from ._schedule_runner import LeaderLoop

        stop = v.stop_token(stop)
        ttl = v.lease(lease, "lease")
        LeaderLoop(self, ttl, owner or f"scheduler-{uuid.uuid4().hex}").run(stop)
