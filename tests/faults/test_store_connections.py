"""Faults of the store's own connections (issue 9 items 3 and 4, SPEC §4): killed backends,
a disconnect in the middle of a statement, a fork with an open store, a ``NullPool`` engine,
``close()`` while an operation runs, and a disconnect seen by the application's own
connections (the pool's invalidation must reach the store's connections too).

PostgreSQL backends are found by ``application_name``: each test tags its own engine, so
terminating them never touches another test's connections."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import NullPool

import alkstore_sa as alk
from tests.support import PG_URL, Target, wait_for

ROOT = Path(__file__).resolve().parents[2]

# -- helpers -------------------------------------------------------------------------------


def _tag() -> str:
    return f"alk-conn-{uuid.uuid4().hex[:10]}"


def _tagged_engine(app: str, **kw: Any) -> sa.Engine:
    """A PostgreSQL engine whose every connection carries ``application_name = app``."""
    return sa.create_engine(PG_URL, connect_args={"application_name": app}, **kw)


def _control() -> sa.Engine:
    return sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)


def _backends(app: str, where: str = "true") -> list[int]:
    control = _control()
    try:
        with control.connect() as c:
            return list(
                c.execute(
                    sa.text(
                        f"SELECT pid FROM pg_stat_activity WHERE application_name = :app AND {where}"
                    ),
                    {"app": app},
                ).scalars()
            )
    finally:
        control.dispose()


def _terminate(pids: list[int]) -> None:
    control = _control()
    try:
        with control.connect() as c:
            for pid in pids:
                c.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        control.dispose()
    wait_for(lambda: not set(pids) & set(_all_backends()), "the terminated backends to exit")


def _all_backends() -> list[int]:
    control = _control()
    try:
        with control.connect() as c:
            return list(c.execute(sa.text("SELECT pid FROM pg_stat_activity")).scalars())
    finally:
        control.dispose()


def _backend_pid(store: alk.Store) -> int:
    """The PostgreSQL backend an operation of ``store`` runs on."""
    with store.executor() as ex:
        return int(ex.rows("SELECT pg_backend_pid()", {})[0][0])


@pytest.fixture
def pg(pg_db: Target) -> Target:
    """PostgreSQL only: server backends, prepared statements."""
    return pg_db


@pytest.fixture
def tagged(pg: Target) -> Iterator[tuple[str, sa.Engine]]:
    app = _tag()
    engine = _tagged_engine(app)
    yield app, engine
    engine.dispose()


# -- killed connections --------------------------------------------------------------------


@pytest.mark.parametrize("pre_ping", [False, True], ids=["no-pre-ping", "pre-ping"])
def test_operations_after_killed_store_connections_succeed_first_try(
    pg: Target, qname: str, pre_ping: bool
) -> None:
    """Every one of the store's connections is terminated between two operations: enqueue,
    claim and ack each succeed on their first try (no exception, no lost ack)."""
    app = _tag()
    engine = _tagged_engine(app, pool_pre_ping=pre_ping)
    store = alk.Store(engine, schema=pg.schema)
    try:
        q = store.queue(qname)
        q.enqueue("before")
        handles = q.claim_batch("w", 1)
        threads = [threading.Thread(target=q.stats) for _ in range(4)]  # several connections
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _terminate(_backends(app))

        job_id = q.enqueue("after the kill")
        _terminate(_backends(app))
        assert handles[0].ack() is True
        _terminate(_backends(app))
        claimed = q.claim_one("w")
        assert claimed is not None and claimed.id == job_id
        _terminate(_backends(app))
        assert claimed.heartbeat(60) is True
        assert claimed.ack() is True
        assert q.stats().processing == 0
    finally:
        store.close()
        engine.dispose()


def test_a_pooled_connection_the_store_never_used_killed_while_idle_is_replaced(
    pg: Target, qname: str
) -> None:
    """The server ends a connection idle in the engine's pool that the store has not used
    yet (the application's, or the first operation's schema check's): pg_terminate_backend,
    or a role's ``idle_session_timeout``. The store's next operation, checking it out, met
    the dead connection while making it its own (its first query), and failed with
    'the connection is closed' (DatabaseError) instead of taking a fresh one."""
    app = _tag()
    engine = _tagged_engine(app)
    store = alk.Store(engine, schema=pg.schema)
    try:
        store.check_schema()  # the first operation's check, on a connection that goes back to the pool
        with engine.connect() as conn:  # and one of the application's
            conn.exec_driver_sql("SELECT 1")
        idle = _backends(app)
        assert idle
        _terminate(idle)
        q = store.queue(qname)
        job_id = q.enqueue("after the kill")  # not retried: it must not meet the dead connection
        assert q.get_job(job_id) is not None
    finally:
        store.close()
        engine.dispose()


def test_a_new_stores_first_operation_on_a_pool_of_dead_connections_succeeds(pg: Target, qname: str) -> None:
    """The application's engine holds idle connections the server has ended (a restart,
    pg_terminate_backend, ``idle_session_timeout``) when a Store is made on it: the
    schema check of the store's first operation ran on one of them and the enqueue failed
    with DatabaseError ('terminating connection due to administrator command')."""
    app = _tag()
    engine = _tagged_engine(app)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        _terminate(_backends(app))
        store = alk.Store(engine, schema=pg.schema)
        try:
            q = store.queue(qname)
            job_id = q.enqueue("first")  # not retried: it must not meet the dead connection
            assert q.get_job(job_id) is not None
        finally:
            store.close()
    finally:
        engine.dispose()


def _wait_for_lock_waiter(app: str, but_not: frozenset[int] = frozenset()) -> int:
    def waiter() -> int | None:
        pids = set(_backends(app, "wait_event_type = 'Lock'")) - but_not
        return next(iter(pids), None)

    return int(wait_for(waiter, "a store backend waiting on the lock"))


def test_ack_cut_off_mid_statement_is_retried_once_on_a_fresh_connection(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str
) -> None:
    """The ack's backend dies while the ack waits on a row lock (so the statement was sent
    and did not land): the ack is retried on a new connection and lands."""
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema)
    locker = pg.engine.connect()
    try:
        q = store.queue(qname)
        q.enqueue("x")
        handle = q.claim_one("w")
        assert handle is not None
        tx = locker.begin()
        locker.execute(sa.text(f"SELECT id FROM {pg.table('alkstore_jobs')} WHERE id = :id FOR UPDATE"), {"id": handle.id})
        assert _cut_off_while_waiting(app, tx, handle.ack) == [True]
        assert q.get_job(handle.id) is None
    finally:
        locker.close()
        store.close()


def _cut_off_while_waiting(app: str, tx: sa.RootTransaction, call: Any) -> list[Any]:
    """Run ``call`` on a thread while ``tx`` holds the lock its statement waits for; kill
    the backend it waits on, see the retry wait on another backend, then let it through.
    What the call returned (or raised, captured)."""
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_capture(call)))
    t.start()
    first = _wait_for_lock_waiter(app)
    _terminate([first])
    _wait_for_lock_waiter(app, but_not=frozenset({first}))  # the retry, on another backend
    tx.commit()
    t.join(30)
    return result


def _cut_off_once(app: str, tx: sa.RootTransaction, call: Any) -> list[Any]:
    """Run ``call`` on a thread while ``tx`` holds the lock its statement waits for; kill
    the backend it waits on, then let the lock go. What the call returned (or raised,
    captured): an operation that must not be repeated raises, with no retry."""
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_capture(call)))
    t.start()
    _terminate([_wait_for_lock_waiter(app)])
    t.join(30)
    tx.commit()
    return result


@pytest.mark.parametrize(
    "read",
    ["stream.read", "stream.offset", "lock.holder", "lock.acquire", "lock.renew", "schedules", "tick",
     "stream.commit"],
)
def test_a_read_cut_off_mid_statement_is_retried_once_on_a_fresh_connection(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str, read: str
) -> None:
    """A stream's, a lock's or the scheduler's read whose connection dies while the
    statement waits answers from a fresh connection, as the queue's reads do (it raised
    DatabaseError). So do a lock's acquire and renew by its holder (a repeat of one that
    landed before the connection died finds the lease its own and extends it again) and a
    stream consumer's commit (a repeat records the same offset again)."""
    app, engine = tagged
    clock = [1_000_000.0]
    store = alk.Store(engine, schema=pg.schema, clock=lambda: clock[0])
    locker = pg.engine.connect()
    stream, lock = store.stream(qname), store.lock(qname)
    calls = {"stream.read": (stream.read, "alkstore_stream_events"),
             "stream.offset": (lambda: stream.offset("c"), "alkstore_stream_offsets"),
             "lock.holder": (lock.holder, "alkstore_locks"),
             "lock.acquire": (lambda: lock.acquire("me", 60), "alkstore_locks"),
             "lock.renew": (lambda: lock.renew("me", 60), "alkstore_locks"),
             "schedules": (lambda: [s.name for s in store.schedules()], "alkstore_schedules"),
             "tick": (lambda: store._scheduler().tick(), "alkstore_schedules"),
             "stream.commit": (lambda: stream.commit("c", offset), "alkstore_stream_offsets")}
    call, table = calls[read]
    try:
        offset = stream.publish("x")
        stream.commit("c", offset)
        assert lock.acquire("me", 60)
        store.schedule(qname, "@every 1s", qname, "fire")
        expected = call() if read != "tick" else 1
        clock[0] += 1  # the schedule's next boundary is due
        tx = locker.begin()
        locker.execute(sa.text(f"LOCK TABLE {pg.table(table)} IN ACCESS EXCLUSIVE MODE"))
        assert _cut_off_while_waiting(app, tx, call) == [expected]
        assert lock.holder() is not None and lock.holder().owner == "me"  # type: ignore[union-attr]
        assert stream.offset("c") == offset
    finally:
        locker.close()
        store.unschedule(qname)
        store.close()


