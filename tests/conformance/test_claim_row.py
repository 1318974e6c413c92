"""A claimed handle's Job is the row as stored: SQLite's claim reads back only the columns
the call does not already hold and fills in the rest (queue, worker, clock, deadline, state)."""

from __future__ import annotations

import alkstore_sa as alk
from tests.support import FakeClock


def test_claimed_job_equals_the_stored_row(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=12.345, max_attempts=4)
    ids = q.enqueue_many([{"n": i} for i in range(5)], priority=3)
    clock.advance(0.1)
    handles = q.claim_batch("worker-x", 5)
    assert sorted(h.id for h in handles) == sorted(ids)
    for h in handles:
        stored = q.get_job(h.id)
        assert stored is not None
        assert h.job == stored
        assert h.job.queue == qname and h.job.worker_id == "worker-x" and h.job.state == "processing"
    assert q.ack_batch(handles) == 5
