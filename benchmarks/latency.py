"""Wake latency and idle cost of a worker: enqueue commit → handler start with an idle
``alk.Worker`` in another process, and the CPU that worker burns while idle; beside the raw
transport floor in the same run (PostgreSQL: a LISTEN/NOTIFY round trip between two plain
psycopg connections; SQLite: a peer polling ``PRAGMA data_version`` every millisecond)."""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import alkstore_sa as alk
from benchmarks.env import Env

QUEUE = "bench-latency"
GAP = 0.02  # seconds between samples, so the worker is idle (waiting) when each job commits
IDLE_SECONDS = 10.0


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(ms), "p99_ms": _percentile(ms, 99), "samples": len(ms)}


def _worker_main(url: str, schema: str, results: Any, ready: Any) -> None:
    """Child: an idle worker whose handler reports when it started (monotonic clock, which
    is system-wide on Linux, so both processes read the same one)."""
    store = alk.Store(url, schema=schema)

    def handler(job: alk.Job) -> None:
        results.put((job.payload["i"], time.monotonic()))

    worker = alk.Worker(store, QUEUE, handler, concurrency=1, poll_interval=3600)
    stop = alk.StopToken()
    ready.set()
    try:
        worker.run(stop)
    finally:
        store.close()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alkstore_latency(env: Env, samples: int, log: Callable[[str], None]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results, ready = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_worker_main, args=(env.url, env.schema, results, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("latency worker did not start")
        q = env.store.queue(QUEUE)
        time.sleep(1.0)  # let it subscribe and go idle
        for i in range(5):  # warm-up: compiled statements, prepared plans
            q.enqueue({"i": -1 - i})
            results.get(timeout=30)
        latencies: list[float] = []
        for i in range(samples):
            time.sleep(GAP)
            q.enqueue({"i": i})
            committed = time.monotonic()
            got, started = results.get(timeout=30)
            assert got == i
            latencies.append((started - committed) * 1000)
        time.sleep(1.0)
        before, t0 = _cpu_seconds(proc.pid), time.monotonic()
        log(f"  [{env.kind}] measuring an idle worker's CPU for {IDLE_SECONDS:.0f}s")
        time.sleep(IDLE_SECONDS)
        idle_cpu = (_cpu_seconds(proc.pid) - before) / (time.monotonic() - t0)
    finally:
        proc.terminate()
        proc.join(10)
    return {**_summary(latencies), "idle_cpu_percent": idle_cpu * 100}


def _pg_listener(dsn: str, channel: str, results: Any, ready: Any) -> None:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f'LISTEN "{channel}"')
    ready.set()
    for n in conn.notifies():
        results.put((int(n.payload), time.monotonic()))
        if n.payload == "-1":
            return


def _sqlite_poller(path: str, results: Any, ready: Any) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS bench_wake (i INTEGER)")
    version = conn.execute("PRAGMA data_version").fetchone()[0]
    last = conn.execute("SELECT coalesce(max(rowid), 0) FROM bench_wake").fetchone()[0]
    ready.set()
    while True:
        time.sleep(0.001)
        now = conn.execute("PRAGMA data_version").fetchone()[0]
        if now == version:
            continue
        version = now
        for rowid, i in conn.execute("SELECT rowid, i FROM bench_wake WHERE rowid > ?", (last,)):
            last = rowid
            results.put((i, time.monotonic()))
            if i == -1:
                return


def floor_latency(env: Env, samples: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results, ready = ctx.Queue(), ctx.Event()
    if env.kind == "postgresql":
        channel = "bench_floor_wake"
        proc = ctx.Process(target=_pg_listener, args=(env.dsn, channel, results, ready), daemon=True)
        title = "raw LISTEN/NOTIFY round trip (psycopg)"
    else:
        proc = ctx.Process(target=_sqlite_poller, args=(env.floor_path, results, ready), daemon=True)
        title = "raw peer polling PRAGMA data_version every 1 ms (sqlite3)"
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("floor listener did not start")
        conn = env.raw_connect(floor=env.kind == "sqlite")
        if env.kind == "sqlite":
            conn.execute("CREATE TABLE IF NOT EXISTS bench_wake (i INTEGER)")

        def send(i: int) -> None:
            if env.kind == "postgresql":
                conn.execute("SELECT pg_notify(%s, %s)", (channel, str(i)))
            else:
                conn.execute("INSERT INTO bench_wake (i) VALUES (?)", (i,))

        latencies: list[float] = []
        for i in range(samples):
            time.sleep(GAP)
            send(i)
            committed = time.monotonic()
            got, received = results.get(timeout=30)
            assert got == i
            latencies.append((received - committed) * 1000)
        send(-1)
        conn.close()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
    return {**_summary(latencies), "title": title}


def run_latency(env: Env, samples: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Both sides, one after the other (a latency sample needs an otherwise idle pair)."""
    log(f"  [{env.kind}] wake latency: {samples} samples")
    result = {"alkstore": alkstore_latency(env, samples, log), "floor": floor_latency(env, samples)}
    a, f = result["alkstore"], result["floor"]
    log(f"  [{env.kind}] latency p50 {a['p50_ms']:.2f} ms / p99 {a['p99_ms']:.2f} ms "
        f"(floor {f['p50_ms']:.2f} / {f['p99_ms']:.2f}); idle worker CPU {a['idle_cpu_percent']:.2f}%")
    return result
