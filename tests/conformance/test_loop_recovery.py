"""The long-running loops ride out failures (issue 9 items 11 and 12), on both engines.

- A schedule that cannot fire (its payload is over the runner store's ``max_payload_bytes``)
  is retried on its own capped backoff, logged once per failure streak, and does not keep
  the other schedules from firing.
- ``run_schedules`` and ``Stream.subscribe`` survive database errors: retried with a capped
  backoff, logged once when the outage starts and once when it ends, and they deliver
  afterwards. The leadership rules hold throughout: no fire without a lease the database
  just confirmed; a renewal that failed while the lease may have lapsed goes back to
  acquiring; one refused by the database still raises ``LeadershipLost`` (SPEC §7).

Outages are real, never mocks: the tables a loop needs are renamed away and back (every
statement on them fails, as on a database that is down), and on PostgreSQL the store's
backends are also terminated in a loop with ``pg_terminate_backend`` (the store's engine
carries an ``application_name`` of its own, so only its connections are killed).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.scheduler import LEADER_LOCK
from tests.outages import kill_backends, tables_away
from tests.support import PG_URL, WAIT, FakeClock, Target, wait_for

LOGGER = "alkstore_sa"


@pytest.fixture(autouse=True)
def _clean_slate(db: Target) -> None:
    """Tests of one PostgreSQL module share a schema, and a tick fires every due schedule:
    each test starts with no schedules and no leadership lease."""
    for table in ("alkstore_schedules", "alkstore_locks"):
        db.execute(f"DELETE FROM {db.table(table)}")


@pytest.fixture
def engines() -> Iterator[list[sa.Engine]]:
    made: list[sa.Engine] = []
    yield made
    for engine in made:
        engine.dispose()


def own_engine(db: Target, engines: list[sa.Engine], app: str | None = None) -> sa.Engine:
    """An engine of the test's own (another Store's registration never meets the fixture's);
    on PostgreSQL tagged with ``application_name`` so a test can kill exactly its backends."""
    if db.kind == "sqlite":
        engine = sa.create_engine(db.url)
    else:
        engine = sa.create_engine(PG_URL, connect_args={"application_name": app or "alk-loop-test"})
    engines.append(engine)
    return engine


def count_jobs(db: Target, queue: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=queue))  # type: ignore[arg-type]


def holder(store: alk.Store) -> alk.LockInfo | None:
    return alk.Lock._reserved(store, LEADER_LOCK).holder()


def messages(caplog: pytest.LogCaptureFixture, *, min_level: int = logging.DEBUG, containing: str = "") -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno >= min_level and containing in r.getMessage()
    ]


def outage_lines(caplog: pytest.LogCaptureFixture, containing: str) -> tuple[list[str], list[str]]:
    """(WARNING-or-above lines, 'recovered' lines) that mention ``containing``."""
    bad = messages(caplog, min_level=logging.WARNING, containing=containing)
    back = [m for m in messages(caplog, min_level=logging.INFO, containing=containing) if "recovered" in m]
    return bad, back


class Runner:
    """``store.run_schedules(stop, lease=...)`` in a thread; its outcome kept for the test."""

    def __init__(self, store: alk.Store, lease: float) -> None:
        self.stop = alk.StopToken()
        self.outcome: list[Any] = []

        def target() -> None:
            try:
                store.run_schedules(self.stop, lease=lease)
                self.outcome.append("returned")
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.outcome.append(exc)

        self.thread = threading.Thread(target=target, name="run_schedules", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        assert not self.outcome, f"run_schedules ended: {self.outcome[0]!r}"
        return True

    def join(self) -> Any:
        self.stop.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "run_schedules did not return"
        return self.outcome[0]


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for r in started:
        r.stop.stop()
        r.thread.join(WAIT)


# -- item 11: a schedule that cannot fire ------------------------------------------------------


def test_a_schedule_that_cannot_fire_backs_off_logs_once_and_does_not_block_the_others(
    db: Target, engines: list[sa.Engine], clock: FakeClock, qname: str,
    runners: list[Runner], caplog: pytest.LogCaptureFixture,
) -> None:
    """Created through a store that allows a large payload, run through one that does not:
    the schedule stays due (at a frozen clock) and every tick could try it again."""
    big = alk.Store(own_engine(db, engines), schema=db.schema, clock=clock, max_payload_bytes=100_000)
    small = alk.Store(own_engine(db, engines), schema=db.schema, clock=clock, max_payload_bytes=200)
    try:
        big.schedule("too-big", "@every 1s", qname + "-big", {"blob": "x" * 1000})
        small.schedule("fine", "@every 1s", qname + "-fine", {"ok": True})
        caplog.set_level(logging.DEBUG, LOGGER)
        r = Runner(small, lease=3.0)
        runners.append(r)
        wait_for(lambda: holder(small), "the runner to lead")
        clock.advance(1.0)  # both schedules due
        wait_for(lambda: r.alive() and count_jobs(db, qname + "-fine") == 1, "'fine' to fire")
        time.sleep(2.0)  # 'too-big' stays due all along: a hot loop would try it ~2000 times
        clock.advance(1.0)
        wait_for(lambda: r.alive() and count_jobs(db, qname + "-fine") == 2, "'fine' to fire again")
        assert count_jobs(db, qname + "-big") == 0
        about = messages(caplog, containing="'too-big'")
        assert len(messages(caplog, min_level=logging.ERROR, containing="'too-big'")) == 1, about
        # every attempt logs at most one (DEBUG) line: a handful of attempts, not a spin
        assert 1 <= len(about) <= 10, about
        # fixing the schedule (re-registering a payload that fits) makes it fire promptly
        small.schedule("too-big", "@every 1s", qname + "-big", {"blob": "small now"})
        clock.advance(1.0)
        wait_for(lambda: r.alive() and count_jobs(db, qname + "-big") >= 1, "the fixed schedule to fire")
        # the fire commits before its ticker logs the recovery: the job can be seen first
        wait_for(
            lambda: any("recovered" in m for m in messages(caplog, min_level=logging.INFO, containing="'too-big'")),
            "the recovery to be logged",
        )
        assert r.join() == "returned"
    finally:
        big.close()
        small.close()


# -- item 12: run_schedules survives database errors --------------------------------------------


def test_run_schedules_rides_out_an_outage_logging_it_once(
    db: Target, store: alk.Store, clock: FakeClock, qname: str,
    runners: list[Runner], caplog: pytest.LogCaptureFixture,
) -> None:
    store.schedule("steady", "@every 1s", qname, {})
    caplog.set_level(logging.INFO, LOGGER)
    r = Runner(store, lease=6.0)  # renews every 2 s; the outage below stays well inside 6 s
    runners.append(r)
    owner = wait_for(lambda: holder(store), "the runner to lead").owner
    clock.advance(1.0)
    wait_for(lambda: count_jobs(db, qname) == 1, "the first fire")
    with tables_away(db, "alkstore_locks", "alkstore_schedules"):
        wait_for(lambda: r.alive() and outage_lines(caplog, owner)[0], "the runner to hit the outage")
        time.sleep(1.0)  # several retries' worth of outage (still within the lease)
        assert r.alive()
    clock.advance(1.0)
    wait_for(lambda: r.alive() and count_jobs(db, qname) == 2, "a fire after the outage")
    bad, back = outage_lines(caplog, owner)
    assert len(bad) == 1, bad  # once per outage, not per attempt
    wait_for(lambda: outage_lines(caplog, owner)[1], "the recovery line")
    assert len(outage_lines(caplog, owner)[1]) == 1
    h = holder(store)
    assert h is not None and h.owner == owner  # still the same leader
    assert r.join() == "returned"
    assert holder(store) is None  # released on stop


def test_a_leader_whose_lease_may_have_lapsed_in_an_outage_goes_back_to_acquiring(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, runners: list[Runner],
) -> None:
    """The renewals fail for longer than the lease: the runner cannot know whether it still
    leads, so it fires nothing until it acquires again; meanwhile another owner took the
    lease, and the runner waits for it rather than raising or firing on the stale lease."""
    store.schedule("stale", "@every 1s", qname, {})
    r = Runner(store, lease=0.6)
    runners.append(r)
    owner = wait_for(lambda: holder(store), "the runner to lead").owner
    with tables_away(db, "alkstore_locks"):
        time.sleep(1.5)  # more than the lease (real time): it may have lapsed
        db.execute(
            f"UPDATE {db.table('alkstore_locks_away')} SET owner = 'thief', expires_at = :exp "
            "WHERE name = :name",
            exp=clock() + 3600, name=LEADER_LOCK,
        )
        clock.advance(1.0)  # a boundary falls due during the outage: it must not fire
        time.sleep(0.5)
        assert r.alive() and count_jobs(db, qname) == 0
    time.sleep(1.0)  # the lock table is back, held by the thief
    assert r.alive() and count_jobs(db, qname) == 0
    h = holder(store)
    assert h is not None and h.owner == "thief"
    db.execute(f"DELETE FROM {db.table('alkstore_locks')} WHERE owner = 'thief'")
    wait_for(lambda: r.alive() and (h := holder(store)) is not None and h.owner == owner, "the runner to lead again")
    wait_for(lambda: r.alive() and count_jobs(db, qname) == 1, "the due boundary to fire once it leads")
    assert r.join() == "returned"
    assert holder(store) is None


def test_a_renewal_refused_after_an_outage_within_the_lease_raises_leadership_lost(
    db: Target, store: alk.Store, clock: FakeClock, qname: str,
    runners: list[Runner], caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewal that failed while the lease is surely still valid is retried; when the
    database then answers that the lease is another's, that is LeadershipLost (SPEC §7)."""
    store.schedule("refused", "@every 1s", qname, {})
    caplog.set_level(logging.INFO, LOGGER)
    r = Runner(store, lease=6.0)  # renews every 2 s; the outage below is far shorter than 6 s
    runners.append(r)
    owner = wait_for(lambda: holder(store), "the runner to lead").owner
    with tables_away(db, "alkstore_locks"):
        db.execute(
            f"UPDATE {db.table('alkstore_locks_away')} SET owner = 'thief', expires_at = :exp "
            "WHERE name = :name",
            exp=clock() + 3600, name=LEADER_LOCK,
        )
        clock.advance(1.0)
        wait_for(lambda: r.alive() and outage_lines(caplog, owner)[0], "a renewal to fail")
    r.thread.join(WAIT)
    assert r.outcome and isinstance(r.outcome[0], alk.LeadershipLost), r.outcome
    assert count_jobs(db, qname) == 0  # never fired on the lease it lost
    h = holder(store)
    assert h is not None and h.owner == "thief"  # the loser left the thief's lease alone


