"""The worker runtime (SPEC §11): a wake-driven claim loop feeding handler threads.

Outcome mapping: a handler that returns → ``ack``; raises ``Fail(msg)`` → ``fail(msg)``;
raises ``Retry(delay=...)`` → ``retry`` with that delay; raises anything else →
``retry(str(exc))`` on the backoff curve. Long handlers are heartbeated automatically
(every third of the job's visibility timeout); a handler whose claim was lost is never
acked. Stopping: claiming stops at once, in-flight jobs get ``shutdown_grace`` seconds to
finish, and whatever still runs after that is released by letting its claim lapse.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as queue_mod
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _validate as v
from .errors import AlkstoreError, HandleConsumed, InvalidOptions
from .model import Job
from .queue import JobHandle, Queue
from .stop import StopToken
from .store import Store

log = logging.getLogger("alkstore_sa")

Handler = Callable[[Job], Any]


class Fail(Exception):
    """Raise from a handler to dead-letter the job now, with ``message`` as its last error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message)
        self.message = message


class Retry(Exception):
    """Raise from a handler to retry the job after ``delay`` seconds (None: the backoff curve)."""

    def __init__(self, delay: v.Duration | None = None, error: str = "retry requested") -> None:
        super().__init__(error)
        self.delay = delay
        self.error = error


