"""Bad input (SPEC §3, §5): every invalid argument raises its typed error before anything is
written (the caller's transaction stays usable); refusals on live state are values; names
are plain values end to end; a closed store refuses every operation. Both engines."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone, tzinfo
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import alkstore_sa as alk
from tests.support import FakeClock, Target, deepest_accepted, list_depth

NAN, INF = float("nan"), float("inf")
YEAR = 365.25 * 86400
OVER_100Y = 101 * YEAR
I32 = 2**31 - 1
Call = Callable[..., Any]


def table_counts(db: Target) -> tuple[object, object]:
    return (
        db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')}"),
        db.scalar(f"SELECT count(*) FROM {db.table('alkstore_dead_jobs')}"),
    )


def snapshot(db: Target, q: alk.Queue) -> tuple[object, ...]:
    return (q.stats(), *table_counts(db))


def expect(err: type[Exception], fn: Call) -> None:
    with pytest.raises(err) as info:
        fn()
    assert isinstance(info.value, alk.AlkstoreError)
    if err is not alk.StoreClosed:
        assert isinstance(info.value, ValueError)


@contextmanager
def caller_tx(db: Target, kind: str = "session") -> Iterator[Any]:
    """The caller's own transaction (an ORM Session or a Connection), committed at the end."""
    if kind == "session":
        with Session(db.engine) as s, s.begin():
            yield s
    else:
        with db.engine.connect() as c, c.begin():
            yield c


def assert_refused(db: Target, q: alk.Queue, err: type[Exception], *calls: Call) -> None:
    """Each call (given a caller's Session) raises ``err``; the tables are left unchanged."""
    before = snapshot(db, q)
    with caller_tx(db) as s:
        for call in calls:
            expect(err, lambda call=call: call(s))
    assert snapshot(db, q) == before


@pytest.fixture
def q(store: alk.Store, qname: str) -> alk.Queue:
    """The test's queue, holding one pending job."""
    queue = store.queue(qname)
    queue.enqueue("seed")
    return queue


@pytest.mark.parametrize(
    "err", [alk.InvalidName, alk.InvalidOptions, alk.PayloadError, alk.InvalidSpec]
)
def test_argument_errors_are_value_errors_and_alkstore_errors(err: type[Exception]) -> None:
    assert issubclass(err, ValueError) and issubclass(err, alk.AlkstoreError)
    assert issubclass(alk.StoreClosed, alk.AlkstoreError)


BAD_WAITS = [-1, -0.001, NAN, INF, -INF, True, "1", b"1", OVER_100Y]


@pytest.mark.parametrize("bad", BAD_WAITS, ids=repr)
def test_stop_token_wait_refuses_a_bad_timeout(bad: object) -> None:
    stopped, token = alk.StopToken(), alk.StopToken()
    stopped.stop()
    expect(alk.InvalidOptions, lambda: stopped.wait(bad))  # type: ignore[arg-type]
    expect(alk.InvalidOptions, lambda: token.wait(bad))  # type: ignore[arg-type]


def test_stop_token_accepts_none_zero_and_timedelta_waits_and_only_callables() -> None:
    token = alk.StopToken()
    assert token.wait(0) is False and token.wait(timedelta(milliseconds=10)) is False
    expect(alk.InvalidOptions, lambda: token.on_stop("not callable"))  # type: ignore[arg-type]
    token.stop()  # the refused callback was not kept
    assert token.wait(None) is True and token.wait(0) is True


@pytest.mark.parametrize("bad", ["x", 1, True, SimpleNamespace(stopped=False)], ids=repr)
def test_worker_run_refuses_a_stop_that_is_no_stop_token(store: alk.Store, qname: str, bad: object) -> None:
    """``Worker.run(stop)`` takes a StopToken (or None): anything else is refused before the
    worker starts anything, and no job is claimed."""
    q = store.queue(qname)
    job = q.enqueue({"n": 1})
    w = alk.Worker(store, q, lambda job: None)
    expect(alk.InvalidOptions, lambda: w.run(bad, burst=True))  # type: ignore[arg-type]
    found = store.get_job(job)
    assert found is not None and found.attempts == 0


# -- invalid arguments raise their typed error and write nothing ------------------------------

