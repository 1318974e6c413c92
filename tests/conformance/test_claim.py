"""SPEC §5.3: what is claimable, in which order, and what a claim sets."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

import alkstore_sa as alk
from tests.support import FakeClock, Target


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


def test_claim_sets_attempts_deadline_and_worker(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=45)
    job_id = q.enqueue("x")
    clock.advance(3)
    h = q.claim_one("worker-7")
    assert h is not None and h.id == job_id
    job = h.job
    assert job.state == "processing" and job.attempts == 1 and job.worker_id == "worker-7"
    assert job.claimed_at == _ts(clock) and job.claim_expires_at == _ts(clock, 45)
    stored = q.get_job(job_id)
    assert stored is not None and stored.state == "processing" and stored.claim_expires_at == _ts(clock, 45)


def test_claim_order_priority_then_run_at_then_enqueue_order(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    low_early = q.enqueue("low-early", priority=0)
    high_late = q.enqueue("high-late", priority=5, delay=2)
    mid_a = q.enqueue("mid-a", priority=1)
    mid_b = q.enqueue("mid-b", priority=1)
    neg = q.enqueue("neg", priority=-3)
    delayed_mid = q.enqueue("delayed-mid", priority=1, delay=1)
    clock.advance(10)
    order = [h.id for h in q.claim_batch("w", 10)]
    assert order == [high_late, mid_a, mid_b, delayed_mid, low_early, neg]


def test_claim_one_takes_the_first_in_order(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue("a")
    top = q.enqueue("b", priority=9)
    h = q.claim_one("w")
    assert h is not None and h.id == top


def test_claim_batch_never_more_than_n(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many(list(range(20)))
    assert q.claim_batch("w", 0) == [] and q.claim_batch("w", -5) == []
    assert len(q.claim_batch("w", 7)) == 7
    assert len(q.claim_batch("w", 100)) == 13
    assert q.claim_batch("w", 100) == []


def test_delayed_job_is_not_claimable_until_ready(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    job_id = q.enqueue("later", delay=60)
    assert q.claim_one("w") is None
    clock.advance(59.9)
    assert q.claim_one("w") is None
    clock.advance(0.1)
    h = q.claim_one("w")
    assert h is not None and h.id == job_id


def test_expired_job_is_not_claimable(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    q.enqueue("short", expires=10)
    clock.advance(10)
    assert q.claim_one("w") is None
    assert q.stats().pending == 1  # still stored until sweep_expired moves it


def test_queues_are_separate_and_case_sensitive(store: alk.Store, qname: str) -> None:
    upper = store.queue(qname.upper())
    lower = store.queue(qname)
    a = upper.enqueue("A")
    b = lower.enqueue("b")
    assert [h.id for h in lower.claim_batch("w", 5)] == [b]
    assert [h.id for h in upper.claim_batch("w", 5)] == [a]


def test_reclaim_consumes_an_attempt(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=10, max_attempts=3)
    job_id = q.enqueue("x")
    first = q.claim_one("w1")
    assert first is not None and first.job.attempts == 1
    clock.advance(9)
    assert q.claim_one("w2") is None  # claim still live
    clock.advance(1)
    second = q.claim_one("w2")
    assert second is not None and second.id == job_id and second.job.attempts == 2
    assert second.job.worker_id == "w2"


def test_exhausted_reclaimable_goes_dead_before_claim(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=10, max_attempts=2)
    job_id = q.enqueue("x")
    other = q.enqueue("y", delay=100)
    for _ in range(2):
        assert q.claim_one("w") is not None
        clock.advance(10)
    assert q.claim_one("w") is None  # attempts exhausted: not handed out a third time
    job = q.get_job(job_id)
    assert job is not None and job.state == "dead" and job.last_error == "max attempts exceeded"
    assert job.attempts == 2 and job.died_at == datetime.fromtimestamp(clock.now, timezone.utc)
    assert q.stats().dead == 1 and q.get_job(other).state == "pending"  # type: ignore[union-attr]


def test_two_workers_never_share_a_live_claim(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many(list(range(10)))
    a = {h.id for h in q.claim_batch("same", 6)}
    b = {h.id for h in q.claim_batch("same", 6)}
    assert len(a) == 6 and len(b) == 4 and not a & b


def test_claim_on_database_clock(dbstore: alk.Store, qname: str) -> None:
    """Without an injected clock, deadlines come from the database clock."""
    q = dbstore.queue(qname, visibility_timeout=60)
    job_id = q.enqueue("x")
    h = q.claim_one("w")
    assert h is not None and h.id == job_id
    job = h.job
    assert job.claimed_at is not None and job.claim_expires_at is not None
    assert abs((job.claim_expires_at - job.claimed_at).total_seconds() - 60) < 1e-3
    now = datetime.now(timezone.utc)
    assert abs((job.claimed_at - now).total_seconds()) < 5
    assert job.created_at <= job.claimed_at


@pytest.mark.parametrize("outcome", ["retry", "lapse"])
def test_a_claim_of_a_job_whose_attempts_were_written_by_hand_as_the_largest_count(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, outcome: str
) -> None:
    """A pending job whose attempts an operator wrote as the largest 32-bit integer (to
    have it die at its next failure, say): on PostgreSQL every claim of its queue failed
    with "integer out of range" (attempts + 1), the other jobs of the queue unclaimable
    too. A claim counts no further than that largest count (SQLite's integers go on to
    2**63: it counts on); the job is at its budget, so a retry, or its claim lapsing,
    buries it."""
    top = 2**31 - 1
    counted = top if db.kind == "postgresql" else top + 1
    q = store.queue(qname, max_attempts=3, visibility_timeout=10)
    job_id, other = q.enqueue("capped"), q.enqueue("other")
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET attempts = :a WHERE id = :id", a=top, id=job_id)
    handles = {h.id: h for h in q.claim_batch("w", 5)}
    assert set(handles) == {job_id, other}
    assert handles[job_id].job.attempts == counted
    if outcome == "retry":
        assert handles[job_id].retry("boom") is True
    else:
        clock.advance(11)
        assert [h.id for h in q.claim_batch("w", 5)] == [other]  # the capped one is buried
    job = q.get_job(job_id)
    assert job is not None and job.state == "dead" and job.attempts == counted
    assert job.last_error == "max attempts exceeded"


@pytest.mark.parametrize("priority", [2**31, 2**40, 2**63 - 1, 1e30])
def test_a_sqlite_job_whose_priority_was_written_by_hand_past_int32_is_claimed_first(
    sqlite_db: Target, qname: str, priority: float
) -> None:
    """SQLite's integer column holds up to 2**63 (and a REAL past it): a pending job whose
    priority was written by hand above 2**31 - 1 was counted ready but never claimed — the
    claim's priority walk started at 2**31 - 1, below it — so it waited forever while its
    queue's oldest ready age grew. It is claimed first, as its priority says."""
    store = sqlite_db.store()
    try:
        q = store.queue(qname)
        odd, normal = q.enqueue("odd"), q.enqueue("normal")
        sqlite_db.execute("UPDATE alkstore_jobs SET priority = :p WHERE id = :id", p=priority, id=odd)
        assert q.stats().ready == 2
        assert [h.id for h in q.claim_batch("w", 5)] == [odd, normal]
    finally:
        store.close()
