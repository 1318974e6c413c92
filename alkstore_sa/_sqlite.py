"""SQLite connection settings the store relies on: a long busy timeout so concurrent
writers wait instead of failing with 'database is locked', a bound on the WAL file left
behind after a checkpoint (``journal_size_limit``), and ``synchronous=NORMAL`` where — and
only where — the database is in WAL mode. (WAL is switched on once, at install
time: it is persistent in the file and cannot be switched inside a transaction.) On a WAL
database the store's own connections wait for the write lock in ``wait_for_lock``, fairly,
instead of in SQLite's busy handler (same bound, same error when it runs out)."""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import AssertionPool, SingletonThreadPool, StaticPool

from .errors import InvalidOptions

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

# How the store's own connections wait for the write lock on a WAL database (see
# wait_for_lock): each pause between tries is drawn between 0 and a bound, in seconds.
# While other connections commit, the bound starts at LOCK_PAUSE and shrinks as the wait
# lasts (halved after LOCK_AGING, down to LOCK_PAUSE_MIN); while none does, it grows with
# the quiet time (a twentieth of it) from LOCK_PAUSE up to LOCK_PAUSE_LONG.
LOCK_PAUSE = 0.001
LOCK_PAUSE_MIN = 0.0001
LOCK_AGING = 0.01
LOCK_PAUSE_LONG = 0.005

_T = TypeVar("_T")

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


def wait_here(dbapi_conn: Any) -> int | None:
    """Make one of the store's own connections wait for the write lock in the store's
    :func:`wait_for_lock` rather than in SQLite's busy handler: on a WAL database its busy
    timeout goes to 0, and its previous one is returned (for :func:`wait_there`); None, and
    nothing changed, for any other journal mode (see :func:`wait_for_lock` for why)."""
    ((mode,),) = _rows(dbapi_conn, "PRAGMA journal_mode")
    if str(mode).lower() != "wal":
        return None
    ((timeout,),) = _rows(dbapi_conn, "PRAGMA busy_timeout")
    _rows(dbapi_conn, "PRAGMA busy_timeout = 0")
    return int(timeout)


def wait_there(dbapi_conn: Any, timeout: int) -> None:
    """Undo :func:`wait_here`: the connection's busy timeout is ``timeout`` again."""
    _rows(dbapi_conn, f"PRAGMA busy_timeout = {int(timeout)}")


def waits_here(exc: BaseException, timeout: int | None) -> bool:
    """Whether ``exc`` says the write lock was taken, on a connection that waits for it in
    :func:`wait_for_lock`: one :func:`wait_here` prepared, which returned ``timeout`` (not
    None)."""
    return timeout is not None and is_busy(exc)


def wait_for_lock(dbapi_conn: Any, attempt: Callable[[], _T], busy: BaseException, timeout: int) -> _T:
    """Try ``attempt`` (a ``BEGIN IMMEDIATE``, or a statement outside any transaction, on
    ``dbapi_conn``, that just failed with ``busy`` because another connection holds the
    write lock) again until it runs, for up to ``timeout`` ms — the busy timeout the
    connection had before :func:`wait_here` (the store's, or one the application set after
    it) — then raise the last busy error, as SQLite's own busy handler would, saying how
    long it waited (:func:`waited_ms`).

    Why not SQLite's busy handler: it is not fair. A waiter sleeps 1, 2, 5, 10, ... up to
    100 ms between tries, and a process that writes in a loop takes the lock again
    microseconds after each commit, so a try finds the lock free only by luck — and the
    longer a process has waited, the rarer its tries: a process claiming in a tight loop
    kept three others out of a whole drain. Here a waiter tries again after a short pause
    drawn at random (so it never keeps step with the holder's cycle). While the lock
    changes hands (``PRAGMA data_version`` moves: others commit), the pauses get *shorter*
    the longer this connection has waited, so the longest waiter tries most often and is
    the likeliest to get the lock next. While no one commits (a long transaction holds the
    lock) they grow instead, to ``LOCK_PAUSE_LONG``: waiting that out costs about 1 % of
    a core. Nothing is added to a write that finds the lock free.

    Only on a WAL database (:func:`wait_here`), where the write lock is all a writer waits
    for: in a rollback-journal mode a transaction's statements and its COMMIT may wait for
    readers too, and there SQLite's handler keeps doing all the waiting."""
    started = time.monotonic()
    deadline = started + timeout / 1000
    version, last_commit = _data_version(dbapi_conn), started
    while True:
        now = time.monotonic()
        if now >= deadline:
            setattr(busy, _WAITED, timeout)
            raise busy
        bound = _pause_bound(now - started, now - last_commit)
        time.sleep(min(deadline - now, random.uniform(0, bound)))
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            busy = exc
        seen = _data_version(dbapi_conn)
        if seen != version:
            version, last_commit = seen, time.monotonic()


_WAITED = "alkstore_waited_ms"  # set on the busy error wait_for_lock (or SQLite's handler) gave up with


def waited_ms(exc: BaseException) -> int:
    """How long the write lock was waited for before ``exc`` (a busy error) was raised: what
    :func:`wait_for_lock` waited, or the busy timeout SQLite's own handler waited out
    (:func:`note_busy_timeout`), else the busy timeout the store sets."""
    return int(getattr(exc, _WAITED, BUSY_TIMEOUT_MS))


