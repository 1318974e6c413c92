"""Async applications (SPEC §13): the native ``a``-functions on AsyncSession,
async_scoped_session and AsyncConnection; ``alk.Store(async_engine)``; a Store given an
Engine of another driver than psycopg 3; ``Task.aenqueue`` on asyncpg; and the
``InvalidOptions`` that names the right function when sync and async forms are mixed.

(tests/conformance/test_drivers.py runs every transactional function on every driver.)
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker
from sqlalchemy.pool import NullPool

import alkstore_sa as alk
from alkstore_sa import _sqlite
from alkstore_sa._registry import store_for
from tests.support import PG_URL, WAIT, FakeClock, Target, sqlite_target

ASYNC_DRIVERS = ["asyncpg", "psycopg_async", "aiosqlite"]
FUNCTIONS: list[tuple[str, tuple[Any, ...]]] = [
    ("enqueue", ("q", {"x": 1})),
    ("enqueue_many", ("q", [1, 2])),
    ("get_job", ("q", 1)),
    ("outbox_enqueue", ("o", {"x": 1})),
    ("publish", ("s", {"x": 1})),
    ("notify", ("ch", "text")),
]


def async_url(driver: str, target: Target) -> sa.URL:
    if driver == "aiosqlite":
        return sa.make_url(target.url).set(drivername="sqlite+aiosqlite")
    # postgresql+psycopg under create_async_engine is psycopg 3's async dialect
    return sa.make_url(PG_URL).set(drivername="postgresql+asyncpg" if driver == "asyncpg" else "postgresql+psycopg")


@pytest.fixture(params=ASYNC_DRIVERS)
def target_and_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[Target, sa.URL]]:
    if request.param == "aiosqlite":
        target = sqlite_target(str(tmp_path))
        yield target, async_url("aiosqlite", target)
        target.engine.dispose()
    else:
        target = request.getfixturevalue("_pg_module_target")
        yield target, async_url(request.param, target)


def _qname() -> str:
    return f"an-{uuid.uuid4().hex[:10]}"


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


# -- the native forms -----------------------------------------------------------------------


def test_every_async_form_of_session_joins_its_transaction(target_and_url: tuple[Target, sa.URL]) -> None:
    """AsyncSession, async_scoped_session and AsyncConnection: commit → written, rollback →
    nothing; the store's clock and schema apply (its registration for the async engine)."""
    target, url = target_and_url
    clock = FakeClock()
    store = target.store(clock=clock)
    name = _qname()

    async def scenario() -> list[int]:
        engine = create_async_engine(url)
        store.register(engine)
        try:
            kept = []
            async with AsyncSession(engine) as session:
                await alk.aenqueue(session, name, "rolled back")
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                kept.append(await alk.aenqueue(session, name, "session", delay=7))
            scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
            kept.extend(await alk.aenqueue_many(scoped, name, ["scoped-1", "scoped-2"]))
            await scoped.commit()
            await scoped.remove()
            async with engine.connect() as conn:
                await alk.aenqueue(conn, name, "connection rolled back")
                await conn.rollback()
            async with engine.begin() as conn:
                kept.append(await alk.aenqueue(conn, store.queue(name, max_attempts=8), "connection"))
                job = await alk.aget_job(conn, name, kept[-1])
                assert job is not None and job.max_attempts == 8
            return kept
        finally:
            await engine.dispose()

    try:
        kept = asyncio.run(scenario())
        jobs = [store.get_job(i) for i in kept]
        assert [j.payload for j in jobs if j is not None] == ["session", "scoped-1", "scoped-2", "connection"]
        assert jobs[0] is not None and jobs[0].run_at == _ts(clock, 7)
        assert store.queue(name).stats().pending == 4
    finally:
        store.close()


def _gathered_then_alone(
    store: alk.Store, url: sa.URL, call: Callable[[AsyncSession, str], Awaitable[int]]
) -> tuple[list[Any], list[int]]:
    """``call(session, payload)`` twice, gathered, on one new AsyncSession of a new engine
    (no pooled connection: the session must make one), then once alone, then a commit: the
    gathered results (exceptions returned) and the later call's id."""

    async def scenario() -> tuple[list[Any], list[int]]:
        engine = create_async_engine(url)
        store.register(engine)
        try:
            async with AsyncSession(engine) as session:
                results = await asyncio.gather(call(session, "first"), call(session, "second"), return_exceptions=True)
                later = await call(session, "later")
                await session.commit()
            return results, [later]
        finally:
            await engine.dispose()

    return asyncio.run(scenario())


def _the_one_refusal(results: list[Any]) -> str:
    """The message of the one InvalidOptions among gathered ``results``."""
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1, results
    assert isinstance(refused[0], alk.InvalidOptions), repr(refused[0])
    return str(refused[0])


