"""SPEC §12, the worker side of tasks, on both engines: a Worker given a ``Tasks`` registry
(or one handler for several queues) serves every queue with one fair claim loop, calls the
task each job names with its args and kwargs, runs ``async def`` tasks and handlers on an
event loop it owns (sync ones on threads; ``concurrency`` bounds both together), and
applies the §11 rules — outcomes, heartbeats, lost claims, graceful stop — to both kinds.

Workers run in a thread of the test; every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.worker import acker, claimer
from alkstore_sa.worker.loop import EventLoopThread
from tests.conformance.test_worker import running
from tests.support import WAIT, FakeClock, Target, wait_for


def _names(worker: alk.Worker) -> list[str]:
    return [q.name for q in worker.queues]


def _raw(store: alk.Store, queue: str, payload: Any, **options: Any) -> int:
    """A job enqueued without a Task (another app, an older deploy, a hand-made payload)."""
    return store.queue(queue, **options).enqueue(payload)


def _job(store: alk.Store, queue: str, job_id: int) -> alk.Job | None:
    return store.queue(queue).get_job(job_id)


class Gate:
    """A thread-safe gate for sync and async tasks alike (async ones poll it on the loop, so
    the test never needs the worker's loop object)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self) -> None:
        assert self.event.wait(2 * WAIT), "the test never opened the gate"

    async def await_open(self) -> None:
        deadline = time.monotonic() + 2 * WAIT
        while not self.event.is_set():
            assert time.monotonic() < deadline, "the test never opened the gate"
            await asyncio.sleep(0.005)

    def open(self) -> None:
        self.event.set()


# -- construction ------------------------------------------------------------------------------


def test_a_tasks_worker_serves_every_queue_that_has_a_task(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    tasks.task(queue=f"{qname}-a", name="a1")(lambda: None)
    tasks.task(queue=f"{qname}-b", name="b1")(lambda: None)
    tasks.task(queue=f"{qname}-a", name="a2")(lambda: None)
    w = alk.Worker(store, tasks)
    assert _names(w) == [f"{qname}-a", f"{qname}-b"]
    assert w.concurrency == 8 and w.tasks is tasks and w.handler is None
    narrowed = alk.Worker(store, tasks, queues=[f"{qname}-b"], concurrency=2)
    assert _names(narrowed) == [f"{qname}-b"] and narrowed.concurrency == 2
    assert _names(alk.Worker(store, tasks, queues=f"{qname}-b")) == [f"{qname}-b"]


def test_a_queue_without_a_task_is_refused_naming_the_registry_queues(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    tasks.task(queue=f"{qname}-a", name="a1")(lambda: None)
    with pytest.raises(alk.InvalidOptions) as err:
        alk.Worker(store, tasks, queues=[f"{qname}-a", "reports"])
    message = str(err.value)
    assert "'reports'" in message and "no task" in message and f"'{qname}-a'" in message, message
    with pytest.raises(alk.InvalidOptions, match="no tasks"):
        alk.Worker(store, alk.Tasks())
    with pytest.raises(alk.InvalidOptions, match="at least one queue"):
        alk.Worker(store, tasks, queues=[])


def test_a_queue_named_in_another_unicode_spelling_is_told_apart(store: alk.Store) -> None:
    """Names are exact code points: 'café' composed (NFC) and decomposed (NFD) are two
    queues. A worker asked for the other spelling said "queue 'café' has no task in this
    registry (its queues: 'café')", two names that print alike; it now says how they differ."""
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    tasks = alk.Tasks()
    tasks.task(queue=composed, name="t")(lambda: None)
    with pytest.raises(alk.InvalidOptions, match=r"differs from 'café' only in its Unicode spelling \(NFD, not NFC\)"):
        alk.Worker(store, tasks, queues=[decomposed])
    assert [q.name for q in alk.Worker(store, tasks, queues=[composed]).queues] == [composed]


def test_handler_form_takes_one_or_several_queues(store: alk.Store, qname: str) -> None:
    def handler(job: alk.Job) -> None:
        return None

    assert _names(alk.Worker(store, qname, handler)) == [qname]
    w = alk.Worker(store, [f"{qname}-a", store.queue(f"{qname}-b"), f"{qname}-a"], handler)
    assert _names(w) == [f"{qname}-a", f"{qname}-b"]  # each queue once, in the order given
    assert w.concurrency == 4 and w.queue.name == f"{qname}-a" and w.tasks is None
    with pytest.raises(alk.InvalidOptions, match="at least one queue"):
        alk.Worker(store, [], handler)
    with pytest.raises(alk.InvalidName):
        alk.Worker(store, [qname, ""], handler)


@pytest.mark.parametrize(
    "build",
    [
        lambda store, tasks: alk.Worker(store, tasks, lambda job: None),  # a registry calls its tasks
        lambda store, tasks: alk.Worker(store, "q", lambda job: None, queues=["q"]),  # queues= is for registries
        lambda store, tasks: alk.Worker(store, "q"),  # a queue needs a handler
        lambda store, tasks: alk.Worker(store, 42, lambda job: None),  # type: ignore[arg-type]
        lambda store, tasks: alk.Worker(store, tasks, queues=[42]),  # type: ignore[list-item]
        lambda store, tasks: alk.Worker(store, "q", tasks["t"]),  # a task is not a handler
        lambda store, tasks: alk.Worker(store, tasks["t"]),  # type: ignore[arg-type]  # nor a registry
    ],
    ids=[
        "tasks-and-handler", "queues-with-handler", "no-handler", "bad-target", "bad-queue",
        "task-as-handler", "task-as-registry",
    ],
)
def test_mixed_up_forms_are_refused(store: alk.Store, build: Callable[..., Any]) -> None:
    tasks = alk.Tasks()
    tasks.task(queue="q", name="t")(lambda: None)
    with pytest.raises((alk.InvalidOptions, alk.InvalidName)):
        build(store, tasks)


def test_a_queue_handle_of_another_store_is_refused(store: alk.Store, qname: str, tmp_path: Any) -> None:
    """A worker claims, acks, registers and is woken through its own store: a Queue handle of
    another store (another database, or another Store object) was served through a mix of
    both — a round of turns claimed every queue through the first one's store and a batch
    of acks went through its first job's, so jobs ran and were never acked."""
    other = alk.Store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        other.install()
        tasks = alk.Tasks()
        tasks.task(queue=qname, name="t")(lambda: None)
        for build in (
            lambda: alk.Worker(store, other.queue(qname), lambda job: None),
            lambda: alk.Worker(store, [qname, other.queue(f"{qname}-b")], lambda job: None),
            lambda: alk.Worker(store, tasks, queues=[other.queue(qname)]),
        ):
            with pytest.raises(alk.InvalidOptions, match="another Store"):
                build()
        assert alk.Worker(store, store.queue(qname), lambda job: None).queues[0].store is store
    finally:
        other.close()


# -- dispatch by task name -------------------------------------------------------------------


def test_tasks_are_called_with_their_args_and_kwargs_across_queues(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    calls: list[tuple[str, Any, Any, int | None]] = []

    @tasks.task(queue=f"{qname}-emails", name="send_email")
    def send_email(order_id: int, *, template: str = "receipt") -> None:
        job = alk.current_job()
        calls.append(("send_email", order_id, template, job and job.id))

    @tasks.task(queue=f"{qname}-reports", name="build_report")
    async def build_report(day: str, parts: list[int]) -> str:
        await asyncio.sleep(0)
        job = alk.current_job()
        calls.append(("build_report", day, parts, job and job.id))
        return "ignored"

    a = send_email.enqueue(store, 42, template="x")
    b = send_email.enqueue(store, 7)
    c = build_report.enqueue(store, "2024-05-01", [1, 2])
    with running(alk.Worker(store, tasks, concurrency=3, poll_interval=0.2)) as r:
        wait_for(lambda: len(calls) == 3, "the three jobs to run")
        wait_for(
            lambda: all(_job(store, q, i) is None for q, i in [(f"{qname}-emails", a), (f"{qname}-emails", b), (f"{qname}-reports", c)]),
            "the acks",
        )
        r.stop_and_join()
    assert sorted(calls, key=str) == sorted(
        [("send_email", 42, "x", a), ("send_email", 7, "receipt", b), ("build_report", "2024-05-01", [1, 2], c)],
        key=str,
    )


def test_a_handler_serves_several_queues(store: alk.Store, qname: str) -> None:
    seen: list[tuple[str, Any]] = []
    ids = {
        store.queue(f"{qname}-a").enqueue({"n": 1}): f"{qname}-a",
        store.queue(f"{qname}-b").enqueue({"n": 2}): f"{qname}-b",
    }

    def handler(job: alk.Job) -> None:
        seen.append((job.queue, job.payload))

    with running(alk.Worker(store, list(dict.fromkeys(ids.values())), handler, poll_interval=0.2)) as r:
        wait_for(lambda: len(seen) == 2, "both queues' jobs")
        wait_for(lambda: all(_job(store, q, i) is None for i, q in ids.items()), "the acks")
        r.stop_and_join()
    assert sorted(seen, key=str) == [(f"{qname}-a", {"n": 1}), (f"{qname}-b", {"n": 2})]


def test_narrowed_queues_leave_the_others_alone(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    ran: list[str] = []
    tasks.task(queue=f"{qname}-a", name="ta")(lambda: ran.append("a"))
    tb = tasks.task(queue=f"{qname}-b", name="tb")(lambda: ran.append("b"))
    ta = tasks["ta"]
    ta.enqueue(store)
    other = tb.enqueue(store)
    alk.Worker(store, tasks, queues=[f"{qname}-a"], poll_interval=0.2).run(burst=True)
    assert ran == ["a"]
    job = _job(store, f"{qname}-b", other)
    assert job is not None and job.state == "pending" and job.attempts == 0


def test_unknown_task_is_retried_with_that_error_never_acked(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="alkstore_sa")
    tasks = alk.Tasks()
    tasks.task(queue=qname, name="known")(lambda: None)
    job_id = _raw(store, qname, {"task": "shop.jobs.gone", "args": [], "kwargs": {}})
    last = _raw(store, qname, {"task": "shop.jobs.gone", "args": [1], "kwargs": {}}, max_attempts=1)
    with running(alk.Worker(store, tasks, concurrency=2, poll_interval=0.2)) as r:
        wait_for(
            lambda: (j := _job(store, qname, job_id)) is not None and j.errors and j.state == "pending",
            "the retry",
        )
        wait_for(lambda: (j := _job(store, qname, last)) is not None and j.state == "dead", "the last attempt to bury it")
        r.stop_and_join()
    job = _job(store, qname, job_id)
    assert job is not None and job.attempts == 1
    assert job.errors[-1]["error"] == "unknown task 'shop.jobs.gone'"
    buried = _job(store, qname, last)
    assert buried is not None and buried.last_error == "max attempts exceeded"
    assert buried.errors[-1]["error"] == "unknown task 'shop.jobs.gone'"
    assert any("unknown task 'shop.jobs.gone'" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize(
    "payload",
    [{"to": "a@example.com"}, [1, 2], {"task": "known", "args": {}, "kwargs": {}}],
    ids=["no-task-key", "a-list", "args-not-a-list"],
)
def test_a_payload_that_is_not_a_task_call_goes_dead(store: alk.Store, qname: str, payload: Any) -> None:
    tasks = alk.Tasks()
    tasks.task(queue=qname, name="known")(lambda: None)
    job_id = _raw(store, qname, payload)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    job = _job(store, qname, job_id)
    assert job is not None and job.state == "dead" and job.attempts == 1
    assert job.last_error is not None and job.last_error.startswith("not a task payload"), job.last_error


def test_a_sync_task_that_returns_a_coroutine_is_retried_never_acked(
    store: alk.Store, qname: str, recwarn: pytest.WarningsRecorder
) -> None:
    tasks = alk.Tasks()
    body_ran: list[int] = []

    async def body() -> None:
        body_ran.append(1)

    @tasks.task(queue=qname, name="sneaky")
    def sneaky() -> Any:
        return body()  # a sync function handing back a coroutine: nobody would await it

    job_id = sneaky.enqueue(store)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    job = _job(store, qname, job_id)
    assert job is not None and job.state == "pending" and job.attempts == 1
    error = job.errors[-1]["error"]
    assert "returned an awaitable" in error and "'sneaky'" in error and "async def" in error, error
    assert body_ran == []
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_an_async_task_or_handler_returning_a_coroutine_it_did_not_await_is_retried_never_acked(
    store: alk.Store, qname: str, recwarn: pytest.WarningsRecorder
) -> None:
    """``return send(x)`` without ``await`` in an ``async def``: the worker awaited the call,
    got the inner coroutine back, ignored it and acked the job, whose work never ran (Python
    only warned 'never awaited' when it was collected). A coroutine it returns is closed and
    the job retried, as for a sync task returning one; a Task or Future it returns runs on
    the loop by itself and is no reason to retry."""
    tasks = alk.Tasks()
    body_ran: list[int] = []

    async def body() -> None:
        body_ran.append(1)

    @tasks.task(queue=qname, name="forgot-await")
    async def forgot_await() -> Any:
        return body()

    @tasks.task(queue=qname, name="spawns")
    async def spawns() -> Any:
        done = asyncio.get_running_loop().create_future()  # a Future, as a spawned Task is
        done.set_result(None)
        return done

    task_job = forgot_await.enqueue(store)
    spawned_job = spawns.enqueue(store)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)

    async def handler(job: alk.Job) -> Any:
        return body()

    q = store.queue(qname)
    handler_job = q.enqueue({"n": 1})
    alk.Worker(store, q, handler, poll_interval=0.2).run(burst=True)
    assert body_ran == []
    assert _job(store, qname, spawned_job) is None
    for job_id, what in ((task_job, "task 'forgot-await'"), (handler_job, "handler")):
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, job
        error = job.errors[-1]["error"]
        assert f"{what} returned a coroutine" in error and "await" in error, error
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def _gen() -> Any:
    yield 1


async def _agen() -> Any:
    yield 1


class _Yielding:
    def __call__(self, *args: Any) -> Any:
        yield 1


@pytest.mark.parametrize(
    "func", [_gen, _agen, functools.partial(_Yielding(), 1)],
    ids=["generator", "async-generator", "partial-of-a-generator-object"],
)
def test_a_generator_function_is_refused_as_a_task_or_handler(store: alk.Store, qname: str, func: Any) -> None:
    """Calling a generator function runs none of its body, and nothing would iterate what it
    returns: the worker acked such jobs without running them (an ``async def`` with a
    ``yield`` is no coroutine function, so it was even called on a thread)."""
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidOptions, match="generator"):
        tasks.task(queue=qname, name="gen")(func)
    assert "gen" not in tasks
    with pytest.raises(alk.InvalidOptions, match="generator"):
        alk.Worker(store, qname, func)


def test_a_staticmethod_decorated_as_a_task_in_a_class_body_is_the_function_it_holds(
    store: alk.Store, qname: str
) -> None:
    """``@tasks.task`` above ``@staticmethod`` decorates the staticmethod object (callable
    since Python 3.10), not its function: an ``async def`` one was taken for sync, so every
    job was retried with 'returned an awaitable' until dead, and a generator one was not
    refused."""
    tasks = alk.Tasks()
    ran: list[tuple[str, int]] = []

    class Jobs:
        @tasks.task(queue=qname, name="async-static")
        @staticmethod
        async def async_static(n: int) -> None:
            await asyncio.sleep(0)
            ran.append(("async", n))

        @tasks.task(queue=qname, name="sync-static")
        @staticmethod
        def sync_static(n: int) -> None:
            ran.append(("sync", n))

    assert Jobs.async_static.is_async and not Jobs.sync_static.is_async
    with pytest.raises(alk.InvalidOptions, match="generator"):
        tasks.task(queue=qname, name="gen-static")(staticmethod(_gen))
    with pytest.raises(alk.InvalidOptions, match="cannot take these arguments"):
        Jobs.async_static.enqueue(store, 1, 2)
    Jobs.async_static.enqueue(store, 1)
    Jobs.sync_static.enqueue(store, 2)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    assert sorted(ran) == [("async", 1), ("sync", 2)]
    assert store.queue(qname).stats().pending == 0


def test_an_async_task_registered_in_a_second_registry_runs_as_async(store: alk.Store, qname: str) -> None:
    """A Task decorated again by another registry (``@app.task`` over ``@shared.task``) is an
    ``async def`` task when the one it wraps is: before Python 3.12 (no
    ``inspect.markcoroutinefunction``) it was taken for sync, and every job was retried
    with 'returned an awaitable' until dead."""
    shared, app = alk.Tasks(), alk.Tasks()
    ran: list[int] = []

    @app.task(queue=qname, name="outer")
    @shared.task(queue=f"{qname}-shared", name="inner")
    async def both(n: int) -> None:
        await asyncio.sleep(0)
        ran.append(n)

    assert both.is_async
    both.enqueue(store, 1)
    alk.Worker(store, app, poll_interval=0.2).run(burst=True)
    assert ran == [1]
    assert store.queue(qname).stats().pending == 0


class _AsyncCallClass:
    async def __call__(self, *args: Any) -> None: ...


class _GeneratorCallClass:
    def __call__(self, *args: Any) -> Any:
        yield 1


class _SyncCallClass:
    def __call__(self, *args: Any) -> None: ...


class _InheritedCallClass(_SyncCallClass):
    def __init__(self, *args: Any) -> None: ...


@pytest.mark.parametrize(
    "cls", [_AsyncCallClass, _GeneratorCallClass, _SyncCallClass, _InheritedCallClass],
    ids=["async-call", "generator-call", "sync-call", "inherited-call"],
)
def test_a_class_whose_instances_are_callable_is_refused_asking_for_an_instance(
    store: alk.Store, qname: str, cls: type
) -> None:
    """Given the class where an instance was meant, calling it only makes an instance: its
    ``async def __call__`` was taken for the class's, the worker awaited the instance and
    every job was retried ('object ... can't be used in 'await' expression') until dead; a
    generator ``__call__`` was refused as 'a generator function'; a plain ``def __call__``
    was accepted, and every job was acked with its ``__call__`` never run (the instance the
    call made was the ignored return value). All are refused at registration, asking for an
    instance; an instance works (test above)."""
    tasks = alk.Tasks()
    with pytest.raises(alk.InvalidOptions, match=rf"is a class.*pass an instance \({cls.__name__}\(\)"):
        tasks.task(queue=qname, name="cls")(cls)
    assert "cls" not in tasks
    with pytest.raises(alk.InvalidOptions, match=r"is a class.*pass an instance"):
        alk.Worker(store, qname, cls)
    outbox = store.outbox(qname)
    message = outbox.enqueue({"m": 1})
    with pytest.raises(alk.InvalidOptions, match=r"deliver is a class.*pass an instance"):
        outbox.relay(cls, alk.StopToken())
    assert outbox.get_job(message) is not None  # nothing claimed


class _AsyncCallable:
    """An object whose ``__call__`` is ``async def``: an async task or handler."""

    def __init__(self, ran: list[tuple[str, Any]]) -> None:
        self.ran = ran

    async def __call__(self, *args: Any, tag: str = "") -> None:
        await asyncio.sleep(0)
        self.ran.append((tag, args[-1].id if args and isinstance(args[-1], alk.Job) else args))


@pytest.mark.parametrize("wrap", [lambda f: f, lambda f: functools.partial(f, tag="p")], ids=["object", "partial"])
def test_an_object_with_an_async_call_is_awaited_as_a_task_a_handler_and_a_delivery(
    store: alk.Store, qname: str, wrap: Callable[[Any], Any]
) -> None:
    """An object whose ``__call__`` is ``async def`` is an async task or handler, and so is a
    ``functools.partial`` of one: the partial was taken for sync, its coroutine discarded
    unawaited, and every job retried ('returned an awaitable') until dead."""
    ran: list[tuple[str, Any]] = []
    tag = "" if wrap(len) is len else "p"
    tasks = alk.Tasks()
    task = tasks.task(queue=qname, name="callable")(wrap(_AsyncCallable(ran)))
    assert task.is_async
    task.enqueue(store, 7)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    q = store.queue(f"{qname}-h")
    handler_job = q.enqueue({"n": 1})
    alk.Worker(store, q, wrap(_AsyncCallable(ran)), poll_interval=0.2).run(burst=True)
    outbox = store.outbox(f"{qname}-o")
    outbox.enqueue({"m": 1})
    stop = alk.StopToken()
    delivered: list[Any] = []

    class Deliver:
        async def __call__(self, payload: Any, tag: str = "") -> None:
            await asyncio.sleep(0)
            delivered.append((tag, payload))
            stop.stop()

    relay = threading.Thread(target=outbox.relay, args=(wrap(Deliver()), stop), kwargs={"poll_interval": 0.2}, daemon=True)
    relay.start()
    try:
        wait_for(lambda: delivered, "the delivery")
    finally:
        stop.stop()
        relay.join(WAIT)
    assert not relay.is_alive()
    assert sorted(ran, key=repr) == sorted([(tag, (7,)), (tag, handler_job)], key=repr)
    assert delivered == [(tag, {"m": 1})]
    assert store.queue(qname).stats().pending == 0 and q.stats().pending == 0


def test_a_partial_of_an_async_task_registered_again_runs_as_async(store: alk.Store, qname: str) -> None:
    """``functools.partial`` of an ``async def`` Task (arguments bound, registered in another
    registry) is async too: before Python 3.12 nothing marks the Task itself as a coroutine
    function, so the partial was taken for sync and every job retried ('returned an
    awaitable') until dead."""
    shared, app = alk.Tasks(), alk.Tasks()
    ran: list[tuple[str, int]] = []

    @shared.task(queue=f"{qname}-shared", name="inner")
    async def inner(region: str, n: int) -> None:
        await asyncio.sleep(0)
        ran.append((region, n))

    bound = app.task(queue=qname, name="eu")(functools.partial(inner, "eu"))
    assert bound.is_async
    bound.enqueue(store, 1)
    alk.Worker(store, app, poll_interval=0.2).run(burst=True)
    assert ran == [("eu", 1)]
    assert store.queue(qname).stats().pending == 0


@pytest.mark.parametrize("make", [_gen, _agen], ids=["generator", "async-generator"])
def test_a_task_or_handler_returning_a_generator_is_retried_never_acked(
    store: alk.Store, qname: str, make: Callable[[], Any]
) -> None:
    """What a decorator around a generator function hands back (a plain function returning
    the generator) cannot be told apart at registration: the worker sees the generator it
    returned, whose body never ran, and retries the job saying so instead of acking it."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="yields")
    def yields() -> Any:
        return make()

    q = store.queue(qname)
    task_job = yields.enqueue(store)
    alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    handler_job = q.enqueue({"n": 1})
    alk.Worker(store, q, lambda job: make(), poll_interval=0.2).run(burst=True)
    for job_id, what in ((task_job, "task 'yields'"), (handler_job, "handler")):
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, job
        error = job.errors[-1]["error"]
        assert f"{what} returned a" in error and "generator" in error and "never ran" in error, error


@pytest.mark.parametrize("form", ["tasks", "handler"])
def test_a_job_whose_stored_payload_is_not_json_goes_dead_and_the_worker_runs_on(
    db: Target, store: alk.Store, qname: str, form: str
) -> None:
    """A payload is a text column: a row written or edited by hand (another app, a fix in
    psql) may not decode. Decoding it on the claim loop's thread raised out of run(): the
    worker died, and the good job claimed with it lapsed too — in every worker that claimed
    them, again after each visibility timeout. The job now goes dead saying why (no retry
    can decode it; fix the row and requeue it), and its batch runs."""
    tasks = alk.Tasks()
    ran: list[Any] = []

    @tasks.task(queue=qname, name="takes")
    def takes(n: int) -> None:
        ran.append(n)

    bad, good = takes.enqueue(store, 1), takes.enqueue(store, 2)
    db.execute(
        f"UPDATE {db.table('alkstore_jobs')} SET payload = :p WHERE id = :i",
        p='{"task": "takes", "args": [1], "kwargs": {}', i=bad,  # cut short
    )
    if form == "tasks":
        worker = alk.Worker(store, tasks, concurrency=2, poll_interval=0.2)
    else:
        worker = alk.Worker(store, qname, lambda job: ran.append(job.payload["args"][0]), concurrency=2, poll_interval=0.2)
    worker.run(burst=True)
    assert ran == [2]
    assert _job(store, qname, good) is None
    assert db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE id = :i", i=bad) == 0
    errors = db.scalar(f"SELECT errors FROM {db.table('alkstore_dead_jobs')} WHERE id = :i", i=bad)
    assert isinstance(errors, str) and "payload could not be decoded" in errors, errors


def test_a_job_whose_error_history_was_spoiled_by_hand_runs_and_the_worker_runs_on(
    db: Target, store: alk.Store, qname: str
) -> None:
    """The §11 handler gets the whole Job, built on the claim loop's thread: an error
    history edited by hand to something that is not a list of entries raised there, out of
    run() — the worker died and the job claimed beside it lapsed, at every reclaim. The job
    now runs like any other (its history reads as one "unreadable" entry)."""
    q = store.queue(qname)
    odd, plain = q.enqueue({"n": 1}), q.enqueue({"n": 2})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET errors = 'not json' WHERE id = :i", i=odd)
    seen: dict[int, list[dict[str, Any]]] = {}
    worker = alk.Worker(store, qname, lambda job: seen.setdefault(job.id, job.errors), concurrency=2, poll_interval=0.2)
    worker.run(burst=True)
    assert set(seen) == {odd, plain} and seen[plain] == []
    assert [e["attempt"] for e in seen[odd]] == [None]
    assert q.stats() == alk.QueueStats(0, 0, 0, 0, None)


NOT_LISTS = ["not json", '{"attempt": 1}', '"a string"', "[1, 2", ""]


@pytest.mark.parametrize("history", NOT_LISTS)
def test_a_job_whose_error_history_is_not_a_list_has_its_retry_and_its_death_recorded(
    db: Target, store: alk.Store, qname: str, clock: FakeClock, history: str
) -> None:
    """Retry and fail append to the stored error history in SQL. One edited by hand into
    something that is not a JSON list made that statement fail (SQLite's ``json_insert``
    on malformed text, PostgreSQL's ``jsonb`` cast; an object took no entry on SQLite): the
    outcome was not recorded, the claim lapsed, and the job died only by reclaim
    exhaustion, visibility timeouts later. The outcome is recorded; the history that was
    stored is kept, as the first entry, saying it was unreadable."""
    q = store.queue(qname, backoff_base=10, max_attempts=2)
    retried, failed = q.enqueue({"do": "raise"}), q.enqueue({"do": "fail"})
    for job_id in (retried, failed):
        db.execute(f"UPDATE {db.table('alkstore_jobs')} SET errors = :e WHERE id = :i", e=history, i=job_id)

    def handler(job: alk.Job) -> None:
        if job.payload["do"] == "fail":
            raise alk.Fail("no such user")
        raise RuntimeError(f"boom {job.attempts}")

    first = clock.now
    alk.Worker(store, qname, handler, concurrency=2, poll_interval=0.2).run(burst=True)
    kept = {"attempt": None, "error": f"the stored error history is unreadable: {history}", "at": None}
    job = q.get_job(retried)
    assert job is not None and job.state == "pending" and job.attempts == 1, job
    assert job.run_at.timestamp() - first in {5.0, 6.0, 7.0, 8.0, 9.0, 10.0}, job.run_at
    assert job.errors == [kept, {"attempt": 1, "error": "boom 1", "at": _at(first)}]
    dead = q.get_job(failed)
    assert dead is not None and dead.state == "dead" and dead.last_error == "no such user", dead
    assert dead.errors == [kept, {"attempt": 1, "error": "no such user", "at": _at(first)}]

    clock.advance(10)  # the retry is due: its last attempt buries it
    alk.Worker(store, qname, handler, concurrency=2, poll_interval=0.2).run(burst=True)
    job = q.get_job(retried)
    assert job is not None and job.state == "dead" and job.last_error == "max attempts exceeded", job
    assert job.errors == [
        kept,
        {"attempt": 1, "error": "boom 1", "at": _at(first)},
        {"attempt": 2, "error": "boom 2", "at": _at(first + 10)},
    ]
    assert q.stats() == alk.QueueStats(0, 0, 0, 2, None)


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _depth(value: Any) -> int:
    """How deep ``_nested`` nested a value (counted without recursion: comparing such lists
    would recurse as deep as decoding them)."""
    depth = 0
    while isinstance(value, list):
        assert len(value) == 1, value
        value, depth = value[0], depth + 1
    assert value == 0
    return depth


@pytest.mark.parametrize("form", ["tasks", "handler"])
def test_a_payload_nested_as_deep_as_enqueue_accepts_runs_and_the_worker_runs_on(
    store: alk.Store, qname: str, form: str
) -> None:
    """Enqueue accepts what ``json.dumps`` can nest at the caller's stack depth; the worker
    decoded it deeper in its own stack, and the RecursionError ended ``run()`` with the
    job's whole claim batch left to lapse (in every worker that claimed it again)."""
    tasks = alk.Tasks()
    ran: list[Any] = []

    @tasks.task(queue=qname, name="deep")
    def deep(value: Any) -> None:
        ran.append(value)

    depth = sys.getrecursionlimit()
    while True:  # the deepest payload enqueue accepts here
        payload = _nested(depth)
        try:
            deep_id = deep.enqueue(store, payload)
            break
        except alk.PayloadError:
            depth -= 1
    plain_id = deep.enqueue(store, 1)
    read = store.queue(qname).get_job(deep_id)
    assert read is not None and _depth(read.payload["args"][0]) == depth
    if form == "tasks":
        worker = alk.Worker(store, tasks, concurrency=2, poll_interval=0.2)
    else:
        worker = alk.Worker(store, qname, lambda job: ran.append(job.payload["args"][0]), concurrency=2,
                            poll_interval=0.2)
    worker.run(burst=True)
    assert sorted(_depth(v) if v != 1 else -1 for v in ran) == [-1, depth]
    assert _job(store, qname, deep_id) is None and _job(store, qname, plain_id) is None


# -- async tasks and handlers on the worker's event loop --------------------------------------


def test_every_async_task_in_flight_gets_a_thread_for_its_to_thread_call(store: alk.Store, qname: str) -> None:
    """``concurrency`` async tasks that each hand a blocking call to ``asyncio.to_thread``
    (as the docs tell them to) all run those calls at once: the loop's default executor has
    a thread for every job in flight, not asyncio's default of ``min(32, CPUs + 4)``, which
    held the jobs past it back until others finished."""
    concurrency = min(32, (os.cpu_count() or 1) + 4) + 2  # past asyncio's default pool size
    tasks = alk.Tasks()
    all_in = threading.Barrier(concurrency, timeout=2 * WAIT)  # broken if they never meet

    @tasks.task(queue=qname, name="blocking")
    async def blocking(n: int) -> None:
        await asyncio.to_thread(all_in.wait)

    ids = [blocking.enqueue(store, n) for n in range(concurrency)]
    with running(alk.Worker(store, tasks, concurrency=concurrency, poll_interval=0.2)) as r:
        wait_for(lambda: all(_job(store, qname, i) is None for i in ids), "the acks", timeout=3 * WAIT)
        r.stop_and_join()
    assert not all_in.broken, "the to_thread calls of the jobs in flight could not all run at once"


def test_async_tasks_run_concurrently_on_one_loop_the_worker_owns(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    started: list[tuple[int, int, int]] = []  # (job id, id(loop), thread id)
    all_in = asyncio.Event()  # set on the worker's loop once all four are waiting on it
    loops: list[asyncio.AbstractEventLoop] = []

    @tasks.task(queue=qname, name="waiter")
    async def waiter(n: int) -> None:
        loop = asyncio.get_running_loop()
        job = alk.current_job()
        assert job is not None
        started.append((job.id, id(loop), threading.get_ident()))
        loops.append(loop)
        await asyncio.wait_for(all_in.wait(), 2 * WAIT)

    ids = [waiter.enqueue(store, n) for n in range(4)]
    with running(alk.Worker(store, tasks, concurrency=4, poll_interval=0.2)) as r:
        wait_for(lambda: len(started) == 4, "all four async tasks to be waiting at once")
        loops[0].call_soon_threadsafe(all_in.set)
        wait_for(lambda: all(_job(store, qname, i) is None for i in ids), "the acks")
        r.stop_and_join()
    assert sorted(s[0] for s in started) == sorted(ids)
    assert len({s[1] for s in started}) == 1, "more than one event loop"
    assert len({s[2] for s in started}) == 1 and started[0][2] != threading.get_ident()
    assert loops[0].is_closed(), "the worker's loop was not closed when run() returned"


def test_an_async_def_handler_runs_on_the_loop(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    ids = q.enqueue_many([{"n": 1}, {"n": 2}])
    seen: list[tuple[int, int | None]] = []

    async def handler(job: alk.Job) -> None:
        await asyncio.sleep(0.01)
        current = alk.current_job()
        seen.append((job.id, current and current.id))

    with running(alk.Worker(store, q, handler, concurrency=2, poll_interval=0.2)) as r:
        wait_for(lambda: all(q.get_job(i) is None for i in ids), "both jobs acked")
        r.stop_and_join()
    assert sorted(seen) == [(i, i) for i in sorted(ids)]


def test_concurrency_bounds_sync_and_async_jobs_together(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    gate = Gate()
    lock = threading.Lock()
    now = {"in": 0, "max": 0, "done": 0}

    def enter() -> None:
        with lock:
            now["in"] += 1
            now["max"] = max(now["max"], now["in"])

    def leave() -> None:
        with lock:
            now["in"] -= 1
            now["done"] += 1

    @tasks.task(queue=f"{qname}-s", name="sync_one")
    def sync_one() -> None:
        enter()
        gate.wait()
        leave()

    @tasks.task(queue=f"{qname}-a", name="async_one")
    async def async_one() -> None:
        enter()
        await gate.await_open()
        leave()

    for _ in range(4):
        sync_one.enqueue(store)
        async_one.enqueue(store)
    with running(alk.Worker(store, tasks, concurrency=3, poll_interval=0.2)) as r:
        wait_for(lambda: now["in"] == 3, "three jobs in flight")
        time.sleep(0.5)  # several claim-loop turns: nothing more may start while three run
        assert now["in"] == 3
        stats = [store.queue(f"{qname}-{k}").stats() for k in "sa"]
        assert sum(s.processing for s in stats) == 3, stats
        gate.open()
        wait_for(lambda: now["done"] == 8, "all eight jobs")
        r.stop_and_join()
    assert now["max"] == 3


def test_fail_retry_and_errors_from_async_tasks(store: alk.Store, qname: str, clock: FakeClock) -> None:
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="outcome", backoff_base=10)
    async def outcome(do: str) -> None:
        await asyncio.sleep(0)
        if do == "fail":
            raise alk.Fail("bad input: no such user")
        if do == "retry":
            raise alk.Retry(delay=42, error="upstream busy")
        if do == "raise":
            raise RuntimeError("disk full")

    ids = {do: outcome.enqueue(store, do) for do in ["ok", "fail", "retry", "raise"]}
    alk.Worker(store, tasks, concurrency=4, poll_interval=0.2).run(burst=True)
    now = clock()
    assert _job(store, qname, ids["ok"]) is None
    failed = _job(store, qname, ids["fail"])
    assert failed is not None and failed.state == "dead" and failed.last_error == "bad input: no such user"
    retried = _job(store, qname, ids["retry"])
    assert retried is not None and retried.state == "pending" and retried.run_at.timestamp() == now + 42
    assert retried.errors[-1]["error"] == "upstream busy"
    raised = _job(store, qname, ids["raise"])
    assert raised is not None and raised.state == "pending" and raised.errors[-1]["error"] == "disk full"
    assert 5 <= raised.run_at.timestamp() - now <= 10  # the backoff curve


@pytest.mark.parametrize("raised", [SystemExit("config missing"), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_task_raising_systemexit_or_keyboardinterrupt_is_retried_with_that_error(
    store: alk.Store, qname: str, clock: FakeClock, raised: BaseException
) -> None:
    """Neither ends the worker (they come from the task, not a signal: SIGINT and SIGTERM
    reach the main thread as a stop), and the job is retried on its curve with the error
    recorded — not left to lapse after its visibility timeout with no error to show."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="quits_sync")
    def quits_sync() -> None:
        raise raised

    @tasks.task(queue=qname, name="quits_async")
    async def quits_async() -> None:
        raise raised

    ids = [quits_sync.enqueue(store), quits_async.enqueue(store)]
    worker = alk.Worker(store, tasks, concurrency=2, poll_interval=0.2)
    worker.run(burst=True)
    expected = f"{type(raised).__name__}: {raised}".rstrip(": ")
    for job_id in ids:
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, job
        assert job.errors[-1]["error"] == expected, job.errors
        assert job.run_at.timestamp() > clock()  # on the backoff curve


def test_an_async_task_raising_generatorexit_is_retried_and_frees_its_slot(
    store: alk.Store, qname: str, recwarn: pytest.WarningsRecorder
) -> None:
    """GeneratorExit raised by an ``async def`` task's own code (not its coroutine being
    closed) was taken for the close of a task dropped at shutdown: nothing was recorded, the
    job's slot was never freed (a worker with one slot ran nothing more) and asyncio logged
    'Task exception was never retrieved'. It is retried with the error, like a sync task's."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="exits")
    async def exits() -> None:
        await asyncio.sleep(0)
        raise GeneratorExit("from the task")

    @tasks.task(queue=qname, name="after")
    async def after() -> None:
        pass

    first, second = exits.enqueue(store), after.using(priority=-1).enqueue(store)
    with running(alk.Worker(store, tasks, concurrency=1, poll_interval=0.2)) as r:
        wait_for(lambda: _job(store, qname, second) is None, "the job after it (one slot)")
        r.stop_and_join()
    job = _job(store, qname, first)
    assert job is not None and job.state == "pending" and job.errors[-1]["error"] == "GeneratorExit: from the task", job


def test_an_async_task_cancelled_from_inside_is_retried_and_logged(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An ``async def`` task whose own code is cancelled (it awaits a task something else
    cancelled) is retried with 'task NAME was cancelled', as any error; unlike every other
    retry it was recorded without a log line, so the log showed nothing of a job that was
    retried, or went dead, that way."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="cancelled_inside")
    async def cancelled_inside() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(3600))
        inner.cancel()
        await inner

    job_id = cancelled_inside.enqueue(store)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        alk.Worker(store, tasks, poll_interval=0.2).run(burst=True)
    job = _job(store, qname, job_id)
    assert job is not None and job.state == "pending" and job.errors[-1]["error"] == "task 'cancelled_inside' was cancelled"
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and getattr(r, "job_id", None) == job_id]
    assert said == [f"job {job_id} of {qname!r}: task 'cancelled_inside' was cancelled; retrying it"], said


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_a_background_asyncio_task_raising_systemexit_leaves_the_event_loop_running(
    store: alk.Store, qname: str, raised: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio re-raises SystemExit and KeyboardInterrupt out of ``run_forever``: a task a
    job spawned and left behind raising one ended the worker's event loop thread, and every
    async job after it sat in its slot unrun (never acked, never retried) until the grace
    period ran out at stop. The loop logs it and keeps serving."""
    tasks = alk.Tasks()
    raising = threading.Event()

    @tasks.task(queue=qname, name="spawns")
    async def spawns() -> None:
        async def background() -> None:
            await asyncio.sleep(0)
            raising.set()
            raise raised

        asyncio.get_running_loop().create_task(background())  # outlives the job

    @tasks.task(queue=qname, name="after")
    async def after(n: int) -> None:
        await asyncio.sleep(0)

    first = spawns.enqueue(store)
    with running(alk.Worker(store, tasks, concurrency=2, poll_interval=0.2, shutdown_grace=1)) as r:
        assert raising.wait(WAIT), "the background task never ran"
        wait_for(lambda: _job(store, qname, first) is None, "the spawning job's ack")
        ids = [after.enqueue(store, n) for n in range(3)]
        wait_for(lambda: all(_job(store, qname, i) is None for i in ids), "the acks of the async jobs after it")
        r.stop_and_join()
    assert any(
        rec.levelno == logging.ERROR and type(raised).__name__ in rec.getMessage() for rec in caplog.records
    ), [rec.getMessage() for rec in caplog.records]


def test_an_async_job_stopping_the_event_loop_leaves_it_running(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``loop.stop()`` from a job (or a library it calls) ended the worker's event loop as
    its own close does: every async job after it sat in its slot unrun. Only close() ends
    the loop now; a stop from anything else is logged and the loop runs on."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="stops_the_loop")
    async def stops_the_loop() -> None:
        asyncio.get_running_loop().stop()

    @tasks.task(queue=qname, name="after")
    async def after(n: int) -> None:
        await asyncio.sleep(0)

    first = stops_the_loop.enqueue(store)
    with running(alk.Worker(store, tasks, concurrency=2, poll_interval=0.2, shutdown_grace=1)) as r:
        wait_for(lambda: _job(store, qname, first) is None, "the stopping job's ack")
        ids = [after.enqueue(store, n) for n in range(3)]
        wait_for(lambda: all(_job(store, qname, i) is None for i in ids), "the acks of the async jobs after it")
        r.stop_and_join()
    assert any(
        rec.levelno == logging.ERROR and "stopped" in rec.getMessage() for rec in caplog.records
    ), [rec.getMessage() for rec in caplog.records]


# -- what Fail and Retry carry -------------------------------------------------------------------


class _Coded(alk.Fail):
    """A Fail subclass that sets its message itself (no ``super().__init__``)."""

    def __init__(self, code: int) -> None:
        self.message = code  # type: ignore[assignment]


class _MessageRaises(alk.Fail):
    """A Fail subclass whose message is a property that raises (computed from a response
    that is not there, say): its text is read from the exception instead."""

    @property  # type: ignore[override]
    def message(self) -> str:
        raise RuntimeError("no message")

    @message.setter
    def message(self, value: object) -> None:
        pass


class _ErrorRaises(alk.Retry):
    """A Retry subclass whose error is a property that raises."""

    @property  # type: ignore[override]
    def error(self) -> str:
        raise RuntimeError("no error")

    @error.setter
    def error(self, value: object) -> None:
        pass


class _DelayRaises(alk.Retry):
    """A Retry subclass whose delay is a property that raises: the backoff curve."""

    @property  # type: ignore[override]
    def delay(self) -> float:
        raise RuntimeError("no delay")

    @delay.setter
    def delay(self, value: object) -> None:
        pass


def _zero_division() -> ZeroDivisionError:
    try:
        1 / 0  # noqa: B018 - the real exception, as `except ... as e: raise alk.Fail(e)` sees it
    except ZeroDivisionError as exc:
        return exc
    raise AssertionError("unreachable")


FAILS: dict[str, tuple[Callable[[], BaseException], str]] = {
    "exception": (lambda: alk.Fail(_zero_division()), "division by zero"),
    "empty-exception": (lambda: alk.Fail(ValueError()), "ValueError"),
    "int": (lambda: alk.Fail(5), "5"),
    "none": (lambda: alk.Fail(None), "failed"),
    "subclass-int": (lambda: _Coded(404), "404"),
    # reading the attribute raised inside the worker: the claim lapsed, nothing recorded
    "subclass-message-raises": (lambda: _MessageRaises("no such user"), "no such user"),
}


def _both_kinds(tasks: alk.Tasks, queue: str, make: Callable[[str], BaseException]) -> tuple[alk.Task, alk.Task]:
    """A sync and an async task that raise ``make(kind)``."""

    @tasks.task(queue=queue, name="raises_sync")
    def raises_sync(kind: str) -> None:
        raise make(kind)

    @tasks.task(queue=queue, name="raises_async")
    async def raises_async(kind: str) -> None:
        await asyncio.sleep(0)
        raise make(kind)

    return raises_sync, raises_async


def _enqueue_each_kind(store: alk.Store, pair: tuple[alk.Task, alk.Task], kinds: Iterable[str]) -> dict[tuple[str, str], int]:
    """A job of both tasks for every kind: the ids by (task name, kind)."""
    return {(task.name, kind): task.enqueue(store, kind) for task in pair for kind in kinds}


def _drain(store: alk.Store, tasks: alk.Tasks) -> None:
    alk.Worker(store, tasks, concurrency=4, poll_interval=0.2).run(burst=True)


def _raise_each_kind(
    store: alk.Store, queue: str, kinds: Iterable[str], make: Callable[[str], BaseException]
) -> dict[tuple[str, str], int]:
    """Both tasks raising ``make(kind)``, a job of each for every kind, run once by a burst
    worker: the job ids by (task name, kind)."""
    tasks = alk.Tasks()
    ids = _enqueue_each_kind(store, _both_kinds(tasks, queue, make), kinds)
    _drain(store, tasks)
    return ids


def test_fail_records_the_text_of_any_message(store: alk.Store, qname: str) -> None:
    """``Fail(msg)`` → ``fail(msg)`` whatever ``msg`` is: an exception object (``raise
    alk.Fail(exc)``), a number, a subclass's own attribute — its text is the last error
    (None: "failed"), or the exception's own when reading the message raises. A non-str
    was refused by ``fail()`` inside the worker, and the job stayed processing until its
    claim lapsed, ending dead with no error recorded."""
    ids = _raise_each_kind(store, qname, FAILS, lambda kind: FAILS[kind][0]())
    for (name, kind), job_id in ids.items():
        expected = FAILS[kind][1]
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "dead" and job.attempts == 1, (name, kind, job)
        assert job.last_error == expected, (name, kind, job.last_error)
        assert [e["error"] for e in job.errors] == ([] if kind == "none" else [expected]), (name, kind, job.errors)


RETRIES: dict[str, tuple[Callable[[], BaseException], str, float | None]] = {
    "error-int": (lambda: alk.Retry(delay=1, error=404), "404", 1.0),
    "error-exception": (lambda: alk.Retry(delay=2, error=KeyError("k")), "'k'", 2.0),
    "error-none": (lambda: alk.Retry(delay=3, error=None), "retry requested", 3.0),
    "timedelta": (lambda: alk.Retry(delay=timedelta(seconds=4), error="later"), "later", 4.0),
    # reading the attribute raised inside the worker: the claim lapsed, nothing recorded
    "subclass-error-raises": (lambda: _ErrorRaises(delay=5, error="upstream busy"), "upstream busy", 5.0),
    "subclass-delay-raises": (lambda: _DelayRaises(delay=6, error="later"), "later", None),
}


def test_retry_records_the_text_of_any_error(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """``Retry(delay, error)`` → ``retry(error, delay)``, ``error`` recorded as text whatever
    it is (``Retry(error=404)`` was refused inside the worker and the job left to lapse);
    an attribute that cannot be read is the exception's text, or the backoff curve."""
    ids = _raise_each_kind(store, qname, RETRIES, lambda kind: RETRIES[kind][0]())
    now = clock()
    for (name, kind), job_id in ids.items():
        _, expected, delay = RETRIES[kind]
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, (name, kind, job)
        assert [e["error"] for e in job.errors] == [expected], (name, kind, job.errors)
        if delay is None:  # the curve (backoff_base 5)
            assert 3 <= job.run_at.timestamp() - now <= 5, (name, kind)
        else:
            assert job.run_at.timestamp() == now + delay, (name, kind)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup and ExceptionGroup: Python 3.11+")
def test_fail_or_retry_raised_inside_a_task_group_is_that_outcome(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """``alk.Fail`` or ``alk.Retry`` raised in a child of an ``asyncio.TaskGroup`` (or
    collected in an ``ExceptionGroup`` by sync code) reaches the worker wrapped in the
    group: it is the outcome it says — dead now, or retried after its delay — not a retry
    on the curve with the group's text ('unhandled errors in a TaskGroup (1 sub-exception)')."""

    async def child(kind: str) -> None:
        await asyncio.sleep(0)
        if kind == "fail":
            raise alk.Fail("no such user")
        raise alk.Retry(delay=42, error="upstream busy")

    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="grouped_async")
    async def grouped_async(kind: str) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(child(kind))
            group.create_task(asyncio.sleep(WAIT))  # cancelled when the other child raises

    @tasks.task(queue=qname, name="grouped_sync")
    def grouped_sync(kind: str) -> None:
        errors: list[Exception] = {  # a Fail beside other errors is still a Fail; the longest Retry wins
            "fail": [RuntimeError("disk full"), alk.Fail("no such user")],
            "retry": [alk.Retry(delay=5, error="busy"), alk.Retry(delay=42, error="upstream busy")],
        }[kind]
        raise ExceptionGroup("collected", [errors[0], ExceptionGroup("inner", errors[1:])])  # noqa: F821 - 3.11+

    ids = _enqueue_each_kind(store, (grouped_async, grouped_sync), ["fail", "retry"])
    _drain(store, tasks)
    now = clock()
    for (name, kind), job_id in ids.items():
        job = _job(store, qname, job_id)
        assert job is not None and job.attempts == 1, (name, kind, job)
        if kind == "fail":
            assert (job.state, job.last_error) == ("dead", "no such user"), (name, job.state, job.errors)
        else:
            assert job.state == "pending" and [e["error"] for e in job.errors] == ["upstream busy"], (name, job.errors)
            assert job.run_at.timestamp() == now + 42, name


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.TaskGroup and ExceptionGroup: Python 3.11+")
def test_an_exception_group_is_recorded_with_what_it_holds(store: alk.Store, qname: str) -> None:
    """A task whose ``asyncio.TaskGroup`` failed raises an ``ExceptionGroup`` whose own text
    ('unhandled errors in a TaskGroup (1 sub-exception)') says nothing of what failed: the
    error recorded in ``job.errors`` (and shown by ``alkstore dead show``) names each
    exception it holds, however nested, with its type."""
    tasks = alk.Tasks()

    async def child() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad row 7")

    @tasks.task(queue=qname, name="grouped_async")
    async def grouped_async() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(child())

    @tasks.task(queue=qname, name="grouped_sync")
    def grouped_sync() -> None:
        raise ExceptionGroup("collected", [KeyError("sku"), ExceptionGroup("inner", [TimeoutError()])])  # noqa: F821

    ids = {task.name: task.enqueue(store) for task in (grouped_async, grouped_sync)}
    _drain(store, tasks)
    expected = {
        "grouped_async": "unhandled errors in a TaskGroup (1 sub-exception): ValueError: bad row 7",
        "grouped_sync": "collected (2 sub-exceptions): KeyError: 'sku'; TimeoutError",
    }
    for name, job_id in ids.items():
        job = _job(store, qname, job_id)
        assert job is not None and [e["error"] for e in job.errors] == [expected[name]], (name, job)


@pytest.mark.parametrize(
    "delay",
    [-1, 1e12, "x", True, float("nan"), float("inf"), timedelta(seconds=-1), timedelta(days=40000)],
    ids=["negative", "over-100-years", "str", "bool", "nan", "inf", "negative-timedelta", "long-timedelta"],
)
def test_retry_refuses_a_bad_delay_where_it_is_raised(delay: Any) -> None:
    """Checked as ``h.retry(delay=)`` checks it, at construction: the error points at the
    ``raise``, not at the worker's attempt to record it."""
    with pytest.raises(alk.InvalidOptions, match="delay"):
        alk.Retry(delay=delay)


@pytest.mark.parametrize("delay", [None, 0, 2.5, timedelta(minutes=1)])
def test_retry_takes_none_a_number_or_a_timedelta(delay: Any) -> None:
    assert alk.Retry(delay=delay).delay == delay


def test_a_retry_with_a_bad_delay_is_retried_on_the_curve_naming_the_problem(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    """``raise alk.Retry(delay=-1)`` raises InvalidOptions in the task, retried like any
    exception: on the backoff curve, its error saying what was wrong. It was refused inside
    the worker, and the job stayed processing until its claim lapsed, every attempt."""
    delays: dict[str, Any] = {"negative": -1, "huge": 1e12, "str": "x"}
    ids = _raise_each_kind(store, qname, delays, lambda kind: alk.Retry(delay=delays[kind]))
    now = clock()  # the default backoff_base (5): the curve is [3, 5] s after attempt 1
    for (name, kind), job_id in ids.items():
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, (name, kind, job)
        [entry] = job.errors
        assert "Retry delay" in entry["error"], (name, kind, entry)
        assert 3 <= job.run_at.timestamp() - now <= 5, (name, kind)  # the curve


class _Unchecked(alk.Retry):
    """A Retry subclass that sets its own attributes, bypassing the constructor's checks."""

    def __init__(self, delay: Any) -> None:
        Exception.__init__(self, "unchecked")
        self.delay = delay
        self.error = "upstream busy"


def test_a_refused_outcome_is_recorded_as_a_retry_on_the_curve_never_left_to_lapse(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth: an outcome whose arguments the handle refuses anyway (a subclass
    that skipped the checks) is recorded as a plain retry on the backoff curve whose error
    says what was wrong — not logged and dropped, which left the job processing until its
    claim lapsed and then dead with no error."""
    tasks = alk.Tasks()
    pair = _both_kinds(tasks, qname, lambda kind: _Unchecked(-1 if kind == "negative" else "soon"))
    ids = _enqueue_each_kind(store, pair, ["negative", "str"])
    last = pair[0].using(max_attempts=1).enqueue(store, "negative")
    with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
        _drain(store, tasks)
    now = clock()
    for (name, kind), job_id in ids.items():
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, (name, kind, job)
        [entry] = job.errors
        assert "upstream busy" in entry["error"] and "delay must be" in entry["error"], (name, kind, entry)
        assert 3 <= job.run_at.timestamp() - now <= 5, (name, kind)  # the curve
    dead = _job(store, qname, last)
    assert dead is not None and dead.state == "dead" and dead.last_error == "max attempts exceeded", dead
    assert "delay must be" in dead.errors[-1]["error"]
    refused = [r for r in caplog.records if r.name == "alkstore_sa" and "refused" in r.getMessage()]
    assert len(refused) == len(ids) + 1, [r.getMessage() for r in caplog.records]


# -- exceptions whose text is hard to get ----------------------------------------------------------


class _ApiError(Exception):
    """``str()`` raises: the attribute it reads is None."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def __str__(self) -> str:
        return f"HTTP {self.response.status}"


class _OddError(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


class _Hopeless(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _BrokenExit(SystemExit):
    def __str__(self) -> str:
        raise RuntimeError("no str")


UNPRINTABLE: dict[str, tuple[Callable[[], BaseException], str]] = {
    "str-raises": (lambda: _ApiError(None), "_ApiError(None)"),
    "str-not-a-str": (lambda: _OddError(), "_OddError()"),
    "nothing-works": (lambda: _Hopeless(), "_Hopeless"),
    "systemexit": (lambda: _BrokenExit(), "_BrokenExit: _BrokenExit()"),
}


def test_an_exception_whose_str_fails_is_retried_with_its_repr(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception whose ``str()`` raises or returns no str is retried on the curve like
    any other, recorded as its ``repr()`` (its type name when that fails too), and logged
    without a logging error. Before, formatting it raised inside the worker: the job stayed
    processing with no error until its claim lapsed, and ended dead with ``errors=[]``."""
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        ids = _raise_each_kind(store, qname, UNPRINTABLE, lambda kind: UNPRINTABLE[kind][0]())
    now = clock()
    for (name, kind), job_id in ids.items():
        job = _job(store, qname, job_id)
        assert job is not None and job.state == "pending" and job.attempts == 1, (name, kind, job)
        assert [e["error"] for e in job.errors] == [UNPRINTABLE[kind][1]], (name, kind, job.errors)
        assert 3 <= job.run_at.timestamp() - now <= 5, (name, kind)  # the curve (backoff_base 5)
    raised = [r for r in caplog.records if r.name == "alkstore_sa" and r.exc_info is not None]
    assert len(raised) == len(ids), [r.getMessage() for r in caplog.records]
    for record in raised:
        logging.Formatter().format(record)  # the message and the traceback both format
    assert {r.getMessage().rsplit(": ", 1)[-1] for r in raised} >= {"_ApiError(None)", "_OddError()", "_Hopeless"}


HUGE = "x" * 1_000_000
CAPPED = "x" * 10_000 + "… [990000 more characters]"
LONG_STR = "y" * 20_000

BIG: dict[str, tuple[Callable[[], BaseException], str, str]] = {
    "raised": (lambda: RuntimeError(HUGE), "pending", CAPPED),
    "fail-exception": (lambda: alk.Fail(RuntimeError(HUGE)), "dead", CAPPED),
    "retry-error-object": (lambda: alk.Retry(delay=1, error=RuntimeError(HUGE)), "pending", CAPPED),
    "fail-str": (lambda: alk.Fail(LONG_STR), "dead", LONG_STR),
    "retry-str": (lambda: alk.Retry(delay=1, error=LONG_STR), "pending", LONG_STR),
}


def test_the_text_of_a_huge_exception_is_capped(store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture) -> None:
    """The text the worker takes from an object (a raised exception, a non-str ``Fail`` or
    ``Retry`` error) is cut at 10,000 characters, saying how many more there were — in
    ``job.errors`` (on every attempt) and in the WARNING's message. A str given to ``Fail``
    or ``Retry`` is recorded as given, as ``fail(msg)`` records it."""
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        ids = _raise_each_kind(store, qname, BIG, lambda kind: BIG[kind][0]())
    for (name, kind), job_id in ids.items():
        _, state, expected = BIG[kind]
        job = _job(store, qname, job_id)
        assert job is not None and job.state == state and job.attempts == 1, (name, kind, job)
        [entry] = job.errors
        assert entry["error"] == expected, (name, kind, len(entry["error"]))
    messages = [r.getMessage() for r in caplog.records if r.name == "alkstore_sa"]
    assert messages and max(len(m) for m in messages) < 2 * len(LONG_STR), [len(m) for m in messages]


def test_current_job_is_each_tasks_own_in_threads_and_asyncio_tasks(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    seen: dict[str, list[tuple[int, int | None]]] = {"sync": [], "async": [], "child": []}

    def current_id() -> int | None:
        job = alk.current_job()
        return None if job is None else job.id

    @tasks.task(queue=qname, name="sync_t")
    def sync_t(n: int) -> None:
        time.sleep(0.01)
        seen["sync"].append((n, current_id()))

    @tasks.task(queue=qname, name="async_t")
    async def async_t(n: int) -> None:
        await asyncio.sleep(0.01 * (n % 3))  # interleave the asyncio tasks
        seen["async"].append((n, current_id()))

        async def child() -> None:
            seen["child"].append((n, current_id()))

        await asyncio.create_task(child())  # a task a job spawns sees that job

    ids = {("sync", n): sync_t.enqueue(store, n) for n in range(4)}
    ids.update({("async", n): async_t.enqueue(store, n) for n in range(6)})
    alk.Worker(store, tasks, concurrency=6, poll_interval=0.2).run(burst=True)
    assert sorted(seen["sync"]) == [(n, ids["sync", n]) for n in range(4)]
    assert sorted(seen["async"]) == [(n, ids["async", n]) for n in range(6)]
    assert sorted(seen["child"]) == sorted(seen["async"])
    assert alk.current_job() is None


def test_current_job_is_none_once_the_job_ended_in_what_it_left_running(store: alk.Store, qname: str) -> None:
    """An asyncio task a job spawned and left running (fire and forget), or a context copied
    in it and run later, saw that job as ``alk.current_job()`` after it was acked: a job no
    longer executing, which a log filter or a follow-up enqueue would then take for its own."""
    tasks = alk.Tasks()
    job_over = threading.Event()
    seen: dict[str, int | None] = {}
    copied: list[contextvars.Context] = []
    left: list[asyncio.Task[None]] = []

    def current_id() -> int | None:
        job = alk.current_job()
        return None if job is None else job.id

    async def background() -> None:
        seen["spawned, during"] = current_id()
        while not job_over.is_set():
            await asyncio.sleep(0.005)
        seen["spawned, after"] = current_id()

    @tasks.task(queue=qname, name="spawns")
    async def spawns() -> None:
        left.append(asyncio.get_running_loop().create_task(background()))
        await asyncio.sleep(0)
        copied.append(contextvars.copy_context())

    job_id = spawns.enqueue(store)
    with running(alk.Worker(store, tasks, poll_interval=0.2)) as r:
        wait_for(lambda: _job(store, qname, job_id) is None, "the ack")
        job_over.set()
        wait_for(lambda: "spawned, after" in seen, "the spawned task to look again")
        r.stop_and_join()
    assert seen == {"spawned, during": job_id, "spawned, after": None}
    assert copied[0].run(current_id) is None


# -- heartbeats, lost claims and stopping, for async jobs ----------------------------------------


def test_a_long_async_task_is_heartbeated(dbstore: alk.Store, qname: str) -> None:
    """An async task running 2.6 visibility timeouts keeps its claim: no rival takes it.
    (A beat comes every third of the timeout: with 2 s the claim survives a beat held up
    1.33 s on a loaded machine; with 1 s, one held up 0.8 s let the rival in.)"""
    tasks = alk.Tasks()
    attempts: list[int] = []
    finished = threading.Event()
    visibility = 2.0

    @tasks.task(queue=qname, name="slow", visibility_timeout=visibility)
    async def slow() -> None:
        job = alk.current_job()
        assert job is not None
        attempts.append(job.attempts)
        await asyncio.sleep(2.6 * visibility)
        finished.set()

    job_id = slow.enqueue(dbstore)
    q = dbstore.queue(qname)
    stolen: list[int] = []
    with running(alk.Worker(dbstore, tasks, concurrency=1, poll_interval=0.2)) as r:
        wait_for(lambda: attempts, "the task to start")
        while not finished.is_set():  # a rival keeps trying to take the job
            h = q.claim_one("rival")
            if h is not None:
                stolen.append(h.job.attempts)
            time.sleep(0.05)
        assert stolen == [], f"the async task's claim lapsed: a rival took it as attempts {stolen}"
        wait_for(lambda: q.get_job(job_id) is None, "the ack")
        r.stop_and_join()
    assert attempts == [1]


def test_an_async_task_blocking_the_event_loop_keeps_its_claim(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """docs/worker.md: heartbeats run on their own thread, so an ``async def`` task that
    blocks the worker's loop with sync code (here a sync wait) still has its claim extended
    meanwhile, and is acked once it returns."""
    tasks = alk.Tasks()
    blocking, release = threading.Event(), threading.Event()

    @tasks.task(queue=qname, name="blocks", visibility_timeout=1.0)
    async def blocks() -> None:
        blocking.set()
        release.wait(WAIT)  # sync: nothing else runs on the loop meanwhile

    job_id = blocks.enqueue(store)
    q = store.queue(qname)
    with running(alk.Worker(store, tasks, concurrency=1, poll_interval=0.2)) as r:
        wait_for(blocking.is_set, "the task to block the loop")
        clock.advance(0.5)  # within the claim: a heartbeat now moves its deadline to now + 1 s
        extended = datetime.fromtimestamp(clock() + 1.0, timezone.utc)

        def heartbeated() -> bool:
            job = q.get_job(job_id)
            return job is not None and job.claim_expires_at == extended

        wait_for(heartbeated, "a heartbeat while the loop is blocked")
        release.set()
        wait_for(lambda: q.get_job(job_id) is None, "the ack")
        r.stop_and_join()


def test_an_async_job_blocking_the_loop_through_shutdown_is_cancelled_once_it_yields() -> None:
    """docs/worker.md (graceful stop): async jobs still running at the end are cancelled, so
    their ``finally`` blocks run, and the worker leaves no loop behind. A job whose sync code
    blocks the loop past the unwind time cannot be cancelled then; once the blocking call
    returns and the job next awaits, it is cancelled and the loop closed. (The loop used to
    stop at that point instead, with the job suspended at its ``await`` for good: its
    ``finally`` never ran and the loop was never closed.)"""
    loop_thread = EventLoopThread(name="alkstore-loop-blocked")
    blocking, release, unwound = threading.Event(), threading.Event(), threading.Event()

    async def job() -> None:
        blocking.set()
        release.wait(2 * WAIT)  # sync: the loop is blocked until the test releases it
        try:
            await asyncio.sleep(3600)
        finally:
            unwound.set()

    loop_thread.submit_all([job()], contextvars.copy_context())
    assert blocking.wait(WAIT)
    loop_thread.close(timeout=0.05)  # what the worker's stop does: it cannot wait for the blocked loop
    release.set()
    assert unwound.wait(WAIT), "the job was never cancelled: its finally block did not run"
    assert loop_thread._thread is not None and loop_thread.loop is not None
    loop_thread._thread.join(WAIT)
    assert not loop_thread._thread.is_alive()
    assert loop_thread.loop.is_closed()


def test_a_lost_claim_of_an_async_task_is_not_acked(
    dbstore: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    tasks = alk.Tasks()
    gate = Gate()
    started = threading.Event()

    @tasks.task(queue=qname, name="held", visibility_timeout=1.0)
    async def held() -> None:
        started.set()
        await gate.await_open()

    job_id = held.enqueue(dbstore)
    q = dbstore.queue(qname)

    def logged(word: str) -> list[str]:
        return [m for rec in caplog.records if str(job_id) in (m := rec.getMessage()) and word in m]

    with running(alk.Worker(dbstore, tasks, concurrency=1, poll_interval=0.2)) as r:
        assert started.wait(WAIT)
        assert q.cancel(job_id) is True  # the claim is gone under the running task
        wait_for(lambda: logged("claim lost"), "the heartbeat to notice the lost claim")
        gate.open()
        wait_for(lambda: logged("not ack"), "the worker to give the job up")
        r.stop_and_join()
    assert not [rec for rec in caplog.records if rec.getMessage() == f"job {job_id}: ack"]


def test_stop_finishes_the_async_and_sync_tasks_in_flight(store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    gate = Gate()
    started: list[str] = []

    @tasks.task(queue=qname, name="finishing_async")
    async def finishing_async(n: int) -> None:
        started.append("async")
        await gate.await_open()

    @tasks.task(queue=qname, name="finishing_sync")
    def finishing_sync(n: int) -> None:
        started.append("sync")
        gate.wait()

    first = [finishing_async.enqueue(store, 1), finishing_sync.enqueue(store, 1)]
    with running(alk.Worker(store, tasks, concurrency=2, poll_interval=0.2, shutdown_grace=WAIT)) as r:
        wait_for(lambda: len(started) == 2, "both tasks to start")
        second = finishing_async.enqueue(store, 2)
        r.stop.stop()
        r.thread.join(0.5)
        assert r.thread.is_alive(), "run() returned while its tasks were still running"
        gate.open()
        r.stop_and_join()
    assert sorted(started) == ["async", "sync"]
    for job_id in first:
        assert _job(store, qname, job_id) is None  # finished and acked before run() returned
    job = _job(store, qname, second)
    assert job is not None and job.state == "pending" and job.attempts == 0  # never claimed


def test_an_async_task_past_the_grace_period_is_cancelled_and_left_to_lapse(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    tasks = alk.Tasks()
    started = threading.Event()
    unwound: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []

    @tasks.task(queue=qname, name="stuck", visibility_timeout=120)
    async def stuck() -> None:
        loops.append(asyncio.get_running_loop())
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            unwound.append("finally")

    job_id = stuck.enqueue(store)
    w = alk.Worker(store, tasks, concurrency=1, poll_interval=0.2, shutdown_grace=0.3)
    with running(w) as r:
        assert started.wait(WAIT)
        r.stop_and_join(timeout=10)  # returns after the grace period
    assert unwound == ["finally"], "the abandoned coroutine was not cancelled"
    assert loops[0].is_closed()
    assert not [t for t in threading.enumerate() if t.name.startswith("alkstore-loop")]
    assert any("grace period" in rec.getMessage() for rec in caplog.records)
    q = store.queue(qname)
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.worker_id == w.worker_id  # nothing written
    assert q.claim_one("next") is None  # not released early: the claim must lapse first
    clock.advance(120)
    nxt = q.claim_one("next")
    assert nxt is not None and nxt.id == job_id and nxt.job.attempts == 2
    assert nxt.ack() is True


# -- fairness: a busy queue does not starve a quiet one ---------------------------------------


def _record_claims(worker: alk.Worker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Wrap each of the worker's queue handles, and the claim of queues taking turns, so
    every claim it makes is recorded, in order, as (queue, jobs claimed)."""
    claims: list[tuple[str, int]] = []
    for q in worker.queues:

        def counted(worker_id: str, n: int, q: alk.Queue = q, claim: Any = q.claim_batch) -> list[alk.JobHandle]:
            handles = claim(worker_id, n)
            claims.append((q.name, len(handles)))
            return handles

        q.claim_batch = counted  # type: ignore[method-assign]
    _on_turn_calls(
        monkeypatch,
        lambda queues, taken: claims.extend(
            (q.name, len(hs)) for q, (_n, hs) in zip(queues, taken, strict=False) if hs is not None
        ),
    )
    return claims


def _on_turn_calls(monkeypatch: pytest.MonkeyPatch, seen: Callable[[list[alk.Queue], Any], None]) -> None:
    """Call ``seen(queues, taken)`` after each claim call of queues taking turns — on its
    own (``claim_turns``) or with a batch of acks riding along (``ack_and_claim_turns``)."""
    turns, riding = claimer.claim_turns, claimer.ack_and_claim_turns

    def counted(store: alk.Store, worker_id: str, queues: list[alk.Queue], want: int, budget: int) -> Any:
        taken = turns(store, worker_id, queues, want, budget)
        seen(queues, taken)
        return taken

    def counted_riding(
        store: alk.Store, handles: list[alk.JobHandle], worker_id: str, queues: list[alk.Queue], want: int, budget: int
    ) -> Any:
        landed, taken = riding(store, handles, worker_id, queues, want, budget)
        seen(queues, taken)
        return landed, taken

    monkeypatch.setattr(claimer, "claim_turns", counted)
    monkeypatch.setattr(claimer, "ack_and_claim_turns", counted_riding)


def _claimed_before(claims: list[tuple[str, int]], queue: str, start: int = 0) -> int:
    """Jobs claimed from other queues after ``claims[start]`` and before ``queue``'s first job."""
    total = 0
    for name, n in claims[start:]:
        if name == queue and n:
            return total
        total += n if name != queue else 0
    raise AssertionError(f"{queue!r} never claimed a job: {claims}")


@pytest.fixture
def quiet_wakes(store: alk.Store) -> Iterator[Callable[[str], threading.Event]]:
    """``watch(queue)`` → an Event set when the store's wake hub delivered a wake for that
    queue. The hub calls its watchers in registration order on one thread, so once the test's
    watcher (registered after the worker's) has fired, the worker has seen the wake too."""
    watches: list[tuple[str, int]] = []

    def watch(queue: str) -> threading.Event:
        woken = threading.Event()
        key = store.backend.wake_key(queue)
        hub = store.hub()
        # a busy worker does not wait on the queue, and PostgreSQL enqueues notify only
        # while someone does (docs/performance.md, "Wakes"): the test waits, here
        hub.advertise(key)
        wait_for(lambda: not hasattr(hub, "_held") or (key in hub._held and key not in hub._unsettled),
                 "the test's presence to settle")
        time.sleep(0.05)  # its claim-once-more wake passes before the test's watcher is in
        watches.append((key, hub.watch_queue(key, woken.set)))
        return woken

    yield watch
    for key, token in watches:
        store.hub().unwatch_queue(key, token)


@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("busy_first", [True, False], ids=["busy-listed-first", "quiet-listed-first"])
def test_a_busy_queue_does_not_starve_a_quiet_one(
    store: alk.Store, qname: str, busy_first: bool, concurrency: int,
    quiet_wakes: Callable[[str], threading.Event], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The busy queue holds every slot when a job arrives on the quiet one; from then on,
    the quiet queue's job is claimed in the first round that has a free slot (with one
    slot, every round has just one: only the round-robin order lets the quiet queue in)."""
    tasks = alk.Tasks()
    gate = Gate()
    started: list[str] = []
    busy_q, quiet_q = f"{qname}-busy", f"{qname}-quiet"
    specs = [(busy_q, "busy", lambda n: (started.append("busy"), gate.wait())), (quiet_q, "quiet", lambda: started.append("quiet"))]
    for queue, name, body in specs if busy_first else specs[::-1]:
        tasks.task(queue=queue, name=name)(body)
    store.queue(busy_q).enqueue_many([{"task": "busy", "args": [n], "kwargs": {}} for n in range(500)])
    w = alk.Worker(store, tasks, concurrency=concurrency, poll_interval=3600)
    claims = _record_claims(w, monkeypatch)
    with running(w) as r:
        wait_for(lambda: len(started) == concurrency, "the busy queue to fill every slot")
        woken = quiet_wakes(quiet_q)
        tasks["quiet"].enqueue(store)
        assert woken.wait(WAIT), "no wake for the quiet queue"
        mark = len(claims)  # no slot is free: nothing is claimed until the gate opens
        gate.open()
        wait_for(lambda: "quiet" in started, "the quiet queue's job to start")
        r.stop_and_join()
    before = _claimed_before(claims, quiet_q, mark)
    assert before < concurrency, f"{before} busy jobs were claimed before the quiet queue's job: {claims[mark:][:20]}"


@pytest.mark.parametrize("busy_first", [True, False], ids=["busy-listed-first", "quiet-listed-first"])
def test_free_slots_are_split_between_ready_queues(
    store: alk.Store, qname: str, busy_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog, and one job enqueued after it on another queue: both are ready at start,
    and the first round splits the free slots, so the later job is claimed in it."""
    tasks = alk.Tasks()
    busy_q, quiet_q = f"{qname}-busy", f"{qname}-quiet"
    specs = [(busy_q, "busy"), (quiet_q, "quiet")]
    for queue, name in specs if busy_first else specs[::-1]:
        tasks.task(queue=queue, name=name)(lambda: time.sleep(0.002))
    store.queue(busy_q).enqueue_many([{"task": "busy", "args": [], "kwargs": {}}] * 100)
    tasks["quiet"].enqueue(store)
    w = alk.Worker(store, tasks, concurrency=4, poll_interval=0.2)
    claims = _record_claims(w, monkeypatch)
    w.run(burst=True)
    assert _claimed_before(claims, quiet_q) <= 2, claims[:6]  # half the slots at most
    assert sum(n for _, n in claims) == 101


def test_queues_outnumbering_free_slots_take_turns_with_batched_claims(
    store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many queues with a few jobs each and few slots: each turn claims up to the free slots
    from one queue (one statement), not one job per queue per statement; every job runs."""
    names = [f"{qname}-{i:02d}" for i in range(20)]
    for name in names:
        store.queue(name).enqueue_many([{"n": n} for n in range(4)])
    ran: list[str] = []
    w = alk.Worker(store, names, lambda job: ran.append(job.queue), concurrency=4, poll_interval=0.2)
    claims = _record_claims(w, monkeypatch)
    w.run(burst=True)
    assert sorted(ran) == sorted(names * 4)
    handing_out = [n for _, n in claims if n]
    # one job per statement would be 80 claims; turns of up to 4 need 20 when the four
    # slots always free together, more when a loaded machine frees them a few at a time
    # (42 seen once with the suite running beside it): the bound stays well short of 80
    assert len(handing_out) <= 60, claims


def test_a_queue_short_of_its_turn_leaves_the_rest_to_the_next_in_the_same_call(
    store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queues of one job each, four free slots: one claim call (one SQLite transaction) takes
    a job from each of four queues, rather than one queue per round."""
    names = [f"{qname}-{i:02d}" for i in range(20)]
    for name in names:
        store.queue(name).enqueue("x")
    calls: list[list[int]] = []
    _on_turn_calls(monkeypatch, lambda _queues, taken: calls.append([len(hs) for _n, hs in taken if hs is not None]))
    # the four jobs of a call finish together and are acked together (never by time), so
    # all four slots come free at once: how many queues a call takes does not depend on
    # how the machine schedules the worker's threads
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    together = threading.Barrier(4, timeout=WAIT)
    ran: list[str] = []

    def handle(job: alk.Job) -> None:
        together.wait()
        ran.append(job.queue)

    w = alk.Worker(store, names, handle, concurrency=4, poll_interval=0.2)
    w.run(burst=True)
    assert sorted(ran) == sorted(names)
    assert calls[0] == [1, 1, 1, 1]  # all twenty ready at start: the first four share the slots
    handing_out = [c for c in calls if sum(c)]
    assert len(handing_out) <= 10, calls  # twenty jobs, up to four a call (one queue per round: 20)


def test_a_queue_with_settings_among_queues_taking_turns_is_claimed_within_its_limits(
    store: alk.Store, qname: str
) -> None:
    """A queue found to have settings during a turn is left to its limited claim next round:
    its jobs still run, within its concurrency limit."""
    names = [f"{qname}-{i:02d}" for i in range(10)]
    for name in names:
        store.queue(name).enqueue_many([{"n": n} for n in range(3)])
    limited = store.queue(names[0])
    limited.set_concurrency(1)
    live: list[int] = []
    most = [0]
    lock = threading.Lock()

    def handle(job: alk.Job) -> None:
        if job.queue == limited.name:
            with lock:
                live.append(job.id)
                most[0] = max(most[0], len(live))
            time.sleep(0.01)
            with lock:
                live.remove(job.id)

    ran: list[str] = []
    w = alk.Worker(store, names, lambda job: (handle(job), ran.append(job.queue)), concurrency=4, poll_interval=0.05)
    w.run(burst=True)
    assert sorted(ran) == sorted(names * 3)
    assert most[0] == 1


# -- burst ------------------------------------------------------------------------------------


def test_burst_drains_every_queue_including_follow_up_jobs(store: alk.Store, qname: str) -> None:
    """``run(burst=True)`` returns only once no queue has a ready job — also jobs that tasks
    enqueued on another queue while running."""
    tasks = alk.Tasks()
    done: list[str] = []

    @tasks.task(queue=f"{qname}-b", name="second")
    async def second(n: int) -> None:
        done.append(f"second-{n}")

    @tasks.task(queue=f"{qname}-a", name="first")
    def first(n: int) -> None:
        done.append(f"first-{n}")
        second.enqueue(store, n)

    for n in range(3):
        first.enqueue(store, n)
    alk.Worker(store, tasks, concurrency=1, poll_interval=3600).run(burst=True)
    assert sorted(done) == sorted([f"first-{n}" for n in range(3)] + [f"second-{n}" for n in range(3)])


_BOUND: contextvars.ContextVar[str | None] = contextvars.ContextVar("test_bound", default=None)


def test_context_variables_a_job_sets_do_not_reach_the_jobs_after_it(store: alk.Store, qname: str) -> None:
    """Each job starts from the context ``run()`` was called in, whichever thread claimed it
    and whatever ran before it there: a value one job binds (a log field with
    ``structlog.contextvars.bind_contextvars``, a tenant id) is not seen by the next, sync or
    async. One slot, so every job follows another on the same thread or loop."""
    tasks = alk.Tasks()
    seen: list[tuple[str, int, str | None]] = []

    @tasks.task(queue=qname, name="bind_sync")
    def bind_sync(n: int) -> None:
        seen.append(("sync", n, _BOUND.get()))
        _BOUND.set(f"sync {n}")

    @tasks.task(queue=qname, name="bind_async")
    async def bind_async(n: int) -> None:
        seen.append(("async", n, _BOUND.get()))
        _BOUND.set(f"async {n}")

    for n in range(6):
        (bind_sync if n % 3 else bind_async).enqueue(store, n)
    token = _BOUND.set("run's caller")
    try:
        alk.Worker(store, tasks, concurrency=1, poll_interval=0.2).run(burst=True)
    finally:
        _BOUND.reset(token)
    assert sorted(seen, key=lambda s: s[1]) == [
        ("async" if n % 3 == 0 else "sync", n, "run's caller") for n in range(6)
    ]


def test_an_ack_never_waits_on_the_loop_for_a_write_a_background_task_of_the_loop_holds(
    sqlite_db: Target, qname: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An async task that leaves an asyncio task behind writing through the application's
    own AsyncEngine (an audit row, fire and forget): on SQLite that task holds the file's one
    write lock until the loop lets it reach its commit. The job's ack must not be written
    on the loop then — it would wait for a lock only the loop it blocks can release, for the
    whole busy timeout, fail, and leave the job to run again. Each job runs once, is acked,
    and every audit row lands. (SQLite alone: there the app's writes and the worker's acks
    share one lock.)"""
    from sqlalchemy.ext.asyncio import create_async_engine

    from alkstore_sa import _sqlite

    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_MS", 3000)  # a broken worker fails in seconds, not minutes
    caplog.set_level(logging.WARNING, logger="alkstore_sa")
    engine = sa.create_engine(sqlite_db.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE audit (id INTEGER PRIMARY KEY, job INTEGER)")
    app_engine = create_async_engine(sqlite_db.url.replace("sqlite:///", "sqlite+aiosqlite:///", 1))
    store = alk.Store(engine)
    tasks = alk.Tasks()
    ran: list[int] = []
    left_behind: set[asyncio.Task[None]] = set()

    async def audit(job_id: int) -> None:
        async with app_engine.begin() as conn:  # takes the write lock at the INSERT ...
            await conn.execute(sa.text("INSERT INTO audit (job) VALUES (:j)"), {"j": job_id})
            await asyncio.sleep(0.05)  # ... and releases it at the commit, on the loop

    @tasks.task(queue=qname, name="audited")
    async def audited(n: int) -> None:
        job = alk.current_job()
        assert job is not None
        ran.append(job.id)
        left_behind.add(asyncio.get_running_loop().create_task(audit(job.id)))
        await asyncio.sleep(0.01)  # the audit row is written: the lock is held from here

    try:
        ids = [audited.enqueue(store, n) for n in range(3)]
        with running(alk.Worker(store, tasks, concurrency=1, poll_interval=0.2)) as r:
            wait_for(lambda: store.queue(qname).stats().pending + store.queue(qname).stats().processing == 0,
                     "every job acked")
            wait_for(lambda: _audit_rows(engine) == 3, "every audit row committed")
            r.stop_and_join()
        assert sorted(ran) == ids  # each job ran once
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    finally:
        store.close()
        asyncio.run(app_engine.dispose())
        engine.dispose()


def _audit_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM audit").scalar_one())


def test_what_an_async_job_set_in_its_context_is_not_seen_by_the_records_of_other_jobs(
    store: alk.Store, qname: str
) -> None:
    """The last async job in flight has its event loop write the acks of the others that
    wait for theirs (and claim the next jobs): those jobs' log records are not made in the
    context of the job that finished last, so a field it bound (a tenant id, a
    structlog.contextvars field) never appears on another job's lines."""
    tasks = alk.Tasks()
    records: list[tuple[int, str | None]] = []

    class Seen(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.msg == "job %s: %s":  # each outcome's DEBUG line, with its job id
                records.append((int(record.args[0]), _BOUND.get()))  # type: ignore[index]
            return True

    @tasks.task(queue=qname, name="binds")
    async def binds(seconds: float) -> None:
        job = alk.current_job()
        assert job is not None
        _BOUND.set(f"job {job.id}")
        await asyncio.sleep(seconds)

    ids = [binds.enqueue(store, 0.05 if n % 2 == 0 else 0.001) for n in range(8)]
    logger = logging.getLogger("alkstore_sa")
    seen, level = Seen(), logger.level
    logger.addFilter(seen)
    logger.setLevel(logging.DEBUG)
    try:
        alk.Worker(store, tasks, concurrency=2, poll_interval=0.2).run(burst=True)
    finally:
        logger.removeFilter(seen)
        logger.setLevel(level)
    assert sorted(job_id for job_id, _ in records) == ids  # every job's outcome was logged
    assert [(job_id, bound) for job_id, bound in records if bound is not None] == []


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup: Python 3.11+")
def test_a_deeply_nested_exception_group_is_still_an_outcome(store: alk.Store, qname: str) -> None:
    """A group nested deeper than Python's recursion limit (a recursive crawl opening an
    ``asyncio.TaskGroup`` per level nests one group per level; each child runs in its own
    task, so the crawl itself never comes near the limit) is still mapped and recorded: a
    ``Fail`` at its bottom is dead now, anything else a retry whose error says what it
    holds. Walking it recursively raised RecursionError inside the worker's outcome
    mapping, and the job stayed processing, nothing recorded, until its claim lapsed."""
    depth = sys.getrecursionlimit() * 3
    tasks = alk.Tasks()

    @tasks.task(queue=qname, name="deep")
    def deep(kind: str) -> None:
        exc: BaseException = alk.Fail("no such user") if kind == "fail" else ValueError("bad row 7")
        for level in range(depth):
            exc = ExceptionGroup(f"level {level}", [exc])  # noqa: F821 - 3.11+
        raise exc

    ids = {kind: deep.enqueue(store, kind) for kind in ("fail", "error")}
    _drain(store, tasks)
    failed, errored = _job(store, qname, ids["fail"]), _job(store, qname, ids["error"])
    assert failed is not None and (failed.state, failed.last_error) == ("dead", "no such user"), failed
    assert errored is not None and errored.state == "pending" and errored.attempts == 1, errored
    [entry] = errored.errors
    assert entry["error"].startswith(f"level {depth - 1} (1 sub-exception): ") and "ValueError: bad row 7" in entry["error"], entry


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup: Python 3.11+")
def test_a_group_whose_exceptions_lead_back_to_itself_is_rendered_once() -> None:
    """A subclass whose ``exceptions`` holds the group itself is walked once, not forever."""
    from alkstore_sa.worker.outcomes import text_of

    class Looping(ExceptionGroup):  # type: ignore[type-arg]  # noqa: F821 - 3.11+
        @property
        def exceptions(self) -> tuple[BaseException, ...]:  # type: ignore[override]
            return (self, KeyError("sku"))

    assert text_of(Looping("loop", [ValueError("x")])) == "loop (1 sub-exception): KeyError: 'sku'"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup: Python 3.11+")
def test_a_wide_exception_group_is_rendered_only_up_to_the_cut() -> None:
    """The text recorded for a group is cut at 10,000 characters, so its exceptions are
    rendered only until then, and the rest are counted: a TaskGroup of thousands of
    children each failing with a long message (a response body) built the whole text first
    — tens of megabytes per failed attempt for a 10,000-character record."""
    from alkstore_sa.worker.outcomes import MAX_ERROR_TEXT, text_of

    rendered: list[int] = []

    class Loud(ValueError):
        def __str__(self) -> str:
            rendered.append(1)
            return "x" * 1000

    text = text_of(ExceptionGroup("batch", [Loud() for _ in range(1000)]))  # noqa: F821 - 3.11+
    assert len(rendered) <= MAX_ERROR_TEXT // 1000 + 1, len(rendered)
    assert text.startswith("batch (1000 sub-exceptions): Loud: xxx") and len(text) < MAX_ERROR_TEXT + 100, len(text)
    assert text.endswith(f"(and {1000 - len(rendered)} more exceptions, not shown)"), text[-80:]
