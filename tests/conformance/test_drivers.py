"""The caller's-transaction forms on every driver an application's engine may use (SPEC §13):
psycopg (3), psycopg2 and asyncpg on PostgreSQL; pysqlite and aiosqlite on SQLite.

Each test runs once per driver, through the form that driver takes: ``alk.enqueue(session,
...)`` on a sync engine, ``await alk.aenqueue(async_session, ...)`` on an async one. The
statements run through the application's own driver (compiled for its placeholder style),
in its transaction: commit → visible with the right values, rollback → nothing. Results are
read back through the store's own (psycopg 3 / sqlite3) connections.

A failed call never leaves a commit that silently writes nothing: on PostgreSQL a failed
statement aborts the transaction, so the commit must fail; on SQLite the transaction
carries on and the caller's own rows commit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import PG_URL, WAIT, FakeClock, Target, sqlite_target

Call = Callable[..., Awaitable[Any]]
DRIVERS = ["psycopg", "psycopg2", "asyncpg", "pysqlite", "aiosqlite"]
ASYNC_DRIVERS = {"asyncpg", "aiosqlite"}

orders_md = sa.MetaData()
orders = sa.Table(
    "drv_orders", orders_md,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("note", sa.Text, nullable=False),
)


def app_url(driver: str, target: Target) -> sa.URL:
    """The URL of ``target``'s database for ``driver``."""
    url = sa.make_url(target.url)
    if driver in ("pysqlite", "aiosqlite"):
        return url.set(drivername="sqlite" if driver == "pysqlite" else "sqlite+aiosqlite")
    return sa.make_url(PG_URL).set(drivername=f"postgresql+{driver}")


@dataclass
class App:
    """An application's engine on one driver, and the store its calls are served by."""

    driver: str
    target: Target
    engine: Any  # Engine, or AsyncEngine for the async drivers
    store: alk.Store
    clock: FakeClock
    loop: asyncio.AbstractEventLoop

    @property
    def is_async(self) -> bool:
        return self.driver in ASYNC_DRIVERS

    def tx(self, name: str, *args: Any, commit: bool = True, note: str | None = None, **kw: Any) -> Any:
        """``alk.<name>`` (``await alk.a<name>`` on an async driver) in one transaction of a
        Session (AsyncSession) that also inserts an order row when ``note`` is given;
        committed or rolled back. Returns the call's result."""

        async def body(call: Call) -> Any:
            return await call(name, *args, **kw)

        return self.session_tx(body, commit=commit, note=note)

    def session_tx(self, body: Callable[[Call], Awaitable[Any]], *, commit: bool = True, note: str | None = None) -> Any:
        """Run ``await body(call)`` in one session transaction, where ``await call(name,
        *args, **kw)`` runs the transactional function ``name`` in it: ``alk.<name>`` on a
        sync driver (run at once), ``alk.a<name>`` on an async one."""

        async def in_sync_session() -> Any:
            with Session(self.engine) as session:
                if note is not None:
                    session.execute(orders.insert().values(note=note))
                result = await body(lambda name, *a, **k: _done(getattr(alk, name)(session, *a, **k)))
                session.commit() if commit else session.rollback()
                return result

        async def in_async_session() -> Any:
            async with AsyncSession(self.engine) as session:
                if note is not None:
                    await session.execute(orders.insert().values(note=note))
                result = await body(lambda name, *a, **k: getattr(alk, "a" + name)(session, *a, **k))
                await (session.commit() if commit else session.rollback())
                return result

        return self.run(in_async_session() if self.is_async else in_sync_session())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def notes(self) -> list[str]:
        with self.target.engine.connect() as conn:
            conn = conn.execution_options(schema_translate_map=self._translate())
            return [r[0] for r in conn.execute(sa.select(orders.c.note).order_by(orders.c.id))]

    def _translate(self) -> dict[str | None, str | None]:
        return {None: self.target.schema} if self.target.kind == "postgresql" else {}

    def ts(self, offset: float = 0.0) -> datetime:
        return datetime.fromtimestamp(self.clock.now + offset, timezone.utc)


