"""SPEC §5.5–5.7: cancel, ack_batch, reads, dead-letter listing/requeue, sweep, stats."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa._conn import Lease
from tests.support import FakeClock, Target


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


def _dead(q: alk.Queue, n: int) -> list[int]:
    ids = q.enqueue_many(list(range(n)))
    for h in q.claim_batch("w", n):
        assert h.fail(f"dead {h.payload}")
    return ids


def test_cancel_pending_and_processing(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    pending, processing = q.enqueue("p"), q.enqueue("q", priority=1)
    h = q.claim_one("w")
    assert h is not None and h.id == processing
    assert q.cancel(pending) is True and q.cancel(processing) is True
    assert q.get_job(pending) is None and q.get_job(processing) is None
    # not an interrupt: the holder learns it from its next op
    assert h.heartbeat(10) is False and h.ack() is False


def test_cancel_refusals(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    (dead,) = _dead(q, 1)
    other = store.queue(qname + "-other").enqueue(1)
    assert q.cancel(dead) is False
    assert q.cancel(10**15) is False
    assert q.cancel(other) is False  # another queue's job
    assert q.get_job(dead).state == "dead" and q.get_job(other) is not None  # type: ignore[union-attr]


def test_cancel_pending_deletes_only_a_pending_job(store: alk.Store, qname: str) -> None:
    """The dashboard's cancel (internal, ``queue.cancel_pending``): one statement that deletes
    the job only while it is pending, so a claim that landed first keeps its job."""
    from alkstore_sa.queue import cancel_pending

    q = store.queue(qname)
    pending, processing = q.enqueue("p"), q.enqueue("q", priority=1)
    h = q.claim_one("w")
    assert h is not None and h.id == processing
    later = q.enqueue("later", delay=3600)  # pending, not yet ready: still cancellable
    other = store.queue(qname + "-other").enqueue(1)
    assert cancel_pending(q, pending) is True and cancel_pending(q, later) is True
    assert q.get_job(pending) is None and q.get_job(later) is None
    assert cancel_pending(q, processing) is False
    assert h.ack() is True  # the claim was left alone
    (dead,) = _dead(q, 1)
    assert cancel_pending(q, dead) is False and q.get_job(dead).state == "dead"  # type: ignore[union-attr]
    assert cancel_pending(q, other) is False and q.get_job(other) is not None  # another queue's job
    assert cancel_pending(q, pending) is False and cancel_pending(q, 10**15) is False
    assert cancel_pending(q, 2**70) is False  # outside int64: nothing to delete


def test_ack_batch_counts_only_valid_claims(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=10)
    short = store.queue(qname, visibility_timeout=1)
    lapsed_id = short.enqueue("lapsed")
    valid_ids = q.enqueue_many(["a", "b", "c"])
    pending_id = q.enqueue("never claimed", delay=100)
    foreign = store.queue(qname + "-x", visibility_timeout=10)
    foreign_id = foreign.enqueue("foreign")
    assert foreign.claim_one("w") is not None
    handles = q.claim_batch("w", 10)
    assert {h.id for h in handles} == {lapsed_id, *valid_ids}
    clock.advance(2)  # only the 1 s claim lapsed
    acked_elsewhere = handles[-1].id
    assert next(h for h in handles if h.id == acked_elsewhere).ack() is True
    ids = [*valid_ids, lapsed_id, pending_id, foreign_id, 10**15, valid_ids[0]]
    assert q.ack_batch(ids) == 2
    assert all(q.get_job(i) is None for i in valid_ids)
    assert q.get_job(lapsed_id).state == "processing"  # type: ignore[union-attr]
    assert q.get_job(pending_id).state == "pending"  # type: ignore[union-attr]
    assert q.get_job(foreign_id).state == "processing"  # type: ignore[union-attr]
    assert q.ack_batch([]) == 0


def test_get_job_forms(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    other = store.queue(qname + "-other")
    live = q.enqueue("live")
    (dead,) = _dead(other, 1)
    assert q.get_job(live).payload == "live"  # type: ignore[union-attr]
    assert q.get_job(dead).state == "dead"  # type: ignore[union-attr]  # id-global: any queue
    assert store.get_job(dead).last_error == "dead 0"  # type: ignore[union-attr]
    assert store.get_job(live).state == "pending"  # type: ignore[union-attr]
    assert store.get_job(10**15) is None and q.get_job(-1) is None


def test_dead_jobs_pagination(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    ids = _dead(q, 7)
    store.queue(qname + "-other").enqueue("not dead")
    page1 = q.dead_jobs(limit=3)
    assert [j.id for j in page1] == sorted(ids, reverse=True)[:3]
    page2 = q.dead_jobs(limit=3, before_id=page1[-1].id)
    assert [j.id for j in page2] == sorted(ids, reverse=True)[3:6]
    assert [j.id for j in q.dead_jobs(before_id=min(ids))] == []
    assert len(q.dead_jobs()) == 7 and q.dead_jobs(limit=0) == []
    job = page1[0]
    assert job.state == "dead" and job.died_at is not None and job.last_error is not None
    assert job.errors and job.errors[0]["error"] == job.last_error


def test_requeue_dead(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, max_attempts=5)
    job_id = q.enqueue({"again": True}, priority=4)
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    new_id = q.requeue_dead(job_id)
    assert new_id is not None and new_id != job_id
    assert q.get_job(job_id) is None  # the dead row is gone
    fresh = q.get_job(new_id)
    assert fresh is not None and fresh.state == "pending" and fresh.attempts == 0
    assert fresh.payload == {"again": True} and fresh.priority == 4 and fresh.max_attempts == 5
    assert q.requeue_dead(job_id) is None  # only once
    assert store.queue(qname + "-other").requeue_dead(new_id) is None  # live, other queue


def test_sweep_moves_pending_and_processing(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=1000)
    pending = q.enqueue("p", expires=10, delay=100)
    processing = q.enqueue("q", expires=10)
    forever = q.enqueue("r")
    later = q.enqueue("s", expires=100, delay=100)
    h = q.claim_one("w")
    assert h is not None and h.id == processing
    clock.advance(10)
    result = q.sweep_expired()
    assert result == alk.SweepResult(expired=2, purged=0)
    for job_id in (pending, processing):
        job = q.get_job(job_id)
        assert job is not None and job.state == "dead" and job.last_error == "expired"
        assert job.died_at == _ts(clock)
    assert h.ack() is False  # the holder's claim went with the row
    assert q.get_job(forever).state == "pending" and q.get_job(later).state == "pending"  # type: ignore[union-attr]
    assert q.sweep_expired() == alk.SweepResult(0, 0)


def test_sweep_is_per_queue(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, other = store.queue(qname), store.queue(qname + "-other")
    other_id = other.enqueue("o", expires=1)
    clock.advance(5)
    assert q.sweep_expired().expired == 0
    assert other.get_job(other_id).state == "pending"  # type: ignore[union-attr]


def test_sweep_retention(store: alk.Store, qname: str, clock: FakeClock) -> None:
    keep = store.queue(qname)  # retention None: forever
    short = store.queue(qname, dead_letter_retention=60)
    kept = _dead(keep, 2)
    purged = _dead(short, 3)
    clock.advance(59)
    assert short.sweep_expired() == alk.SweepResult(0, 0)
    clock.advance(1)
    assert short.sweep_expired() == alk.SweepResult(expired=0, purged=3)
    assert all(short.get_job(i) is None for i in purged)
    clock.advance(10**6)
    assert keep.sweep_expired().purged == 0
    assert all(keep.get_job(i).state == "dead" for i in kept)  # type: ignore[union-attr]


def test_stats(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=100)
    assert q.stats() == alk.QueueStats(0, 0, 0, 0, None)
    q.enqueue("ready-old")
    clock.advance(5)
    q.enqueue_many(["ready-new", "claimed"])
    q.enqueue("delayed", delay=50)
    _dead(store.queue(qname + "-d"), 1)
    (dead_here,) = q.enqueue_many(["dead"], priority=10)
    h = q.claim_one("w")
    assert h is not None and h.id == dead_here and h.fail()
    assert q.claim_one("w") is not None  # ready-old leaves the ready set
    clock.advance(2)
    stats = q.stats()
    assert (stats.pending, stats.ready, stats.processing, stats.dead) == (3, 2, 1, 1)
    assert stats.oldest_ready_age == 2.0


def test_queue_stats_is_one_snapshot(
    db: Target, store: alk.Store, qname: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """store.queue_stats() (what ``alkstore status`` prints) reads every count in one
    statement: a job that died between two reads was counted both processing and dead
    (four jobs out of three)."""
    other = db.store(clock=clock)
    try:
        q = store.queue(qname, max_attempts=1)
        q.enqueue_many(["a", "b", "c"])
        h = other.queue(qname, max_attempts=1).claim_one("w")
        assert h is not None
        failed: list[bool] = []
        rows = Lease.rows

        def then_fail(ex: Lease, sql: str, params: Any) -> list[tuple[Any, ...]]:
            result = rows(ex, sql, params)
            if not failed and "GROUP BY" in sql.upper():
                failed.append(h.fail("boom"))  # committed by another store, after this read
            return result

        monkeypatch.setattr(Lease, "rows", then_fail)
        stats = store.queue_stats()[qname]
        monkeypatch.undo()
        assert failed == [True]
        assert (stats.pending, stats.processing, stats.dead) == (2, 1, 0), stats
    finally:
        other.close()


def test_sweep_and_stats_on_database_clock(dbstore: alk.Store, qname: str) -> None:
    q = dbstore.queue(qname)
    q.enqueue("x")
    q.enqueue("y", delay=3600)
    stats = q.stats()
    assert (stats.pending, stats.ready) == (2, 1)
    assert stats.oldest_ready_age is not None and 0 <= stats.oldest_ready_age < 5
    assert q.sweep_expired() == alk.SweepResult(0, 0)


def test_store_closed_everywhere(db, qname: str) -> None:  # type: ignore[no-untyped-def]
    store = db.store()
    q = store.queue(qname)
    q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None
    store.close()
    store.close()  # idempotent
    assert store.closed
    for op in (
        lambda: store.queue(qname), lambda: store.get_job(1), lambda: q.enqueue(1),
        lambda: q.enqueue_many([1]), lambda: q.claim_one("w"), lambda: q.claim_batch("w", 2),
        lambda: q.ack_batch([1]), lambda: q.cancel(1), lambda: q.get_job(1), lambda: q.dead_jobs(),
        lambda: q.requeue_dead(1), lambda: q.sweep_expired(), lambda: q.stats(), lambda: store.install(),
        h.ack, lambda: h.retry("e"), h.fail, lambda: h.heartbeat(1),
    ):
        try:
            op()
        except alk.StoreClosed:
            continue
        raise AssertionError("operation on a closed store did not raise StoreClosed")


def test_store_as_context_manager(db, qname: str) -> None:  # type: ignore[no-untyped-def]
    with db.store() as store:
        store.queue(qname).enqueue(1)
    assert store.closed


def test_ack_batch_with_handles_acks_only_their_own_claims(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """Handles carry their claim: a stale handle (its claim lapsed and the job was
    reclaimed) is not counted, where its bare id would be."""
    q = store.queue(qname, visibility_timeout=10)
    a, b, c = q.enqueue_many(["a", "b", "c"])
    stale = {h.id: h for h in q.claim_batch("w1", 3)}
    clock.advance(11)
    fresh = {h.id: h for h in q.claim_batch("w2", 3)}  # all three reclaimed (attempt 2)
    assert q.ack_batch([stale[a], stale[b]]) == 0  # their claims are gone
    assert stale[a].consumed and stale[b].consumed
    assert q.get_job(a).state == "processing"  # type: ignore[union-attr]
    assert q.ack_batch([fresh[a], fresh[b]]) == 2
    assert q.ack_batch([c]) == 1  # a bare id acks whichever claim is live (SPEC §5.5)
    assert all(q.get_job(i) is None for i in (a, b, c))


def test_ack_batch_refuses_consumed_handles_before_acking_anything(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many([1, 2])
    h1, h2 = q.claim_batch("w", 2)
    assert h1.ack() is True
    with pytest.raises(alk.HandleConsumed):
        q.ack_batch([h2, h1])
    assert not h2.consumed and q.get_job(h2.id).state == "processing"  # type: ignore[union-attr]
    assert q.ack_batch([h2]) == 1


@pytest.mark.parametrize("column", ["dead_letter_retention", "died_at"])
def test_a_dead_job_whose_retention_stamps_name_no_number_is_kept_by_the_sweep(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, column: str
) -> None:
    """A dead job whose dead_letter_retention or died_at was written by hand as something
    that is no number — text on SQLite (which keeps it; "7 days", say), NaN on PostgreSQL:
    on SQLite the sweep's died_at + retention read the text as 0, so the job was purged at
    the next sweep, as if its retention had passed (the dead letter lost). PostgreSQL keeps
    a NaN (its order puts NaN above every number). Such a job is kept, as for a retention
    that never ends, on both engines."""
    q = store.queue(qname, dead_letter_retention=100)
    job_id = q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    stored = math.nan if db.kind == "postgresql" else "7 days"
    db.execute(f"UPDATE {db.table('alkstore_dead_jobs')} SET {column} = :v WHERE id = :id", v=stored, id=job_id)
    clock.advance(50)
    assert q.sweep_expired() == alk.SweepResult(expired=0, purged=0)
    job = q.get_job(job_id)
    assert job is not None and job.state == "dead"
