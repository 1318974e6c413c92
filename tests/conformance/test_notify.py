"""SPEC §9: notify / listen on both engines — fan-out, transactional delivery, channel
names of any length and character, payload validation, the Subscription surface, and the
SQLite notifications table's engine-side cap."""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
import weakref
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa._backends.sql import NOTIFY_READERS
from alkstore_sa._backends.sqlite import NOTIFY_KEEP, NOTIFY_PRUNE_EVERY, NOTIFY_READER_TTL
from alkstore_sa._backends.sqlite_watcher import SAVE_EVERY, SAVE_ROWS
from tests.support import Target, new_pg_schema, wait_for

DELIVERY = 10.0  # seconds a delivery may take before the test fails (never a speed claim)
QUIET = 0.3  # seconds of silence that stand for "not delivered" where no fence fits


def _fence(store: alk.Store, sub: alk.Subscription, channel: str | None = None) -> None:
    """Prove nothing else is queued for ``sub``: a fresh notify on its channel, committed
    after everything before it, must be the very next item (one subscription's
    notifications arrive in commit order)."""
    channel = sub.channel if channel is None else channel
    store.notify(channel, "~fence~")
    assert sub.get(timeout=DELIVERY) == alk.Notification(channel, "~fence~")


def _await_queued(sub: alk.Subscription, n: int) -> None:
    """Wait until ``n`` notifications have reached ``sub`` without taking any."""
    deadline = time.monotonic() + DELIVERY
    while sub._items.qsize() < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sub._items.qsize() == n


def _payloads(sub: alk.Subscription, n: int) -> list[str]:
    out = []
    for _ in range(n):
        note = sub.get(timeout=DELIVERY)
        assert note is not None, f"only {len(out)} of {n} notifications arrived: {out}"
        out.append(note.payload)
    return out


# -- fan-out ------------------------------------------------------------------------------


def test_notify_reaches_every_subscriber(db: Target, store: alk.Store) -> None:
    other = db.store()  # a second store: its own listener/watcher
    try:
        a = store.listen("orders")
        b = store.listen("orders")
        c = other.listen("orders")
        elsewhere = store.listen("orders-2")
        store.notify("orders", "first")
        other.notify("orders", "second")
        for sub in (a, b, c):
            first, second = sub.get(timeout=DELIVERY), sub.get(timeout=DELIVERY)
            assert first == alk.Notification("orders", "first")
            assert second == alk.Notification("orders", "second")
        _fence(store, elsewhere)
        for sub in (a, b, c, elsewhere):
            sub.close()
    finally:
        other.close()


def test_default_payload_is_empty_text(store: alk.Store) -> None:
    with store.listen("pings") as sub:
        store.notify("pings")
        assert sub.get(timeout=DELIVERY) == alk.Notification("pings", "")


def test_notify_before_listen_is_not_delivered(store: alk.Store) -> None:
    store.notify("early", "sent before anyone listened")
    with store.listen("early") as sub:
        store.notify("early", "after")
        assert sub.get(timeout=DELIVERY) == alk.Notification("early", "after")


def test_order_is_kept_per_subscription(store: alk.Store) -> None:
    with store.listen("seq") as sub:
        for i in range(50):
            store.notify("seq", str(i))
        assert _payloads(sub, 50) == [str(i) for i in range(50)]


# -- in the caller's transaction -----------------------------------------------------------


def test_session_notify_only_on_commit(db: Target, store: alk.Store) -> None:
    with store.listen("tx") as sub, Session(db.engine) as session:
        alk.notify(session, "tx", "rolled back")
        session.rollback()
        _fence(store, sub)

        alk.notify(session, "tx", "committed")
        if db.kind == "postgresql":  # SQLite: the open write transaction holds the writer lock
            _fence(store, sub)  # another transaction's commit passes; this one is not out yet
        session.commit()
        assert sub.get(timeout=DELIVERY) == alk.Notification("tx", "committed")
        _fence(store, sub)  # and the rolled-back one never surfaces


