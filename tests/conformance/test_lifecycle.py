"""The job lifecycle end to end: enqueue → claim → ack / retry / fail, on both engines."""

from __future__ import annotations

import alkstore_sa as alk
from tests.support import FakeClock


def test_enqueue_claim_ack(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue({"order": 42})
    h = q.claim_one("w1")
    assert h is not None and h.id == job_id and h.payload == {"order": 42}
    assert h.job.state == "processing" and h.job.attempts == 1 and h.job.worker_id == "w1"
    assert h.ack() is True
    assert q.get_job(job_id) is None
    assert q.claim_one("w1") is None


def test_fail_moves_to_dead_with_history(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue("p")
    h = q.claim_one("w1")
    assert h is not None
    assert h.fail("broken") is True
    job = q.get_job(job_id)
    assert job is not None and job.state == "dead"
    assert job.last_error == "broken" and job.died_at is not None
    assert [e["error"] for e in job.errors] == ["broken"]
    assert [j.id for j in q.dead_jobs()] == [job_id]


def test_the_claim_fields_through_a_retry_and_into_dead_storage(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """What docs/api.md says of ``claimed_at``, ``claim_expires_at`` and ``worker_id``: the
    latest claim's time and claimant stay after a retry (the deadline goes: no claim is
    live) and in dead storage, where the last claim's deadline stays too."""
    q = store.queue(qname, visibility_timeout=30, max_attempts=2, backoff_base=0)
    job_id = q.enqueue("p")
    assert (q.get_job(job_id).claimed_at, q.get_job(job_id).worker_id) == (None, None)  # type: ignore[union-attr]
    h = q.claim_one("w1")
    assert h is not None and h.retry("again", delay=0)
    job = q.get_job(job_id)
    assert job is not None and job.state == "pending"
    assert (job.claimed_at, job.claim_expires_at, job.worker_id) == (h.job.claimed_at, None, "w1")
    clock.advance(1)
    h = q.claim_one("w2")
    assert h is not None and h.retry("at the budget")
    dead = q.get_job(job_id)
    assert dead is not None and dead.state == "dead"
    assert (dead.claimed_at, dead.claim_expires_at, dead.worker_id) == (
        h.job.claimed_at, h.job.claim_expires_at, "w2"
    )
