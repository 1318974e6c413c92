"""The claim-ordered pages (ready, scheduled) resume after a key that holds a job's
``run_at`` as stored (a float); it must come back exact, whatever the PostgreSQL session's
``extra_float_digits`` (0 by default up to PostgreSQL 11, and settable per role or
database: ``ALTER ROLE app SET extra_float_digits = 0``), under which the server writes a
double with 15 significant digits only."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.dashboard.reads import PAGE, Cursor, jobs_page
from tests.support import Target


@pytest.mark.parametrize("state", ["ready", "scheduled"])
def test_paging_is_exact_when_the_server_rounds_floats(pg_db: Target, qname: str, state: str) -> None:
    """Jobs whose run_at carries microseconds (16 significant digits as epoch seconds): the
    second page's key, read rounded, matched no job's run_at, so the page started past
    the jobs at the rounded value or repeated some (was: jobs missing from the pages)."""
    url = sa.make_url(pg_db.url).update_query_dict({"options": "-c extra_float_digits=0"})
    store = alk.Store(url, schema=pg_db.schema)
    try:
        with store.engine.connect() as conn:  # the setting this test is about is in force
            assert conn.exec_driver_sql("SHOW extra_float_digits").scalar() == "0"
        q = store.queue(f"{qname}-{state}")
        now = datetime.now(timezone.utc).replace(microsecond=0)
        base = now + (timedelta(days=1) if state == "scheduled" else -timedelta(days=1))
        # 10 µs apart, each 4 µs past a multiple of 10: the 15 digits round each one down, to
        # a value below its own (the next page then started at the last job again)
        ids = [q.enqueue({"i": i}, run_at=base + timedelta(microseconds=10 * i + 4)) for i in range(PAGE + 20)]
        seen: list[int] = []
        cursor = Cursor()
        for _ in range(5):
            page = jobs_page(store, q.name, state, cursor)
            seen += [j.id for j in page.jobs]
            if page.next_query is None:
                break
            nq = page.next_query
            cursor = Cursor(int(str(nq["after"])), int(str(nq["priority"])), float(str(nq["run_at"])))
        assert seen == ids
    finally:
        store.close()
