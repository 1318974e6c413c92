"""Executors: the store's own driver connections (autocommit; see _connections for how they
are kept) and the caller's SQLAlchemy Connection. Errors from either become alkstore
errors here, via the backend.

The context managers are plain classes, not generators: they sit on every operation's
path, and a generator-based one costs several microseconds more per use.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import PendingRollbackError

from ._backends import Backend
from .errors import AlkstoreError, DatabaseError, NotInstalled

if TYPE_CHECKING:
    from ._connections import ConnectionCache, Held


class RawExecutor:
    """Runs compiled SQL straight on a driver connection in autocommit mode: a
    single-statement operation is one round trip, with no BEGIN/COMMIT around it."""

    __slots__ = ("_conn", "_backend", "_tx")

    def __init__(self, dbapi_conn: Any, backend: Backend) -> None:
        self._conn = dbapi_conn
        self._backend = backend
        self._tx = _Transaction(dbapi_conn, backend)

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()  # type: ignore[no-any-return]
        except Exception as exc:
            raise self._backend.translate_error_on(exc, self._conn) from exc

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        try:
            return self._conn.execute(sql, params).rowcount  # type: ignore[no-any-return]
        except Exception as exc:
            raise self._backend.translate_error_on(exc, self._conn) from exc

    def transaction(self) -> _Transaction:
        return self._tx

    def now(self) -> float | None:
        """No clock of its own: the operation's parameters carry its time."""
        return None


class _Transaction:
    """BEGIN on enter; COMMIT on a clean exit, ROLLBACK on an error (which propagates).
    ``saved``: what ``prepare_connection`` returned for the connection, if it prepared it."""

    __slots__ = ("_conn", "_backend", "_saved")

    def __init__(self, dbapi_conn: Any, backend: Backend, saved: Any = None) -> None:
        self._conn = dbapi_conn
        self._backend = backend
        self._saved = saved

    def __enter__(self) -> None:
        try:
            self._backend.begin(self._conn, self._saved)
        except Exception as exc:
            raise self._backend.translate_error_on(exc, self._conn) from exc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            try:
                self._backend.commit(self._conn)
                return
            except Exception as commit_error:
                self._rollback_quietly()
                raise self._backend.translate_error_on(commit_error, self._conn) from commit_error
        self._rollback_quietly()

    def _rollback_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the original error is the one worth raising
            self._backend.rollback(self._conn)


# Whatever the caller's engine, session or connection asks for (``stream_results=True``,
# ``yield_per``), our statements run on an ordinary cursor: a server-side cursor (psycopg,
# psycopg2) wraps the statement in DECLARE ... CURSOR FOR, which PostgreSQL refuses for an
# INSERT (a syntax error, and the caller's transaction aborted) and runs a SELECT only as
# far as it is fetched. (``yield_per`` turns ``stream_results`` on again at execution, so
# it is switched off too.)
_PLAIN_CURSOR = {"stream_results": False, "yield_per": None}