async def _done(value: Any) -> Any:
    """A sync call's result as an awaitable, so one test body serves both kinds of driver."""
    return value


def make_engine(driver: str, target: Target, **kw: Any) -> Any:
    url = app_url(driver, target)
    if target.kind == "postgresql":
        # the order table lives in the module's schema, like an application's own tables
        kw.setdefault("execution_options", {"schema_translate_map": {None: target.schema}})
    return (create_async_engine if driver in ASYNC_DRIVERS else sa.create_engine)(url, **kw)


@pytest.fixture(params=DRIVERS)
def app(request: pytest.FixtureRequest, tmp_path) -> Iterator[App]:
    driver = request.param
    if driver in ("pysqlite", "aiosqlite"):
        target = sqlite_target(str(tmp_path))
    else:
        target = request.getfixturevalue("_pg_module_target")
    with target.engine.begin() as conn:
        orders_md.create_all(conn.execution_options(schema_translate_map={None: target.schema} if target.kind == "postgresql" else {}))
    clock = FakeClock()
    store = target.store(clock=clock)
    engine = make_engine(driver, target)
    store.register(engine)
    loop = asyncio.new_event_loop()
    application = App(driver, target, engine, store, clock, loop)
    try:
        yield application
    finally:
        store.close()
        if application.is_async:
            loop.run_until_complete(engine.dispose())
        else:
            engine.dispose()
        loop.close()
        if target.kind == "sqlite":
            target.engine.dispose()
        else:
            with target.engine.begin() as conn:
                conn.execute(orders.delete().execution_options(schema_translate_map={None: target.schema}))


def _qname() -> str:
    return f"drv-{uuid.uuid4().hex[:10]}"


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue_every_option_commits_with_its_values(app: App) -> None:
    name = _qname()
    handle = app.store.queue(name, visibility_timeout=45, max_attempts=4, backoff_base=2.5, dead_letter_retention=3600)
    run_at = app.ts(120)
    payload = {"order": 1, "big": 2**70, "text": "naïve \u0000 ☃"}

    async def body(call: Call) -> Any:
        return (
            await call("enqueue", handle, payload, delay=30, priority=-7, max_attempts=9, expires=600),
            await call("enqueue", name, [1, 2.5], run_at=run_at, priority=2**31 - 1),
            await call("enqueue", name, "both", delay=5, run_at=run_at),  # delay wins
            await call("enqueue", handle, None),  # every default over the handle's stamps
        )

    first, second, third, fourth = app.session_tx(body, note="with jobs")
    job = app.store.get_job(first)
    assert job is not None and job.queue == name and job.state == "pending"
    assert job.payload == payload
    assert (job.priority, job.max_attempts, job.attempts) == (-7, 9, 0)
    assert (job.visibility_timeout, job.backoff_base, job.dead_letter_retention) == (45.0, 2.5, 3600.0)
    assert job.created_at == app.ts() and job.run_at == app.ts(30) and job.expires_at == app.ts(600)

    job = app.store.get_job(second)
    assert job is not None and job.payload == [1, 2.5] and job.run_at == run_at
    assert job.priority == 2**31 - 1 and job.expires_at is None
    assert (job.max_attempts, job.visibility_timeout, job.dead_letter_retention) == (3, 300.0, None)
    job = app.store.get_job(third)
    assert job is not None and job.run_at == app.ts(5)
    job = app.store.get_job(fourth)
    assert job is not None and job.payload is None and job.run_at == app.ts()
    assert (job.priority, job.max_attempts, job.visibility_timeout) == (0, 4, 45.0)
    assert app.notes() == ["with jobs"]


def test_enqueue_rolled_back_leaves_nothing(app: App) -> None:
    name = _qname()
    app.tx("enqueue", name, {"order": 1}, delay=3, commit=False, note="rolled back")
    app.tx("enqueue_many", name, [1, 2, 3], commit=False)
    assert app.store.queue(name).stats().pending == 0
    assert app.notes() == []


