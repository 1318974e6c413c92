"""Batched acks: the acks of jobs that finish close together are written as one statement
(``queue.ack_claims``), whatever queues they are of, each row still fenced by its own job's
claim — id and attempt, processing, deadline not passed: the single ack's predicate — so an
ack whose claim lapsed meanwhile is not applied while the rest of its batch is.

A job whose handler or task returned is handed here (``add``) and keeps its slot. The
pending acks are written once

- they fill a batch (``max_batch``), or
- every job in flight is waiting for its ack (nothing else would join the batch soon), or
- the oldest has waited ``max_delay`` (a few milliseconds; a tenth of the job's visibility
  timeout if that is shorter).

A batch that an ``add`` on a runner thread makes due is written by that thread, with no
hand-off. So is one that an ``add`` on the event loop makes due because every job in
flight now waits for its ack and no other asyncio task is on the loop: nothing runs then,
on the loop or on a thread, and no job can start before this write frees their slots, so
blocking the loop for it holds up nobody; and the jobs that claim hands out start on the
loop with no wake-up either. A task a job left running in the background keeps the batch
off the loop (the writer thread writes it): it may hold what the write would wait for —
on SQLite, an open write transaction of the application's AsyncEngine holds the file's one
write lock until the loop lets it commit. The acker's own writer thread writes the batches that come due by time,
or from the event loop while other jobs still run there (they must not wait on the
database). The writer is woken only for an ack due before it would wake by itself, or
such a batch from the event loop: a thread that writes every batch costs it no wake-up
(a thread wake per batch, on two shared cores, costs more than the batch's Python work;
an async no-op task's worker on SQLite drained ~35% more jobs a second once the loop
wrote its own batches instead of waking the writer, which then woke the loop). Once an add had to wake it, the writer wakes by
itself every ``max_delay`` while acks keep coming (an ack added meanwhile is then due no
sooner than that tick, so it needs no wake-up), and sleeps until the next add after a tick
that saw none. One batch is written at a time, in the transaction of the claim for the
slots it frees (``Ride``: one SQLite transaction, one pipelined PostgreSQL round trip)
where the claimer can take it along, else as a statement of its own. The
writer then records each job's outcome as it landed (``finish``: counts, metrics, logs, the
heartbeat roster) and frees the batch's slots together (``release``), so the claimer's next
claim is one statement for all of them. Until its ack is written a job stays on the
heartbeat roster (its claim is still extended) and holds its slot, so ``concurrency`` and
``run(burst=True)`` count it as in flight and a graceful stop (which waits for every slot)
writes every pending ack before ``run()`` returns. A process that dies loses only the acks
not yet written: their jobs are claimed again after their visibility timeout and run once
more (delivery stays at least once).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..queue import JobHandle, ack_claims
from .outcomes import ACK, Outcome

if TYPE_CHECKING:
    from .dispatch import Work

log = logging.getLogger("alkstore_sa")

MAX_DELAY = 0.005  # seconds the oldest ack of a batch may wait for others to join it
STOP_TIMEOUT = 10.0  # seconds stop() waits for a write in progress (a database outage)

Answer = Callable[[JobHandle], bool]
"""What the ack of one job did, as ``settle`` asks it: True landed, False refused; raises
the error of a failed write."""


_Pending = tuple["Work", float]
"""An ack waiting for its batch: the job, and the ``time.monotonic()`` by which it must be
written (a tuple, not a class: one is made per job)."""


class Acker:
    """Collects the acks of a worker's jobs and writes them in batches."""

    def __init__(
        self,
        max_batch: int,
        *,
        in_flight: Callable[[], int],
        settling: Callable[[list[Work]], list[bool]],
        finish: Callable[[Work, Outcome, Answer], None],
        finish_landed: Callable[[list[Work]], None],
        release: Callable[[int, bool], None],
        max_delay: float | None = None,
    ) -> None:
        self.max_batch = max(1, max_batch)
        self.max_delay = MAX_DELAY if max_delay is None else max_delay
        self._in_flight = in_flight  # jobs holding a slot (those pending here included)
        # for each work: its outcome is written from now on (no more heartbeats); False: a
        # heartbeat of its claim was refused before, the claim is gone and its ack is not written
        self._settling = settling
        self._finish = finish  # records one job's outcome, given what its ack did
        # records the acks of a batch that landed, together (each claim was settling: asked above)
        self._finish_landed = finish_landed
        self._release = release  # frees this many slots at once (True: without nudging the claimer)
        # offers a batch to the claim for the slots it frees (``Ride``); None: never
        self.ride_with: Callable[[Ride], None] | None = None
        self._lock = threading.Lock()  # taken directly on the hot paths; waits go through _cond
        self._cond = threading.Condition(self._lock)
        self._pending: list[_Pending] = []
        self._first_due = float("inf")  # the earliest due time among _pending
        self._writing = False  # a batch is being written (by the writer or a runner thread)
        # when the writer wakes by itself (time.monotonic()): an add due before then wakes it,
        # one due later does not (it wakes in time anyway); -inf while a batch is written, as
        # whoever writes it tells the writer about what is pending once done
        self._wakes_at = float("inf")
        self._ticking = False  # the writer wakes every max_delay while acks keep coming
        self._added = False  # an ack was added since the writer's last tick
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="alkstore-acker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is pending, then end the writer thread (waiting at most STOP_TIMEOUT
        for a write that hangs)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT)
            if self._thread.is_alive():
                log.warning("the worker's ack writer did not finish within %gs; its claims will lapse", STOP_TIMEOUT)

    def add(self, w: Work, outcome: Outcome) -> bool:
        """Take over ``w``'s outcome if it is an ack (True; its slot is freed with its
        batch). Anything else, or once stopped, is left to the caller (False)."""
        if outcome.kind != "ack":
            return False
        now = time.monotonic()
        batch = None
        with self._lock:
            if self._stopping or self._thread is None:
                return False
            wait = w.handle._visibility_timeout / 10
            due = now + (wait if wait < self.max_delay else self.max_delay)
            self._pending.append((w, due))
            self._added = True
            if due < self._first_due:
                self._first_due = due
            due_now = self._due_in(now) <= 0
            if due_now and not self._writing and (
                asyncio._get_running_loop() is None
                or (len(self._pending) >= self._in_flight() and _alone_on_loop())
            ):
                # due now, on a runner thread — or on the event loop with every job in flight
                # waiting for its ack and no other asyncio task there, so nothing runs on the
                # loop (module docstring): written here, no hand-off
                batch = self._take()
            elif (due_now and not self._writing) or due < self._wakes_at:
                # the writer sleeps until the oldest one's due time: tell it about one due
                # before it wakes, and about a batch that is due now from the event loop
                # while jobs still run there (they must not wait on the database); a batch
                # being written is followed by a look at what is pending (_write_taken);
                # more acks are likely to follow this one, so the writer ticks from now on
                # (module docstring)
                self._ticking = True
                self._cond.notify()
        if batch is not None:
            self._write_taken(batch)
        return True

    def _take(self) -> list[_Pending]:
        """(Lock held.) The next batch, off the list; its writer is the caller."""
        pending = self._pending
        batch = pending[: self.max_batch]
        del pending[: self.max_batch]
        self._first_due = min((due for _, due in pending), default=float("inf"))
        self._writing = True
        return batch

    def _write_taken(self, batch: list[_Pending]) -> None:
        try:
            self._settle(batch)
        except BaseException:  # noqa: BLE001 - the slots it holds were freed; the writer lives on
            log.exception("recording a batch of acks failed unexpectedly; their claims will lapse")
        finally:
            with self._lock:
                self._writing = False
                if self._stopping or (self._pending and self._writer_needed()):
                    self._cond.notify()  # the writer looks at what came meanwhile
                elif not self._pending and self._wakes_at == float("-inf"):
                    self._wakes_at = float("inf")  # it waits for this write: the next add wakes it

    def _writer_needed(self) -> bool:
        """(Lock held, something pending, no batch being written.) Whether the writer must
        be woken for the pending acks: it waits for the write just done, or sleeps past
        their due time."""
        if self._wakes_at == float("-inf"):
            return True
        now = time.monotonic()
        return self._due_in(now) <= 0 or self._first_due < self._wakes_at

    def _due_in(self, now: float) -> float:
        """(Lock held, something pending.) Seconds until the pending acks must be written."""
        pending = self._pending
        if self._stopping or len(pending) >= self.max_batch or len(pending) >= self._in_flight():
            return 0.0
        return self._first_due - now

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._writing and not self._ticking:  # a runner thread writes a batch: one write at a time
                        wait, self._wakes_at = None, float("-inf")  # it notifies when done
                    elif self._pending and not self._writing:
                        now = time.monotonic()
                        wait = self._due_in(now)
                        if wait <= 0:
                            batch = self._take()
                            self._wakes_at = float("-inf")  # looks again after writing it
                            break
                        self._wakes_at = now + wait
                    elif self._stopping and not self._writing:
                        return
                    elif self._ticking:  # acks keep coming (or a batch is being written): look again in max_delay
                        wait = self.max_delay
                        self._wakes_at = time.monotonic() + wait
                        self._ticking, self._added = self._added, False  # a tick with no add is the last
                    else:
                        wait, self._wakes_at = None, float("inf")
                    self._cond.wait(wait)
            self._write_taken(batch)

    def _settle(self, batch: list[_Pending]) -> None:
        """Write the batch — in the transaction of the claim for the slots it frees, where
        the claimer takes it along (``Ride``), else as one statement of its own — then
        record each job's outcome and free the batch's slots together."""
        works = [w for w, _ in batch]
        writing = [w for w, live in zip(works, self._settling(works), strict=True) if live]
        ride_with = self.ride_with
        if writing and ride_with is not None:
            ride = Ride(self, works, writing)
            try:
                ride_with(ride)
            except BaseException:  # noqa: BLE001 - written on their own below, unless they landed
                log.exception("claiming along with a batch of acks failed unexpectedly")
            if ride.settled:
                return
        try:
            answers = self._write(writing)
        except BaseException:
            self._release(len(works), False)
            raise
        self._record(works, answers, claimed=False)

    def _record(self, works: list[Work], answers: dict[int, Answer], *, claimed: bool) -> None:
        """Record each job's outcome given its ack's answer — the acks that landed together
        (the usual case), each of the others (a lost claim, a refusal, a failed write) on its
        own — then free the slots (``claimed``: the claimer is already claiming for them)."""
        try:
            landed = []
            for w in works:
                answer = answers.get(id(w), _refused)
                if answer is _landed:
                    landed.append(w)
                    continue
                try:
                    self._finish(w, ACK, answer)
                except BaseException:  # noqa: BLE001 - one job's bookkeeping must not cost the others theirs
                    log.exception("job %s: recording its ack failed unexpectedly", w.handle.id)
            if landed:
                try:
                    self._finish_landed(landed)
                except BaseException:  # noqa: BLE001 - the slots must be freed whatever happens
                    log.exception("recording a batch of %d acks failed unexpectedly", len(landed))
        finally:
            self._release(len(works), claimed)

    @staticmethod
    def _write(works: list[Work]) -> dict[int, Answer]:
        """Each work's answer (keyed by ``id(work)``): one statement for the whole batch,
        whatever queues its jobs are of (each row is fenced by its own claim)."""
        if not works:
            return {}
        handles = [w.handle for w in works]
        try:
            landed = ack_claims(handles[0]._queue.store, handles, None)
        except Exception as exc:  # noqa: BLE001 - each job's outcome says it failed
            answer = _raising(exc)
            return {id(w): answer for w in works}
        return _answers(works, landed)


