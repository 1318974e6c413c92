"""Tasks (SPEC §12): named functions whose calls are enqueued as jobs, and the registry a
worker dispatches them from.

A task job's payload is pinned: ``{"task": NAME, "args": [...], "kwargs": {...}}``. The job
carries the task's stamps (§5.1), so claims, heartbeats and retries never need the registry;
a worker needs it only to find the function a job names (``Tasks.resolve``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Union, cast, overload

from sqlalchemy.engine import Connection, Engine

from . import _validate as v
from ._orm import is_session_like
from .errors import AlkstoreError, InvalidOptions, InvalidSpec, PayloadError
from .queue import Queue, QueueOpts
from .store import Store, store_for
from .transactional import (
    bind_of_caller,
    enqueue_as,
    is_async_session,
    run_in_async_transaction,
    sync_given_to_async,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, scoped_session

P = ParamSpec("P")
R = TypeVar("R")

EnqueueTarget = Union[Store, "Session", "scoped_session[Any]", Connection]
_ACCEPTED = "a Store (its own transaction) or a Session, scoped_session or Connection (your transaction)"
_ACCEPTED_ASYNC = (
    "an AsyncSession, async_scoped_session or AsyncConnection (your transaction) "
    "or a Store (its own transaction)"
)


class UnknownTask(AlkstoreError, LookupError):
    """A job names a task this registry does not have (a deploy in progress, say): the worker
    retries it with this message, never acks it."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown task '{name}'")


class NotATaskPayload(AlkstoreError, ValueError):
    """A job's payload is not ``{"task": str, "args": list, "kwargs": dict}``: it was enqueued
    by something other than a Task, and no deploy can make it runnable."""

    default_message = 'not a task payload: expected {"task": str, "args": list, "kwargs": dict}'


@dataclass(frozen=True)
class _PerCall:
    """Enqueue options of one call (``Task.using``); ``None`` keeps the task's own."""

    delay: v.Duration | None = None
    run_at: datetime | None = None
    priority: int | None = None
    max_attempts: int | None = None
    expires: v.Duration | None = None
    unique_key: str | None = None