def test_enqueue_many_commits_in_payload_order(app: App) -> None:
    name = _qname()
    payloads = [{"n": i} for i in range(5)] + ["x", None]
    ids = app.tx("enqueue_many", name, payloads, priority=3, delay=10, max_attempts=2, expires=50)
    assert len(ids) == len(payloads) and ids == sorted(ids)
    jobs = [app.store.get_job(i) for i in ids]
    assert [j.payload for j in jobs if j is not None] == payloads
    for job in jobs:
        assert job is not None and (job.priority, job.max_attempts) == (3, 2)
        assert job.run_at == app.ts(10) and job.expires_at == app.ts(50)
    assert app.tx("enqueue_many", name, []) == []


def test_a_committed_enqueue_is_claimable_by_the_store(app: App) -> None:
    name = _qname()
    job_id = app.tx("enqueue", name, {"claim": "me"})
    handle = app.store.queue(name).claim_one("w")
    assert handle is not None and handle.id == job_id and handle.payload == {"claim": "me"}
    assert handle.ack() is True


# -- outbox, streams, notify ----------------------------------------------------------------


def test_outbox_enqueue_commit_and_rollback(app: App) -> None:
    name = _qname()
    app.tx("outbox_enqueue", name, {"dropped": True}, commit=False)
    msg_id = app.tx("outbox_enqueue", name, {"kept": True}, note="outboxed")
    outbox = app.store.outbox(name)
    job = outbox.get_job(msg_id)
    assert job is not None and job.payload == {"kept": True} and job.created_at == app.ts()
    assert outbox.queue.stats().pending == 1
    assert app.notes() == ["outboxed"]


def test_publish_commit_and_rollback(app: App) -> None:
    name = _qname()
    app.tx("publish", name, {"dropped": True}, commit=False)
    first = app.tx("publish", name, {"e": 1})
    second = app.tx("publish", name, [2])
    events = app.store.stream(name).read()
    assert [(e.offset, e.payload) for e in events] == [(first, {"e": 1}), (second, [2])]
    assert second == first + 1 and events[0].created_at == app.ts()


def test_notify_is_delivered_on_commit_only(app: App) -> None:
    channel = _qname()
    with app.store.listen(channel) as sub:
        app.tx("notify", channel, "rolled back", commit=False)
        app.tx("notify", channel, "committed")
        # the rolled-back one was sent first: had it been delivered, it would come first
        note = sub.get(timeout=WAIT)
        assert note is not None and (note.channel, note.payload) == (channel, "committed")


# -- reads ----------------------------------------------------------------------------------


def test_get_job_in_the_callers_transaction(app: App) -> None:
    name = _qname()
    q = app.store.queue(name, max_attempts=6)
    existing = q.enqueue({"before": 1}, priority=4)

    async def body(call: Call) -> Any:
        new = await call("enqueue", q, {"in": "tx"})
        return (
            await call("get_job", name, existing),
            await call("get_job", q, new),  # the transaction sees its own uncommitted job
            await call("get_job", "other", existing),
            new,
        )

    seen, in_tx, elsewhere, new = app.session_tx(body, commit=False)
    assert seen is not None and (seen.id, seen.payload, seen.priority, seen.max_attempts) == (existing, {"before": 1}, 4, 6)
    assert in_tx is not None and in_tx.id == new and in_tx.payload == {"in": "tx"} and in_tx.state == "pending"
    assert elsewhere is None  # another queue's name
    assert app.store.get_job(new) is None  # rolled back
    assert app.tx("get_job", name, 2**63) is None


# -- failures -------------------------------------------------------------------------------


