"""``Worker``: its two forms and their options, and ``run()`` wiring the claimer, the runner
and the heartbeater.

Stopping: claiming stops at once, in-flight jobs get ``shutdown_grace`` seconds to
finish, and whatever still runs after that is released by letting its claim lapse (async
jobs are cancelled so the event loop can close; sync ones keep their threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .. import _tracing
from .. import _validate as v
from ..errors import AlkstoreError, InvalidOptions
from ..model import Job
from ..queue import JobHandle, Queue
from ..stop import Nudge, StopToken
from ..store import Store
from ..tasks import Task, Tasks, call_problem
from . import observe
from .acker import Acker, Answer
from .claimer import Claimer
from .dispatch import Dispatch, HandlerDispatch, TaskDispatch, Work, job_context
from .heartbeater import Heartbeater
from .outcomes import ACK, Outcome, refused, settle
from .registry import Registration
from .runner import Runner

log = logging.getLogger("alkstore_sa")

Handler = Callable[[Job], Any]
QueueLike = str | Queue

HANDLER_CONCURRENCY = 4  # the §11 form's default
REGISTRY_INTERVAL = 10.0  # how often a worker refreshes its registry row (store.workers())
MAX_REGISTRY_INTERVAL = 30.0
TASKS_CONCURRENCY = 8  # the §12 form's default


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs the jobs of one or more queues, at most ``concurrency`` at a time.

    ``Worker(store, tasks)``: every queue that has a task in the ``Tasks`` registry (or the
    ``queues=`` subset), calling the task each job names. ``Worker(store, queue, handler)``:
    ``handler(job)`` for every job of ``queue`` — a name, a ``Queue``, or a list of them.
    Sync handlers and tasks run on threads, ``async def`` ones on an event loop the worker
    owns.
    """

    def __init__(
        self,
        store: Store,
        target: Tasks | QueueLike | Sequence[QueueLike],
        handler: Handler | None = None,
        *,
        concurrency: int | None = None,
        queues: QueueLike | Sequence[QueueLike] | None = None,
        worker_id: str | None = None,
        batch_size: int | None = None,
        poll_interval: v.Duration = 5.0,
        shutdown_grace: v.Duration = 30.0,
        registry_interval: v.Duration = REGISTRY_INTERVAL,
    ) -> None:
        self.store = store = v.store(store)
        self.tasks: Tasks | None = None
        self.handler: Handler | None = None
        self._dispatch: Dispatch
        if isinstance(target, Tasks):
            if handler is not None:
                raise InvalidOptions(
                    "a Worker given a Tasks registry calls the task each job names: pass no handler"
                )
            self.tasks = target
            self.queues = _task_queues(store, target, queues)
            self._dispatch = TaskDispatch(target)
            default_concurrency = TASKS_CONCURRENCY
        else:
            if queues is not None:
                raise InvalidOptions(
                    "queues= narrows the queues of a Tasks registry; with a handler, pass the "
                    "queue (or a list of queues) as the second argument"
                )
            if handler is None:
                raise InvalidOptions(
                    "a Worker on a queue needs a handler: Worker(store, queue, handler), or "
                    "Worker(store, tasks) for a Tasks registry"
                )
            if not callable(handler):
                raise InvalidOptions("handler must be callable")
            problem = call_problem(handler, "the handler")
            if problem is not None:
                raise InvalidOptions(problem)
            if isinstance(handler, Task):
                # calling a task with the Job would pass the Job as its first argument
                raise InvalidOptions(
                    f"the handler is a task ({handler.name!r}): pass its Tasks registry instead, "
                    f"Worker(store, tasks, queues=[{handler.queue!r}])"
                )
            self.handler = handler
            self.queues = _listed_queues(store, target)
            self._dispatch = HandlerDispatch(handler)
            default_concurrency = HANDLER_CONCURRENCY
        self.queue = self.queues[0]  # the one queue of a one-queue worker
        concurrency = default_concurrency if concurrency is None else concurrency
        self.concurrency = v.int32(concurrency, "concurrency", minimum=1)
        self.batch_size = self.concurrency if batch_size is None else v.int32(batch_size, "batch_size", minimum=1)
        self._given_id = None if worker_id is None else v.worker_id(worker_id)
        self._default_id = (os.getpid(), default_worker_id())  # (the process it names, the id)
        self.poll_interval = v.interval(poll_interval, "poll_interval")
        self.shutdown_grace = v.duration(shutdown_grace, "shutdown_grace")
        self.registry_interval = v.interval(registry_interval, "registry_interval")
        if self.registry_interval > MAX_REGISTRY_INTERVAL:
            raise InvalidOptions(
                f"registry_interval must be at most {MAX_REGISTRY_INTERVAL:g}s (SPEC §15), got {self.registry_interval:g}"
            )
        self.processed = 0  # outcomes recorded (landed or refused), for callers' summaries
        self._count_lock = threading.Lock()
        self._roster = Heartbeater()
        self._claimer: Claimer | None = None
        self._runner: Runner | None = None
        self._running_in: int | None = None  # the pid of the process whose run() is under way
        self._abandoned = 0  # jobs the last run left running after its grace period

    @property
    def worker_id(self) -> str:
        """The id this worker claims, registers and logs under: the one given, else a default
        (``host:pid:random``) of the process that asks. A Worker built in one process and run
        in forked children (a pre-fork server, multiprocessing's fork start method) thus
        takes a new id in each child, instead of every child claiming and registering under
        the parent's; ``run()`` reads it once, so one run uses one id throughout."""
        if self._given_id is not None:
            return self._given_id
        pid = os.getpid()
        if self._default_id[0] != pid:
            self._default_id = (pid, default_worker_id())
        return self._default_id[1]

    def __repr__(self) -> str:
        return f"<alkstore_sa.Worker {self.worker_id!r} on {_names(self.queues)}>"

    # -- main loop -------------------------------------------------------------------------

    def run(self, stop: StopToken | None = None, *, burst: bool = False) -> None:
        """Claim and run jobs until ``stop``; then drain in-flight work (bounded by the
        grace period) and return. ``burst=True`` also returns once no queue has a
        claimable job and nothing runs (batch scripts, tests, cron-style runs). One run at a
        time: InvalidOptions while another run of this Worker is under way."""
        stop = StopToken() if stop is None else v.stop_token(stop)
        # one run at a time: a run keeps its roster, runner and claimer on the Worker (its
        # outcomes are recorded through them), so a second one would replace them under it
        pid = os.getpid()
        with self._count_lock:
            if self._running_in == pid:  # (a pid of another process: a forked copy, not running here)
                raise InvalidOptions(
                    f"this Worker is already running ({self!r}): one Worker runs once at a time; "
                    "make another Worker to run more"
                )
            self._running_in = pid
        try:
            self._run(stop, burst)
        finally:
            self._running_in = None

    def _run(self, stop: StopToken, burst: bool) -> None:
        self.store.check_schema()
        worker_id = self.worker_id  # this process's: claims, registry row, logs and spans alike
        nudge = Nudge()  # wakes the claim loop: a wake-up, a free slot, stop (maybe from a signal handler)
        self._roster = Heartbeater()
        claimer: Claimer | None = None

        def freed() -> None:
            # claimed for on the thread that freed the slots (claimer.py); never on the event
            # loop, which must not block on the database
            if claimer is None or asyncio._get_running_loop() is not None:
                nudge.set()
            else:
                claimer.claim_freed()

        runner = self._runner = Runner(self.concurrency, self._finish, freed)
        # acks of jobs finishing together go out as one statement (acker.py)
        acker = Acker(
            self.batch_size, in_flight=lambda: runner.busy,
            settling=lambda works: self._roster.settling_all([w.key for w in works]),
            finish=self._finish, finish_landed=self._finish_landed, release=runner.release,
        )
        runner.defer = acker.add

        def start(handles: list[JobHandle]) -> None:
            self._roster.add(handles)  # heartbeated from now on, before it starts running
            if observe.observer is not None:  # metrics: each job's wait since its run_at
                for h in handles:
                    observe.started(h)
            works = [self._dispatch.work(h, job_context(h, worker_id)) for h in handles]
            tracer = _tracing.tracer
            if tracer is not None:  # alkstore_sa.tracing: a CONSUMER span per execution
                _traced(tracer, works)
            runner.submit(works)

        claimer = Claimer(
            self.queues, worker_id, batch_size=self.batch_size, poll_interval=self.poll_interval,
            free=runner.free, busy=lambda: runner.busy, start=start, nudge=nudge,
        )
        self._claimer = claimer
        if self.store.backend.acks_ride_claims:
            acker.ride_with = claimer.claim_along  # a batch of acks rides in the next claim's transaction
        watches = self._watch(claimer)
        registration = Registration(
            self.store, worker_id, [q.name for q in self.queues], self.concurrency, self.registry_interval
        )
        registration.start()
        self._roster.start()
        acker.start()
        log.info("worker %s started on %s (%sconcurrency %d)", worker_id, _names(self.queues),
                 "" if self.tasks is None else f"{len(self.tasks)} task(s), ", self.concurrency)
        unhook = stop.on_stop(nudge.set)  # taken back when this run ends (a token outlives runs)
        try:
            claimer.run(stop, burst)
            if stop.stopped:
                log.info(
                    "worker %s: stop requested; finishing %d in-flight job(s) (grace %gs)",
                    worker_id, runner.busy, self.shutdown_grace,
                )
        finally:
            self._drain(worker_id, runner, acker)
            self._roster.stop()
            registration.stop()
            self._unwatch(watches)
            unhook()
            log.info("worker %s stopped after %d jobs", worker_id, self.processed)

    def _drain(self, worker_id: str, runner: Runner, acker: Acker) -> None:
        left = runner.wait_idle(self.shutdown_grace)  # pending acks hold their slots: written by now
        self._abandoned = left  # (the CLI then does not wait for the threads they keep busy)
        if left:
            log.warning(
                "worker %s: %d job(s) still running after the %gs grace period; their claims "
                "will lapse and another worker will retry them",
                worker_id, left, self.shutdown_grace,
            )
        acker.stop()  # writes whatever is still pending (the grace period ran out on it)
        runner.stop()

    # -- wake ------------------------------------------------------------------------------

    def _watch(self, claimer: Claimer) -> list[tuple[Any, str, int]]:
        """Register a wake callback per queue; none (polling only) if the hub cannot start."""
        watches: list[tuple[Any, str, int]] = []
        try:
            hub = self.store.hub()
            for q in self.queues:
                key = self.store.backend.wake_key(q.name)
                wake = _waker(claimer, q.name)
                watches.append((hub, key, hub.watch_queue(key, wake)))
            advertise = getattr(hub, "advertise", None)
            if advertise is not None:
                keys = {q.name: self.store.backend.wake_key(q.name) for q in self.queues}
                claimer.advertise = lambda name: advertise(keys[name])
        except AlkstoreError as exc:
            log.warning("no wake-ups for %s (%s): polling every %.1fs", _names(self.queues), exc, self.poll_interval)
            self._unwatch(watches)
            return []
        return watches

    def _unwatch(self, watches: list[tuple[Any, str, int]]) -> None:
        for hub, key, token in watches:
            with contextlib.suppress(AlkstoreError):
                hub.unwatch_queue(key, token)

    # -- one job's outcome -----------------------------------------------------------------

    def _finish(self, w: Work, outcome: Outcome | None, ack: Answer | None = None) -> None:
        """Record a job's outcome under its claim, on a runner thread (``None``: the job was
        abandoned at shutdown; nothing is recorded and the claim lapses). ``ack``: what its
        ack did, when the ack writer wrote it in a batch (acker.py)."""
        h, context = w.handle, w.context
        landing: str | None = None  # how the outcome landed (observe.ACKED, ...)
        try:
            if outcome is None:
                return
            if not self._roster.settling(w.key):  # (for a batched ack: its writer asked first)
                log.warning(
                    "job %s: claim lost before %s; not %sing", h.id, outcome.kind, outcome.kind, extra=context
                )
                landing = observe.LOST
                observe.finished(h, landing, w.duration)
                return
            try:
                try:
                    landed = settle(h, outcome, context, ack)
                except InvalidOptions as exc:
                    if outcome.kind == "ack":
                        raise
                    # the refused call did not consume the handle: record a retry instead
                    log.error("job %s: %s refused (%s); retrying it on the backoff curve",
                              h.id, outcome.kind, exc, extra=context)
                    outcome = refused(outcome, exc)
                    landed = settle(h, outcome, context, ack)
            except (AlkstoreError, ValueError) as exc:
                log.error("job %s: %s failed: %s", h.id, outcome.kind, exc, extra=context)
                return
            with self._count_lock:
                self.processed += 1
            landing = observe.LOST if landed is None else landed
            observe.finished(h, landing, w.duration)
            if landed is not None:
                log.debug("job %s: %s", h.id, outcome.kind, extra=context)
            else:
                log.warning("job %s: %s refused (claim lapsed, cancelled or swept)", h.id, outcome.kind, extra=context)
        finally:
            self._roster.remove(w.key)  # this claim only: a newer claim of the job keeps beating
            if self._claimer is not None:
                self._claimer.finished(h._queue.name)  # room under a concurrency limit
            if w.span is not None:  # alkstore_sa.tracing: the execution's span ends here
                w.span.end(outcome, landing)

    def _finish_landed(self, works: list[Work]) -> None:
        """Record the acks of a batch that landed (acker.py; it asked the roster first, so
        each claim was live and settling): what ``_finish`` does for each, with one lock per
        batch rather than three per job. Each job's own bookkeeping is tried on its own, as
        in ``_finish``: one that raises (a span whose ``end`` fails) costs no other job its."""
        try:
            with self._count_lock:
                self.processed += len(works)
            debug = log.isEnabledFor(logging.DEBUG)
            for w in works:
                try:
                    observe.finished(w.handle, observe.ACKED, w.duration)
                    if debug:
                        log.debug("job %s: %s", w.handle.id, "ack", extra=w.context)  # as _finish words it
                except BaseException:  # noqa: BLE001 - one job's bookkeeping must not cost the others theirs
                    log.exception("job %s: recording its ack failed unexpectedly", w.handle.id)
        finally:
            self._roster.remove_all([w.key for w in works])  # these claims only (see _finish)
            claimer = self._claimer
            for w in works:
                try:
                    if claimer is not None:
                        claimer.finished(w.handle._queue.name)  # room under a concurrency limit
                    if w.span is not None:  # alkstore_sa.tracing: the execution's span ends here
                        w.span.end(ACK, observe.ACKED)
                except BaseException:  # noqa: BLE001 - as above
                    log.exception("job %s: recording its ack failed unexpectedly", w.handle.id)