@pytest.mark.parametrize("clock", ["database", "injected"])
@pytest.mark.parametrize("change", ["new", "same", "other-interval"])
def test_schedule_cut_off_mid_statement_is_retried_once_on_a_fresh_connection(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str, clock: str, change: str
) -> None:
    """``store.schedule()`` whose connection dies mid-operation raised DatabaseError, while
    the scheduler's reads (e66c619) and the store's other reads and idempotent writes are
    retried once on a fresh connection. It reads the clock, then upserts by name: a repeat
    of an upsert that landed writes the same definition again (an unchanged interval keeps
    its boundary, the changed one is computed from the same reading), so it is retried too.
    The table lock holds the upsert, the statement after the clock read, where the cut comes."""
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema, clock=None if clock == "database" else lambda: 1_000_000.0)
    locker = pg.engine.connect()
    try:
        if change != "new":
            store.schedule(qname, "@every 1h", qname, "old")
        before = {s.name: s for s in store.schedules()}.get(qname)
        spec = "@every 2h" if change == "other-interval" else "@every 1h"
        tx = locker.begin()
        locker.execute(sa.text(f"LOCK TABLE {pg.table('alkstore_schedules')} IN ACCESS EXCLUSIVE MODE"))
        assert _cut_off_while_waiting(app, tx, lambda: store.schedule(qname, spec, qname, "new")) == [None]
        after = {s.name: s for s in store.schedules()}[qname]
        assert (after.spec, after.payload) == (spec, "new")
        if change == "same":
            assert before is not None and after.next_fire_at == before.next_fire_at
    finally:
        locker.close()
        store.unschedule(qname)
        store.close()