def test_connection_notify_follows_the_connection_transaction(db: Target, store: alk.Store) -> None:
    with store.listen("conn-tx") as sub:
        with db.engine.connect() as conn:
            tx = conn.begin()
            alk.notify(conn, "conn-tx", "no")
            tx.rollback()
            with conn.begin():
                alk.notify(conn, "conn-tx", "yes")
        assert sub.get(timeout=DELIVERY) == alk.Notification("conn-tx", "yes")
        _fence(store, sub)


# -- channel names ----------------------------------------------------------------------------

ODD_NAMES = {
    "200-chars": "n" * 200,
    "200-multibyte": "通" * 200,  # 600 UTF-8 bytes
    "quotes": "it's a \"quoted\" name",
    "sql": "x'; DROP TABLE alkstore_jobs; --",
    "unicode": "ünïcødé ☃ 通知 🚀",
    "spaces-newline": "  a\tb\nc  ",
    "case-Upper": "Orders",
    "reserved-prefix-inside": "x__alkstore.internal",  # only a leading __alkstore is reserved
}


@pytest.mark.parametrize("name", list(ODD_NAMES.values()), ids=list(ODD_NAMES))
def test_odd_channel_names_round_trip(store: alk.Store, name: str) -> None:
    with store.listen(name) as sub:
        store.notify(name, "payload for " + name)
        assert sub.get(timeout=DELIVERY) == alk.Notification(name, "payload for " + name)


def test_channel_names_are_case_sensitive(store: alk.Store) -> None:
    with store.listen("Orders") as upper, store.listen("orders") as lower:
        store.notify("orders", "lower")
        assert lower.get(timeout=DELIVERY) == alk.Notification("orders", "lower")
        _fence(store, upper)


@pytest.mark.parametrize("prefix", ["p" * 63, "é" * 40], ids=["ascii", "multibyte"])
def test_long_names_sharing_63_bytes_do_not_collide(store: alk.Store, prefix: str) -> None:
    """PostgreSQL truncates identifiers at 63 bytes: the mapping must keep these apart."""
    assert len(prefix.encode()) >= 63
    one, two = prefix + "-one" + "x" * 50, prefix + "-two" + "x" * 50
    with store.listen(one) as sub_one, store.listen(two) as sub_two:
        store.notify(one, "1")
        assert sub_one.get(timeout=DELIVERY) == alk.Notification(one, "1")
        store.notify(two, "2")
        assert sub_two.get(timeout=DELIVERY) == alk.Notification(two, "2"), "got the other name's"
        _fence(store, sub_one)


def test_channels_of_two_schemas_do_not_meet(_pg_module_target: Target) -> None:
    """PostgreSQL only: stores on two schemas of one database share one NOTIFY namespace;
    the mapping keeps them apart. (On SQLite each database file is its own namespace.)"""
    db = _pg_module_target
    store = db.store()
    schema = new_pg_schema("n")
    migrations.upgrade(db.engine, schema=schema)
    other = alk.Store(db.engine.url.render_as_string(hide_password=False), schema=schema)
    try:
        with store.listen("shared") as mine, other.listen("shared") as theirs:
            other.notify("shared", "theirs")
            assert theirs.get(timeout=DELIVERY) == alk.Notification("shared", "theirs")
            _fence(store, mine)
    finally:
        other.close()
        store.close()
        db.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.parametrize("bad", ["", "a" * 201, "nul\x00byte", "lone\ud800surrogate", 7, None, b"bytes"])
def test_invalid_channel_names_are_refused(store: alk.Store, db: Target, bad: object) -> None:
    with pytest.raises(alk.InvalidName):
        store.notify(bad, "x")  # type: ignore[arg-type]
    with pytest.raises(alk.InvalidName):
        store.listen(bad)  # type: ignore[arg-type]
    with Session(db.engine) as session, pytest.raises(alk.InvalidName):
        alk.notify(session, bad, "x")  # type: ignore[arg-type]


# -- payloads ---------------------------------------------------------------------------------

BAD_PAYLOADS = {
    "bytes": b"text",
    "int": 42,
    "none": None,
    "dict": {"a": 1},
    "nul": "a\x00b",
    "8000-ascii": "a" * 8000,
    "8000-bytes-of-4000-chars": "é" * 4000,
    "lone-surrogate": "x\udc80",
}