@pytest.fixture
def uninstalled(app: App, tmp_path) -> Iterator[tuple[App, alk.Store]]:
    """An engine on ``app``'s driver whose registered store has no tables (NotInstalled),
    and whose database has the order table (so the caller's own rows can commit)."""
    if app.target.kind == "sqlite":
        path = tmp_path / f"bare-{uuid.uuid4().hex[:8]}.db"
        bare = Target("sqlite", f"sqlite:///{path}", sa.create_engine(f"sqlite:///{path}"), "alkstore")
        orders_md.create_all(bare.engine)
        store = bare.store()
    else:
        bare = app.target
        store = alk.Store(bare.engine, schema=f"missing_{uuid.uuid4().hex[:8]}")
    engine = make_engine(app.driver, bare)
    store.register(engine)
    other = App(app.driver, bare, engine, store, app.clock, app.loop)
    try:
        yield other, store
    finally:
        store.close()
        if other.is_async:
            app.loop.run_until_complete(engine.dispose())
        else:
            engine.dispose()
        if bare is not app.target:
            bare.engine.dispose()


def test_a_failed_call_never_leaves_a_silent_commit(uninstalled: tuple[App, alk.Store]) -> None:
    """PostgreSQL: the failed statement aborted the transaction, so the commit fails (it
    would otherwise be a silent ROLLBACK losing the caller's rows). SQLite: the transaction
    is still usable and the caller's own row commits."""
    other, _ = uninstalled
    committed: list[bool] = []

    def sync_scenario() -> None:
        with Session(other.engine) as session:
            session.execute(orders.insert().values(note="mine"))
            with pytest.raises(alk.NotInstalled):
                alk.enqueue(session, "q", {"x": 1})
            try:
                session.commit()
                committed.append(True)
            except sa.exc.SQLAlchemyError:
                session.rollback()
                committed.append(False)

    async def async_scenario() -> None:
        async with AsyncSession(other.engine) as session:
            await session.execute(orders.insert().values(note="mine"))
            with pytest.raises(alk.NotInstalled):
                await alk.aenqueue(session, "q", {"x": 1})
            try:
                await session.commit()
                committed.append(True)
            except sa.exc.SQLAlchemyError:
                await session.rollback()
                committed.append(False)

    if other.is_async:
        other.run(async_scenario())
    else:
        sync_scenario()
    if other.target.kind == "postgresql":
        assert committed == [False], "the commit of an aborted transaction must fail"
        assert other.notes() == []
    else:
        assert committed == [True]
        assert other.notes() == ["mine"]
    # the engine is fine afterwards: a new transaction works
    other.session_tx(_nothing, note="after")
    assert other.notes()[-1:] == ["after"]


async def _nothing(call: Call) -> None:
    return None


@pytest.mark.parametrize("app", ["psycopg", "psycopg2", "asyncpg"], indirect=True)
def test_a_failure_inside_a_savepoint_leaves_the_transaction_usable(uninstalled: tuple[App, alk.Store]) -> None:
    """PostgreSQL: rolling back to a SAVEPOINT undoes the failure, and the transaction
    commits the caller's rows (so the failure must not have been made fatal there). (On
    SQLite a failure does not end the transaction at all: the test above.)"""
    other, _ = uninstalled

    def sync_scenario() -> None:
        with Session(other.engine) as session:
            session.execute(orders.insert().values(note="kept"))
            with pytest.raises(alk.NotInstalled), session.begin_nested():
                alk.enqueue(session, "q", {"x": 1})
            session.commit()

    async def async_scenario() -> None:
        async with AsyncSession(other.engine) as session:
            await session.execute(orders.insert().values(note="kept"))
            with pytest.raises(alk.NotInstalled):
                async with session.begin_nested():
                    await alk.aenqueue(session, "q", {"x": 1})
            await session.commit()

    other.run(async_scenario()) if other.is_async else sync_scenario()
    assert other.notes() == ["kept"]