def test_calls_gathered_on_one_async_session_are_refused_with_invalid_options(
    target_and_url: tuple[Target, sa.URL],
) -> None:
    """Two ``aenqueue`` calls gathered on one AsyncSession that has no connection yet: the
    second finds the session provisioning its connection, which SQLAlchemy refuses. That is
    the caller's misuse of the session, not a statement the database refused: an
    InvalidOptions saying so and what to do (not a DatabaseError), nothing written by it,
    and the caller's transaction intact — the first call's job and a later one commit."""
    target, url = target_and_url
    name = _qname()

    with target.store() as store:
        results, later = _gathered_then_alone(store, url, lambda session, p: alk.aenqueue(session, name, p))
        message = _the_one_refusal(results)
        assert message.startswith("alk.aenqueue got an AsyncSession already running another operation"), message
        assert "one after another" in message and "its own AsyncSession" in message, message
        kept = [r for r in results if not isinstance(r, BaseException)] + later
        assert [j.payload for j in map(store.get_job, kept) if j is not None] == ["first", "later"]
        assert store.queue(name).stats().pending == 2


def test_task_calls_gathered_on_one_async_session_are_refused_naming_the_tasks_call(
    target_and_url: tuple[Target, sa.URL],
) -> None:
    """The same misuse through a Task: the refusal names the call that was made,
    ``task.aenqueue`` (as every other refusal of a Task's enqueue does), not
    ``alk.aenqueue``, which the caller never called; the caller's transaction is intact."""
    target, url = target_and_url
    name = _qname()
    tasks = alk.Tasks()

    @tasks.task(queue=name, name="greet")
    def greet(who: str) -> None:
        pass

    with target.store() as store:
        results, later = _gathered_then_alone(store, url, greet.aenqueue)
        message = _the_one_refusal(results)
        assert message.startswith("task.aenqueue got an AsyncSession already running another operation"), message
        assert store.queue(name).stats().pending == 2


def test_a_session_shared_by_threads_is_refused_with_invalid_options(sqlite_db: Target, qname: str) -> None:
    """The synchronous twin: a Session used by a second thread while the first is still
    making its connection gets InvalidOptions saying what is wrong, and nothing written."""
    path = sa.make_url(sqlite_db.url).database
    slow, entered, release = threading.Event(), threading.Event(), threading.Event()

    def slow_connect() -> sqlite3.Connection:
        if slow.is_set():  # the session's connection (not register()'s look at the file)
            entered.set()
            release.wait(WAIT)
        return sqlite3.connect(str(path), check_same_thread=False)

    engine = sa.create_engine("sqlite://", creator=slow_connect, poolclass=NullPool)
    results: list[Any] = []
    with sqlite_db.store() as store, Session(engine) as session:
        store.register(engine)
        slow.set()
        first = threading.Thread(target=lambda: results.append(alk.enqueue(session, qname, "first")))
        first.start()
        assert entered.wait(WAIT)
        with pytest.raises(alk.InvalidOptions, match=r"^alk\.enqueue got a Session already running another operation"):
            alk.enqueue(session, qname, "second")
        release.set()
        first.join(WAIT)
        session.commit()
        assert [j.payload for j in map(store.get_job, results) if j is not None] == ["first"]
        assert store.queue(qname).stats().pending == 1
    engine.dispose()


def test_store_built_from_an_async_engine(target_and_url: tuple[Target, sa.URL]) -> None:
    """``alk.Store(async_engine)``: its own operations go through a sync driver (psycopg 3 /
    sqlite3) on the same database, and it is registered for the async engine."""
    target, url = target_and_url
    clock = FakeClock()
    name = _qname()

    async def scenario() -> tuple[int, alk.Store]:
        engine = create_async_engine(url)
        store = alk.Store(engine, schema=target.schema, clock=clock)
        try:
            assert store.engine is not engine.sync_engine
            assert store.engine.dialect.driver == ("pysqlite" if target.kind == "sqlite" else "psycopg")
            assert not store.engine.dialect.is_async
            with store.listen(name) as sub:  # the listener runs on the store's own engine
                async with AsyncSession(engine) as session, session.begin():
                    job_id = await alk.aenqueue(session, name, {"from": "async"}, priority=3)
                    await alk.anotify(session, name, "committed")
                note = await asyncio.to_thread(sub.get, WAIT)
                assert note is not None and note.payload == "committed"
            # the store's own operation, from a thread (it is synchronous)
            own = await asyncio.to_thread(store.queue(name).enqueue, {"from": "store"})
            handles = await asyncio.to_thread(store.queue(name).claim_batch, "w", 10)
            assert [h.id for h in handles] == [job_id, own]
            job = store.get_job(job_id)
            assert job is not None and job.created_at == _ts(clock) and job.priority == 3
            return job_id, store
        finally:
            store.close()
            await engine.dispose()

    _, store = asyncio.run(scenario())
    assert store.closed


