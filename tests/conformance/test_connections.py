"""SPEC §4 (issue 9 item 4): the store's own connections follow the engine's pool rules —
``pool_recycle``, ``engine.dispose()``, ``pool_pre_ping`` (a checkout, so a ping, per
operation) — and ``close()`` returns every one of them. Faults (killed backends, fork,
NullPool, close during an operation) are in tests/faults/test_store_connections.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.conftest import require_pg
from tests.support import PG_URL, WAIT, Target


class Opened:
    """Counts the DBAPI connections an engine's pool opens."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        event.listen(engine, "connect", self._opened)

    def _opened(self, *_: Any) -> None:
        self.count += 1


class Checkouts(Opened):
    """Counts the checkouts of an engine's pool (each one pinged under ``pool_pre_ping``)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        event.listen(engine, "checkout", self._opened)


def _engine(db: Target, **kw: Any) -> sa.Engine:
    return sa.create_engine(db.url, **kw)


@pytest.fixture
def make_store(db: Target) -> Iterator[Any]:
    """Stores on engines of the test's own, closed and disposed afterwards."""
    made: list[tuple[alk.Store, sa.Engine]] = []

    def make(**engine_kw: Any) -> tuple[alk.Store, sa.Engine, Opened]:
        engine = _engine(db, **engine_kw)
        opened = Opened(engine)
        store = alk.Store(engine, schema=db.schema)
        store.check_schema()
        made.append((store, engine))
        return store, engine, opened

    yield make
    for store, engine in made:
        store.close()
        engine.dispose()


def _ops(store: alk.Store, queue: str) -> None:
    q = store.queue(queue)
    q.enqueue("x")
    h = q.claim_one("w")
    assert h is not None and h.ack() is True


def test_pool_recycle_applies_to_the_stores_connections(make_store: Any, qname: str) -> None:
    # pool_recycle=0: every connection is past its age at its next checkout
    store, _, opened = make_store(pool_recycle=0)
    q = store.queue(qname)
    before = opened.count
    for _ in range(3):
        q.stats()
    assert opened.count >= before + 2, "the store reused a connection past pool_recycle"


def test_engine_dispose_renews_the_stores_connections(make_store: Any, qname: str) -> None:
    store, engine, opened = make_store()
    _ops(store, qname)
    before = opened.count
    engine.dispose()
    _ops(store, qname)
    assert opened.count > before, "the store kept connections of the disposed pool"
    assert engine.pool.checkedout() <= 4  # type: ignore[attr-defined]


def test_pre_ping_engine_checks_out_per_operation(make_store: Any, qname: str) -> None:
    """With ``pool_pre_ping`` the pool pings at every checkout: the store checks out for
    every operation (and keeps nothing checked out between them), so every operation's
    connection was pinged."""
    store, engine, _ = make_store(pool_pre_ping=True)
    pinged: list[int] = []
    event.listen(engine, "checkout", lambda *_: pinged.append(1))
    _ops(store, qname)
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert len(pinged) >= 3  # enqueue, claim, ack


