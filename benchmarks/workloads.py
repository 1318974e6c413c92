"""The alkstore_sa side of every workload, and the list of workloads with their floors and
the issue's targets (ratios to the floor in the same run)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa.worker import observe
from benchmarks import traced
from benchmarks.env import Env, sqlite_pragmas
from benchmarks.floor import QUEUE, WORKER, Steps
from benchmarks.many_queues import PER_QUEUE, drain_queues

SESSION_QUEUE = "bench-session"
TASKS_QUEUE = "bench-tasks"
TASKS_CONCURRENCY = 8  # the Tasks worker's concurrency, hence its claim size (a claim fills free slots)
TASKS_STEP = 400  # jobs per timed step of the running Tasks worker (enqueued untimed before it)
PROC_BATCH = 10  # rows per claim for the 4-process drain (the 4-consumer floor)
# Limits that never bind (4 processes x 10 hold at most 40 claims; about 20,000 claims a
# second at most): the limited drains measure what the limited claim path costs, not the
# limit itself (a binding limit's throughput is the limit).
LIMITED_CONCURRENCY = 100
LIMITED_RATE = (1_000_000_000, 1.0)


def payloads(n: int, start: int = 0) -> list[dict[str, Any]]:
    """Small, typical job payloads (built before timing starts, on both sides)."""
    return [
        {"user_id": i, "action": "send_welcome_email", "locale": "en", "key": f"k-{i:08d}"}
        for i in range(start, start + n)
    ]


def drain(q: alk.Queue, batch: int, worker: str, limit: int | None = None) -> int:
    """``claim_batch(batch)`` + ``ack_batch`` (``claim_one`` + ``ack`` when ``batch == 1``),
    touching each payload; until ``limit`` jobs are done, or until a claim comes back empty
    when ``limit`` is None."""
    done = 0
    if batch == 1:
        claim_one = q.claim_one
        while limit is None or done < limit:
            h = claim_one(worker)
            if h is None:
                break
            _ = h.payload
            h.ack()
            done += 1
        return done
    claim_batch, ack_batch = q.claim_batch, q.ack_batch
    while limit is None or done < limit:
        hs = claim_batch(worker, batch if limit is None else min(batch, limit - done))
        if not hs:
            break
        for h in hs:
            _ = h.payload
        ack_batch([h.id for h in hs])
        done += len(hs)
    return done


class _Outcomes:
    """The worker's metrics hook (``alkstore_sa.worker.observe``) as a counter: the benchmark
    learns from it when a step's last ack landed. It is the benchmark's instrument, not part
    of the worker measured, so it is kept as light as it can be: no lock per job (``next``
    on an ``itertools.count`` is atomic), one ``Event.set`` per step, by the ack that
    reaches the step's target."""

    def __init__(self) -> None:
        self._acks = itertools.count(1)
        self.other = 0  # anything but an ack: the no-op task never fails, so this stays 0
        self.target = 0  # acks expected once the current step is done (cumulative)
        self._reached = threading.Event()

    def started(self, claim: alk.JobHandle) -> None:
        pass

    def finished(self, claim: alk.JobHandle, outcome: str, duration: float | None) -> None:
        if outcome != observe.ACKED:
            self.other += 1
            self._reached.set()
        elif next(self._acks) == self.target:
            self._reached.set()

    def expect(self, more: int) -> None:
        """The next step's jobs: ``more`` acks to wait for (before they are enqueued)."""
        self._reached.clear()
        self.target += more

    def wait(self, timeout: float = 120.0) -> None:
        if not self._reached.wait(timeout):
            raise RuntimeError(f"tasks worker: the step's acks (up to {self.target}) not all in after {timeout}s")
        if self.other:
            raise RuntimeError(f"tasks worker: {self.other} job(s) not acked")