def test_the_first_call_through_an_async_engine_leaves_the_event_loop_free(
    target_and_url: tuple[Target, sa.URL],
) -> None:
    """The first caller's-transaction call through a newly registered async engine checks
    that it reaches the store's database, reading the store's own side on one of the
    store's (synchronous) connections. That read must not hold the event loop: here the
    store's one connection is taken, and only another task of the loop gives it back —
    once the call has read the caller's side. A read on the loop's thread would wait out
    the pool's timeout with that task never running."""
    target, url = target_and_url
    own = sa.create_engine(target.url if target.kind == "sqlite" else PG_URL, pool_size=1, max_overflow=0, pool_timeout=WAIT)
    store = alk.Store(own, schema=target.schema)
    name = _qname()
    read_theirs = threading.Event()

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_postmaster_start_time" in statement or "pragma_database_list" in statement:
            read_theirs.set()

    async def give_back(blocker: sa.Connection) -> None:
        deadline = asyncio.get_running_loop().time() + WAIT
        while not read_theirs.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        blocker.close()

    async def scenario() -> int:
        engine = create_async_engine(url)
        store.register(engine)
        sa.event.listen(engine.sync_engine, "after_cursor_execute", on_statement)
        blocker = own.connect()  # the store's only connection
        try:
            async with AsyncSession(engine) as session:
                job_id, _ = await asyncio.gather(alk.aenqueue(session, name, "first"), give_back(blocker))
                await session.commit()
            return job_id
        finally:
            blocker.close()
            await engine.dispose()

    try:
        job_id = asyncio.run(scenario())
        assert read_theirs.is_set()
        job = store.get_job(job_id)
        assert job is not None and job.payload == "first"
    finally:
        store.close()
        own.dispose()


def test_store_from_an_in_memory_async_sqlite_engine_is_refused() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(alk.InvalidOptions, match="in-memory"):
        alk.Store(engine)
    asyncio.run(engine.dispose())


def test_store_given_a_psycopg2_engine_runs_its_own_connections_on_psycopg(_pg_module_target: Target) -> None:
    """A Store on an Engine of another PostgreSQL driver makes its own psycopg 3 engine
    from the same URL, and serves the application's engine in its transactions."""
    target = _pg_module_target
    app_engine = sa.create_engine(sa.make_url(PG_URL).set(drivername="postgresql+psycopg2"))
    name = _qname()
    clock = FakeClock()
    try:
        with alk.Store(app_engine, schema=target.schema, clock=clock) as store:
            assert store.engine is not app_engine and store.engine.dialect.driver == "psycopg"
            with Session(app_engine) as session, session.begin():
                job_id = alk.enqueue(session, name, {"psycopg2": True}, max_attempts=5)
                job = alk.get_job(session, name, job_id)
                assert job is not None and job.max_attempts == 5
            handle = store.queue(name).claim_one("w")
            assert handle is not None and handle.id == job_id and handle.payload == {"psycopg2": True}
            assert handle.job.created_at == _ts(clock)
            own_engine = store.engine
        # close() returned the store's own connections and removed both registrations
        assert own_engine.pool.checkedout() == 0
        for engine in (app_engine, own_engine):
            with engine.connect() as conn:
                assert not isinstance(store_for(conn), alk.Store)
    finally:
        app_engine.dispose()


def test_task_aenqueue_on_asyncpg(_pg_module_target: Target) -> None:
    """``await task.aenqueue(async_session, ...)`` on asyncpg, the native path: the job joins
    the session's transaction (commit → job, rollback → none), with the task's stamps."""
    target = _pg_module_target
    name = _qname()
    tasks = alk.Tasks()

    @tasks.task(queue=name, max_attempts=6, priority=2)
    async def build_report(day: str, *, fmt: str = "pdf") -> None: ...

    async def scenario(store: alk.Store) -> int:
        engine = create_async_engine(async_url("asyncpg", target))
        store.register(engine)
        try:
            async with AsyncSession(engine) as session:
                await build_report.aenqueue(session, "monday")
                await session.rollback()
            async with AsyncSession(engine) as session, session.begin():
                return await build_report.using(delay=60).aenqueue(session, "tuesday", fmt="csv")
        finally:
            await engine.dispose()

    clock = FakeClock()
    with target.store(clock=clock) as store:
        job_id = asyncio.run(scenario(store))
        job = store.get_job(job_id)
        assert job is not None
        assert job.payload == {"task": build_report.name, "args": ["tuesday"], "kwargs": {"fmt": "csv"}}
        assert (job.max_attempts, job.priority, job.run_at) == (6, 2, _ts(clock, 60))
        assert store.queue(name).stats().pending == 1


