"""Streams (SPEC §10) on both engines: offsets (strictly increasing from 1, never reused,
rolled-back publishes consume none), ``read`` bounds, payload round trip, validation that
raises typed errors before anything is written, consumer offsets, ``trim_to``, isolation
by name, the transactional ``alk.publish``, and wake-driven ``subscribe`` (woken, stopped,
resumed), plus ``StoreClosed``.

Subscriptions run on a helper thread and every wait has a timeout: a broken wake or stop
fails the test instead of hanging the run. They use ``poll_interval=3600`` so an event that
arrives within seconds can only have come through the wake path, never the re-poll.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import FakeClock, Target, wait_for

DELIVERY = 5.0  # seconds a woken subscription may take (a bound for failure, not a speed claim)
JOIN = 5.0  # seconds a stopped subscription's thread may take to end
SETTLE = 0.5  # seconds for a subscription to finish its initial read and block in its wait
QUIET = 0.3  # seconds of silence that stand for "nothing delivered"
NEVER = 3600.0  # a re-poll interval no test waits for: deliveries must come from a wake
CHILD_BOUND = 30.0  # seconds a forked child's subscription may take to deliver (a failure bound)


def events_of(db: Target, stream: str) -> list[tuple[int, str]]:
    """The stored (offset, payload text) rows of one stream, by raw SQL."""
    with db.engine.connect() as c:
        rows = c.execute(
            sa.text(
                f'SELECT "offset", payload FROM {db.table("alkstore_stream_events")} '
                'WHERE stream = :s ORDER BY "offset"'
            ),
            {"s": stream},
        )
        return [(int(o), p) for o, p in rows]


def counter_rows(db: Target, stream: str) -> int:
    """How many counter rows the stream has (0 before its first committed publish)."""
    return int(
        db.scalar(  # type: ignore[arg-type]
            f"SELECT count(*) FROM {db.table('alkstore_streams')} WHERE name = :s", s=stream
        )
    )


def offsets(events: list[alk.Event]) -> list[int]:
    return [e.offset for e in events]


class Follower:
    """Runs ``stream.subscribe(...)`` on a thread, handing each event over a queue."""

    _END = object()

    def __init__(
        self,
        stream: alk.Stream,
        consumer: str,
        *,
        poll_interval: float = NEVER,
        stop: alk.StopToken | None = None,
    ) -> None:
        self.stop = stop if stop is not None else alk.StopToken()
        self.items: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self.ended = threading.Event()
        self._iterator = stream.subscribe(consumer, self.stop, poll_interval=poll_interval)
        self.thread = threading.Thread(target=self._run, name="stream-follower", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self._iterator:
                self.items.put(event)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.error = exc
        finally:
            self.ended.set()
            self.items.put(self._END)

    def next(self, timeout: float = DELIVERY) -> alk.Event:
        try:
            item = self.items.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout}s (error: {self.error!r})") from None
        if item is self._END:
            raise AssertionError(f"the subscription ended (error: {self.error!r})")
        return item  # type: ignore[no-any-return]

    def take(self, n: int) -> list[int]:
        return [self.next().offset for _ in range(n)]

    def assert_quiet(self, seconds: float = QUIET) -> None:
        try:
            item = self.items.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected delivery: {item!r} (error: {self.error!r})")

    def close(self) -> None:
        """Stop it and require its thread to end promptly, with nothing left undelivered."""
        self.stop.stop()
        self.thread.join(JOIN)
        assert not self.thread.is_alive(), f"subscription still running {JOIN}s after stop"
        assert self.error is None, repr(self.error)


# -- offsets --------------------------------------------------------------------------------


def test_publish_returns_strictly_increasing_offsets_from_one(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    got = [st.publish({"i": i}) for i in range(5)]
    assert got == [1, 2, 3, 4, 5]
    assert all(type(o) is int for o in got)
    with Session(store.engine) as session, session.begin():
        got.append(alk.publish(session, qname, {"i": 5}))
        got.append(alk.publish(session, qname, {"i": 6}))
    got.append(st.publish({"i": 7}))
    assert got == list(range(1, 9))
    assert offsets(st.read(after=0, limit=100)) == got
    assert [e.payload for e in st.read()] == [{"i": i} for i in range(8)]


def test_a_stream_handle_writes_nothing(db: Target, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    assert isinstance(st, alk.Stream) and st.name == qname
    assert st.read() == []
    assert st.offset("c") == 0
    assert st.trim_to(10) == 0
    assert counter_rows(db, qname) == 0
    assert events_of(db, qname) == []
    assert st.publish("first") == 1  # reads and trims before the first publish moved nothing


def test_offsets_are_never_reused_after_a_trim(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(3):
        st.publish(i)
    assert st.trim_to(3) == 3
    assert st.read() == []
    assert st.publish("after trim") == 4
    assert [(e.offset, e.payload) for e in st.read()] == [(4, "after trim")]


# -- read -----------------------------------------------------------------------------------


def test_read_order_bounds_and_limit(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(1, 8):
        st.publish(f"e{i}")
    assert offsets(st.read()) == [1, 2, 3, 4, 5, 6, 7]  # defaults: after=0, limit=100
    assert offsets(st.read(after=0, limit=100)) == [1, 2, 3, 4, 5, 6, 7]
    assert offsets(st.read(after=3)) == [4, 5, 6, 7]  # strictly after
    assert offsets(st.read(after=3, limit=2)) == [4, 5]
    assert offsets(st.read(after=0, limit=1)) == [1]
    assert offsets(st.read(after=6)) == [7]
    assert st.read(after=7) == []
    assert st.read(after=1000) == []
    assert st.read(after=2**63 - 1) == []
    assert st.read(after=0, limit=0) == []
    assert st.read(after=3, limit=0) == []
    assert offsets(st.read(after=0, limit=2**40)) == [1, 2, 3, 4, 5, 6, 7]  # huge limit: all
    assert [e.payload for e in st.read(after=4, limit=2)] == ["e5", "e6"]
    # paging with limit walks the whole stream exactly once
    seen: list[int] = []
    after = 0
    while batch := st.read(after=after, limit=3):
        seen += offsets(batch)
        after = batch[-1].offset
    assert seen == [1, 2, 3, 4, 5, 6, 7]


def test_event_fields_with_the_injected_clock(store: alk.Store, clock: FakeClock, qname: str) -> None:
    st = store.stream(qname)
    st.publish("a")
    clock.advance(2.5)
    with Session(store.engine) as session, session.begin():
        alk.publish(session, qname, "b")
    a, b = st.read()
    assert isinstance(a, alk.Event)
    assert (a.stream, a.offset, a.payload) == (qname, 1, "a")
    assert (b.stream, b.offset, b.payload) == (qname, 2, "b")
    assert a.created_at == datetime.fromtimestamp(1_800_000_000.0, timezone.utc)
    assert b.created_at == datetime.fromtimestamp(1_800_000_002.5, timezone.utc)
    for e in (a, b):
        assert e.created_at.tzinfo is not None and e.created_at.utcoffset() == timedelta(0)


def test_event_created_at_from_the_database_clock(dbstore: alk.Store, qname: str) -> None:
    st = dbstore.stream(qname)
    before = time.time()
    st.publish("x")
    after = time.time()
    (e,) = st.read()
    assert e.created_at.tzinfo is not None and e.created_at.utcoffset() == timedelta(0)
    assert before - 2.0 <= e.created_at.timestamp() <= after + 2.0


# -- payloads -------------------------------------------------------------------------------

PAYLOADS: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**62,
    2**70,  # JSON has no integer bound; neither does the round trip
    1.5,
    -0.25,
    1e300,
    "",
    "plain",
    "ünïcödé ⚡ \u2028 'quotes' \"double\" \\ back\nslash",
    "nul \x00 inside",
    [],
    [1, "two", None, [3.0]],
    {},
    {"nested": {"list": [1, {"deep": True}], "n": None}, "ünï": "⚡"},
    "x" * 100_000,
]


def test_payload_round_trip(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for payload in PAYLOADS:
        st.publish(payload)
    with Session(store.engine) as session, session.begin():
        for payload in PAYLOADS:
            alk.publish(session, qname, payload)
    got = [e.payload for e in st.read(limit=1000)]
    assert got == PAYLOADS + PAYLOADS
    assert [type(p) for p in got] == [type(p) for p in PAYLOADS + PAYLOADS]


class _Opaque:
    pass


BAD_PAYLOADS: dict[str, Any] = {  # explicit ids: set and object reprs differ between processes
    "set": {1, 2},
    "bytes": b"bytes",
    "object": _Opaque(),
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "nested-nan": {"nested": [math.nan]},
    "nested-set": {"k": {"a", "set"}},
    "tuple-key": {(1, 2): "tuple key"},
}


@pytest.mark.parametrize("payload", list(BAD_PAYLOADS.values()), ids=list(BAD_PAYLOADS))
def test_non_json_payload_raises_and_writes_nothing(
    db: Target, store: alk.Store, qname: str, payload: Any
) -> None:
    st = store.stream(qname)
    with pytest.raises(alk.PayloadError):
        st.publish(payload)
    assert counter_rows(db, qname) == 0 and events_of(db, qname) == []
    # the transactional form: raises before any SQL, and the caller's transaction stays usable
    with Session(store.engine) as session:
        with pytest.raises(alk.PayloadError):
            alk.publish(session, qname, payload)
        assert alk.publish(session, qname, "ok") == 1
        session.commit()
    assert [(e.offset, e.payload) for e in st.read()] == [(1, "ok")]


def test_a_stored_event_that_is_not_json_is_named_by_its_stream_and_offset(
    db: Target, store: alk.Store, qname: str
) -> None:
    """An event row whose payload is not JSON (edited by hand, or nested deeper than this
    process can decode) fails every read of a page holding it, and every subscription
    reaching it ends there again at each restart: the PayloadError said only "a stored
    payload is not JSON", so the consumer could not tell which event to repair or commit
    past. It names the stream and the offset."""
    st = store.stream(qname)
    for i in range(3):
        st.publish({"i": i})
    db.execute(
        f"UPDATE {db.table('alkstore_stream_events')} SET payload = 'oops' "
        'WHERE stream = :s AND "offset" = 2',
        s=qname,
    )
    with pytest.raises(alk.PayloadError, match=rf"stream '{qname}'.* event 2\b"):
        st.read()
    assert [e.offset for e in st.read(after=2)] == [3]
    f = Follower(st, "c", poll_interval=0.2)
    assert f.ended.wait(JOIN), "the subscription went on past an event it could not decode"
    assert isinstance(f.error, alk.PayloadError) and "event 2" in str(f.error), repr(f.error)


def test_oversized_payload_raises_and_writes_nothing(db: Target, clock: FakeClock, qname: str) -> None:
    small = db.store(clock=clock, max_payload_bytes=64)
    try:
        st = small.stream(qname)
        fits = "x" * 62  # json.dumps adds the two quotes: exactly 64 bytes
        with pytest.raises(alk.PayloadError):
            st.publish("x" * 63)
        with Session(small.engine) as session:
            with pytest.raises(alk.PayloadError):
                alk.publish(session, qname, {"big": "y" * 100})
            session.rollback()
        assert counter_rows(db, qname) == 0 and events_of(db, qname) == []
        assert st.publish(fits) == 1
        assert [e.payload for e in st.read()] == [fits]
    finally:
        small.close()


# -- validation -----------------------------------------------------------------------------

BAD_NAMES: list[Any] = ["", "x" * 201, "a\x00b", "__alkstore", "__alkstore_x", None, 7, b"bytes", ["l"]]


@pytest.mark.parametrize("bad", BAD_NAMES, ids=lambda v: repr(v)[:24])
def test_bad_stream_names_raise_invalid_name(store: alk.Store, bad: Any) -> None:
    with pytest.raises(alk.InvalidName):
        store.stream(bad)
    with Session(store.engine) as session:
        with pytest.raises(alk.InvalidName):
            alk.publish(session, bad, {"x": 1})
        # nothing ran in the caller's transaction: it is still usable
        assert session.execute(sa.text("SELECT 1")).scalar() == 1
    assert issubclass(alk.InvalidName, ValueError)


@pytest.mark.parametrize("bad", BAD_NAMES, ids=lambda v: repr(v)[:24])
def test_bad_consumer_names_raise_invalid_name(store: alk.Store, qname: str, bad: Any) -> None:
    st = store.stream(qname)
    st.publish("e")
    stop = alk.StopToken()
    with pytest.raises(alk.InvalidName):
        st.commit(bad, 1)
    with pytest.raises(alk.InvalidName):
        st.offset(bad)
    with pytest.raises(alk.InvalidName):
        st.subscribe(bad, stop)  # eagerly, before any iteration
    stop.stop()


def test_names_at_the_limits_are_accepted(store: alk.Store, qname: str) -> None:
    for name in ("x" * 200, qname + " ünï ⚡ 'q\" ;--", qname + "\U0001f600"):
        st = store.stream(name)
        assert st.publish("e") == 1
        st.commit("c" * 200, 1)
        assert st.offset("c" * 200) == 1
        assert [e.payload for e in st.read()] == ["e"]
        assert st.trim_to(1) == 1


BAD_OFFSETS: list[Any] = [-1, -(2**63), 2**63, 1.0, 0.5, True, False, "3", None, math.nan]


@pytest.mark.parametrize("bad", BAD_OFFSETS, ids=lambda v: repr(v)[:24])
def test_bad_offsets_raise_invalid_options(db: Target, store: alk.Store, qname: str, bad: Any) -> None:
    st = store.stream(qname)
    st.publish("e")
    st.commit("c", 1)
    with pytest.raises(alk.InvalidOptions):
        st.read(after=bad)
    with pytest.raises(alk.InvalidOptions):
        st.commit("c", bad)
    with pytest.raises(alk.InvalidOptions):
        st.trim_to(bad)
    assert issubclass(alk.InvalidOptions, ValueError)
    # nothing was written or removed
    assert st.offset("c") == 1
    assert events_of(db, qname) == [(1, '"e"')]


@pytest.mark.parametrize("bad", [-1, -100, 1.0, 2.5, True, False, "10", None, math.inf], ids=lambda v: repr(v)[:24])
def test_bad_limits_raise_invalid_options(store: alk.Store, qname: str, bad: Any) -> None:
    st = store.stream(qname)
    st.publish("e")
    with pytest.raises(alk.InvalidOptions):
        st.read(after=0, limit=bad)


@pytest.mark.parametrize("bad", [0, 1e-9, 0.0009, -1, math.nan, math.inf, True, "1", 101 * 365.25 * 86400])
def test_bad_poll_interval_raises_invalid_options(store: alk.Store, qname: str, bad: Any) -> None:
    stop = alk.StopToken()
    with pytest.raises(alk.InvalidOptions):
        store.stream(qname).subscribe("c", stop, poll_interval=bad)


@pytest.mark.parametrize("bad", [None, "x", True, object(), threading.Event()], ids=lambda v: type(v).__name__)
def test_a_stop_that_is_no_stop_token_raises_invalid_options_at_the_call(
    store: alk.Store, qname: str, bad: Any
) -> None:
    st = store.stream(qname)
    st.publish("e")
    with pytest.raises(alk.InvalidOptions, match="stop must be an alkstore_sa.StopToken"):
        st.subscribe("c", bad)
    assert st.offset("c") == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"], ids=lambda v: repr(v)[:24])
def test_bad_batch_raises_invalid_options(store: alk.Store, qname: str, bad: Any) -> None:
    stop = alk.StopToken()
    try:
        with pytest.raises(alk.InvalidOptions):
            store.stream(qname).subscribe("c", stop, batch=bad)  # never iterated: cannot spin
    finally:
        stop.stop()


def test_transactional_publish_needs_a_session_or_connection(store: alk.Store, qname: str) -> None:
    with pytest.raises(alk.InvalidOptions):
        alk.publish(store.engine, qname, "x")  # type: ignore[arg-type]
    with pytest.raises(alk.InvalidOptions):
        alk.publish(None, qname, "x")  # type: ignore[arg-type]
    assert store.stream(qname).read() == []


# -- consumers ------------------------------------------------------------------------------


def test_commit_and_offset(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    assert st.offset("reader") == 0  # none committed
    for i in range(10):
        st.publish(i)
    assert st.offset("reader") == 0  # publishing commits nothing for anyone
    st.commit("reader", 4)
    assert st.offset("reader") == 4
    st.commit("reader", 9)
    assert st.offset("reader") == 9  # overwrite forwards
    st.commit("reader", 2)
    assert st.offset("reader") == 2  # and backwards (a deliberate rewind)
    st.commit("reader", 0)
    assert st.offset("reader") == 0
    st.commit("reader", 7)
    # consumers are independent, and so are streams
    assert st.offset("other") == 0
    st.commit("other", 3)
    assert (st.offset("reader"), st.offset("other")) == (7, 3)
    assert store.stream(qname + "-b").offset("reader") == 0
    assert st.offset("Reader") == 0  # consumer names are case-sensitive
    # committing does not touch the events
    assert offsets(st.read()) == list(range(1, 11))


def test_the_retention_recipe_trims_to_the_slowest_consumer_from_a_schedule(
    store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """docs/streams.md, "Retention": a schedule fires into the recipe's own queue, and its
    worker trims the stream to the lowest committed offset of the consumers it names."""
    from alkstore_sa.scheduler import Scheduler

    st = store.stream(qname)
    for i in range(1, 8):
        st.publish(i)
    st.commit("billing", 5)
    st.commit("search-index", 3)
    trim_queue = qname + "-stream-trim"
    store.schedule(qname + "-trim", "@every 1h", trim_queue, {"stream": qname, "consumers": ["billing", "search-index"]})

    def trim(job: alk.Job) -> None:
        target = store.stream(job.payload["stream"])
        keep_from = min(target.offset(c) for c in job.payload["consumers"])
        target.trim_to(keep_from)

    clock.advance(3600)
    try:
        assert Scheduler(store).tick() == 1
    finally:
        store.unschedule(qname + "-trim")
    alk.Worker(store, trim_queue, trim, poll_interval=0.05).run(alk.StopToken(), burst=True)
    assert [e.offset for e in st.read()] == [4, 5, 6, 7]
    assert store.queue(trim_queue).stats().dead == 0


def test_commit_survives_trim_and_a_new_store(db: Target, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(5):
        st.publish(i)
    st.commit("c", 5)
    st.trim_to(5)
    other = db.store()
    try:
        assert other.stream(qname).offset("c") == 5
    finally:
        other.close()


# -- trim_to --------------------------------------------------------------------------------


def test_trim_to_counts_and_removes_only_that_streams_older_events(
    db: Target, store: alk.Store, qname: str
) -> None:
    a, b = store.stream(qname), store.stream(qname + "-b")
    for i in range(10):
        a.publish(f"a{i + 1}")
    for i in range(3):
        b.publish(f"b{i + 1}")
    assert a.trim_to(0) == 0
    assert a.trim_to(4) == 4
    assert offsets(a.read()) == [5, 6, 7, 8, 9, 10]
    assert [e.payload for e in a.read(limit=1)] == ["a5"]
    assert offsets(a.read(after=2)) == [5, 6, 7, 8, 9, 10]  # after below the trim point
    assert a.trim_to(4) == 0  # already gone
    assert a.trim_to(2) == 0
    assert a.trim_to(6) == 2
    assert offsets(b.read()) == [1, 2, 3]  # the other stream is untouched
    assert a.trim_to(2**63 - 1) == 4
    assert a.read() == []
    assert [e.payload for e in b.read()] == ["b1", "b2", "b3"]
    assert len(events_of(db, qname + "-b")) == 3 and events_of(db, qname) == []


# -- isolation by name ----------------------------------------------------------------------


def test_streams_are_isolated_by_name_case_sensitively(store: alk.Store, qname: str) -> None:
    names = [qname, qname.upper(), qname + " ", qname + "-2"]
    streams = [store.stream(n) for n in names]
    for round_ in range(3):
        for i, st in enumerate(streams):
            assert st.publish({"stream": i, "round": round_}) == round_ + 1  # own counters
    for i, st in enumerate(streams):
        assert [(e.offset, e.payload["stream"], e.stream) for e in st.read()] == [
            (r + 1, i, names[i]) for r in range(3)
        ]
    streams[0].commit("c", 2)
    assert [st.offset("c") for st in streams] == [2, 0, 0, 0]
    assert streams[1].trim_to(3) == 3
    assert [len(st.read()) for st in streams] == [3, 0, 3, 3]


# -- the caller's transaction ---------------------------------------------------------------


def test_transactional_publish_is_visible_at_commit(db: Target, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    st.publish("before")
    with Session(db.engine) as session:
        off = alk.publish(session, qname, {"in": "tx"})
        assert off == 2
        assert offsets(st.read()) == [1]  # nobody else sees it before the commit
        session.commit()
    assert [(e.offset, e.payload) for e in st.read()] == [(1, "before"), (2, {"in": "tx"})]


def test_transactional_publish_is_absent_after_rollback_and_consumes_no_offset(
    db: Target, store: alk.Store, qname: str
) -> None:
    st = store.stream(qname)
    st.publish("one")
    with Session(db.engine) as session:
        assert alk.publish(session, qname, "rolled back a") == 2
        assert alk.publish(session, qname, "rolled back b") == 3
        session.rollback()
    assert [e.payload for e in st.read()] == ["one"]
    # the rolled-back offsets are handed out again: no gap for a reader to wonder about
    assert st.publish("two") == 2
    with Session(db.engine) as session, session.begin():
        assert alk.publish(session, qname, "three") == 3
    assert [(e.offset, e.payload) for e in st.read()] == [(1, "one"), (2, "two"), (3, "three")]


def test_transactional_publish_on_a_connection(db: Target, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    with db.engine.connect() as conn:
        with conn.begin():
            assert alk.publish(conn, qname, "rolled back") == 1
            conn.rollback()
        with conn.begin():
            assert alk.publish(conn, qname, "kept") == 1
    assert [(e.offset, e.payload) for e in st.read()] == [(1, "kept")]


def test_transactional_publish_commits_with_the_callers_rows(db: Target, store: alk.Store, qname: str) -> None:
    table = "orders_" + qname.replace("-", "_")
    qualified = db.table(table) if db.kind == "sqlite" else f'"{db.schema}"."{table}"'
    db.execute(f"CREATE TABLE {qualified} (id INTEGER PRIMARY KEY, ref TEXT)")
    try:
        st = store.stream(qname)
        with Session(db.engine) as session:
            session.execute(sa.text(f"INSERT INTO {qualified} (id, ref) VALUES (1, 'rolled')"))
            alk.publish(session, qname, {"order": 1})
            session.rollback()
        with Session(db.engine) as session, session.begin():
            session.execute(sa.text(f"INSERT INTO {qualified} (id, ref) VALUES (2, 'kept')"))
            assert alk.publish(session, qname, {"order": 2}) == 1
        assert db.scalar(f"SELECT count(*) FROM {qualified}") == 1
        assert [e.payload for e in st.read()] == [{"order": 2}]
    finally:
        db.execute(f"DROP TABLE {qualified}")


def test_an_open_publish_holds_back_later_publishers_of_that_stream(
    db: Target, store: alk.Store, qname: str
) -> None:
    """The no-skip mechanism, seen from one process: while a transaction that published to
    the stream is open, another publisher of the stream waits; it gets the next offset
    after a commit and the same offset after a rollback."""
    st = store.stream(qname)

    def publish_in_thread(payload: str) -> tuple[threading.Thread, dict[str, Any]]:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["offset"] = st.publish(payload)
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t, box

    for outcome in ("rollback", "commit"):
        with Session(db.engine) as session:
            held = alk.publish(session, qname, f"held ({outcome})")
            t, box = publish_in_thread(f"waiter ({outcome})")
            t.join(QUIET)
            assert t.is_alive() and not box, f"a publish did not wait for the open one: {box}"
            session.commit() if outcome == "commit" else session.rollback()
        t.join(10)
        assert not t.is_alive() and "error" not in box, box
        assert box["offset"] == (held + 1 if outcome == "commit" else held)
    assert [e.payload for e in st.read()] == ["waiter (rollback)", "held (commit)", "waiter (commit)"]


# -- subscribe ------------------------------------------------------------------------------


def test_subscribe_yields_events_after_the_committed_offset(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(1, 6):
        st.publish(f"e{i}")
    st.commit("late", 3)
    f = Follower(st, "late")
    try:
        assert f.take(2) == [4, 5]
        f.assert_quiet()
    finally:
        f.close()
    g = Follower(st, "fresh")  # never committed: from the start
    try:
        e = g.next()
        assert (e.offset, e.payload, e.stream) == (1, "e1", qname)
        assert g.take(4) == [2, 3, 4, 5]
        g.assert_quiet()
    finally:
        g.close()
    # subscribing commits nothing by itself
    assert (st.offset("late"), st.offset("fresh")) == (3, 0)


def test_subscribe_pages_through_a_backlog_larger_than_its_batch(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(25):
        st.publish(i)
    stop = alk.StopToken()
    got: list[int] = []
    for e in st.subscribe("c", stop, poll_interval=NEVER, batch=4):
        got.append(e.offset)
        if len(got) == 25:
            stop.stop()  # stopping inside the loop ends the iterator
    assert got == list(range(1, 26))


def wake_sources(db: Target, store: alk.Store, name: str) -> dict[str, Any]:
    def same_store() -> None:
        store.stream(name).publish("same store")

    def other_store() -> None:
        other = db.store()
        try:
            other.stream(name).publish("other store")
        finally:
            other.close()

    def session_commit() -> None:
        with Session(db.engine) as session, session.begin():
            alk.publish(session, name, "session commit")

    return {"same store": same_store, "other store": other_store, "session commit": session_commit}


@pytest.mark.parametrize("source", ["same store", "other store", "session commit"])
def test_subscribe_wakes_on_a_publish_from_another_thread(
    db: Target, store: alk.Store, qname: str, source: str
) -> None:
    st = store.stream(qname)
    st.publish("seed")
    f = Follower(st, "c", poll_interval=NEVER)
    try:
        assert f.next().payload == "seed"
        time.sleep(SETTLE)  # it is now blocked in its (hour-long) wait
        publish = wake_sources(db, store, qname)[source]
        done = threading.Event()
        t = threading.Thread(target=lambda: (publish(), done.set()), daemon=True)
        t.start()
        t.join(10)
        assert done.is_set(), "the publish did not return"
        published = time.monotonic()
        e = f.next(timeout=DELIVERY)
        latency = time.monotonic() - published
        assert (e.offset, e.payload) == (2, source)
        assert latency < DELIVERY
        f.assert_quiet()
    finally:
        f.close()


@pytest.mark.parametrize("kind", ["odd", "long"])
def test_subscribe_wakes_for_names_of_any_character_and_length(
    store: alk.Store, qname: str, kind: str
) -> None:
    name = qname + " ünï ⚡ 'q\" ;--" if kind == "odd" else (qname + "-" + "x" * 200)[:200]
    st = store.stream(name)
    sibling = store.stream(name[:-1] + ("Y" if name[-1] != "Y" else "Z"))
    f = Follower(st, "c")
    try:
        time.sleep(SETTLE)
        sibling.publish("not mine")
        f.assert_quiet()
        st.publish("mine")
        e = f.next()
        assert (e.offset, e.payload, e.stream) == (1, "mine", name)
    finally:
        f.close()


def test_a_subscription_started_before_a_fork_is_woken_in_the_child(store: alk.Store, qname: str) -> None:
    """A pre-fork server (gunicorn --preload) started a ``subscribe`` iterator in the
    master: its wake-up stayed registered with the parent's listener thread, which a
    forked child does not have, so in the child the iterator only re-polled (here: never).
    In the child it is woken by the child's own listener, from its next read there. The
    child's stop token ends its wait after CHILD_BOUND, so a child that is never woken
    reports "<nothing>" instead of hanging (the bound covers the child's first connections
    and its listener's start on a loaded machine: only a failing run waits it out)."""
    st = store.stream(qname)
    st.publish("seed")
    stop = alk.StopToken()
    events = st.subscribe("c", stop, poll_interval=NEVER)
    assert next(events).payload == "seed"  # running: its wake-up is the parent's
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(out_r)
            for _ in range(2):
                timer = threading.Timer(CHILD_BOUND, stop.stop)
                timer.start()
                event = next(events, None)
                timer.cancel()
                os.write(out_w, (event.payload if event is not None else "<nothing>").encode() + b"\n")
            events.close()
            code = 0
        finally:
            os._exit(code)
    os.close(out_w)
    try:
        with os.fdopen(out_r, "rb", closefd=False) as out:
            # published before the child's read, the read finds it; after it, a wake must
            st.publish("first")
            first = out.readline()
            st.publish("second")  # the child has read: only a wake brings this one
            second = out.readline()
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(out_r)
    assert (first, second) == (b"first\n", b"second\n")
    assert os.waitstatus_to_exitcode(status) == 0
    timer = threading.Timer(CHILD_BOUND, stop.stop)  # a bound here too: a failure, not a hang
    timer.start()
    seen = [next(events, None) for _ in range(2)]
    timer.cancel()
    assert [e.payload if e is not None else None for e in seen] == ["first", "second"]  # the parent's still runs
    stop.stop()
    assert next(events, None) is None


def test_transactional_publish_is_not_delivered_before_commit(db: Target, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    f = Follower(st, "c")
    try:
        time.sleep(SETTLE)
        with Session(db.engine) as session:
            alk.publish(session, qname, "rolled back")
            f.assert_quiet()
            session.rollback()
        f.assert_quiet()
        with Session(db.engine) as session:
            alk.publish(session, qname, "committed")
            f.assert_quiet()
            session.commit()
        e = f.next()
        assert (e.offset, e.payload) == (1, "committed")
        f.assert_quiet()
    finally:
        f.close()


def test_subscribe_stops_when_the_stop_token_stops(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    st.publish("e1")
    f = Follower(st, "c", poll_interval=NEVER)
    assert f.next().offset == 1
    time.sleep(SETTLE)  # blocked in its hour-long wait
    began = time.monotonic()
    f.stop.stop()
    assert f.ended.wait(JOIN), "the subscription did not end after stop()"
    assert time.monotonic() - began < JOIN
    f.thread.join(JOIN)
    assert not f.thread.is_alive() and f.error is None
    # a publish after the stop reaches nobody
    st.publish("e2")
    with pytest.raises(AssertionError, match="ended"):
        f.next(timeout=QUIET)


def test_subscribe_with_a_stopped_token_yields_nothing(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    st.publish("e1")
    stop = alk.StopToken()
    stop.stop()
    began = time.monotonic()
    assert list(st.subscribe("c", stop, poll_interval=NEVER)) == []
    assert time.monotonic() - began < JOIN


def test_ended_subscriptions_leave_nothing_behind_on_a_long_lived_stop_token(
    store: alk.Store, qname: str
) -> None:
    """An application's one StopToken outlives many subscriptions (one per client
    connection): each registers a wake-up on the token, and one that ended — exhausted by a
    break, or closed — must take it back, or the token keeps every ended subscription's
    wake-up alive until it stops."""
    st = store.stream(qname)
    st.publish("e1")
    stop = alk.StopToken()
    for _ in range(20):
        for event in st.subscribe("c", stop, poll_interval=NEVER):
            assert event.offset == 1
            break
    sub = st.subscribe("c", stop, poll_interval=NEVER)
    assert next(sub).offset == 1
    sub.close()
    assert not stop._callbacks  # noqa: SLF001 - what a long-lived token holds on to
    stop.stop()  # and stopping the token afterwards still works


def test_one_stop_token_ends_several_subscriptions(store: alk.Store, qname: str) -> None:
    stop = alk.StopToken()
    followers = [Follower(store.stream(qname + f"-{i}"), "c", stop=stop) for i in range(3)]
    time.sleep(SETTLE)
    stop.stop()
    for f in followers:
        assert f.ended.wait(JOIN)
        f.close()


def test_subscribe_resumes_after_commit_on_a_new_subscription(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(1, 6):
        st.publish(f"e{i}")
    first = Follower(st, "worker")
    try:
        for expected in (1, 2, 3):
            e = first.next()
            assert e.offset == expected
            st.commit("worker", e.offset)  # at-least-once: commit after processing
        # 4 and 5 may have been delivered too; they are not committed
    finally:
        first.close()
    assert st.offset("worker") == 3
    second = Follower(st, "worker")
    try:
        assert second.take(2) == [4, 5]  # resumes after the committed offset
        st.publish("e6")  # and then keeps following, woken
        e = second.next()
        assert (e.offset, e.payload) == (6, "e6")
        st.commit("worker", 6)
        second.assert_quiet()
    finally:
        second.close()
    third = Follower(st, "worker")
    try:
        third.assert_quiet()  # nothing after 6
    finally:
        third.close()


def test_subscribe_after_a_trim_starts_at_the_oldest_kept_event(store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(6):
        st.publish(i)
    st.commit("c", 1)
    assert st.trim_to(3) == 3
    f = Follower(st, "c")
    try:
        assert f.take(3) == [4, 5, 6]
    finally:
        f.close()


# -- StoreClosed ----------------------------------------------------------------------------


def test_operations_on_a_closed_store_raise_store_closed(db: Target, clock: FakeClock, qname: str) -> None:
    s = db.store(clock=clock)
    st = s.stream(qname)
    st.publish("e")
    s.close()
    stop = alk.StopToken()
    with pytest.raises(alk.StoreClosed):
        s.stream(qname)
    with pytest.raises(alk.StoreClosed):
        st.publish("x")
    with pytest.raises(alk.StoreClosed):
        st.read()
    with pytest.raises(alk.StoreClosed):
        st.read(after=0, limit=0)
    with pytest.raises(alk.StoreClosed):
        st.commit("c", 1)
    with pytest.raises(alk.StoreClosed):
        st.offset("c")
    with pytest.raises(alk.StoreClosed):
        st.trim_to(1)
    with pytest.raises(alk.StoreClosed):
        st.subscribe("c", stop)
    s.close()  # idempotent
    assert issubclass(alk.StoreClosed, alk.AlkstoreError)
    # nothing was written after the close
    fresh = db.store(clock=clock)
    try:
        assert [e.payload for e in fresh.stream(qname).read()] == ["e"]
        assert fresh.stream(qname).offset("c") == 0
    finally:
        fresh.close()


def test_a_running_subscription_ends_with_store_closed(db: Target, clock: FakeClock, qname: str) -> None:
    s = db.store(clock=clock)
    st = s.stream(qname)
    st.publish("e1")
    f = Follower(st, "c", poll_interval=0.2)
    try:
        assert f.next().offset == 1
        s.close()
        assert f.ended.wait(JOIN), "the subscription kept running on a closed store"
        assert isinstance(f.error, alk.StoreClosed), repr(f.error)
    finally:
        f.stop.stop()
        f.thread.join(JOIN)
        s.close()


def test_sqlite_the_watcher_reads_only_the_streams_it_has_subscribers_of(sqlite_db: Target) -> None:
    """A stream subscription made the SQLite watcher read every stream's counter at each
    look (and remember them all): with 200,000 streams (one per tenant) a look took 0.4 s,
    delaying every wake and notification of the process and keeping its CPU busy. It reads
    the counters of the streams it has subscribers of."""
    sqlite_db.execute(
        "INSERT INTO alkstore_streams (name, last_offset) WITH RECURSIVE n(i) AS "
        "(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) SELECT 'tenant-' || i, 1 FROM n"
    )
    store = sqlite_db.store()
    stop = alk.StopToken()
    events = store.stream("mine").subscribe("c", stop)
    try:
        other = sqlite_db.store()  # another connection's commits are what the watcher looks at
        try:
            other.stream("mine").publish({"n": 1})
            assert next(events).payload == {"n": 1}
            other.stream("tenant-7").publish({"n": "elsewhere"})
            other.stream("mine").publish({"n": 2})
            assert next(events).payload == {"n": 2}
        finally:
            other.close()
        assert set(store.hub()._stream_offsets) <= {"mine"}
    finally:
        stop.stop()
        events.close()
        store.close()


def test_sqlite_the_watcher_reads_a_stream_counter_written_by_hand_as_text(
    sqlite_db: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite keeps the text an UPDATE puts in alkstore_streams.last_offset: the watcher
    converted each watched stream's counter with int(), which raised at every look — a
    traceback ("alkstore SQLite watcher error") for every commit to the database, and no
    stream of the process woken any more (its subscribers left to re-poll). The watcher
    compares the counter as stored: a change wakes the stream's subscribers, as any does."""
    store = sqlite_db.store()
    stop = alk.StopToken()
    events = store.stream("odd").subscribe("c", stop)
    thread = threading.Thread(target=lambda: list(events), daemon=True)
    thread.start()
    try:
        wait_for(lambda: "odd" in store.hub().streams.channel_keys(), "the subscription's watch")
        store.stream("odd").publish({"n": 1})
        wait_for(lambda: store.hub()._stream_offsets.get("odd") == 1, "the watcher's first look at the stream")
        with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
            sqlite_db.execute("UPDATE alkstore_streams SET last_offset = 'one' WHERE name = 'odd'")
            wait_for(lambda: store.hub()._stream_offsets.get("odd") == "one", "the watcher's look at the text")
        assert "watcher error" not in caplog.text
    finally:
        stop.stop()
        thread.join(JOIN)
        store.close()


@pytest.mark.parametrize("stored", ["three", float("inf")])
def test_sqlite_a_committed_offset_written_by_hand_as_no_offset_reads_from_the_start(
    sqlite_db: Target, stored: object
) -> None:
    """SQLite keeps the text (or an infinity) an UPDATE puts in a consumer's committed
    offset: offset() raised ValueError (OverflowError), and so did every subscribe() of the
    consumer, which could not start again. It reads as 0 — the consumer reads from the
    start (at least once) — and its next commit writes a real offset."""
    store = sqlite_db.store()
    try:
        stream = store.stream("s")
        stream.publish({"n": 1})
        stream.commit("c", 1)
        sqlite_db.execute("UPDATE alkstore_stream_offsets SET \"offset\" = :o WHERE consumer = 'c'", o=stored)
        assert stream.offset("c") == 0
        stop = alk.StopToken()
        events = stream.subscribe("c", stop)
        try:
            assert next(events).offset == 1
        finally:
            stop.stop()
            events.close()
        stream.commit("c", 1)
        assert stream.offset("c") == 1
    finally:
        store.close()