class Alk:
    """The library side of every workload. Each method prepares its workload (untimed: empty
    the table, prefill what a drain drains) and returns the ``Steps`` the runner times."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.store = env.store
        self.q = self.store.queue(QUEUE)
        # the async side (aenqueue): one loop for the run, since async connections belong to
        # the loop that opened them
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_engine: AsyncEngine | None = None

    def close(self) -> None:
        if self._loop is not None:
            if self._async_engine is not None:
                self._loop.run_until_complete(self._async_engine.dispose())
            self._loop.close()

    def reset(self) -> None:
        self.env.truncate(self.env.jobs)
        self.env.settle()

    def prefill(self, items: Sequence[Any], per_tx: int = 1000) -> None:
        for i in range(0, len(items), per_tx):
            self.q.enqueue_many(items[i : i + per_tx])

    def enqueue_one(self, items: Sequence[Any]) -> Steps:
        self.reset()
        enqueue = self.q.enqueue

        def step(chunk: Sequence[Any]) -> None:
            for p in chunk:
                enqueue(p)

        return Steps(step)

    def enqueue_session(self, items: Sequence[Any]) -> Steps:
        self.reset()
        enqueue = alk.enqueue
        session = Session(self.env.engine)

        def step(chunk: Sequence[Any]) -> None:
            for p in chunk:
                enqueue(session, SESSION_QUEUE, p)
                session.commit()

        return Steps(step, session.close)

    def async_engine(self) -> tuple[asyncio.AbstractEventLoop, AsyncEngine]:
        """An async engine on the run's database (psycopg 3's async driver / aiosqlite),
        registered with the Store, and the loop it runs on; made once."""
        if self._loop is None or self._async_engine is None:
            driver = "postgresql+psycopg" if self.env.kind == "postgresql" else "sqlite+aiosqlite"
            engine = create_async_engine(sa.engine.make_url(self.env.url).set(drivername=driver))
            if self.env.kind == "sqlite":
                # the same connection settings the Store's connect hook gives its own engine
                sa.event.listen(engine.sync_engine, "connect", sqlite_pragmas)
            self.store.register(engine)
            self._loop, self._async_engine = asyncio.new_event_loop(), engine
        return self._loop, self._async_engine

    def enqueue_session_async(self, items: Sequence[Any]) -> Steps:
        """``await alk.aenqueue(session, ...)`` + ``await session.commit()`` per job, on an
        AsyncSession; each step is one ``run_until_complete`` of its chunk."""
        self.reset()
        loop, engine = self.async_engine()
        aenqueue = alk.aenqueue
        session = AsyncSession(engine)

        async def run(chunk: Sequence[Any]) -> None:
            for p in chunk:
                await aenqueue(session, SESSION_QUEUE, p)
                await session.commit()

        def step(chunk: Sequence[Any]) -> None:
            loop.run_until_complete(run(chunk))

        return Steps(step, lambda: loop.run_until_complete(session.close()))

    def drain_tasks(self, items: Sequence[Any], mode: str) -> Steps:
        """A ``Tasks`` worker (concurrency 8) with one no-op task (``def`` or ``async def``),
        started once per repetition (untimed) and running throughout, as in production.
        Each step enqueues its chunk (untimed), then is timed from that commit until the
        last of its jobs' acks landed (the worker's wake-up included), as counted by the
        worker's metrics hook."""
        self.reset()
        tasks = alk.Tasks()
        if mode == "sync":
            def noop(payload: Any) -> None:
                return None
        else:
            async def noop(payload: Any) -> None:  # type: ignore[misc]
                return None
        task = tasks.task(queue=TASKS_QUEUE, name=f"bench.noop_{mode}")(noop)
        q = self.store.queue(TASKS_QUEUE)
        done = _Outcomes()
        previous = observe.install(done)
        stop = alk.StopToken()
        worker = alk.Worker(self.store, tasks, concurrency=TASKS_CONCURRENCY, worker_id=WORKER)
        thread = threading.Thread(target=worker.run, args=(stop,), name="bench-tasks-worker", daemon=True)
        thread.start()

        def run(chunk: Sequence[Any]) -> float:
            calls = [{"task": task.name, "args": [p], "kwargs": {}} for p in chunk]  # SPEC §12 shape
            done.expect(len(chunk))
            for i in range(0, len(calls), 1000):
                q.enqueue_many(calls[i : i + 1000])
            t0 = time.perf_counter()
            done.wait()
            return time.perf_counter() - t0

        def close() -> None:
            stop.stop()
            thread.join(60)
            observe.install(previous)
            left = self.env.scalar(self._count_sql(), (TASKS_QUEUE,))
            if thread.is_alive() or done.other or left:
                raise RuntimeError(
                    f"tasks worker: {done.other} outcomes other than an ack, {left} jobs left "
                    f"(of {done.target} jobs run)"
                )

        run(payloads(TASKS_CONCURRENCY, start=-TASKS_CONCURRENCY))  # untimed: the worker is up and its threads started
        self.env.settle()
        return Steps(run, close)

    def _count_sql(self) -> str:
        return f"SELECT count(*) FROM {self.env.jobs} WHERE queue = {'%s' if self.env.kind == 'postgresql' else '?'}"

    def enqueue_many(self, items: Sequence[Any], per_tx: int = 1000) -> Steps:
        self.reset()
        enqueue_many = self.q.enqueue_many

        def step(chunk: Sequence[Any]) -> None:
            for i in range(0, len(chunk), per_tx):
                enqueue_many(chunk[i : i + per_tx])

        return Steps(step)

    def drain_steps(self, items: Sequence[Any], batch: int, reset: bool = True) -> Steps:
        """Prefill ``items`` (untimed); each step drains exactly its chunk's count.
        ``reset=False`` keeps what the table holds (the scaling run's backlog)."""
        if reset:
            self.reset()
        self.prefill(items)
        self.env.settle()

        def step(chunk: Sequence[Any]) -> None:
            done = drain(self.q, batch, WORKER, limit=len(chunk))
            if done != len(chunk):
                raise RuntimeError(f"alkstore drain got {done} of {len(chunk)} jobs")

        return Steps(step)

    def drain_batch(self, items: Sequence[Any]) -> Steps:
        return self.drain_steps(items, 100)

    def drain_one(self, items: Sequence[Any]) -> Steps:
        return self.drain_steps(items, 1)

    def drain_procs(self, items: Sequence[Any], run_pool: Callable[[dict[str, Any]], tuple[int, float]],
                    batch: int) -> Steps:
        """All of ``items`` drained by the process pool in one step (its own clock)."""
        self.reset()
        self.prefill(items)

        def step(chunk: Sequence[Any]) -> float:
            done, elapsed = run_pool({"side": "alk", "batch": batch, "queue": QUEUE})
            if done != len(chunk):
                raise RuntimeError(f"alkstore drain (processes) got {done} of {len(chunk)} jobs")
            return elapsed

        return Steps(step)


    def drain_procs_limited(self, items: Sequence[Any], run_pool: Callable[[dict[str, Any]], tuple[int, float]],
                            batch: int, limit: str) -> Steps:
        """``drain_procs`` on a queue with a concurrency or a rate limit (SPEC §14) that never
        binds: every claim takes the limited path (settings lock, counts, rate log)."""
        steps = self.drain_procs(items, run_pool, batch)
        if limit == "concurrency":
            self.q.set_concurrency(LIMITED_CONCURRENCY)
        else:
            self.q.set_rate_limit(LIMITED_RATE[0], per=LIMITED_RATE[1])

        def clear() -> None:  # the other workloads drain this queue unlimited
            self.q.set_concurrency(None)
            self.q.set_rate_limit(None)

        return Steps(steps.step, clear)