def test_run_sync_keeps_working_on_asyncpg(_pg_module_target: Target) -> None:
    """The bridge documented before the native forms existed: the sync function through
    ``run_sync`` runs on asyncpg too (its statements compiled for asyncpg)."""
    target = _pg_module_target
    name = _qname()

    async def scenario(store: alk.Store) -> int:
        engine = create_async_engine(async_url("asyncpg", target))
        store.register(engine)
        try:
            async with AsyncSession(engine) as session, session.begin():
                return await session.run_sync(alk.enqueue, name, {"bridge": 1})
        finally:
            await engine.dispose()

    with target.store() as store:
        job_id = asyncio.run(scenario(store))
        assert store.queue(name).get_job(job_id) is not None


def test_an_asyncpg_engine_kept_across_worker_runs_needs_disposing_between_them(_pg_module_target: Target) -> None:
    """docs/worker.md: each ``run()`` has an event loop of its own, so an async task using an
    asyncpg engine made outside it gets the previous run's connection in the next run and
    fails ('attached to a different loop'); ``sync_engine.dispose(close=False)`` between
    the runs is the documented remedy."""
    target = _pg_module_target
    engine = create_async_engine(async_url("asyncpg", target))
    tasks = alk.Tasks()
    name = _qname()

    @tasks.task(queue=name, max_attempts=1)
    async def query(run: int) -> None:
        async with AsyncSession(engine) as session:
            await session.execute(sa.text("SELECT 1"))

    def run_once(store: alk.Store, run: int) -> list[str]:
        query.enqueue(store, run)
        alk.Worker(store, tasks, concurrency=1).run(alk.StopToken(), burst=True)
        dead = store.queue(name).dead_jobs()
        for j in dead:
            store.queue(name).delete_dead(j.id)
        return [" / ".join(e["error"] for e in j.errors) for j in dead]

    with target.store() as store:
        assert run_once(store, 0) == []
        (error,) = run_once(store, 1)  # the engine's pooled connection is the first run's
        assert "attached to a different loop" in error
        engine.sync_engine.dispose(close=False)
        assert run_once(store, 2) == []
        engine.sync_engine.dispose(close=False)
        assert run_once(store, 3) == []
    engine.sync_engine.dispose(close=False)


# -- mixing sync and async forms ------------------------------------------------------------


@pytest.mark.parametrize(("function", "args"), FUNCTIONS, ids=[f for f, _ in FUNCTIONS])
def test_an_async_session_given_to_a_sync_function_names_the_async_one(function: str, args: tuple[Any, ...]) -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=lambda: 1)
    for session in (AsyncSession(engine), scoped, engine.connect()):
        with pytest.raises(alk.InvalidOptions) as info:
            getattr(alk, function)(session, *args)
        message = str(info.value)
        assert f"alk.{function} got an {type(session).__name__}" in message, message
        assert f"`await alk.a{function}(...)`" in message, message
    asyncio.run(engine.dispose())


@pytest.mark.parametrize(("function", "args"), FUNCTIONS, ids=[f for f, _ in FUNCTIONS])
def test_a_sync_session_given_to_an_async_function_names_the_sync_one(function: str, args: tuple[Any, ...]) -> None:
    engine = sa.create_engine("sqlite://")
    sessions: list[Any] = [Session(engine), scoped_session(sessionmaker(engine)), engine.connect()]
    for session in sessions:
        with pytest.raises(alk.InvalidOptions) as info:
            asyncio.run(getattr(alk, "a" + function)(session, *args))
        message = str(info.value)
        assert f"alk.a{function} got a {type(session).__name__}" in message, message
        assert f"`alk.{function}(...)` (no await)" in message, message
    sessions[2].close()
    engine.dispose()


def test_neither_kind_of_session_names_what_is_accepted() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    for wrong in (None, "session", engine, engine.sync_engine):
        with pytest.raises(alk.InvalidOptions, match="expected a Session, scoped_session or Connection"):
            alk.enqueue(wrong, "q", 1)  # type: ignore[arg-type]
        with pytest.raises(alk.InvalidOptions, match="expected an AsyncSession, async_scoped_session or AsyncConnection"):
            asyncio.run(alk.aenqueue(wrong, "q", 1))  # type: ignore[arg-type]
    asyncio.run(engine.dispose())