class Ride:
    """A batch of acks offered to the claim for the slots it frees (``Acker.ride_with``,
    the claimer's ``claim_along``): where the backend says it is cheaper
    (``acks_ride_claims``) they are written in that claim's transaction. The
    claimer settles the ride once it committed — each job's outcome recorded and the
    slots freed — before it starts the jobs it claimed, so ``concurrency`` still bounds
    the jobs in flight. A ride not settled is written on its own, as without it."""

    __slots__ = ("_acker", "_works", "_writing", "handles", "freeing", "settled")

    def __init__(self, acker: Acker, works: list[Work], writing: list[Work]) -> None:
        self._acker = acker
        self._works = works
        self._writing = writing
        self.handles = [w.handle for w in writing]  # the acks to write (lost claims are not)
        self.freeing = len(works)  # the slots the batch frees once settled
        self.settled = False

    def settle(self, landed: set[tuple[int, int]]) -> None:
        """The acks were written and ``landed`` are the claims that held: record each job's
        outcome and free the batch's slots, without nudging the claimer (it is claiming)."""
        if self.settled:
            return
        self.settled = True
        self._acker._record(self._works, _answers(self._writing, landed), claimed=True)


def _alone_on_loop() -> bool:
    """(On the event loop, in a job's asyncio task.) Whether no other asyncio task is still
    on the loop. A task a job left running in the background may hold what the batch's
    write would wait for — on SQLite the file's one write lock, taken by an open
    transaction of the application's AsyncEngine that commits only once the loop lets it —
    so the loop writes a batch itself only when it blocks nobody; otherwise the writer
    thread does. (``all_tasks`` lists the unfinished tasks of the running loop: the
    caller's own among them.)"""
    return len(asyncio.all_tasks()) <= 1


def _answers(works: list[Work], landed: set[tuple[int, int]]) -> dict[int, Answer]:
    return {id(w): _landed if w.key in landed else _refused for w in works}


def _landed(_h: JobHandle) -> bool:
    return True


def _refused(_h: JobHandle) -> bool:
    return False


def _raising(exc: Exception) -> Answer:
    def answer(_h: JobHandle) -> bool:
        raise exc

    return answer