BAD_NAMES = [None, 42, b"emails", ["q"], "", "x" * 201, "\U0001f642" * 201, "a\x00b", "\x00",
             "__alkstore", "__alkstore_jobs", "__alkstoreX"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_queue_name(db: Target, store: alk.Store, q: alk.Queue, name: Any) -> None:
    assert_refused(db, q, alk.InvalidName, lambda s: store.queue(name),
                   lambda s: alk.enqueue(s, name, "p"), lambda s: alk.enqueue_many(s, name, ["p"]))


BAD_QUEUE_OPTS = [
    *({"visibility_timeout": x} for x in (0, -1, 0.0, timedelta(0), timedelta(seconds=-1),
                                          NAN, INF, -INF, True, OVER_100Y,
                                          timedelta(days=101 * 366), 10**400,
                                          # under a millisecond: now + 1e-7 is now again in
                                          # epoch seconds, so the claim lapsed as it was made
                                          1e-7, 0.0009, timedelta(microseconds=999))),
    *({"max_attempts": x} for x in (0, -1, I32 + 1, 2**63, True, 3.0, NAN)),
    *({"backoff_base": x} for x in (-1, -0.001, timedelta(seconds=-1), NAN, INF, True, OVER_100Y)),
    *({"dead_letter_retention": x} for x in (-1, timedelta(seconds=-1), NAN, INF, False, OVER_100Y)),
]


@pytest.mark.parametrize("opts", BAD_QUEUE_OPTS, ids=repr)
def test_bad_queue_options(db: Target, store: alk.Store, q: alk.Queue, opts: dict) -> None:
    assert_refused(db, q, alk.InvalidOptions, lambda s: store.queue(q.name, **opts))


NAIVE = datetime(2030, 1, 1, 12, 0)


class _BrokenZone(tzinfo):
    """A tzinfo of the caller's whose ``utcoffset()`` raises or answers what is no offset."""

    def __init__(self, offset: object) -> None:
        self.offset = offset

    def utcoffset(self, dt: datetime | None) -> Any:
        if isinstance(self.offset, Exception):
            raise self.offset
        return self.offset

    def dst(self, dt: datetime | None) -> None:
        return None

    def __repr__(self) -> str:
        return f"_BrokenZone({self.offset!r})"


BROKEN_ZONES = [
    datetime(2030, 1, 1, tzinfo=_BrokenZone(offset))
    for offset in (RuntimeError("no offset today"), KeyError("zone"), "+05:00", 3600, timedelta(hours=25))
]
BAD_ENQUEUE_OPTS = [
    *({"delay": x} for x in (-1, -0.001, timedelta(seconds=-1), NAN, INF, -INF, True,
                             OVER_100Y, 10**400)),
    {"run_at": NAIVE}, {"run_at": datetime(2000, 1, 1)}, *({"run_at": x} for x in BROKEN_ZONES),
    *({"priority": x} for x in (1.5, 1.0, "1", None, True, False, I32 + 1, -(2**31) - 1, NAN)),
    *({"max_attempts": x} for x in (0, -1, I32 + 1, True, 2.0)),
    *({"expires": x} for x in (0, -1, timedelta(0), NAN, INF, True, OVER_100Y,
                               # under a millisecond: now + 1e-7 is now again in epoch
                               # seconds, so the job expired as it was enqueued
                               1e-7, 0.0009, timedelta(microseconds=999))),
]


@pytest.mark.parametrize("opts", BAD_ENQUEUE_OPTS, ids=repr)
def test_bad_enqueue_options(db: Target, q: alk.Queue, opts: dict) -> None:
    assert_refused(db, q, alk.InvalidOptions,
                   lambda s: q.enqueue("p", **opts), lambda s: q.enqueue_many(["a", "b"], **opts),
                   lambda s: alk.enqueue(s, q.name, "p", **opts),
                   lambda s: alk.enqueue(s, q, "p", **opts),
                   lambda s: alk.enqueue_many(s, q, ["a", "b"], **opts))


AWARE = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=5)))
ACCEPTED: list[tuple[dict, dict, str, object]] = [  # (queue opts, enqueue opts, field, value)
    ({"visibility_timeout": timedelta(seconds=30)}, {}, "visibility_timeout", 30.0),
    ({"visibility_timeout": 0.001}, {}, "visibility_timeout", 0.001),
    ({"visibility_timeout": 99 * YEAR}, {}, "visibility_timeout", 99 * YEAR),
    ({"max_attempts": 1}, {}, "max_attempts", 1),
    ({"max_attempts": I32}, {}, "max_attempts", I32),
    ({"backoff_base": 0}, {}, "backoff_base", 0.0),
    ({"backoff_base": timedelta(minutes=1)}, {}, "backoff_base", 60.0),
    ({"dead_letter_retention": 0}, {}, "dead_letter_retention", 0.0),
    ({"dead_letter_retention": timedelta(days=7)}, {}, "dead_letter_retention", 7 * 86400.0),
    ({}, {"delay": 0}, "run_at", 0),
    ({}, {"delay": timedelta(seconds=5)}, "run_at", 5),
    ({}, {"delay": 99 * YEAR}, "run_at", 99 * YEAR),
    ({}, {"run_at": AWARE}, "run_at", AWARE),
    ({}, {"priority": I32}, "priority", I32),
    ({}, {"priority": -(2**31)}, "priority", -(2**31)),
    ({}, {"max_attempts": I32}, "max_attempts", I32),
    ({}, {"expires": timedelta(minutes=1)}, "expires_at", 60),
    ({}, {"expires": 0.5}, "expires_at", 0.5),
]


@pytest.mark.parametrize(("qopts", "opts", "field", "expected"), ACCEPTED, ids=repr)
def test_boundary_options_are_accepted_and_stamped(
    store: alk.Store, clock: FakeClock, qname: str, qopts: dict, opts: dict, field: str,
    expected: Any,
) -> None:
    q = store.queue(qname, **qopts)
    job = q.get_job(q.enqueue("p", **opts))
    assert job is not None
    value = getattr(job, field)
    if isinstance(value, datetime):  # a relative expectation is seconds from the clock's now
        if not isinstance(expected, datetime):
            expected = datetime.fromtimestamp(clock() + expected, timezone.utc)
        assert value.tzinfo is not None and abs((value - expected).total_seconds()) < 0.01
    else:
        assert value == expected


