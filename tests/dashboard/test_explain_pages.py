"""The dashboard's job pages stay index range reads stopped by their LIMIT with a million
pending rows, on both engines (the table of tests/compile/test_explain.py).

- ready / scheduled pages (first, and resumed after a key in the middle): every read of
  the jobs table is a range of the pending index under a LIMIT, one priority at a time,
  never a sort of the queue's rows (ordered by id, PostgreSQL walked the primary key and
  SQLite read a small queue's page by scanning the whole table);
- the processing page reads the processing index (not the primary key from the start);
- a queue's dead letters read the dead table by index, never by a full scan.
"""

from __future__ import annotations

from typing import Any

import pytest

from alkstore_sa.dashboard.reads import LISTED, Cursor, jobs_page
from tests.compile.test_explain import (  # noqa: F401 - the loaded-table fixtures
    BIG,
    PENDING_IX,
    Loaded,
    _postgresql_loaded,
    _sqlite_loaded,
    assert_sqlite_no_table_scan,
    eqp_text,
    pg_explain,
    pg_table_scans,
    sqlite_eqp,
    walk,
)

pytestmark = pytest.mark.slow

PROCESSING_IX = "alkstore_jobs_processing_ix"


@pytest.fixture(params=["sqlite", "postgresql"])
def table(request: pytest.FixtureRequest) -> Loaded:
    """The loaded million-row table of each engine."""
    return request.getfixturevalue(f"_{request.param}_loaded")  # type: ignore[no-any-return]


def _plan(table: Loaded, key: str, params: dict[str, Any]) -> tuple[Any, str]:
    if table.kind == "postgresql":
        plan, text = pg_explain(table.target, table.sql(key), params)
        return plan, text
    rows = sqlite_eqp(table.target, table.sql(key), params)
    return rows, eqp_text(rows)


@pytest.mark.parametrize("state", ["ready", "scheduled"])
def test_pending_pages_are_limited_ranges_of_the_pending_index(table: Loaded, state: str) -> None:
    """Each statement of a page (the walk of the queue's priorities, then per priority a
    range bounded by the state's side of ``run_at``; resumed: the key's tie and later
    rows first) reads the pending index as a range the LIMIT stops: no sort, no walk past
    the other state's rows."""
    store = table.store
    first = jobs_page(store, BIG, state)
    assert len(first.jobs) == 50 and first.next_query is not None
    middle = store.get_job(400_000 if state == "ready" else 400_000 - 400_000 % 10)
    assert middle is not None and middle.state == "pending"
    cursor = Cursor(middle.id, middle.priority, middle.run_at.timestamp())
    assert len(jobs_page(store, BIG, state, cursor).jobs) == 50
    params: dict[str, Any] = {
        "queue": BIG, "after": middle.id, "limit": 51, "now": table.now, "preview": LISTED,
        "priority": middle.priority, "run_at": middle.run_at.timestamp(),
    }
    for key in (f"pending_page:{state}", f"pending_page:{state}:tie", f"pending_page:{state}:later"):
        plan, text = _plan(table, key, params)
        print(f"\n{table.kind} {key}:\n{text}")
        if table.kind == "postgresql":
            scans = pg_table_scans(plan)
            assert len(scans) == 1, text
            for node, up in walk(plan):
                if node in scans:
                    assert node["Node Type"] == "Index Scan" and node["Index Name"] == PENDING_IX, text
                    assert "priority =" in node["Index Cond"] and "run_at" in node["Index Cond"], text
                    assert up[-1]["Node Type"] == "Limit", f"an index range the LIMIT stops:\n{text}"
        else:
            accesses = assert_sqlite_no_table_scan(plan)
            assert len(accesses) == 1 and PENDING_IX in accesses[0] and "priority=?" in accesses[0], text
            assert "TEMP B-TREE" not in text, f"the page is sorted instead of read in index order:\n{text}"
    # the walk of the priorities is the claim's own, pinned by tests/compile/test_explain.py


def test_processing_page_reads_the_processing_index(table: Loaded) -> None:
    assert len(jobs_page(table.store, BIG, "processing").jobs) == 50
    plan, text = _plan(table, "processing_page", {"queue": BIG, "after": 0, "limit": 51, "now": table.now, "preview": LISTED})
    print(f"\n{table.kind} processing_page:\n{text}")
    if table.kind == "postgresql":
        scans = pg_table_scans(plan)
        assert [s.get("Index Name") for s in scans] == [PROCESSING_IX], text
    else:
        accesses = assert_sqlite_no_table_scan(plan)
        assert len(accesses) == 1 and PROCESSING_IX in accesses[0], text


def test_dead_page_of_a_queue_is_an_index_read(table: Loaded) -> None:
    assert len(jobs_page(table.store, BIG, "dead").jobs) == 50
    plan, text = _plan(table, "dead_page:True:True", {"queue": BIG, "after": 0, "limit": 51, "now": table.now, "preview": LISTED})
    print(f"\n{table.kind} dead_page:\n{text}")
    if table.kind == "postgresql":
        assert all(s["Node Type"] in ("Index Scan", "Index Only Scan") for s in pg_table_scans(plan)), text
    else:
        assert len(assert_sqlite_no_table_scan(plan)) == 1


@pytest.mark.parametrize("by_queue", [True, False], ids=["one queue", "every queue"])
def test_dead_letters_page_newest_first_is_an_index_read(table: Loaded, by_queue: bool) -> None:
    """``/dead`` (every queue: the primary key) and ``/dead?queue=Q`` (the queue index),
    newest first, first page and a page after a key: index ranges the LIMIT stops."""
    from alkstore_sa.dashboard.reads import dead_page

    first = dead_page(table.store, BIG if by_queue else None, None)
    assert len(first.jobs) == 50 and first.next_query is not None
    for before in (2**63 - 1, int(str(first.next_query["before"]))):
        params: dict[str, Any] = {"before": before, "limit": 51, "preview": LISTED}
        if by_queue:
            params["queue"] = BIG
        plan, text = _plan(table, f"dead_page:{by_queue}:False", params)
        print(f"\n{table.kind} dead_page:{by_queue}:False:\n{text}")
        if table.kind == "postgresql":
            scans = pg_table_scans(plan)
            assert scans and all(s["Node Type"] in ("Index Scan", "Index Only Scan") for s in scans), text
            assert "Sort" not in text, text
        else:
            assert len(assert_sqlite_no_table_scan(plan)) == 1, text
            assert "TEMP B-TREE" not in text, text
