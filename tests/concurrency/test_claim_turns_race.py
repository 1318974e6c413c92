"""Queues taking turns across processes: three processes claim from the same six queues
with ``queue.claim_turns`` (PostgreSQL: one statement for all the turns; SQLite: one
transaction), each call starting at another queue and with another budget, until nothing
is left. Every job is claimed exactly once, none is lost, and no call takes more than its
budget."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.concurrency import harness, workers
from tests.support import Target

QUEUES = 6
PER_QUEUE = 1_000  # enough calls that a slow-starting process still takes part
PROCS = 3


@pytest.mark.slow
def test_turns_racing_across_processes_hand_out_each_job_once(db: Target, qname: str, tmp_path) -> None:
    names = [f"{qname}-{k}" for k in range(QUEUES)]
    store = db.store()
    try:
        enqueued = {name: store.queue(name).enqueue_many([{"i": i} for i in range(PER_QUEUE)]) for name in names}
    finally:
        store.close()
    ready = workers.ready_dir(tmp_path)  # the processes start claiming together once connected
    specs = [
        {
            "url": db.url, "schema": db.schema, "queues": names, "worker_id": f"w{p}", "want": 8,
            "budgets": [3, 8, 1, 13, 2], "offset": p, "max_seconds": 90, "ready_dir": ready, "parties": PROCS,
        }
        for p in range(PROCS)
    ]
    results = harness.run(workers.claim_turns, specs, tmp_path, timeout=120)

    claimed = [(queue, job_id) for r in results for queue, job_id in r["claimed"]]
    per_job = Counter(job_id for _queue, job_id in claimed)
    twice = {job_id: k for job_id, k in per_job.items() if k > 1}
    assert not twice, f"jobs claimed more than once: {dict(list(twice.items())[:10])}"
    expected = {(name, job_id) for name, ids in enqueued.items() for job_id in ids}
    assert set(claimed) == expected, f"lost: {sorted(expected - set(claimed))[:10]}"
    assert all(got <= budget for r in results for budget, got in r["calls"]), "a call took more than its budget"
    active = sum(1 for r in results if r["claimed"])
    assert active >= 2, f"only {active} process(es) claimed anything: no concurrency exercised"
    left = db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE state = 'pending'")
    assert left == 0