@dataclass
class _InFlight:
    handle: JobHandle
    next_beat: float
    lost: bool = False


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs ``handler`` for the jobs of one queue with ``concurrency`` threads."""

    def __init__(
        self,
        store: Store,
        queue: str | Queue,
        handler: Handler,
        *,
        concurrency: int = 4,
        worker_id: str | None = None,
        batch_size: int | None = None,
        poll_interval: v.Duration = 5.0,
        shutdown_grace: v.Duration = 30.0,
    ) -> None:
        if not callable(handler):
            raise InvalidOptions("handler must be callable")
        self.queue = queue if isinstance(queue, Queue) else store.queue(queue)
        self.store = store
        self.handler = handler
        self.concurrency = v.int32(concurrency, "concurrency", minimum=1)
        self.batch_size = self.concurrency if batch_size is None else v.int32(batch_size, "batch_size", minimum=1)
        self.worker_id = default_worker_id() if worker_id is None else v.worker_id(worker_id)
        self.poll_interval = v.duration(poll_interval, "poll_interval", inclusive=False)
        self.shutdown_grace = v.duration(shutdown_grace, "shutdown_grace")
        self._nudge = threading.Event()  # wakes the claim loop: a wake-up, a free slot, stop
        self._beat_nudge = threading.Event()  # wakes the heartbeat thread: new jobs, stop
        self._beat_stop = False
        self._lock = threading.Lock()
        self._in_flight: dict[int, _InFlight] = {}
        self._work: queue_mod.SimpleQueue[JobHandle | None] = queue_mod.SimpleQueue()
        self.processed = 0

    # -- main loop -------------------------------------------------------------------------

    def run(self, stop: StopToken | None = None, *, burst: bool = False) -> None:
        """Claim and run jobs until ``stop``; then drain in-flight work (bounded by the
        grace period) and return. ``burst=True`` also returns once nothing is claimable and
        nothing runs (batch scripts, tests, cron-style runs)."""
        stop = stop or StopToken()
        self.store.check_schema()
        stop.on_stop(self._nudge.set)
        watch = self._watch()
        threads = [
            threading.Thread(target=self._execute_loop, name=f"alkstore-worker-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        self._beat_stop = False
        beater = threading.Thread(target=self._heartbeat_loop, name="alkstore-heartbeat", daemon=True)
        for t in [*threads, beater]:
            t.start()
        log.info("worker %s started on queue %r (concurrency %d)", self.worker_id, self.queue.name, self.concurrency)
        try:
            self._claim_loop(stop, burst)
        finally:
            self._drain(threads)
            self._beat_stop = True
            self._beat_nudge.set()
            if watch is not None:
                self._unwatch(watch)
            log.info("worker %s stopped after %d jobs", self.worker_id, self.processed)

    def _claim_loop(self, stop: StopToken, burst: bool) -> None:
        failures = 0
        while not stop.stopped:
            with self._lock:
                free = self.concurrency - len(self._in_flight)
            wait = self.poll_interval
            if free > 0:
                want = min(free, self.batch_size)
                try:
                    handles = self.queue.claim_batch(self.worker_id, want)
                    failures = 0
                except AlkstoreError as exc:
                    failures += 1
                    backoff = min(0.1 * 2**failures, self.poll_interval)
                    log.warning("claim on %r failed (%s); retrying in %.1fs", self.queue.name, exc, backoff)
                    stop.wait(backoff)
                    continue
                self._start(handles)
                if len(handles) == want:
                    continue  # there may be more: claim again at once
                if burst and not handles:
                    with self._lock:
                        if not self._in_flight:
                            return
                wait = self._idle_wait()
            self._nudge.wait(wait)
            self._nudge.clear()

    def _idle_wait(self) -> float:
        """Sleep until the next delayed job is due or claim lapses, at most poll_interval."""
        try:
            with self.store.executor() as ex:
                due = self.store.backend.next_due(
                    ex, {"queue": self.queue.name, "now": self.store.now()}
                )
        except AlkstoreError as exc:
            log.warning("could not read the next due time of %r: %s", self.queue.name, exc)
            return self.poll_interval
        if due is None:
            return self.poll_interval
        return min(self.poll_interval, due + 0.001)

    def _start(self, handles: list[JobHandle]) -> None:
        now = time.monotonic()
        with self._lock:
            for h in handles:
                self._in_flight[h.id] = _InFlight(h, now + h.job.visibility_timeout / 3)
        for h in handles:
            self._work.put(h)
        if handles:
            self._beat_nudge.set()  # its schedule changed: the first beat may be due soon

    def _drain(self, threads: list[threading.Thread]) -> None:
        deadline = time.monotonic() + self.shutdown_grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight:
                    break
            time.sleep(0.01)
        with self._lock:
            left = len(self._in_flight)
        if left:
            log.warning(
                "worker %s: %d job(s) still running after the %.1fs grace period; their claims "
                "will lapse and another worker will retry them",
                self.worker_id, left, self.shutdown_grace,
            )
        for _ in threads:
            self._work.put(None)

    # -- wake ------------------------------------------------------------------------------

    def _watch(self) -> tuple[Any, str, int] | None:
        try:
            hub = self.store.hub()
            key = self.store.backend.wake_key(self.queue.name)
            return hub, key, hub.watch_queue(key, self._nudge.set)
        except AlkstoreError as exc:
            log.warning("no wake-ups for %r (%s): polling every %.1fs", self.queue.name, exc, self.poll_interval)
            return None

    def _unwatch(self, watch: tuple[Any, str, int]) -> None:
        hub, key, token = watch
        with contextlib.suppress(AlkstoreError):
            hub.unwatch_queue(key, token)

    # -- handler threads -------------------------------------------------------------------

    def _execute_loop(self) -> None:
        while True:
            h = self._work.get()
            if h is None:
                return
            try:
                self._execute(h)
            finally:
                with self._lock:
                    self._in_flight.pop(h.id, None)
                self._nudge.set()

    def _execute(self, h: JobHandle) -> None:
        job = h.job
        context = {"queue": job.queue, "job_id": job.id, "attempt": job.attempts, "worker_id": self.worker_id}
        try:
            self.handler(job)
        except Fail as exc:
            reason = exc.message
            self._finish(h, "fail", lambda: h.fail(reason), context)
        except Retry as exc:
            error, delay = exc.error, exc.delay
            self._finish(h, "retry", lambda: h.retry(error, delay), context)
        except Exception as exc:  # noqa: BLE001 - any handler error is a retry
            log.warning("job %s of %r raised %s: %s", job.id, job.queue, type(exc).__name__, exc, extra=context, exc_info=True)
            message = str(exc) or type(exc).__name__
            self._finish(h, "retry", lambda: h.retry(message), context)
        else:
            self._finish(h, "ack", h.ack, context)

    def _finish(self, h: JobHandle, outcome: str, op: Callable[[], bool], context: dict[str, Any]) -> None:
        with self._lock:
            entry = self._in_flight.get(h.id)
        if entry is not None and entry.lost:
            log.warning("job %s: claim lost before %s; not %sing", h.id, outcome, outcome, extra=context)
            return
        try:
            landed = op()
        except (AlkstoreError, ValueError) as exc:
            log.error("job %s: %s failed: %s", h.id, outcome, exc, extra=context)
            return
        self.processed += 1
        if landed:
            log.debug("job %s: %s", h.id, outcome, extra=context)
        else:
            log.warning("job %s: %s refused (claim lapsed, cancelled or swept)", h.id, outcome, extra=context)

    # -- heartbeats ------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._beat_stop:
            now = time.monotonic()
            with self._lock:
                due = [e for e in self._in_flight.values() if e.next_beat <= now and not e.lost]
                upcoming = min((e.next_beat for e in self._in_flight.values() if not e.lost), default=now + 1.0)
            for entry in due:
                self._beat(entry)
            self._beat_nudge.wait(max(0.005, min(1.0, upcoming - time.monotonic())))
            self._beat_nudge.clear()

    def _beat(self, entry: _InFlight) -> None:
        vt = entry.handle.job.visibility_timeout
        try:
            ok = entry.handle.heartbeat(vt)
        except HandleConsumed:
            return  # finished meanwhile
        except AlkstoreError as exc:
            log.warning("job %s: heartbeat failed (%s); will try again", entry.handle.id, exc)
            entry.next_beat = time.monotonic() + min(vt / 10, 1.0)
            return
        if ok:
            entry.next_beat = time.monotonic() + vt / 3
        else:
            entry.lost = True
            log.warning("job %s: claim lost (lapsed, cancelled or swept); its result will not be acked", entry.handle.id)