BAD_PAYLOADS = [set(), {1, 2}, b"bytes", bytearray(b"x"), object(), NAN, INF, -INF, 1j,
                {"a": [1, NAN]}, {"k": {1}}, {(1, 2): "tuple key"}, [1, object()]]


def _payload_id(p: object) -> str:
    """Stable ids (no memory addresses): xdist workers must collect identical names."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(p))


@pytest.mark.parametrize("payload", BAD_PAYLOADS, ids=_payload_id)
def test_bad_payload(db: Target, q: alk.Queue, payload: object) -> None:
    assert_refused(db, q, alk.PayloadError,
                   lambda s: q.enqueue(payload), lambda s: q.enqueue_many(["ok", payload, "ok"]),
                   lambda s: alk.enqueue(s, q.name, payload),
                   lambda s: alk.enqueue_many(s, q, ["ok", payload]))


@pytest.mark.parametrize("payloads", [5, None, 1.5, {"a": 1}, "text", b"bytes"], ids=repr)
def test_enqueue_many_of_something_that_is_no_list_of_payloads(db: Target, q: alk.Queue, payloads: object) -> None:
    assert_refused(db, q, alk.InvalidOptions,
                   lambda s: q.enqueue_many(payloads), lambda s: alk.enqueue_many(s, q, payloads))


@pytest.mark.parametrize("limit", [64, None], ids=["64B", "default-1MiB"])
def test_payload_size_limit(db: Target, clock: FakeClock, qname: str, limit: int | None) -> None:
    kw = {} if limit is None else {"max_payload_bytes": limit}
    size = limit or 1 << 20
    with db.store(clock=clock, **kw) as small:  # registered: the transactional forms use it too
        q = small.queue(qname)
        fits, too_big = "x" * (size - 2), "x" * (size - 1)  # a JSON string is 2 bytes longer
        assert_refused(db, q, alk.PayloadError,
                       lambda s: q.enqueue(too_big), lambda s: q.enqueue_many(["ok", too_big]),
                       lambda s: alk.enqueue(s, qname, too_big),
                       lambda s: alk.enqueue_many(s, qname, [too_big]))
        job = q.get_job(q.enqueue(fits))
        assert job is not None and job.payload == fits


def test_enqueue_many_past_the_batch_limit_is_refused_before_any_statement(db: Target, q: alk.Queue) -> None:
    """An enqueue_many of payloads totalling more than one statement can carry (about 1 GB
    on both databases) was refused by the database only after the whole batch had been
    serialized and sent — PostgreSQL ended the connection ('invalid message length'),
    SQLite said 'string or blob too big'. Past 256 MiB (each payload counted 8 bytes more)
    it is a PayloadError, raised as soon as the payload that passes the limit is
    serialized (the rest are never read), with nothing written, and the caller's
    transaction usable (sync and async forms)."""
    big = "x" * ((1 << 20) - 2)  # 1 MiB serialized: the default max_payload_bytes
    read: list[int] = []

    def payloads() -> Iterator[str]:
        read.clear()
        for i in range(300):
            read.append(i)
            yield big

    def refused(exc: BaseException) -> None:
        assert isinstance(exc, alk.PayloadError), repr(exc)
        assert "split them into several calls" in str(exc), str(exc)
        assert len(read) == 256, len(read)  # 255 payloads fit, the 256th passes the limit

    before = snapshot(db, q)
    for call in (lambda: q.enqueue_many(payloads()), lambda: alk.enqueue_many(s, q.name, payloads())):
        with caller_tx(db) as s:
            with pytest.raises(alk.PayloadError) as info:
                call()
            refused(info.value)
            alk.enqueue(s, q.name, "kept")

    async def in_async_session() -> None:
        url = sa.make_url(db.url)
        url = url.set(drivername="sqlite+aiosqlite" if db.kind == "sqlite" else "postgresql+asyncpg")
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session:
                await alk.aenqueue(session, q, "kept")
                with pytest.raises(alk.PayloadError) as info:
                    await alk.aenqueue_many(session, q, payloads())
                refused(info.value)
                await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(in_async_session())
    _, live, dead = before
    assert snapshot(db, q)[1:] == (live + 3, dead)  # the three "kept" jobs alone
    assert sorted(h.payload for h in q.claim_batch("w", 10)) == ["kept", "kept", "kept", "seed"]


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "1024", (256 << 20) + 1, 1 << 31, 1 << 40])
def test_a_max_payload_bytes_past_the_batch_limit_is_refused(db: Target, limit: object) -> None:
    """``alk.Store(..., max_payload_bytes=N)`` had no upper bound: past 256 MiB ``enqueue(x)``
    took a payload ``enqueue_many([x])`` refused, and past about 1 GB it promised payloads
    no statement of either database carries (each refused only after it was sent). The
    limit is an int from 1 to 256 MiB, what one enqueue_many carries."""
    with pytest.raises(alk.InvalidOptions, match="max_payload_bytes must be an int from 1 to 268435456"):
        alk.Store(db.engine, schema=db.schema, max_payload_bytes=limit)  # type: ignore[arg-type]
    with alk.Store(db.engine, schema=db.schema, max_payload_bytes=256 << 20) as store:
        assert store.max_payload_bytes == 256 << 20


def test_a_batch_of_one_payload_at_the_largest_max_payload_bytes_fits() -> None:
    """A payload of the largest ``max_payload_bytes`` (256 MiB serialized) is one batch on
    its own, though it and its 8 bytes of overhead pass the batch limit: ``enqueue_many([x])``
    takes every ``x`` that ``enqueue`` takes; a second payload is refused."""
    from alkstore_sa._validate import MAX_BATCH_BYTES, encode_batch

    big = "x" * (MAX_BATCH_BYTES - 2)  # MAX_BATCH_BYTES serialized, with its quotes
    assert [len(t) for t in encode_batch([big], MAX_BATCH_BYTES)] == [MAX_BATCH_BYTES]
    with pytest.raises(alk.PayloadError, match="split them into several calls"):
        encode_batch([big, "x"], MAX_BATCH_BYTES)


BEFORE_ANY_IO: dict[str, tuple[type[Exception], str, tuple[Any, ...], dict[str, Any]]] = {
    "enqueue payload": (alk.PayloadError, "enqueue", ("q", {1}), {}),
    "enqueue priority": (alk.InvalidOptions, "enqueue", ("q", 1), {"priority": "high"}),
    "enqueue_many payload": (alk.PayloadError, "enqueue_many", ("q", ["ok", {1}]), {}),
    "enqueue_many delay": (alk.InvalidOptions, "enqueue_many", ("q", [1]), {"delay": -1}),
    "get_job id": (alk.InvalidOptions, "get_job", ("q", "1"), {}),
    "outbox_enqueue payload": (alk.PayloadError, "outbox_enqueue", ("o", NAN), {}),
    "publish payload": (alk.PayloadError, "publish", ("s", b"bytes"), {}),
    "notify payload": (alk.PayloadError, "notify", ("ch", 5), {}),
}


def test_bad_input_is_refused_before_the_callers_connection_is_taken(db: Target, store: alk.Store) -> None:
    """A caller's-transaction call with bad input raises its typed error before any I/O:
    the session takes no connection and begins no transaction for it. (It used to check out
    the caller's connection first, so with the database down a bad payload came out as the
    DatabaseError of the failed connect, and an AsyncSession awaited a connection only to
    refuse the input.) Sync and async forms, and a task's."""
    tasks = alk.Tasks()

    @tasks.task(queue="io")
    def job(x: object) -> None: ...

    def sync_calls(session: Any) -> Iterator[tuple[str, type[Exception], Call]]:
        for label, (err, function, args, kw) in BEFORE_ANY_IO.items():
            yield label, err, lambda f=function, a=args, k=kw: getattr(alk, f)(session, *a, **k)
        yield "task payload", alk.PayloadError, lambda: job.enqueue(session, {1})

    for session in (Session(db.engine), scoped_session(sessionmaker(db.engine))):
        real = session() if isinstance(session, scoped_session) else session
        for label, err, call in sync_calls(session):
            with pytest.raises(err):
                call()
            assert not real.in_transaction(), label
        real.close()

    async def in_async_session() -> None:
        url = sa.make_url(db.url)
        url = url.set(drivername="sqlite+aiosqlite" if db.kind == "sqlite" else "postgresql+asyncpg")
        engine = create_async_engine(url)
        store.register(engine)
        try:
            async with AsyncSession(engine) as session:
                for label, (err, function, args, kw) in BEFORE_ANY_IO.items():
                    with pytest.raises(err):
                        await getattr(alk, "a" + function)(session, *args, **kw)
                    assert not session.in_transaction(), label
                with pytest.raises(alk.PayloadError):
                    await job.aenqueue(session, {1})
                assert not session.in_transaction(), "task payload"
        finally:
            await engine.dispose()

    asyncio.run(in_async_session())


