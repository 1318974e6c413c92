"""PostgreSQL plans a worker's claim once per connection, not once per call.

psycopg prepares a statement after five runs, and PostgreSQL then chooses between a plan
made for each call's values and one generic plan it reuses. With the claim's row count as
a LIMIT parameter, the generic plan's estimate (a tenth of the rows below each LIMIT)
made it look many times costlier, so the server re-planned the claim every call: 0.75 ms
of planning for 0.4 ms of execution, measured (docs/performance.md, "The claim's plan").
The count is written into the claim's text instead (one text per count, bounded).
"""

from __future__ import annotations

import pytest

from alkstore_sa import JobHandle
from alkstore_sa import queue as queue_mod
from alkstore_sa._backends import postgresql
from tests.support import Target

# the claim and the claim of turns are the statements that lock with SKIP LOCKED
CLAIMS = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%SKIP LOCKED%'"


def test_claims_reuse_one_generic_plan(pg_db: Target) -> None:
    with pg_db.store() as store:
        q = store.queue("plan-reuse")
        q.enqueue_many(list(range(300)))
        for _ in range(25):
            assert q.ack_batch(q.claim_batch("w", 5)) == 5
        for _ in range(25):
            h = q.claim_one("w")
            assert h is not None and h.ack() is True
        held = store._conns.take()  # the connection those claims ran on (the last one back)
        try:
            plans = held.dbapi.execute(CLAIMS).fetchall()
        finally:
            store._conns.give(held)
    assert len(plans) == 2, plans  # one prepared claim per count: 5 and 1
    for generic, custom in plans:
        # five custom plans while psycopg has not prepared it yet, five more before the
        # server compares; every later call reuses the generic plan
        assert generic >= 15 and custom <= 10, plans


def test_claim_texts_are_bounded(pg_db: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every count gets a text of its own only up to COUNTED_VARIANTS_MAX texts (a worker
    claims at most its free slots: a handful of counts); past that, and above
    COUNTED_LIMIT_MAX, the claim takes its count as a parameter — and claims the same."""
    monkeypatch.setattr(postgresql, "COUNTED_VARIANTS_MAX", 3)
    monkeypatch.setattr(postgresql, "COUNTED_LIMIT_MAX", 50)
    with pg_db.store() as store:
        q = store.queue("plan-bounded")
        q.enqueue_many(list(range(200)))
        for n in (1, 2, 3, 4, 5, 60):
            assert len(q.claim_batch("w", n)) == n
        texts = sorted(k for k in store.backend._sql if k.startswith("claim"))
    assert texts == ["claim", "claim#1", "claim#2", "claim#3"], texts


def test_claim_of_turns_reuses_one_generic_plan(pg_db: Target) -> None:
    """Queues taking turns (a worker's acks riding its claim): the queue names are an array
    parameter whose length a generic plan cannot know, so the claim of turns is told to
    reuse its generic plan (its counts written in make that the custom plan's shape)."""
    with pg_db.store() as store:
        queues = [store.queue(f"turns-reuse-{i}") for i in range(3)]
        for q in queues:
            q.enqueue_many(list(range(100)))
        handles: list[JobHandle] = []
        for _ in range(30):
            _landed, taken = queue_mod.ack_and_claim_turns(store, handles, "w", queues, 2, 5)
            handles = [h for _n, got in taken if got for h in got]
            assert len(handles) == 5
        held = store._conns.take()
        try:
            plans = held.dbapi.execute(CLAIMS).fetchall()
        finally:
            store._conns.give(held)
    assert len(plans) == 1, plans
    (generic, custom), = plans
    assert generic >= 20 and custom <= 5, plans
