"""PgBouncer in transaction-pooling mode (issue 9 item 6): the store's own connections work
behind it with the library's defaults (no prepared-statement collisions across clients);
LISTEN through it delivers nothing, which the listener's round-trip probe detects and logs
once while workers drain by polling; a direct listener connection beside a pooled engine
gets every notification; asyncpg application processes set up as docs/pgbouncer.md says
enqueue in their own transactions without an error.

The PgBouncer is the one ``.ci/run`` started (``ALKSTORE_TEST_PGBOUNCER_URL``), else a
private one on a free loopback port; without the ``pgbouncer`` package these tests skip
with that reason outside CI and fail under CI."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa._backends import pg_listener, pg_wire
from tests.faults import pgbouncer
from tests.support import IN_CI, Target, wait_for

DELIVERY = 10.0
THREADS = 8
HAMMER_SECONDS = 3.0
NO_PREPARE = {"prepare_threshold": None}  # isolates the listener tests from statement caching
# docs/pgbouncer.md's asyncpg settings: SQLAlchemy's statement cache off, asyncpg's unnamed statements
ASYNCPG_SETTINGS = {"prepared_statement_cache_size": 0, "statement_cache_size": 0}


def _running(start: Callable[[], pgbouncer.Bouncer]) -> Iterator[pgbouncer.Bouncer]:
    """A PgBouncer started by ``start`` for the fixture's scope (a failure under CI, where
    it must be there; elsewhere a skip that says why)."""
    try:
        started = start()
    except (FileNotFoundError, RuntimeError) as exc:
        if IN_CI:
            pytest.fail(f"PgBouncer is required under CI: {exc}")
        pytest.skip(str(exc))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def bouncer(_pg_module_target: Target) -> Iterator[pgbouncer.Bouncer]:
    yield from _running(pgbouncer.start)


@pytest.fixture
def pg(_pg_module_target: Target) -> Target:
    return _pg_module_target


def test_store_works_behind_transaction_pooling_with_default_settings(
    bouncer: pgbouncer.Bouncer, pg: Target
) -> None:
    """8 threads enqueue, claim and ack for a few seconds through the pooler: zero errors
    (psycopg's automatic prepared statements would collide across PgBouncer's clients)."""
    engine = sa.create_engine(bouncer.url, pool_size=THREADS)
    store = alk.Store(engine, schema=pg.schema)
    q = store.queue("pooled")
    errors: list[str] = []
    acked = [0] * THREADS
    until = time.monotonic() + HAMMER_SECONDS

    def hammer(i: int) -> None:
        while time.monotonic() < until and len(errors) < 50:
            try:
                q.enqueue({"thread": i})
                handle = q.claim_one(f"w{i}")
                if handle is not None and handle.ack():
                    acked[i] += 1
            except Exception as exc:  # noqa: BLE001 - every error is the finding
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(HAMMER_SECONDS + 60)
        assert not errors, f"{len(errors)} errors behind PgBouncer; first: {errors[:3]}"
        assert sum(acked) > THREADS  # each thread went round more than the threshold of 5
    finally:
        store.close()
        engine.dispose()


def test_listen_through_the_pooler_is_detected_and_workers_poll(
    bouncer: pgbouncer.Bouncer, pg: Target, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_listener, "PROBE_TIMEOUT", 3.0)
    engine = sa.create_engine(bouncer.url, connect_args=NO_PREPARE)
    store = alk.Store(engine, schema=pg.schema)
    handled: list[int] = []
    worker = alk.Worker(store, "polled", lambda job: handled.append(job.id), concurrency=2, poll_interval=0.3)
    stop = alk.StopToken()
    runner = threading.Thread(target=worker.run, args=(stop,))
    caplog.set_level(logging.WARNING, logger="alkstore_sa")
    try:
        runner.start()
        hub = store.hub()  # the one the worker uses
        assert wait_for(lambda: hub.listen_works is not None, "the probe's verdict") is not None
        assert hub.listen_works is False
        sub = store.listen("still-returns")  # LISTEN itself succeeds through the pooler
        sub.close()
        ids = [store.queue("polled").enqueue({"n": n}) for n in range(5)]
        wait_for(lambda: set(ids) <= set(handled), "the worker to drain the queue by polling")
    finally:
        stop.stop()
        runner.join(30)
        store.close()
        engine.dispose()
    warnings = [r for r in caplog.records if "LISTEN does not work" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].levelno == logging.WARNING
    assert "PgBouncer" in warnings[0].getMessage() and "poll_interval" in warnings[0].getMessage()


def test_an_idle_worker_leaves_no_presence_lock_on_a_pooled_server_connection(
    bouncer: pgbouncer.Bouncer, pg: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's presence (``advertise``) is a session-level advisory lock taken on the
    listener's connection. Through a transaction pooler that "session" is whichever server
    connection ran the statement: the lock stayed there, held on behalf of nobody, for
    other clients' transactions (every enqueue into the queue then notified for nothing).
    Before the round-trip probe's verdict (held off here) no presence is taken at all."""
    monkeypatch.setattr(pg_listener, "PROBE_TIMEOUT", 600.0)  # no verdict during the test
    advertised = threading.Event()
    advertise = pg_listener.PgHub.advertise

    def spy(self: pg_listener.PgHub, key: str) -> None:
        advertise(self, key)
        advertised.set()

    monkeypatch.setattr(pg_listener.PgHub, "advertise", spy)
    engine = sa.create_engine(bouncer.url, connect_args=NO_PREPARE)
    store = alk.Store(engine, schema=pg.schema)
    queue = "presence-pooled"
    worker = alk.Worker(store, queue, lambda job: None, poll_interval=0.3)
    stop = alk.StopToken()
    runner = threading.Thread(target=worker.run, args=(stop,))
    try:
        runner.start()
        assert advertised.wait(DELIVERY), "the idle worker never advertised"
        store.listen("fence").close()  # the listener has run every command sent before
        held = pg.scalar(
            "SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND classid = :cls"
            " AND objid::text::bigint = (pg_catalog.hashtext(:key)::bigint & 4294967295)",
            cls=pg_wire.WAKE_PRESENCE_CLASS, key=store.backend.wake_key(queue),
        )
        assert store.hub().listen_works is None
        assert held == 0, "a presence lock was left on a server connection of the pool"
    finally:
        stop.stop()
        runner.join(30)
        store.close()
        engine.dispose()