BAD_CLAIMS: dict[str, Call] = {
    **{f"worker={w!r}": (lambda q, w=w: q.claim_one(w)) for w in ("", None, 1, b"w1", True)},
    **{f"batch-worker={w!r}": (lambda q, w=w: q.claim_batch(w, 5)) for w in ("", None, 7)},
    **{f"n={n!r}": (lambda q, n=n: q.claim_batch("w1", n)) for n in ("1", 1.0, None, True, [1])},
}


@pytest.mark.parametrize("call", BAD_CLAIMS)
def test_bad_claim_argument(db: Target, q: alk.Queue, call: str) -> None:
    assert_refused(db, q, alk.InvalidOptions, lambda s: BAD_CLAIMS[call](q))


@pytest.mark.parametrize("n", [0, -1, -(2**40)])
def test_claim_batch_non_positive_n_claims_nothing(db: Target, q: alk.Queue, n: int) -> None:
    before = snapshot(db, q)
    assert q.claim_batch("w1", n) == []
    assert snapshot(db, q) == before


BAD_HANDLE_CALLS: dict[str, Call] = {
    **{f"heartbeat({x!r})": (lambda h, x=x: h.heartbeat(x))
       for x in (0, -1, NAN, INF, True, timedelta(0), OVER_100Y, 1e-7, 0.0009)},
    **{f"retry(delay={x!r})": (lambda h, x=x: h.retry("e", delay=x))
       for x in (-1, NAN, INF, True, timedelta(seconds=-1), OVER_100Y)},
}