@pytest.mark.parametrize("payload", list(BAD_PAYLOADS.values()), ids=list(BAD_PAYLOADS))
def test_bad_payloads_raise_payload_error_and_send_nothing(db: Target, store: alk.Store, payload: object) -> None:
    with store.listen("bad-payload") as sub:
        with pytest.raises(alk.PayloadError):
            store.notify("bad-payload", payload)  # type: ignore[arg-type]
        with Session(db.engine) as session:
            with pytest.raises(alk.PayloadError):
                alk.notify(session, "bad-payload", payload)  # type: ignore[arg-type]
            alk.notify(session, "bad-payload", "still usable")  # the session is unharmed
            session.commit()
        assert sub.get(timeout=DELIVERY) == alk.Notification("bad-payload", "still usable")
        _fence(store, sub)


@pytest.mark.parametrize("payload", ["a" * 7999, "é" * 3999 + "a", "🚀" * 1999 + "abc", "quote ' \" \\ ;"])
def test_payloads_up_to_7999_bytes_arrive_intact(store: alk.Store, payload: str) -> None:
    assert len(payload.encode()) <= 7999
    with store.listen("big") as sub:
        store.notify("big", payload)
        note = sub.get(timeout=DELIVERY)
        assert note is not None and note.payload == payload


# -- the Subscription surface ---------------------------------------------------------------


def test_get_times_out_with_none(store: alk.Store) -> None:
    with store.listen("silence") as sub:
        assert sub.get(timeout=0.05) is None
        assert sub.get(timeout=0) is None
        store.notify("silence", "now")
        assert sub.get(timeout=DELIVERY) == alk.Notification("silence", "now")


@pytest.mark.parametrize(
    "bad", [-1, -0.001, float("nan"), float("inf"), float("-inf"), True, False, "1", b"1", [1], 101 * 365.25 * 86400],
    ids=repr,
)
def test_a_bad_get_timeout_raises_invalid_options_and_takes_nothing(store: alk.Store, bad: object) -> None:
    with store.listen("timeouts") as sub:
        store.notify("timeouts", "kept")
        _await_queued(sub, 1)
        with pytest.raises(alk.InvalidOptions, match="timeout"):
            sub.get(timeout=bad)  # type: ignore[arg-type]
        assert sub.get(timeout=0) == alk.Notification("timeouts", "kept")


def test_get_timeouts_none_zero_and_timedelta(store: alk.Store) -> None:
    """None waits until a notification (or a close), 0 only looks, a timedelta is seconds."""
    with store.listen("timeouts-ok") as sub:
        assert sub.get(timeout=0) is None
        assert sub.get(timeout=0.0) is None
        assert sub.get(timeout=timedelta(milliseconds=20)) is None
        store.notify("timeouts-ok", "a")
        assert sub.get(timeout=None) == alk.Notification("timeouts-ok", "a")


def test_iteration_yields_in_order_and_ends_at_close(store: alk.Store) -> None:
    sub = store.listen("iter")
    seen: list[str] = []
    ended = threading.Event()

    def consume() -> None:
        for note in sub:
            assert note.channel == "iter"
            seen.append(note.payload)
        ended.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for i in range(5):
        store.notify("iter", f"m{i}")
    deadline = DELIVERY
    while len(seen) < 5 and deadline > 0:
        ended.wait(0.05)
        deadline -= 0.05
    assert seen == [f"m{i}" for i in range(5)]
    assert not ended.is_set(), "iteration ended before close()"

    sub.close()  # the iterator is blocked waiting for the next one: close ends it
    t.join(DELIVERY)
    assert not t.is_alive(), "a blocked iterator did not end at close()"
    assert ended.is_set()


def test_blocked_get_returns_none_at_close(store: alk.Store) -> None:
    sub = store.listen("blocked-get")
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(sub.get()), daemon=True)  # no timeout
    t.start()
    t.join(0.2)
    assert t.is_alive()
    sub.close()
    t.join(DELIVERY)
    assert not t.is_alive() and got == [None]