def test_once_listen_is_known_not_to_work_the_listener_sends_no_more_listens(
    bouncer: pgbouncer.Bouncer, pg: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each LISTEN sent through a transaction pooler registers whichever server connection
    ran it: those connections then get the channel's notifications while idle in the pool
    (PgBouncer logs "got packet 'A' from server when not linked" for each) or hand them to
    another client. Once the probe showed that LISTEN does not work, the listener kept
    sending LISTEN (and UNLISTEN) for every channel and stream subscribed later."""
    monkeypatch.setattr(pg_listener, "PROBE_TIMEOUT", 1.0)
    sent: list[str] = []
    execute = pg_wire.ListenConnection.execute

    def spy(self: pg_wire.ListenConnection, command: str, key: str | None, timeout: float) -> None:
        sent.append(command)
        execute(self, command, key, timeout)

    monkeypatch.setattr(pg_wire.ListenConnection, "execute", spy)
    engine = sa.create_engine(bouncer.url, connect_args=NO_PREPARE)
    store = alk.Store(engine, schema=pg.schema)
    try:
        hub = store.hub()
        wait_for(lambda: hub.listen_works is not None, "the probe's verdict")
        assert hub.listen_works is False
        sent.clear()
        sub = store.listen("later")  # still returns (docs/pgbouncer.md): it receives nothing
        sub.close()
        stop = alk.StopToken()
        events = store.stream("later-stream").subscribe("c", stop)
        store.stream("later-stream").publish(1)
        assert next(events).payload == 1  # by its re-read
        stop.stop()
        events.close()
        store.listen("fence").close()  # the listener has run every command sent before
        assert [c for c in sent if "LISTEN" in c] == []
    finally:
        store.close()
        engine.dispose()


def test_a_direct_listener_beside_a_pooled_engine_gets_notifications(
    bouncer: pgbouncer.Bouncer, pg: Target, caplog: pytest.LogCaptureFixture
) -> None:
    """The recommended setup: the application's engine through the pooler, the listener on
    a direct connection (``Store(..., listen_url=...)``); notifications sent through the
    pooler arrive, and a worker is woken by an enqueue through the pooler."""
    engine = sa.create_engine(bouncer.url)
    store = alk.Store(engine, schema=pg.schema, listen_url=pg.url)
    caplog.set_level(logging.WARNING, logger="alkstore_sa")
    try:
        sub = store.listen("direct")
        store.notify("direct", "through the pooler")
        got = sub.get(timeout=DELIVERY)
        assert got is not None and got.payload == "through the pooler"
        sub.close()
        hub = store.hub()
        wait_for(lambda: hub.listen_works is not None, "the probe's verdict")
        assert hub.listen_works is True
    finally:
        store.close()
        engine.dispose()
    assert not [r for r in caplog.records if "LISTEN does not work" in r.getMessage()]


def _aenqueue_through(url: str, schema: str, queue: str, connect_args: dict[str, object]) -> list[str]:
    """One application process: an asyncpg engine through the pooler, three sessions each
    enqueueing in 30 transactions of their own; the errors, as text."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def app() -> list[str]:
        engine = create_async_engine(url, pool_size=3, max_overflow=0, connect_args=connect_args)
        store = alk.Store(engine, schema=schema)
        errors: list[str] = []

        async def session(n: int) -> None:
            for i in range(30):
                try:
                    async with AsyncSession(engine) as s, s.begin():
                        await alk.aenqueue(s, store.queue(queue), {"session": n, "i": i})
                except Exception as exc:  # noqa: BLE001 - every error is the finding
                    errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])

        try:
            await asyncio.gather(*(session(n) for n in range(3)))
        finally:
            store.close()
            await engine.dispose()
        return errors

    return asyncio.run(app())


