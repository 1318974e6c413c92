"""The worker's own asyncio event loop, on one thread, for ``async def`` handlers and tasks.

Started at the first async job (a worker that only runs sync code never has one). Each
job becomes an asyncio task of its own; the jobs of one claim are handed over together,
with one wake-up of the loop (``submit_all``). Closing cancels whatever still runs on the
loop — jobs abandoned after the grace period, tasks that jobs spawned and left behind —
gives them a bounded time to unwind (their ``finally`` blocks run), then stops and closes
the loop, as ``asyncio.run`` does at its end. A loop that a job's sync code blocks past that
time is left to do the same by itself: the cancellation is queued, and once the blocking call
returns the tasks are cancelled at their next ``await``, then the loop stops and closes.

Until then nothing ends the loop: a ``SystemExit`` or ``KeyboardInterrupt`` raised by a task
(asyncio lets those two escape ``run_forever``), or a ``loop.stop()`` from a job, is logged
and the loop runs on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread
import contextvars
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("alkstore_sa")

UNWIND_TIMEOUT = 5.0  # seconds cancelled coroutines get to finish at close
_DEFAULT_CALLS = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default size


class EventLoopThread:
    """One event loop running forever on a daemon thread until ``close()``."""

    def __init__(self, name: str = "alkstore-loop", calls: int | None = None) -> None:
        self.name = name
        # threads of the default executor (``asyncio.to_thread``): at least one per job in
        # flight, so a blocking call handed off by each of them runs at once (asyncio's
        # default, min(32, CPUs + 4), would hold the jobs past it back); None: that default
        self._calls = None if calls is None else max(calls, _DEFAULT_CALLS)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running: set[asyncio.Task[Any]] = set()  # tasks of submit_all (_spawn)
        self._closing = False  # close() stops the loop: nothing else ends it

    def submit_all(self, coros: list[Coroutine[Any, Any, Any]], context: contextvars.Context) -> None:
        """Run each of ``coros`` as an asyncio task of its own on the loop (started now if
        need be), each in a copy of ``context``; from another thread, waking the loop once
        for all of them, and on the loop itself (a claim made there, acker.py) with no
        wake-up at all. The coroutines must handle their own errors (nothing reads their
        results)."""
        loop = self.loop if self.loop is not None else self._start()
        if asyncio._get_running_loop() is loop:
            self._spawn(loop, coros, context)
        else:
            loop.call_soon_threadsafe(self._spawn, loop, coros, context)

    def _spawn(
        self, loop: asyncio.AbstractEventLoop, coros: list[Coroutine[Any, Any, Any]], context: contextvars.Context
    ) -> None:
        # the loop itself keeps only a weak reference to a task: ours are held here until
        # done, and the finished ones dropped at the next hand-over (at most ``concurrency``
        # are held; a done callback per task would cost each job one more loop callback)
        running = self._running
        if running:
            self._running = running = {t for t in running if not t.done()}
        for coro in coros:
            running.add(context.run(loop.create_task, coro))  # the task runs in a copy of ``context``

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(_CallThreads(self._calls, thread_name_prefix=f"{self.name}-call"))
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            while True:
                try:
                    loop.run_forever()
                    if self._closing:
                        loop.close()  # close() stopped it (after the cancellation it queued ran)
                        return
                    # a job (or a library it calls) called loop.stop(): only close() ends the
                    # loop, or every later async job would sit in its slot unrun
                    log.error("the worker's event loop was stopped by a job (loop.stop()); it keeps running")
                except BaseException as exc:  # noqa: BLE001 - logged; the loop keeps serving
                    # asyncio re-raises SystemExit and KeyboardInterrupt from a task or a
                    # callback out of run_forever (a task a job spawned and left behind, say);
                    # the loop is intact, the step that raised is done: run it on, or every
                    # later async job would sit in its slot unrun
                    log.error(
                        "an asyncio task or callback on the worker's event loop raised %s; "
                        "the loop keeps running", type(exc).__name__, exc_info=exc,
                    )
                    if self._closing:  # it escaped the last step before the stop close() asked for
                        loop.close()
                        return

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()
        self.loop = loop
        return loop

    def close(self, timeout: float = UNWIND_TIMEOUT) -> None:
        """Cancel every task still on the loop, wait up to ``timeout`` seconds for them to
        unwind, then stop and close the loop (its thread closes it). A loop that a coroutine
        blocks (sync code that never yields) is not waited for: that is logged, and the loop
        stops only after the cancellation queued here has run, once the blocking call
        returns — so the tasks still get their ``CancelledError`` and the loop is closed."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        unwound = asyncio.run_coroutine_threadsafe(_cancel_all(timeout), loop)
        # the loop stops once the cancellation is done: at once if it already is, else when
        # the (blocked) loop gets to run it; stopping it before then would leave the tasks
        # suspended at their ``await`` for good, never cancelled
        unwound.add_done_callback(lambda _: loop.call_soon_threadsafe(self._stop_closing, loop))
        try:
            left = unwound.result(timeout + 1.0)
        except concurrent.futures.TimeoutError:
            log.warning(
                "the worker's event loop is blocked (a coroutine runs sync code that never "
                "yields): its tasks will be cancelled, and the loop closed, once that call returns"
            )
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the worker's event loop is blocked while its tasks unwind; it stops and closes by itself")
            return
        if left > 0:
            log.warning("%d asyncio task(s) ignored cancellation at shutdown and were dropped", left)

    def _stop_closing(self, loop: asyncio.AbstractEventLoop) -> None:
        """(On the loop.) Stop it for good: its thread then closes it (a ``loop.stop()`` of a
        job, before this, is not the end: see ``_start``)."""
        self._closing = True
        loop.stop()


class _CallThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor: the threads of ``asyncio.to_thread`` and
    ``loop.run_in_executor(None, ...)``, where async jobs run their sync calls (as
    docs/worker.md tells them to). Like the worker's handler threads they are daemon threads
    that the interpreter does not wait for at exit: a call still running when its job was
    abandoned after the grace period dies with the process, instead of keeping the process
    from exiting (``concurrent.futures`` joins every thread of its executors at exit, daemon
    or not) until the CLI's guard ends it as a blocked stop."""

    def _adjust_thread_count(self) -> None:
        super()._adjust_thread_count()  # type: ignore[misc]  # (private: starts a thread when one is needed)
        joined_at_exit = getattr(concurrent.futures.thread, "_threads_queues", None)
        if joined_at_exit is not None:
            for t in self._threads:  # type: ignore[attr-defined]
                joined_at_exit.pop(t, None)  # daemon already: made on the loop's daemon thread


async def _cancel_all(timeout: float) -> int:
    """Cancel every other task of the running loop; the number still pending after
    ``timeout`` seconds."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    pending: set[asyncio.Task[Any]] = set()
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=timeout)
    for t in pending:
        # dropped (close() says so once): asyncio's "Task was destroyed but it is pending!"
        # when it is collected, at exit, would only repeat that as an error
        t._log_destroy_pending = False  # type: ignore[attr-defined]
    await asyncio.get_running_loop().shutdown_asyncgens()
    return len(pending)