def test_a_stop_during_an_outage_returns_cleanly(
    db: Target, store: alk.Store, runners: list[Runner], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    r = Runner(store, lease=1.5)
    runners.append(r)
    owner = wait_for(lambda: holder(store), "the runner to lead").owner
    with tables_away(db, "alkstore_locks"):
        wait_for(lambda: r.alive() and outage_lines(caplog, owner)[0], "the runner to hit the outage")
        assert r.join() == "returned"  # the release is best effort: it failed, and that is fine


def test_a_standby_rides_out_an_outage_and_takes_over(
    db: Target, store: alk.Store, engines: list[sa.Engine], clock: FakeClock, qname: str,
    runners: list[Runner], caplog: pytest.LogCaptureFixture,
) -> None:
    other = alk.Store(own_engine(db, engines), schema=db.schema, clock=clock)
    try:
        caplog.set_level(logging.INFO, LOGGER)
        store.schedule("handover", "@every 1s", qname, {})
        a = Runner(store, lease=3.0)
        runners.append(a)
        first = wait_for(lambda: holder(store), "runner a to lead").owner
        b = Runner(other, lease=3.0)
        runners.append(b)
        with tables_away(db, "alkstore_locks"):
            time.sleep(1.0)  # both fail; neither dies
            assert a.alive() and b.alive()
        assert a.join() == "returned"
        wait_for(lambda: (h := holder(store)) is not None and h.owner != first, "runner b to take over")
        clock.advance(1.0)
        wait_for(lambda: b.alive() and count_jobs(db, qname) == 1, "runner b to fire")
        assert b.join() == "returned"
    finally:
        other.close()


def test_run_schedules_survives_killed_connections(
    pg_db: Target, engines: list[sa.Engine], qname: str, runners: list[Runner],
) -> None:
    """pg_terminate_backend is PostgreSQL's (SQLite's outages are the renamed tables)."""
    db = pg_db
    app = f"alk-loop-{uuid.uuid4().hex[:8]}"
    store = alk.Store(own_engine(db, engines, app), schema=db.schema)  # the database clock
    try:
        store.schedule("killed", "@every 1s", qname, {})
        r = Runner(store, lease=3.0)
        runners.append(r)
        wait_for(lambda: r.alive() and count_jobs(db, qname) >= 1, "the runner to fire")
        assert kill_backends(app, 0.5) >= 1
        before = count_jobs(db, qname)
        wait_for(lambda: r.alive() and count_jobs(db, qname) >= before + 2, "fires after the kills")
        assert r.join() == "returned"
        wait_for(lambda: holder(store) is None, "the lease to be released")
    finally:
        store.close()


# -- item 12: Stream.subscribe survives database errors ------------------------------------------


class Follower:
    """``stream.subscribe(...)`` on a thread, collecting the offsets it yields."""

    def __init__(self, stream: alk.Stream, consumer: str, poll_interval: float) -> None:
        self.stop = alk.StopToken()
        self.offsets: list[int] = []
        self.error: BaseException | None = None
        iterator = stream.subscribe(consumer, self.stop, poll_interval=poll_interval)

        def run() -> None:
            try:
                for event in iterator:
                    self.offsets.append(event.offset)
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.error = exc

        self.thread = threading.Thread(target=run, name="subscribe", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        assert self.error is None and self.thread.is_alive(), f"the subscription ended: {self.error!r}"
        return True

    def close(self) -> None:
        self.stop.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def test_subscribe_rides_out_an_outage_logging_it_once(
    db: Target, dbstore: alk.Store, qname: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    st = dbstore.stream(qname)
    st.publish({"n": 1})
    f = Follower(st, "reader", poll_interval=0.2)
    try:
        wait_for(lambda: f.alive() and f.offsets == [1], "the first event")
        with tables_away(db, "alkstore_stream_events"):
            wait_for(lambda: f.alive() and outage_lines(caplog, qname)[0], "the subscription to hit the outage")
            time.sleep(1.0)  # several retries' worth
            assert f.alive()
        st.publish({"n": 2})
        st.publish({"n": 3})
        wait_for(lambda: f.alive() and f.offsets == [1, 2, 3], "the events after the outage")
        bad, _ = outage_lines(caplog, qname)
        assert len(bad) == 1, bad
        wait_for(lambda: len(outage_lines(caplog, qname)[1]) == 1, "one recovery line")
    finally:
        f.close()
    assert f.error is None


def test_subscribe_survives_killed_connections(
    pg_db: Target, engines: list[sa.Engine], qname: str,
) -> None:
    """pg_terminate_backend is PostgreSQL's (SQLite's outages are the renamed tables)."""
    db = pg_db
    app = f"alk-loop-{uuid.uuid4().hex[:8]}"
    store = alk.Store(own_engine(db, engines, app), schema=db.schema)
    publisher = alk.Store(own_engine(db, engines, "alk-loop-publisher"), schema=db.schema)
    try:
        pub = publisher.stream(qname)
        pub.publish({"n": 1})
        f = Follower(store.stream(qname), "reader", poll_interval=0.2)
        try:
            wait_for(lambda: f.alive() and f.offsets == [1], "the first event")
            done = threading.Event()

            def publish_during_the_kills() -> None:
                for n in range(2, 12):
                    pub.publish({"n": n})
                    time.sleep(0.05)
                done.set()

            t = threading.Thread(target=publish_during_the_kills, daemon=True)
            t.start()
            assert kill_backends(app, 0.5) >= 1
            t.join(WAIT)
            assert done.is_set()
            pub.publish({"n": 12})
            wait_for(lambda: f.alive() and f.offsets == list(range(1, 13)), "every event, in order, once")
        finally:
            f.close()
        assert f.error is None
    finally:
        store.close()
        publisher.close()