Side = Callable[[Sequence[Any]], Steps]


@dataclass(frozen=True)
class Workload:
    key: str  # the JSON key
    title: str  # the table's workload cell
    alk: Callable[[Alk, Any], Side]  # (side object, process pool) -> the timed function
    floor: Callable[[Any, Any], Side]  # (Floor, or Alk when floor_on_alk, process pool) -> ...
    floor_title: str
    engines: tuple[str, ...] = ("sqlite", "postgresql")
    targets: tuple[tuple[str, float], ...] = ()  # (engine, minimum ratio) from the issue
    unit: int = 1  # jobs per transaction/claim: interleaved steps are multiples of it
    interleave: bool = True  # False: each repetition is one step per side (the process pool)
    floor_on_alk: bool = False  # True: ``floor`` is another library path (an ``Alk`` method)

    def target(self, engine: str) -> float | None:
        return dict(self.targets).get(engine)


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "enqueue_one", "enqueue, one job per transaction (`q.enqueue`)",
        lambda a, _: a.enqueue_one, lambda f, _: f.enqueue_one,
        "driver `INSERT ... RETURNING id` / `lastrowid`, autocommit",
        targets=(("postgresql", 0.8), ("sqlite", 0.4)),
    ),
    Workload(
        "enqueue_session", "enqueue in a caller's `Session` (`alk.enqueue(session, ...)` + commit)",
        lambda a, _: a.enqueue_session, lambda f, _: f.enqueue_session,
        "same `INSERT` through the same Session + commit",
    ),
    Workload(
        "enqueue_session_async",
        "enqueue in a caller's `AsyncSession` (`await alk.aenqueue(session, ...)` + commit; "
        "psycopg async / aiosqlite)",
        lambda a, _: a.enqueue_session_async, lambda a, _: a.enqueue_session,
        "not a raw floor: sync `alk.enqueue(session, ...)` + commit on the same database",
        floor_on_alk=True,
    ),
    Workload(
        "enqueue_many", "batch enqueue (`enqueue_many`, 1,000 per transaction)",
        lambda a, _: a.enqueue_many, lambda f, _: f.executemany,
        "driver `executemany`, 1,000 per transaction", unit=1000,
        targets=(("sqlite", 0.5),),
    ),
    Workload(
        "enqueue_many_copy", "batch enqueue (`enqueue_many`, 1,000 per transaction)",
        lambda a, _: a.enqueue_many, lambda f, _: f.copy,
        "`COPY ... FROM STDIN`, 1,000 per transaction",
        engines=("postgresql",), unit=1000,
    ),
    Workload(
        "drain_batch", "drain, 1 consumer: `claim_batch(100)` + `ack_batch`",
        lambda a, _: a.drain_batch, lambda f, _: f.drain_batch,
        "one-statement claim of 100 + one-statement delete", unit=100,
        targets=(("postgresql", 0.7), ("sqlite", 0.5)),
    ),
    Workload(
        "drain_one", "drain, 1 consumer: `claim_one` + `h.ack()`",
        lambda a, _: a.drain_one, lambda f, _: f.drain_one,
        "one-statement claim of 1 + one-statement delete",
        targets=(("postgresql", 0.7), ("sqlite", 0.3)),
    ),
    Workload(
        "drain_batch8", f"drain, 1 consumer: `claim_batch({TASKS_CONCURRENCY})` + `ack_batch` (the tasks worker's claim size)",
        lambda a, _: partial(a.drain_steps, batch=TASKS_CONCURRENCY),
        lambda f, _: partial(f.drain_steps, batch=TASKS_CONCURRENCY),
        f"one-statement claim of {TASKS_CONCURRENCY} + one-statement delete", unit=TASKS_CONCURRENCY,
    ),
    Workload(
        "drain_tasks_sync", f"drain, `Tasks` worker, concurrency {TASKS_CONCURRENCY}, sync no-op task (steady state)",
        lambda a, _: partial(a.drain_tasks, mode="sync"),
        lambda a, _: partial(a.drain_steps, batch=TASKS_CONCURRENCY),
        f"not a raw floor: the handle drain, `claim_batch({TASKS_CONCURRENCY})` + `ack_batch`",
        targets=(("postgresql", 0.7), ("sqlite", 0.7)), unit=TASKS_STEP, floor_on_alk=True,
    ),
    Workload(
        "drain_tasks_async", f"drain, `Tasks` worker, concurrency {TASKS_CONCURRENCY}, async no-op task (steady state)",
        lambda a, _: partial(a.drain_tasks, mode="async"),
        lambda a, _: partial(a.drain_steps, batch=TASKS_CONCURRENCY),
        f"not a raw floor: the handle drain, `claim_batch({TASKS_CONCURRENCY})` + `ack_batch`",
        targets=(("postgresql", 0.7), ("sqlite", 0.7)), unit=TASKS_STEP, floor_on_alk=True,
    ),
    Workload(
        "drain_4proc", f"drain, 4 consumer processes: `claim_batch({PROC_BATCH})` + `ack_batch`",
        lambda a, pool: partial(a.drain_procs, run_pool=pool.run, batch=PROC_BATCH),
        lambda f, pool: partial(f.drain_procs, run_pool=pool.run, batch=PROC_BATCH),
        f"same floor (claim of {PROC_BATCH} + delete), 4 processes",
        interleave=False,
    ),
    Workload(
        "drain_4proc_concurrency",
        f"drain, 4 consumer processes, concurrency-limited queue (limit {LIMITED_CONCURRENCY}, never reached)",
        lambda a, pool: partial(a.drain_procs_limited, run_pool=pool.run, batch=PROC_BATCH, limit="concurrency"),
        lambda f, pool: partial(f.drain_procs, run_pool=pool.run, batch=PROC_BATCH),
        f"the unlimited floor (claim of {PROC_BATCH} + delete), 4 processes",
        interleave=False,
    ),
    Workload(
        "drain_4proc_rate",
        "drain, 4 consumer processes, rate-limited queue (limit never reached)",
        lambda a, pool: partial(a.drain_procs_limited, run_pool=pool.run, batch=PROC_BATCH, limit="rate"),
        lambda f, pool: partial(f.drain_procs, run_pool=pool.run, batch=PROC_BATCH),
        f"the unlimited floor (claim of {PROC_BATCH} + delete), 4 processes",
        interleave=False,
    ),
    Workload(
        "drain_many_queues",
        f"drain, one `Worker` (concurrency 8) serving many queues, {PER_QUEUE} ready jobs each",
        lambda a, _: lambda items: drain_queues(a, items, queues=max(1, len(items) // PER_QUEUE)),
        lambda a, _: lambda items: drain_queues(a, items, queues=1),
        "not a raw floor: the same worker on one queue holding the same jobs",
        targets=(("postgresql", 0.8), ("sqlite", 0.8)), interleave=False, floor_on_alk=True,
    ),
    # What tracing costs (benchmarks/traced.py): the same library path, tracing on vs off
    Workload(
        "enqueue_one_traced", "enqueue, one job per transaction (`q.enqueue`), tracing on",
        lambda a, _: partial(traced.enqueue_one, a, traced=True),
        lambda a, _: partial(traced.enqueue_one, a, traced=False),
        "not a raw floor: the same `q.enqueue` with tracing off", floor_on_alk=True,
    ),
    Workload(
        "enqueue_many_traced", "batch enqueue (`enqueue_many`, 1,000 per transaction), tracing on",
        lambda a, _: partial(traced.enqueue_many, a, traced=True),
        lambda a, _: partial(traced.enqueue_many, a, traced=False),
        "not a raw floor: the same `enqueue_many` with tracing off", unit=1000, floor_on_alk=True,
    ),
    Workload(
        "drain_worker_traced",
        f"drain, `Worker` (concurrency {traced.CONCURRENCY}), sync no-op handler, tracing on (steady state)",
        lambda a, _: partial(traced.drain_worker, a, traced=True),
        lambda a, _: partial(traced.drain_worker, a, traced=False),
        "not a raw floor: the same worker with tracing off", unit=traced.STEP, floor_on_alk=True,
    ),
)