def test_closed_subscription_receives_nothing_and_close_is_idempotent(store: alk.Store) -> None:
    sub = store.listen("closing")
    keep = store.listen("closing")
    sub.close()
    sub.close()
    store.notify("closing", "after close")
    assert keep.get(timeout=DELIVERY) == alk.Notification("closing", "after close")
    assert sub.get(timeout=QUIET) is None
    assert sub.get() is None, "get() without timeout must not block on a closed subscription"
    assert list(sub) == []
    keep.close()


def test_a_subscription_dropped_without_close_is_freed_and_queues_nothing(store: alk.Store) -> None:
    """The store's listener held every subscription, so one dropped without ``close()`` (a
    request handler's, say) was never freed and went on queueing every notification of its
    channel for nobody: memory grew with the traffic, for the life of the store."""
    dropped = store.listen("dropped")
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None, "the store still holds the dropped subscription"
    with store.listen("dropped") as live:  # the channel still works for the others
        store.notify("dropped", "after")
        assert live.get(timeout=DELIVERY) == alk.Notification("dropped", "after")
    # ... and its registration went at the next listen(): one dropped per request adds up
    with store.listen("another"):
        assert not store.hub().fanout.has(store.backend.channel_key("dropped"))


def test_a_subscription_made_before_a_fork_listens_in_the_child(store: alk.Store) -> None:
    """A pre-fork server (gunicorn --preload) made a subscription at import time: in each
    forked child it stayed tied to the parent's listener thread, which a child does not
    have, so its ``get()`` waited forever. In a child it listens again (the child's own
    listener, as a worker's wakes do) from its first use there."""
    sub = store.listen("forked")
    ready_r, ready_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(ready_r)
            os.close(out_r)
            assert sub.get(timeout=0) is None  # its first use here: listening from now
            os.write(ready_w, b"x")
            note = sub.get(timeout=DELIVERY)
            os.write(out_w, (note.payload if note is not None else "<nothing>").encode())
            sub.close()
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(out_w)
    try:
        assert os.read(ready_r, 1) == b"x", "the child did not start listening"
        store.notify("forked", "to the child")
        got = os.read(out_r, 100).decode()
    finally:
        _, status = os.waitpid(pid, 0)
        for fd in (ready_r, out_r):
            os.close(fd)
    assert got == "to the child"
    assert os.waitstatus_to_exitcode(status) == 0
    assert sub.get(timeout=DELIVERY) == alk.Notification("forked", "to the child")  # the parent's still works
    sub.close()


def test_listen_on_a_closed_store_raises(db: Target) -> None:
    s = db.store()
    s.close()
    with pytest.raises(alk.StoreClosed):
        s.listen("x")
    with pytest.raises(alk.StoreClosed):
        s.notify("x", "y")


def test_store_close_ends_every_live_subscription_with_store_closed(db: Target) -> None:
    """SPEC §3: a subscription is a handle made from its store. close() wakes a blocked
    iteration and a blocked get() of every live subscription with StoreClosed (as a
    running ``stream.subscribe`` ends), and a later get() raises it too, also with
    notifications still queued; the subscription's own close() stays a quiet no-op."""
    s = db.store()
    iterated, waiting, queued = s.listen("closing-store"), s.listen("closing-store"), s.listen("other")
    s.notify("other", "still queued")
    deadline = time.monotonic() + DELIVERY
    while queued._items.qsize() == 0 and time.monotonic() < deadline:  # delivered, not taken
        time.sleep(0.01)
    assert queued._items.qsize() == 1
    outcomes: dict[str, object] = {}
    yielded: list[alk.Notification] = []

    def iterate() -> None:
        try:
            yielded.extend(iterated)
            outcomes["iteration"] = "ended"
        except alk.AlkstoreError as exc:
            outcomes["iteration"] = exc

    def get() -> None:
        try:
            outcomes["get"] = waiting.get()  # no timeout: blocks until close
        except alk.AlkstoreError as exc:
            outcomes["get"] = exc

    threads = [threading.Thread(target=f, daemon=True) for f in (iterate, get)]
    for t in threads:
        t.start()
    threads[0].join(QUIET)
    assert all(t.is_alive() for t in threads)
    s.close()
    for t in threads:
        t.join(DELIVERY)
    assert not any(t.is_alive() for t in threads), "a blocked subscription outlived store.close()"
    assert isinstance(outcomes["iteration"], alk.StoreClosed), outcomes
    assert isinstance(outcomes["get"], alk.StoreClosed), outcomes
    assert yielded == []
    for sub in (iterated, waiting, queued):
        with pytest.raises(alk.StoreClosed):
            sub.get(timeout=0.1)
        with pytest.raises(alk.StoreClosed):
            sub.get()
        with pytest.raises(alk.StoreClosed):
            next(iter(sub))
        sub.close()
        sub.close()


