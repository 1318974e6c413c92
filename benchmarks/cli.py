"""``python -m benchmarks``: every workload on each engine, side by side with its raw floor
in the same run; medians over the repetitions; a markdown table on stdout (progress on
stderr) and, with ``--json PATH``, the full results in a file."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from importlib import metadata as importlib_metadata
from typing import Any

from benchmarks import enqueue_procs
from benchmarks import report as rpt
from benchmarks.dashboard import run_dashboard
from benchmarks.delayed import render as render_delayed
from benchmarks.delayed import run_delayed
from benchmarks.env import Env, Unavailable, make_env
from benchmarks.floor import Floor
from benchmarks.latency import run_latency
from benchmarks.procs import ProcPool
from benchmarks.runner import WARMUP, measure
from benchmarks.scaling import run_scaling
from benchmarks.workloads import WORKLOADS, Alk, payloads

# Jobs per measurement, sized so the default run (both engines, 3 repetitions, scaling
# included) takes 1-3 minutes on a 2-core machine: about 70 s when it is quiet, up to
# about 2.5 min when other work shares its CPUs and its PostgreSQL.
SIZES: dict[str, dict[str, int]] = {
    "sqlite": {
        "enqueue_one": 15_000, "enqueue_session": 8_000, "enqueue_session_async": 8_000,
        "enqueue_many": 80_000, "drain_batch": 80_000, "drain_one": 8_000, "drain_batch8": 40_000,
        "drain_tasks_sync": 8_000, "drain_tasks_async": 8_000, "drain_4proc": 40_000,
        "drain_4proc_concurrency": 40_000, "drain_4proc_rate": 40_000,
        "drain_many_queues": 10_000,
        "enqueue_one_traced": 8_000, "enqueue_many_traced": 40_000, "drain_worker_traced": 8_000,
    },
    "postgresql": {
        "enqueue_one": 3_000, "enqueue_session": 2_000, "enqueue_session_async": 2_000,
        "enqueue_many": 30_000, "enqueue_many_copy": 30_000, "drain_batch": 30_000, "drain_one": 2_000,
        "drain_batch8": 10_000, "drain_tasks_sync": 4_000, "drain_tasks_async": 4_000,
        "drain_4proc": 20_000, "drain_4proc_concurrency": 20_000, "drain_4proc_rate": 20_000,
        "drain_many_queues": 10_000,
        "enqueue_one_traced": 2_000, "enqueue_many_traced": 20_000, "drain_worker_traced": 4_000,
    },
}
QUICK_SIZES: dict[str, dict[str, int]] = {
    "sqlite": {
        "enqueue_one": 300, "enqueue_session": 200, "enqueue_session_async": 200,
        "enqueue_many": 2_000, "drain_batch": 2_000, "drain_one": 200, "drain_batch8": 800,
        "drain_tasks_sync": 800, "drain_tasks_async": 800, "drain_4proc": 1_000,
        "drain_4proc_concurrency": 1_000, "drain_4proc_rate": 1_000,
        "drain_many_queues": 500,
        "enqueue_one_traced": 200, "enqueue_many_traced": 2_000, "drain_worker_traced": 800,
    },
    "postgresql": {
        "enqueue_one": 200, "enqueue_session": 100, "enqueue_session_async": 100,
        "enqueue_many": 2_000, "enqueue_many_copy": 2_000, "drain_batch": 2_000, "drain_one": 200,
        "drain_batch8": 800, "drain_tasks_sync": 800, "drain_tasks_async": 800,
        "drain_4proc": 1_000, "drain_4proc_concurrency": 1_000, "drain_4proc_rate": 1_000,
        "drain_many_queues": 500,
        "enqueue_one_traced": 200, "enqueue_many_traced": 2_000, "drain_worker_traced": 800,
    },
}
SCALING = {"sizes": (10_000, 100_000, 1_000_000), "drain_jobs": {"sqlite": 20_000, "postgresql": 10_000}}
QUICK_SCALING = {"sizes": (2_000, 20_000), "drain_jobs": {"sqlite": 1_000, "postgresql": 1_000}}
# The delayed-backlog run: backlog sizes (delayed jobs in the drained queue), ready jobs per drain.
DELAYED = {"sizes": (1_000_000,), "jobs": {"sqlite": {"drain_one": 4_000, "drain_batch": 40_000},
                                           "postgresql": {"drain_one": 2_000, "drain_batch": 20_000}}}
QUICK_DELAYED = {"sizes": (5_000,), "jobs": {"sqlite": {"drain_one": 200, "drain_batch": 1_000},
                                             "postgresql": {"drain_one": 200, "drain_batch": 1_000}}}
# Concurrent enqueue: jobs per enqueuing process, per side and repetition.
ENQUEUE_PROCS_PER_PROC = 250
# The dashboard/metrics reads: rows in the big queue, queues in all, timed requests per read.
DASHBOARD = {"rows": 1_000_000, "queues": 100, "requests": 5}
QUICK_DASHBOARD = {"rows": 2_000, "queues": 10, "requests": 2}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--engine", choices=("sqlite", "postgresql", "all"), default="all",
                   help="which engine(s) to run (default: all; an unreachable PostgreSQL is "
                        "skipped with a note under 'all', an error when asked for by name)")
    p.add_argument("--quick", action="store_true",
                   help="small counts and 1 repetition: a smoke test of the harness")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; 1 with --quick)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--skip-scaling", action="store_true", help="skip the 10k/100k/1M backlog run")
    p.add_argument("--skip-latency", action="store_true",
                   help="skip the wake latency / idle CPU measurement of a worker process")
    p.add_argument("--enqueue-procs", metavar="LEVELS", default=None,
                   help="comma-separated numbers of concurrently enqueuing processes for the "
                        "concurrent-enqueue run (default 1,4,16,32; 1,2 with --quick; SQLite runs "
                        "only 1, 2 and 4)")
    p.add_argument("--skip-enqueue-procs", action="store_true",
                   help="skip the concurrent-enqueue run (N processes enqueueing at once)")
    p.add_argument("--delayed-backlog", metavar="SIZES", default=None,
                   help="comma-separated numbers of delayed jobs in the queue the delayed-backlog "
                        "run drains ready jobs from (default 1000000; 5000 with --quick)")
    p.add_argument("--skip-delayed", action="store_true",
                   help="skip the delayed-backlog run (drain with N delayed jobs vs with none)")
    p.add_argument("--skip-dashboard", action="store_true",
                   help="skip the dashboard pages / metrics scrape on a 1M-row queue")
    p.add_argument("--only", metavar="KEYS",
                   help="comma-separated workload keys to run (e.g. drain_one,enqueue_one); "
                        "'dashboard' runs the dashboard/metrics reads, 'delayed' the "
                        "delayed-backlog run, 'enqueue_procs' the concurrent-enqueue run")
    args = p.parse_args(argv)
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.reps < 1:
        p.error("--reps must be >= 1")
    default_levels = enqueue_procs.QUICK_LEVELS if args.quick else enqueue_procs.LEVELS
    try:
        args.enqueue_levels = (
            tuple(int(k) for k in args.enqueue_procs.split(",")) if args.enqueue_procs else default_levels
        )
    except ValueError:
        p.error("--enqueue-procs takes numbers of processes, e.g. 1,4,16,32")
    if any(k < 1 for k in args.enqueue_levels):
        p.error("--enqueue-procs: each level must be >= 1")
    try:
        args.delayed_sizes = (
            tuple(int(k) for k in args.delayed_backlog.split(",")) if args.delayed_backlog
            else (QUICK_DELAYED if args.quick else DELAYED)["sizes"]
        )
    except ValueError:
        p.error("--delayed-backlog takes numbers of delayed jobs, e.g. 100000,1000000")
    if any(k < 0 for k in args.delayed_sizes) or list(args.delayed_sizes) != sorted(args.delayed_sizes):
        p.error("--delayed-backlog: sizes must be >= 0, in increasing order (the backlog grows in place)")
    return args


def _version(dist: str) -> str:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return "not installed"


def machine_meta(args: argparse.Namespace, engines: list[str]) -> dict[str, Any]:
    import sqlite3

    libs = {
        "alkstore_sa": _version("alkstore-sa"),
        "SQLAlchemy": _version("SQLAlchemy"),
        "psycopg": _version("psycopg"),
        "alembic": _version("alembic"),
        "sqlite3 (library)": sqlite3.sqlite_version,
    }
    try:
        import psycopg

        libs["libpq"] = str(psycopg.pq.version())
    except Exception:  # noqa: BLE001 - informational
        pass
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "libraries": libs,
        "databases": {},
        "engines": engines,
        "reps": args.reps,
        "quick": args.quick,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "skipped": {},
    }


def _proc_spec(env: Env) -> dict[str, Any]:
    return {"kind": env.kind, "url": env.url, "schema": env.schema, "sqlite_path": env.sqlite_path,
            "floor_path": env.floor_path, "dsn": env.dsn, "floor": env.floor}


def run_engine(env: Env, sizes: dict[str, int], reps: int, pool: ProcPool | None,
               only: set[str] | None) -> list[dict[str, Any]]:
    alk_side, floor_side = Alk(env), Floor(env)
    results = []
    try:
        for wl in WORKLOADS:
            if env.kind not in wl.engines or (only and wl.key not in only):
                continue
            n = sizes[wl.key]
            items = payloads(n)
            # a floor_on_alk workload compares two library paths (async vs sync enqueue, the
            # Tasks worker vs the handle drain): its "floor" runs on the library's side
            run_alk = wl.alk(alk_side, pool)
            run_floor = wl.floor(alk_side if wl.floor_on_alk else floor_side, pool)
            # warm both sides: compiled statements, prepared plans, pooled connections
            measure(run_alk, run_floor, items[: min(n, WARMUP)], 1, wl.unit, wl.interleave)
            m = measure(run_alk, run_floor, items, reps, wl.unit, wl.interleave)
            results.append({
                "engine": env.kind, "key": wl.key, "workload": wl.title, "floor_title": wl.floor_title,
                "jobs": n, **m, "target": wl.target(env.kind),
            })
            log(f"  [{env.kind}] {wl.key:<18} alkstore {m['alkstore']['median']:>10,.0f}/s  "
                f"floor {m['floor']['median']:>10,.0f}/s  ratio {m['ratio']:.2f}")
    finally:
        alk_side.close()
        floor_side.close()
        env.truncate(env.jobs, env.floor)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engines = ["sqlite", "postgresql"] if args.engine == "all" else [args.engine]
    only = set(args.only.split(",")) if args.only else None
    if only:
        unknown = only - {w.key for w in WORKLOADS} - {"dashboard", "delayed", "enqueue_procs"}
        if unknown:
            log(f"unknown workload keys: {', '.join(sorted(unknown))}")
            return 2
    sizes = QUICK_SIZES if args.quick else SIZES
    scaling_cfg = QUICK_SCALING if args.quick else SCALING
    meta = machine_meta(args, engines)
    dashboard_cfg = QUICK_DASHBOARD if args.quick else DASHBOARD
    report: dict[str, Any] = {"meta": meta, "results": [], "scaling": {}, "latency": {}, "dashboard": {},
                              "enqueue_procs": {}, "delayed": {}, "notes": rpt.NOTES}
    started = time.perf_counter()
    pool: ProcPool | None = None
    try:
        if only is None or any(not w.interleave for w in WORKLOADS if w.key in only):  # a process pool
            pool = ProcPool(4)
        for kind in engines:
            try:
                env = make_env(kind)
            except Unavailable as exc:
                if args.engine == "all":
                    log(f"skipping {kind}: {exc}")
                    meta["skipped"][kind] = str(exc)
                    continue
                log(str(exc))
                return 2
            try:
                meta["databases"][kind] = env.database_version()
                log(f"{kind}: {meta['databases'][kind]}")
                if pool is not None:
                    pool.setup(_proc_spec(env))
                report["results"].extend(run_engine(env, sizes[kind], args.reps, pool, only))
                if pool is not None:
                    pool.teardown()
                if not args.skip_dashboard and (only is None or "dashboard" in only):
                    report["dashboard"][kind] = run_dashboard(env, log=log, **dashboard_cfg)
                if not args.skip_latency and only is None:
                    report["latency"][kind] = run_latency(env, 30 if args.quick else 300, log)
                if not args.skip_enqueue_procs and (only is None or "enqueue_procs" in only):
                    report["enqueue_procs"][kind] = enqueue_procs.run_enqueue_procs(
                        env, args.enqueue_levels, 30 if args.quick else ENQUEUE_PROCS_PER_PROC,
                        args.reps, log,
                    )
                if not args.skip_delayed and (only is None or "delayed" in only):
                    report["delayed"][kind] = run_delayed(
                        env, args.delayed_sizes, (QUICK_DELAYED if args.quick else DELAYED)["jobs"][kind],
                        args.reps, log,
                    )
                if not args.skip_scaling:
                    report["scaling"][kind] = run_scaling(
                        env, scaling_cfg["sizes"], scaling_cfg["drain_jobs"][kind], args.reps, log
                    )
            finally:
                env.close()
    finally:
        if pool is not None:
            pool.close()
    meta["engines"] = [k for k in engines if k in meta["databases"]]
    meta["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(rpt.render(report))
    if report["enqueue_procs"]:
        print("\n".join(enqueue_procs.render(report["enqueue_procs"])))
    if report["delayed"]:
        print("\n".join(render_delayed(report["delayed"])))
    log(f"total {meta['elapsed_s']}s")
    if args.json:
        rpt.write_json(report, args.json)
    return 0
