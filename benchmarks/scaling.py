"""The scaling run: drain throughput (``claim_batch(100)`` + ``ack_batch``) with 10k, 100k
and 1M rows already in the tables, to show the claim is an index range scan, not a scan of
the backlog.

The backlog grows in place between sizes; at every size it is, by row count:
45% ready pending jobs of another queue, 20% pending jobs of the drained queue with a
far-future ``run_at``, 10% in-flight (``processing``) jobs of the drained queue with a
far-future claim deadline, and 25% dead jobs of the drained queue. None of it is claimable,
so every drain must hand out exactly the jobs enqueued for it (checked). The floor table
gets the same live backlog (it has no dead storage), and both sides are drained
interleaved as in the main table: the ratio column cancels the machine's drift between
sizes, the alkstore column shows the absolute figure.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from benchmarks.env import Env
from benchmarks.floor import QUEUE, WORKER, Floor
from benchmarks.floor import drain as floor_drain
from benchmarks.runner import WARMUP, measure
from benchmarks.workloads import Alk, drain, payloads

FAR = 10 * 365 * 86400.0
_BACKLOG_PAYLOAD = '{"backlog":true}'
_DEAD_ID_BASE = 10**12  # dead ids far above any live id the benchmark will allocate


def _series(env: Env, count: int, insert: str, select: str, floor: bool = False) -> None:
    """INSERT ... SELECT over ``count`` generated rows (``g`` is 1..count)."""
    if env.kind == "postgresql":
        env.execute(f"{insert} {select} FROM generate_series(1, {int(count)}) AS s(g)", floor=floor)
    else:
        env.execute(
            f"WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {int(count)}) "
            f"{insert} {select} FROM s",
            floor=floor,
        )


def _lit(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


LIVE_COLS = (
    "(state, queue, payload, priority, attempts, max_attempts, visibility_timeout, "
    "backoff_base, created_at, run_at, claimed_at, claim_expires_at, worker_id, errors)"
)


def split(count: int) -> tuple[int, int, int, int]:
    """(other queue ready, far-future, in-flight, dead) rows of a backlog of ``count``."""
    other, future, inflight = count * 45 // 100, count * 20 // 100, count * 10 // 100
    return other, future, inflight, count - other - future - inflight


def grow(env: Env, count: int, dead_from: int) -> None:
    """Add ``count`` backlog rows in the proportions above (untimed setup, plain SQL): to
    alkstore's tables, and the live part of it to the floor table too."""
    now = time.time()
    other, future, inflight, dead = split(count)
    common = f"{_lit(_BACKLOG_PAYLOAD)}, 0"
    for table in (env.jobs, env.floor):
        on_floor = table == env.floor
        for n, state, queue, attempts, run_at, claimed, deadline, worker in (
            (other, "pending", "bench-backlog", 0, now - 60, "NULL", "NULL", "NULL"),
            (future, "pending", QUEUE, 0, now + FAR, "NULL", "NULL", "NULL"),
            (inflight, "processing", QUEUE, 1, now - 60, repr(now), repr(now + FAR), "'other-worker'"),
        ):
            _series(
                env, n, f"INSERT INTO {table} {LIVE_COLS}",
                f"SELECT {_lit(state)}, {_lit(queue)}, {common}, {attempts}, 3, 300.0, 5.0, {now!r}, "
                f"{run_at!r}, {claimed}, {deadline}, {worker}, '[]'", floor=on_floor,
            )
    _series(
        env, dead,
        f"INSERT INTO {env.dead} (id, queue, payload, priority, attempts, max_attempts, "
        "visibility_timeout, backoff_base, created_at, run_at, claimed_at, claim_expires_at, "
        "worker_id, errors, last_error, died_at)",
        f"SELECT {dead_from} + g, {_lit(QUEUE)}, {common}, 3, 3, 300.0, 5.0, {now!r}, {now!r}, "
        f"{now!r}, {now!r}, 'old-worker', '[]', 'failed', {now!r}",
    )
    if env.kind == "postgresql":
        # what autovacuum would do after a bulk load, done now so it cannot start mid-measurement
        for table in (env.jobs, env.dead, env.floor):
            env.execute(f"VACUUM ANALYZE {table}", floor=table == env.floor)
    env.settle()


def _check_backlog(env: Env, table: str, size: int) -> None:
    """The drains took exactly their own jobs: the drained queue still holds its whole
    backlog (far-future + in-flight rows) and nothing else."""
    _, future, inflight, _ = split(size)
    left = env.scalar(f"SELECT count(*) FROM {table} WHERE queue = {_lit(QUEUE)}", floor=table == env.floor)
    if left != future + inflight:
        raise RuntimeError(f"{table}: {left} rows left in the drained queue, expected {future + inflight}")


