"""The claim stays an index scan with a million pending rows, on both engines.

One queue holds 1,000,000 pending rows (mixed priorities, some delayed, some with an
expiry), beside lapsed/live/exhausted processing rows of the same queue, other queues'
rows and dead rows; the tables are ANALYZEd. The test takes the exact SQL the backend
runs (``store.backend._sql``, compiled by a real ``claim_one``) and asks the database for
its plan with the same parameters:

- PostgreSQL: ``EXPLAIN (FORMAT JSON)`` with the store's clock and with the database clock
  (``now`` NULL, the production default), and the *generic* plan of the prepared statement
  (psycopg prepares a statement after a few executions, and PostgreSQL may then switch to
  a generic plan that cannot see the parameter values).
- SQLite: ``EXPLAIN QUERY PLAN`` of the claim and of the two statements that move
  exhausted reclaimables first (they run on every claim).

The pending scan must read ``alkstore_jobs_pending_ix`` as a walk of the queue's distinct
priorities (one probe each) and, per priority, an ordered range bounded by ``run_at <= now``
(no sort of the candidates, so the LIMIT stops it after n rows, and delayed rows of higher
priorities are never read one by one), and nothing may scan the jobs table sequentially. ``stats()`` of a small queue must not scan the big queue's rows either.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import alkstore_sa as alk
from tests.support import FakeClock, Target, sqlite_target

pytestmark = pytest.mark.slow

N = 1_000_000
BIG = "big"
SMALL = "other-3"
OTHER_ROWS = 20_000  # spread over 20 other queues
PROCESSING_ROWS = 2_000
DEAD_ROWS = 20_000
PENDING_IX = "alkstore_jobs_pending_ix"
TABLES = ("alkstore_jobs", "alkstore_dead_jobs")

COLS = (
    "state, queue, payload, priority, attempts, max_attempts, visibility_timeout, backoff_base,"
    " created_at, run_at, expires_at, errors, claimed_at, claim_expires_at, worker_id"
)
DEAD_COLS = (
    "id, queue, payload, priority, attempts, max_attempts, visibility_timeout, backoff_base,"
    " created_at, run_at, errors, last_error, died_at"
)


def load_rows(target: Target, now: float) -> None:
    """Bulk-load the big table with set-based SQL (one statement per row family)."""
    jobs, dead = target.table("alkstore_jobs"), target.table("alkstore_dead_jobs")
    if target.kind == "postgresql":
        def series(n: int) -> str:
            return f"FROM generate_series(1, {n}) AS s(g)"
    else:
        def series(n: int) -> str:
            return f"FROM (WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n}) SELECT g FROM s)"

    # the big queue: priorities -1..1, ready over the last day, every 10th delayed two
    # days, every 7th with a future expiry
    target.execute(f"""
        INSERT INTO {jobs} ({COLS})
        SELECT 'pending', '{BIG}', '{{"n": ' || g || '}}', (g % 3) - 1, 0, 3, 300, 5,
               {now} - 86400 + g * 0.01,
               {now} - 86400 + g * 0.05 + CASE WHEN g % 10 = 0 THEN 172800 ELSE 0 END,
               CASE WHEN g % 7 = 0 THEN {now} + 3600 ELSE NULL END, '[]', NULL, NULL, NULL
        {series(N)}""")
    # the big queue's claimed rows: half lapsed, half live; a third on their last attempt
    target.execute(f"""
        INSERT INTO {jobs} ({COLS})
        SELECT 'processing', '{BIG}', '{{}}', 0, 1 + g % 3, 3, 300, 5, {now} - 1000,
               {now} - 1000, NULL, '[]', {now} - 900, {now} - {PROCESSING_ROWS // 2} + g, 'w'
        {series(PROCESSING_ROWS)}""")
    target.execute(f"""
        INSERT INTO {jobs} ({COLS})
        SELECT 'pending', 'other-' || (g % 20), '{{}}', 0, 0, 3, 300, 5, {now} - 100,
               {now} - 100, NULL, '[]', NULL, NULL, NULL
        {series(OTHER_ROWS)}""")
    target.execute(f"""
        INSERT INTO {dead} ({DEAD_COLS})
        SELECT 100000000 + g, CASE WHEN g % 100 = 0 THEN '{SMALL}' ELSE '{BIG}' END, '{{}}', 0,
               3, 3, 300, 5, {now} - 5000, {now} - 5000, '[]', 'failed', {now} - 4000
        {series(DEAD_ROWS)}""")
    target.execute("ANALYZE" if target.kind == "sqlite" else f"ANALYZE {jobs}")
    if target.kind == "postgresql":
        target.execute(f"ANALYZE {dead}")


@dataclass
class Loaded:
    target: Target
    store: alk.Store
    now: float
    load_seconds: float

    @property
    def kind(self) -> str:
        return self.target.kind

    def sql(self, key: str) -> str:
        return self.store.backend._sql[key]


def _load(target: Target) -> Iterator[Loaded]:
    clock = FakeClock(start=round(time.time(), 3))  # data relative to the real clock too
    started = time.perf_counter()
    load_rows(target, clock())
    store = target.store(clock=clock)
    try:
        q = store.queue(BIG)
        assert q.claim_one("w-explain") is not None  # compiles "claim" (and moves exhausted)
        assert q.stats().pending >= N - 1  # compiles "stats"
        yield Loaded(target, store, clock(), time.perf_counter() - started)
    finally:
        store.close()


@pytest.fixture(scope="module")
def _sqlite_loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    target = sqlite_target(str(tmp_path_factory.mktemp("explain")))
    try:
        yield from _load(target)
    finally:
        target.engine.dispose()


@pytest.fixture(scope="module")
def _postgresql_loaded(_pg_module_target: Target) -> Iterator[Loaded]:
    yield from _load(_pg_module_target)


@pytest.fixture(params=["sqlite", "postgresql"])
def loaded(request: pytest.FixtureRequest) -> Loaded:
    return request.getfixturevalue(f"_{request.param}_loaded")


@pytest.fixture
def pg_loaded(_postgresql_loaded: Loaded) -> Loaded:
    return _postgresql_loaded


# -- PostgreSQL plans ---------------------------------------------------------------------


def pg_explain(target: Target, sql: str, params: dict[str, Any], analyze: bool = False) -> tuple[dict[str, Any], str]:
    """(JSON plan, text plan) of a statement, with psycopg binding the parameters.
    ``analyze``: run it (rolled back), for the subplans a plain EXPLAIN cannot show: the
    step of a recursive CTE gets its expressions only once it runs."""
    option = "ANALYZE" if analyze else "COSTS"
    raw = target.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(f"EXPLAIN (FORMAT JSON, {option}) " + sql, params)
        plan = cur.fetchone()[0][0]["Plan"]
        cur.execute(f"EXPLAIN ({option}) " + sql, params)
        text = "\n".join(r[0] for r in cur.fetchall())
        raw.rollback()
    finally:
        raw.close()
    return plan, text


def pg_explain_generic(target: Target, sql: str, params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The generic plan of the statement as a server-side prepared statement, run (rolled
    back) as pg_explain's ``analyze`` does."""
    from psycopg import sql as psql

    names: list[str] = []

    def positional(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", positional, sql).replace("%%", "%")
    args = psql.SQL(", ").join(psql.Literal(params[n]) for n in names)
    raw = target.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE alkstore_explain_claim AS " + prepared)
        try:
            execute = psql.SQL("EXECUTE alkstore_explain_claim({})").format(args)
            cur.execute(psql.SQL("EXPLAIN (FORMAT JSON, ANALYZE) ") + execute)
            plan = cur.fetchone()[0][0]["Plan"]
            cur.execute(psql.SQL("EXPLAIN (ANALYZE) ") + execute)
            text = "\n".join(r[0] for r in cur.fetchall())
        finally:
            cur.execute("DEALLOCATE alkstore_explain_claim")
        raw.rollback()
    finally:
        raw.close()
    return plan, text


def walk(node: dict[str, Any], up: tuple[dict[str, Any], ...] = ()) -> Iterator[tuple[dict[str, Any], tuple[dict[str, Any], ...]]]:
    yield node, up
    for child in node.get("Plans", []):
        yield from walk(child, (*up, node))


def pg_table_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n for n, _ in walk(plan)
        if n.get("Relation Name") in TABLES and n["Node Type"] != "ModifyTable"
    ]


def assert_pg_claim_plan(plan: dict[str, Any], text: str) -> None:
    scans = pg_table_scans(plan)
    assert scans, text
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (
            f"{scan['Node Type']} on {scan['Relation Name']} in the claim plan:\n{text}"
        )
    pending = [(n, up) for n, up in walk(plan) if n.get("Index Name") == PENDING_IX]
    # two reads of the claim index: the walk of the queue's priorities (one probe per
    # priority, "max(priority) < p"), and per priority the ready rows as a range bounded by
    # run_at <= now — so delayed rows of higher priorities are never read one by one
    assert len(pending) == 2, f"the pending scan must use {PENDING_IX} (walk + ranges):\n{text}"
    for scan, _ in pending:
        assert "queue" in scan.get("Index Cond", ""), text
    walks = [(n, up) for n, up in pending if "priority <" in n.get("Index Cond", "")]
    ranges = [(n, up) for n, up in pending if re.search(r"priority = .*run_at <=", n.get("Index Cond", ""))]
    assert len(walks) == 1 and len(ranges) == 1, f"a priority walk and a run_at-bounded range:\n{text}"
    assert walks[0][1][-1]["Node Type"] == "Limit", f"each walk step must be a one-row probe:\n{text}"
    scan, up = ranges[0]
    # up to the CTE that holds it: LIMIT n over the nested loop over the walk, and per
    # priority a LIMIT over the locking, ordered range read; no Sort of the candidates
    cte = next(i for i in range(len(up) - 1, -1, -1) if up[i].get("Subplan Name", "").startswith("CTE"))
    between = [n["Node Type"] for n in up[cte:]]
    assert "Sort" not in between and "Incremental Sort" not in between, (
        f"the pending candidates are sorted instead of read in index order:\n{text}"
    )
    assert between[0] == "Limit" and between[1] == "Nested Loop", f"LIMIT n over the walk:\n{text}"
    outer = up[cte + 1]["Plans"][0]
    assert outer["Node Type"] == "CTE Scan" and outer.get("CTE Name") == "pr", f"the walk drives the loop:\n{text}"
    assert between[-2:] == ["Limit", "LockRows"], f"per priority: LIMIT over the locking range read:\n{text}"


def claim_params(n: int, now: float | None) -> dict[str, Any]:
    return {"queue": BIG, "worker_id": "w-explain", "n": n, "now": now}


@pytest.mark.parametrize("n", [1, 100])
@pytest.mark.parametrize("clock", ["store-clock", "database-clock"])
def test_pg_claim_plan_is_an_index_scan(pg_loaded: Loaded, n: int, clock: str) -> None:
    now = pg_loaded.now if clock == "store-clock" else None
    plan, text = pg_explain(pg_loaded.target, pg_loaded.sql("claim"), claim_params(n, now), analyze=True)
    print(f"\nPostgreSQL claim plan (n={n}, {clock}):\n{text}")
    assert_pg_claim_plan(plan, text)


@pytest.mark.parametrize("clock", ["store-clock", "database-clock"])
def test_pg_generic_claim_plan_is_an_index_scan(pg_loaded: Loaded, clock: str) -> None:
    """What a long-lived worker connection ends up running: psycopg auto-prepares the claim,
    and PostgreSQL may then use a generic plan blind to the queue name and clock."""
    now = pg_loaded.now if clock == "store-clock" else None
    plan, text = pg_explain_generic(
        pg_loaded.target, pg_loaded.sql("claim"), claim_params(10, now)
    )
    print(f"\nPostgreSQL generic claim plan ({clock}):\n{text}")
    assert "$1" in text or "$2" in text, f"not a generic plan:\n{text}"
    assert_pg_claim_plan(plan, text)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_pg_claim_of_turns_plan_is_index_scans(pg_loaded: Loaded, generic: bool) -> None:
    """Queues taking turns (one statement): every turn reads the claim index the way the
    single claim does — the priority walk and the run_at-bounded ranges, by queue — and no
    table is scanned, in the custom plan and in the generic one a worker's prepared
    statement ends up with."""
    backend = pg_loaded.store.backend
    sql = backend.sql("claim:turns", backend._claim_turns_statement)
    params = {"queues": ["explain-empty", BIG], "worker_id": "w-explain", "n": 10, "budget": 15,
              "now": pg_loaded.now}
    explain = pg_explain_generic if generic else functools.partial(pg_explain, analyze=True)
    plan, text = explain(pg_loaded.target, sql, params)
    print(f"\nPostgreSQL claim of turns plan ({'generic' if generic else 'custom'}):\n{text}")
    scans = pg_table_scans(plan)
    assert scans, text
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (
            f"{scan['Node Type']} on {scan['Relation Name']} in the claim of turns:\n{text}"
        )
    pending = [n for n, _ in walk(plan) if n.get("Index Name") == PENDING_IX]
    assert all("queue" in n.get("Index Cond", "") for n in pending), text
    assert any("priority <" in n.get("Index Cond", "") for n in pending), f"the priority walk:\n{text}"
    assert any(re.search(r"priority = .*run_at <=", n.get("Index Cond", "")) for n in pending), text
    assert "Sort Key: j.run_at" not in text, f"ready rows sorted instead of read in index order:\n{text}"


# -- SQLite plans -------------------------------------------------------------------------


def sqlite_eqp(target: Target, sql: str, params: dict[str, Any]) -> list[tuple[int, int, str]]:
    raw = target.engine.raw_connection()
    try:
        rows = raw.dbapi_connection.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
    finally:
        raw.close()
    return [(r[0], r[1], r[3]) for r in rows]


def eqp_text(rows: list[tuple[int, int, str]]) -> str:
    depth: dict[int, int] = {0: -1}
    out = []
    for node, parent, detail in rows:
        depth[node] = depth.get(parent, -1) + 1
        out.append("  " * depth[node] + detail)
    return "\n".join(out)


TABLE_ACCESS = re.compile(r"^(SCAN|SEARCH) (?:main\.)?(alkstore_jobs|alkstore_dead_jobs)\b(.*)$")


def assert_sqlite_no_table_scan(rows: list[tuple[int, int, str]]) -> list[str]:
    text = eqp_text(rows)
    accesses = [m for _, _, d in rows if (m := TABLE_ACCESS.match(d))]
    assert accesses, text
    for m in accesses:
        assert m.group(1) == "SEARCH", f"full scan of {m.group(2)}:\n{text}"
        assert re.match(r" USING (COVERING INDEX alkstore_\w+|INDEX alkstore_\w+|INTEGER PRIMARY KEY)", m.group(3)), (
            f"{m.group(0)}:\n{text}"
        )
    return [m.group(0) for m in accesses]


@pytest.mark.parametrize("n", [1, 100])
def test_sqlite_claim_plan_is_an_index_scan(_sqlite_loaded: Loaded, n: int) -> None:
    loaded = _sqlite_loaded
    params = claim_params(n, loaded.now)
    rows = sqlite_eqp(loaded.target, loaded.sql("claim"), params)
    text = eqp_text(rows)
    print(f"\nSQLite claim plan (n={n}):\n{text}")
    assert_sqlite_no_table_scan(rows)
    # the ready rows: per priority of the walk (the IN list), a range bounded by run_at
    pending = [
        (node, parent) for node, parent, d in rows
        if f"USING INDEX {PENDING_IX} (queue=? AND priority=? AND run_at<?)" in d
    ]
    assert len(pending) == 1, f"the pending scan must use {PENDING_IX}, bounded by run_at:\n{text}"
    # the walk's probes, and past its last level the one ordered scan below it: both
    # ranges of the claim index, neither sorted
    below = [(node, parent) for node, parent, d in rows if f"USING INDEX {PENDING_IX} (queue=? AND priority<?)" in d]
    assert len(below) == 2, f"the priority walk and the scan below it must read {PENDING_IX}:\n{text}"
    for _, parent in below:
        assert not any("TEMP B-TREE" in d for _, p, d in rows if p == parent), text
    _, parent = pending[0]
    siblings = [d for _, p, d in rows if p == parent]
    assert not any("TEMP B-TREE" in d for d in siblings), (
        f"the pending candidates are sorted instead of read in index order:\n{text}"
    )
    # the UPDATE finds each picked row by its rowid, not by scanning the table
    assert any(re.match(r"SEARCH (main\.)?alkstore_jobs USING INTEGER PRIMARY KEY", d) for _, _, d in rows), text


@pytest.mark.parametrize("key", ["claim:bury", "claim:drop"])
def test_sqlite_exhausted_move_plan_is_an_index_scan(_sqlite_loaded: Loaded, key: str) -> None:
    """The exhausted-reclaim move runs before every claim: it must not scan the table."""
    loaded = _sqlite_loaded
    rows = sqlite_eqp(loaded.target, loaded.sql(key), {"queue": BIG, "now": loaded.now})
    print(f"\nSQLite {key} plan:\n{eqp_text(rows)}")
    accesses = assert_sqlite_no_table_scan(rows)
    assert all("alkstore_jobs_processing_ix" in a for a in accesses), eqp_text(rows)


# -- stats ---------------------------------------------------------------------------------


def test_stats_of_a_small_queue_reads_only_its_rows(loaded: Loaded) -> None:
    """stats() of one queue is five index range counts: it never reads the big queue."""
    params = {"queue": SMALL, "now": loaded.now}
    if loaded.kind == "postgresql":
        plan, text = pg_explain(loaded.target, loaded.sql("stats"), params)
        print(f"\nPostgreSQL stats plan ({SMALL}):\n{text}")
        scans = pg_table_scans(plan)
        assert len(scans) == 5, text
        for scan in scans:
            assert scan["Node Type"] != "Seq Scan", f"Seq Scan on {scan['Relation Name']}:\n{text}"
    else:
        rows = sqlite_eqp(loaded.target, loaded.sql("stats"), params)
        print(f"\nSQLite stats plan ({SMALL}):\n{eqp_text(rows)}")
        assert len(assert_sqlite_no_table_scan(rows)) == 5


def test_claim_on_the_loaded_table(loaded: Loaded) -> None:
    """A batch claim on the loaded table hands out jobs of the big queue (the load and claim
    times are printed for the record; speed is the benchmarks' business, not asserted)."""
    q = loaded.store.queue(BIG)
    started = time.perf_counter()
    handles = q.claim_batch("w-explain", 100)
    elapsed = time.perf_counter() - started
    print(f"\n{loaded.kind}: load+ANALYZE {loaded.load_seconds:.1f}s, claim_batch(100) {elapsed * 1000:.1f}ms")
    assert len(handles) == 100
    assert all(h.job.queue == BIG and h.job.attempts >= 1 for h in handles)
