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
a short job).

A claim made on one of the runner's own threads (slots freed there: the usual case on a
busy worker) wakes no thread at all at first: that thread goes back to the items as soon
as the claim is done and runs them itself, one after the other, so a claim of short jobs
costs no wake-up. Waking a sleeping thread is a system call the waker makes holding the
GIL, and where the other core is idle (a virtual machine's halted vCPU) it measured ~50 µs —
a fifth of a whole round of eight no-op jobs on SQLite. So that a long job does not hold up
the items queued behind it, a watcher thread ticks every ``HANDOFF_DELAY`` while such items
come: an item that was already queued at its previous tick and is still there gets a
thread woken for it (which then chains as above). A job queued behind a long one thus
starts at most about ``2 × HANDOFF_DELAY`` later than it would with a wake-up per claim
(Go's runtime hands a processor off from a blocked thread the same way, from its sysmon
thread). The watcher sleeps, untimed, after a tick that saw nothing queued and nothing
waiting: an idle worker costs no ticks.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
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

HANDOFF_DELAY = 0.002  # seconds between the watcher's ticks (module docstring)


class Runner:
    """Runs each job handed over and calls ``finish(work, outcome)`` for it on a thread."""

    def __init__(self, concurrency: int, finish: Finish, on_free: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self._finish = finish
        self._on_free = on_free  # told each time a slot frees up (wakes the claimer)
        self._busy = 0
        # guards _busy (the slots); hot paths take the lock itself (a Condition's own
        # __enter__ is a Python-level call), and wait/notify through the Condition
        self._slots = threading.Lock()
        self._changed = threading.Condition(self._slots)
        # the items for the threads, and the chain that hands them out (module docstring)
        self._items: collections.deque[_Item] = collections.deque()
        self._lock = lock = threading.Lock()  # guards what follows (taken directly on hot paths)
        self._handout = threading.Condition(lock)  # threads wait on it for items
        self._sleepers = 0  # threads waiting for an item, not woken yet
        self._coming = 0  # threads woken or started that have not looked at the items yet
        self._closing = False  # stop(): idle threads exit
        self._threads: list[threading.Thread] = []
        self._own = threading.local()  # .runner: set on the runner's own threads
        # the watcher of items put on the runner's own threads (module docstring)
        self._watcher = threading.Condition(lock)  # it waits on this one, never woken for an item
        self._watcher_thread: threading.Thread | None = None
        self._watching = False  # it ticks
        self._queued = 0  # items ever put
        self._taken = 0  # items ever taken
        self.ticks = 0  # the watcher's ticks so far (tests: an idle worker costs none)
        self._loop = EventLoopThread(calls=concurrency)  # a to_thread call for each job in flight
        # each job runs in a copy of the context the runner was made in (run()'s caller's):
        # context variables a job sets (a log field bound, a tenant id) end with it, on the
        # thread or the loop that runs the next job alike
        self._context = contextvars.copy_context()
        self._abandoning = False  # set at shutdown: a cancelled async job is then abandoned
        # takes over an outcome (True) whose recording frees the slot later, with
        # ``release()``: the worker's batched acks (acker.py); None records each one here
        self.defer: Callable[[Work, Outcome], bool] | None = None

    @property
    def busy(self) -> int:
        """Slots taken: jobs handed over whose outcome has not been dealt with yet (a
        snapshot: reading one attribute needs no lock, and a locked read would be as
        stale the moment the lock is released)."""
        return self._busy

    def free(self) -> int:
        return self.concurrency - self._busy

    def submit(self, works: list[Work]) -> None:
        with self._slots:
            self._busy += len(works)
        coros = []
        items: list[_Item] = []
        for w in works:
            if w.is_async and w.outcome is None:
                coros.append(self._run_async(w))
            else:
                items.append((w, w.outcome))
        if items:
            self._put(items)
        if coros:
            self._loop.submit_all(coros, self._context)  # one wake-up of the loop for the whole claim

    def release(self, n: int, claimed: bool = False) -> None:
        """Free ``n`` slots whose outcomes were recorded elsewhere (see ``defer``), together:
        the claimer is told once — unless ``claimed``: the claim for them is already under
        way on this thread (the acks rode with it, acker.py)."""
        with self._slots:
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
            self._watcher.notify_all()

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
                # its own code was cancelled (it awaited something cancelled): a retry like
                # any error, and logged like one
                outcome = Outcome("retry", f"{w.what} was cancelled")
                log.warning("job %s of %r: %s; retrying it", w.handle.id, w.handle._queue.name,
                            outcome.error, extra=w.context)
        except GeneratorExit:
            raise  # a task dropped at shutdown, closed when collected: its claim lapses (loop.py)
        except BaseException:  # noqa: BLE001 - keep the slot count true; the claim will lapse
            log.exception("job %s: the event loop caught an unexpected error; its claim will lapse", w.handle.id)
            outcome = None
        # recorded outside the job's context: an ack may write a batch of other jobs' acks
        # and claim and start the next jobs here (acker.py), whose log lines and spans must
        # not carry what this job set (a log field bound, a tenant id)
        self._context.copy().run(self._settle_async, w, outcome)

    def _settle_async(self, w: Work, outcome: Outcome | None) -> None:
        if outcome is None:
            self._done(w, None)
        elif not self._handed_over(w, outcome):
            self._put([(w, outcome)])  # recorded on a thread: queue operations block

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
        with self._slots:
            self._busy -= 1
            self._changed.notify_all()
        self._on_free()

    # -- threads -----------------------------------------------------------------------------

    def _put(self, items: list[_Item]) -> None:
        """Queue items for the threads; wake or start one unless one is on its way — or,
        on one of the runner's own threads, which comes back for them, have the watcher
        look after them (module docstring)."""
        with self._lock:
            self._items.extend(items)
            self._queued += len(items)
            start = self._watch() if getattr(self._own, "runner", False) else self._call_next()
        if start is not None:
            start.start()

    def _watch(self) -> threading.Thread | None:
        """(Handout lock held.) Make sure the watcher ticks: wake it, or create it (returned,
        to be started by the caller outside the lock)."""
        if self._watching:
            return None
        self._watching = True
        if self._watcher_thread is None:
            self._watcher_thread = threading.Thread(target=self._watch_loop, name="alkstore-handout", daemon=True)
            return self._watcher_thread
        self._watcher.notify()
        return None

    def _watch_loop(self) -> None:
        """Every HANDOFF_DELAY while items come: call a thread to an item that has waited
        since the previous tick with none on its way; sleep after a tick that saw nothing."""
        with self._handout:
            seen = self._queued  # the items put before the previous tick
            while not self._closing:
                if not self._watching:
                    self._watcher.wait()
                    seen = self._queued
                    continue
                self._watcher.wait(HANDOFF_DELAY)
                self.ticks += 1
                start = self._call_next() if self._taken < seen and not self._coming else None
                if self._queued == seen and not self._items:
                    self._watching = False  # nothing came and nothing waits
                seen = self._queued
                if start is not None:
                    self._handout.release()  # a new thread starts outside the lock
                    try:
                        start.start()
                    finally:
                        self._handout.acquire()

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
        """The next item (None: stop); ``called``: this thread was woken or started for one.
        A thread called for an item calls the next thread while items remain (the chain);
        one that came back by itself (it put them, or finished a job) leaves the rest to
        the watcher, unless a thread is on its way anyway."""
        start = None
        with self._lock:
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
                called = True
            item = self._items.popleft()
            self._taken += 1
            if self._items:
                if called:
                    start = self._call_next()
                elif not self._coming and not self._watching:  # (checked here: once per job)
                    start = self._watch()
        if start is not None:
            start.start()
        return item

    def _thread_loop(self) -> None:
        self._own.runner = True
        called = True  # started for an item
        while True:
            item = self._take(called)
            called = False
            if item is None:
                return
            w, outcome = item
            if outcome is None:
                try:
                    outcome = self._context.copy().run(outcome_of, w)
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
