"""SPEC §9, the listen transport's edges: "listening when listen() returns" holds for every
subscriber of a channel, not only the one whose LISTEN was sent (issue 9 item 9); and on
PostgreSQL a listener that cannot reach the database makes listen() fail with a
DatabaseError after a bounded wait, while internal wake watches register and return. The
SQLite watcher looks at commits only while someone waits for them, and then at most once
per gap during a stream of commits; its safety check runs however often unrelated files in
the directory change."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa._backends import pg_listener
from alkstore_sa._backends.sqlite_watcher import SAFETY_POLL
from tests.support import WAIT, Target

DELIVERY = 10.0
ROUNDS = 30
RACERS = 3


def test_every_concurrent_listen_is_active_when_it_returns(store: alk.Store) -> None:
    """Threads race listen() on a fresh channel, then each notifies at once: each one's own
    notify, committed after its listen() returned, must reach its subscription."""
    failures: list[str] = []
    for rnd in range(ROUNDS):
        channel = f"race-{rnd}"
        barrier = threading.Barrier(RACERS)

        def racer(tag: str, channel: str = channel, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            with store.listen(channel) as sub:
                store.notify(channel, tag)
                seen = []
                while tag not in seen:
                    note = sub.get(timeout=DELIVERY)
                    if note is None:
                        failures.append(f"{channel}: {tag} never arrived (saw {seen})")
                        return
                    seen.append(note.payload)

        threads = [threading.Thread(target=racer, args=(f"t{i}",)) for i in range(RACERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DELIVERY * 3)
        assert not any(t.is_alive() for t in threads), "a racer hung"
        assert not failures, failures


def test_resubscribe_after_last_close_is_active(store: alk.Store) -> None:
    """Close the last subscription (UNLISTEN queued) and listen again at once, many times:
    the new subscription must not be left behind by the UNLISTEN."""
    for i in range(40):
        store.listen("flip").close()
        with store.listen("flip") as sub:
            store.notify("flip", str(i))
            assert sub.get(timeout=DELIVERY) == alk.Notification("flip", str(i))


# -- PostgreSQL: the listener cannot connect ---------------------------------------------------


@pytest.fixture
def unreachable(pg_db: Target, monkeypatch: pytest.MonkeyPatch) -> alk.Store:
    """PostgreSQL's listener connection only (SQLite has no listener connection)."""
    db = pg_db
    monkeypatch.setattr(pg_listener, "LISTEN_TIMEOUT", 1.0)
    # port 1 on loopback: nothing listens there, so every connection attempt is refused
    store = alk.Store(sa.make_url(db.url).set(port=1), schema=db.schema)
    yield store
    store.close()


def test_listen_fails_after_a_bounded_wait_when_the_listener_cannot_connect(unreachable: alk.Store) -> None:
    started = time.monotonic()
    with pytest.raises(alk.DatabaseError, match="listener"):
        unreachable.listen("nowhere")
    assert time.monotonic() - started < DELIVERY  # bounded (1 s here), never a hang
    assert not unreachable.hub().fanout.has(unreachable.backend.channel_key("nowhere"))


def test_queue_watch_registers_while_the_listener_cannot_connect(unreachable: alk.Store) -> None:
    """A worker's wake watch never fails for an unreachable database: it stays registered
    (LISTENed on reconnection, with a wake then) and the worker polls meanwhile."""
    hub = unreachable.hub()
    key = unreachable.backend.wake_key("q")
    token = hub.watch_queue(key, lambda: None)
    assert hub.fanout.has(key)
    hub.unwatch_queue(key, token)


def _counted_looks(hub: Any) -> list[int]:
    looks = [0]
    check = hub._check

    def counted() -> bool:
        looks[0] += 1
        return check()

    hub._check = counted
    return looks


def _watched_queue(store: alk.Store) -> tuple[Any, str, threading.Event]:
    """The store's hub with a watch on queue "watched": (hub, its wake key, set on a wake)."""
    hub = store.hub()
    key = store.backend.wake_key("watched")
    woken = threading.Event()
    hub.watch_queue(key, woken.set)
    return hub, key, woken


def _commit_stream(db: Target, count: int) -> float:
    """``count`` commits from another connection (each moves data_version and writes the
    -wal file, like a busy worker's claims and acks); the seconds they took."""
    with db.engine.connect() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS scratch (n INTEGER)"))
        conn.commit()
        time.sleep(0.05)
        started = time.monotonic()
        for i in range(count):
            conn.execute(sa.text("INSERT INTO scratch VALUES (:n)"), {"n": i})
            conn.commit()
        took = time.monotonic() - started
    time.sleep(0.05)
    return took