class SessionExecutor:
    """Runs compiled SQL on the caller's Connection, inside the caller's transaction
    (SQLAlchemy's events and echo still see every statement). The SQL was compiled for the
    connection's driver (``Backend.for_dialect``); this class serves the drivers that take
    named parameters in a dict (psycopg, psycopg2, sqlite3)."""

    __slots__ = ("_conn", "backend", "unregistered")

    def __init__(self, conn: Connection, backend: Backend, *, unregistered: bool = False) -> None:
        self._conn = conn
        self.backend = backend  # compiled for this connection's driver: run operations on it
        # no store is registered for the connection's engine: the defaults serve it
        self.unregistered = unregistered

    def _params(self, sql: str, params: Mapping[str, Any]) -> Any:
        return dict(params)

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        args = self._params(sql, params)
        began = self._driver_in_transaction()
        try:
            return [tuple(r) for r in self._conn.exec_driver_sql(sql, args, _PLAIN_CURSOR)]
        except Exception as exc:
            raise self._failed(exc, began) from exc

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        args = self._params(sql, params)
        began = self._driver_in_transaction()
        try:
            return self._conn.exec_driver_sql(sql, args, _PLAIN_CURSOR).rowcount
        except Exception as exc:
            raise self._failed(exc, began) from exc

    def _driver_in_transaction(self) -> bool:
        """Whether the driver has a transaction open (SQLite: sqlite3's and aiosqlite's
        ``in_transaction``); False where the failure itself says it (PostgreSQL)."""
        if self.backend.failure_aborts_transaction:
            return False
        try:
            return bool(getattr(self._conn.connection.driver_connection, "in_transaction", False))
        except Exception:  # noqa: BLE001 - no connection to ask: the statement will say why
            return False

    def _dbapi_connection(self) -> Any:
        """The driver connection under the caller's Connection (None when it has none)."""
        try:
            return self._conn.connection.dbapi_connection
        except Exception:  # noqa: BLE001 - closed or invalidated: the error says why
            return None

    def _failed(self, exc: Exception, began: bool) -> BaseException:
        """The alkstore error for ``exc``, after making sure the caller cannot commit a
        transaction the failure ended (SPEC §13): on PostgreSQL every failed statement
        aborts it; SQLite keeps it after most failures, but rolls the whole transaction
        back after some (an interrupt — ``sqlite3.Connection.interrupt()`` or a progress
        handler's time limit —, I/O errors, out of memory), and the caller's COMMIT would
        then succeed with nothing to commit: the caller's own rows lost without an error."""
        if self.backend.failure_aborts_transaction:
            _fail_transaction(self._conn)
        elif began and not self._driver_in_transaction():
            _fail_transaction(self._conn, lost=True)
        err = self.backend.translate_error_on(exc, self._dbapi_connection())
        if self.unregistered and type(err) is NotInstalled and self.backend.name == "postgresql":
            # the store may well be installed, in another schema, for another Engine object:
            # "run alkstore migrate" alone would install a second copy whose jobs it never sees
            again = NotInstalled(
                f"{err}. No Store is registered for this session's engine, so the default schema "
                f"{self.backend.schema!r} was used: if your store is on another schema or was made "
                "on another Engine object (from the URL, say), call store.register(engine) with "
                "the engine your sessions use"
            )
            again.__cause__ = err.__cause__
            return again
        return err

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """The caller's transaction is already the atomic unit (and SAVEPOINTs are unreliable
        under pysqlite's transaction handling), so nothing is added — unless the caller's
        SQLite connection runs in autocommit (``isolation_level="AUTOCOMMIT"``), where each
        statement would commit on its own: a publish's offset would then be visible before
        its event (a reader that moves past it never sees the event). There the operation
        gets a transaction of its own, as the store's own connections do. (PostgreSQL runs
        each caller's-transaction operation as one statement: nothing to add there.)"""
        if self.backend.failure_aborts_transaction or not self._driver_autocommit():
            return contextlib.nullcontext()
        return _CallerAutocommitTransaction(self)

    def _driver_autocommit(self) -> bool:
        """Whether the caller's SQLite driver connection is in autocommit with no transaction
        open (sqlite3's legacy ``isolation_level=None``, or Python 3.12's ``autocommit=True``);
        a transaction begun by the application's own ``BEGIN`` (SQLAlchemy's pysqlite recipe)
        is one to join, not to wrap."""
        try:
            driver: Any = self._conn.connection.driver_connection
            if getattr(driver, "in_transaction", True):
                return False
            return getattr(driver, "autocommit", None) is True or driver.isolation_level is None
        except Exception:  # noqa: BLE001 - no connection to ask: the statement will say why
            return False

    def now(self) -> float | None:
        """No clock of its own: the operation's parameters carry its time."""
        return None


class _CallerAutocommitTransaction:
    """BEGIN (the backend's: IMMEDIATE on SQLite) on the caller's autocommit connection,
    through SQLAlchemy (its events and echo see it); COMMIT on a clean exit, ROLLBACK on an
    error (which propagates)."""

    __slots__ = ("_ex",)

    def __init__(self, ex: SessionExecutor) -> None:
        self._ex = ex

    def __enter__(self) -> None:
        ex = self._ex
        try:
            ex._conn.exec_driver_sql(ex.backend.BEGIN)
        except Exception as exc:
            raise ex.backend.translate_error_on(exc, ex._dbapi_connection()) from exc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        ex = self._ex
        if exc_type is None:
            try:
                ex._conn.exec_driver_sql("COMMIT")
                return
            except Exception as commit_error:
                self._rollback_quietly()
                raise ex.backend.translate_error_on(commit_error, ex._dbapi_connection()) from commit_error
        self._rollback_quietly()

    def _rollback_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the original error is the one worth raising
            driver: Any = self._ex._conn.connection.driver_connection
            if driver.in_transaction:
                self._ex._conn.exec_driver_sql("ROLLBACK")


