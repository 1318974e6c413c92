"""The job lifecycle end to end: enqueue → claim → ack / retry / fail, on both engines."""

from __future__ import annotations

import alkstore_sa as alk


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