@pytest.mark.parametrize("call", BAD_HANDLE_CALLS)
def test_bad_handle_argument_changes_nothing_and_keeps_handle(
    db: Target, q: alk.Queue, call: str
) -> None:
    h = q.claim_one("w1")
    assert h is not None
    before, job_before = snapshot(db, q), q.get_job(h.id)
    expect(alk.InvalidOptions, lambda: BAD_HANDLE_CALLS[call](h))
    assert snapshot(db, q) == before and q.get_job(h.id) == job_before
    assert h.ack() is True  # the raising call did not consume the handle
    assert q.get_job(h.id) is None


BAD_IDS = ["1", 1.0, None, True, b"1"]
ID_OPS: dict[str, tuple[Call, object]] = {  # op, and what it returns for an unknown id
    "q.cancel": (lambda q, s, i: q.cancel(i), False),
    "q.get_job": (lambda q, s, i: q.get_job(i), None),
    "q.requeue_dead": (lambda q, s, i: q.requeue_dead(i), None),
    "q.ack_batch": (lambda q, s, i: q.ack_batch([i]), 0),
    "q.dead_jobs": (lambda q, s, i: q.dead_jobs(before_id=i), []),
    "store.get_job": (lambda q, s, i: q.store.get_job(i), None),
    "alk.get_job": (lambda q, s, i: alk.get_job(s, q.name, i), None),
}


@pytest.mark.parametrize(("op", "bad"), [  # dead_jobs(before_id=None) is the valid default
    (op, bad) for op in ID_OPS for bad in BAD_IDS if (op, bad) != ("q.dead_jobs", None)
], ids=repr)
def test_job_id_not_an_int(db: Target, q: alk.Queue, op: str, bad: object) -> None:
    h = q.claim_one("w1")
    assert h is not None  # a bad id anywhere refuses the whole batch: h stays claimed
    assert_refused(db, q, alk.InvalidOptions, lambda s: ID_OPS[op][0](q, s, bad),
                   lambda s: q.ack_batch([h.id, bad]))


# -- the caller's transaction survives a refused call -----------------------------------------

TX_BAD_CALLS: dict[str, tuple[type[Exception], Call]] = {
    "payload": (alk.PayloadError, lambda s, q: alk.enqueue(s, q.name, {1, 2})),
    "delay": (alk.InvalidOptions, lambda s, q: alk.enqueue(s, q, "p", delay=-1)),
    "priority": (alk.InvalidOptions, lambda s, q: alk.enqueue(s, q.name, "p", priority=2**31)),
    "run_at": (alk.InvalidOptions, lambda s, q: alk.enqueue(s, q, "p", run_at=NAIVE)),
    "name": (alk.InvalidName, lambda s, q: alk.enqueue(s, "__alkstore_x", "p")),
    "many-payload": (alk.PayloadError, lambda s, q: alk.enqueue_many(s, q.name, ["ok", NAN])),
    "many-expires": (alk.InvalidOptions, lambda s, q: alk.enqueue_many(s, q, ["ok"], expires=0)),
    "many-name": (alk.InvalidName, lambda s, q: alk.enqueue_many(s, "", ["ok"])),
}


@pytest.mark.parametrize("kind", ["session", "connection"])
@pytest.mark.parametrize("bad", TX_BAD_CALLS)
def test_transaction_stays_usable_after_refusal(
    db: Target, store: alk.Store, qname: str, bad: str, kind: str
) -> None:
    q = store.queue(qname)
    with caller_tx(db, kind) as tx:
        first = alk.enqueue(tx, qname, "first")
        err, call = TX_BAD_CALLS[bad]
        expect(err, lambda: call(tx, q))
        assert alk.get_job(tx, qname, 2**64) is None  # out-of-range id: a value, not SQL
        second = alk.enqueue(tx, q, "second")
        more = alk.enqueue_many(tx, qname, ["third", "fourth"])
        assert alk.get_job(tx, qname, second) is not None
    ids = [first, second, *more]
    assert [j.payload for j in map(q.get_job, ids) if j] == ["first", "second", "third", "fourth"]
    assert q.stats().pending == 4


# -- names are plain values end to end ---------------------------------------------------------

GOOD_NAMES = ["it's", 'say "hi"', "a;b", "'; DROP TABLE x; --",
              '"; DROP TABLE alkstore_jobs; --', "\U0001f4e7 emails \U0001f680",
              "\u0635\u0646\u062f\u0648\u0642 \u0627\u0644\u0628\u0631\u064a\u062f",
              "\u202eevil\u202c", "\u540d\u524d", "y" * 200, "\U0001f642" * 200, "_alkstore",
              "__alkstor", "a%b_c", "back\\slash", " ", "tab\tnew\nline", "%(queue)s", ":queue",
              "?", "$1"]


