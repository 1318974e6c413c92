"""A worker's claim keeps reading by index as its queue grows from nothing.

psycopg prepares the claim on a long-lived connection after five runs; PostgreSQL may then
switch to one generic plan, made from the table as it was at that moment and kept until an
ANALYZE invalidates it (never, with autovacuum off). A claim first prepared while its queue
was empty — a worker started before any job — must not keep a plan made for an empty
table: one that joins the claimed rows back by a sequential scan took 16 ms per claim once
50,000 jobs had arrived (docs/performance.md, "The claim's plan"). PostgreSQL does switch
the claim to its generic plan (2026-12-07: thousands of generic plans, five custom), so that
generic plan, made here on an empty table, is the one that must still read by index.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql as psql

from tests.support import Target

CLAIM = "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s"


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    found = [(node["Node Type"], node.get("Relation Name", ""))]
    for child in node.get("Plans", []):
        found += _scans(child)
    return found


def test_a_claim_prepared_on_an_empty_queue_reads_by_index_once_it_grew(pg_db: Target) -> None:
    with pg_db.store() as store:
        q = store.queue("plan-growth")
        for _ in range(12):  # prepared (psycopg: after 5 runs) while the table is empty
            assert q.claim_batch("w", 8) == []
        for start in range(0, 20_000, 2_000):
            q.enqueue_many(list(range(start, start + 2_000)))
        for _ in range(10):
            assert q.ack_batch(q.claim_batch("w", 8)) == 8
        claim = next(v for k, v in store.backend._sql.items() if k.split("#")[0] == "claim")
        names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", claim)))
        values = {"queue": "plan-growth", "worker_id": "w", "n": 8, "now": None}
        held = store._conns.take()  # the connection those claims ran on (the last one back)
        try:
            conn = held.dbapi
            (name,) = conn.execute(CLAIM, ("%SKIP LOCKED%",)).fetchone()
            args = psql.SQL(", ").join(psql.Literal(values[n]) for n in names)
            query = psql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(psql.Identifier(name), args)
            # the generic plan itself, whichever plan PostgreSQL's heuristic would pick now
            conn.execute("SET plan_cache_mode = force_generic_plan")
            try:
                plan = conn.execute(query).fetchone()[0][0]["Plan"]
            finally:
                conn.execute("RESET plan_cache_mode")
        finally:
            store._conns.give(held)
    seq = [s for s in _scans(plan) if s[0] == "Seq Scan" and s[1].startswith("alkstore_")]
    assert not seq, f"the claim the worker's connection runs now scans {seq}"
