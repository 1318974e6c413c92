"""Queues taking turns (``queue.claim_turns``, the worker's round when its ready queues
outnumber its free slots): each queue in order takes up to ``want`` jobs and what is left
of the budget, with the single claim's candidates and order; a queue with settings takes
no turn of the budget. On PostgreSQL all the turns are one statement, on SQLite one
transaction: the results must be the same as a claim per queue."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import queue as queue_mod
from tests.support import FakeClock, Target


def _state(db: Target, ids: list[int]) -> dict[int, str]:
    with db.engine.connect() as c:
        rows = c.execute(sa.text(f"SELECT id, state FROM {db.table('alkstore_jobs')}")).all()
    return {r[0]: r[1] for r in rows if r[0] in ids}


def _ids(taken: list[tuple[int, list[alk.JobHandle] | None]]) -> list[tuple[int, Any]]:
    return [(n, None if hs is None else [h.id for h in hs]) for n, hs in taken]


def test_each_queue_takes_its_turn_in_order_until_the_budget_is_spent(db: Target, qname: str) -> None:
    store = db.store()
    a, b, c, d = (store.queue(f"{qname}-{k}") for k in "abcd")
    a_ids = a.enqueue_many(["a"] * 3)
    # b's claim order: priority first, then enqueue order
    b_low = b.enqueue_many(["low"] * 3)
    b_high = [b.enqueue("high", priority=5) for _ in range(2)]
    b_mid = [b.enqueue("mid", priority=1) for _ in range(3)]
    c_ids = c.enqueue_many(["c"] * 5)
    d_ids = d.enqueue_many(["d"] * 4)

    taken = queue_mod.claim_turns(store, "w", [a, b, c, d], 4, 9)

    # a is short of its turn (3 of 4): the rest of the budget goes on; c gets what is left
    assert _ids(taken) == [(4, a_ids), (4, b_high + b_mid[:2]), (2, c_ids[:2])]
    handles = [h for _n, hs in taken for h in hs or []]
    assert all(h.job.worker_id == "w" and h.job.attempts == 1 for h in handles)
    states = _state(db, a_ids + b_low + b_high + b_mid + c_ids + d_ids)
    claimed = {h.id for h in handles}
    assert {i for i, s in states.items() if s == "processing"} == claimed  # nothing past the budget
    assert all(states[i] == "pending" for i in d_ids + c_ids[2:] + b_low + b_mid[2:])
    assert all(h.ack() for h in handles)
    store.close()


def test_a_queue_with_settings_takes_no_part_of_the_budget(db: Target, qname: str) -> None:
    """Settings made by another store (this one does not know them): the queue's turn comes
    back None — it is claimed through its limits — and nothing of it is claimed."""
    store, other = db.store(), db.store()
    a, paused, b = (store.queue(f"{qname}-{k}") for k in ("a", "p", "b"))
    a_ids = a.enqueue_many(["a"] * 2)
    paused_ids = paused.enqueue_many(["p"] * 3)
    b_ids = b.enqueue_many(["b"] * 3)
    other.queue(paused.name).set_concurrency(10)

    taken = queue_mod.claim_turns(store, "w", [a, paused, b], 4, 5)

    assert _ids(taken) == [(4, a_ids), (3, None), (3, b_ids)]
    assert all(s == "pending" for s in _state(db, paused_ids).values())
    assert paused.name in store._limited_queues
    store.close()
    other.close()


def test_turns_reclaim_lapsed_claims_and_bury_exhausted_ones(db: Target, qname: str, clock: FakeClock) -> None:
    store = db.store(clock=clock)
    a, b = (store.queue(f"{qname}-{k}", visibility_timeout=10) for k in "ab")
    lapsing = a.enqueue("a1")
    spent = b.enqueue("b1", max_attempts=1)
    first = [a.claim_one("w0"), b.claim_one("w0")]
    assert [h.id for h in first if h is not None] == [lapsing, spent]
    b_ready = b.enqueue("b2")
    clock.advance(20)  # both claims lapse: a's job has attempts left, b's has none

    taken = queue_mod.claim_turns(store, "w", [a, b], 4, 8)

    ((_, a_got), (_, b_got)) = taken
    assert a_got is not None and [(h.id, h.job.attempts) for h in a_got] == [(lapsing, 2)]
    assert b_got is not None and [h.id for h in b_got] == [b_ready]
    assert [j.id for j in b.dead_jobs()] == [spent]
    store.close()
