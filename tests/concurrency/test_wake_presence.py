"""SPEC §9 / §5.2, conditional wakes (docs/performance.md, "Wakes"): on PostgreSQL an enqueue
notifies only while a consumer of its queue waits (its listener holds the queue's wake
presence), so enqueues that nobody waits for never take the notifying commit's global lock.

- what an enqueue sends: nothing with nobody waiting; one wake once a listener advertised;
  nothing again after that wake withdrew the presence (every enqueue form);
- the go-idle race, across PROCESSES: an idle worker whose re-poll is an hour away gets
  every job, one after another, each enqueued by this process a random fraction of a
  millisecond after the worker handled the previous one — i.e. while it claims, finds the
  queue empty, advertises and claims once more. A job whose enqueue looked before the
  presence was taken and committed after the worker's last claim would wait for the hourly
  re-poll and fail the test. Both engines (SQLite wakes need no presence).

Timings are never asserted: ``PROMPT`` only tells the wake path from the hourly re-poll."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa._backends.pg_wire import WAKE_PRESENCE_CLASS
from tests.concurrency.test_wake import NO_POLL, PROMPT, IdleWorker
from tests.support import Target

ROUNDS = 150  # busy -> idle transitions raced against an enqueue


def _wakes(listener: psycopg.Connection, wait: float = 0.3) -> int:
    """Notifications that arrived on ``listener`` within ``wait`` seconds."""
    return sum(1 for _ in listener.notifies(timeout=wait, stop_after=None))


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PROMPT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


@pytest.fixture
def pg_listener(pg_db: Target):
    conn = psycopg.connect(pg_db.url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    yield conn
    conn.close()


def test_enqueue_notifies_only_while_a_consumer_waits(
    pg_db: Target, pg_listener: psycopg.Connection, qname: str
) -> None:
    store = pg_db.store()
    try:
        q = store.queue(qname)
        key = store.backend.wake_key(qname)
        pg_listener.execute(f'LISTEN "{key}"')
        hub = store.hub()
        local: list[float] = []  # wakes of this process's watcher
        token = hub.watch_queue(key, lambda: local.append(time.monotonic()))

        def advertise_settled() -> None:
            """Advertise; nothing in flight, so the presence settles and this process's
            watcher gets its one "claim once more" wake."""
            before = len(local)
            hub.advertise(key)
            _until(lambda: key in hub._held and key not in hub._unsettled and len(local) > before,
                   "the presence was not taken and settled")

        def withdrawn() -> None:
            _until(lambda: key not in hub._held, "the wake did not withdraw the presence")

        def released_on_the_server() -> None:
            """The hub forgets a presence before its connection gives the lock back: wait
            for the server to show it gone before an enqueue is expected to see nobody."""
            presence = (
                "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = %s::oid "
                "AND objid::bigint = (pg_catalog.hashtext(%s)::bigint & 4294967295)"
            )
            _until(lambda: pg_listener.execute(presence, (WAKE_PRESENCE_CLASS, key)).fetchone() == (0,),
                   "the presence lock was not given back")

        def enqueue_every_way() -> None:
            q.enqueue({"n": 1})
            q.enqueue_many([{"n": 2}, {"n": 3}])
            q.enqueue({"n": 4}, unique_key=f"u-{time.monotonic_ns()}")
            with Session(pg_db.engine) as session:
                alk.enqueue(session, qname, {"n": 5})
                session.commit()

        enqueue_every_way()
        assert _wakes(pg_listener) == 0, "an enqueue notified with nobody waiting"

        for form in range(4):
            advertise_settled()
            hub.advertise(key)  # held: nothing more is taken
            if form == 0:
                q.enqueue({"n": "woken"})
            elif form == 1:
                q.enqueue_many([{"n": "woken"}])
            elif form == 2:
                q.enqueue({"n": "woken"}, unique_key=f"w-{time.monotonic_ns()}")
            else:
                with Session(pg_db.engine) as session:
                    alk.enqueue(session, qname, {"n": "woken"})
                    session.commit()
            assert _wakes(pg_listener) == 1, f"form {form}: the waiting consumer was not woken"
            # the wake withdrew the presence (one-shot): the next enqueues wake nobody
            withdrawn()
            enqueue_every_way()
            assert _wakes(pg_listener) == 0, f"form {form}: an enqueue notified after the wake withdrew the presence"

        # the barrier: while an enqueue that looked before the presence was taken is
        # uncommitted, the presence stays unsettled (no "claim once more" yet: it would not
        # see the job); its commit settles it, and the watcher is woken to claim once more
        with Session(pg_db.engine) as session:
            alk.enqueue(session, qname, {"n": "in flight"})
            before = len(local)
            hub.advertise(key)
            _until(lambda: key in hub._held, "the presence was not taken")
            time.sleep(0.1)  # several barrier retries
            assert key in hub._unsettled and len(local) == before, "settled over an uncommitted enqueue"
            committed = time.monotonic()
            session.commit()
        _until(lambda: len(local) > before, "no claim-once-more wake after the enqueue committed")
        assert local[-1] >= committed and key not in hub._unsettled
        assert _wakes(pg_listener) == 0, "it looked before the presence was taken: no wake"
        q.enqueue({"n": "woken"})
        assert _wakes(pg_listener) == 1
        withdrawn()

        # a rolled-back enqueue sends nothing, even to a waiting consumer
        advertise_settled()
        with Session(pg_db.engine) as session:
            alk.enqueue(session, qname, {"n": "rolled back"})
            session.rollback()
        assert _wakes(pg_listener) == 0
        # and a consumer that stops watching stops waiting
        hub.unwatch_queue(key, token)
        withdrawn()
        released_on_the_server()
        q.enqueue({"n": "after unwatch"})
        assert _wakes(pg_listener) == 0
    finally:
        store.close()


@pytest.mark.slow
def test_worker_going_idle_during_an_enqueue_still_gets_the_job(
    db: Target, qname: str, tmp_path: Path
) -> None:
    parent = db.store()
    q = parent.queue(qname)
    w = IdleWorker(db, qname, tmp_path, poll_interval=NO_POLL, concurrency=1, max_seconds=600)
    rng = random.Random(11)
    try:
        w.wait_running(q)
        for i in range(ROUNDS):
            # a random point inside the worker's claim -> advertise -> claim-again sequence
            time.sleep(rng.uniform(0.0, 0.003))
            if i % 3 == 2:  # the caller's-transaction form: the check runs before the commit
                with Session(db.engine) as session:
                    job_id = alk.enqueue(session, qname, {"i": i})
                    time.sleep(rng.uniform(0.0, 0.003))  # uncommitted while the worker goes idle
                    session.commit()
            else:
                job_id = q.enqueue({"i": i})
            path = w.marks / f"{job_id}.json"
            deadline = time.monotonic() + PROMPT
            while not path.exists():
                assert time.monotonic() < deadline, (
                    f"round {i}: job {job_id} was not picked up within {PROMPT}s by a worker "
                    "that had just gone idle (polling hourly): its wake was missed"
                )
                time.sleep(0.0005)
        result = w.finish()
    finally:
        w.kill()
        parent.close()
    assert result["processed"] == ROUNDS + 1