def test_lock_release_cut_off_mid_statement_is_not_retried(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str
) -> None:
    """A release whose connection dies after the statement was sent raises: had it landed,
    a repeat would find nothing to release and answer False for a lease that was given up."""
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema)
    locker = pg.engine.connect()
    try:
        lock = store.lock(qname)
        assert lock.acquire("me", 60)
        tx = locker.begin()
        locker.execute(sa.text(f"LOCK TABLE {pg.table('alkstore_locks')} IN ACCESS EXCLUSIVE MODE"))
        result = _cut_off_once(app, tx, lambda: lock.release("me"))
        assert len(result) == 1 and isinstance(result[0], alk.DatabaseError), result
        assert lock.release("me") is True  # the cut-off release did not land
    finally:
        locker.close()
        store.close()


def test_enqueue_cut_off_mid_statement_is_not_retried(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str
) -> None:
    """An enqueue whose connection dies after the statement was sent raises: it might have
    committed, and a retry could enqueue the job twice. Nothing is written twice."""
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema)
    locker = pg.engine.connect()
    try:
        q = store.queue(qname)
        q.stats()  # schema check done, a connection cached
        tx = locker.begin()
        locker.execute(sa.text(f"LOCK TABLE {pg.table('alkstore_jobs')} IN SHARE MODE"))
        result = _cut_off_once(app, tx, lambda: q.enqueue("once"))
        assert len(result) == 1 and isinstance(result[0], alk.DatabaseError), result
        assert q.stats().pending == 0
        assert q.enqueue("next") > 0  # the store itself is fine
    finally:
        locker.close()
        store.close()