def test_a_subscription_closed_before_its_store_raises_store_closed_after(db: Target) -> None:
    s = db.store()
    sub = s.listen("closed-first")
    sub.close()
    assert sub.get(timeout=0) is None
    s.close()
    with pytest.raises(alk.StoreClosed):
        sub.get(timeout=0)


# -- volume: the SQLite table is capped by the engine --------------------------------------


def test_ten_thousand_notifies(db: Target, store: alk.Store) -> None:
    """SQLite: the notifications table stays bounded (no consumer chore) while a live
    subscriber keeps receiving, in order, through the newest. PostgreSQL: every one arrives."""
    n = 10_000
    with store.listen("volume") as sub:
        peak = 0
        for i in range(n):
            store.notify("volume", str(i))
            if db.kind == "sqlite" and i % 1000 == 999:
                peak = max(peak, int(db.scalar('SELECT count(*) FROM "alkstore_notifications"')))  # type: ignore[arg-type]
        got: list[int] = []
        while not got or got[-1] != n - 1:
            note = sub.get(timeout=DELIVERY)
            assert note is not None, f"the newest notification never arrived (last seen {got[-1:]})"
            got.append(int(note.payload))
        if db.kind == "sqlite":
            # what the subscriber has read is let go once its reading place is saved (within
            # SAVE_EVERY of the read): the next prune leaves only the newest NOTIFY_KEEP
            time.sleep(SAVE_EVERY + 0.5)
            for i in range(NOTIFY_PRUNE_EVERY):
                store.notify("volume", f"after-{i}")
    assert got == list(range(n)), "lost, out of order or duplicated"
    if db.kind == "sqlite":
        rows = int(db.scalar('SELECT count(*) FROM "alkstore_notifications"'))  # type: ignore[arg-type]
        assert rows <= NOTIFY_KEEP + NOTIFY_PRUNE_EVERY, rows
        # while it was receiving, the table held at most the newest NOTIFY_KEEP plus what the
        # subscriber had not yet read or not yet said it read: far below the 10,000 sent
        assert peak < n // 2, peak
        newest = int(db.scalar('SELECT max(id) FROM "alkstore_notifications"'))  # type: ignore[arg-type]
        oldest = int(db.scalar('SELECT min(id) FROM "alkstore_notifications"'))  # type: ignore[arg-type]
        assert newest - oldest < NOTIFY_KEEP + NOTIFY_PRUNE_EVERY


def _places(db: Target) -> dict[str, int]:
    """The SQLite watchers' saved reading places: consumer -> last notification id read."""
    with db.engine.connect() as c:
        rows = c.exec_driver_sql(
            'SELECT consumer, "offset" FROM alkstore_stream_offsets WHERE stream = ?', (NOTIFY_READERS,)
        ).all()
    return {consumer: offset for consumer, offset in rows}


def _place_of_another_process(db: Target, offset: int, heard: float) -> None:
    """A reading place as another process's watcher saves it, last heard at ``heard``."""
    db.execute(
        'INSERT INTO alkstore_stream_offsets (stream, consumer, "offset", updated_at) '
        "VALUES (:s, 'other-process', :o, :t)",
        s=NOTIFY_READERS, o=offset, t=heard,
    )


def _note_rows(db: Target) -> int:
    return int(db.scalar('SELECT count(*) FROM "alkstore_notifications"'))  # type: ignore[arg-type]