def plan(env: Env, key: str) -> str:
    """How one of the library's compiled statements (``claim`` or ``ack_batch``) reads the
    live table: its query plan's table scans (informational; read from the backend's
    statement cache). Index scans bounded by the queue's own rows keep a drain flat."""
    sql = getattr(env.store.backend, "_sql", {}).get(key)
    if not sql:
        return f"({key} statement not found)"
    now = time.time() if env.kind == "sqlite" else None
    params: dict[str, Any] = {"queue": QUEUE, "worker_id": WORKER, "n": 100, "now": now}
    if key == "ack_batch":
        params = {"queue": QUEUE, "now": now, "ids": "[1, 2]" if env.kind == "sqlite" else [1, 2]}
    try:
        if env.kind == "postgresql":
            lines = [r[0] for r in env.execute("EXPLAIN " + sql, params)]
            scans = [
                ln.strip().removeprefix("->").strip().split("  (")[0]
                for ln in lines
                if "Scan" in ln and "alkstore_" in ln
            ]
        else:
            rows = env.execute("EXPLAIN QUERY PLAN " + sql, params)
            scans = [r[3] for r in rows if r[3].startswith(("SCAN", "SEARCH")) and "alkstore_" in r[3]]
    except Exception as exc:  # noqa: BLE001 - informational only
        return f"(EXPLAIN failed: {type(exc).__name__}: {exc})"
    return "; ".join(dict.fromkeys(scans)) or "(no table scans)"


def claim_cost(env: Env, floor: Floor | None = None) -> dict[str, float] | None:
    """PostgreSQL only: shared buffers touched and execution time of one claim of 100 ready
    rows (``EXPLAIN (ANALYZE, BUFFERS)`` in a rolled-back transaction) by the library's
    compiled claim, or the floor's. Page counts do not depend on the machine's load: flat
    counts across sizes are the claim staying flat."""
    if env.kind != "postgresql":
        return None
    if floor is None:
        sql = getattr(env.store.backend, "_sql", {}).get("claim")
        if not sql:
            return None
        params: Any = {"queue": QUEUE, "worker_id": WORKER, "n": 100, "now": None}
    else:
        sql, params = floor.sql.claim, floor.sql.claim_params(QUEUE, 100, WORKER)
    conn = env.admin(floor is not None)
    conn.execute("BEGIN")
    try:
        out = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()[0][0]
    finally:
        conn.execute("ROLLBACK")
    top = out["Plan"]
    return {"buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "exec_ms": out["Execution Time"], "rows": top.get("Actual Rows", 0)}


def run_scaling(env: Env, sizes: tuple[int, ...], drain_jobs: int, reps: int,
                log: Any = print) -> list[dict[str, Any]]:
    alk_side, floor_side = Alk(env), Floor(env)
    env.truncate(env.jobs, env.dead, env.floor)
    have = 0
    results: list[dict[str, Any]] = []
    items = payloads(drain_jobs)
    try:
        for size in sizes:
            t0 = time.perf_counter()
            grow(env, size - have, _DEAD_ID_BASE + have)
            have = size
            log(f"  [{env.kind}] backlog grown to {size:,} rows in {time.perf_counter() - t0:.1f}s")
            run_alk = partial(alk_side.drain_steps, batch=100, reset=False)
            run_floor = partial(floor_side.drain_steps, batch=100, reset=False)
            measure(run_alk, run_floor, items[:WARMUP], 1, 100)
            m = measure(run_alk, run_floor, items, reps, 100)
            costs = {}
            if env.kind == "postgresql":
                alk_side.prefill(items[:100])
                floor_side.prefill(items[:100])
                costs = {"alkstore": claim_cost(env), "floor": claim_cost(env, floor_side)}
                drain(alk_side.q, 100, WORKER)
                floor_drain(floor_side.conn, floor_side.sql, QUEUE, 100, WORKER)
            _check_backlog(env, env.jobs, size)
            _check_backlog(env, env.floor, size)
            results.append({"backlog_rows": size, "drain_jobs": drain_jobs, **m, "claim_cost": costs,
                            "plans": {k: plan(env, k) for k in ("claim", "ack_batch")}})
            log(f"  [{env.kind}] backlog {size:>9,}: alkstore {m['alkstore']['median']:>9,.0f}/s  "
                f"floor {m['floor']['median']:>9,.0f}/s  ratio {m['ratio']:.2f}")
    finally:
        floor_side.close()
        env.truncate(env.jobs, env.dead, env.floor)
    base = results[0]
    for r in results:
        r["alkstore_vs_smallest"] = r["alkstore"]["median"] / base["alkstore"]["median"]
        r["ratio_vs_smallest"] = r["ratio"] / base["ratio"]
    return results
