"""SPEC §9, the listen transport's edges: "listening when listen() returns" holds for every
subscriber of a channel, not only the one whose LISTEN was sent (issue 9 item 9); and on
PostgreSQL a listener that cannot reach the database makes listen() fail with a
DatabaseError after a bounded wait, while internal wake watches register and return."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa._backends import pg_listener
from tests.support import Target

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


def test_sqlite_watcher_looks_at_most_once_per_gap_during_a_stream_of_commits(sqlite_db: Target) -> None:
    """Every commit to the file wakes the SQLite watcher (a busy worker's own claims and acks
    included). A stream of commits must cost one look per ``MIN_GAP`` at most, not one per
    commit, and the enqueue at its end still wakes the queue's watcher. (Counted looks, not
    timings: the bound is computed from how long the stream actually took.)"""
    from alkstore_sa._backends import sqlite_watcher

    store = sqlite_db.store()
    try:
        hub = store.hub()
        woken = threading.Event()
        hub.watch_queue(store.backend.wake_key("watched"), woken.set)
        looks = [0]
        check = hub._check

        def counted() -> bool:
            looks[0] += 1
            return check()

        hub._check = counted
        with sqlite_db.engine.connect() as conn:  # another connection: its commits move data_version
            conn.execute(sa.text("CREATE TABLE scratch (n INTEGER)"))
            conn.commit()
            time.sleep(0.05)
            before = looks[0]
            started = time.monotonic()
            for i in range(300):
                conn.execute(sa.text("INSERT INTO scratch VALUES (:n)"), {"n": i})
                conn.commit()
            took = time.monotonic() - started
        time.sleep(0.05)
        during = looks[0] - before
        # one look per gap, plus the settle re-looks a look that finds nothing may add
        bound = 2 * (took / sqlite_watcher.MIN_GAP + 1) + 10
        assert during <= bound, f"{during} looks for 300 commits in {took * 1000:.1f} ms"
        assert during < 300
        store.queue("watched").enqueue({"n": 1})
        assert woken.wait(5), "the enqueue after the stream did not wake the queue's watcher"
    finally:
        store.close()
