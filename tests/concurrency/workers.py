"""Child-process side of the concurrency tests: spawn-safe, importable worker functions.

Every function takes one JSON-able ``spec`` dict (url, schema, queue name, knobs), builds
its OWN ``alk.Store(url, schema=...)`` (never an engine inherited from the parent), and
returns a JSON-able result that ``child_main`` writes to a file for the parent to read.
Module level imports only: a spawned child re-imports this module from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa.worker.claimer import Claimer

BARRIER_TIMEOUT = 60.0  # spawned children import SQLAlchemy + psycopg first: allow slow starts


def child_main(
    fn: Callable[[dict[str, Any]], Any], spec: dict[str, Any], out: str, barrier: Any
) -> None:
    """Entry point of every spawned child: wait for the others, run ``fn``, write the outcome.
    Before the barrier, a first store's schema check warms up what every child's own first
    operation would otherwise do after it (the driver's import, the dialect's first
    connect): on a loaded machine that took one child longer than another needed to finish
    the whole workload alone, and a test's "several processes took part" then failed."""
    try:
        _warm_up(spec)
        barrier.wait(BARRIER_TIMEOUT)
        record: dict[str, Any] = {"result": fn(spec)}
    except BaseException:  # noqa: BLE001 - everything goes back to the parent as text
        record = {"error": traceback.format_exc()}
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, out)


def _warm_up(spec: dict[str, Any]) -> None:
    if "url" not in spec or "schema" not in spec:
        return
    with contextlib.suppress(alk.AlkstoreError), alk.Store(spec["url"], schema=spec["schema"]) as store:
        store.check_schema()


READY_TIMEOUT = 60.0