def test_a_session_with_no_bind_raises_invalid_options(store: alk.Store) -> None:
    """docs/api.md: every caller's-transaction function (sync and async, by name, by a Queue
    handle and through a task) refuses a session bound to no engine with InvalidOptions,
    not SQLAlchemy's UnboundExecutionError."""
    q = store.queue("unbound")
    tasks = alk.Tasks()

    @tasks.task(queue="unbound")
    def job(x: int) -> None: ...

    calls: list[tuple[str, tuple[Any, ...]]] = [*FUNCTIONS, ("enqueue", (q, 1)), ("enqueue_many", (q, [1]))]
    per_table = Session(binds={sa.Table("app_rows", sa.MetaData(), sa.Column("id", sa.Integer)): store.engine})
    for session in (Session(), scoped_session(sessionmaker()), per_table):
        for function, args in calls:
            with pytest.raises(alk.InvalidOptions, match="no bind") as info:
                getattr(alk, function)(session, *args)
            assert f"alk.{function} got a {type(session).__name__}" in str(info.value)
        with pytest.raises(alk.InvalidOptions, match="no bind"):
            job.enqueue(session, 1)
        with pytest.raises(alk.InvalidOptions, match="no bind"):
            job.using(priority=1).enqueue(session, 1)

    async def scenario() -> None:
        scoped = async_scoped_session(async_sessionmaker(), scopefunc=lambda: 1)
        for session in (AsyncSession(), scoped):
            for function, args in calls:
                with pytest.raises(alk.InvalidOptions, match="no bind") as info:
                    await getattr(alk, "a" + function)(session, *args)
                assert f"alk.a{function} got an AsyncSession" in str(info.value)
            with pytest.raises(alk.InvalidOptions, match="no bind"):
                await job.aenqueue(session, 1)

    asyncio.run(scenario())
    assert q.stats().pending == 0


def test_a_tasks_refusals_name_the_tasks_own_methods(tmp_path) -> None:
    """A session a task cannot enqueue through (one bound to no engine, the sync facade of
    an AsyncSession) is refused with an InvalidOptions that names ``task.enqueue`` /
    ``task.aenqueue``, the call the user made and the one to make instead: not
    ``alk.aenqueue(...)``, whose (session, queue, payload) a task call does not take."""
    target = sqlite_target(str(tmp_path))
    tasks = alk.Tasks()

    @tasks.task(queue="named")
    def job(x: int) -> None: ...

    async def scenario() -> None:
        engine = create_async_engine(async_url("aiosqlite", target))
        try:
            for call in (lambda s: job.aenqueue(s, 1), lambda s: job.using(priority=1).aenqueue(s, 1)):
                with pytest.raises(alk.InvalidOptions, match=r"^task\.aenqueue got an AsyncSession with no bind"):
                    await call(AsyncSession())
            async with AsyncSession(engine) as session:
                for sync_form in (session.sync_session, (await session.connection()).sync_connection):
                    with pytest.raises(alk.InvalidOptions, match=r"^task\.enqueue got .* use `await task\.aenqueue\(\.\.\.\)`") as info:
                        job.enqueue(sync_form, 1)
                    assert "alk." not in str(info.value)
        finally:
            await engine.dispose()

    for session in (Session(), scoped_session(sessionmaker())):
        with pytest.raises(alk.InvalidOptions, match=r"^task\.enqueue got a \w+ with no bind") as info:
            job.enqueue(session, 1)
        assert "alk." not in str(info.value)
    asyncio.run(scenario())
    with target.store() as store:
        assert store.queue("named").stats().pending == 0
    target.engine.dispose()


def test_register_takes_async_engines_of_every_supported_driver(_pg_module_target: Target) -> None:
    target = _pg_module_target
    with target.store() as store:
        engines: list[AsyncEngine] = [create_async_engine(async_url(d, target)) for d in ("asyncpg", "psycopg_async")]
        for engine in engines:
            store.register(engine)
            asyncio.run(engine.dispose())


