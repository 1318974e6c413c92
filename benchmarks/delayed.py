"""The delayed-backlog run (issue 11, goal 3): draining ready jobs must cost the same
however many delayed jobs the queue holds, at whatever priorities.

Two queues share the tables. ``QUEUE`` holds the backlog: ``size`` pending jobs due far in
the future, their priorities spread evenly over ``LEVELS`` levels around the ready jobs'
priority 0 (five levels above it: in claim order, priority DESC then run_at, half the
backlog sits in front of every ready job). ``PLAIN`` holds none. Each repetition prefills
the same ready jobs into both queues (untimed) and drains them interleaved in small steps
(``runner.measure``), so both sides see the same machine: the ratio is the drain with the
backlog over the drain without (target >= 0.9), for ``claim_one`` + ``ack`` and for
``claim_batch(100)`` + ``ack_batch``. The backlog is seeded set-based (one INSERT ...
SELECT) and checked intact after every measurement. On PostgreSQL, the shared buffers one
claim touches on each side (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back) show the same
thing without the machine's noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import alkstore_sa as alk
from benchmarks.env import Env
from benchmarks.floor import QUEUE, WORKER, Steps
from benchmarks.runner import WARMUP, measure
from benchmarks.scaling import FAR, LIVE_COLS, _series
from benchmarks.workloads import drain, payloads

PLAIN = "bench-plain"
LEVELS = 10  # backlog priorities -4..5; the ready jobs' 0 is one of them
MODES = (("drain_one", 1), ("drain_batch", 100))


def seed(env: Env, size: int) -> None:
    """``size`` delayed jobs in ``QUEUE`` (untimed setup, one set-based INSERT)."""
    now = time.time()
    _series(
        env, size, f"INSERT INTO {env.jobs} {LIVE_COLS}",
        f"SELECT 'pending', '{QUEUE}', '{{\"delayed\":true}}', (g % {LEVELS}) - {LEVELS // 2 - 1}, 0, 3, "
        f"300.0, 5.0, {now!r}, {now + FAR!r} + g * 0.001, NULL, NULL, NULL, '[]'",
    )
    if env.kind == "postgresql":
        # what autovacuum would do after a bulk load, done now so it cannot start mid-measurement
        env.execute(f"VACUUM ANALYZE {env.jobs}")
    env.settle()


def _drain_steps(env: Env, q: alk.Queue, batch: int) -> Callable[[Sequence[Any]], Steps]:
    """The runner's side: prefill the items as ready jobs of ``q`` (untimed); each step
    drains exactly its chunk's count."""

    def prepare(items: Sequence[Any]) -> Steps:
        for i in range(0, len(items), 1000):
            q.enqueue_many(items[i : i + 1000])
        env.settle()

        def step(chunk: Sequence[Any]) -> None:
            done = drain(q, batch, WORKER, limit=len(chunk))
            if done != len(chunk):
                raise RuntimeError(f"{q.name}: drained {done} of {len(chunk)} jobs")

        return Steps(step)

    return prepare


def _check(env: Env, size: int) -> None:
    """Each drain took exactly its own jobs: the backlog is whole, the plain queue empty."""
    for queue, want in ((QUEUE, size), (PLAIN, 0)):
        left = env.scalar(f"SELECT count(*) FROM {env.jobs} WHERE queue = '{queue}'")
        if left != want:
            raise RuntimeError(f"{queue}: {left} rows left, expected {want}")


def claim_buffers(env: Env, queue: str, n: int) -> float | None:
    """PostgreSQL only: shared buffers one claim of ``n`` touches (EXPLAIN ANALYZE,
    BUFFERS, in a rolled-back transaction), through the library's compiled claim."""
    sql = getattr(env.store.backend, "_sql", {}).get("claim")
    if env.kind != "postgresql" or not sql:
        return None
    conn = env.admin()
    conn.execute("BEGIN")
    try:
        params = {"queue": queue, "worker_id": WORKER, "n": n, "now": None}
        top = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()[0][0]["Plan"]
    finally:
        conn.execute("ROLLBACK")
    return float(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def run_delayed(env: Env, sizes: Sequence[int], jobs: dict[str, int], reps: int,
                log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """For each backlog size (grown in place), both drain modes: the rate with the backlog,
    the rate without, and their ratio (median over the repetitions)."""
    env.truncate(env.jobs, env.dead)
    backlog_q, plain_q = env.store.queue(QUEUE), env.store.queue(PLAIN)
    have = 0
    results: list[dict[str, Any]] = []
    try:
        for size in sizes:
            t0 = time.perf_counter()
            seed(env, size - have)
            have = size
            log(f"  [{env.kind}] delayed backlog seeded to {size:,} rows in {time.perf_counter() - t0:.1f}s")
            for key, batch in MODES:
                items = payloads(jobs[key])
                with_backlog, without = _drain_steps(env, backlog_q, batch), _drain_steps(env, plain_q, batch)
                measure(with_backlog, without, items[: min(len(items), WARMUP)], 1, batch)
                m = measure(with_backlog, without, items, reps, batch)
                _check(env, size)
                buffers = {}
                if env.kind == "postgresql":
                    for q in (backlog_q, plain_q):
                        q.enqueue_many(items[:batch])
                    buffers = {"with_backlog": claim_buffers(env, QUEUE, batch),
                               "without": claim_buffers(env, PLAIN, batch)}
                    for q in (backlog_q, plain_q):
                        drain(q, batch, WORKER)
                results.append({
                    "backlog_rows": size, "mode": key, "batch": batch, "jobs": len(items),
                    "with_backlog": m["alkstore"], "without": m["floor"], "ratio": m["ratio"],
                    "ratios": m["ratios"], "claim_buffers": buffers,
                })
                log(f"  [{env.kind}] delayed {size:>9,} {key:<11} with {m['alkstore']['median']:>9,.0f}/s  "
                    f"without {m['floor']['median']:>9,.0f}/s  ratio {m['ratio']:.2f}")
    finally:
        env.truncate(env.jobs, env.dead)
    return results


def render(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Markdown for the report: one table per engine."""
    lines: list[str] = []
    for kind, rows in results.items():
        pg = kind == "postgresql"
        lines += [
            "",
            f"Delayed backlog, {'PostgreSQL' if pg else 'SQLite'}: ready jobs drained from a queue holding "
            f"N delayed jobs ({LEVELS} priority levels, half above the ready jobs') vs from a queue holding "
            "none, interleaved in one run (target: ratio >= 0.9)",
            "",
            "| delayed jobs | drain | jobs | with backlog | without | ratio |"
            + (" buffers per claim (with / without) |" if pg else ""),
            "|---:|---|---:|---:|---:|---:|" + ("---:|" if pg else ""),
        ]
        for r in rows:
            drain_name = "`claim_one` + `ack`" if r["batch"] == 1 else f"`claim_batch({r['batch']})` + `ack_batch`"
            line = (
                f"| {r['backlog_rows']:,} | {drain_name} | {r['jobs']:,} | {r['with_backlog']['median']:,.0f}/s | "
                f"{r['without']['median']:,.0f}/s | {r['ratio']:.2f}× |"
            )
            if pg:
                b = r["claim_buffers"]
                line += f" {b.get('with_backlog', 0):,.0f} / {b.get('without', 0):,.0f} |"
            lines.append(line)
    return lines