def _app_process(url: str, schema: str, queue: str, out: Any) -> None:
    out.put(_aenqueue_through(url, schema, queue, ASYNCPG_SETTINGS))


def test_asyncpg_set_up_as_documented_enqueues_through_transaction_pooling(
    bouncer: pgbouncer.Bouncer, pg: Target
) -> None:
    """docs/pgbouncer.md's asyncpg setup: four application processes, each an asyncpg
    engine through the pooler with the two settings in connect_args and a Store on it,
    enqueue in their own transactions with alk.aenqueue: not one error (SQLAlchemy's
    statement cache gave 'prepared statement ... does not exist', asyncpg's named
    statements 'already exists' across processes). The same option in the URL is refused
    by Store(async_engine), with the way out in the message."""
    url = sa.make_url(bouncer.url).set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)
    queue = "asyncpg-pooled"
    spawn = multiprocessing.get_context("spawn")  # fresh interpreters, as application processes are
    out = spawn.Queue()
    procs = [spawn.Process(target=_app_process, args=(url, pg.schema, queue, out)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        errors = [e for _ in procs for e in out.get(timeout=60)]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    assert not errors, f"{len(errors)} errors; first: {errors[:3]}"
    store = alk.Store(pg.engine, schema=pg.schema)
    try:
        assert store.queue(queue).stats().ready == 4 * 3 * 30
    finally:
        store.close()
    from sqlalchemy.ext.asyncio import create_async_engine

    in_url = create_async_engine(url + "?prepared_statement_cache_size=0")
    try:
        with pytest.raises(alk.InvalidOptions, match="prepared_statement_cache_size.*register"):
            alk.Store(in_url, schema=pg.schema)
    finally:
        asyncio.run(in_url.dispose())


# A pooler with one server connection: a store-side read made while the caller's
# transaction holds it can only wait, until PgBouncer fails it after this many seconds
ONE_SERVER_WAIT = 5


@pytest.fixture(scope="module")
def one_server_bouncer(_pg_module_target: Target) -> Iterator[pgbouncer.Bouncer]:
    yield from _running(lambda: pgbouncer.start_private(pool_size=1, query_wait_timeout=ONE_SERVER_WAIT))


@pytest.mark.parametrize("startup", ["check_schema", "install"])
def test_first_enqueue_in_a_transaction_after_check_schema_needs_no_second_server_connection(
    one_server_bouncer: pgbouncer.Bouncer, pg: Target, startup: str
) -> None:
    """A FastAPI app on asyncpg (and a Flask one on psycopg2) behind a transaction pooler,
    its store checked at startup as the docs' lifespan recipe does: a burst of first
    requests, each holding a server connection in its transaction (the order flushed) when
    it enqueued, hung until the app's pool timed out. The first caller's-transaction call
    on an engine checked that it reaches the store's database by reading the store's side
    on another connection, which PgBouncer could only give once a transaction ended. With
    one server connection a single request showed it; ``check_schema()`` (and ``install()``,
    which an app may call at startup instead: a no-op read at the head) now read the store's
    side beforehand."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    queue = f"one-server-{startup}"

    async_url = sa.make_url(one_server_bouncer.url).set(drivername="postgresql+asyncpg")

    async def app() -> int:
        async_engine = create_async_engine(async_url, connect_args=ASYNCPG_SETTINGS)
        store = alk.Store(async_engine, schema=pg.schema)
        try:
            await asyncio.to_thread(getattr(store, startup))  # the lifespan's startup check
            async with AsyncSession(async_engine) as session, session.begin():
                await session.execute(sa.text("SELECT 1"))  # the transaction holds the server connection
                return await alk.aenqueue(session, queue, {"n": 1})
        finally:
            store.close()
            await async_engine.dispose()

    job_id = asyncio.run(app())

    sync_engine = sa.create_engine(sa.make_url(one_server_bouncer.url).set(drivername="postgresql+psycopg2"))
    store = alk.Store(sync_engine, schema=pg.schema)
    try:
        getattr(store, startup)()
        with sa.orm.Session(sync_engine) as session, session.begin():
            session.execute(sa.text("SELECT 1"))
            second = alk.enqueue(session, queue, {"n": 2})
        assert [j.id for j in store.queue(queue).claim_batch("w", 10)] == [job_id, second]
    finally:
        store.close()
        sync_engine.dispose()


def test_the_first_enqueue_that_cannot_read_the_stores_side_says_to_check_the_schema_at_startup(
    one_server_bouncer: pgbouncer.Bouncer, pg: Target
) -> None:
    """Without a check at startup (tasks.md's Flask snippet has none), the read of the
    store's side in the first request's transaction waits for a server connection that
    transaction holds, until PgBouncer gives up: the request failed with
    ``ProtocolViolation: query_wait_timeout``, nothing saying why the store read anything.
    The error now says what it was reading and what avoids it; the caller's transaction
    stays usable (the check runs before anything is written)."""
    engine = sa.create_engine(sa.make_url(one_server_bouncer.url).set(drivername="postgresql+psycopg2"))
    store = alk.Store(engine, schema=pg.schema)  # no check_schema()
    try:
        with sa.orm.Session(engine) as session, session.begin():
            session.execute(sa.text("SELECT 1"))
            with pytest.raises(alk.DatabaseError, match=r"check_schema\(\).*pgbouncer\.md") as caught:
                alk.enqueue(session, "one-server-unchecked", {"n": 1})
            assert "query_wait_timeout" in str(caught.value)
            assert session.execute(sa.text("SELECT 2")).scalar() == 2
        store.check_schema()
        with sa.orm.Session(engine) as session, session.begin():
            session.execute(sa.text("SELECT 1"))
            alk.enqueue(session, "one-server-unchecked", {"n": 2})
        assert store.queue("one-server-unchecked").stats().ready == 1
    finally:
        store.close()
        engine.dispose()
