"""Exactly-once handout: four OS processes drain one queue of 5,000 jobs with mixed batch
sizes; every job is processed exactly once, none lost, none twice, the queue ends empty.
A second variant gives two processes the SAME worker_id (the claim token is per claim,
never the worker_id)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.concurrency import harness, workers
from tests.support import Target

JOBS = 5_000

VARIANTS = {
    # worker ids and each process's cycle of claim_batch sizes
    "distinct-ids": [("w0", [1]), ("w1", [10]), ("w2", [1, 10]), ("w3", [10, 1, 3])],
    "shared-id": [("same", [1, 10]), ("same", [10, 1])],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_drain_exactly_once(db: Target, qname: str, variant: str, tmp_path) -> None:
    store = db.store()
    try:
        q = store.queue(qname)  # visibility 300 s: nothing lapses during the drain
        enqueued = q.enqueue_many([{"i": i} for i in range(JOBS)])
    finally:
        store.close()
    assert len(set(enqueued)) == JOBS

    ready = workers.ready_dir(tmp_path)  # the processes start claiming together once connected
    specs = [
        {
            "url": db.url,
            "schema": db.schema,
            "queue": qname,
            "worker_id": wid,
            "sizes": sizes,
            "max_seconds": 90,
            "ready_dir": ready,
            "parties": len(VARIANTS[variant]),
        }
        for wid, sizes in VARIANTS[variant]
    ]
    results = harness.run(workers.drain, specs, tmp_path, timeout=120)

    claims = [c for r in results for c in r["claims"]]
    per_job = Counter(c[0] for c in claims)
    twice = {job_id: k for job_id, k in per_job.items() if k > 1}
    assert not twice, f"jobs handed out more than once: {dict(list(twice.items())[:10])}"
    assert set(per_job) == set(enqueued), (
        f"lost: {sorted(set(enqueued) - set(per_job))[:10]}, "
        f"strangers: {sorted(set(per_job) - set(enqueued))[:10]}"
    )
    assert all(c[1] == 1 for c in claims), "a first-time claim must be attempt 1"
    assert all(c[3] is True for c in claims), "an ack of a live claim must land"
    for (wid, _), r in zip(VARIANTS[variant], results, strict=True):
        assert {c[2] for c in r["claims"]} <= {wid}
        assert all(got <= n for n, got in r["calls"]), "claim_batch returned more than n"

    # real concurrency (on a 2-core box one process can be starved: at least two, not all)
    active = sum(1 for r in results if r["claims"])
    assert active >= 2, f"only {active} process(es) claimed anything: no concurrency exercised"

    live = db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=qname)
    dead = db.scalar(
        f"SELECT count(*) FROM {db.table('alkstore_dead_jobs')} WHERE queue = :q", q=qname
    )
    assert (live, dead) == (0, 0)
