"""``python -m benchmarks.soak`` (``make bench-soak``): sustained load on PostgreSQL, with a
row per interval showing whether throughput holds and storage levels off.

Four enqueuing processes (``q.enqueue``, one job per transaction) at a steady total rate,
a share of them delayed; four ``alk.Worker`` processes draining; a share of the jobs fail
every attempt and go dead at ``max_attempts``; the parent sweeps the queue (dead-letter
retention) every few seconds, as the maintenance recipe does. Every interval it prints the
jobs enqueued and processed, the backlog, and per table its total / heap / index size,
live and dead tuples and the autovacuum runs so far (``pg_stat_user_tables``).

The schema is installed fresh by the packaged migrations, so the storage parameters of
schema step 3 apply; ``--no-storage-params`` resets them to the server's defaults after
the install, for a before/after comparison. Targets (issue 11, goal 4): processed in the
last interval ≥ 0.9× the first; table and index sizes level off.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import threading
import time
import uuid
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from benchmarks.env import pg_url

QUEUE = "soak"
# The tables whose storage parameters schema step 3 sets (PostgreSQL): their reset is
# what ``--no-storage-params`` runs.
TUNED = ("alkstore_jobs", "alkstore_dead_jobs")
RESET_PARAMS = (
    "fillfactor", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_insert_threshold",
    "autovacuum_analyze_scale_factor", "autovacuum_analyze_threshold",
    "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit",
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="duration (default 10)")
    p.add_argument("--quick", action="store_true",
                   help="1 minute in 15 s intervals, retention 10 s (a smoke run)")
    p.add_argument("--interval", type=float, default=None, help="seconds per row (default 60; 15 with --quick)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="jobs/s enqueued in total by the enqueuing processes; 0 (default): "
                        "measure capacity first (enqueuers unpaced for a calibration period) "
                        "and run at 80%% of it")
    p.add_argument("--enqueuers", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8, help="each worker's concurrency")
    p.add_argument("--delayed", type=float, default=0.1, help="share of jobs enqueued with a delay")
    p.add_argument("--max-delay", type=float, default=30.0, help="delays are uniform in [1, this] s")
    p.add_argument("--failing", type=float, default=0.02,
                   help="share of jobs whose handler always fails (dead after max_attempts)")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--retention", type=float, default=120.0, help="dead_letter_retention, seconds")
    p.add_argument("--sweep-every", type=float, default=5.0, help="seconds between sweep_expired calls")
    p.add_argument("--no-storage-params", action="store_true",
                   help="reset the tables' storage parameters to the server defaults")
    p.add_argument("--no-autovacuum-stand-in", action="store_true",
                   help="on a server with autovacuum off, do not run the stand-in that vacuums "
                        "the way autovacuum would (so the tables grow)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes = 1.0
        args.retention = min(args.retention, 10.0)
        args.max_delay = min(args.max_delay, 10.0)
    if args.interval is None:
        args.interval = 15.0 if args.quick else 60.0
    return args


# -- the child processes -----------------------------------------------------------------

def _queue(store: alk.Store, args: dict[str, Any]) -> alk.Queue:
    return store.queue(QUEUE, max_attempts=args["max_attempts"], backoff_base=0.2,
                       dead_letter_retention=args["retention"], visibility_timeout=60)


def enqueuer_main(index: int, spec: dict[str, Any], counts: Any, rate: Any, start: Any, stop: Any) -> None:
    """Enqueue at ``rate`` jobs/s in total (a shared value the parent may change; 0: as fast
    as it can), paced against the clock so a slow moment is caught up at once, until ``stop``."""
    store = alk.Store(sa.create_engine(spec["url"]), schema=spec["schema"])
    q = _queue(store, spec)
    rng = random.Random(index)
    q.enqueue({"warm": True}, delay=3600)  # connection and statements ready before the start
    start.wait()
    n = 0
    t_base, n_base, per_s = time.monotonic(), 0, -1.0
    while not stop.is_set():
        if rate.value / spec["enqueuers"] != per_s:  # a new pace starts from here
            t_base, n_base, per_s = time.monotonic(), n, rate.value / spec["enqueuers"]
        ahead = t_base + (n - n_base) / per_s - time.monotonic() if per_s > 0 else 0.0
        if ahead > 0:
            time.sleep(min(ahead, 0.05))
            continue
        delay = rng.uniform(1.0, spec["max_delay"]) if rng.random() < spec["delayed"] else None
        q.enqueue({"n": n, "fail": rng.random() < spec["failing"], "pad": "x" * 64}, delay=delay)
        n += 1
        if n % 50 == 0:
            counts[index] = n
    counts[index] = n
    store.close()


def worker_main(index: int, spec: dict[str, Any], counts: Any, start: Any, stop: Any) -> None:
    """One ``alk.Worker``; a failing job's handler raises (retried with backoff, then dead)."""
    import logging

    logging.getLogger("alkstore_sa").setLevel(logging.CRITICAL)  # a failing job logs each attempt
    store = alk.Store(sa.create_engine(spec["url"]), schema=spec["schema"])
    lock = threading.Lock()
    done = [0, 0]  # handler returned, handler raised

    def handle(job: alk.Job) -> None:
        failed = bool(job.payload.get("fail"))
        with lock:
            done[failed] += 1
            counts[2 * index], counts[2 * index + 1] = done
        if failed:
            raise RuntimeError("soak: this job always fails")

    token = alk.StopToken()
    worker = alk.Worker(store, _queue(store, spec), handle, concurrency=spec["concurrency"],
                        poll_interval=1.0, worker_id=f"soak-{index}")
    runner = threading.Thread(target=worker.run, args=(token,), daemon=True)
    start.wait()
    runner.start()
    stop.wait()
    token.stop()
    runner.join(30)
    store.close()


