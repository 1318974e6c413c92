"""Concurrent enqueue: N processes enqueue one job per transaction at once (N = 1, 4, 16, 32),
the library beside raw floors measured in the same run, interleaved side by side.

Sides (PostgreSQL):

- ``q.enqueue`` (the library, autocommit, one statement);
- floor: the plain driver's ``INSERT ... RETURNING id`` of a row of the same width (the
  library's columns and values) into a table with the same indexes and constraints
  (``CREATE TABLE ... (LIKE alkstore_jobs INCLUDING ALL)``), autocommit;
- the same floor plus ``pg_notify`` in the statement (what every enqueue did before wakes
  became conditional: notifying commits are serialized by PostgreSQL);
- ``alk.enqueue(session, ...)`` + ``session.commit()`` against the same wide ``INSERT``
  through a Session + commit.

SQLite (one writer at a time, so only 1 and 4 processes): ``q.enqueue`` against the plain
``sqlite3`` INSERT into the same wide table.

The processes are spawned once (the largest level) and reused; each level uses the first N.
All of a level's processes start together at a barrier; throughput = jobs / (last finish -
first start). Nobody waits on the queue, so the library sends no wake (counted by a LISTEN
connection during its runs: ``wakes``)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

from benchmarks.env import Env

QUEUE = "bench-enqueue-procs"
LEVELS = (1, 4, 16, 32)
QUICK_LEVELS = (1, 2)  # quick: two spawned processes at most (start-up dominates a quick run)
SQLITE_LEVELS = (1, 2, 4)
RECV_TIMEOUT_S = 600.0
WIDE = "bench_wide_jobs"
SIDES_PG = ("alk", "floor", "floor_notify", "alk_session", "floor_session")
SIDES_SQLITE = ("alk", "floor")
PAIRS = (("alk", "floor"), ("alk_session", "floor_session"))

_COLS = (
    "queue, state, payload, priority, attempts, max_attempts, visibility_timeout, backoff_base, "
    "dead_letter_retention, created_at, run_at, expires_at, errors"
)


def _wide_insert(kind: str, table: str, notify: bool = False) -> str:
    """The floor's INSERT of a library-width row: every value the library writes, as
    parameters (queue, payload, now, now), the constant stamps inlined."""
    p = "%s" if kind == "postgresql" else "?"
    values = f"({p}, 'pending', {p}, 0, 0, 3, 300.0, 5.0, NULL, {p}, {p}, NULL, '[]')"
    sql = f"INSERT INTO {table} ({_COLS}) VALUES {values} RETURNING id"
    if notify:
        sql = f"WITH ins AS ({sql}), w AS MATERIALIZED (SELECT pg_notify(%s, '') IS NULL AS w) SELECT ins.id FROM ins, w"
    return sql


def _session_insert(table: str) -> str:
    return (
        f"INSERT INTO {table} ({_COLS}) VALUES (:queue, 'pending', :payload, 0, 0, 3, 300.0, 5.0, "
        "NULL, :now, :now, NULL, '[]') RETURNING id"
    )


def _run_side(res: dict[str, Any], side: str, n: int, start: int) -> int:
    """One process's share: ``n`` enqueues of ``side``, one per transaction."""
    items = [{"user_id": i, "action": "send_welcome_email", "locale": "en", "key": f"k-{i:08d}"}
             for i in range(start, start + n)]
    if side == "alk":
        enqueue = res["store"].queue(QUEUE).enqueue
        for p in items:
            enqueue(p)
    elif side in ("floor", "floor_notify"):
        conn, kind, table = res["conn"], res["kind"], res["table"]
        sql = _wide_insert(kind, table, notify=side == "floor_notify")
        cur = conn.cursor()
        for p in items:
            now = time.time()
            args: tuple[Any, ...] = (QUEUE, json.dumps(p), now, now)
            if side == "floor_notify":
                args += (res["wake"],)
            cur.execute(sql, args)
            cur.fetchone()
    elif side == "alk_session":
        import alkstore_sa as alk

        session = res["session"]
        for p in items:
            alk.enqueue(session, QUEUE, p)
            session.commit()
    elif side == "floor_session":
        import sqlalchemy as sa

        session, stmt = res["session"], sa.text(_session_insert(res["table"]))
        for p in items:
            session.execute(stmt, {"queue": QUEUE, "payload": json.dumps(p), "now": time.time()})
            session.commit()
    else:
        raise ValueError(side)
    return n


