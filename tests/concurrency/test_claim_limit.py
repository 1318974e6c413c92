"""``claim_batch(n)`` never returns more than n, with several concurrent claimers on a large
table whose planner statistics are stale (SPEC §5.3; STYLE "Traps": an
``UPDATE … WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)`` can update more than n
rows on PostgreSQL when the planner re-runs the subquery).

The table is ANALYZEd while empty (autovacuum off, so nothing refreshes the statistics),
then filled with raw SQL: the planner believes it is empty. Some rows are lapsed claims, so
both candidate scans (ready pending, reclaimable processing) feed every claim."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.concurrency import harness, workers
from tests.conftest import require_pg
from tests.support import Target, drop_pg_schema, new_pg_schema, pg_target, sqlite_target

PENDING_ROWS = {"postgresql": 50_000, "sqlite": 20_000}
LAPSED_ROWS = {"postgresql": 5_000, "sqlite": 2_000}
SIZES = [1, 2, 5, 17, 64, 100, 250, 3, 1000]
QUEUE = "big"


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh(request: pytest.FixtureRequest, tmp_path) -> Iterator[Target]:
    """A database of our own: the statistics must be exactly what this test made them."""
    if request.param == "sqlite":
        target = sqlite_target(str(tmp_path))
        yield target
        target.engine.dispose()
    else:
        require_pg()
        target = pg_target(new_pg_schema("climit"))
        yield target
        drop_pg_schema(target)


def _fill_with_stale_stats(db: Target, pending: int, lapsed: int) -> None:
    jobs = db.table("alkstore_jobs")
    if db.kind == "postgresql":
        db.execute(f"ALTER TABLE {jobs} SET (autovacuum_enabled = false)")
        db.execute(f"ANALYZE {jobs}")
        series = "generate_series(1, :n) AS g(i)"
        now = "extract(epoch FROM clock_timestamp())"
    else:
        db.execute(f"ANALYZE {jobs}")
        series = (
            "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) "
            "SELECT i FROM s) AS g"
        )
        now = "(julianday('now') - 2440587.5) * 86400.0"
    cols = (
        "queue, state, payload, priority, attempts, max_attempts, visibility_timeout, "
        "backoff_base, dead_letter_retention, created_at, run_at, claimed_at, "
        "claim_expires_at, worker_id, expires_at, errors"
    )
    # ready pending rows, in a few priority bands
    db.execute(
        f"INSERT INTO {jobs} ({cols}) SELECT :q, 'pending', '{{}}', i % 5, 0, 3, 600, 5, NULL, "
        f"{now} - 60, {now} - 60 + i * 0.0001, NULL, NULL, NULL, NULL, '[]' FROM {series}",
        q=QUEUE,
        n=pending,
    )
    # processing rows whose claim lapsed long ago: reclaimable
    db.execute(
        f"INSERT INTO {jobs} ({cols}) SELECT :q, 'processing', '{{}}', i % 5, 1, 3, 600, 5, NULL, "
        f"{now} - 120, {now} - 120, {now} - 100, {now} - 90, 'gone', NULL, '[]' FROM {series}",
        q=QUEUE,
        n=lapsed,
    )


@pytest.mark.slow
def test_claim_batch_never_returns_more_than_n(fresh: Target, tmp_path) -> None:
    db = fresh
    pending, lapsed = PENDING_ROWS[db.kind], LAPSED_ROWS[db.kind]
    _fill_with_stale_stats(db, pending, lapsed)
    jobs = db.table("alkstore_jobs")
    if db.kind == "postgresql":  # the premise: the planner still thinks the table is empty
        reltuples = db.scalar(f"SELECT reltuples FROM pg_class WHERE oid = '{jobs}'::regclass")
        assert reltuples is not None and reltuples <= 0, reltuples

    ready = workers.ready_dir(tmp_path)  # each claimer marks itself ready here, then waits for the others
    specs = [
        {
            "url": db.url,
            "schema": db.schema,
            "queue": QUEUE,
            "worker_id": f"c{i}",
            "sizes": SIZES,
            "offset": i * 2,
            "max_seconds": 90,
            "ready_dir": ready,
            "parties": 4,
        }
        for i in range(4)
    ]
    started = time.monotonic()
    results = harness.run(workers.claim_sizes, specs, tmp_path, timeout=120)
    elapsed = time.monotonic() - started

    calls = [c for r in results for c in r["calls"]]
    over = [(n, got) for n, got in calls if got > n]
    assert not over, f"claim_batch(n) returned more than n: {over[:10]} (of {len(calls)} calls)"
    ids = Counter(i for r in results for i in r["ids"])
    assert not [i for i, k in ids.items() if k > 1], "a job was handed out twice"
    assert sum(ids.values()) == pending + lapsed, (sum(ids.values()), pending + lapsed, elapsed)
    # real concurrency (on a 2-core box one claimer can be starved: at least two, not all)
    active = sum(1 for r in results if r["ids"])
    assert active >= 2, f"only {active} claimer(s) got any job: no concurrency was exercised"
    left = db.scalar(f"SELECT count(*) FROM {jobs} WHERE state = 'pending'")
    assert left == 0
