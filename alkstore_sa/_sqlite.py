"""SQLite connection settings the store relies on: a long busy timeout so concurrent
writers wait instead of failing with 'database is locked', a bound on the WAL file left
behind after a checkpoint (``journal_size_limit``), and ``synchronous=NORMAL`` where — and
only where — the database is in WAL mode. (WAL is switched on once, at install
time: it is persistent in the file and cannot be switched inside a transaction.)"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import AssertionPool, SingletonThreadPool, StaticPool

BUSY_TIMEOUT_MS = 60_000
# The size, in bytes, a WAL file is truncated back to when a checkpoint lets it restart.
# SQLite's default (-1) never truncates: one long read transaction of the application stops
# checkpoints from passing it, the WAL grows for as long as it lasts (hundreds of MB under
# a busy worker), and the file then stays that size until every connection has closed it.
# 64 MiB is 16 times the WAL's usual peak (the auto-checkpoint runs at 1000 pages, ~4 MiB),
# so a busy store never pays for truncating and re-growing the file in normal operation,
# while the disk a long reader used is given back down to a modest, fixed bound.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024

# SQLite's primary result codes the library tells apart (an extended code carries one in
# its low byte: a stale snapshot's lock upgrade is SQLITE_BUSY_SNAPSHOT, 517)
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY = 5, 6, 8

log = logging.getLogger("alkstore_sa")
_warned: set[str] = set()  # database files already warned about (once per file and process)
_warned_lock = threading.Lock()


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "the write lock is taken" (busy or locked, any variant;
    an error without a result code, as Python 3.10's sqlite3 raises, by its message)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


def _rows(dbapi_conn: Any, sql: str) -> list[Any]:
    """Run ``sql`` through a cursor: sqlite3's connection, or SQLAlchemy's adapter of an
    aiosqlite one (whose own ``execute`` hands back the driver's async cursor)."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


# Pools that hand one connection to several checkouts: the store never borrows from one
# (store._own_engine), nor disposes of one (configure_sqlite_engine).
_SHARING_POOLS = (StaticPool, SingletonThreadPool, AssertionPool)

# The settings' generation a pooled connection (its ConnectionRecord's info) has: every
# configure_sqlite_engine() call that does not dispose of the pool starts a new one (see there).
_CONFIGURED = "alkstore_sqlite_generation"
_generation = [0]


def _on_connect(dbapi_conn: Any, record: Any) -> None:
    if record is not None:
        record.info[_CONFIGURED] = _generation[0]
    _rows(dbapi_conn, f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    ((limit,),) = _rows(dbapi_conn, "PRAGMA journal_size_limit")
    if limit == -1:  # SQLite's "no limit": any other value is the application's own choice, kept
        _rows(dbapi_conn, f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    ((mode,),) = _rows(dbapi_conn, "PRAGMA journal_mode")
    if str(mode).lower() == "wal":
        # With WAL, NORMAL keeps the database consistent across crashes and skips an fsync
        # per commit; only the last commits before a power loss can be lost (SQLite's
        # documented recommendation for WAL).
        _rows(dbapi_conn, "PRAGMA synchronous = NORMAL")
        return
    # In a rollback-journal mode NORMAL can corrupt the file on power loss: the app's own
    # setting stays. Say so once, where alkstore is installed (before install() switches a
    # new file to WAL there is nothing to warn about).
    path = _main_file(dbapi_conn)
    if not path or not _alkstore_installed(dbapi_conn):
        return
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning(
        "SQLite database %s is in journal_mode=%s, not WAL: alkstore leaves its synchronous "
        "setting alone, and concurrent workers will contend for the file. Switch it to WAL once "
        "with `alkstore migrate --url sqlite:///...` (or enable_wal(connection) in your Alembic env.py)",
        path, mode,
    )


def _main_file(dbapi_conn: Any) -> str:
    """The main database's file ('' for an in-memory or temporary database)."""
    for _seq, name, file in _rows(dbapi_conn, "PRAGMA database_list"):
        if name == "main":
            return str(file or "")
    return ""


def _alkstore_installed(dbapi_conn: Any) -> bool:
    return bool(_rows(dbapi_conn, "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'alkstore_alembic_version'"))


def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """A connection the pool held before the latest ``configure_sqlite_engine`` (of an async
    engine, or a pool sharing its connection) gets the settings at its next checkout."""
    if record.info.get(_CONFIGURED, -1) < _generation[0]:
        _on_connect(dbapi_conn, record)


def configure_sqlite_engine(engine: Engine) -> None:
    """Apply the settings to every connection of the engine: those it opens from now on, and
    those its pool already holds. A sync engine's queue pool starts afresh (it closes only
    the idle ones). Otherwise each connection gets the settings at its next checkout:
    an async engine's (aiosqlite) connections cannot be closed from synchronous code —
    disposing of its pool in a FastAPI lifespan, after the app's first query, logged a
    MissingGreenlet "Exception closing connection" per pooled connection and left each one
    unclosed — and a pool that shares its connection between checkouts (StaticPool,
    SingletonThreadPool, AssertionPool) closes it on dispose even while the application's
    open transaction is on it: a Store made (or an engine register()ed) then lost that
    transaction's rows."""
    if not event.contains(engine, "connect", _on_connect):
        event.listen(engine, "connect", _on_connect)
    if not engine.dialect.is_async and not isinstance(engine.pool, _SHARING_POOLS):
        engine.pool.dispose()  # connections the pool already holds were opened without the hook
        return
    _generation[0] += 1
    if not event.contains(engine, "checkout", _on_checkout):
        event.listen(engine, "checkout", _on_checkout)
