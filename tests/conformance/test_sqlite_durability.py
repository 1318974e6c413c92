"""A Store changes an app's SQLite durability only where that is safe (SQLite only).

``synchronous=NORMAL`` is SQLite's recommendation *for WAL mode*; in a rollback-journal
mode it risks a corrupt file on power loss. A database installed through the app's own
Alembic chain without ``enable_wal`` stays in ``journal_mode=delete``: there the store must
leave the app's own ``synchronous`` setting alone and say once, in the log, how to switch
to WAL. In WAL mode every connection of the engine gets NORMAL. Every connection also
bounds the WAL file a checkpoint leaves behind (``journal_size_limit``).

The SQLite operations the docs recommend are pinned here too: a ``VACUUM INTO`` backup and
its switch back to WAL by ``alkstore migrate``, and which of the application's own
transaction styles survive another connection's commit between a read and a write.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import _sqlite, migrations

NORMAL, EXTRA = 1, 3


def installed_file(tmp_path: Path, *, wal: bool) -> str:
    """A SQLite file with alkstore installed, in WAL mode or (as an app's Alembic chain
    without enable_wal leaves it) in the default rollback journal."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(url)
    migrations.upgrade(engine)  # switches to WAL
    if not wal:
        with engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode=DELETE").scalar() == "delete"
    engine.dispose()
    return url


def app_engine(url: str) -> sa.Engine:
    """The app's engine, with its own durability setting on every connection."""
    engine = sa.create_engine(url)
    sa.event.listen(engine, "connect", lambda dbapi, _rec: dbapi.execute(f"PRAGMA synchronous = {EXTRA}"))
    return engine


def settings(engine: sa.Engine, n: int = 2) -> list[tuple[str, int]]:
    """(journal_mode, synchronous) of ``n`` connections opened at once."""
    conns = [engine.connect() for _ in range(n)]
    try:
        return [
            (c.exec_driver_sql("PRAGMA journal_mode").scalar(), c.exec_driver_sql("PRAGMA synchronous").scalar())
            for c in conns
        ]
    finally:
        for c in conns:
            c.close()


def test_wal_database_gets_synchronous_normal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = app_engine(installed_file(tmp_path, wal=True))
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"), alk.Store(engine) as store:
        assert settings(engine) == [("wal", NORMAL)] * 2
        store.queue("q").enqueue(1)
    assert not [r for r in caplog.records if "WAL" in r.getMessage()]
    engine.dispose()


def test_rollback_journal_keeps_the_apps_setting_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = installed_file(tmp_path, wal=False)
    engine = app_engine(url)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"), alk.Store(engine) as store:
        assert settings(engine) == [("delete", EXTRA)] * 2
        q = store.queue("q")
        q.enqueue(1)
        h = q.claim_one("w1")
        assert h is not None and h.ack() is True
        engine.dispose()
        assert settings(engine) == [("delete", EXTRA)] * 2  # new connections too
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "WAL" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "journal_mode=delete" in warnings[0] and "alkstore migrate" in warnings[0], warnings[0]
    assert str(tmp_path / "app.db") in warnings[0]

    # the cure the message names: migrate switches the file to WAL, then NORMAL applies
    migrations.upgrade(engine)
    with alk.Store(engine):
        assert settings(engine) == [("wal", NORMAL)] * 2
    engine.dispose()


def test_a_new_file_is_not_warned_about_before_install(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A fresh file is in journal_mode=delete until install() switches it: no warning."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'new.db'}")
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"), alk.Store(engine) as store:
        store.install()
        store.queue("q").enqueue(1)
    assert not [r for r in caplog.records if "WAL" in r.getMessage()]
    engine.dispose()