# -- the parent: sizes and stats ---------------------------------------------------------

def table_stats(conn: Any, schema: str) -> dict[str, dict[str, Any]]:
    """Per alkstore table of ``schema``: sizes (bytes) and pg_stat_user_tables counters."""
    rows = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), "
        "pg_indexes_size(c.oid), s.n_live_tup, s.n_dead_tup, s.autovacuum_count, "
        "s.autoanalyze_count, s.vacuum_count "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_stat_user_tables s ON s.relid = c.oid "
        "WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY c.relname",
        (schema,),
    ).fetchall()
    keys = ("total", "heap", "indexes", "live", "dead", "autovacuum", "autoanalyze", "vacuum")
    return {r[0]: dict(zip(keys, r[1:], strict=True)) for r in rows}


def mb(n: int) -> str:
    return f"{n / 1048576:.1f}"


def render(rows: list[dict[str, Any]], args: argparse.Namespace, meta: dict[str, Any]) -> str:
    out = ["## Soak (PostgreSQL)", ""]
    out.append(
        f"- {meta['server']}; {args.enqueuers} enqueuing processes at {meta['rate']:,.0f} jobs/s in "
        f"total (`q.enqueue`{', 80% of the calibrated capacity' if meta.get('calibrated') else ''}), {args.workers} `alk.Worker` processes (concurrency "
        f"{args.concurrency}); {args.delayed:.0%} delayed 1-{args.max_delay:.0f} s; "
        f"{args.failing:.0%} always fail (dead after {args.max_attempts} attempts, backoff base 0.2 s); "
        f"dead retention {args.retention:.0f} s, `sweep_expired` every {args.sweep_every:.0f} s"
    )
    out.append(f"- storage parameters: {meta['params']}")
    if "stand_in" in meta:
        out.append(f"- the server runs with autovacuum off: a stand-in ran what autovacuum would "
                   f"(the same triggers and cost delay, checked every {meta['stand_in']:g} s); its "
                   "runs are counted as autovacuum runs")
    out.append("")
    names = meta["tables"]
    head = "| t (s) | enqueued/s | processed/s | backlog | oldest snapshot (xids) |"
    sep = "|---:|---:|---:|---:|---:|"
    for t in names:
        short = t.removeprefix("alkstore_")
        head += f" {short} total / heap / idx MB | {short} live / dead tup | {short} autovac |"
        sep += "---:|---:|---:|"
    out += [head, sep]
    for r in rows:
        line = (f"| {r['t']:.0f} | {r['enqueued_per_s']:,.0f} | {r['processed_per_s']:,.0f} | {r['backlog']:,} "
                f"| {r.get('xmin_age', 0):,} |")
        for t in names:
            s = r["tables"].get(t, {})
            line += (f" {mb(s.get('total', 0))} / {mb(s.get('heap', 0))} / {mb(s.get('indexes', 0))} "
                     f"| {s.get('live', 0):,} / {s.get('dead', 0):,} | {s.get('autovacuum', 0)} |")
        out.append(line)
    out.append("")
    first, last = rows[0], rows[-1]
    ratio = last["processed_per_s"] / first["processed_per_s"] if first["processed_per_s"] else 0.0
    out.append(f"- processed/s, last interval vs first: {ratio:.2f}× (target ≥ 0.90 "
               f"{'ok' if ratio >= 0.9 else 'MISSED'})")
    half = rows[len(rows) // 2]
    for t in names:
        a, b = half["tables"].get(t, {}).get("total", 0), last["tables"].get(t, {}).get("total", 0)
        if a:
            out.append(f"- {t} total size, last vs middle row: {b / a:.2f}×")
    out.append("- processed = handler calls (a failing job's attempts included); backlog = live "
               "rows (pending, delayed and in flight) at the row's end; autovac = autovacuum runs "
               "so far; n_live_tup / n_dead_tup are the statistics collector's estimates; oldest snapshot = "
               "the age of the oldest backend_xmin on the server at the row's end (a large one holds "
               "vacuum back: it cannot remove rows that snapshot may see)")
    return "\n".join(out) + "\n"


def calibrate(conn: Any, schema: str, args: argparse.Namespace, enq_counts: Any, work_counts: Any) -> float:
    """Enqueuers unpaced for a while: the rate both sides sustain is the smaller of the
    enqueue and the drain rate; the run uses 80% of it. Waits for the ready backlog the
    calibration left to drain (so the first row is not inflated by it)."""
    seconds = 10.0 if args.quick else 30.0
    log(f"soak: calibrating for {seconds:g} s (enqueuers unpaced)")
    time.sleep(2.0)  # past the start-up
    t, e, d = time.monotonic(), sum(enq_counts), sum(work_counts)
    time.sleep(seconds)
    dt = time.monotonic() - t
    enq, done = (sum(enq_counts) - e) / dt, (sum(work_counts) - d) / dt
    chosen = 0.8 * min(enq, done)
    log(f"soak: calibration: enqueue {enq:,.0f}/s, processed {done:,.0f}/s -> pacing at {chosen:,.0f}/s")
    return max(chosen, 10.0)


def settle(conn: Any, schema: str, limit: float) -> None:
    """Wait (at most ``limit`` s) until the ready pending jobs are few: what the calibration
    left behind is drained before the measured run starts."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ready = conn.execute(
            f'SELECT count(*) FROM "{schema}"."alkstore_jobs" WHERE state = \'pending\' '
            "AND run_at <= extract(epoch FROM clock_timestamp())"
        ).fetchone()[0]
        if ready < 200:
            return
        time.sleep(0.5)


class AutovacuumStandIn:
    """What autovacuum would do, for a server where it is off (``SHOW autovacuum``): every
    naptime, each table of the schema past its autovacuum trigger — its own storage
    parameters, else the server's settings — gets ``VACUUM (ANALYZE)`` at its autovacuum
    cost delay (``ANALYZE`` alone when only the analyze trigger is past). Runs on its own
    connection and thread; ``runs[table]`` counts what it ran."""

    SETTINGS = ("autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
                "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
                "autovacuum_analyze_threshold", "autovacuum_analyze_scale_factor",
                "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit", "vacuum_cost_limit")

    def __init__(self, dsn: str, schema: str, naptime: float) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.schema, self.naptime = schema, naptime
        self.server = {k: float(self.conn.execute(f"SHOW {k}").fetchone()[0].removesuffix("ms"))
                       for k in self.SETTINGS}
        self.runs: dict[str, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="autovacuum-stand-in", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(self.naptime):
            self.tick()

    def tick(self) -> None:
        rows = self.conn.execute(
            "SELECT c.relname, c.reltuples, coalesce(c.reloptions, '{}'), s.n_dead_tup, "
            "s.n_ins_since_vacuum, s.n_mod_since_analyze "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE n.nspname = %s AND c.relkind = 'r'",
            (self.schema,),
        ).fetchall()
        for name, reltuples, reloptions, dead, inserted, modified in rows:
            if self.stopped.is_set():
                return
            own = {k: float(v) for k, v in (o.split("=", 1) for o in reloptions)}
            opt = {k: own.get(k, self.server[k]) for k in self.SETTINGS}
            tuples = max(reltuples, 0.0)
            vacuum = (dead > opt["autovacuum_vacuum_threshold"] + opt["autovacuum_vacuum_scale_factor"] * tuples
                      or inserted > opt["autovacuum_vacuum_insert_threshold"]
                      + opt["autovacuum_vacuum_insert_scale_factor"] * tuples)
            analyze = modified > opt["autovacuum_analyze_threshold"] + opt["autovacuum_analyze_scale_factor"] * tuples
            if not (vacuum or analyze):
                continue
            limit = opt["autovacuum_vacuum_cost_limit"]
            self.conn.execute(f"SET vacuum_cost_delay = {opt['autovacuum_vacuum_cost_delay']:g}")
            self.conn.execute(f"SET vacuum_cost_limit = {int(limit if limit > 0 else opt['vacuum_cost_limit'])}")
            target = f'"{self.schema}"."{name}"'
            self.conn.execute(f"VACUUM (ANALYZE) {target}" if vacuum else f"ANALYZE {target}")
            if vacuum:
                self.runs[name] = self.runs.get(name, 0) + 1

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(120)
        self.conn.close()


def storage_params(conn: Any, schema: str) -> str:
    rows = conn.execute(
        "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.reloptions IS NOT NULL ORDER BY c.relname",
        (schema,),
    ).fetchall()
    return "; ".join(f"{name} ({', '.join(opts)})" for name, opts in rows) or "server defaults"


def main(argv: list[str] | None = None) -> int:
    import psycopg

    args = parse_args(argv)
    url = pg_url()
    dsn = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    schema = f"alksoak_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema)
    conn = psycopg.connect(dsn, autocommit=True)
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    stop = ctx.Event()
    rows: list[dict[str, Any]] = []
    stand_in: AutovacuumStandIn | None = None
    try:
        store.install()
        if args.no_storage_params:
            for t in TUNED:
                conn.execute(f'ALTER TABLE "{schema}"."{t}" RESET ({", ".join(RESET_PARAMS)})')
        meta = {"server": "PostgreSQL " + conn.execute("SHOW server_version").fetchone()[0],
                "params": storage_params(conn, schema)}
        for name in ("autovacuum", "autovacuum_naptime", "autovacuum_vacuum_cost_delay",
                     "autovacuum_vacuum_cost_limit"):
            meta["server"] += f", {name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
        if conn.execute("SHOW autovacuum").fetchone()[0] == "off" and not args.no_autovacuum_stand_in:
            naptime = 10.0 if args.quick else float(conn.execute(
                "SELECT setting FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()[0])
            stand_in = AutovacuumStandIn(dsn, schema, naptime)
            meta["stand_in"] = naptime
        spec = {"url": url, "schema": schema, "rate": args.rate, "enqueuers": args.enqueuers,
                "delayed": args.delayed, "max_delay": args.max_delay, "failing": args.failing,
                "max_attempts": args.max_attempts, "retention": args.retention,
                "concurrency": args.concurrency}
        rate = ctx.Value("d", args.rate, lock=False)
        enq_counts = ctx.Array("q", args.enqueuers, lock=False)
        work_counts = ctx.Array("q", 2 * args.workers, lock=False)
        start = ctx.Barrier(args.enqueuers + args.workers + 1)
        for i in range(args.enqueuers):
            procs.append(ctx.Process(target=enqueuer_main, args=(i, spec, enq_counts, rate, start, stop), daemon=True))
        for i in range(args.workers):
            procs.append(ctx.Process(target=worker_main, args=(i, spec, work_counts, start, stop), daemon=True))
        for p in procs:
            p.start()
        start.wait(timeout=120)
        q = _queue(store, spec)
        if args.rate <= 0:
            chosen = calibrate(conn, schema, args, enq_counts, work_counts)
            rate.value = chosen / 2  # a gentler pace while the calibration's backlog drains
            settle(conn, schema, 60.0)
            rate.value = chosen  # the enqueuers start this pace from here: no catching up
            meta["calibrated"] = True
        meta["rate"] = rate.value
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        last_t, last_enq, last_done = t0, sum(enq_counts), sum(work_counts)  # the calibration's counts excluded
        next_row, next_sweep = t0 + args.interval, t0 + args.sweep_every
        log(f"soak: {args.minutes:g} min, schema {schema}, {meta['params']}")
        while next_row <= end + 0.5:
            now = time.monotonic()
            if now >= next_sweep:
                q.sweep_expired()
                next_sweep += args.sweep_every
            if now < next_row:
                time.sleep(min(next_row, next_sweep) - now)
                continue
            enq, done = sum(enq_counts), sum(work_counts)
            stats = table_stats(conn, schema)
            for name, ran in (stand_in.runs if stand_in else {}).items():
                stats[name]["autovacuum"] += ran
            backlog = conn.execute(f'SELECT count(*) FROM "{schema}"."alkstore_jobs"').fetchone()[0]
            # how far back the oldest open snapshot on the server holds vacuum (transactions)
            horizon = conn.execute("SELECT coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity "
                                   "WHERE pid <> pg_backend_pid()").fetchone()[0]
            row = {"t": now - t0, "enqueued_per_s": (enq - last_enq) / (now - last_t),
                   "processed_per_s": (done - last_done) / (now - last_t), "backlog": backlog,
                   "xmin_age": horizon, "enqueued": enq, "processed": done, "tables": stats}
            rows.append(row)
            j, d = stats.get("alkstore_jobs", {}), stats.get("alkstore_dead_jobs", {})
            log(f"  t={row['t']:5.0f}s enq {row['enqueued_per_s']:7,.0f}/s proc {row['processed_per_s']:7,.0f}/s "
                f"backlog {backlog:6,} jobs {mb(j.get('total', 0))} MB dead_tup {j.get('dead', 0):,} "
                f"av {j.get('autovacuum', 0)} | dead_jobs {mb(d.get('total', 0))} MB av {d.get('autovacuum', 0)}")
            last_t, last_enq, last_done = now, enq, done
            next_row += args.interval
    finally:
        stop.set()
        if stand_in is not None:
            stand_in.close()
        for p in procs:
            p.join(40)
            if p.is_alive():
                p.terminate()
        store.close()
        try:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            conn.close()
            engine.dispose()
    if not rows:
        return 1
    grown = [t for t in rows[-1]["tables"] if rows[-1]["tables"][t]["total"] > 200_000]
    meta["tables"] = [t for t in ("alkstore_jobs", "alkstore_dead_jobs") if t in rows[-1]["tables"]] + sorted(
        t for t in grown if t not in ("alkstore_jobs", "alkstore_dead_jobs"))
    print(render(rows, args, meta))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "meta": meta, "rows": rows}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
