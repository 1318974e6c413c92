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

Items are handed to the threads in a chain: a put wakes one sleeping thread (or starts
one) only when no thread is already on its way, and each thread that takes an item wakes
the next one while items remain. So every item still gets a thread of its own without
waiting for another item to finish, but a claim of eight short jobs wakes a thread or two
rather than eight (each wake-up on a busy, two-core machine costs about as much as running
a short job), and the thread that claimed them runs some of them itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
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
        self._busy = 0
        self._changed = threading.Condition()  # guards _busy (the slots)
        # the items for the threads, and the chain that hands them out (module docstring)
        self._items: collections.deque[_Item] = collections.deque()
        self._handout = threading.Condition(threading.Lock())  # guards what follows
        self._sleepers = 0  # threads waiting for an item, not woken yet
        self._coming = 0  # threads woken or started that have not looked at the items yet
        self._closing = False  # stop(): idle threads exit
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

    def release(self, n: int, claimed: bool = False) -> None:
        """Free ``n`` slots whose outcomes were recorded elsewhere (see ``defer``), together:
        the claimer is told once — unless ``claimed``: the claim for them is already under
        way on this thread (the acks rode with it, acker.py)."""
        with self._changed:
            self._busy -= n
            self._changed.notify_all()
        if not claimed:
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
        with self._handout:
            self._closing = True
            self._handout.notify_all()

    # -- async jobs, on the loop -----------------------------------------------------------

    async def _run_async(self, w: Work) -> None:
        try:
            outcome: Outcome | None = await aoutcome_of(w)
        except asyncio.CancelledError:
            if self._abandoning:
                # cancelled by stop() after the grace period: nothing is recorded, the
                # claim lapses and another attempt runs the job, as for a sync job left running
                log.warning("job %s: cancelled at shutdown; its claim will lapse", w.handle.id, extra=w.context)
                outcome = None
            else:
                outcome = Outcome("retry", f"{w.what} was cancelled")
        except BaseException:  # noqa: BLE001 - keep the slot count true; the claim will lapse
            log.exception("job %s: the event loop caught an unexpected error; its claim will lapse", w.handle.id)
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
            log.exception("job %s: handing its outcome over failed; recording it alone", w.handle.id)
            return False

    def _done(self, w: Work, outcome: Outcome | None) -> None:
        try:
            self._finish(w, outcome)
        except BaseException:  # noqa: BLE001 - the slot must be freed whatever happens
            log.exception("job %s: recording its outcome failed unexpectedly; its claim will lapse", w.handle.id)
        finally:
            self._release()

    def _release(self) -> None:
        with self._changed:
            self._busy -= 1
            self._changed.notify_all()
        self._on_free()

    # -- threads -----------------------------------------------------------------------------

    def _put(self, w: Work, outcome: Outcome | None) -> None:
        """Queue an item for the threads; wake or start one unless one is on its way."""
        with self._handout:
            self._items.append((w, outcome))
            start = self._call_next()
        if start is not None:
            start.start()

    def _call_next(self) -> threading.Thread | None:
        """(Handout lock held, an item queued.) Make sure a thread is on its way to the
        items: wake a sleeping one, or else create one (returned, to be started by the
        caller outside the lock) while there are fewer than ``concurrency``. With every
        thread busy, one of them comes back for the item: a queued item means a free slot,
        so some thread is not running a job (module docstring)."""
        if self._coming:
            return None
        if self._sleepers:
            self._sleepers -= 1
            self._coming += 1
            self._handout.notify()
            return None
        if len(self._threads) < self.concurrency:
            thread = threading.Thread(
                target=self._thread_loop, name=f"alkstore-worker-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            self._coming += 1
            return thread
        return None

    def _take(self, called: bool) -> _Item | None:
        """The next item (None: stop); ``called``: this thread was woken or started for one."""
        start = None
        with self._handout:
            if called:
                self._coming -= 1
            while not self._items:
                if self._closing:
                    return None
                self._sleepers += 1
                self._handout.wait()  # whoever wakes it moved it to _coming
                if self._closing:
                    return None
                self._coming -= 1
            item = self._items.popleft()
            if self._items:
                start = self._call_next()  # the chain: the next item gets its own thread
        if start is not None:
            start.start()
        return item

    def _thread_loop(self) -> None:
        called = True  # started for an item
        while True:
            item = self._take(called)
            called = False
            if item is None:
                return
            w, outcome = item
            if outcome is None:
                try:
                    outcome = outcome_of(w)
                except BaseException:  # noqa: BLE001 - the thread must survive to keep its slot real
                    log.exception(
                        "job %s: the worker thread caught an unexpected error; its claim will lapse", w.handle.id
                    )
            if outcome is not None and self._handed_over(w, outcome):
                continue  # the slot stays taken until release()
            try:
                self._finish(w, outcome)
            except BaseException:  # noqa: BLE001 - as above
                log.exception("job %s: recording its outcome failed unexpectedly; its claim will lapse", w.handle.id)
            finally:
                self._release()