@pytest.mark.parametrize("name", GOOD_NAMES, ids=repr)
def test_name_is_a_plain_value(db: Target, store: alk.Store, qname: str, name: str) -> None:
    q, other = store.queue(name), store.queue(qname)
    other.enqueue("other")
    jid = q.enqueue({"name": name})
    with caller_tx(db) as s:
        tx_id = alk.enqueue(s, name, "tx")
        job = alk.get_job(s, name, tx_id)
        assert job is not None and job.queue == name
        assert alk.get_job(s, qname, tx_id) is None  # queue-filtered read
    assert (q.stats().pending, other.stats().pending) == (2, 1)
    hs = q.claim_batch("w1", 10)
    assert sorted(h.id for h in hs) == sorted([jid, tx_id])
    assert {h.job.queue for h in hs} == {name}
    assert all(h.ack() for h in hs)
    stats = q.stats()
    assert (stats.pending, stats.processing, stats.dead) == (0, 0, 0)
    assert other.stats().pending == 1 and table_counts(db)[0] is not None


@pytest.mark.parametrize("group", [
    ("emails", "Emails", "EMAILS", "emails "),
    ("caf\u00e9", "cafe\u0301"),
    ("a%", "ab", "a_", "a"),
], ids=repr)
def test_similar_names_are_distinct_queues(store: alk.Store, qname: str, group: tuple) -> None:
    names = [f"{qname}:{g}" for g in group]
    queues = [store.queue(n) for n in names]
    for i, q in enumerate(queues):
        q.enqueue_many([q.name] * (i + 1))
    for i, q in enumerate(queues):
        assert q.stats().pending == i + 1
        hs = q.claim_batch("w1", 100)
        assert len(hs) == i + 1 and {(h.job.queue, h.payload) for h in hs} == {(q.name, q.name)}


# -- refusals on live state are values, not exceptions -----------------------------------------

LATE_OPS: dict[str, Call] = {
    "ack": lambda h: h.ack(), "heartbeat": lambda h: h.heartbeat(30),
    "retry": lambda h: h.retry("late"), "retry-delay": lambda h: h.retry("late", delay=0),
    "fail": lambda h: h.fail("late"), "fail-none": lambda h: h.fail(),
}


@pytest.mark.parametrize("how", ["lapsed", "superseded"])
@pytest.mark.parametrize("op", LATE_OPS)
def test_op_on_dead_claim_returns_false_and_changes_nothing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, op: str, how: str
) -> None:
    q = store.queue(qname, visibility_timeout=10, max_attempts=5)
    jid = q.enqueue("p")
    h = q.claim_one("w1")
    assert h is not None
    clock.advance(11)
    newer = q.claim_one("w1") if how == "superseded" else None  # same worker id, new claim
    if how == "superseded":
        assert newer is not None and newer.id == jid and newer.job.attempts == 2
    before, job_before = snapshot(db, q), q.get_job(jid)
    assert LATE_OPS[op](h) is False
    assert snapshot(db, q) == before and q.get_job(jid) == job_before
    assert job_before is not None and job_before.state == "processing"
    if newer is not None:
        assert newer.ack() is True
    else:
        again = q.claim_one("w2")
        assert again is not None and again.id == jid and again.job.attempts == 2


UNKNOWN_IDS = [0, -1, 987_654_321, 2**63 - 1, 2**63, -(2**63) - 1, 2**100]


@pytest.mark.parametrize("op", ID_OPS)
@pytest.mark.parametrize("job_id", UNKNOWN_IDS)
def test_unknown_id_is_a_value(db: Target, q: alk.Queue, op: str, job_id: int) -> None:
    before = snapshot(db, q)
    fn, expected = ID_OPS[op]
    with caller_tx(db) as s:
        assert fn(q, s, job_id) == expected
    assert snapshot(db, q) == before