def _capture(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc


def test_disconnect_seen_by_the_app_renews_the_stores_connections(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str
) -> None:
    """The application's own connection hits a disconnect: SQLAlchemy invalidates every
    connection of the pool opened before it (the pool's rule), the store's included."""
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema)
    try:
        before = _backend_pid(store)
        with engine.connect() as conn:
            _terminate([int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())])
            with pytest.raises(sa.exc.OperationalError):
                conn.exec_driver_sql("SELECT 1")
        assert _backend_pid(store) != before
    finally:
        store.close()


# -- pool rules ----------------------------------------------------------------------------


def _open_connections(engine: sa.Engine) -> list[int]:
    """A live count of the engine's open DBAPI connections (from the pool's events)."""
    count = [0]

    @event.listens_for(engine, "connect")
    def opened(*_: Any) -> None:
        count[0] += 1

    @event.listens_for(engine, "close")
    def closed(*_: Any) -> None:
        count[0] -= 1

    @event.listens_for(engine, "close_detached")
    def closed_detached(*_: Any) -> None:
        count[0] -= 1

    return count


def test_nullpool_engine_keeps_no_connection_open(db: Target, qname: str) -> None:
    app = _tag()
    if db.kind == "postgresql":
        engine = _tagged_engine(app, poolclass=NullPool)
    else:
        engine = sa.create_engine(db.url, poolclass=NullPool)
    open_now = _open_connections(engine)
    store = alk.Store(engine, schema=db.schema)
    try:
        q = store.queue(qname)
        q.enqueue("x")
        h = q.claim_one("w")
        assert h is not None and h.ack() is True
        q.stats()
        assert open_now[0] == 0, f"{open_now[0]} connection(s) left open on a NullPool engine"
        if db.kind == "postgresql":
            wait_for(lambda: not _backends(app), "no backend left for the NullPool engine")
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("size", [1, 3])
def test_connections_the_store_keeps_never_starve_the_apps_pool(db: Target, qname: str, size: int) -> None:
    """The store keeps idle connections checked out between its operations, but never ones
    the application's own checkouts need: on a pool of ``size`` connections and no
    overflow, after the store used all of them at once, the application can still hold
    all of them at once (a kept one would make its checkout time out)."""
    engine = sa.create_engine(db.url, pool_size=size, max_overflow=0, pool_timeout=2)
    store = alk.Store(engine, schema=db.schema)
    try:
        q = store.queue(qname)
        q.enqueue("x")
        together = threading.Barrier(size)
        errors: list[BaseException] = []

        def use() -> None:
            try:
                together.wait(10)
                for _ in range(20):
                    q.stats()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=use) for _ in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        with contextlib.ExitStack() as held:
            conns = [held.enter_context(engine.connect()) for _ in range(size)]
            assert [c.execute(sa.text("SELECT 1")).scalar() for c in conns] == [1] * size
        assert q.stats().pending == 1  # the store goes on working afterwards
    finally:
        store.close()
        engine.dispose()


