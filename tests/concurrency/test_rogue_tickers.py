"""The boundary guarantee across processes (SPEC §7, §16): four processes tick the same
schedules at once with no leadership lease between them (rogue tickers), on the database's
clock, while one of them keeps re-registering every schedule under the same interval.
The row-locked advance lets each boundary fire exactly once: every schedule holds one job
per boundary from its first to the one it now waits for, and the processes' fire counts add
up to the jobs."""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from tests.concurrency import harness, schedule_workers
from tests.support import Target

PROCS = 4
SCHEDULES = 5
SECONDS = 2.0  # at least two boundaries of "@every 1s" elapse while they tick


@pytest.mark.slow
def test_rogue_tickers_in_four_processes_fire_each_boundary_once(db: Target, tmp_path, request) -> None:
    tag = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    schedules = [(f"rogue-{tag}-{i}", f"rogue-{tag}-q{i}") for i in range(SCHEDULES)]
    store = db.store()
    try:
        for name, queue in schedules:
            store.schedule(name, "@every 1s", queue, {"registration": -1})
        first = {s.name: s.next_fire_at.timestamp() for s in store.schedules() if s.name.startswith(f"rogue-{tag}")}
        specs = [
            {
                "url": db.url, "schema": db.schema, "seconds": SECONDS,
                "schedules": schedules, "reregister": i == 0,
            }
            for i in range(PROCS)
        ]
        results = harness.run(schedule_workers.tick_and_reregister, specs, tmp_path, timeout=120)

        after = {s.name: s for s in store.schedules() if s.name in first}
        with db.engine.connect() as c:
            counts = dict(
                c.execute(
                    sa.text(f"SELECT queue, count(*) FROM {db.table('alkstore_jobs')} GROUP BY queue")
                ).fetchall()
            )
        fired = 0
        for name, queue in schedules:
            boundaries = round(after[name].next_fire_at.timestamp() - first[name])
            assert boundaries >= 1, (name, after[name])
            assert counts.get(queue, 0) == boundaries, (name, counts.get(queue), boundaries)
            fired += boundaries
        assert sum(r["fired"] for r in results) == fired, results
    finally:
        store.close()
