"""The claim loop: one loop for every queue a worker serves, claiming as many jobs as there
are free slots, fairly; idle queues cost nothing until a wake-up, their next due time or
the re-poll; a queue whose claims fail backs off (capped) without holding up the others.

How it chooses, each round (docs/worker.md, "Several queues"):

- a queue is **ready** when it was woken (a committed enqueue into it), its last claim
  came back full (there may be more), or its next due time or re-poll has come — and it
  is not backing off after a failed claim;
- the ready queues are taken in round-robin order, starting after the queue that went
  first in the previous round, and the free slots are split evenly between them (the
  first ones in that order get the remainder). With fewer free slots than ready queues,
  the queues take **turns**: the first in that order takes up to ``batch_size`` of the
  free slots, the next one up to ``batch_size`` of what is left (a queue short of its turn
  leaves the rest to the next at once), and so on, all in one ``claim_turns`` call (one
  PostgreSQL statement, one SQLite transaction); the next round starts after the last one
  served. So 1,000 queues of a few jobs each cost about one claim per round, not one per
  job;
- each queue's share is claimed with one ``claim_batch`` (at most ``batch_size``). A claim
  that comes back short puts its queue to sleep until a wake, its next due job (one
  ``next_due_many`` read for all the queues the round left idle) or the re-poll; slots it
  left unused go to the other queues in the next round, at once.

So a queue with a backlog cannot starve a quiet one: once the quiet one is ready it is
claimed in the next round that has a free slot, or the one after.

A queue whose settings (SPEC §14) hold its claims back — paused, a full concurrency limit
or rate window — sleeps by them instead of by its next due job (which would say "now"
while ready jobs wait): until the rate window frees a place, a claim lapses, one of this
worker's own jobs of the queue finishes, or a wake (a resume or a changed limit).

Where a claim runs: slots freed on a worker thread (a batch of acks written, an outcome
recorded), or on the event loop by a batch of acks it wrote while no job ran (acker.py),
are claimed for on that same thread, right away (``claim_freed``); the claimer's
own thread claims for wakes, due times, re-polls and backoffs, and whenever such a round
could not fill the free slots. Rounds never overlap (one lock), so the choice above is the
same wherever a round runs. Handing every freed slot to the claimer's thread would cost a
thread wake-up per batch, which on a busy worker is as much as the claim itself.

Where the backend says so (``acks_ride_claims``), a batch of acks not yet written
is offered to that round instead (``claim_along``): the acks go out in the transaction of
its first claim, and are settled (outcomes recorded, slots freed) before the jobs it
claimed start.

An outage is logged once per queue: a WARNING at the first failed claim, DEBUG for the
ones after it, and an INFO line when claims work again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._limits import limit_wait
from ..errors import AlkstoreError, StoreClosed
from ..queue import JobHandle, Queue, ack_and_claim_turns, claim_turns
from ..stop import Nudge, StopToken

if TYPE_CHECKING:
    from .acker import Ride

log = logging.getLogger("alkstore_sa")

BACKOFF_START = 0.1  # seconds after the first failed claim
_MAX_DOUBLINGS = 32  # 0.1 s * 2**32 is 13 years: past any cap, and far from float overflow


def _nothing(_queue: str) -> None:
    return None


def claim_backoff(failures: int, cap: float) -> float:
    """Seconds to wait after ``failures`` consecutive failed claims: 0.1 s doubling per
    failure, at most ``cap``. The exponent is capped, so an outage of any length (any
    ``failures``) gives a finite delay."""
    doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
    return min(BACKOFF_START * 2.0**doublings, cap)


class _Outage:
    """Consecutive claim failures of one queue, so each outage is logged once."""

    def __init__(self, queue: str, cap: float) -> None:
        self.queue = queue
        self.cap = cap
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: AlkstoreError) -> float:
        """Count a failure, log it (WARNING for the first one only); the delay before the
        next try."""
        self.failures += 1
        delay = claim_backoff(self.failures, self.cap)
        if self.failures == 1:
            self.since = time.monotonic()
            log.warning(
                "claim on %r failed (%s); retrying with backoff (0.1s doubling, at most %.1fs) "
                "until it works", self.queue, exc, self.cap,
            )
        else:
            log.debug("claim on %r failed again (%s); retrying in %.1fs", self.queue, exc, delay)
        return delay

    def recovered(self) -> None:
        if self.failures:
            log.info(
                "claim on %r works again after %d failed attempt(s) over %.1fs",
                self.queue, self.failures, time.monotonic() - self.since,
            )
            self.failures = 0


class _Source:
    """One queue the claimer serves, and what it knows about it."""

    def __init__(self, queue: Queue, poll_interval: float) -> None:
        self.queue = queue
        self.outage = _Outage(queue.name, poll_interval)
        self.woken = True  # claim at the next chance: start-up, a wake, a full batch, a failed claim
        self.due = 0.0  # monotonic time a claim is due anyway (its next due job, or the re-poll)
        self.not_before = 0.0  # monotonic time before which it is not claimed (backoff)
        # its concurrency limit (SPEC §14) was full at its last claim: one of our own jobs of
        # it finishing makes room, so that wakes it (others' acks are seen at the re-poll)
        self.capped = False
        # how many of our own jobs of it finished so far: one that finished while a claim
        # was deciding ``capped`` (after the limit was read, before the flag was set) is
        # seen by comparing this count, so its room is never missed
        self.finishes = 0
        # its limits held its last claim back and time alone lets a job through (a rate
        # window, a claim lapsing): seconds until then, as the limits said; else None
        self.held_for: float | None = None
        # burst: its limits hold back jobs that are ready now; it is claimed again when
        # they could pass (its due time), not at every turn of the loop
        self.held_ready = False
        # it has settings (SPEC §14), yet they did not hold it at its last idle look: a claim
        # that came back short may still have left ready jobs (burst looks again)
        self.unheld_limited = False

    def ready(self, now: float) -> bool:
        return now >= self.not_before and (self.woken or now >= self.due)

    def ready_at(self) -> float:
        return self.not_before if self.woken else max(self.not_before, self.due)


_Idle = tuple[_Source, int, bool]
"""A queue whose claim came back short: (source, its finished count before the claim,
whether the round was still clean)."""


class Claimer:
    """Claims for one worker from its queues; hands each batch to ``start`` (roster + runner)."""

    def __init__(
        self,
        queues: list[Queue],
        worker_id: str,
        *,
        batch_size: int,
        poll_interval: float,
        free: Callable[[], int],
        busy: Callable[[], int],
        start: Callable[[list[JobHandle]], None],
        nudge: Nudge,
    ) -> None:
        self.sources = [_Source(q, poll_interval) for q in queues]
        self._by_name = {s.queue.name: s for s in self.sources}
        self._index = {s.queue.name: i for i, s in enumerate(self.sources)}
        # burst: the queues whose last claim, made with nothing in flight, found nothing
        # (emptied whenever a claim hands out jobs)
        self._drained: set[_Source] = set()
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self._free, self._busy, self._start = free, busy, start
        self._nudge = nudge  # set by a wake-up, a freed slot, or stop
        self._next = 0  # where the next round's round-robin order starts
        # one round at a time, on the claimer's thread or the thread that freed slots
        self._round_lock = threading.Lock()
        self._claiming = False  # run() is on: rounds may run (off before it starts and once it ended)
        # says that this worker now waits for a wake of a queue (PgHub.advertise: enqueues
        # notify only while someone waits); set by the runtime from its wake hub, a no-op
        # where wakes need no advertising or there is no hub
        self.advertise: Callable[[str], None] = _nothing
        self._stop = StopToken()

    def wake(self, queue: str) -> None:
        """A committed enqueue into ``queue``, or a change of its settings (called on the
        wake hub's thread)."""
        source = self._by_name.get(queue)
        if source is not None:
            source.woken = True
            self._nudge.set()

    def finished(self, queue: str) -> None:
        """One of this worker's jobs of ``queue`` finished (its outcome recorded): if the
        queue's concurrency limit held its claims back, there may be room now. The slot
        freed right after this nudges the loop."""
        source = self._by_name.get(queue)
        if source is not None:
            source.finishes += 1
            if source.capped:
                source.woken = True

    def run(self, stop: StopToken, burst: bool) -> None:
        """Until ``stop`` (or, with ``burst``, until nothing is claimable and nothing runs)."""
        self._stop = stop
        self._claiming = True
        try:
            while not stop.stopped:
                with self._round_lock:
                    free = self._free()
                    if free > 0:
                        if burst and self._busy() == 0:
                            if len(self._drained) == len(self.sources):
                                return
                            for s in self.sources:  # the burst ends only once every queue was found empty
                                s.woken = s.woken or (s not in self._drained and not s.held_ready)
                        ready = self._ready(time.monotonic(), free + 1)
                        if ready:
                            self._round(ready, free, clean=burst and self._busy() == 0)
                            continue
                    sleep = self._sleep(free)
                # The flags above carry every reason to claim; the nudge only ends the sleep, so
                # a wake that lands between reading them and clearing it is still seen next turn.
                self._nudge.wait(sleep)
                self._nudge.clear()
        finally:
            with self._round_lock:
                self._claiming = False

    def claim_freed(self) -> None:
        """Slots were just freed on this (worker) thread: claim for them here, at once, with
        no thread wake-up. The claimer's thread is nudged instead when it is in a round
        itself, when no queue is ready, or when this round left slots free (it then sleeps
        by the queues' due times); never after the worker stopped claiming."""
        if not self._round_lock.acquire(blocking=False):
            self._nudge.set()  # its round ends soon and looks at the free slots
            return
        filled = False
        try:
            if self._claiming and not self._stop.stopped:
                free = self._free()
                ready = self._ready(time.monotonic(), free + 1) if free > 0 else []
                if ready:
                    self._round(ready, free, clean=False)  # burst's drained check is the claimer's own
                filled = self._free() <= 0
        except StoreClosed:
            pass  # the claimer's own round, nudged below, ends run() with it
        except Exception:  # noqa: BLE001 - a bug here must not cost the thread; the claimer's own round follows
            log.exception("claiming for freed slots failed unexpectedly")
        finally:
            self._round_lock.release()
        if not filled:
            self._nudge.set()

    def claim_along(self, ride: Ride) -> None:
        """A batch of acks is about to free ``ride.freeing`` slots on this (worker) thread:
        claim for them (and any other free slot) in the same transaction as the acks
        (``ack_and_claim_turns``), settling the ride once that committed and before the
        claimed jobs start. The ride is left unsettled — the acker writes it on its own,
        then frees the slots as usual — when no round can run here now (the claimer's
        thread is in one, the worker stopped claiming, no queue is ready, or the first ready
        queue has settings: it is claimed through its limits), or when the transaction
        failed (the round stops there: the slots are not free until the acks are written)."""
        if not self._round_lock.acquire(blocking=False):
            return
        filled = False
        try:
            if self._claiming and not self._stop.stopped:
                free = self._free() + ride.freeing
                ready = self._ready(time.monotonic(), free + 1)
                if ready and ready[0].queue.name not in ready[0].queue.store._limited_queues:
                    self._round(ready, free, clean=False, ride=ride)
                    filled = self._free() <= 0
        except StoreClosed:
            pass  # as claim_freed; the acks are then written on their own (and refused likewise)
        except Exception:  # noqa: BLE001 - as claim_freed: the claimer's own round follows
            log.exception("claiming along with a batch of acks failed unexpectedly")
        finally:
            self._round_lock.release()
        if ride.settled and not filled:
            self._nudge.set()  # as claim_freed: the claimer's thread sleeps by the queues' due times

    def _ready(self, now: float, limit: int) -> list[_Source]:
        """The ready queues in this round's round-robin order, the first ``limit`` of them
        (a scan that stops there: with many queues, a round looks at few)."""
        ready: list[_Source] = []
        count = len(self.sources)
        for k in range(count):
            s = self.sources[(self._next + k) % count]
            if s.ready(now):
                ready.append(s)
                if len(ready) == limit:
                    break
        return ready

    def _shares(self, ready: list[_Source], free: int) -> list[int]:
        """Each ready queue's share of ``free`` slots, in order. As many slots as ready
        queues or more: split evenly (the first ones get the remainder). Fewer: the queues
        take turns, each taking up to ``batch_size`` of what is left — one claim statement
        per turn, not one per job, when many queues each hold a few jobs."""
        if len(ready) <= free:
            base, extra = divmod(free, len(ready))
            return [min(base + (1 if i < extra else 0), self.batch_size) for i in range(len(ready))]
        shares: list[int] = []
        while free > 0:
            shares.append(min(free, self.batch_size))
            free -= shares[-1]
        return shares

    def _round(self, ready: list[_Source], free: int, *, clean: bool, ride: Ride | None = None) -> None:
        """Share ``free`` slots out over the ready queues and claim each share. ``clean``:
        nothing is in flight, so an empty claim proves the queue drained (for burst).
        ``ride``: acks written in the first claim's transaction (``claim_along``; the first
        queue has no settings)."""
        if len(ready) > free and not any(s.queue.name in s.queue.store._limited_queues for s in ready):
            self._turns(ready, free, clean=clean, ride=ride)
            return
        shares = self._shares(ready, free)
        # next round: after the first queue of this one; when queues outnumber the free
        # slots, after the last one served (the others go first next round)
        first = ready[0] if len(ready) <= free else ready[len(shares) - 1]
        self._next = (self._index[first.queue.name] + 1) % len(self.sources)
        idle: list[_Idle] = []
        for s, want in zip(ready, shares, strict=False):  # the ready queues past the shares wait
            if want <= 0:
                break
            s.woken = False  # cleared before the claim: a wake that comes during it is kept
            finishes = s.finishes
            try:
                if ride is None:
                    handles: list[JobHandle] | None = s.queue.claim_batch(self.worker_id, want)
                else:
                    ((want, handles),) = self._claim_with(ride, [s], want)
                    ride = None
            except AlkstoreError as exc:
                self._failed(s, exc)
                if ride is not None:
                    break  # its slots are not free until the acks are written on their own
                continue
            if handles is None:
                s.woken = True  # it has settings after all: claimed through its limits next round
                continue
            clean = self._claimed(s, want, handles, finishes, clean, idle)
        self._rest(idle)

    def _claim_with(self, ride: Ride, sources: list[_Source], budget: int) -> list[tuple[int, list[JobHandle] | None]]:
        """The acks of ``ride`` and the claims of ``sources`` in turn (up to ``batch_size``
        each, ``budget`` in all) in one transaction; the ride is settled once it committed."""
        store = sources[0].queue.store
        landed, taken = ack_and_claim_turns(
            store, ride.handles, self.worker_id, [s.queue for s in sources], self.batch_size, budget
        )
        ride.settle(landed)
        return taken

    def _turns(self, ready: list[_Source], free: int, *, clean: bool, ride: Ride | None = None) -> None:
        """Queues outnumber the free slots: they take turns in one call (``claim_turns``),
        each up to ``batch_size`` of what is left, so a queue holding fewer jobs than its turn
        leaves the rest to the next one at once (one SQLite transaction for them all). The
        next round starts after the last queue served."""
        for s in ready:
            s.woken = False  # cleared before the claim: a wake that comes during it is kept
        finishes = [s.finishes for s in ready]
        try:
            if ride is None:
                taken = claim_turns(ready[0].queue.store, self.worker_id, [s.queue for s in ready], self.batch_size, free)
            else:
                taken = self._claim_with(ride, ready, free)
        except AlkstoreError as exc:
            for s in ready:
                self._failed(s, exc)
            return
        served = ready[len(taken) - 1]  # free > 0: at least one turn was taken
        self._next = (self._index[served.queue.name] + 1) % len(self.sources)
        for s in ready[len(taken):]:
            s.woken = True  # not reached: the budget was spent before its turn
        idle: list[_Idle] = []
        for s, (want, handles), done in zip(ready, taken, finishes, strict=False):
            if handles is None:
                s.woken = True  # it has settings: claimed through its limits next round
                continue
            clean = self._claimed(s, want, handles, done, clean, idle)
        self._rest(idle)

    def _failed(self, s: _Source, exc: AlkstoreError) -> None:
        if isinstance(exc, StoreClosed):
            raise exc  # no retry can work: run() ends with it (SPEC §3)
        s.woken = True  # try again once the backoff is over
        s.not_before = time.monotonic() + s.outage.failed(exc)

    def _claimed(
        self, s: _Source, want: int, handles: list[JobHandle], finishes: int, clean: bool, idle: list[_Idle]
    ) -> bool:
        """Deal with one queue's claim of up to ``want`` jobs (``finishes``: its count of
        our finished jobs before the claim): its jobs start now; a short claim puts it on
        ``idle`` (``_rest``, once the round's claims are dealt with). Whether the round is
        still clean."""
        s.not_before = 0.0
        s.outage.recovered()
        s.held_ready = False
        if handles:
            self._start(handles)
            clean = False
            self._drained.clear()  # jobs run now may enqueue more anywhere
        if len(handles) == want:
            s.woken = True  # a full batch: there may be more
        else:
            idle.append((s, finishes, clean))
        return clean

    def _rest(self, idle: list[_Idle]) -> None:
        """The queues whose claims came back short sleep until their next due time or their
        limits (``_idle_waits``: one read for them all), and wait for a wake."""
        if not idle:
            return
        waits = self._idle_waits([s for s, _, _ in idle])
        now = time.monotonic()
        for (s, finishes, clean), wait in zip(idle, waits, strict=True):
            s.due = now + wait
            if s.capped and s.finishes != finishes:
                s.woken = True  # one of ours finished while the limit was being read
            s.held_ready = clean and s.held_for is not None and self._ready_now(s)
            if clean and s.unheld_limited and self._ready_now(s):
                # its claim came back short under its limits, which no longer hold it by the
                # time they were read (a rate window that freed meanwhile): ready jobs are
                # left, so it is not drained; claimed again at once
                s.woken = True
                self._drained.discard(s)
            elif clean and not s.held_ready:
                self._drained.add(s)
            else:
                self._drained.discard(s)
            # waiting from now on; the hub wakes the queue once more when its presence
            # is settled, for the enqueues that looked before it was taken
            self.advertise(s.queue.name)

    def _ready_now(self, s: _Source) -> bool:
        """Whether the queue holds a job a claim could take now but for its limits (burst:
        such jobs are ready, so the burst waits for its limits to let them through)."""
        store = s.queue.store
        try:
            with store.executor(retry=True) as ex:  # a read
                return store.backend.next_due(ex, {"queue": s.queue.name, "now": store.now()}) == 0.0
        except AlkstoreError as exc:
            log.warning("could not read whether %r has ready jobs: %s", s.queue.name, exc)
            return True  # not proven drained: looked at again when its limits allow

    def _sleep(self, free: int) -> float:
        """Seconds until a queue becomes ready (at most poll_interval); with no free slot,
        until a slot frees (which nudges), bounded by poll_interval."""
        if free <= 0:
            return self.poll_interval
        until = min(s.ready_at() for s in self.sources) - time.monotonic()
        return min(self.poll_interval, max(until, 0.001))

    def _idle_waits(self, sources: list[_Source]) -> list[float]:
        """For each queue: sleep until its next delayed job is due or a claim lapses, at
        most poll_interval. A queue whose settings hold claims back (paused, a full
        concurrency limit or rate window) sleeps until they could let one through instead:
        the rate window's next free place, a lapse, or a wake (a resume, a raised limit, one
        of our jobs done). The next due times of the others are one read
        (``next_due_many``: on PostgreSQL one statement however many queues went idle)."""
        store = sources[0].queue.store
        waits: dict[_Source, float] = {}
        for s in sources:
            try:
                held = limit_wait(store, s.queue.name)
            except AlkstoreError as exc:
                log.warning("could not read the limits of %r: %s", s.queue.name, exc)
                s.held_for = self.poll_interval  # unknown: not proven drained (burst)
                waits[s] = self.poll_interval
                continue
            s.capped = held is not None and held[1]
            s.unheld_limited = held is None and s.queue.name in store._limited_queues
            s.held_for = None if held is None else held[0]
            if held is not None:
                wait = held[0]
                waits[s] = self.poll_interval if wait is None else min(self.poll_interval, wait + 0.001)
        rest = [s for s in sources if s not in waits]
        if rest:
            names = [s.queue.name for s in rest]
            try:
                with store.executor() as ex:
                    due = store.backend.next_due_many(ex, {"queues": names, "now": store.now()})
            except AlkstoreError as exc:
                log.warning("could not read the next due time of %s: %s", ", ".join(map(repr, names)), exc)
                due = {}
            for s in rest:
                when = due.get(s.queue.name)
                waits[s] = self.poll_interval if when is None else min(self.poll_interval, when + 0.001)
        return [waits[s] for s in sources]
