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
from alkstore_sa.worker.heartbeater import Heartbeater
from alkstore_sa.worker.registry import Registration
from tests.support import WAIT, FakeClock, Target

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


class _GatedClock:
    """A FakeClock reading that, once armed, holds its caller at the ``skip``-th call after
    arming (``inside`` is set) until ``go`` — a store's claim held while it has the write
    lock (the claim reads the clock again once BEGIN IMMEDIATE took it)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.armed = 0  # calls left before the one that is held (0: not armed)
        self.inside, self.go = threading.Event(), threading.Event()

    def arm(self, skip: int) -> None:
        self.armed = skip + 1

    def __call__(self) -> float:
        if self.armed:
            self.armed -= 1
            if not self.armed:
                self.inside.set()
                assert self.go.wait(WAIT)
        return self.clock()


class _SeenClock:
    """A FakeClock reading that says when it was read (``read``)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.read = threading.Event()

    def __call__(self) -> float:
        now = self.clock()
        self.read.set()
        return now


def _write_locked(path: str) -> bool:
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()
    return False


@pytest.mark.parametrize("limit", [1, 2])
def test_a_heartbeat_that_waited_past_its_lease_never_lifts_the_concurrency_limit(
    sqlite_db: Target, qname: str, limit: int
) -> None:
    """SPEC §14: at most N jobs of a queue hold a live claim at any moment. A heartbeat sent
    while its claim was live, whose write waited for the lock past the claim's deadline
    while a limited claim of the queue counted that claim as lapsed and gave its place to
    another job, must not make the lapsed claim live again beside that job (limit 1); with
    room left beside that job it is extended, as any heartbeat that waited (limit 2)."""
    clock = FakeClock()
    seen, gated = _SeenClock(clock), _GatedClock(clock)
    worker, other = sqlite_db.store(clock=seen), sqlite_db.store(clock=gated)
    try:
        q = worker.queue(qname, visibility_timeout=10)
        other.queue(qname).set_concurrency(limit)
        q.enqueue("x", priority=0)
        x = q.claim_one("w1")  # deadline: t + 10
        assert x is not None
        q.enqueue("y", priority=5)
        clock.advance(5)
        results: dict[str, object] = {}
        # the other process's claim takes the write lock and holds it at its clock reading
        gated.arm(skip=1)  # claim_batch's own reading first, then the one under the lock
        claimer = threading.Thread(target=lambda: results.update(claimed=other.queue(qname).claim_one("w2")))
        claimer.start()
        assert gated.inside.wait(WAIT)
        assert _write_locked(str(sqlite_db.engine.url.database))
        # the worker heartbeats x while its claim is live (t + 5); the write waits for the lock
        seen.read.clear()
        beater = threading.Thread(target=lambda: results.update(beat=x.heartbeat(30)))
        beater.start()
        assert seen.read.wait(WAIT)
        clock.advance(6)  # t + 11: x's claim lapses before either write lands
        gated.go.set()  # the claim reads t + 11: x is no longer live, so y may run
        claimer.join(WAIT)
        beater.join(WAIT)
        assert not claimer.is_alive() and not beater.is_alive()
        claimed = results["claimed"]
        assert claimed is not None and claimed.payload == "y"  # type: ignore[attr-defined]
        live = sqlite_db.scalar(
            f"SELECT count(*) FROM {sqlite_db.table('alkstore_jobs')} "
            "WHERE queue = :q AND state = 'processing' AND claim_expires_at > :now",
            q=qname, now=clock.now,
        )
        assert results["beat"] is (limit == 2)
        assert live == limit, f"{live} live claims under a concurrency limit of {limit}"
    finally:
        worker.close()
        other.close()


def test_a_workers_heartbeats_due_together_all_count_from_when_they_were_due(store: alk.Store, qname: str) -> None:
    """The worker's heartbeat thread beats its due claims one after another: the first
    waited for the lock, and the next one, sent only after it, found its claim's deadline
    passed meanwhile and was refused — its job marked lost (run again, never acked),
    though nobody could have taken the claim while the lock was held. The beats due
    together are one round, each live when it was due."""
    q = store.queue(qname, visibility_timeout=SHORT + 0.5)  # first beats due after 0.5 s
    q.enqueue_many([{"n": 1}, {"n": 2}])
    handles = q.claim_batch("w1", 2)
    assert len(handles) == 2
    beats = Heartbeater()
    beats.start()
    try:
        with app_writing(store):  # held from before the beats are due until after the claims' deadlines
            beats.add(handles)
        deadline = time.monotonic() + WAIT
        while any(_left(store.get_job(h.id).claim_expires_at) < SHORT / 2 for h in handles):  # type: ignore[union-attr]
            assert not any(beats.lost(h._claim) for h in handles), "a heartbeat due while its claim was live was refused"
            assert time.monotonic() < deadline, "the heartbeats did not land"
            time.sleep(0.05)
        assert not any(beats.lost(h._claim) for h in handles)
    finally:
        beats.stop()