def note_busy_timeout(exc: BaseException, dbapi_conn: Any) -> None:
    """Record on ``exc``, a busy error SQLite's own handler gave up with on ``dbapi_conn``
    (not :func:`wait_for_lock`, which records its own), the bound that handler waited: the
    connection's busy timeout — the application's where it set one (a caller's transaction,
    or a file not in WAL mode), which the error then names (:func:`waited_ms`). Nothing when
    it cannot be read."""
    if dbapi_conn is None or getattr(exc, "sqlite_errorcode", None) != SQLITE_BUSY or hasattr(exc, _WAITED):
        return
    try:
        rows = _rows(dbapi_conn, "PRAGMA busy_timeout")  # the driver's cursor: no statement event, no echo
    except Exception:  # noqa: BLE001 - the error is raised as it is, naming the store's bound
        return
    if rows:
        setattr(exc, _WAITED, int(rows[0][0]))


def _pause_bound(waited: float, quiet: float) -> float:
    """The longest pause before the next try, ``waited`` seconds into the wait and
    ``quiet`` seconds after another connection's last commit seen (see the constants)."""
    if quiet >= LOCK_PAUSE_LONG:  # a long transaction holds the lock
        return min(LOCK_PAUSE_LONG, max(LOCK_PAUSE, quiet / 20))
    return max(LOCK_PAUSE_MIN, LOCK_PAUSE * LOCK_AGING / (LOCK_AGING + waited))


def _data_version(dbapi_conn: Any) -> Any:
    """``PRAGMA data_version``: it moves whenever another connection has committed."""
    try:
        return _rows(dbapi_conn, "PRAGMA data_version")
    except sqlite3.Error:
        return None


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


def leave_pep249_mode(dbapi_conn: Any) -> bool:
    """Put a connection in Python 3.12's ``autocommit=False`` mode (PEP 249: sqlite3 keeps a
    transaction open at all times, beginning the next one as each ends) into autocommit, and
    say whether it was (then :func:`enter_pep249_mode` puts it back). In that mode
    ``isolation_level`` is ignored: the store's ``BEGIN IMMEDIATE`` would fail inside the open
    transaction, ``synchronous`` cannot be set in it, and a kept connection's reads would hold
    a snapshot (stale, and stopping every checkpoint) until it commits. No-op (False) for the
    legacy mode and ``autocommit=True``, before Python 3.12, and for aiosqlite."""
    if getattr(dbapi_conn, "autocommit", None) is not False:
        return False
    dbapi_conn.autocommit = True  # commits the transaction open: a pooled connection's is empty
    return True


def enter_pep249_mode(dbapi_conn: Any, was: bool) -> None:
    """Undo :func:`leave_pep249_mode` (``was``: what it returned)."""
    if was:
        dbapi_conn.autocommit = False


def _on_connect(dbapi_conn: Any, record: Any) -> None:
    if record is not None:
        record.info[_CONFIGURED] = _generation[0]
    pep249 = leave_pep249_mode(dbapi_conn)
    try:
        _configure(dbapi_conn)
    finally:
        enter_pep249_mode(dbapi_conn, pep249)


def _configure(dbapi_conn: Any) -> None:
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


def refuse_exclusive_locking(dbapi_conn: Any) -> None:
    """Raise InvalidOptions when the connection runs with ``PRAGMA locking_mode=EXCLUSIVE``
    (an application's own ``connect`` hook: a single-process speed tip). Then the first
    connection that reads the file keeps it locked until it closes, and the store needs
    several at once — its watcher, a worker's threads, other processes: a ``listen()`` or a
    worker's wake waited out the busy timeout and failed with 'database is locked', which
    blamed another connection's long transaction. Asked once per store (its schema check)."""
    ((mode,),) = _rows(dbapi_conn, "PRAGMA locking_mode")
    if str(mode).lower() == "exclusive":
        raise InvalidOptions(
            "this engine's SQLite connections run with PRAGMA locking_mode=EXCLUSIVE: the first "
            "one to read the file keeps it locked until it closes, and alkstore needs several "
            "connections at once (its watcher, a worker's threads, other processes); remove "
            "that PRAGMA from the engine's connect hook (locking_mode=NORMAL)"
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
    those its pool already holds. A sync engine's queue pool starts afresh: its idle
    connections are closed and a new pool takes over (``engine.dispose()``), so one checked
    out at this moment goes back to the old pool, never to serve the engine again.
    (``engine.pool.dispose()`` kept the pool: that connection came back into it without the
    settings, and the pool, which forgets what is checked out when disposed, then allowed
    one connection more than its size and overflow.) Otherwise each connection gets the
    settings at its next checkout: an async engine's (aiosqlite) connections cannot be
    closed from synchronous code — disposing of its pool in a FastAPI lifespan, after the
    app's first query, logged a MissingGreenlet "Exception closing connection" per pooled
    connection and left each one unclosed — and a pool that shares its connection between
    checkouts (StaticPool, SingletonThreadPool, AssertionPool) closes it on dispose even
    while the application's open transaction is on it: a Store made (or an engine
    register()ed) then lost that transaction's rows."""
    if not event.contains(engine, "connect", _on_connect):
        event.listen(engine, "connect", _on_connect)
    if not engine.dialect.is_async and not isinstance(engine.pool, _SHARING_POOLS):
        engine.dispose()  # connections the pool already holds were opened without the hook
        return
    _generation[0] += 1
    if not event.contains(engine, "checkout", _on_checkout):
        event.listen(engine, "checkout", _on_checkout)
