"""What the worker runs for a claimed job: its handler, or the task its payload names.

Decided on the claim loop's thread as each job is handed over (for tasks, a dict lookup),
so the runner only has to know whether the call is sync (a thread) or async (the event
loop) — or that the outcome is known without running anything: a job naming a task this
worker does not have is retried, a payload that is no task call is failed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from .._tracing import ExecutionSpan
from ..model import Job
from ..queue import JobHandle
from ..tasks import NotATaskPayload, Tasks, UnknownTask, is_async_callable
from .heartbeater import ClaimKey
from .outcomes import Outcome, text_of

log = logging.getLogger("alkstore_sa")


class Work:
    """One claimed job on its way through the runner (a slotted class: one is made per job)."""

    __slots__ = ("handle", "context", "what", "call", "is_async", "outcome", "duration", "span", "key")

    def __init__(
        self,
        handle: JobHandle,
        context: dict[str, Any],
        what: str,
        call: Callable[[], Any] | None = None,
        is_async: bool = False,
        outcome: Outcome | None = None,
    ) -> None:
        self.handle = handle
        self.context = context  # the ``extra`` fields of every log record about the job
        self.what = what  # "handler" or "task 'NAME'", for messages
        self.call = call  # runs the handler or task; None when ``outcome`` is set
        self.is_async = is_async  # the call returns a coroutine for the worker's event loop
        self.outcome = outcome  # known without running anything
        self.duration: float | None = None  # seconds the call ran (set by the runner; for metrics)
        self.span: ExecutionSpan | None = None  # alkstore_sa.tracing: this execution's span, when traced
        self.key: ClaimKey = handle._claim  # its claim, as the heartbeat roster knows it

    @property
    def job(self) -> Job:
        return self.handle.job


def job_context(h: JobHandle, worker_id: str) -> dict[str, Any]:
    job_id, attempt = h._claim
    return {"queue": h._queue.name, "job_id": job_id, "attempt": attempt, "worker_id": worker_id}


class HandlerDispatch:
    """The §11 form: one handler, called with the job, for every queue served."""

    def __init__(self, handler: Callable[[Job], Any]) -> None:
        self.handler = handler
        self.is_async = is_async_callable(handler)

    def work(self, h: JobHandle, context: dict[str, Any]) -> Work:
        try:
            h.payload  # noqa: B018 - decoded first: a row that cannot be is failed (undecodable)
        except ValueError as exc:
            return undecodable(h, context, "handler", exc)
        return Work(h, context, "handler", functools.partial(self.handler, h.job), self.is_async)


class TaskDispatch:
    """The §12 form: the task a job's payload names, called with its args and kwargs."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks

    def work(self, h: JobHandle, context: dict[str, Any]) -> Work:
        try:
            payload = h.payload
        except ValueError as exc:
            return undecodable(h, context, "task", exc)
        try:
            task, args, kwargs = self.tasks.resolve(payload)  # the Job itself is built only if asked for
        except UnknownTask as exc:
            # a deploy in progress: a worker that has the task may come along, so the job is
            # retried on its curve (and goes dead at its attempt budget), never acked
            log.warning(
                "job %s of %r: %s (this worker has %s); retrying it",
                h.id, h._queue.name, exc, _listed(self.tasks), extra=context,
            )
            return Work(h, context, f"task {exc.name!r}", outcome=Outcome("retry", str(exc)))
        except NotATaskPayload as exc:
            # nothing can make this job runnable: it was not enqueued by a Task
            log.warning("job %s of %r: %s; failing it", h.id, h._queue.name, exc, extra=context)
            return Work(h, context, "task", outcome=Outcome("fail", str(exc)))
        context["task"] = task.name
        call = functools.partial(task.func, *args, **kwargs)
        return Work(h, context, f"task {task.name!r}", call, task.is_async)


Dispatch = HandlerDispatch | TaskDispatch


def undecodable(h: JobHandle, context: dict[str, Any], what: str, exc: ValueError) -> Work:
    """The Work of a job whose stored payload is not JSON (a row written or edited by hand:
    the column is text): failed, since no attempt can decode it — fix the row and requeue
    it. Raised on the claim loop's thread, the error would end the worker's run() and let
    the claims of the job's whole batch lapse, in every worker that claims it."""
    problem = f"the job's stored payload could not be decoded: {text_of(exc)}"
    log.error("job %s of %r: %s; failing it", h.id, h._queue.name, problem, extra=context)
    return Work(h, context, what, outcome=Outcome("fail", problem))


def _listed(tasks: Tasks, limit: int = 5) -> str:
    names = [t.name for t in tasks]
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