def test_a_script_that_never_closes_its_store_exits_quietly(db: Target, qname: str) -> None:
    """A script that uses a store and ends without ``close()``: the connections the store
    kept must go back to the engine's pool at exit, while the driver is still whole. Left
    to the interpreter's teardown, SQLAlchemy resets them after psycopg's modules are gone
    and prints an "Exception during reset" traceback for each."""
    code = (
        "import sqlalchemy as sa, alkstore_sa as alk\n"
        f"store = alk.Store(sa.create_engine({db.url!r}), schema={db.schema!r})\n"
        f"q = store.queue({qname!r})\n"
        "q.enqueue(1); q.enqueue_many([2, 3])\n"
        "q.ack_batch(q.claim_batch('w', 2))\n"
        "q.stats()\n"
        f"alk.Worker(store, {qname!r}, lambda job: None, poll_interval=0.1).run(burst=True)\n"
        "assert q.stats().pending == 0\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr


def test_close_returns_a_connection_in_use_by_a_running_operation(db: Target, qname: str) -> None:
    """``close()`` while an operation waits on a lock: when it finishes, its connection goes
    back to the engine's pool, not into the (emptied) cache."""
    engine = sa.create_engine(db.url)
    store = alk.Store(engine, schema=db.schema)
    store.check_schema()  # done now, so the operation below is the only checkout
    blocker: Any
    if db.kind == "postgresql":
        blocker = db.engine.connect()  # another engine: only the operation counts below
        blocker.exec_driver_sql("SELECT pg_advisory_lock(424242)")

        def blocked_op() -> None:
            with store.executor() as ex:
                ex.rows("SELECT pg_advisory_xact_lock(424242)", {})

        def release() -> None:
            blocker.exec_driver_sql("SELECT pg_advisory_unlock(424242)")
            blocker.close()
    else:
        path = sa.make_url(db.url).database
        assert path
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")

        def blocked_op() -> None:
            with store.executor() as ex, ex.transaction():
                pass

        def release() -> None:
            blocker.execute("COMMIT")
            blocker.close()

    outcome: list[Any] = []
    t = threading.Thread(target=lambda: outcome.append(_capture(blocked_op)))
    t.start()
    try:
        wait_for(lambda: engine.pool.checkedout() == 1, "the operation to hold a connection")  # type: ignore[attr-defined]
        store.close()
    finally:
        release()
    t.join(30)
    assert outcome == [None]
    assert engine.pool.checkedout() == 0, "close() left a connection checked out"  # type: ignore[attr-defined]
    engine.dispose()


# -- fork ----------------------------------------------------------------------------------


def _in_child(work: Any) -> dict[str, Any]:
    """Run ``work()`` in a forked child; its JSON result, after the child exited 0."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            os.write(w, json.dumps(work()).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(w, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result  # type: ignore[no-any-return]


def test_forked_child_never_uses_the_parents_postgresql_connections(
    pg: Target, tagged: tuple[str, sa.Engine], qname: str
) -> None:
    app, engine = tagged
    store = alk.Store(engine, schema=pg.schema)
    try:
        q = store.queue(qname)
        parent = {_backend_pid(store)}
        with engine.connect() as conn:  # an app connection left idle in the engine's pool
            parent.add(int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()))
        q.enqueue("parent")

        def child() -> dict[str, Any]:
            return {"pid": _backend_pid(store), "job": q.enqueue("child")}

        result = _in_child(child)
        assert result["pid"] not in parent, "the child ran on one of the parent's connections"
        # the parent's connections were left alone: it carries on with them
        assert _backend_pid(store) in parent
        payloads = sorted(h.payload for h in q.claim_batch("w", 10))
        assert payloads == ["child", "parent"]
    finally:
        store.close()


def test_forked_child_never_uses_the_parents_sqlite_connections(sqlite_db: Target, qname: str) -> None:
    db = sqlite_db
    engine = sa.create_engine(db.url)

    @event.listens_for(engine, "connect")
    def stamp(dbapi_conn: Any, _record: Any) -> None:
        # a TEMP table lives in one connection: it names the process that opened it
        dbapi_conn.execute(f"CREATE TEMP TABLE owner AS SELECT {os.getpid()} AS pid")

    def owner(store: alk.Store) -> int:
        with store.executor() as ex:
            return int(ex.rows("SELECT pid FROM temp.owner", {})[0][0])

    store = alk.Store(engine, schema=db.schema)
    try:
        q = store.queue(qname)
        assert owner(store) == os.getpid()
        with engine.connect() as conn:  # an app connection left idle in the engine's pool
            conn.exec_driver_sql("SELECT 1")
        q.enqueue("parent")

        def child() -> dict[str, Any]:
            h = q.claim_one("child")
            return {"owner": owner(store), "me": os.getpid(), "job": q.enqueue("child"), "acked": bool(h and h.ack())}

        result = _in_child(child)
        assert result["owner"] == result["me"], "the child used a connection the parent opened"
        assert result["acked"] is True
        assert owner(store) == os.getpid()  # the parent carries on with its own connections
        assert [h.payload for h in q.claim_batch("w", 10)] == ["child"]
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar_one() == "ok"
    finally:
        store.close()
        engine.dispose()


def test_a_parent_closing_its_sqlite_connections_after_a_fork_loses_none_of_the_childs_commits(
    sqlite_db: Target, qname: str
) -> None:
    """SQLite keeps its lock bookkeeping per process, and a fork copies it: a child whose
    parent had connections open to the file at the fork believes its own new connections
    already hold the file's shared locks and never takes them. When the parent then closed
    its last connection (store.close(), engine.dispose(), the parent exiting), SQLite saw no
    other process on the file, checkpointed and deleted the WAL under the child, and every
    commit the child made from then on went to the deleted file: reported as done, visible
    to the child, lost for everyone else. The store now closes its idle SQLite connections
    before a fork, so a parent that is not using the file at that moment passes nothing on."""
    engine = sa.create_engine(sqlite_db.url)
    store = alk.Store(engine, schema=sqlite_db.schema)
    q = store.queue(qname)
    q.enqueue("parent")  # the parent's connections are open (and kept) at the fork
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            q.enqueue("child-early")  # the child's own connections open, parent alive
            os.write(to_parent, b"1")
            os.read(to_child, 1)  # the parent has closed every connection it had
            for i in range(5):
                q.enqueue(f"child-{i}")
            code = 0
        finally:
            os.write(to_parent, b"2")
            os._exit(code)
    try:
        assert os.read(from_child, 1) == b"1"
        store.close()
        engine.dispose()  # the parent is done with the file
        os.write(from_parent, b"x")
        assert os.read(from_child, 1) == b"2"
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        payloads = sqlite_db.scalar(f"SELECT group_concat(payload, ' ') FROM {sqlite_db.table('alkstore_jobs')}")
        assert sorted(str(payloads).split(" ")) == sorted(
            ['"parent"', '"child-early"', *[f'"child-{i}"' for i in range(5)]]
        )
    finally:
        for fd in (to_child, from_parent, from_child, to_parent):
            os.close(fd)
        store.close()
        engine.dispose()


def test_a_forked_child_listens_while_a_parent_thread_was_starting_the_watcher(
    sqlite_db: Target, qname: str
) -> None:
    """A thread of the parent was starting the store's SQLite watcher at fork time (it
    connects and reads under the store's hub lock: here its connection waits at a gate).
    That thread does not exist in the child, so the lock stayed held there for good: the
    child's first listen() (and a worker's wake-up watch, and close()) waited forever."""
    engine = sa.create_engine(sqlite_db.url, poolclass=NullPool)  # every checkout connects
    parent = os.getpid()
    connecting, gate = threading.Event(), threading.Event()
    armed = False

    @event.listens_for(engine, "do_connect")
    def held_at_the_gate(*_: Any) -> None:
        if armed and os.getpid() == parent:
            connecting.set()
            gate.wait()

    store = alk.Store(engine, schema=sqlite_db.schema)
    starting = threading.Thread(target=lambda: store.listen(qname).close())
    try:
        store.queue(qname).stats()  # the schema checked: the next connection is the watcher's
        armed = True
        starting.start()
        assert connecting.wait(30), "the parent's thread never began starting the watcher"

        def child() -> dict[str, Any]:
            got: list[Any] = []
            done = threading.Event()

            def listen() -> None:
                with store.listen(qname) as sub:
                    store.notify(qname, "in the child")
                    got.append(sub.get(timeout=30))
                done.set()

            threading.Thread(target=listen, daemon=True).start()
            # a hang fails here (the child exits and its thread with it), never a speed claim
            return {"listened": done.wait(30), "payload": got[0].payload if got and got[0] else None}

        result = _in_child(child)
        assert result == {"listened": True, "payload": "in the child"}
    finally:
        gate.set()
        if starting.is_alive():
            starting.join(30)
        store.close()
        engine.dispose()


# -- prepared statements: only on a direct connection --------------------------------------


class _TcpForwarder:
    """A minimal TCP proxy to PostgreSQL on loopback: what any pooler or proxy looks like
    from the server's side (it sees the proxy's socket, not the client's)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