def test_sqlite_a_live_reader_behind_keeps_what_it_has_not_read(sqlite_db: Target) -> None:
    store = sqlite_db.store()
    store.notify("c", "before")
    _place_of_another_process(sqlite_db, offset=1, heard=time.time())
    for i in range(3 * NOTIFY_KEEP):
        store.notify("c", str(i))
    assert _note_rows(sqlite_db) == 3 * NOTIFY_KEEP  # every row after its place
    store.close()


def test_sqlite_a_reader_gone_past_its_ttl_holds_nothing_and_is_forgotten(sqlite_db: Target) -> None:
    store = sqlite_db.store()
    _place_of_another_process(sqlite_db, offset=0, heard=time.time() - NOTIFY_READER_TTL - 1)
    for i in range(3 * NOTIFY_KEEP):
        store.notify("c", str(i))
    assert _note_rows(sqlite_db) <= NOTIFY_KEEP + NOTIFY_PRUNE_EVERY
    assert _places(sqlite_db) == {}
    store.close()


def test_sqlite_a_watcher_saves_its_place_while_it_has_subscriptions(sqlite_db: Target) -> None:
    store = sqlite_db.store()
    store.notify("c", "before")
    sub = store.listen("c")
    (place,) = _places(sqlite_db).values()
    assert place == 1  # saved before listen() returned: everything after it is kept
    deadline = time.monotonic() + DELIVERY
    for i in range(SAVE_ROWS + 1):
        store.notify("c", str(i))
    assert _payloads(sub, SAVE_ROWS + 1) == [str(i) for i in range(SAVE_ROWS + 1)]
    while list(_places(sqlite_db).values()) != [SAVE_ROWS + 2] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(_places(sqlite_db).values()) == [SAVE_ROWS + 2]  # moved on as it read
    with store.executor() as ex:
        assert store.backend.stream_overview(ex, {}) == []  # the dashboard lists no such consumer
    sub.close()
    assert _places(sqlite_db) == {}  # its last subscription closed: it holds nothing back
    store.close()


def test_sqlite_a_read_only_listener_still_receives(sqlite_db: Target, caplog: pytest.LogCaptureFixture) -> None:
    """A listener on a read-only file cannot save its reading place: it says so and
    listens all the same (as it did before places were saved)."""
    writer = sqlite_db.store()
    writer.notify("c", "before")  # the -wal and -shm exist: a read-only opener needs them
    path = sqlite_db.url.removeprefix("sqlite:///")
    reader = alk.Store(f"sqlite:///file:{path}?mode=ro&uri=true")
    with caplog.at_level("WARNING", logger="alkstore_sa"):
        sub = reader.listen("c")
    assert "cannot save its reading place" in caplog.text
    writer.notify("c", "after")
    assert _payloads(sub, 1) == ["after"]
    sub.close()
    reader.close()
    writer.close()


def test_sqlite_listen_and_close_do_not_wait_out_another_connections_write(sqlite_db: Target) -> None:
    """While another connection holds SQLite's write lock (an application's open write
    transaction), the first ``listen()`` of a store waited for it to end and the last
    subscription's ``close()`` (and so ``store.close()``) sat out the whole 60 s busy
    timeout — holding the watcher, whose deliveries and wakes stopped meanwhile. Saving and
    dropping the reading place now wait at most briefly; a place not saved is saved at a
    later look."""
    store = sqlite_db.store()
    writer = sqlite3.connect(sqlite_db.url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False)
    try:
        first = store.listen("first")
        writer.execute("BEGIN IMMEDIATE")
        done: dict[str, alk.Subscription | None] = {}

        def close_then_listen() -> None:
            first.close()  # the store's last subscription: its place is dropped
            done["closed"] = None
            done["listening"] = store.listen("second")  # the first again: a place is saved

        caller = threading.Thread(target=close_then_listen, daemon=True)
        caller.start()
        caller.join(30)  # against the 60 s busy timeout they waited out
        assert not caller.is_alive(), f"still waiting for the other connection's write lock: {sorted(done)}"
        writer.execute("ROLLBACK")
        sub = done["listening"]
        assert sub is not None
        store.notify("second", "heard")
        assert _payloads(sub, 1) == ["heard"]
        wait_for(lambda: len(_places(sqlite_db)) == 1, "the reading place to be saved at a later look")
        sub.close()
    finally:
        writer.close()
        store.close()
