"""Server-side time of one enqueue on PostgreSQL (issue 11, goal 2): ``EXPLAIN (ANALYZE)`` of
the library's enqueue statement beside the raw INSERT of a row of the same width into a
table with the same indexes, interleaved; planning and execution medians.

``python -m benchmarks.server_time [N]`` (default N = 300). ``pg_stat_statements`` would
say the same with the commit included, but it must be preloaded (a server restart)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import psycopg
import sqlalchemy as sa

from alkstore_sa.queue import enqueue_params
from alkstore_sa.schema import jobs
from benchmarks.enqueue_procs import WIDE, _wide_insert
from benchmarks.env import make_env

QUEUE = "bench-server-time"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    n = int(args[0]) if args else 300
    env = make_env("postgresql")
    try:
        table = f'"{env.schema}".{WIDE}'
        env.execute(f"CREATE TABLE {table} (LIKE {env.jobs} INCLUDING ALL)")
        q = env.store.queue(QUEUE)
        q.enqueue({"warm": True})  # compiles the library's statement
        backend = env.store.backend
        library = backend._sql["enqueue"]
        bare = backend.sql(
            "enqueue:bare",
            lambda: sa.insert(jobs)
            .values(backend._enqueue_values(sa.bindparam("payload", type_=sa.Text)))
            .returning(jobs.c.id),
        )
        payload = json.dumps({"user_id": 1, "action": "send_welcome_email", "locale": "en", "key": "k-00000001"})
        conn = psycopg.connect(env.dsn, autocommit=True)
        cur = psycopg.ClientCursor(conn)

        def params() -> dict[str, object]:
            p = enqueue_params(env.store, QUEUE, q.opts, delay=None, run_at=None, priority=0,
                               max_attempts=None, expires=None)
            p["payload"] = payload
            return p

        forms: dict[str, Callable[[], str]] = {
            "raw same-width INSERT ... RETURNING id": lambda: cur.mogrify(
                _wide_insert("postgresql", table), (QUEUE, payload, time.time(), time.time())
            ),
            "library INSERT without any wake": lambda: cur.mogrify(bare, params()),
            "library enqueue (conditional wake, nobody waiting)": lambda: cur.mogrify(library, params()),
        }
        spent: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in forms}
        for _ in range(n):
            for name, text in forms.items():
                plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text()).fetchone()[0][0]  # type: ignore[index]
                spent[name][0].append(plan["Planning Time"])
                spent[name][1].append(plan["Execution Time"])
        conn.close()
        print(f"server time per statement, medians of {n} (EXPLAIN ANALYZE, interleaved):")
        for name, (planning, execution) in spent.items():
            print(f"  {name}: planning {statistics.median(planning) * 1000:.0f} us, "
                  f"execution {statistics.median(execution) * 1000:.0f} us")
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