def test_connections_opened_before_install_do_not_keep_the_strict_setting(tmp_path: Path) -> None:
    """``Store(engine)`` then ``install()`` on a new file: the store's first operation opened
    connections in the rollback journal (strict setting kept); once install switched the file
    to WAL, every connection the store and the app use afterwards gets NORMAL."""
    engine = app_engine(f"sqlite:///{tmp_path / 'new.db'}")
    with alk.Store(engine) as store:
        with pytest.raises(alk.NotInstalled):
            store.queue("q").enqueue({})  # opens a connection before the file is in WAL
        store.install()
        store.queue("q").enqueue({})
        with store.executor() as ex:
            assert ex.rows("PRAGMA synchronous", {}) == [(NORMAL,)]
        assert settings(engine) == [("wal", NORMAL)] * 2


def test_store_connections_bound_the_wal_unless_the_app_chose_a_limit(tmp_path: Path) -> None:
    """Every connection of the store and of the app's engine truncates the WAL back to
    ``JOURNAL_SIZE_LIMIT`` when it is reset (SQLite's default, -1, never does); an app that
    set its own limit on its connections keeps it."""
    url = installed_file(tmp_path, wal=True)
    with alk.Store(url) as store, store.executor() as ex:
        assert ex.rows("PRAGMA journal_size_limit", {}) == [(_sqlite.JOURNAL_SIZE_LIMIT,)]
    engine = sa.create_engine(url)
    with alk.Store(engine), engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_size_limit").scalar() == _sqlite.JOURNAL_SIZE_LIMIT
    engine.dispose()
    own = sa.create_engine(url)
    sa.event.listen(own, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA journal_size_limit = 1000000"))
    with alk.Store(own), own.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_size_limit").scalar() == 1_000_000
    own.dispose()


def test_wal_shrinks_back_after_a_long_read_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An open read transaction stops checkpoints from passing it, so the WAL grows while
    the store writes (SQLite's design). Once it ends, the next checkpoint resets the WAL and
    the file is truncated back to the limit (here a small one) instead of staying huge."""
    limit = 256 * 1024
    monkeypatch.setattr(_sqlite, "JOURNAL_SIZE_LIMIT", limit, raising=False)
    url = installed_file(tmp_path, wal=True)
    wal = tmp_path / "app.db-wal"
    with alk.Store(url) as store:
        q = store.queue("work")

        def churn(batches: int) -> None:
            for _ in range(batches):
                q.enqueue_many([{"pad": "x" * 4000}] * 50)
                while handles := q.claim_batch(worker_id="w", n=50):
                    q.ack_batch([h.id for h in handles])

        reader = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM alkstore_jobs").fetchall()
            churn(15)  # about 10 MB of pages, past the auto-checkpoint's 1000 pages
            grown = wal.stat().st_size
            assert grown > 4 * limit, f"the WAL did not grow behind the reader ({grown} bytes)"
        finally:
            reader.execute("COMMIT")
            reader.close()
        sizes = []
        for _ in range(20):  # a checkpoint runs at the next commits, then a write resets the WAL
            churn(1)
            sizes.append(wal.stat().st_size)
            if sizes[-1] <= limit:
                break
        assert sizes[-1] <= limit, f"the WAL stayed at {sizes} bytes after the reader ended (limit {limit})"


def test_a_vacuum_into_backup_is_consistent_and_migrate_puts_it_back_in_wal(tmp_path: Path) -> None:
    """What operations.md says about backups: ``VACUUM INTO`` copies the database while the
    store writes; the copy is in rollback-journal mode, a Store alone leaves it so, and the
    migration ``alkstore migrate`` runs switches it back to WAL."""
    url = installed_file(tmp_path, wal=True)
    backup = tmp_path / "backup.db"
    with alk.Store(url) as store:
        q = store.queue("q")
        q.enqueue_many([{"n": i} for i in range(100)])
        with store.engine.connect() as c:
            c.exec_driver_sql(f"VACUUM INTO '{backup}'")
        q.enqueue_many([{"n": i} for i in range(100, 150)])
    copy = sa.create_engine(f"sqlite:///{backup}")
    with alk.Store(copy) as restored:
        assert restored.queue("q").stats().pending == 100
        assert settings(copy, 1) == [("delete", 2)]  # FULL, sqlite3's default: not WAL yet
    migrations.upgrade(copy)
    copy.dispose()
    with alk.Store(f"sqlite:///{backup}") as restored:
        assert restored.queue("q").stats().pending == 100
    assert settings(copy, 1) == [("wal", NORMAL)]
    copy.dispose()


def test_own_writes_after_a_read_need_the_write_lock_first(tmp_path: Path) -> None:
    """What install.md says about the application's own writes: with the store's busy
    timeout, SQLAlchemy's default pysqlite handling (the transaction starts at the first
    write) survives another process's commit between a read and a write; a deferred
    ``BEGIN`` (SQLAlchemy's SAVEPOINT recipe) fails at once, and ``BEGIN IMMEDIATE`` does not."""
    url = installed_file(tmp_path, wal=True)
    other = sa.create_engine(url)
    with other.begin() as c:
        c.exec_driver_sql("CREATE TABLE own (x INTEGER)")

    def insert_other(x: int) -> None:
        with other.begin() as o:
            o.exec_driver_sql("INSERT INTO own VALUES (:x)", {"x": x})

    def read_commit_write(engine: sa.Engine) -> None:
        with engine.begin() as c:
            c.exec_driver_sql("SELECT count(*) FROM own").scalar()
            insert_other(0)  # another connection commits meanwhile
            c.exec_driver_sql("INSERT INTO own VALUES (1)")

    def recipe(begin: str) -> sa.Engine:
        engine = sa.create_engine(url)
        sa.event.listen(engine, "connect", lambda dbapi, _rec: setattr(dbapi, "isolation_level", None))
        sa.event.listen(engine, "begin", lambda conn: conn.exec_driver_sql(begin))
        return engine

    default, deferred, immediate = sa.create_engine(url), recipe("BEGIN"), recipe("BEGIN IMMEDIATE")
    stores = [alk.Store(e) for e in (default, deferred, immediate)]  # the busy timeout on each
    try:
        read_commit_write(default)
        with pytest.raises(sa.exc.OperationalError, match="database is locked"):
            read_commit_write(deferred)
        with immediate.begin() as c:  # holds the write lock: the other commit waits for it
            c.exec_driver_sql("SELECT count(*) FROM own").scalar()
            waiter = threading.Thread(target=insert_other, args=(3,))
            waiter.start()
            time.sleep(0.1)
            c.exec_driver_sql("INSERT INTO own VALUES (2)")
        waiter.join(10)
        with other.connect() as c:  # 0, 1 (default); 0 (deferred: its own write failed); 3, 2
            assert sorted(x for (x,) in c.exec_driver_sql("SELECT x FROM own")) == [0, 0, 1, 2, 3]
    finally:
        for s in stores:
            s.close()
        for e in (default, deferred, immediate, other):
            e.dispose()


def test_waiting_out_the_busy_timeout_says_who_may_hold_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual cause of ``database is locked`` after the busy timeout, in a web app: a
    store operation with a transaction of its own (``q.enqueue``) called inside an open
    transaction of the application's that has written, on the same thread — it waits for a
    commit that can only come after it returns. The error says so and names the form that
    writes in the caller's transaction; nothing is written."""
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_MS", 200)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    store = alk.Store(engine)
    try:
        store.install()
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        with engine.connect() as app:
            app.exec_driver_sql("INSERT INTO orders DEFAULT VALUES")  # the request's transaction wrote
            with pytest.raises(alk.DatabaseError, match=r"database is locked.*0\.2 s.*your own.*alk\.enqueue\(session") as err:
                store.queue("emails").enqueue({"order": 1})
            assert isinstance(err.value.orig, sqlite3.OperationalError)
            app.rollback()
        assert store.queue("emails").stats().pending == 0
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("operation", ["enqueue", "claim"])
def test_the_store_waits_for_the_lock_as_long_as_the_application_set(tmp_path: Path, operation: str) -> None:
    """An application that sets its own busy timeout on its engine's connections (a
    ``connect`` hook registered after creating the Store, as install.md says for
    ``synchronous``) — 0.2 s, say, so that a web request fails fast — gets that bound on the
    store's own operations too: a lone statement (``q.enqueue``) and a ``BEGIN IMMEDIATE``
    (``claim_batch``) alike, and the error names it. Nothing is written."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    store = alk.Store(engine)
    try:
        store.install()
        sa.event.listen(engine, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA busy_timeout = 200"))
        engine.dispose()  # every connection from now on has the application's setting
        q = store.queue("emails")
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        with engine.connect() as app:
            assert app.exec_driver_sql("PRAGMA busy_timeout").scalar() == 200
            app.exec_driver_sql("INSERT INTO orders DEFAULT VALUES")  # holds the write lock
            started = time.monotonic()
            with pytest.raises(alk.DatabaseError, match=r"database is locked.*busy timeout, 0\.2 s"):
                q.enqueue({"order": 1}) if operation == "enqueue" else q.claim_batch("w", 1)
            waited = time.monotonic() - started
            app.rollback()
        assert waited < 30, f"waited {waited:.1f} s: the store's own 60 s, not the application's 0.2 s"
        assert q.stats().pending == 0
        with engine.connect() as c:  # the connection went back to the pool with its own setting
            assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 200
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("where", ["callers-transaction", "async-callers-transaction", "rollback-journal"])
def test_a_busy_error_names_the_busy_timeout_sqlite_waited_out(tmp_path: Path, where: str) -> None:
    """Where SQLite's own busy handler did the waiting — a caller's-transaction call
    (``alk.enqueue(session, ...)`` or ``alk.aenqueue``, on the application's connection) or
    the store's own connection to a file not in WAL mode — it waited the connection's busy
    timeout, the one the application set (0.2 s here): the error names that, not the
    store's 60 s."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(url)
    store = alk.Store(engine)
    try:
        store.install()
        if where == "rollback-journal":
            with engine.connect() as c:
                assert c.exec_driver_sql("PRAGMA journal_mode=DELETE").scalar() == "delete"
        sa.event.listen(engine, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA busy_timeout = 200"))
        engine.dispose()  # every connection from now on has the application's setting
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")

        async def in_async_session() -> None:
            async_engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://"))
            store.register(async_engine)
            sa.event.listen(
                async_engine.sync_engine, "connect", lambda dbapi, _rec: dbapi.execute("PRAGMA busy_timeout = 200")
            )
            try:
                async with AsyncSession(async_engine) as session:
                    await alk.aenqueue(session, "emails", {"order": 1})
            finally:
                await async_engine.dispose()

        with engine.connect() as app:
            app.exec_driver_sql("INSERT INTO orders DEFAULT VALUES")  # holds the write lock
            with pytest.raises(alk.DatabaseError, match=r"database is locked.*busy timeout, 0\.2 s"):
                if where == "rollback-journal":
                    store.queue("emails").enqueue({"order": 1})
                elif where == "callers-transaction":
                    with Session(engine) as session:
                        alk.enqueue(session, "emails", {"order": 1})
                else:
                    asyncio.run(in_async_session())
            app.rollback()
        assert store.queue("emails").stats().pending == 0
    finally:
        store.close()
        engine.dispose()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sqlite3's autocommit attribute is Python 3.12's")
def test_an_engine_on_python_312s_autocommit_false_works_with_the_store(tmp_path: Path) -> None:
    """Python 3.12's PEP 249 mode (``connect_args={"autocommit": False}``) keeps a transaction
    open on every connection: the store's settings, its own BEGIN IMMEDIATE and the watcher's
    reads must not run inside it, and the application's connections keep the mode. (Before:
    every connection of the engine failed to open, 'Safety level may not be changed inside a
    transaction', and install() could not switch to WAL.)"""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(url, connect_args={"autocommit": False})
    store = alk.Store(engine)
    try:
        store.install()  # switches the file to WAL
        with Session(engine) as session, session.begin():
            session.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
        with Session(engine) as session, session.begin():
            session.execute(sa.text("INSERT INTO orders DEFAULT VALUES"))
            alk.enqueue(session, "q", {"in": "txn"})
        with Session(engine) as session:
            session.execute(sa.text("INSERT INTO orders DEFAULT VALUES"))
            alk.enqueue(session, "q", {"in": "rolled back"})
            session.rollback()
        q = store.queue("q")
        q.enqueue({"in": "store"})
        with store.listen("chan") as sub:
            store.notify("chan", "hi")
            note = sub.get(timeout=10)
            assert note is not None and note.payload == "hi"
        handles = q.claim_batch("w1", 5)
        assert sorted(h.job.payload["in"] for h in handles) == ["store", "txn"]
        assert all(h.ack() for h in handles)
        with engine.connect() as c:
            assert c.connection.driver_connection.autocommit is False  # the app's mode is kept
            assert c.exec_driver_sql("PRAGMA synchronous").scalar() == NORMAL
        other = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:  # committed for everyone, and nothing holds a snapshot the checkpoint must wait for
            assert other.execute("SELECT count(*) FROM orders").fetchone() == (1,)
            assert other.execute("SELECT count(*) FROM alkstore_jobs").fetchone() == (0,)
            assert other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        finally:
            other.close()
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("hook", ["before", "after"])
def test_an_engine_whose_connections_lock_the_file_exclusively_is_refused(tmp_path: Path, hook: str) -> None:
    """``PRAGMA locking_mode=EXCLUSIVE`` (a single-process speed tip) makes the first
    connection that reads the file keep it locked for good, and the store needs several at
    once (its watcher, a worker's threads, other processes). It said nothing: a listen() or
    a worker's wake waited out the 60 s busy timeout and failed with 'database is locked',
    blaming another connection's long transaction. The first operation now says why."""
    url = installed_file(tmp_path, wal=True)
    engine = sa.create_engine(url)

    def exclusive(dbapi: Any, _record: Any) -> None:
        dbapi.execute("PRAGMA locking_mode = EXCLUSIVE")

    if hook == "before":
        sa.event.listen(engine, "connect", exclusive)
    store = alk.Store(engine)
    if hook == "after":
        sa.event.listen(engine, "connect", exclusive)
    try:
        with pytest.raises(alk.InvalidOptions, match="locking_mode=EXCLUSIVE"):
            store.queue("q").enqueue({})
        with pytest.raises(alk.InvalidOptions, match="locking_mode=EXCLUSIVE"):
            store.listen("chan")
        with pytest.raises(alk.InvalidOptions, match="locking_mode=EXCLUSIVE"):
            alk.Worker(store, "q", lambda job: None).run(alk.StopToken())
    finally:
        store.close()
        engine.dispose()
    other = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        assert other.execute("SELECT count(*) FROM alkstore_jobs").fetchone() == (0,)
    finally:
        other.close()


@pytest.mark.parametrize("given", ["url", "engine", "register"])
def test_a_file_opened_with_a_shared_cache_is_refused(tmp_path: Path, given: str) -> None:
    """``cache=shared`` makes a process's connections lock whole tables and report a taken
    lock at once ('database table is locked'), never waiting the busy timeout. Before: a
    store on it ran, but its watcher failed its looks and its reading-place saves while
    the process enqueued and notified, and a listener lost the notifications the prune then
    deleted ('... notifications were pruned before this process read them'); the app's
    writes in threads failed. Store() and register() now refuse it, naming the option."""
    path = installed_file(tmp_path, wal=True).removeprefix("sqlite:///")
    url = f"sqlite:///file:{path}?cache=shared&uri=true"
    match = "cache=shared"
    if given == "url":
        with pytest.raises(alk.InvalidOptions, match=match):
            alk.Store(url)
        return
    engine = sa.create_engine(url)
    try:
        if given == "engine":
            with pytest.raises(alk.InvalidOptions, match=match):
                alk.Store(engine)
        else:
            store = alk.Store(f"sqlite:///{path}")
            try:
                with pytest.raises(alk.InvalidOptions, match=match):
                    store.register(engine)
            finally:
                store.close()
    finally:
        engine.dispose()