def _open(spec: dict[str, Any], side: str) -> dict[str, Any]:
    """What one side needs, and only that: 32 processes holding every side's connections at
    once would exceed a default ``max_connections``."""
    res: dict[str, Any] = {"kind": spec["kind"], "table": spec["table"], "wake": spec["wake"], "side": side}
    if side.startswith("floor") and side != "floor_session":
        from benchmarks.env import raw_connect

        res["conn"] = raw_connect(spec["kind"], spec["sqlite_path"], spec["dsn"])
        return res
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    import alkstore_sa as alk

    res["engine"] = sa.create_engine(spec["url"])
    if side != "floor_session":  # alk.enqueue(session, ...) finds the engine's store
        res["store"] = alk.Store(res["engine"], schema=spec["schema"])
    if side != "alk":
        res["session"] = Session(res["engine"])
    return res


def _close(res: dict[str, Any] | None) -> None:
    if res is None:
        return
    for key in ("session", "conn", "store"):
        if key in res:
            res[key].close()
    if "engine" in res:
        res["engine"].dispose()


def _child(pipe: Any, barrier: Any) -> None:
    spec: dict[str, Any] = {}
    res: dict[str, Any] | None = None
    while True:
        msg = pipe.recv()
        if msg is None:
            break
        op, arg = msg
        try:
            if op == "setup":
                _close(res)
                res, spec = None, arg
                pipe.send(("ok", None))
            elif op == "run":
                if res is None or res["side"] != arg["side"]:
                    _close(res)
                    res = _open(spec, arg["side"])
                    _run_side(res, arg["side"], 20, -20)  # warm: statements, prepared plans
                pipe.send(("ready", None))
                barrier.wait()
                t0 = time.monotonic()
                n = _run_side(res, arg["side"], arg["n"], arg["start"])
                pipe.send(("done", (n, t0, time.monotonic())))
            else:
                raise ValueError(op)
        except BaseException:
            pipe.send(("error", traceback.format_exc()))
            if op == "run":
                break
    _close(res)