def test_close_returns_every_connection_to_the_pool(make_store: Any, qname: str) -> None:
    store, engine, _ = make_store()
    q = store.queue(qname)
    threads = [threading.Thread(target=lambda: (q.enqueue("x"), q.stats())) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.pool.checkedout() >= 1  # type: ignore[attr-defined]  # the cache keeps some
    store.close()
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with pytest.raises(alk.StoreClosed):
        store.queue(qname)


def test_listen_url_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    """``listen_url`` is the PostgreSQL listener's own connection: a SQLite store refuses it,
    and so does a PostgreSQL store given a non-PostgreSQL URL (nothing is registered)."""
    with pytest.raises(alk.InvalidOptions, match="PostgreSQL"):
        alk.Store(f"sqlite:///{tmp_path / 'x.db'}", listen_url=f"sqlite:///{tmp_path / 'y.db'}")
    require_pg()
    with pytest.raises(alk.InvalidOptions, match="PostgreSQL"):
        alk.Store(PG_URL, listen_url=f"sqlite:///{tmp_path / 'y.db'}")


def test_a_listen_url_on_another_database_is_refused_at_the_schema_check(pg_db: Target, tmp_path: Path) -> None:
    """PostgreSQL delivers a NOTIFY to the sessions listening in *its* database: a
    ``listen_url`` naming another one (a typo in ``$ALKSTORE_LISTEN_URL``, a replica) gave
    a worker that never woke, polling every ``poll_interval`` without a word — the
    listener's connection reached its server directly, so no probe ran. The schema check
    (run by ``check_schema()``, a worker's ``run()`` and every command) now compares the
    listener's database with the store's: ``InvalidOptions`` naming both; the same
    database through another URL passes."""
    other = sa.make_url(pg_db.url).set(database="postgres", drivername="postgresql")
    # a password in the query (libpq takes it there too) is hidden in the message
    other = other.update_query_dict({"password": "s3cr3t-pw"})
    store = alk.Store(pg_db.engine, schema=pg_db.schema, listen_url=other)
    try:
        with pytest.raises(alk.InvalidOptions, match=r"listen_url reaches another database.*'postgres'") as refused:
            store.check_schema()
        assert "s3cr3t" not in str(refused.value) and "password=***" in str(refused.value), refused.value
        worker = alk.Worker(store, "never-woken", lambda job: None)
        with pytest.raises(alk.InvalidOptions, match="listen_url"):
            worker.run(alk.StopToken())
    finally:
        store.close()
    same = sa.make_url(pg_db.url).set(drivername="postgresql", host="localhost")
    store = alk.Store(pg_db.engine, schema=pg_db.schema, listen_url=same)
    try:
        store.check_schema()
    finally:
        store.close()


def test_a_listen_url_that_does_not_answer_keeps_no_one_waiting(
    pg_db: Target, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``listen_url`` whose server takes the connection but never answers (a host behind
    a firewall that drops packets, a server stalled): the listener keeps retrying on its own
    and workers poll, so the check that it reaches the store's database must not hold the
    store's first operation (an enqueue in a web request) or a worker's start for the
    driver's connect timeout (psycopg's default: 130 s). The check gives up after
    ``LISTEN_CHECK_WAIT`` and is not a verdict: the enqueue goes through."""
    import socket

    from alkstore_sa import store as store_module

    monkeypatch.setattr(store_module, "LISTEN_CHECK_WAIT", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
    port = silent.getsockname()[1]
    store = alk.Store(pg_db.engine, schema=pg_db.schema, listen_url=f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    done = threading.Event()
    outcome: list[object] = []

    def first_enqueue() -> None:
        try:
            outcome.append(store.queue(qname).enqueue("x"))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome.append(exc)
        finally:
            done.set()

    try:
        threading.Thread(target=first_enqueue, daemon=True).start()
        assert done.wait(60), "the first enqueue waited for listen_url's server to answer"
        assert isinstance(outcome[0], int), outcome
    finally:
        store.close()
        silent.close()


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg", "psycopg_async"])
def test_a_listen_url_engine_of_another_driver_is_refused_at_the_store(driver: str) -> None:
    """The listener runs on psycopg 3's connection: a psycopg2 Engine (or an async engine's
    sync facade) as ``listen_url`` is refused when the store is made, naming the fix —
    not accepted, to fail at every reconnect and make ``listen()`` wait 30 s for an
    AttributeError."""
    require_pg()
    url = sa.make_url(PG_URL).set(drivername=f"postgresql+{driver}")
    if driver == "psycopg2":
        listen_engine = sa.create_engine(url)
    else:
        from sqlalchemy.ext.asyncio import create_async_engine

        listen_engine = create_async_engine(url).sync_engine
    with pytest.raises(alk.InvalidOptions, match=r"psycopg 3.*pass its URL"):
        alk.Store(PG_URL, listen_url=listen_engine)
    listen_engine.dispose()
    # its URL is accepted: the store makes the listener's psycopg 3 engine from it
    store = alk.Store(PG_URL, listen_url=url if driver == "psycopg2" else sa.make_url(PG_URL))
    store.close()


# -- pools that hand one connection to several checkouts ----------------------------------


@pytest.mark.parametrize("poolclass", ["StaticPool", "SingletonThreadPool"])
def test_a_store_never_borrows_a_connection_the_application_holds(
    db: Target, qname: str, poolclass: str
) -> None:
    """``StaticPool`` hands every checkout the same connection, ``SingletonThreadPool`` every
    checkout of a thread: a store operation borrowing it would run inside the application's
    open transaction, see its uncommitted rows, and end it (on SQLite, taking the
    connection out of its transaction commits it). The store runs on an engine of its own
    instead: the application's rollback leaves nothing and its commit keeps everything."""
    kw: dict[str, Any] = {"poolclass": getattr(sa.pool, poolclass)}
    if db.kind == "sqlite":
        kw["connect_args"] = {"check_same_thread": False}  # the FastAPI tutorial's engine
    engine = _engine(db, **kw)
    store = alk.Store(engine, schema=db.schema)
    meta = sa.MetaData()
    schema = db.schema if db.kind == "postgresql" else None  # the app's own table, beside the store's
    orders = sa.Table(f"orders_{qname}", meta, sa.Column("id", sa.Integer, primary_key=True), schema=schema)
    try:
        meta.create_all(engine)
        for commit in (False, True):
            with Session(engine) as session:
                session.execute(orders.insert().values(id=1 if commit else 2))
                job = alk.enqueue(session, qname, {"commit": commit})
                # a store operation meanwhile runs on a connection of its own: it does not see
                # the uncommitted job, nor end the application's transaction
                assert store.get_job(job) is None
                (session.commit if commit else session.rollback)()
            with engine.connect() as conn:
                ids = sorted(conn.execute(sa.select(orders.c.id)).scalars())
            assert ids == ([1] if commit else [])
            found = store.get_job(job)
            assert (found is not None and found.queue == qname) if commit else found is None
    finally:
        store.close()
        meta.drop_all(engine)
        engine.dispose()