class PositionalSessionExecutor(SessionExecutor):
    """A SessionExecutor for a driver with positional ``$n`` parameters (asyncpg): the
    values go in the order the statement's compilation recorded."""

    __slots__ = ()

    def _params(self, sql: str, params: Mapping[str, Any]) -> Any:
        return tuple([params[name] for name in self.backend.positions(sql)])


def session_executor(conn: Connection, backend: Backend, *, unregistered: bool = False) -> SessionExecutor:
    """The executor for a caller's connection, given the backend compiled for its driver;
    ``unregistered``: no store is registered for the connection's engine."""
    if backend.positional:
        return PositionalSessionExecutor(conn, backend, unregistered=unregistered)
    return SessionExecutor(conn, backend, unregistered=unregistered)


def _fail_transaction(conn: Connection, *, lost: bool = False) -> None:
    """After a statement failed in the caller's transaction on PostgreSQL: the server has
    aborted that transaction, and a later COMMIT would be answered with a silent ROLLBACK —
    the caller's own rows lost with no error (every driver reports that COMMIT as a
    success). A guard on the connection refuses that commit until the caller rolls back
    (or back to a SAVEPOINT around the failure, which makes the transaction usable again).
    The connection itself is kept: invalidating it would make SQLAlchemy reconnect after
    the rollback *without* the Connection's own settings (an ``isolation_level`` or
    ``postgresql_readonly`` execution option: a SERIALIZABLE connection silently carrying
    on at READ COMMITTED). Nothing in autocommit, where no transaction was lost.
    ``lost``: the database has already rolled back the whole transaction, SAVEPOINTs
    included (SQLite), so later statements would run outside it: the connection is
    invalidated, and SQLAlchemy refuses everything until the caller rolls back."""
    try:
        autocommit = conn._is_autocommit_isolation()
    except AttributeError:  # a SQLAlchemy without it: treat as transactional (the safe side)
        autocommit = False
    if autocommit or not conn.in_transaction():
        return
    if not lost:
        _AbortedTransactionGuard.arm(conn)
        return
    with contextlib.suppress(Exception):  # the statement's own error is the one to raise
        conn.invalidate()


class CommitRefused(DatabaseError, PendingRollbackError):
    """The caller's COMMIT of a transaction an alkstore call's failure aborted: an
    alkstore ``DatabaseError`` and SQLAlchemy's ``PendingRollbackError`` (roll back)."""


class _AbortedTransactionGuard:
    """Refuses the COMMIT of a PostgreSQL transaction a failed call aborted, until it is
    rolled back: armed at the failure, disarmed by any rollback — a ROLLBACK TO SAVEPOINT
    after the failure can only name the savepoint the failure happened in or one around
    it, so it always undoes the failure. (Releasing a savepoint fails loudly by itself;
    a ``Connection.commit()`` with the savepoint still open, or the commit of the outer
    transaction a ``join_transaction_mode="create_savepoint"`` session runs in, sends
    COMMIT straight away.)"""

    __slots__ = ("armed",)

    _guards: weakref.WeakKeyDictionary[Connection, _AbortedTransactionGuard] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.armed = False

    @classmethod
    def arm(cls, conn: Connection) -> None:
        guard = cls._guards.get(conn)
        if guard is None:  # one set of listeners per Connection, however often it fails
            guard = cls._guards[conn] = cls()
            event.listen(conn, "commit", guard._on_commit)
            event.listen(conn, "rollback", guard._disarm)
            event.listen(conn, "rollback_savepoint", guard._disarm)
        guard.armed = True

    def _disarm(self, conn: Connection, *args: Any) -> None:
        self.armed = False

    def _on_commit(self, conn: Connection) -> None:
        if self.armed:
            self.armed = False
            # The transaction is lost already; end it at the driver now. SQLAlchemy keeps its
            # side of it after a failed commit, for the caller to roll back — but a
            # Connection closed without that rollback would go back to the pool unreset,
            # still inside the aborted transaction.
            try:
                conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - then the connection goes
                with contextlib.suppress(Exception):
                    conn.invalidate()
            raise CommitRefused(
                "COMMIT refused: an alkstore call failed in this transaction, and PostgreSQL "
                "aborted it there (a COMMIT would silently roll back your rows): roll back "
                "(or back to a savepoint around the failed call)"
            )