def test_sqlite_watcher_looks_at_most_once_per_gap_during_a_stream_of_commits(sqlite_db: Target) -> None:
    """While a queue's consumer waits (presence), every commit to the file wakes the SQLite
    watcher. A stream of commits must cost one look per ``MIN_GAP`` at most, not one per
    commit, and the enqueue at its end still wakes the queue's watcher. (Counted looks, not
    timings: the bound is computed from how long the stream actually took.)"""
    from alkstore_sa._backends import sqlite_watcher

    store = sqlite_db.store()
    try:
        hub, key, woken = _watched_queue(store)
        hub.advertise(key)  # as a worker does when it finds the queue empty
        time.sleep(0.05)
        looks = _counted_looks(hub)
        took = _commit_stream(sqlite_db, 300)
        # one look per gap, plus the settle re-looks a look that finds nothing may add
        bound = 2 * (took / sqlite_watcher.MIN_GAP + 1) + 10
        assert looks[0] <= bound, f"{looks[0]} looks for 300 commits in {took * 1000:.1f} ms"
        assert looks[0] < 300
        store.queue("watched").enqueue({"n": 1})
        assert woken.wait(WAIT), "the enqueue after the stream did not wake the queue's watcher"
    finally:
        store.close()


def test_sqlite_watcher_sleeps_while_nobody_waits_and_catches_up_on_presence(sqlite_db: Target) -> None:
    """A consumer busy on full claims gives no presence: the watcher then does not look at
    commits at all. A job committed meanwhile still wakes the queue once its consumer finds
    it empty and says so (``advertise`` makes the watcher look at once), and a wake
    withdraws the presence again."""
    store = sqlite_db.store()
    try:
        hub, key, woken = _watched_queue(store)
        time.sleep(0.05)
        looks = _counted_looks(hub)
        _commit_stream(sqlite_db, 100)
        store.queue("watched").enqueue({"n": 1})  # committed while nobody waits
        time.sleep(0.1)
        assert looks[0] == 0 and not woken.is_set()
        hub.advertise(key)  # the consumer's claim came back short: it waits now
        assert woken.wait(WAIT), "the job committed before the presence did not wake the queue"
        assert key not in hub._present  # withdrawn by that wake
        woken.clear()
        store.queue("watched").enqueue({"n": 2})
        time.sleep(0.1)
        assert not woken.is_set()  # no presence, no wake (the consumer claims anyway)
        hub.advertise(key)
        assert woken.wait(WAIT)
    finally:
        store.close()


def test_safety_check_runs_in_a_busy_directory(sqlite_db: Target) -> None:
    """The safety check covers file events the watch does not see (coalesced or missed):
    here the watch is made blind to the database's own files, and another file in the
    directory is written five times a second. The notification must still arrive by the
    safety check, within about its interval — unrelated events must not keep postponing it."""
    store = sqlite_db.store()
    try:
        sub = store.listen("ch")
        hub = store.hub()
        assert hub._watch is not None, "inotify is needed for this test"
        hub._watch._names = set()  # every event of the database's files goes unseen
        noisy = Path(sqlite_db.engine.url.database or "").parent / "app.log"
        stop = threading.Event()

        def noise() -> None:
            with noisy.open("a") as f:
                while not stop.is_set():
                    f.write("x\n")
                    f.flush()
                    time.sleep(0.2)

        writer = threading.Thread(target=noise, daemon=True)
        writer.start()
        try:
            time.sleep(0.5)
            other = sqlite_db.store()
            try:
                other.notify("ch", "hi")
            finally:
                other.close()
            sent = time.monotonic()
            note = sub.get(timeout=SAFETY_POLL * 5)
            took = time.monotonic() - sent
        finally:
            stop.set()
            writer.join(5)
        assert note is not None and note.payload == "hi", (
            "the safety check never ran while an unrelated file in the directory kept changing"
        )
        assert took < SAFETY_POLL * 3
    finally:
        store.close()


def test_pg_ended_stream_subscriptions_leave_nothing_in_the_listener(pg_db: Target) -> None:
    """Each stream (and queue) a subscription or worker had watched stayed in the PostgreSQL
    listener's set of wake keys after it ended — walked at every reconnection and at close:
    a process following per-tenant streams that come and go grew it without bound."""
    store = pg_db.store()
    try:
        for n in range(20):
            stop = alk.StopToken()
            events = store.stream(f"tenant-{n}").subscribe("c", stop)
            store.stream(f"tenant-{n}").publish(n)
            assert next(events).payload == n  # the subscription watches its stream
            stop.stop()
            events.close()
        assert not store.hub()._queue_keys
    finally:
        store.close()