def _app_engine_the_store_does_not_run_on(db: Target, **kw: Any) -> sa.Engine:
    """psycopg2 on PostgreSQL, a StaticPool on SQLite: the store makes an engine of its own."""
    if db.kind == "postgresql":
        return sa.create_engine(sa.engine.make_url(db.url).set(drivername="postgresql+psycopg2"), **kw)
    return _engine(db, poolclass=sa.pool.StaticPool, connect_args={"check_same_thread": False}, **kw)


def test_the_stores_own_engine_follows_the_application_engines_pool_rules(db: Target, qname: str) -> None:
    """SPEC §4: the store's connections follow the engine's pool rules — also when the store
    runs on an engine of its own (a psycopg2 or async application engine, a sharing pool):
    ``pool_pre_ping`` (a checkout, so a ping, per operation; nothing kept) and
    ``pool_recycle`` carry over to it."""
    for kw in ({"pool_pre_ping": True}, {"pool_recycle": 0}):
        app = _app_engine_the_store_does_not_run_on(db, **kw)
        store = alk.Store(app, schema=db.schema)
        try:
            own = store.engine
            assert own is not app
            opened = Opened(own)
            checkouts = Checkouts(own)
            _ops(store, qname)
            store.queue(qname).stats()
            if "pool_pre_ping" in kw:
                assert checkouts.count >= 4 and own.pool.checkedout() == 0  # type: ignore[attr-defined]
            else:
                assert opened.count >= 3, "the store reused a connection past pool_recycle"
        finally:
            store.close()
            app.dispose()


def test_a_closed_store_keeps_nothing_of_its_engine_alive(db: Target, qname: str) -> None:
    """docs/connections.md: an open store keeps its engine (and kept connections) until
    ``close()``; after ``close()`` nothing of the library does — an app factory per test
    that closes its stores gets its engines and connections back."""
    import gc
    import weakref

    def use_and_close() -> weakref.ref[sa.Engine]:
        engine = _engine(db)
        store = alk.Store(engine, schema=db.schema)
        store.queue(qname).stats()  # a connection kept by the store
        with Session(engine) as session, session.begin():
            alk.enqueue(session, qname, {"n": 1})  # the by-name path: the registration
        store.close()
        return weakref.ref(engine)

    closed = use_and_close()
    gc.collect()
    assert closed() is None


@pytest.mark.parametrize("first", ["check_schema", "install", "enqueue", "stats"])
def test_an_exhausted_pool_raises_an_alkstore_error_on_the_first_operation(
    db: Target, qname: str, first: str
) -> None:
    """pool_size=1, max_overflow=0, shared by the application and the store: while the
    application's session holds the one connection, the store's operation cannot get one
    and fails after ``pool_timeout`` — with a DatabaseError (SPEC §3: every raised error is
    an AlkstoreError), also on the store's first operation, which checks the schema first
    (that check let SQLAlchemy's TimeoutError through)."""
    engine = _engine(db, pool_size=1, max_overflow=0, pool_timeout=0.2)
    store = alk.Store(engine, schema=db.schema)
    q = store.queue(qname)
    try:
        with Session(engine) as session:
            session.execute(sa.text("SELECT 1"))  # the application holds the only connection
            op = {"check_schema": store.check_schema, "install": store.install, "enqueue": lambda: q.enqueue("x"), "stats": q.stats}[first]
            with pytest.raises(alk.DatabaseError) as caught:
                op()
            assert isinstance(caught.value.orig, sa.exc.TimeoutError)
        assert q.enqueue("x") > 0  # the connection is back: the store works
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("pool", [sa.pool.StaticPool, sa.pool.SingletonThreadPool])
@pytest.mark.parametrize("how", ["Store(engine)", "register(engine)"])
def test_a_store_made_while_the_app_holds_a_shared_sqlite_connection_keeps_its_transaction(
    sqlite_db: Target, qname: str, pool: Any, how: str
) -> None:
    """SQLite, a pool that hands one connection to every checkout (the FastAPI tutorial's
    StaticPool with check_same_thread=False): a Store made, or the engine register()ed,
    while a request's transaction is open on that connection. Applying the store's SQLite
    settings disposed of the pool, which closed that very connection: the request's order
    and its job were lost and its commit failed ('Cannot operate on a closed database')."""
    engine = sa.create_engine(sqlite_db.url, poolclass=pool, connect_args={"check_same_thread": False})
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE shared_orders (id INTEGER PRIMARY KEY, note TEXT)")
    first = alk.Store(engine)  # made at startup
    later: alk.Store | None = None
    try:
        with Session(engine) as session:
            session.execute(sa.text("INSERT INTO shared_orders (note) VALUES ('mine')"))
            job_id = alk.enqueue(session, qname, {"order": "mine"})
            if how == "Store(engine)":
                later = alk.Store(engine)
            else:
                later = alk.Store(sqlite_db.url)
                later.register(engine)
            session.commit()
        assert sqlite_db.scalar("SELECT count(*) FROM shared_orders") == 1
        assert first.get_job(job_id) is not None
        with engine.connect() as conn:  # the settings reached the shared connection too
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
    finally:
        if later is not None:
            later.close()
        first.close()
        engine.dispose()