class Lease:
    """``with store.executor() as ex``: one of the store's connections for one operation,
    used as the operation's executor.

    ``retry=True`` marks an operation that may run a statement twice: on a disconnect
    (outside an explicit transaction) the statement is run once more on a fresh
    connection, after the whole cache was dropped. Only operations for which a second run
    is harmless even if the first one landed before the connection died may ask for it —
    the claim-fenced handle operations, idempotent deletes, reads (queue.py says why for
    each). Every other operation still never *sends* on a dead connection: the cache's
    liveness check and the pool's pre-ping catch those before the statement goes out.
    """

    __slots__ = ("_cache", "_held", "_retry", "_in_tx", "_clock")

    def __init__(
        self, cache: ConnectionCache, retry: bool = False, clock: Callable[[], float | None] | None = None
    ) -> None:
        self._cache = cache
        self._held: Held | None = None
        self._retry = retry
        self._in_tx = False
        self._clock = clock  # the store's: read again by an operation once it holds a lock (now())

    def now(self) -> float | None:
        """A fresh reading of the store's clock (None: the database's), for an operation that
        waited for a lock: on SQLite, ``BEGIN IMMEDIATE`` may wait up to the busy timeout
        while another connection writes, and a deadline from the reading taken before that
        wait could be past when it lands."""
        return None if self._clock is None else self._clock()

    def __enter__(self) -> Lease:
        self._held = self._cache.take()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held, self._held = self._held, None
        if held is None:  # a retry's checkout failed: nothing is held
            return
        cache = self._cache
        if exc is None:
            cache.give(held)
        elif cache.backend.is_disconnect(exc, held.dbapi):
            cache.disconnected(held, exc)
        elif isinstance(exc, AlkstoreError):
            cache.give(held)  # a refused statement: the connection is fine (and out of any transaction)
        else:
            cache.release(held)  # interrupted mid-operation: the pool resets it on return

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._held.execute(sql, params).fetchall()  # type: ignore[no-any-return,union-attr]
        except Exception as exc:
            return self._again(exc, sql, params, fetch=True)  # type: ignore[no-any-return]

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        try:
            return self._held.execute(sql, params).rowcount  # type: ignore[no-any-return,union-attr]
        except Exception as exc:
            return self._again(exc, sql, params, fetch=False)  # type: ignore[no-any-return]

    def _again(self, exc: Exception, sql: str, params: Mapping[str, Any], *, fetch: bool) -> Any:
        """Run the statement again once the lock ``exc`` said was taken is free (a statement
        outside a transaction, where the store waits for locks itself: SQLite in WAL mode);
        or once more on a fresh connection if this operation allows it and ``exc`` was a
        disconnect; else raise ``exc`` as an alkstore error."""
        held, backend = self._held, self._cache.backend
        assert held is not None
        if not self._in_tx and backend.waits_for_lock(exc, held.saved):
            run = held.execute
            try:
                if fetch:
                    return backend.wait_for_lock(held.dbapi, lambda: run(sql, params).fetchall(), exc, held.saved)
                return backend.wait_for_lock(held.dbapi, lambda: run(sql, params).rowcount, exc, held.saved)
            except Exception as again:
                raise backend.translate_error_on(again, held.dbapi) from again
        if not self._retry or self._in_tx or not backend.is_disconnect(exc, held.dbapi):
            raise backend.translate_error_on(exc, held.dbapi) from exc
        self._retry = False  # once per operation
        self._held = None
        self._cache.disconnected(held, exc)
        self._held = held = self._cache.take()
        try:
            cursor = held.execute(sql, params)
            return cursor.fetchall() if fetch else cursor.rowcount
        except Exception as again:
            raise backend.translate_error_on(again, held.dbapi) from again

    def storable_text(self, text: str) -> str:
        """``text`` as this connection's database can store it (``Core.storable_text``)."""
        held = self._held
        assert held is not None
        return self._cache.backend.storable_text(held.dbapi, text)

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction of its own, or, inside one already, that one: an operation
        that opens one (an enqueue with an expiry on SQLite) also runs inside another's
        (a scheduler's fire)."""
        return contextlib.nullcontext() if self._in_tx else _LeaseTransaction(self)

    def driver_connection(self) -> Any:
        """The leased driver connection, for a backend that drives it itself (PostgreSQL's
        pipelined statements); its errors are the backend's to translate."""
        held = self._held
        assert held is not None
        return held.dbapi


class _LeaseTransaction:
    """A write transaction on the lease's connection; statements inside it are never
    retried (the transaction died with the connection)."""

    __slots__ = ("_lease", "_tx")

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        held = lease._held
        assert held is not None
        self._tx = _Transaction(held.dbapi, lease._cache.backend, held.saved)

    def __enter__(self) -> None:
        self._tx.__enter__()
        self._lease._in_tx = True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._lease._in_tx = False
        self._tx.__exit__(exc_type, exc, tb)