@pytest.mark.parametrize("app", ["psycopg", "psycopg2"], indirect=True)
def test_a_failure_on_an_autocommit_connection_leaves_it_usable(uninstalled: tuple[App, alk.Store]) -> None:
    """In autocommit there is no transaction to lose: the connection stays usable (it is
    not invalidated) after a failed call."""
    other, _ = uninstalled
    with other.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(orders.insert().values(note="autocommitted"))
        with pytest.raises(alk.NotInstalled):
            alk.enqueue(conn, "q", {"x": 1})
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert not conn.invalidated
    assert other.notes() == ["autocommitted"]


# -- autocommit connections -------------------------------------------------------------------


@pytest.mark.parametrize("app", ["pysqlite", "aiosqlite"], indirect=True)
def test_publish_on_an_autocommit_sqlite_connection_is_one_transaction(app: App) -> None:
    """On a SQLite connection in AUTOCOMMIT, publish's two statements (take the offset,
    insert the event) still commit together: no other connection ever sees the stream's
    offset handed out while its event is missing (a reader that moved past it would never
    see the event)."""
    engine = make_engine(app.driver, app.target, isolation_level="AUTOCOMMIT")
    app.store.register(engine)
    seen: list[tuple[Any, Any]] = []
    stream = f"s-{uuid.uuid4().hex[:8]}"

    def peek(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.startswith("INSERT INTO") and "alkstore_stream_events" in statement:  # the offset is taken; its event not yet
            with app.target.engine.connect() as other:
                last = other.exec_driver_sql("SELECT last_offset FROM alkstore_streams WHERE name = ?", (stream,)).scalar()
                events = other.exec_driver_sql("SELECT count(*) FROM alkstore_stream_events WHERE stream = ?", (stream,)).scalar()
                seen.append((last, events))

    sa.event.listen(getattr(engine, "sync_engine", engine), "before_cursor_execute", peek)

    async def in_async() -> int:
        async with engine.connect() as conn:
            return await alk.apublish(conn, stream, {"n": 1})

    try:
        if app.is_async:
            offset = app.run(in_async())
        else:
            with engine.connect() as conn:
                offset = alk.publish(conn, stream, {"n": 1})
    finally:
        app.run(engine.dispose()) if app.is_async else engine.dispose()
    assert seen == [(None, 0)], "another connection saw the offset taken before its event was written"
    assert offset == 1
    assert [(e.offset, e.payload) for e in app.store.stream(stream).read(after=0)] == [(1, {"n": 1})]


@pytest.mark.parametrize("app", ["psycopg", "psycopg2", "asyncpg"], indirect=True)
@pytest.mark.parametrize("shape", ["connection_savepoint", "create_savepoint_session"])
def test_a_failure_in_a_savepoint_never_rolled_back_makes_the_commit_fail(
    uninstalled: tuple[App, alk.Store], shape: str
) -> None:
    """PostgreSQL: a call that failed inside a SAVEPOINT aborted the whole transaction. If
    the caller catches the error without rolling back to the savepoint and commits — a
    ``Connection.commit()`` with the savepoint still open, or the outer transaction of a
    ``join_transaction_mode="create_savepoint"`` test fixture — the commit must fail (it
    would otherwise be a silent ROLLBACK of the caller's rows); after the caller's
    rollback the connection works, and nothing was written."""
    other, _ = uninstalled
    outcome: list[str] = []

    def sync_scenario() -> None:
        with other.engine.connect() as conn:
            conn.execute(orders.insert().values(note="mine"))
            if shape == "connection_savepoint":
                conn.begin_nested()
                with pytest.raises(alk.NotInstalled):
                    alk.enqueue(conn, "q", {"x": 1})
            else:
                with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
                    session.execute(orders.insert().values(note="in session"))
                    with pytest.raises(alk.NotInstalled):
                        alk.enqueue(session, "q", {"x": 1})
                    with pytest.raises(sa.exc.SQLAlchemyError):
                        session.commit()  # releasing the savepoint fails loudly
                    session.rollback()
            try:
                conn.commit()
                outcome.append("committed")
            except alk.AlkstoreError:
                conn.rollback()
                outcome.append("refused")
            conn.execute(orders.insert().values(note="after"))
            conn.commit()

    async def async_scenario() -> None:
        async with other.engine.connect() as conn:
            await conn.execute(orders.insert().values(note="mine"))
            if shape == "connection_savepoint":
                await conn.begin_nested()
                with pytest.raises(alk.NotInstalled):
                    await alk.aenqueue(conn, "q", {"x": 1})
            else:
                async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as session:
                    await session.execute(orders.insert().values(note="in session"))
                    with pytest.raises(alk.NotInstalled):
                        await alk.aenqueue(session, "q", {"x": 1})
                    with pytest.raises(sa.exc.SQLAlchemyError):
                        await session.commit()
                    await session.rollback()
            try:
                await conn.commit()
                outcome.append("committed")
            except alk.AlkstoreError:
                await conn.rollback()
                outcome.append("refused")
            await conn.execute(orders.insert().values(note="after"))
            await conn.commit()

    other.run(async_scenario()) if other.is_async else sync_scenario()
    assert outcome == ["refused"], "the commit of a transaction the failure aborted must fail"
    assert other.notes() == ["after"]


# -- another database --------------------------------------------------------------------------


@pytest.fixture
def other_database(app: App, tmp_path) -> Iterator[Target]:
    """Another database of ``app``'s kind with alkstore installed in the same schema: a job
    written there would never be seen by ``app.store`` (nor claimed by its workers)."""
    from alkstore_sa import migrations
    from tests.fresh_pg import fresh_pg_database

    if app.target.kind == "sqlite":
        other = sqlite_target(str(tmp_path))
        yield other
        other.engine.dispose()
        return
    with fresh_pg_database("alkother") as url:
        engine = sa.create_engine(url)
        migrations.upgrade(engine, schema=app.target.schema)
        yield Target("postgresql", url, engine, app.target.schema)
        engine.dispose()


@pytest.mark.parametrize("via", ["register", "queue_handle"])
def test_a_store_never_writes_into_another_database(app: App, other_database: Target, via: str) -> None:
    """A store used with a session on another database of the same kind — an engine
    ``register()``ed by mistake, or a Queue handle passed with a session of another
    database — raises InvalidOptions (docs/api.md: register refuses another database)
    and writes nothing there: a job in that database would never be claimed."""
    url = sa.make_url(other_database.url)
    if app.driver in ("pysqlite", "aiosqlite"):
        url = url.set(drivername="sqlite" if app.driver == "pysqlite" else "sqlite+aiosqlite")
    else:
        url = url.set(drivername=f"postgresql+{app.driver}")
    engine = (create_async_engine if app.is_async else sa.create_engine)(url)
    queue: Any = app.store.queue("q") if via == "queue_handle" else "q"
    try:
        if via == "register":
            app.store.register(engine)

        async def in_async() -> None:
            async with AsyncSession(engine) as session:
                with pytest.raises(alk.InvalidOptions, match="another database"):
                    await alk.aenqueue(session, queue, {"x": 1})
                await session.commit()

        if app.is_async:
            app.run(in_async())
        else:
            with Session(engine) as session:
                with pytest.raises(alk.InvalidOptions, match="another database"):
                    alk.enqueue(session, queue, {"x": 1})
                session.commit()
    finally:
        app.run(engine.dispose()) if app.is_async else engine.dispose()
    assert other_database.scalar(f"SELECT count(*) FROM {other_database.table('alkstore_jobs')}") == 0


@pytest.mark.parametrize("app", ["psycopg", "psycopg2", "asyncpg"], indirect=True)
def test_a_failed_call_keeps_the_connections_own_settings(uninstalled: tuple[App, alk.Store]) -> None:
    """PostgreSQL: after a failed call the caller's commit is refused and, once the caller
    rolled back, the Connection carries on — with the settings it was given
    (``isolation_level="SERIALIZABLE"``, ``postgresql_readonly``), not a fresh connection's
    defaults (a SERIALIZABLE connection silently at READ COMMITTED)."""
    other, _ = uninstalled
    show = "SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')"
    seen: list[Any] = []

    def sync_scenario() -> None:
        with other.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="SERIALIZABLE", postgresql_readonly=True)
            with pytest.raises(alk.NotInstalled):
                alk.get_job(conn, "q", 1)
            with pytest.raises(sa.exc.PendingRollbackError):
                conn.commit()
            conn.rollback()
            seen.append(tuple(conn.exec_driver_sql(show).one()))

    async def async_scenario() -> None:
        async with other.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="SERIALIZABLE", postgresql_readonly=True)
            with pytest.raises(alk.NotInstalled):
                await alk.aget_job(conn, "q", 1)
            with pytest.raises(sa.exc.PendingRollbackError):
                await conn.commit()
            await conn.rollback()
            seen.append(tuple((await conn.exec_driver_sql(show)).one()))

    other.run(async_scenario()) if other.is_async else sync_scenario()
    assert seen == [("serializable", "on")]