@pytest.mark.parametrize("how", ["Store(async_engine)", "register(async_engine)"])
def test_an_aiosqlite_engine_gets_the_stores_sqlite_settings(tmp_path, how: str) -> None:
    """The application's aiosqlite connections wait for the write lock as long as the
    store's own (a 60 s busy timeout, not sqlite3's 5 s, so ``aenqueue`` never fails with
    "database is locked" while a worker writes), run ``synchronous=NORMAL`` in WAL and bound
    the WAL file left after a checkpoint (``journal_size_limit``)."""
    target = sqlite_target(str(tmp_path))

    async def settings(engine: AsyncEngine) -> tuple[int, int, int]:
        async with engine.connect() as conn:
            busy = (await conn.execute(sa.text("PRAGMA busy_timeout"))).scalar_one()
            sync = (await conn.execute(sa.text("PRAGMA synchronous"))).scalar_one()
            limit = (await conn.execute(sa.text("PRAGMA journal_size_limit"))).scalar_one()
        return busy, sync, limit

    async def scenario() -> tuple[int, int, int]:
        engine = create_async_engine(async_url("aiosqlite", target))
        await settings(engine)  # a connection opened (and pooled) before the store is made
        store = alk.Store(engine) if how == "Store(async_engine)" else target.store()
        try:
            if how == "register(async_engine)":
                store.register(engine)
            return await settings(engine)
        finally:
            store.close()
            await engine.dispose()

    busy, sync, limit = asyncio.run(scenario())
    target.engine.dispose()
    assert busy == 60_000
    assert sync == 1  # NORMAL: the file is in WAL mode (installed by the store)
    assert limit == _sqlite.JOURNAL_SIZE_LIMIT


@pytest.mark.parametrize("driver", ASYNC_DRIVERS)
def test_the_sync_session_of_an_async_session_names_the_async_function(
    driver: str, tmp_path, request: pytest.FixtureRequest
) -> None:
    """``alk.enqueue(async_session.sync_session, ...)`` outside ``run_sync``: an
    ``InvalidOptions`` naming ``aenqueue``, before any statement — the caller's transaction
    and its own rows stay intact (the driver used to fail mid-call and poison it)."""
    target = sqlite_target(str(tmp_path)) if driver == "aiosqlite" else request.getfixturevalue("_pg_module_target")
    table = f"own_rows_{uuid.uuid4().hex[:8]}"

    async def scenario() -> int:
        engine = create_async_engine(async_url(driver, target))
        store = alk.Store(engine, schema=target.schema)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text(f"CREATE TABLE {table} (v text)"))
            async with AsyncSession(engine) as session:
                await session.execute(sa.text(f"INSERT INTO {table} VALUES ('mine')"))
                for sync_form in (session.sync_session, (await session.connection()).sync_connection):
                    with pytest.raises(alk.InvalidOptions, match=r"`await alk\.aenqueue\(\.\.\.\)`"):
                        alk.enqueue(sync_form, "q", {"x": 1})
                await session.commit()
            async with engine.begin() as conn:
                kept = (await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one()
                await conn.execute(sa.text(f"DROP TABLE {table}"))
            return kept
        finally:
            store.close()
            await engine.dispose()

    assert asyncio.run(scenario()) == 1
    if driver == "aiosqlite":
        target.engine.dispose()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg_async"])
@pytest.mark.parametrize("then", ["commit", "another call, then commit"])
def test_a_call_cancelled_mid_statement_never_leaves_a_commit_that_writes_nothing(
    _pg_module_target: Target, driver: str, then: str
) -> None:
    """``asyncio.timeout`` around an ``aenqueue`` that waits in the database (on a
    ``unique_key`` held by another open transaction) cancels it mid-statement: the caller's
    transaction is then lost with it, so the caller's COMMIT raises instead of succeeding
    with the caller's earlier rows silently gone (SPEC §13) — and after a rollback the
    session works again."""
    target = _pg_module_target
    name = _qname()

    async def scenario(store: alk.Store) -> tuple[list[int], BaseException | None]:
        engine = create_async_engine(async_url(driver, target))
        store.register(engine)
        holder = target.engine.connect()
        try:
            alk.enqueue(holder, store.queue(name), "holder", unique_key="k")
            async with AsyncSession(engine) as session:
                await alk.aenqueue(session, name, "before")
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):  # the call waits until the holder ends
                        await alk.aenqueue(session, name, "waits", unique_key="k")
                holder.rollback()
                if then != "commit":
                    with pytest.raises(alk.DatabaseError):
                        await alk.aenqueue(session, name, "after")
                refused: BaseException | None = None
                try:
                    await session.commit()
                except Exception as exc:  # noqa: BLE001 - asserted by the caller
                    refused = exc
                await session.rollback()
                kept = [await alk.aenqueue(session, name, "again")]
                await session.commit()
            return kept, refused
        finally:
            holder.close()
            await engine.dispose()

    with target.store() as store:
        kept, refused = asyncio.run(scenario(store))
        assert refused is not None, "the commit of the lost transaction succeeded"
        q = store.queue(name)
        assert q.stats().pending == 1
        job = q.get_job(kept[0])
        assert job is not None and job.payload == "again"