@pytest.mark.parametrize("how", ["Store(engine)", "register(engine)"])
def test_a_store_made_while_the_app_holds_a_pooled_sqlite_connection_leaves_the_pool_whole(
    sqlite_db: Target, qname: str, how: str
) -> None:
    """SQLite, an ordinary queue pool (pool_size=1, max_overflow=0): a Store made, or the
    engine register()ed, while a request holds the pool's one connection (a store made
    lazily on first use, inside a request). Applying the store's SQLite settings emptied
    the pool in a way that forgot the connection checked out: once returned, it went on
    serving the application without the settings (SQLite's 5 s busy timeout, not the
    store's 60 s), and the pool counted it out twice, handing out two connections at once
    where the application allowed one."""
    engine = sa.create_engine(sqlite_db.url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    store: alk.Store | None = None
    try:
        with engine.connect() as request:
            request.exec_driver_sql("SELECT 1")  # the request holds the pool's one connection
            if how == "Store(engine)":
                store = alk.Store(engine)
            else:
                store = alk.Store(sqlite_db.url)
                store.register(engine)
        with engine.connect() as conn:
            # every connection the application gets from now on has the store's settings
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
            with pytest.raises(sa.exc.TimeoutError):
                engine.connect()  # still one connection at most, as the application configured
        assert store.queue(qname).enqueue("x") > 0
    finally:
        if store is not None:
            store.close()
        engine.dispose()


def test_a_listen_url_reaching_another_database_is_refused_by_listen(pg_db: Target) -> None:
    """NOTIFY is per database: a listener that ``listen_url`` sends to another database
    than the store's hears nothing. ``store.listen()`` as the store's first call (no schema
    check before it) returned a subscription that never received; it raises
    ``InvalidOptions`` naming both databases. A ``listen_url`` spelled differently but
    reaching the store's database works. (helper-109's finding and test.)"""
    other = sa.make_url(PG_URL).set(database="postgres")
    store = alk.Store(pg_db.engine, schema=pg_db.schema, listen_url=other)
    try:
        with pytest.raises(alk.InvalidOptions, match=r"listen_url reaches another database.*'postgres'"):
            store.listen("misdirected")
    finally:
        store.close()
    same = sa.make_url(PG_URL).set(host="localhost")  # another spelling, the same database
    store = alk.Store(pg_db.engine, schema=pg_db.schema, listen_url=same)
    try:
        with store.listen("directed") as sub:
            store.notify("directed", "heard")
            note = sub.get(WAIT)
            assert note is not None and note.payload == "heard"
    finally:
        store.close()


def test_a_store_side_that_cannot_be_reached_at_the_same_database_check_says_only_that(
    db: Target, tmp_path: Path
) -> None:
    """The first caller's-transaction call through an engine besides the store's reads the
    store's database on one of the store's connections. When that read fails because the
    database is down or cannot be opened, the error says so — it added "call
    store.check_schema() at startup ... a transaction pooler may never give", which is the
    answer only to a read that waited for a connection (tests/faults/test_pgbouncer.py).
    The driver's error stays the cause, and nothing is written."""
    if db.kind == "sqlite":
        unreachable = f"sqlite:///{tmp_path / 'no-such-directory' / 'app.db'}"
    else:
        unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/test"  # nothing listens on port 1
    store = alk.Store(unreachable, schema=db.schema)
    try:
        with Session(db.engine) as session:
            with pytest.raises(alk.DatabaseError) as caught:
                alk.enqueue(session, store.queue("down"), {"x": 1})
            session.commit()
    finally:
        store.close()
    message = str(caught.value)
    assert "check_schema" not in message and "pooler" not in message, message
    assert "reading the store's database" in message, message
    assert caught.value.__cause__ is not None and caught.value.orig is not None
    assert alk.Store(db.engine, schema=db.schema).queue("down").stats().ready == 0
