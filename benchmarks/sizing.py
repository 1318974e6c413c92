"""``python -m benchmarks.sizing``: what each operation costs the PostgreSQL server in CPU,
so you can size a database for a job rate (docs/performance.md, "Sizing").

One process runs each operation on a fresh schema. Its connections carry the application
name ``alksizing``; the CPU time (user + system, from ``/proc``) that the server backends
serving them spend is read before and after, as is this process's own CPU time. So the
figures hold on a busy machine too: other sessions' work is not counted (the WAL writer's
and checkpointer's share of the writes is not either, nor the time commits wait for the
disk). Needs the server on this machine (``/proc`` of its backends readable).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from benchmarks.env import pg_url
from benchmarks.workloads import drain, payloads

APP = "alksizing"
TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(conn: Any) -> float:
    """CPU seconds (user + system) of the server backends serving this process's store."""
    pids = [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP,)).fetchall()]
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def measure(conn: Any, jobs: int, run: Callable[[], object]) -> dict[str, float]:
    s0, c0, t0 = backend_cpu(conn), time.process_time(), time.perf_counter()
    run()
    wall, client, server = (time.perf_counter() - t0, time.process_time() - c0, backend_cpu(conn) - s0)
    return {"jobs": jobs, "per_s": jobs / wall, "server_us": server / jobs * 1e6,
            "client_us": client / jobs * 1e6}


def main(argv: list[str] | None = None) -> int:
    import psycopg

    p = argparse.ArgumentParser(prog="python -m benchmarks.sizing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    args = p.parse_args(argv)
    scale = 0.1 if args.quick else 1.0
    n_one, n_batch, n_worker = int(3000 * scale), int(50_000 * scale), int(10_000 * scale)
    url = sa.engine.make_url(pg_url()).update_query_dict({"application_name": APP})
    dsn = url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
    schema = f"alksizing_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema)
    conn = psycopg.connect(dsn, autocommit=True)
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        store.install()
        q = store.queue("sizing")
        q.enqueue({"warm": 1})
        drain(q, 10, "w")
        one = payloads(n_one)
        rows.append(("enqueue, one job per transaction (`q.enqueue`)",
                     measure(conn, n_one, lambda: [q.enqueue(x) for x in one])))
        rows.append(("drain, `claim_one` + `ack`", measure(conn, n_one, lambda: drain(q, 1, "w"))))
        many = payloads(n_batch)
        rows.append(("enqueue, `enqueue_many` of 1,000", measure(
            conn, n_batch, lambda: [q.enqueue_many(many[i : i + 1000]) for i in range(0, n_batch, 1000)])))
        rows.append(("drain, `claim_batch(100)` + `ack_batch`", measure(conn, n_batch, lambda: drain(q, 100, "w"))))
        for start in range(0, n_worker, 1000):
            q.enqueue_many(payloads(min(1000, n_worker - start), start))

        def worker_drain() -> None:
            alk.Worker(store, q, lambda job: None, concurrency=8).run(burst=True)

        rows.append(("drain, `alk.Worker` (concurrency 8, no-op handler)", measure(conn, n_worker, worker_drain)))
        # behind a transaction pooler the engine must not prepare statements (docs/pgbouncer.md)
        unprepared = sa.create_engine(url, connect_args={"prepare_threshold": None})
        plain = alk.Store(unprepared, schema=schema)
        try:
            pq = plain.queue("sizing")
            pq.enqueue({"warm": 1})
            drain(pq, 10, "w")
            rows.append(("enqueue, one per transaction, `prepare_threshold=None` (PgBouncer transaction mode)",
                         measure(conn, n_one, lambda: [pq.enqueue(x) for x in one])))
            rows.append(("drain, `claim_one` + `ack`, `prepare_threshold=None`",
                         measure(conn, n_one, lambda: drain(pq, 1, "w"))))
        finally:
            plain.close()
            unprepared.dispose()
        version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        store.close()
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()
        engine.dispose()
    print(f"## Server CPU per job (PostgreSQL {version}, one client process, {os.cpu_count()} cores)\n")
    print("| operation | jobs | jobs/s (one process) | server CPU µs/job | jobs/s per server core | client CPU µs/job |")
    print("|---|---:|---:|---:|---:|---:|")
    for title, m in rows:
        per_core = 1e6 / m["server_us"] if m["server_us"] else float("inf")
        print(f"| {title} | {m['jobs']:,} | {m['per_s']:,.0f} | {m['server_us']:,.0f} | {per_core:,.0f} "
              f"| {m['client_us']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