@pytest.mark.parametrize("app", ["psycopg2", "asyncpg"], indirect=True)
def test_a_store_made_from_an_engine_whose_connect_args_reach_another_database(app: App, other_database: Target) -> None:
    """``alk.Store(engine)`` of a psycopg2 or async engine makes its own psycopg 3 engine
    from the URL, without the engine's ``connect_args`` (another driver's). When those name
    another database than the URL, the application's sessions reach that one: the first
    call raises InvalidOptions instead of writing a job the store never sees."""
    url = app_url(app.driver, app.target)
    other_name = sa.make_url(other_database.url).database
    connect_args = {"dbname": other_name} if app.driver == "psycopg2" else {"database": other_name}
    engine = (create_async_engine if app.is_async else sa.create_engine)(url, connect_args=connect_args)
    store = alk.Store(engine, schema=app.target.schema)

    async def in_async() -> None:
        async with AsyncSession(engine) as session:
            with pytest.raises(alk.InvalidOptions, match="another database"):
                await alk.aenqueue(session, "q", {"x": 1})

    try:
        if app.is_async:
            app.run(in_async())
        else:
            with Session(engine) as session, pytest.raises(alk.InvalidOptions, match="another database"):
                alk.enqueue(session, "q", {"x": 1})
    finally:
        store.close()
        app.run(engine.dispose()) if app.is_async else engine.dispose()
    assert other_database.scalar(f"SELECT count(*) FROM {other_database.table('alkstore_jobs')}") == 0