def _prepared_statements(store: alk.Store, queue: str) -> int:
    """Statements the server has prepared on the store's connection, after enough
    repetitions of one statement that psycopg would prepare it (its threshold is 5)."""
    q = store.queue(queue)
    for i in range(8):
        q.enqueue(i)
    with store.executor() as ex:
        return int(ex.rows("SELECT count(*) FROM pg_catalog.pg_prepared_statements", {})[0][0])


def test_store_prepares_statements_only_on_a_direct_connection(pg: Target, qname: str) -> None:
    url = sa.make_url(PG_URL)
    forwarder = _TcpForwarder((url.host or "127.0.0.1", url.port or 5432))
    direct = sa.create_engine(PG_URL)
    proxied = sa.create_engine(url.set(host="127.0.0.1", port=forwarder.port))
    stores = [alk.Store(direct, schema=pg.schema), alk.Store(proxied, schema=pg.schema)]
    try:
        assert _prepared_statements(stores[0], qname) > 0  # direct: psycopg's fast path kept
        # through anything that may be a transaction pooler: never a named statement
        assert _prepared_statements(stores[1], qname) == 0
    finally:
        for s in stores:
            s.close()
        direct.dispose()
        proxied.dispose()
        forwarder.close()


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg_async", "asyncpg"])
def test_forked_child_never_uses_the_parents_connections_of_an_app_engine_the_store_does_not_run_on(
    pg: Target, qname: str, driver: str
) -> None:
    """A psycopg2 or async application engine: the store runs its own operations on an engine
    of its own, and the application's engine must get a fresh pool in the child too —
    otherwise a gunicorn ``--preload`` worker's sessions run on the master's connections
    (shared with every other worker: interleaved protocol, lost commits)."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    url = sa.engine.make_url(PG_URL)
    if driver == "psycopg2":
        app: Any = sa.create_engine(url.set(drivername="postgresql+psycopg2"))
    else:
        app = create_async_engine(url.set(drivername="postgresql+" + driver.removesuffix("_async")))

    loop = asyncio.new_event_loop()  # asyncpg's connections belong to the loop that opened them

    def app_pid() -> int:
        async def pid() -> int:
            async with app.connect() as conn:
                return int((await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one())

        if isinstance(app, sa.Engine):
            with app.connect() as conn:
                return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        return loop.run_until_complete(pid())

    store = alk.Store(app, schema=pg.schema)
    try:
        parent = app_pid()  # left idle in the application engine's pool

        def child() -> dict[str, Any]:
            nonlocal loop
            loop = asyncio.new_event_loop()  # the child's own (the parent's runs nothing here)
            return {"pid": app_pid(), "job": store.queue(qname).enqueue("child")}

        result = _in_child(child)
        assert result["pid"] != parent, "the child's session ran on the parent's connection"
        assert app_pid() == parent  # the parent carries on with its own
    finally:
        store.close()
        if isinstance(app, sa.Engine):
            app.dispose()
        else:
            loop.run_until_complete(app.dispose())
        loop.close()
