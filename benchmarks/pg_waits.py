"""Where four PostgreSQL consumer processes wait (issue 11, goal 5).

Four spawned processes drain the same number of jobs, first with the library
(``claim_batch(10)`` + ``ack_batch``), then with the raw floor (its claim of 10 in a
transaction, then a delete of the ids), while this process samples ``pg_stat_activity``
for their backends (by ``application_name``) every half millisecond. Printed per side:
jobs/s, WAL written per job, and each (state, wait event) as a share of the samples and as
backend time per job (share x processes x seconds / jobs).

``python -m benchmarks.pg_waits [JOBS] [REPS]`` (default 40,000 jobs, 2 repetitions).
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import sys
import threading
import time
from typing import Any

import psycopg
import sqlalchemy as sa

import alkstore_sa as alk
from benchmarks.env import make_env, pg_url
from benchmarks.floor import FloorSQL
from benchmarks.workloads import payloads

PROCS, BATCH = 4, 10
QUEUE = "bench-waits"
SAMPLE_S = 0.0005


def _library(url: str, schema: str, app: str, barrier: Any, out: Any) -> None:
    engine_url = sa.engine.make_url(url).update_query_dict({"application_name": app})
    store = alk.Store(sa.create_engine(engine_url), schema=schema)
    q = store.queue(QUEUE)
    q.claim_batch("warm-up", 0)
    barrier.wait()
    t0, done = time.monotonic(), 0
    while hs := q.claim_batch("c", BATCH):
        done += q.ack_batch(hs)
    out.put((done, t0, time.monotonic()))
    store.close()


def _floor(dsn: str, table: str, app: str, barrier: Any, out: Any) -> None:
    sql = FloorSQL("postgresql", table)
    conn = psycopg.connect(dsn, autocommit=True, application_name=app)
    barrier.wait()
    t0, done = time.monotonic(), 0
    while True:
        with conn.transaction():
            rows = conn.execute(sql.claim, sql.claim_params(QUEUE, BATCH, "c")).fetchall()
        if not rows:
            break
        stmt, params = sql.delete_ids([r[0] for r in rows])
        with conn.transaction():
            done += conn.execute(stmt, params).rowcount
    out.put((done, t0, time.monotonic()))
    conn.close()


def _sample(dsn: str, app: str, stop: threading.Event, counts: collections.Counter[tuple[Any, ...]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            for row in conn.execute(
                "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE application_name = %s",
                (app,),
            ):
                counts[tuple(row)] += 1
            time.sleep(SAMPLE_S)


def _drain(side: str, target: Any, args: tuple[Any, ...], dsn: str) -> None:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(PROCS + 1), ctx.Queue()
    app = f"alkstore-waits-{side}"
    procs = [ctx.Process(target=target, args=(*args, app, barrier, out), daemon=True) for _ in range(PROCS)]
    for p in procs:
        p.start()
    counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(dsn, app, stop, counts))
    with psycopg.connect(dsn, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        sampler.start()
        barrier.wait()
        results = [out.get(timeout=600) for _ in procs]
        stop.set()
        sampler.join()
        wal = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()[0]  # type: ignore[index]
    for p in procs:
        p.join(30)
    jobs = sum(r[0] for r in results)
    seconds = max(r[2] for r in results) - min(r[1] for r in results)
    total = sum(counts.values()) or 1
    print(f"{side}: {jobs:,} jobs, {jobs / seconds:,.0f}/s, WAL {float(wal) / jobs:.0f} bytes/job, {total:,} samples")
    for (state, kind, event), n in counts.most_common(10):
        share = n / total
        print(f"  {100 * share:5.1f}%  {1e6 * share * PROCS * seconds / jobs:6.0f} us/job  {state} / {kind or '-'}:{event or '-'}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    jobs = int(args[0]) if args else 40_000
    reps = int(args[1]) if len(args) > 1 else 2
    env = make_env("postgresql")
    try:
        dsn = env.dsn
        assert dsn is not None
        items = payloads(jobs)
        q = env.store.queue(QUEUE)
        floor = FloorSQL("postgresql", env.floor)
        for rep in range(reps):
            print(f"-- repetition {rep + 1} of {reps}")
            for i in range(0, jobs, 1000):
                q.enqueue_many(items[i : i + 1000])
            with psycopg.connect(dsn, autocommit=True) as conn:
                now = time.time()
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(floor.insert, [(QUEUE, str(p), now, now) for p in items])
                conn.execute(f"VACUUM ANALYZE {env.jobs}")
                conn.execute(f"VACUUM ANALYZE {env.floor}")
            _drain("library", _library, (pg_url(), env.schema), dsn)
            _drain("floor", _floor, (dsn, env.floor), dsn)
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