class _Pool:
    """``size`` spawned enqueuing processes; ``run(k, ...)`` uses the first ``k`` of them."""

    def __init__(self, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.ctx = ctx
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        self.barriers = {k: ctx.Barrier(k + 1) for k in range(1, size + 1)}
        for i in range(size):
            parent_end, child_end = ctx.Pipe()
            # every child waits on the barrier of the level it runs at: handed over per run
            proc = ctx.Process(target=_child_entry, args=(child_end, self.barriers), name=f"bench-enqueuer-{i}",
                               daemon=True)
            proc.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.procs.append(proc)

    def _recv(self, pipe: Any, expect: str) -> Any:
        if not pipe.poll(RECV_TIMEOUT_S):
            raise RuntimeError("an enqueuing process did not answer in time")
        kind, value = pipe.recv()
        if kind != expect:
            raise RuntimeError(f"an enqueuing process failed:\n{value}")
        return value

    def setup(self, spec: dict[str, Any]) -> None:
        for pipe in self.pipes:
            pipe.send(("setup", spec))
        for pipe in self.pipes:
            self._recv(pipe, "ok")

    def run(self, k: int, side: str, per_proc: int) -> tuple[int, float]:
        pipes = self.pipes[:k]
        for i, pipe in enumerate(pipes):
            pipe.send(("run", {"side": side, "n": per_proc, "start": i * per_proc, "level": k}))
        for pipe in pipes:
            self._recv(pipe, "ready")
        self.barriers[k].wait()
        results = [self._recv(pipe, "done") for pipe in pipes]
        return sum(r[0] for r in results), max(r[2] for r in results) - min(r[1] for r in results)

    def close(self) -> None:
        for pipe, proc in zip(self.pipes, self.procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)


def _child_entry(pipe: Any, barriers: dict[int, Any]) -> None:
    """A child that picks the barrier of each run's level (all levels share one process set)."""

    class _LevelBarrier:
        level = 1

        def wait(self) -> None:
            barriers[self.level].wait()

    barrier = _LevelBarrier()
    original_recv = pipe.recv

    def recv() -> Any:
        msg = original_recv()
        if msg is not None and msg[0] == "run":
            barrier.level = msg[1]["level"]
        return msg

    pipe.recv = recv  # type: ignore[method-assign]
    _child(pipe, barrier)


def _count_wakes(listener: Any) -> int:
    return sum(1 for _ in listener.notifies(timeout=0.2, stop_after=None)) if listener is not None else 0


def run_enqueue_procs(env: Env, levels: tuple[int, ...], per_proc: int, reps: int,
                      log: Callable[[str], None]) -> dict[str, Any]:
    """Every side at every level, ``reps`` repetitions, the sides' order rotating per
    repetition; medians and per-repetition ratios (library / its floor)."""
    pg = env.kind == "postgresql"
    if not pg:
        levels = tuple(k for k in levels if k in SQLITE_LEVELS)
    sides = SIDES_PG if pg else SIDES_SQLITE
    table = f'"{env.schema}".{WIDE}' if pg else WIDE
    # the floor table: the library's own columns, defaults, constraints and indexes
    if pg:
        env.execute(f"CREATE TABLE {table} (LIKE {env.jobs} INCLUDING ALL)")
    else:
        ddl = env.scalar("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'alkstore_jobs'")
        env.execute(ddl.replace("alkstore_jobs", WIDE, 1))
        for (idx,) in env.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'alkstore_jobs' AND sql IS NOT NULL"
        ):
            env.execute(idx.replace("alkstore_jobs", WIDE).replace("CREATE INDEX ", f"CREATE INDEX {WIDE}_", 1)
                        .replace("CREATE UNIQUE INDEX ", f"CREATE UNIQUE INDEX {WIDE}_", 1))
    wake = env.store.backend.wake_key(QUEUE)
    listener = None
    if pg:
        listener = env.raw_connect()
        listener.execute(f'LISTEN "{wake}"')
    pool = _Pool(max(levels))
    out: dict[str, Any] = {"levels": {}, "per_proc": per_proc, "sides": list(sides)}
    try:
        pool.setup({"kind": env.kind, "url": env.url, "schema": env.schema, "sqlite_path": env.sqlite_path,
                    "dsn": env.dsn, "table": table, "wake": wake, "sides": list(sides)})
        _count_wakes(listener)  # the warm-up's
        for k in levels:
            rates: dict[str, list[float]] = {s: [] for s in sides}
            wakes = 0
            for rep in range(reps):
                order = sides[rep % len(sides):] + sides[: rep % len(sides)]
                for side in order:
                    env.truncate(env.jobs, table)
                    env.settle()
                    done, seconds = pool.run(k, side, per_proc)
                    rates[side].append(done / seconds)
                    sent = _count_wakes(listener)  # the floor with pg_notify sends on the same channel
                    if side.startswith("alk"):
                        wakes += sent
            level: dict[str, Any] = {s: statistics.median(r) for s, r in rates.items()}
            for a, f in PAIRS:
                if a in rates:
                    level[f"{a}_ratio"] = statistics.median(x / y for x, y in zip(rates[a], rates[f], strict=True))
            level["wakes"] = wakes
            out["levels"][k] = level
            log(f"  [{env.kind}] enqueue x{k:<2} " + "  ".join(f"{s} {level[s]:,.0f}/s" for s in sides)
                + f"  q.enqueue/floor {level['alk_ratio']:.2f}"
                + (f"  session/floor {level['alk_session_ratio']:.2f}" if pg else "") + f"  wakes {wakes}")
    finally:
        pool.close()
        if listener is not None:
            listener.close()
        env.truncate(env.jobs)
        env.execute(f"DROP TABLE {table}")
    return out


def render(results: dict[str, Any]) -> list[str]:
    """Markdown for the report: one table per engine."""
    lines: list[str] = []
    for kind, res in results.items():
        pg = kind == "postgresql"
        lines.append("")
        lines.append(
            f"Concurrent enqueue, {'PostgreSQL' if pg else 'SQLite'}: N processes, one job per transaction, "
            f"{res['per_proc']:,} jobs per process and side (floor: the same-width row into a table with "
            "the same indexes, "
            + ("`LIKE alkstore_jobs INCLUDING ALL`; target: ratios >= 0.8)" if pg
               else "`alkstore_jobs`'s own DDL and indexes; one writer at a time, so 4 processes at most)")
        )
        lines.append("")
        if pg:
            lines.append("| processes | floor `INSERT` | floor + `pg_notify` | `q.enqueue` | ratio | "
                         "Session `INSERT` + commit | `alk.enqueue(session)` + commit | ratio | wakes sent |")
            lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for k, lv in res["levels"].items():
                lines.append(
                    f"| {k} | {lv['floor']:,.0f}/s | {lv['floor_notify']:,.0f}/s | {lv['alk']:,.0f}/s | "
                    f"{lv['alk_ratio']:.2f}× | {lv['floor_session']:,.0f}/s | {lv['alk_session']:,.0f}/s | "
                    f"{lv['alk_session_ratio']:.2f}× | {lv['wakes']} |"
                )
        else:
            lines.append("| processes | floor `INSERT` | `q.enqueue` | ratio |")
            lines.append("|---:|---:|---:|---:|")
            for k, lv in res["levels"].items():
                lines.append(f"| {k} | {lv['floor']:,.0f}/s | {lv['alk']:,.0f}/s | {lv['alk_ratio']:.2f}× |")
    return lines