class TaskCall(Generic[P]):
    """A task with per-call enqueue options, made by ``Task.using``. It never changes the
    task: each ``using`` returns a new one."""

    def __init__(self, task: Task[P, Any], options: _PerCall) -> None:
        self.task = task
        self.options = options

    def __repr__(self) -> str:
        return f"<alkstore_sa.TaskCall {self.task.name!r} {self.options}>"

    def using(
        self,
        *,
        delay: v.Duration | None = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
        unique_key: str | None = None,
    ) -> TaskCall[P]:
        """A new TaskCall with these options over this one's (``None`` keeps the current
        value). ``delay`` and ``run_at`` both set the ready time, so giving one alone
        replaces the other as well. Invalid options raise here, not at enqueue."""
        # validated now so the mistake points at the using() line; enqueue validates again
        v.optional_duration(delay, "delay")
        if run_at is not None:
            v.aware_datetime(run_at, "run_at")
        if priority is not None:
            v.int32(priority, "priority")
        if max_attempts is not None:
            v.max_attempts(max_attempts)
        v.optional_lease(expires, "expires")
        v.unique_key(unique_key)
        given: dict[str, Any] = {
            "delay": delay, "run_at": run_at, "priority": priority,
            "max_attempts": max_attempts, "expires": expires, "unique_key": unique_key,
        }
        changes = {k: x for k, x in given.items() if x is not None}
        if (delay is None) != (run_at is None):  # one ready time replaces the earlier one
            changes.setdefault("delay", None)
            changes.setdefault("run_at", None)
        return TaskCall(self.task, replace(self.options, **changes))

    def enqueue(self, target: EnqueueTarget, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue a call of the task; returns the job id. ``target`` is a Store (the job is
        committed in its own transaction) or a Session / scoped_session / Connection (the job
        joins that transaction and is never committed here)."""
        task = self.task
        own = isinstance(target, Store)
        if not own and not (isinstance(target, Connection) or is_session_like(target)):
            raise _wrong_target(target)
        payload = task._payload(args, kwargs)
        o = self.options
        options: dict[str, Any] = {
            "delay": o.delay, "run_at": o.run_at, "max_attempts": o.max_attempts, "expires": o.expires,
            "priority": task.priority if o.priority is None else o.priority, "unique_key": o.unique_key,
        }
        try:
            if own:
                return Queue._unchecked(cast(Store, target), task.queue, task.opts).enqueue(payload, **options)
            queue = _queue_in(cast(EnqueueTarget, target), task)
            return enqueue_as("task", cast(Any, target), queue, payload, **options)
        except PayloadError as exc:
            raise PayloadError(f"task {task.name!r}: {exc}") from None

    async def aenqueue(self, session: Any, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue a call of the task in an async caller's transaction (AsyncSession,
        async_scoped_session or AsyncConnection; never committed here), or through a Store in
        a worker thread (its own transaction)."""
        if isinstance(session, Store):
            return await asyncio.to_thread(self.enqueue, session, *args, **kwargs)
        if isinstance(session, Connection) or is_session_like(session):
            raise sync_given_to_async(session, "task.aenqueue", "task.enqueue(session, ...) without await")
        if not is_async_session(session):
            raise InvalidOptions(f"aenqueue() takes {_ACCEPTED_ASYNC}, got {type(session).__name__}")
        # the native path of alk.aenqueue: the sync form runs on the caller's async connection,
        # its statements compiled for that connection's driver (asyncpg, aiosqlite, psycopg)
        return await run_in_async_transaction(
            session, "enqueue", lambda sync: self.enqueue(sync, *args, **kwargs), owner="task"
        )


class Task(Generic[P, R]):
    """A function registered in a ``Tasks`` registry. Calling it runs the function here and
    returns its result (for an ``async def`` function, the coroutine); ``enqueue`` makes a
    job of the call for a worker to run."""

    def __init__(
        self, func: Callable[P, R], *, name: str, queue: str, opts: QueueOpts, priority: int
    ) -> None:
        # the function's own __dict__ is not copied: it could shadow enqueue/using
        functools.update_wrapper(self, func, updated=())
        self.func = func
        self.name = name
        self.queue = queue
        self.opts = opts
        self.priority = priority
        # (a Task of another registry, or a partial of one, is async when its function is)
        self.is_async: bool = is_async_callable(func)
        mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
        if self.is_async and mark is not None:
            mark(self)  # so inspect.iscoroutinefunction(task) answers as for the function
        self._signature = _signature_of(func)
        self._plain: TaskCall[P] = TaskCall(self, _PerCall())

    def __repr__(self) -> str:
        return f"<alkstore_sa.Task {self.name!r} queue={self.queue!r}>"

    def __reduce__(self) -> str:
        """Pickled by reference, as its function would be (to a process pool, say): its
        module's attribute of its qualified name, which is this Task. Copies are itself."""
        qualname = getattr(self, "__qualname__", None)
        if not isinstance(qualname, str):
            raise pickle.PicklingError(f"cannot pickle task {self.name!r}: its function has no __qualname__")
        return qualname

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    def enqueue(self, target: EnqueueTarget, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue a call; ``target`` is a Store (own transaction) or a Session /
        scoped_session / Connection (the caller's transaction, never committed)."""
        return self._plain.enqueue(target, *args, **kwargs)

    async def aenqueue(self, session: Any, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue a call in an AsyncSession / async_scoped_session / AsyncConnection's
        transaction (or through a Store, in a thread)."""
        return await self._plain.aenqueue(session, *args, **kwargs)

    def using(
        self,
        *,
        delay: v.Duration | None = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
        unique_key: str | None = None,
    ) -> TaskCall[P]:
        """Per-call options (§5.2) for the next enqueues; returns a new object, the task is
        unchanged. ``priority`` overrides the task's; ``max_attempts`` its stamp;
        ``unique_key`` makes each enqueue yield to a live job holding that key (§14)."""
        return self._plain.using(
            delay=delay, priority=priority, run_at=run_at, max_attempts=max_attempts, expires=expires,
            unique_key=unique_key,
        )

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The pinned payload of a call. Arguments that the function could not take are refused
        now, not after a worker has spent the job's attempts on a TypeError."""
        if self._signature is not None:
            try:
                self._signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise InvalidOptions(f"task {self.name!r} cannot take these arguments: {exc}") from None
        return {"task": self.name, "args": list(args), "kwargs": kwargs}


class Tasks:
    """A registry of tasks by name; one per application is usual. A worker given it serves the
    queues that have a task and calls the task each job's payload names."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[..., Any]] = {}

    def __repr__(self) -> str:
        return f"<alkstore_sa.Tasks {len(self._tasks)} tasks on {self.queues()}>"

    @overload
    def task(self, func: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        visibility_timeout: v.Duration = 300,
        backoff_base: v.Duration = 5,
        priority: int = 0,
        name: str | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        visibility_timeout: v.Duration = 300,
        backoff_base: v.Duration = 5,
        priority: int = 0,
        name: str | None = None,
    ) -> Any:
        """Register a function as a task: ``@tasks.task`` or ``@tasks.task(queue=..., ...)``.

        ``max_attempts``, ``visibility_timeout`` and ``backoff_base`` are the stamps of the
        task's jobs (the §5.1 queue defaults), ``priority`` their default priority. ``name``
        defaults to ``module.qualname``. Bad options raise ``InvalidOptions`` / ``InvalidName``
        and a name already in this registry ``InvalidSpec``, here, at decoration.
        """
        if func is not None and not callable(func):
            raise InvalidOptions(
                f"task() takes its options as keywords, e.g. @tasks.task(queue='emails'); "
                f"got a positional {type(func).__name__}"
            )
        queue = v.name(queue, "queue name")
        opts = QueueOpts.validated(
            visibility_timeout=visibility_timeout, max_attempts=max_attempts, backoff_base=backoff_base
        )
        priority = v.int32(priority, "priority")
        if name is not None:
            name = v.name(name, "task name")

        def decorate(f: Callable[P, R]) -> Task[P, R]:
            if isinstance(f, staticmethod):
                # @tasks.task above @staticmethod in a class body: the function it holds is
                # the task (the object is callable, but neither async nor generator checks
                # see through it)
                f = f.__func__
            if not callable(f):
                raise InvalidOptions(f"@tasks.task decorates a function, got a {type(f).__name__}")
            problem = call_problem(f, f"task {name or _default_name(f)!r}") or _method_problem(f)
            if problem is not None:
                raise InvalidOptions(problem)
            task = Task(f, name=name or _default_name(f), queue=queue, opts=opts, priority=priority)
            self._add(task)
            return task

        return decorate if func is None else decorate(func)

    def _add(self, task: Task[..., Any]) -> None:
        existing = self._tasks.get(task.name)
        if existing is not None:
            if task.name.endswith(".<lambda>"):  # every lambda of one scope has one qualname
                why = ": it is the default name of every lambda defined there; pass name=... to register each"
            elif ".<locals>." in task.name:  # a closure's name is the same on every run of its outer function
                why = (
                    ": it is the default name of a function defined inside another function, the "
                    "same each time the outer one runs; pass name=... (e.g. made from the outer "
                    "function's arguments) to register each"
                )
            else:
                why = "; pass name=... to register another"
            raise InvalidSpec(
                task.name,
                f"a task named {task.name!r} is already in this registry (on queue {existing.queue!r}){why}",
            )
        self._tasks[task.name] = task

    # -- lookup ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Task[..., Any]]:
        return iter(list(self._tasks.values()))

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __getitem__(self, name: str) -> Task[..., Any]:
        return self._tasks[name]

    def get(self, name: str) -> Task[..., Any] | None:
        return self._tasks.get(name)

    def queues(self) -> list[str]:
        """The queues that have a task, each once, in the order their first task was registered."""
        return list(dict.fromkeys(t.queue for t in self._tasks.values()))

    def resolve(self, payload: object) -> tuple[Task[..., Any], list[Any], dict[str, Any]]:
        """The task a job's payload names, with its args and kwargs: what a worker calls.

        Raises ``NotATaskPayload`` when the payload is not the pinned shape (extra keys are
        ignored, so a later version may add some) and ``UnknownTask`` when no task of this
        registry has the name.
        """
        if type(payload) is dict:  # the shape Task.enqueue writes: checked without a loop
            name, args, kwargs = payload.get("task"), payload.get("args"), payload.get("kwargs")
            if type(name) is str and type(args) is list and type(kwargs) is dict:
                task = self._tasks.get(name)
                if task is None:
                    raise UnknownTask(name)
                return task, args, kwargs
        problem = _payload_problem(payload)
        if problem is not None:
            raise NotATaskPayload(f"{NotATaskPayload.default_message}; {problem}")
        assert isinstance(payload, dict)  # _payload_problem checked it
        task = self._tasks.get(payload["task"])
        if task is None:
            raise UnknownTask(payload["task"])
        return task, payload["args"], payload["kwargs"]


# -- helpers --------------------------------------------------------------------------------


def _default_name(func: Callable[..., Any]) -> str:
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise InvalidOptions(f"cannot name a task after {func!r}: pass name=...")
    return v.name(f"{module}.{qualname}", "task name")


def _unpartial(fn: object) -> object:
    """The callable under any ``functools.partial`` layers, and under a Task its function
    (before Python 3.12 nothing marks an async Task itself as a coroutine function)."""
    while isinstance(fn, (functools.partial, Task)):
        fn = fn.func
    return fn


def _called(fn: object) -> tuple[object, ...]:
    """What calling ``fn`` runs, for telling its kind: the callable under any partial
    layers, and an object's ``__call__`` (Python's own checks see through a partial of a
    function, not of a callable object). A class's own ``__call__`` is its instances': what
    calling the class runs is its constructor."""
    fn = _unpartial(fn)
    if isinstance(fn, type):
        return (fn,)
    return fn, getattr(fn, "__call__", None)  # noqa: B004 - a callable object's __call__


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine to await: an ``async def`` function, an
    object with an ``async def __call__``, or a partial of either (also what
    ``inspect.markcoroutinefunction`` marked)."""
    return any(inspect.iscoroutinefunction(f) for f in _called(fn))


def call_problem(fn: object, what: str) -> str | None:
    """Why ``fn`` cannot be a task or handler, else None: a generator function (sync or
    async: calling it runs none of its body, and the worker never iterates what it returns),
    or a class whose instances are callable — a ``__call__`` of any kind, its own or
    inherited (given where an instance was meant: calling the class only makes an instance,
    which the worker takes for the result, and the ``__call__`` never runs)."""
    cls = _unpartial(fn)
    # its instances' __call__ (getattr would find type's, which every class has)
    if isinstance(cls, type) and any("__call__" in vars(klass) for klass in cls.__mro__):
        return (
            f"{what} is a class ({cls.__name__}): calling it only makes an instance, and its "
            f"__call__ would never run; pass an instance ({cls.__name__}(), say)"
        )
    for f in _called(fn):
        if inspect.isgeneratorfunction(f) or inspect.isasyncgenfunction(f):
            kind = "an async generator" if inspect.isasyncgenfunction(f) else "a generator"
            return (
                f"{what} is {kind} function: calling it runs none of its body and the worker "
                "never iterates it; make it return (or, for async, end) when its work is done"
            )
    return None


def _method_problem(f: object) -> str | None:
    """Why ``f`` cannot be a task if it is a method decorated in its class body (a plain
    function defined there whose first parameter is ``self``), else None: the worker calls a
    task with its job's arguments alone, so no job of it could run. (A staticmethod's
    function is defined there too, but takes no ``self``; a closure's qualname ends
    ``<locals>.name``.)"""
    if not inspect.isfunction(f):
        return None
    where = f.__qualname__.split(".")
    if len(where) < 2 or where[-2] == "<locals>":
        return None
    signature = _signature_of(f)
    first = next(iter(signature.parameters.values()), None) if signature is not None else None
    if first is None or first.name != "self" or first.kind not in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    ):
        return None
    return (
        f"task {f.__module__}.{f.__qualname__!s} is a method (its first parameter is self): the "
        "worker calls a task with the job's arguments alone and has no instance to pass as "
        "self; make it a module-level function or a @staticmethod, or register a bound method "
        f"of an instance (tasks.task(obj.{f.__name__}, name=...))"
    )


def _signature_of(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature enqueue checks arguments against; None when Python cannot tell it (some
    builtins), and then the arguments are not checked."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _payload_problem(payload: object) -> str | None:
    if not isinstance(payload, dict):
        return f"got a {type(payload).__name__}"
    for key, kind in (("task", str), ("args", list), ("kwargs", dict)):
        if key not in payload:
            return f"{key!r} is missing"
        if not isinstance(payload[key], kind):
            return f"{key!r} is a {type(payload[key]).__name__}, not a {kind.__name__}"
    return None


def _wrong_target(target: object) -> InvalidOptions:
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_scoped_session,
    )

    kind = type(target).__name__
    if isinstance(target, (AsyncSession, AsyncConnection, async_scoped_session)):
        return InvalidOptions(f"an {kind} is asynchronous: use `await task.aenqueue(session, ...)`")
    if isinstance(target, (Engine, AsyncEngine)):
        return InvalidOptions(f"an {kind} has no transaction to join: pass {_ACCEPTED}")
    return InvalidOptions(f"enqueue() takes {_ACCEPTED}, got {kind}")


class _Defaults:
    """Stands in for a Store on an engine no Store was made for: the caller's-transaction
    functions then use the defaults (SPEC §4), and a Queue handle carries the task's stamps
    to them. Everything but ``_check_open`` is the defaults object's own."""

    def __init__(self, defaults: object) -> None:
        self._defaults = defaults

    def _check_open(self) -> None:
        """The defaults are never closed."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._defaults, attr)


def _queue_in(session: EnqueueTarget, task: Task[..., Any]) -> Queue:
    """A handle with the task's stamps on the store that ``alk.enqueue`` would use for this
    session's engine (found from the session's bind: no connection is taken here)."""
    store = store_for(bind_of_caller(cast(Any, session), owner="task"))
    if not isinstance(store, Store):
        store = cast(Store, _Defaults(store))
    return Queue._unchecked(cast(Store, store), task.queue, task.opts)
