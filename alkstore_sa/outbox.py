"""The outbox (SPEC §6): messages written in the caller's transaction, relayed afterwards.

An outbox is a queue under a derived, reserved backing name with fixed stamps (visibility
60 s, 5 attempts, backoff base 5 s). The reserved name cannot be reached through
``alk.enqueue``: only this surface writes and reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _validate as v
from .errors import InvalidName, InvalidOptions
from .model import Job
from .queue import DEFAULT_OPTS, JobHandle, Queue, QueueOpts
from .stop import StopToken

if TYPE_CHECKING:
    from .store import Store

OUTBOX_OPTS = QueueOpts(visibility_timeout=60.0, max_attempts=5, backoff_base=5.0)


def backing_queue_name(name: str) -> str:
    """The reserved queue behind outbox ``name``."""
    return f"{v.RESERVED_PREFIX}_outbox:{name}"


def listed_queue(store: Store, name: str, **opts: Any) -> Queue:
    """A handle on a queue named as the database lists it, for the operator tools (the CLI,
    the dashboard): an application queue, or the backing queue of an outbox — reserved, so
    ``store.queue`` refuses it — with the outbox's stamps unless ``opts`` gives others."""
    outbox = _outbox_of(name)
    if outbox is None:
        return store.queue(name, **opts)
    backing = store.outbox(outbox).queue
    return backing if not opts else Queue._unchecked(store, backing.name, QueueOpts.validated(**opts))


def stored_queue(store: Store, name: str) -> Queue:
    """The queue a name the database holds stands for, for the operator tools' sweeps,
    deletes and cancels. A row written by hand or by another tool may name a queue ``store.queue``
    refuses (empty, reserved, too long): it is taken as stored — those statements take the
    name as a parameter and read the rows' own stamps — rather than refused, which would
    stop the operation at that row."""
    try:
        return listed_queue(store, name)
    except InvalidName:
        return Queue._unchecked(store, name, DEFAULT_OPTS)


def listed_queue_name(name: object) -> str:
    """``name`` validated as ``listed_queue`` takes it (for reads by name)."""
    outbox = _outbox_of(name)
    if outbox is None:
        return v.name(name, "queue name")
    return backing_queue_name(v.name(outbox, "outbox name"))


def _outbox_of(name: object) -> str | None:
    """The outbox whose backing queue ``name`` is, or None."""
    prefix = backing_queue_name("")
    return name[len(prefix):] if isinstance(name, str) and name.startswith(prefix) else None


class Outbox:
    """A handle on the outbox ``name``; constructing it writes nothing."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = v.store(store)
        self.name = v.name(name, "outbox name")
        self._queue = Queue._unchecked(store, backing_queue_name(self.name), OUTBOX_OPTS)

    def __repr__(self) -> str:
        return f"<alkstore_sa.Outbox {self.name!r}>"

    @property
    def queue(self) -> Queue:
        """The backing queue (for stats, dead-letter inspection and requeue)."""
        return self._queue

    def enqueue(self, payload: Any) -> int:
        """Write one message in its own transaction; returns its id."""
        return self._queue.enqueue(payload)

    def claim_one(self, worker_id: str) -> JobHandle | None:
        return self._queue.claim_one(worker_id)

    def claim_batch(self, worker_id: str, n: int) -> list[JobHandle]:
        return self._queue.claim_batch(worker_id, n)

    def get_job(self, job_id: int) -> Job | None:
        return self._queue.get_job(job_id)

    def relay(
        self,
        deliver: Callable[[Any], Any],
        stop: StopToken,
        worker_id: str = "relay",
        *,
        poll_interval: v.Duration = 5.0,
        shutdown_grace: v.Duration = 30.0,
    ) -> None:
        """Until ``stop``: claim → ``deliver(payload)`` → ack, one message at a time, oldest
        first (best effort: docs/outbox.md); an exception retries on the curve, dead after 5
        attempts. ``deliver`` may be ``async def`` (awaited on the relay's event loop). A stop
        lets the delivery in flight finish for up to ``shutdown_grace`` seconds. At-least-once:
        ``deliver`` may see a message again after a crash, so make it idempotent."""
        from .tasks import call_problem, is_async_callable
        from .worker import Worker

        stop = v.stop_token(stop)  # Worker.run(None) would run with a token nobody can stop
        if not callable(deliver):  # else every message would fail in it until dead
            raise InvalidOptions(f"deliver must be callable, got {type(deliver).__name__}")
        problem = call_problem(deliver, "deliver")  # checked here: the worker sees a wrapper
        if problem is not None:
            raise InvalidOptions(problem)
        handler: Callable[[Job], Any]
        if is_async_callable(deliver):

            async def handler(job: Job) -> Any:  # an async handler, so the worker awaits it
                return await deliver(job.payload)

        else:

            def handler(job: Job) -> Any:
                return deliver(job.payload)

        worker = Worker(
            self.store, self._queue, handler, concurrency=1,
            worker_id=worker_id, poll_interval=poll_interval, shutdown_grace=shutdown_grace,
        )
        worker.run(stop)