def _cancel_after(engine: AsyncEngine, marks: tuple[str, ...]) -> list[asyncio.Future[Any] | None]:
    """A slot for a task, cancelled right after a statement containing one of ``marks`` ran
    on ``engine``: the cancellation lands at the call's next await, deterministically."""
    slot: list[asyncio.Future[Any] | None] = [None]

    def on_statement(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        task = slot[0]
        if task is not None and any(m in statement for m in marks):
            slot[0] = None
            task.cancel()

    sa.event.listen(engine.sync_engine, "after_cursor_execute", on_statement)
    return slot


def test_a_call_cancelled_during_the_engines_first_check_leaves_the_transaction_usable(
    target_and_url: tuple[Target, sa.URL],
) -> None:
    """Cancelled while the first call through an engine reads the store's side of the
    same-database check (in a worker thread): nothing was written, so the caller's
    transaction carries on — its own row and a later job commit, the cancelled job does not."""
    target, url = target_and_url
    name = _qname()
    table = f"own_rows_{uuid.uuid4().hex[:8]}"

    async def scenario(store: alk.Store) -> tuple[int, int]:
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text(f"CREATE TABLE {table} (v text)"))
            store.register(engine)
            slot = _cancel_after(engine, ("pg_postmaster_start_time", "pragma_database_list"))
            async with AsyncSession(engine) as session:
                await session.execute(sa.text(f"INSERT INTO {table} VALUES ('mine')"))
                slot[0] = task = asyncio.ensure_future(alk.aenqueue(session, name, "cancelled"))
                with pytest.raises(asyncio.CancelledError):
                    await task
                later = await alk.aenqueue(session, name, "later")
                await session.commit()
            async with engine.begin() as conn:
                mine = (await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one()
                await conn.execute(sa.text(f"DROP TABLE {table}"))
            return later, mine
        finally:
            await engine.dispose()

    with target.store() as store:
        later, mine = asyncio.run(scenario(store))
        assert mine == 1
        job = store.get_job(later)
        assert job is not None and job.payload == "later"
        assert store.queue(name).stats().pending == 1


@pytest.mark.parametrize("mode", ["transaction", "AUTOCOMMIT"])
def test_an_aiosqlite_publish_cancelled_between_its_statements_never_commits_half(tmp_path, mode: str) -> None:
    """On SQLite a publish is two statements (the stream's counter, then the event). A
    cancellation between them must not leave the counter moved without its event (readers
    would wait at a hole): the caller's commit raises, nothing of the call stays, and after
    a rollback the next event takes the next offset — in the caller's transaction and on an
    autocommit connection (where the publish has a transaction of its own)."""
    target = sqlite_target(str(tmp_path))

    async def scenario(store: alk.Store) -> BaseException | None:
        engine = create_async_engine(async_url("aiosqlite", target))
        store.register(engine)
        used = engine if mode == "transaction" else engine.execution_options(isolation_level="AUTOCOMMIT")
        try:
            async with AsyncSession(used) as session:
                await alk.apublish(session, "s", "first")
                await session.commit()
            slot = _cancel_after(engine, ("alkstore_streams",))  # the counter's upsert
            refused: BaseException | None = None
            async with AsyncSession(used) as session:
                slot[0] = task = asyncio.ensure_future(alk.apublish(session, "s", "cancelled"))
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert slot[0] is None  # it was cancelled right after the counter's statement
                try:
                    await session.commit()
                except Exception as exc:  # noqa: BLE001 - asserted by the caller
                    refused = exc
                await session.rollback()
                await alk.apublish(session, "s", "next")
                await session.commit()
            return refused
        finally:
            await engine.dispose()

    with target.store() as store:
        refused = asyncio.run(scenario(store))
        assert refused is not None, "the commit after the cancelled call succeeded"
        assert [(e.offset, e.payload) for e in store.stream("s").read()] == [(1, "first"), (2, "next")]
    target.engine.dispose()


def test_a_session_or_connection_that_cannot_run_a_transaction_is_refused(db: Target, store: alk.Store) -> None:
    """A closed Connection or AsyncConnection, an AsyncConnection never started (``conn =
    engine.connect()`` without ``await``), a Session or AsyncSession made with
    ``autobegin=False`` outside ``begin()``: none can carry the caller's transaction. Every
    caller's-transaction function (sync and async, and a task's) refuses it with
    InvalidOptions saying why, before any I/O — not DatabaseError, as if the database had
    refused a statement, nor SQLAlchemy's own AsyncContextNotStarted, which is no
    AlkstoreError (SPEC §3) — and writes nothing."""
    tasks = alk.Tasks()

    @tasks.task(queue="carrier")
    def job(x: int) -> None: ...

    engine = sa.create_engine(db.url)
    store.register(engine)
    closed = engine.connect()
    closed.close()
    sync_cases: list[tuple[Any, str]] = [
        (closed, "closed"),
        (Session(bind=closed), "closed"),
        (Session(engine, autobegin=False), "autobegin"),
        (scoped_session(sessionmaker(engine, autobegin=False)), "autobegin"),
    ]
    for session, why in sync_cases:
        for function, args in FUNCTIONS:
            with pytest.raises(alk.InvalidOptions, match=why) as info:
                getattr(alk, function)(session, *args)
            assert f"alk.{function} got a" in str(info.value)
        with pytest.raises(alk.InvalidOptions, match=why):
            job.enqueue(session, 1)
    autobegin_off = Session(engine, autobegin=False)
    with autobegin_off.begin():  # begun: accepted
        assert alk.enqueue(autobegin_off, "carrier", "begun") > 0

    async_engine = create_async_engine(async_url("aiosqlite" if db.kind == "sqlite" else "asyncpg", db))
    store.register(async_engine)

    async def scenario() -> None:
        closed = await async_engine.connect()
        await closed.close()
        cases: list[tuple[Any, str]] = [
            (async_engine.connect(), "not started"),
            (closed, "closed"),
            (AsyncSession(async_engine, autobegin=False), "autobegin"),
            (async_scoped_session(async_sessionmaker(async_engine, autobegin=False), scopefunc=lambda: 1), "autobegin"),
        ]
        for session, why in cases:
            for function, args in FUNCTIONS:
                with pytest.raises(alk.InvalidOptions, match=why) as info:
                    await getattr(alk, "a" + function)(session, *args)
                assert f"alk.a{function} got a" in str(info.value)
            with pytest.raises(alk.InvalidOptions, match=why):
                await job.aenqueue(session, 1)
        async with AsyncSession(async_engine, autobegin=False) as session, session.begin():
            assert await alk.aenqueue(session, "carrier", "begun") > 0
        await async_engine.dispose()

    try:
        asyncio.run(scenario())
    finally:
        engine.dispose()
    assert store.queue("carrier").stats().pending == 2  # the two begun ones
    assert store.queue("q").stats().pending == store.outbox("o").queue.stats().pending == 0
    assert store.stream("s").read() == []


def test_the_sync_facade_given_to_an_async_function_names_the_async_object(tmp_path) -> None:
    """``await alk.aenqueue(async_session.sync_session, ...)`` (or an AsyncConnection's
    ``.sync_connection``, or a task's ``aenqueue``): the object is the synchronous facade of
    an async session, so the advice is to pass the AsyncSession or AsyncConnection itself —
    not to call ``alk.enqueue(...)`` without await, which refuses that same object in turn
    (it works only inside run_sync) and sends the caller back here."""
    target = sqlite_target(str(tmp_path))
    tasks = alk.Tasks()

    @tasks.task(queue="facade")
    def job(x: int) -> None: ...

    async def scenario() -> None:
        engine = create_async_engine(async_url("aiosqlite", target))
        try:
            async with AsyncSession(engine) as session:
                facades = [session.sync_session, (await session.connection()).sync_connection]
                for facade, real in zip(facades, ["AsyncSession", "AsyncConnection"], strict=True):
                    kind = type(facade).__name__
                    for function, args in FUNCTIONS:
                        with pytest.raises(alk.InvalidOptions) as info:
                            await getattr(alk, "a" + function)(facade, *args)
                        message = str(info.value)
                        assert message.startswith(f"alk.a{function} got the {kind} of an {real}"), message
                        assert "no await" not in message, message
                    with pytest.raises(alk.InvalidOptions) as info:
                        await job.aenqueue(facade, 1)
                    message = str(info.value)
                    assert message.startswith(f"task.aenqueue got the {kind} of an {real}"), message
                    assert "without await" not in message, message
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    with target.store() as store:
        assert store.queue("facade").stats().pending == store.queue("q").stats().pending == 0
    target.engine.dispose()


def test_a_scoped_session_outside_its_scope_given_to_an_async_function_names_the_sync_one() -> None:
    """Flask-SQLAlchemy's ``db.session`` outside an application context: its scope function
    raises (RuntimeError 'Working outside of application context'). Given to an
    ``a``-function it is still refused with InvalidOptions naming the sync function — the
    check for an async session's synchronous facade asks for its bind only to choose the
    advice, and must not raise the scope's error instead."""

    def no_scope() -> object:
        raise RuntimeError("Working outside of application context.")

    session = scoped_session(sessionmaker(sa.create_engine("sqlite://")), scopefunc=no_scope)
    for function, args in FUNCTIONS:
        with pytest.raises(alk.InvalidOptions, match=rf"^alk\.a{function} got a scoped_session: use `alk\.{function}\(\.\.\.\)`"):
            asyncio.run(getattr(alk, "a" + function)(session, *args))
