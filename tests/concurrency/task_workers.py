"""Child-process side of the tasks drain test: a ``Tasks`` registry (sync, async, and a task
that asks for a retry on its first attempt) over two queues, and a worker process that
serves it. Spawn-safe: module level imports only, every child builds its own store.

Each run of a task records ``(job id, attempt, worker, ok)`` in the spec's table — read
through ``alk.current_job()``, so the record says which claim ran it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from tests.concurrency.wake_workers import _stop_when
from tests.concurrency.workers import workers_claim_together

PLAIN, AWAITED, FLAKY = "drain.plain", "drain.awaited", "drain.flaky"


class Sink:
    """Where this process's task runs are recorded (set by the worker process)."""

    engine: sa.Engine | None = None
    table = ""
    worker = ""

    @classmethod
    def record(cls, ok: bool) -> None:
        job = alk.current_job()
        assert job is not None and cls.engine is not None
        insert = sa.text(f"INSERT INTO {cls.table} (job_id, attempt, worker, ok) VALUES (:j, :a, :w, :ok)")
        with cls.engine.begin() as conn:
            conn.execute(insert, {"j": job.id, "a": job.attempts, "w": cls.worker, "ok": 1 if ok else 0})


def registry(prefix: str) -> alk.Tasks:
    """The registry both the test and the worker processes build: three tasks on two queues
    (a sync queue, and an async queue shared by the plain and the flaky async task)."""
    tasks = alk.Tasks()

    @tasks.task(queue=f"{prefix}-plain", name=PLAIN)
    def plain(i: int) -> None:
        Sink.record(True)

    @tasks.task(queue=f"{prefix}-awaited", name=AWAITED)
    async def awaited(i: int) -> None:
        await asyncio.sleep(0)
        await asyncio.to_thread(Sink.record, True)  # a blocking write, kept off the loop

    @tasks.task(queue=f"{prefix}-awaited", name=FLAKY)
    async def flaky(i: int) -> None:
        job = alk.current_job()
        assert job is not None
        ok = job.attempts > 1
        await asyncio.to_thread(Sink.record, ok)
        if not ok:
            raise alk.Retry(delay=0, error="first attempt fails")

    return tasks


def _serve_until_empty(spec: dict[str, Any], build: Callable[[alk.Store, str], tuple[alk.Worker, list[str]]]) -> dict[str, Any]:
    """Record runs in the spec's table and run the worker ``build(store, worker_id)`` makes
    until its queues are all empty (nothing pending or processing)."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    try:
        me = f"{spec['name']}:{os.getpid()}"
        Sink.engine, Sink.table, Sink.worker = store.engine, spec["table"], me
        worker, names = build(store, me)
        queues = [store.queue(name) for name in names]

        def empty() -> bool:
            return all((s := q.stats()).pending == 0 and s.processing == 0 for q in queues)

        stop = alk.StopToken()
        _stop_when(stop, empty, spec["max_seconds"], every=0.2)
        started = time.monotonic()
        with contextlib.ExitStack() as together:
            if "ready_dir" in spec:  # the processes' workers start claiming together
                together.enter_context(workers_claim_together(spec))
            worker.run(stop)
        return {"processed": worker.processed, "seconds": time.monotonic() - started, "worker": me}
    finally:
        store.close()


def tasks_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Serve the registry's two queues with ``spec['concurrency']`` until they are empty."""
    return _serve_registry(spec, registry, poll_interval=1.0)


def _serve_registry(spec: dict[str, Any], make: Callable[[str], alk.Tasks], poll_interval: float) -> dict[str, Any]:
    """A ``Tasks`` worker on the registry ``make(prefix)`` builds, until its queues are empty."""

    def build(store: alk.Store, me: str) -> tuple[alk.Worker, list[str]]:
        tasks = make(spec["prefix"])
        worker = alk.Worker(store, tasks, concurrency=spec["concurrency"], worker_id=me, poll_interval=poll_interval)
        return worker, tasks.queues()

    return _serve_until_empty(spec, build)


def many_queues_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-mq-{i:03d}" for i in range(count)]


def many_queues_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """A handler worker serving ``spec['queues']`` queues with fewer slots than queues (so its
    rounds take turns, several queues per claim call) until they are all empty."""

    def handle(job: alk.Job) -> None:
        Sink.record(True)

    def build(store: alk.Store, me: str) -> tuple[alk.Worker, list[str]]:
        names = many_queues_names(spec["prefix"], spec["queues"])
        worker = alk.Worker(store, names, handle, concurrency=spec["concurrency"], worker_id=me, poll_interval=1.0)
        return worker, names

    return _serve_until_empty(spec, build)


SLOW = "crash.slow"
SLOW_SECONDS = 0.03  # each run of the slow task: long enough that a kill finds jobs in flight


def crash_registry(prefix: str) -> alk.Tasks:
    """One sync task that records its run and then takes a while, with a short visibility
    timeout (a killed worker's claims lapse within a second) and attempts to spare."""
    tasks = alk.Tasks()

    @tasks.task(queue=f"{prefix}-crash", name=SLOW, visibility_timeout=1.0, max_attempts=50)
    def slow(i: int) -> None:
        Sink.record(True)
        time.sleep(SLOW_SECONDS)

    return tasks


def crash_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Serve the crash registry's queue until it is empty (or until SIGKILLed)."""
    return _serve_registry(spec, crash_registry, poll_interval=0.2)
