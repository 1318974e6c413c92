"""Executors: the store's own driver connections (cached, autocommit) and the caller's
SQLAlchemy Connection. Errors from either become alkstore errors here, via the backend.

The context managers are plain classes, not generators: they sit on every operation's
path, and a generator-based one costs several microseconds more per use.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ._backends import Backend


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
            raise self._backend.translate_error(exc) from exc

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        try:
            return self._conn.execute(sql, params).rowcount  # type: ignore[no-any-return]
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    def transaction(self) -> _Transaction:
        return self._tx


class _Transaction:
    """BEGIN on enter; COMMIT on a clean exit, ROLLBACK on an error (which propagates)."""

    __slots__ = ("_conn", "_backend")

    def __init__(self, dbapi_conn: Any, backend: Backend) -> None:
        self._conn = dbapi_conn
        self._backend = backend

    def __enter__(self) -> None:
        try:
            self._backend.begin(self._conn)
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            try:
                self._backend.commit(self._conn)
                return
            except Exception as commit_error:
                self._rollback_quietly()
                raise self._backend.translate_error(commit_error) from commit_error
        self._rollback_quietly()

    def _rollback_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the original error is the one worth raising
            self._backend.rollback(self._conn)


class SessionExecutor:
    """Runs compiled SQL on the caller's Connection, inside the caller's transaction
    (SQLAlchemy's events and echo still see every statement)."""

    __slots__ = ("_conn", "_backend")

    def __init__(self, conn: Connection, backend: Backend) -> None:
        self._conn = conn
        self._backend = backend

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return [tuple(r) for r in self._conn.exec_driver_sql(sql, dict(params))]
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        try:
            return self._conn.exec_driver_sql(sql, dict(params)).rowcount
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    def transaction(self) -> contextlib.nullcontext[None]:
        """The caller's transaction is already the atomic unit (and SAVEPOINTs are unreliable
        under pysqlite's transaction handling), so nothing is added."""
        return contextlib.nullcontext()


class _Held:
    __slots__ = ("proxied", "dbapi", "saved", "executor")

    def __init__(self, proxied: Any, dbapi: Any, saved: Any, backend: Backend) -> None:
        self.proxied, self.dbapi, self.saved = proxied, dbapi, saved
        self.executor = RawExecutor(dbapi, backend)


class Lease:
    """``with cache.lease() as ex``: one of the cache's connections for one operation."""

    __slots__ = ("_cache", "_held")

    def __init__(self, cache: ConnectionCache) -> None:
        self._cache = cache
        self._held: _Held | None = None

    def __enter__(self) -> RawExecutor:
        self._held = held = self._cache.take()
        return held.executor

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        held, self._held = self._held, None
        assert held is not None
        if exc is not None and self._cache.backend.is_disconnect(exc, held.dbapi):
            held.proxied.invalidate()
            return
        self._cache.give(held)


class ConnectionCache:
    """A few driver connections checked out of the engine's pool and kept, so an operation
    costs no pool checkout/return; the engine's pool (size, events, connect args) still
    creates them. Fork-aware: a child process never reuses its parent's sockets."""

    def __init__(self, engine: Engine, backend: Backend, max_idle: int = 4) -> None:
        self._engine = engine
        self.backend = backend
        self._max_idle = max_idle
        self._idle: list[_Held] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def lease(self) -> Lease:
        return Lease(self)

    def take(self) -> _Held:
        with self._lock:
            if self._pid != os.getpid():
                self._idle = []  # inherited across fork: never touch the parent's connections
                self._pid = os.getpid()
            if self._idle:
                return self._idle.pop()
        try:
            proxied = self._engine.raw_connection()
        except Exception as exc:
            raise self.backend.translate_error(exc) from exc
        dbapi = proxied.dbapi_connection
        return _Held(proxied, dbapi, self.backend.prepare_connection(dbapi), self.backend)

    def give(self, held: _Held) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < self._max_idle:
                self._idle.append(held)
                return
        self._release(held)

    def _release(self, held: _Held) -> None:
        try:
            self.backend.restore_connection(held.dbapi, held.saved)
            held.proxied.close()
        except Exception:  # noqa: BLE001 - a broken connection is simply dropped
            held.proxied.invalidate()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            same_process = self._pid == os.getpid()
        if same_process:
            for held in idle:
                self._release(held)