def test_refusals_on_wrong_state_are_values(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    dead_id, pending_id, live_id = q.enqueue_many(["dead", "pending", "live"])
    h = q.claim_one("w1")
    assert h is not None and h.id == dead_id and h.fail("x") is True
    h = q.claim_one("w1")
    assert h is not None and h.id == pending_id
    assert q.cancel(pending_id) is True
    assert h.ack() is False  # cancel is not an interrupt: the holder's next op is refused
    before = snapshot(db, q)
    assert q.cancel(dead_id) is False  # a dead id cannot be cancelled
    assert q.cancel(pending_id) is False  # already gone
    assert q.requeue_dead(live_id) is None  # a live (pending) job is not dead
    assert q.ack_batch([live_id, dead_id, pending_id]) == 0  # none processing
    assert store.queue(qname + "-other").requeue_dead(dead_id) is None  # other queue
    assert snapshot(db, q) == before


# -- a closed store refuses every operation -----------------------------------------------------

CLOSED_OPS: dict[str, Call] = {
    "q.enqueue": lambda c: c.q.enqueue("p"), "q.enqueue_many": lambda c: c.q.enqueue_many(["p"]),
    "q.claim_one": lambda c: c.q.claim_one("w1"), "q.claim_batch": lambda c: c.q.claim_batch("w1", 5),
    "q.ack_batch": lambda c: c.q.ack_batch([c.h.id]), "q.cancel": lambda c: c.q.cancel(c.h.id),
    "q.get_job": lambda c: c.q.get_job(c.h.id), "q.dead_jobs": lambda c: c.q.dead_jobs(),
    "q.requeue_dead": lambda c: c.q.requeue_dead(c.dead_id),
    "q.sweep_expired": lambda c: c.q.sweep_expired(), "q.stats": lambda c: c.q.stats(),
    "h.ack": lambda c: c.h.ack(), "h.retry": lambda c: c.h.retry("e"),
    "h.retry-delay": lambda c: c.h.retry("e", delay=1), "h.fail": lambda c: c.h.fail("e"),
    "h.heartbeat": lambda c: c.h.heartbeat(30),
    "store.get_job": lambda c: c.store.get_job(c.h.id),
    "store.queue": lambda c: c.store.queue("fresh"), "store.install": lambda c: c.store.install(),
    "alk.enqueue(handle)": lambda c: alk.enqueue(c.tx, c.q, "p"),
    "alk.enqueue_many(handle)": lambda c: alk.enqueue_many(c.tx, c.q, ["p"]),
    "alk.get_job(handle)": lambda c: alk.get_job(c.tx, c.q, c.h.id),
}


@pytest.mark.parametrize("op", CLOSED_OPS)
def test_closed_store_raises_store_closed(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, op: str
) -> None:
    q = store.queue(qname)
    dead_id = q.enqueue("dead")
    h = q.claim_one("w1")
    assert h is not None and h.fail("x") is True
    live_id = q.enqueue("live")
    h = q.claim_one("w1")
    assert h is not None and h.id == live_id
    with caller_tx(db) as tx:
        store.close()
        ctx = SimpleNamespace(q=q, h=h, store=store, dead_id=dead_id, tx=tx)
        expect(alk.StoreClosed, lambda: CLOSED_OPS[op](ctx))
    with db.store(clock=clock) as fresh:  # nothing was written by the refused call
        fq = fresh.queue(qname)
        live, dead = fq.get_job(live_id), fq.get_job(dead_id)
        assert live is not None and live.state == "processing" and live.attempts == 1
        assert dead is not None and dead.state == "dead"
        stats = fq.stats()
        assert (stats.pending, stats.processing, stats.dead) == (0, 1, 1)


@pytest.mark.parametrize("reading", [float("nan"), float("inf"), None, "now", True])
def test_a_broken_injected_clock_is_refused_before_writing(db: Target, reading: object) -> None:
    store = db.store(clock=lambda: reading)
    with pytest.raises(alk.InvalidOptions, match="clock"):
        store.queue("clock-check").enqueue(1)
    store.close()
    assert db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = 'clock-check'") == 0


# -- handles made with their classes: the same name rules as the store's factories -------------

HANDLE_CLASSES: dict[str, Callable[[alk.Store, object], object]] = {
    "Queue": lambda s, name: alk.Queue(s, name, alk.QueueOpts()),  # type: ignore[arg-type]
    "Lock": lambda s, name: alk.Lock(s, name),  # type: ignore[arg-type]
    "Stream": lambda s, name: alk.Stream(s, name),  # type: ignore[arg-type]
    "Outbox": lambda s, name: alk.Outbox(s, name),  # type: ignore[arg-type]
}
HANDLE_BAD_NAMES = ["", "x" * 201, "a\x00b", "\ud800", None, 7, "__alkstore_scheduler", "__alkstore_outbox:o"]


@pytest.mark.parametrize("bad", HANDLE_BAD_NAMES, ids=repr)
@pytest.mark.parametrize("cls", sorted(HANDLE_CLASSES))
def test_a_handle_class_refuses_a_bad_or_reserved_name(store: alk.Store, cls: str, bad: object) -> None:
    """``alk.Lock(store, name)`` (and Queue, Stream, Outbox: public classes) checks the name
    as ``store.lock(name)`` does: a reserved name would reach the scheduler's leadership
    lease or an outbox's backing queue, a malformed one the database."""
    expect(alk.InvalidName, lambda: HANDLE_CLASSES[cls](store, bad))


def test_a_queue_handle_refuses_options_that_are_no_queue_opts(store: alk.Store, qname: str) -> None:
    expect(alk.InvalidOptions, lambda: alk.Queue(store, qname, {"max_attempts": 3}))  # type: ignore[arg-type]


# -- reserved channel names; payloads nested too deeply to serialize ---------------------------

RESERVED_CHANNELS = ["__alkstore", "__alkstore_wake", "__alkstore.internal", "__alkstoreX"]


@pytest.mark.parametrize("channel", RESERVED_CHANNELS)
def test_reserved_channel_names_are_refused(db: Target, store: alk.Store, channel: str) -> None:
    """SPEC §3: a channel name starting with ``__alkstore`` is an InvalidName for notify,
    listen and the transactional notify, before anything is sent or listened to."""
    notes = db.scalar(f"SELECT count(*) FROM {db.table('alkstore_notifications')}")
    expect(alk.InvalidName, lambda: store.notify(channel, "x"))
    expect(alk.InvalidName, lambda: store.listen(channel))
    with caller_tx(db, "connection") as conn:
        expect(alk.InvalidName, lambda: alk.notify(conn, channel, "x"))
        alk.enqueue(conn, "after-refusal", "p")  # the caller's transaction is still usable
    assert db.scalar(f"SELECT count(*) FROM {db.table('alkstore_notifications')}") == notes


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_a_payload_nested_too_deeply_is_a_payload_error(db: Target, store: alk.Store, qname: str) -> None:
    """SPEC §3: 10,000 levels of nesting (json.dumps raises RecursionError) are a
    PayloadError from every payload API, and nothing is written."""
    deep = _nested(10_000, "leaf")
    q, ob, stream = store.queue(qname), store.outbox(qname), store.stream(qname)

    def written() -> tuple[object, ...]:
        return (
            *table_counts(db),
            db.scalar(f"SELECT count(*) FROM {db.table('alkstore_stream_events')}"),
            db.scalar(f"SELECT count(*) FROM {db.table('alkstore_schedules')}"),
        )

    before = written()
    calls: list[Call] = [
        lambda: q.enqueue(deep),
        lambda: q.enqueue_many(["ok", deep]),
        lambda: ob.enqueue(deep),
        lambda: stream.publish(deep),
        lambda: store.schedule(qname, "@every 1m", qname, deep),
    ]
    for call in calls:
        expect(alk.PayloadError, call)
    with caller_tx(db) as s:
        for tx_call in (
            lambda: alk.enqueue(s, qname, deep),
            lambda: alk.enqueue_many(s, q, [deep]),
            lambda: alk.outbox_enqueue(s, qname, deep),
            lambda: alk.publish(s, qname, deep),
        ):
            expect(alk.PayloadError, tx_call)
    expect(alk.PayloadError, lambda: store.notify("deep", deep))  # type: ignore[arg-type]
    assert written() == before
    # moderately deep payloads still round-trip
    job = q.get_job(q.enqueue(_nested(100, 1)))
    assert job is not None and job.payload == _nested(100, 1)


def test_the_deepest_payload_accepted_is_read_back_from_any_stack(store: alk.Store, qname: str) -> None:
    """A payload is accepted when json.dumps succeeds on the enqueuer's stack; its reader's
    stack may be deeper (a worker's claim loop, a web request), and decoding it there used
    to raise RecursionError: out of get_job, and out of a worker's run(), leaving the job's
    whole batch claimed. Every reader decodes what any enqueuer could write."""
    q = store.queue(qname)
    depth, job_id = deepest_accepted(q.enqueue)
    after = q.enqueue("after")
    seen: dict[int, int] = {}

    def handler(job: alk.Job) -> None:
        seen[job.id] = list_depth(job.payload)

    def deep_get(levels: int) -> alk.Job | None:
        return deep_get(levels - 1) if levels else store.get_job(job_id)

    job = deep_get(100)  # a caller 100 frames down
    assert job is not None and list_depth(job.payload) == depth
    alk.Worker(store, qname, handler, concurrency=1).run(alk.StopToken(), burst=True)
    assert seen == {job_id: depth, after: 0}
    assert store.get_job(job_id) is None and store.get_job(after) is None


@pytest.mark.parametrize(
    "raised",
    [alk.Retry(60, "upstream busy"), alk.Retry(), alk.Retry(timedelta(seconds=5)), alk.Fail("gone"), alk.Fail()],
    ids=repr,
)
def test_fail_and_retry_survive_pickling_and_copying(raised: Exception) -> None:
    """A handler that runs work in a process pool gets a Retry or Fail raised there back
    pickled: it must come back as itself (the default rebuild passed the error text as
    the delay, which Retry's check refused, and the pool broke)."""
    import copy
    import pickle

    for back in (pickle.loads(pickle.dumps(raised)), copy.copy(raised)):
        assert type(back) is type(raised) and vars(back) == vars(raised) and back.args == raised.args


# -- whatever takes a store: something else is an InvalidOptions naming what was given -----------

STORE_TAKERS: dict[str, Callable[[object], object]] = {
    "Worker": lambda s: alk.Worker(s, "q", lambda job: None),  # type: ignore[arg-type]
    "Worker-tasks": lambda s: alk.Worker(s, alk.Tasks()),  # type: ignore[arg-type]
    "Queue": lambda s: alk.Queue(s, "q", alk.QueueOpts()),  # type: ignore[arg-type]
    "Lock": lambda s: alk.Lock(s, "l"),  # type: ignore[arg-type]
    "Stream": lambda s: alk.Stream(s, "s"),  # type: ignore[arg-type]
    "Outbox": lambda s: alk.Outbox(s, "o"),  # type: ignore[arg-type]
    "Subscription": lambda s: alk.Subscription(s, "c"),  # type: ignore[arg-type]
}
NOT_STORES = ["not a store", "sqlite:///app.db", None, 7, SimpleNamespace(queue=None, backend=None)]


@pytest.mark.parametrize("bad", NOT_STORES, ids=repr)
@pytest.mark.parametrize("taker", sorted(STORE_TAKERS))
def test_something_that_is_no_store_is_refused_naming_what_was_given(taker: str, bad: object) -> None:
    """``alk.Worker("sqlite:///app.db", ...)`` (a URL, an engine, None where the store goes)
    raised an AttributeError from deep inside (``'str' object has no attribute 'queue'``),
    and ``alk.Lock("x", name)`` and the other handle classes took it and failed at their
    first operation: each says what it was given and what it needs, before anything else."""
    with pytest.raises(alk.InvalidOptions, match=rf"must be an alk\.Store.*got {type(bad).__name__}"):
        STORE_TAKERS[taker](bad)