def _traced(tracer: _tracing.Tracer, works: list[Work]) -> None:
    """Open each job's CONSUMER span; the handler or task runs with it current. A span that
    cannot be opened (the application's tracer provider or exporter failing) leaves that
    job untraced: tracing never keeps a claimed job from running."""
    for w in works:
        attributes = {"alkstore.worker_id": w.context["worker_id"]}
        if "task" in w.context:
            attributes["alkstore.task"] = w.context["task"]
        try:
            span = tracer.process(w.handle._described(), attributes)  # a payload that is not JSON too
        except Exception:  # noqa: BLE001 - logged; the job runs without its span
            log.warning("job %s: its trace span could not be opened; it runs untraced", w.handle.id,
                        extra=w.context, exc_info=True)
            continue
        w.span = span
        if w.call is not None:
            w.call = span.wrap(w.call, w.is_async)


def _waker(claimer: Claimer, queue: str) -> Callable[[], None]:
    return lambda: claimer.wake(queue)


def _names(queues: list[Queue]) -> str:
    if len(queues) == 1:
        return f"queue {queues[0].name!r}"
    return "queues " + ", ".join(repr(q.name) for q in queues)


def _handle(store: Store, q: object) -> Queue:
    if isinstance(q, Queue):
        if q.store is not store:
            # the worker claims, acks, registers and is woken through its own store alone
            raise InvalidOptions(
                f"queue {q.name!r} is a handle of another Store than the worker's: pass its name, "
                "or a handle of the worker's store (store.queue(name))"
            )
        return q
    return store.queue(q)  # type: ignore[arg-type]  # validates the name (InvalidName)


