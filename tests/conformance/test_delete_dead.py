"""Queue.delete_dead: an operator discards a dead letter (the dashboard's delete action)."""

from __future__ import annotations

import pytest

import alkstore_sa as alk
from tests.conformance.test_queue_ops import _dead


def test_delete_dead_removes_only_that_dead_job(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    first, second = _dead(q, 2)
    assert q.delete_dead(first) is True
    assert store.get_job(first) is None
    assert [j.id for j in q.dead_jobs()] == [second]
    assert q.stats().dead == 1
    assert q.delete_dead(first) is False  # only once


def test_delete_dead_refusals(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    (dead,) = _dead(q, 1)
    live = q.enqueue("live")
    assert q.delete_dead(live) is False  # a live job is never touched
    assert store.get_job(live) is not None
    assert store.queue(qname + "-other").delete_dead(dead) is False  # another queue's
    assert q.delete_dead(10**30) is False  # beyond the id range
    assert store.get_job(dead) is not None


def test_delete_dead_bad_input_and_closed(db, qname: str) -> None:  # type: ignore[no-untyped-def]
    store = db.store()
    q = store.queue(qname)
    with pytest.raises(alk.InvalidOptions):
        q.delete_dead("1")  # type: ignore[arg-type]
    store.close()
    with pytest.raises(alk.StoreClosed):
        q.delete_dead(1)
