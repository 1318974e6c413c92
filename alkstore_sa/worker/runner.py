"""Running claimed jobs: sync calls on threads, ``async def`` ones on the event loop, and
the slot count that bounds them together.

A slot is taken when a claimed job is handed to the runner and freed only once its
handler has returned and its outcome was dealt with — whatever happened to the claim
meanwhile. So ``concurrency`` bounds the jobs actually in flight, sync and async
together: a handler whose claim lapsed (or was cancelled) still holds its slot until it
returns, and the claimer never takes a job there is no slot for. The heartbeat roster is
separate: it tracks claims, not slots.

Threads are started as work needs them, never more than ``concurrency``: a sync job takes
one while it runs; an async job takes one only to record its outcome (the queue operations
are blocking calls, kept off the loop). Since at most ``concurrency`` jobs are in flight,
a thread is always there for each of them. An ack takes no thread at all: it is handed to
the worker's ack writer (``defer``, acker.py), which frees its slot once the batch it went
out in was written.
"""

from __future__ import annotations

import asyncio
import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable

from .dispatch import Work
from .loop import EventLoopThread
from .outcomes import Outcome, aoutcome_of, outcome_of

log = logging.getLogger("alkstore_sa")

Finish = Callable[[Work, "Outcome | None"], None]
"""Records a job's outcome under its claim (None: the job was abandoned, record nothing)."""

_Item = tuple[Work, "Outcome | None"]  # a job to run (outcome None) or whose outcome to record


class Runner:
    """Runs each job handed over and calls ``finish(work, outcome)`` for it on a thread."""

    def __init__(self, concurrency: int, finish: Finish, on_free: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self._finish = finish
        self._on_free = on_free  # told each time a slot frees up (wakes the claimer)
        self._work: queue_mod.SimpleQueue[_Item | None] = queue_mod.SimpleQueue()
        self._busy = 0
        self._queued = 0  # items put and not yet taken by a thread
        self._idle = 0  # threads not working on an item
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._loop = EventLoopThread()
        self._abandoning = False  # set at shutdown: a cancelled async job is then abandoned
        # takes over an outcome (True) whose recording frees the slot later, with
        # ``release()``: the worker's batched acks (acker.py); None records each one here
        self.defer: Callable[[Work, Outcome], bool] | None = None

    @property
    def busy(self) -> int:
        """Slots taken: jobs handed over whose outcome has not been dealt with yet."""
        with self._changed:
            return self._busy

    def free(self) -> int:
        with self._changed:
            return self.concurrency - self._busy

    def submit(self, works: list[Work]) -> None:
        with self._changed:
            self._busy += len(works)
        coros = []
        for w in works:
            if w.is_async and w.outcome is None:
                coros.append(self._run_async(w))
            else:
                self._put(w, w.outcome)
        if coros:
            self._loop.submit_all(coros)  # one wake-up of the loop for the whole claim

    def release(self, n: int) -> None:
        """Free ``n`` slots whose outcomes were recorded elsewhere (see ``defer``), together:
        the claimer is told once."""
        with self._changed:
            self._busy -= n
            self._changed.notify_all()
        self._on_free()

    def wait_idle(self, timeout: float) -> int:
        """Block until no slot is taken or ``timeout`` seconds passed; the slots still taken."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._busy and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self._busy

    def stop(self) -> None:
        """Cancel the async jobs still running (abandoned: their claims lapse) and close the
        loop; then let every thread exit once it is idle (a thread still in a sync handler
        exits after it)."""
        self._abandoning = True
        self._loop.close()
        with self._changed:
            threads = len(self._threads)
        for _ in range(threads):
            self._work.put(None)

    # -- async jobs, on the loop -----------------------------------------------------------

    async def _run_async(self, w: Work) -> None:
        try:
            outcome: Outcome | None = await aoutcome_of(w)
        except asyncio.CancelledError:
            if self._abandoning:
                # cancelled by stop() after the grace period: nothing is recorded, the
                # claim lapses and another attempt runs the job, as for a sync job left running
                log.warning("job %s: cancelled at shutdown; its claim will lapse", w.job.id, extra=w.context)
                outcome = None
            else:
                outcome = Outcome("retry", f"{w.what} was cancelled")
        except BaseException:  # noqa: BLE001 - keep the slot count true; the claim will lapse
            log.exception("job %s: the event loop caught an unexpected error; its claim will lapse", w.job.id)
            outcome = None
        if outcome is None:
            self._done(w, None)
        elif not self._handed_over(w, outcome):
            self._put(w, outcome)  # recorded on a thread: queue operations block

    def _handed_over(self, w: Work, outcome: Outcome) -> bool:
        """Whether ``defer`` took the outcome over (it never blocks: the loop calls it too)."""
        defer = self.defer
        if defer is None:
            return False
        try:
            return defer(w, outcome)
        except Exception:  # noqa: BLE001 - recorded here instead
            log.exception("job %s: handing its outcome over failed; recording it alone", w.job.id)
            return False

    def _done(self, w: Work, outcome: Outcome | None) -> None:
        try:
            self._finish(w, outcome)
        except BaseException:  # noqa: BLE001 - the slot must be freed whatever happens
            log.exception("job %s: recording its outcome failed unexpectedly; its claim will lapse", w.job.id)
        finally:
            self._release()

    def _release(self) -> None:
        with self._changed:
            self._busy -= 1
            self._changed.notify_all()
        self._on_free()

    # -- threads -----------------------------------------------------------------------------

    def _put(self, w: Work, outcome: Outcome | None) -> None:
        """Queue an item for the threads, starting one if every thread is taken."""
        thread = None
        with self._changed:
            self._queued += 1
            if self._queued > self._idle and len(self._threads) < self.concurrency:
                thread = threading.Thread(
                    target=self._thread_loop, name=f"alkstore-worker-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                self._idle += 1  # counted now, so the next put does not start another for this item
        if thread is not None:
            thread.start()
        self._work.put((w, outcome))

    def _thread_loop(self) -> None:
        while True:
            item = self._work.get()
            with self._changed:
                self._idle -= 1
                if item is not None:
                    self._queued -= 1
            if item is None:
                return
            w, outcome = item
            if outcome is None:
                try:
                    outcome = outcome_of(w)
                except BaseException:  # noqa: BLE001 - the thread must survive to keep its slot real
                    log.exception(
                        "job %s: the worker thread caught an unexpected error; its claim will lapse", w.job.id
                    )
            if outcome is not None and self._handed_over(w, outcome):
                with self._changed:
                    self._idle += 1  # the slot stays taken until release()
                continue
            try:
                self._finish(w, outcome)
            except BaseException:  # noqa: BLE001 - as above
                log.exception("job %s: recording its outcome failed unexpectedly; its claim will lapse", w.job.id)
            finally:
                with self._changed:
                    self._idle += 1  # before the slot frees: a claim it triggers finds this thread
                    self._busy -= 1
                    self._changed.notify_all()
                self._on_free()
