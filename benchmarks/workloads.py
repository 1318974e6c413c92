"""The alkstore_sa side of every workload, and the list of workloads with their floors and
the issue's targets (ratios to the floor in the same run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.orm import Session

import alkstore_sa as alk
from benchmarks.env import Env
from benchmarks.floor import QUEUE, WORKER, Floor, Steps

SESSION_QUEUE = "bench-session"
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


class Alk:
    """The library side of every workload. Each method prepares its workload (untimed: empty
    the table, prefill what a drain drains) and returns the ``Steps`` the runner times."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.store = env.store
        self.q = self.store.queue(QUEUE)

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
    floor: Callable[[Floor, Any], Side]
    floor_title: str
    engines: tuple[str, ...] = ("sqlite", "postgresql")
    targets: tuple[tuple[str, float], ...] = ()  # (engine, minimum ratio) from the issue
    unit: int = 1  # jobs per transaction/claim: interleaved steps are multiples of it
    interleave: bool = True  # False: each repetition is one step per side (the process pool)

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
)