def meet_when_ready(spec: dict[str, Any]) -> None:
    """A second start line, passed once this process is ready to claim: it leaves a file in
    the shared ``spec["ready_dir"]`` and waits until ``spec["parties"]`` processes did.

    The harness's barrier is passed before a process opens its store, connects, or builds
    and starts a Worker. On a loaded machine that took one process longer than another
    needed to drain the whole workload alone, and a test's "several processes took part"
    then failed though nothing was wrong."""
    ready = Path(spec["ready_dir"])
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + READY_TIMEOUT
    while (got := len(list(ready.iterdir()))) < spec["parties"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {got} of {spec['parties']} processes got ready in {READY_TIMEOUT:g}s")
        time.sleep(0.005)


@contextlib.contextmanager
def workers_claim_together(spec: dict[str, Any]) -> Iterator[None]:
    """Within: a Worker run in this process makes its first claim only once it met the
    other processes at ``meet_when_ready``, when its wake hub, threads and registration are
    up and its claim loop starts (building and starting a Worker is the slow part of a
    worker process's start)."""
    original = Claimer.run

    def run(self: Claimer, stop: alk.StopToken, burst: bool) -> None:
        meet_when_ready(spec)
        original(self, stop, burst)

    Claimer.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        Claimer.run = original  # type: ignore[method-assign]


def ready_dir(tmp_path: Path) -> str:
    """A fresh directory for ``meet_when_ready`` (parent side)."""
    path = tmp_path / "ready"
    path.mkdir()
    return str(path)


def open_store(spec: dict[str, Any]) -> alk.Store:
    """This process's own store (database clock), from the spec's URL and schema."""
    return alk.Store(spec["url"], schema=spec["schema"])


# -- 1. exactly-once drain --------------------------------------------------------------------


def drain(spec: dict[str, Any]) -> dict[str, Any]:
    """Loop ``claim_batch`` (cycling through the spec's batch sizes) + ``ack`` until a claim
    comes back empty; report every claim as ``[id, attempts, worker_id, ack_result]``."""
    store = open_store(spec)
    try:
        q = store.queue(spec["queue"])
        q.stats()  # connected, schema checked: ready to claim
        meet_when_ready(spec)
        sizes: list[int] = spec["sizes"]
        claims: list[list[Any]] = []
        calls: list[list[int]] = []  # [n asked, len returned]
        deadline = time.monotonic() + spec["max_seconds"]
        i = 0
        while time.monotonic() < deadline:
            n = sizes[i % len(sizes)]
            i += 1
            handles = q.claim_batch(spec["worker_id"], n)
            calls.append([n, len(handles)])
            if not handles:
                break  # nothing pending (visibility is long: nothing comes back either)
            for h in handles:
                claims.append([h.id, h.job.attempts, h.job.worker_id, h.ack()])
        return {"claims": claims, "calls": calls, "pid": os.getpid()}
    finally:
        store.close()


# -- 2. claim_batch(n) never returns more than n ---------------------------------------------


def claim_sizes(spec: dict[str, Any]) -> dict[str, Any]:
    """Claim (no ack) with varying ``n`` until the queue is empty; report each call's
    ``[n, len(result)]`` and every claimed id."""
    store = open_store(spec)
    try:
        q = store.queue(spec["queue"])
        q.stats()  # connected, schema checked: ready to claim
        meet_when_ready(spec)
        deadline = time.monotonic() + spec["max_seconds"]
        sizes: list[int] = spec["sizes"]
        calls: list[list[int]] = []
        ids: list[int] = []
        i = spec["offset"]
        empty = 0
        while time.monotonic() < deadline and empty < 2:
            n = sizes[i % len(sizes)]
            i += 1
            handles = q.claim_batch(spec["worker_id"], n)
            calls.append([n, len(handles)])
            ids.extend(h.id for h in handles)
            empty = empty + 1 if not handles else 0
        return {"calls": calls, "ids": ids}
    finally:
        store.close()


# -- 2c. claimers in tight loops share the queue ---------------------------------------------


def tight_claims(spec: dict[str, Any]) -> dict[str, Any]:
    """``claim_batch(n)`` + ``ack_batch`` back to back, no pause, until a claim comes back
    empty; report how many jobs this process took and its claim calls."""
    store = open_store(spec)
    try:
        q = store.queue(spec["queue"])
        q.stats()  # connected, schema checked: ready to claim
        meet_when_ready(spec)
        deadline = time.monotonic() + spec["max_seconds"]
        taken, calls = 0, 0
        while time.monotonic() < deadline:
            handles = q.claim_batch(spec["worker_id"], spec["n"])
            calls += 1
            if not handles:
                break
            taken += q.ack_batch(handles)
        return {"taken": taken, "calls": calls}
    finally:
        store.close()


# -- 3. ack vs reclaim race -----------------------------------------------------------------


def ack_race(spec: dict[str, Any]) -> dict[str, Any]:
    """Claim a batch of short-visibility jobs, then ack them one by one so that the acks
    straddle the claim deadline, while the other processes reclaim whatever lapsed. Every
    claim is reported as ``[id, attempts, ack_result, claimed_at, claim_expires_at,
    ack_called_at, ack_returned_at]`` (epoch seconds; the database runs on this host, so its
    clock and this process's clock are the same clock).
    Runs until the queue is empty."""
    store = open_store(spec)
    try:
        q = store.queue(
            spec["queue"], visibility_timeout=spec["visibility"], max_attempts=spec["max_attempts"]
        )
        rng = random.Random(spec["seed"])
        lo, hi = spec["first_ack_after"]
        claims: list[list[Any]] = []
        deadline = time.monotonic() + spec["max_seconds"]
        while time.monotonic() < deadline:
            handles = q.claim_batch(spec["worker_id"], spec["batch"])
            if not handles:
                stats = q.stats()
                if stats.pending == 0 and stats.processing == 0:
                    break
                time.sleep(0.01)  # others hold claims that may still lapse
                continue
            rng.shuffle(handles)  # so no job is always the last (always late) of its batch
            time.sleep(rng.uniform(lo, hi))
            for h in handles:
                assert h.job.claimed_at is not None and h.job.claim_expires_at is not None
                started = time.time()
                acked = h.ack()
                claims.append(
                    [
                        h.id,
                        h.job.attempts,
                        acked,
                        h.job.claimed_at.timestamp(),
                        h.job.claim_expires_at.timestamp(),
                        started,
                        time.time(),
                    ]
                )
                time.sleep(rng.uniform(0.0, spec["ack_gap"]))
        return {"claims": claims}
    finally:
        store.close()


# -- 4. hammer: every operation, concurrently, for a while ----------------------------------


def hammer(spec: dict[str, Any]) -> dict[str, Any]:
    """For ``spec["seconds"]`` run a random mix of every queue operation on two queues.

    Nothing may raise. Reported so the parent can check conservation: every id this
    process enqueued, every id whose ``ack``/``cancel`` returned True, the ids offered to
    ``ack_batch``, and the operation counts.
    """
    store = open_store(spec)
    try:
        rng = random.Random(spec["seed"])
        queues = [
            store.queue(name, visibility_timeout=0.2, max_attempts=3, backoff_base=0)
            for name in spec["queues"]
        ]
        wid = spec["worker_id"]
        enqueued: list[int] = []
        removed: list[list[Any]] = []  # [id, "ack" | "cancel"] for every True
        batch_offered: list[int] = []
        errors: list[str] = []
        ops: dict[str, int] = {}
        held: list[alk.JobHandle] = []

        def count(op: str) -> None:
            ops[op] = ops.get(op, 0) + 1

        def enqueue_one(q: alk.Queue) -> None:
            kind = rng.random()
            if kind < 0.2:
                enqueued.append(q.enqueue({"n": rng.random()}, expires=rng.uniform(0.05, 0.4)))
            elif kind < 0.3:
                enqueued.append(q.enqueue("later", delay=rng.uniform(0.05, 0.3)))
            elif kind < 0.6:
                with Session(store.engine) as s:  # the caller's-transaction form
                    enqueued.append(alk.enqueue(s, q, {"tx": True}, priority=rng.randint(-2, 2)))
                    s.commit()
            else:
                enqueued.extend(q.enqueue_many([{"i": i} for i in range(rng.randint(1, 6))]))

        def claim(q: alk.Queue) -> None:
            for h in q.claim_batch(wid, rng.randint(1, 8)):
                r = rng.random()
                if r < 0.35:
                    if h.ack():
                        removed.append([h.id, "ack"])
                elif r < 0.5:
                    h.retry("again", delay=0 if rng.random() < 0.5 else None)
                elif r < 0.6:
                    h.fail("nope")
                elif r < 0.7:
                    h.heartbeat(0.3)
                    if h.ack():
                        removed.append([h.id, "ack"])
                elif r < 0.85:
                    held.append(h)  # for ack_batch later
                # else: abandon it; its claim lapses and someone reclaims it

        def ack_some(q: alk.Queue) -> None:
            mine = [h for h in held if h.job.queue == q.name]
            for h in mine:
                held.remove(h)
            ids = [h.id for h in mine]
            batch_offered.extend(ids)
            q.ack_batch(ids)

        def cancel(q: alk.Queue) -> None:
            if enqueued:
                victim = rng.choice(enqueued[-50:])
                if q.cancel(victim):
                    removed.append([victim, "cancel"])

        actions: list[tuple[str, float, Callable[[alk.Queue], Any]]] = [
            ("enqueue", 0.25, enqueue_one),
            ("claim", 0.35, claim),
            ("ack_batch", 0.08, ack_some),
            ("sweep_expired", 0.1, lambda q: q.sweep_expired()),
            ("stats", 0.07, lambda q: q.stats()),
            ("get_job", 0.05, lambda q: q.get_job(rng.choice(enqueued)) if enqueued else None),
            ("cancel", 0.05, cancel),
        ]
        names = [a[0] for a in actions]
        weights = [a[1] for a in actions]
        funcs = {a[0]: a[2] for a in actions}

        # for spec["seconds"], and on until spec["min_ops"] operations were made (a loaded
        # machine may give a process little of those seconds), within a bound
        start = time.monotonic()
        deadline, bound = start + spec["seconds"], start + spec["seconds"] + 30
        while (now := time.monotonic()) < deadline or (sum(ops.values()) < spec.get("min_ops", 0) and now < bound):
            op = rng.choices(names, weights)[0]
            q = rng.choice(queues)
            try:
                funcs[op](q)
                count(op)
            except Exception:  # noqa: BLE001 - any error is a finding; keep hammering
                errors.append(f"{op}: {traceback.format_exc(limit=3)}")
        return {
            "enqueued": enqueued,
            "removed": removed,
            "batch_offered": batch_offered,
            "errors": errors,
            "ops": ops,
        }
    finally:
        store.close()


# -- 5. kill -9 mid-processing ----------------------------------------------------------------


def doomed(spec: dict[str, Any], claimed_path: str, claimed_event: Any) -> None:
    """Claim a batch, publish what was claimed, then 'process' it (heartbeating each job)
    forever: the parent SIGKILLs this process somewhere in that loop."""
    store = open_store(spec)
    q = store.queue(spec["queue"], visibility_timeout=spec["visibility"])
    handles = q.claim_batch("doomed", spec["n"])
    with open(claimed_path + ".tmp", "w") as f:
        json.dump([[h.id, h.job.attempts] for h in handles], f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(claimed_path + ".tmp", claimed_path)
    claimed_event.set()
    while True:  # mid-processing, until killed
        for h in handles:
            h.heartbeat(spec["visibility"])
            time.sleep(0.005)


def rescue(spec: dict[str, Any]) -> dict[str, Any]:
    """Poll-claim until the expected ids have all been reclaimed (or time runs out); ack
    what was claimed; report ``[id, attempts, worker_id, claimed_at epoch, ack_result]``."""
    store = open_store(spec)
    try:
        q = store.queue(spec["queue"])
        want = set(spec["expect"])
        claims: list[list[Any]] = []
        deadline = time.monotonic() + spec["max_seconds"]
        while want and time.monotonic() < deadline:
            handles = q.claim_batch("rescuer", 100)
            for h in handles:
                assert h.job.claimed_at is not None
                claims.append(
                    [h.id, h.job.attempts, h.job.worker_id, h.job.claimed_at.timestamp(), h.ack()]
                )
                want.discard(h.id)
            if not handles:
                time.sleep(0.05)
        return {"claims": claims}
    finally:
        store.close()


# -- 2b. queues taking turns: one claim call across several queues ---------------------------


def claim_turns(spec: dict[str, Any]) -> dict[str, Any]:
    """Claim (no ack) from the spec's queues taking turns (``queue.claim_turns``, ``want``
    each, a budget cycling through ``budgets``) until two calls in a row take nothing;
    report each call's ``[budget, claimed]`` and every claimed ``[queue, id]``."""
    from alkstore_sa import queue as queue_mod

    store = open_store(spec)
    try:
        queues = [store.queue(name) for name in spec["queues"]]
        queues[0].stats()  # connected, schema checked: ready to claim
        meet_when_ready(spec)
        budgets: list[int] = spec["budgets"]
        calls: list[list[int]] = []
        claimed: list[list[Any]] = []
        deadline = time.monotonic() + spec["max_seconds"]
        i = spec["offset"]
        empty = 0
        while time.monotonic() < deadline and empty < 2:
            budget = budgets[i % len(budgets)]
            # each call starts its turns at another queue, as the worker's round-robin does
            order = queues[i % len(queues):] + queues[: i % len(queues)]
            i += 1
            taken = queue_mod.claim_turns(store, spec["worker_id"], order, spec["want"], budget)
            got = [h for _n, hs in taken for h in hs or []]
            calls.append([budget, len(got)])
            claimed.extend([h.job.queue, h.id] for h in got)
            empty = empty + 1 if not got else 0
        return {"calls": calls, "claimed": claimed}
    finally:
        store.close()
