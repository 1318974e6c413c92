"""Deadlines set by a write that waited for SQLite's write lock (SQLite only).

``BEGIN IMMEDIATE`` (and a lone write statement) waits up to the busy timeout while another
connection writes — here the application holding its own write transaction, as a long
import does. A claim, heartbeat or lock lease must count its deadline from when the lock
is held, not from the clock reading taken before the wait: a claim whose deadline passed
while it waited arrives dead, is handed out again at once, and the job runs twice at the
same time (SPEC §5.3: the claim deadline is ``now + visibility_timeout``; §5.4: a
heartbeat's new deadline is ``now + extend``; §8 likewise for a lease). A job's expiry is
such a deadline too (§5.2: ``expires`` is relative, and an expired job is never claimed): an
enqueue that waited longer than it wrote a job already expired.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import alkstore_sa as alk
from alkstore_sa import tracing
from alkstore_sa.queue import claim_turns
from alkstore_sa.worker.registry import Registration
from tests.support import WAIT, Target

HOLD = 2.0  # seconds the application holds the write lock
SHORT = 1.0  # a visibility timeout / ttl the wait outlasts


@pytest.fixture
def store(sqlite_db: Target) -> Iterator[alk.Store]:
    s = sqlite_db.store()  # the real clock: the wait is real
    yield s
    s.close()


@contextmanager
def app_writing(store: alk.Store, seconds: float = HOLD) -> Iterator[None]:
    """The application holds SQLite's write lock for ``seconds`` on a connection of its own,
    from when this block is entered; the block's writes wait for it."""
    path = store.engine.url.database
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None, timeout=WAIT)
        conn.execute("BEGIN IMMEDIATE")
        holding.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()
        done.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(WAIT)
    try:
        yield
    finally:
        thread.join(WAIT)
    assert done.is_set()


def _left(deadline: object) -> float:
    return deadline.timestamp() - time.time()  # type: ignore[attr-defined]


def test_a_claim_that_waited_for_the_lock_arrives_live(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=SHORT)
    q.enqueue({"n": 1})
    with app_writing(store):
        h = q.claim_one("w1")
    assert h is not None
    assert _left(h.job.claim_expires_at) > SHORT / 2, "the claim arrived (nearly) expired"
    assert q.claim_one("w2") is None  # not handed out again


def test_a_worker_claim_that_waited_for_the_lock_arrives_live(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=SHORT)
    q.enqueue_many([{"n": 1}, {"n": 2}])
    with app_writing(store):
        ((_, handles),) = claim_turns(store, "w1", [q], 2, 2)
    assert handles is not None and len(handles) == 2
    assert all(_left(h.job.claim_expires_at) > SHORT / 2 for h in handles)
    assert q.claim_batch("w2", 2) == []


def test_a_heartbeat_that_waited_for_the_lock_extends_from_when_it_lands(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=HOLD + 1.0)
    q.enqueue({"n": 1})
    h = q.claim_one("w1")
    assert h is not None
    with app_writing(store):
        assert h.heartbeat(SHORT) is True  # sent while the claim was live
    job = store.get_job(h.id)
    assert job is not None and _left(job.claim_expires_at) > SHORT / 2
    assert q.claim_one("w2") is None


def test_a_lock_lease_that_waited_for_the_lock_counts_from_when_it_lands(store: alk.Store) -> None:
    lock = store.lock("nightly")
    with app_writing(store):
        assert lock.acquire("a", SHORT) is True
    assert lock.acquire("b", SHORT) is False  # a's lease is live
    holder = lock.holder()
    assert holder is not None and _left(holder.expires_at) > SHORT / 2
    with app_writing(store, HOLD / 2):  # renewed while live, landing after SHORT had passed
        assert lock.renew("a", SHORT) is True
    holder = lock.holder()
    assert holder is not None and holder.owner == "a" and _left(holder.expires_at) > SHORT / 2


def _enqueued(q: alk.Queue, form: str) -> list[int]:
    """Two jobs expiring SHORT after their enqueue, written by ``form``."""
    if form == "many":
        return q.enqueue_many([{"n": 1}, {"n": 2}], expires=SHORT)
    if form == "unique":
        return [q.enqueue({"n": n}, expires=SHORT, unique_key=f"k{n}") for n in (1, 2)]
    return [q.enqueue({"n": n}, expires=SHORT) for n in (1, 2)]


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
@pytest.mark.parametrize("form", ["enqueue", "unique", "many"])
def test_an_enqueue_that_waited_for_the_lock_counts_its_expiry_from_when_it_lands(
    store: alk.Store, qname: str, form: str, traced: bool
) -> None:
    q = store.queue(qname)
    if traced:
        tracing.instrument()
    try:
        with app_writing(store):
            ids = _enqueued(q, form)
    finally:
        tracing.uninstrument()
    for job_id in ids:
        job = store.get_job(job_id)
        assert job is not None and job.state == "pending"
        assert _left(job.expires_at) > SHORT / 2, "the job was written (nearly) expired"
    assert sorted(h.id for h in q.claim_batch("w1", 2)) == sorted(ids)


def test_a_schedule_fire_with_an_expiry_lands_inside_its_own_transaction(store: alk.Store, qname: str) -> None:
    """A fire enqueues inside the transaction that advances the schedule: the enqueue joins
    it (its clock reading already comes from inside the lock)."""
    store.schedule("s", "@every 1s", qname, {"n": 1}, expires=60)
    q = store.queue(qname)
    deadline = time.monotonic() + WAIT
    while not store.schedules()[0].next_fire_at.timestamp() <= time.time():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with app_writing(store):
        assert store._scheduler().tick() >= 1
    (h,) = q.claim_batch("w1", 1)
    assert 30 < _left(h.job.expires_at) <= 60 + HOLD


def test_a_worker_registry_refresh_that_waited_for_the_lock_lists_the_worker(store: alk.Store) -> None:
    """SPEC §15: a worker is gone only once it stopped refreshing for three intervals; one
    whose refresh waited longer than that for the lock is still running."""
    registration = Registration(store, "w1", ["q"], 1, SHORT / 3)  # a row lapses SHORT after its refresh
    with app_writing(store):
        registration._refresh()
    (listed,) = store.workers()
    assert listed.id == "w1" and _left(listed.last_seen) > -SHORT / 2
