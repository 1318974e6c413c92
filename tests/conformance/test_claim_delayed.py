"""SPEC §5.3 claim order with delayed jobs at mixed priorities.

The claim reads ready rows one priority at a time (a walk of the priorities the queue
holds, each read bounded by ``run_at <= now``), so these pin the order it must keep: delayed
rows of any priority are invisible until due, a due row of a lower priority is taken while
higher ones wait, a delayed high-priority row goes first the moment it is due, a batch runs
across priority levels and stops at ``n`` (also mid-level), and the extreme int32
priorities are ordinary priorities.
"""

from __future__ import annotations

import sqlalchemy as sa

import alkstore_sa as alk
from tests.support import FakeClock, Target

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def test_due_lower_priority_is_claimed_while_higher_ones_are_delayed(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    q = store.queue(qname)
    for p in (9, 7, 5, 3):
        q.enqueue_many([f"later-{p}"] * 3, priority=p, delay=3600)
    due_low = q.enqueue("due-low", priority=1)
    q.enqueue("later-same", priority=1, delay=3600)
    q.enqueue("below", priority=0, delay=3600)
    h = q.claim_one("w")
    assert h is not None and h.id == due_low
    assert q.claim_one("w") is None and q.claim_batch("w", 50) == []


def test_delayed_high_priority_becomes_first_once_due(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=86400)  # no claim lapses within the test
    ready = q.enqueue_many(["r1", "r2", "r3"], priority=2)
    high = q.enqueue("high", priority=8, delay=30)
    top = q.enqueue("top", priority=9, delay=3600)
    assert [h.id for h in q.claim_batch("w", 1)] == [ready[0]]
    clock.advance(30)
    assert [h.id for h in q.claim_batch("w", 2)] == [high, ready[1]]
    assert [h.id for h in q.claim_batch("w", 5)] == [ready[2]]
    clock.advance(3600)
    assert [h.id for h in q.claim_batch("w", 5)] == [top]


def test_batch_runs_across_priority_levels_in_claim_order(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """Levels with only delayed rows are passed over; within a level, run_at then enqueue
    order; a batch that ends mid-level takes that level's first rows."""
    q = store.queue(qname)
    expected: list[int] = []
    for p in (10, 8, 6, 4, 2, 0, -2):
        q.enqueue_many([f"delayed-{p}"] * 2, priority=p, delay=3600)
        if p % 4 == 0:  # 8, 4, 0: ready rows, the later-due one enqueued first
            late = q.enqueue(f"ready-{p}-b", priority=p, delay=5)
            early = q.enqueue_many([f"ready-{p}-a1", f"ready-{p}-a2"], priority=p, delay=1)
            expected += [*early, late]
    clock.advance(10)
    assert [h.id for h in q.claim_batch("w", 4)] == expected[:4]  # ends inside level 4
    assert [h.id for h in q.claim_batch("w", 100)] == expected[4:]
    assert q.claim_batch("w", 100) == []
    assert q.stats().pending == 14  # every delayed row is still there


def test_many_priority_levels(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    ids = {p: q.enqueue(f"p{p}", priority=p) for p in range(-20, 30)}
    for p in range(-20, 30, 3):
        q.enqueue(f"delayed-{p}", priority=p, delay=60)
    in_order = [ids[p] for p in sorted(ids, reverse=True)]
    assert [h.id for h in q.claim_batch("w", 7)] == in_order[:7]
    assert [h.id for h in q.claim_batch("w", 100)] == in_order[7:]


def test_more_levels_than_the_walk_visits(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """Past the walk's 32 levels the claim reads on (PostgreSQL: probes for the next level
    with a due row; SQLite: one ordered scan below the last level): many delayed-only
    levels above, ready rows below them, and a level that comes due later."""
    q = store.queue(qname, visibility_timeout=86400)
    for p in range(100, 140):
        q.enqueue(f"delayed-{p}", priority=p, delay=3600)
    soon = q.enqueue("soon", priority=120, delay=30)
    low = {p: q.enqueue_many([f"ready-{p}-1", f"ready-{p}-2"], priority=p) for p in (7, 5, -1)}
    in_order = [*low[7], *low[5], *low[-1]]
    assert [h.id for h in q.claim_batch("w", 3)] == in_order[:3]
    clock.advance(30)
    assert [h.id for h in q.claim_batch("w", 2)] == [soon, in_order[3]]
    assert [h.id for h in q.claim_batch("w", 10)] == in_order[4:]
    assert q.claim_batch("w", 10) == []


def test_extreme_priorities_are_ordinary(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    bottom = q.enqueue("bottom", priority=INT32_MIN)
    q.enqueue("delayed-top", priority=INT32_MAX, delay=60)
    top = q.enqueue("top", priority=INT32_MAX)
    middle = q.enqueue("middle", priority=0)
    assert [h.id for h in q.claim_batch("w", 10)] == [top, middle, bottom]


def test_expired_high_priority_rows_are_passed_over(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    q.enqueue_many(["stale"] * 3, priority=5, expires=5)
    fresh = q.enqueue("fresh", priority=1)
    clock.advance(5)
    assert [h.id for h in q.claim_batch("w", 10)] == [fresh]


def test_reclaims_and_ready_rows_merge_in_claim_order(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=10)
    lapsed = q.enqueue("lapsed", priority=4)
    assert q.claim_one("w") is not None
    q.enqueue("delayed", priority=9, delay=3600)
    high = q.enqueue("high", priority=6)
    low = q.enqueue("low", priority=2)
    clock.advance(10)
    assert [h.id for h in q.claim_batch("w", 10)] == [high, lapsed, low]


def test_limited_queue_keeps_the_order(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """SPEC §14: a queue with settings claims through the limited path, same order."""
    q = store.queue(qname)
    q.set_concurrency(2)
    q.enqueue_many(["later"] * 3, priority=9, delay=3600)
    a, b, c = q.enqueue_many(["a", "b", "c"], priority=1)
    top = q.enqueue("top", priority=3)
    assert [h.id for h in q.claim_batch("w", 10)] == [top, a]
    assert q.claim_batch("w", 10) == []  # the concurrency limit binds
    q.set_concurrency(None)
    assert [h.id for h in q.claim_batch("w", 10)] == [b, c]


def test_pg_locked_rows_are_skipped_across_levels(pg_db: Target, qname: str, clock: FakeClock) -> None:
    """PostgreSQL: rows another transaction holds locked are skipped, level by level, and
    the claim still takes n rows in claim order from what is left."""
    store = pg_db.store(clock=clock)
    try:
        q = store.queue(qname)
        q.enqueue_many(["later"] * 2, priority=9, delay=3600)
        top = q.enqueue_many(["t1", "t2"], priority=5)
        mid = q.enqueue_many(["m1", "m2"], priority=3)
        low = q.enqueue("l1", priority=1)
        with pg_db.engine.connect() as other:
            held = sa.text(f"SELECT id FROM {pg_db.table('alkstore_jobs')} WHERE id IN (:a, :b) FOR UPDATE")
            other.execute(held, {"a": top[0], "b": mid[1]}).all()
            assert [h.id for h in q.claim_batch("w", 3)] == [top[1], mid[0], low]
            other.rollback()
        assert sorted(h.id for h in q.claim_batch("w", 10)) == sorted([top[0], mid[1]])
    finally:
        store.close()