def _as_list(value: object, what: str) -> list[Any]:
    if isinstance(value, Task):
        raise InvalidOptions(f"{what}: got a task ({value.name!r}); pass its Tasks registry instead")
    if isinstance(value, (str, Queue)):
        return [value]
    if isinstance(value, (list, tuple)):
        if not value:
            raise InvalidOptions(f"{what}: give at least one queue")
        return list(value)
    raise InvalidOptions(
        f"{what}: expected a queue name, a Queue or a list of them, got {type(value).__name__}"
    )


def _unique(queues: list[Queue]) -> list[Queue]:
    """Each queue once (by name), in the order given."""
    first: dict[str, Queue] = {}
    for q in queues:
        first.setdefault(q.name, q)
    return list(first.values())


def _listed_queues(store: Store, target: object) -> list[Queue]:
    """The queues of the §11 form: a name, a Queue, or a list of them."""
    return _unique([_handle(store, q) for q in _as_list(target, "Worker(store, queue, handler)")])


def _task_queues(store: Store, tasks: Tasks, queues: object) -> list[Queue]:
    """The queues a Tasks worker serves: every queue with a task, or the ``queues=`` subset
    (each of which must have a task)."""
    have = tasks.queues()
    if not have:
        raise InvalidOptions("the Tasks registry has no tasks: nothing to serve (import the modules that define them first)")
    if queues is None:
        return [store.queue(name) for name in have]
    chosen = _unique([_handle(store, q) for q in _as_list(queues, "queues=")])
    for q in chosen:
        if q.name not in have:
            raise InvalidOptions(
                f"queue {q.name!r} has no task in this registry (its queues: {', '.join(map(repr, have))})"
                f"{_spelling_hint(q.name, have)}"
            )
    return chosen


def _spelling(name: str) -> str:
    for form in ("NFC", "NFD"):
        if unicodedata.is_normalized(form, name):
            return form
    return "mixed"


def _spelling_hint(name: str, names: list[str]) -> str:
    """What tells ``name`` from a name among ``names`` it prints like: the same text in
    another Unicode spelling (composed 'é' or 'e' with a combining accent; names are exact
    code points, SPEC §3). Empty when there is none."""
    key = unicodedata.normalize("NFC", name)
    for other in names:
        if unicodedata.normalize("NFC", other) == key:
            return (
                f"; it differs from {other!r} only in its Unicode spelling ({_spelling(name)}, not "
                f"{_spelling(other)}): names are exact code points, so normalize them, e.g. "
                "unicodedata.normalize('NFC', name)"
            )
    return ""