@pytest.mark.parametrize("app", ["pysqlite", "aiosqlite"], indirect=True)
def test_an_engine_on_a_symlink_to_the_sqlite_file_is_the_same_database(app: App, tmp_path) -> None:
    """SQLite: an engine that reaches the store's database file through a symbolic link is
    the store's database (SQLite follows the link, WAL and locks included): its jobs are
    written and seen. (A hard link is not: SQLite would keep a second WAL beside it.)"""
    import os

    src = sa.make_url(app.target.url).database
    assert src is not None
    link = tmp_path / "via-symlink.db"
    os.symlink(src, link)
    url = f"{'sqlite+aiosqlite' if app.is_async else 'sqlite'}:///{link}"
    engine = (create_async_engine if app.is_async else sa.create_engine)(url)
    app.store.register(engine)

    async def in_async() -> int:
        async with AsyncSession(engine) as session:
            job_id = await alk.aenqueue(session, "q", {"via": "symlink"})
            await session.commit()
            return job_id

    def in_sync() -> int:
        with Session(engine) as session:
            job_id = alk.enqueue(session, "q", {"via": "symlink"})
            session.commit()
            return job_id

    try:
        job_id = app.run(in_async()) if app.is_async else in_sync()
    finally:
        app.run(engine.dispose()) if app.is_async else engine.dispose()
    job = app.store.get_job(job_id)
    assert job is not None and job.payload == {"via": "symlink"}
