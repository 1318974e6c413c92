"""Executors: the store's own driver connections (cached, autocommit) and the caller's
SQLAlchemy Connection. Errors from either become alkstore errors here, via the backend."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ._backends import Backend
from .errors import AlkstoreError


class RawExecutor:
    """Runs compiled SQL straight on a driver connection in autocommit mode: a
    single-statement operation is one round trip, with no BEGIN/COMMIT around it."""

    __slots__ = ("_conn", "_backend")

    def __init__(self, dbapi_conn: Any, backend: Backend) -> None:
        self._conn = dbapi_conn
        self._backend = backend

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()  # type: ignore[no-any-return]
        except AlkstoreError:
            raise
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int:
        try:
            return self._conn.execute(sql, params).rowcount  # type: ignore[no-any-return]
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc

    @contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self._backend.begin(self._conn):
                yield
        except AlkstoreError:
            raise
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc


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

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._conn.begin_nested():
            yield


class _Held:
    __slots__ = ("proxied", "dbapi", "saved")

    def __init__(self, proxied: Any, dbapi: Any, saved: Any) -> None:
        self.proxied, self.dbapi, self.saved = proxied, dbapi, saved


class ConnectionCache:
    """A few driver connections checked out of the engine's pool and kept, so an operation
    costs no pool checkout/return; the engine's pool (size, events, connect args) still
    creates them. Fork-aware: a child process never reuses its parent's sockets."""

    def __init__(self, engine: Engine, backend: Backend, max_idle: int = 4) -> None:
        self._engine = engine
        self._backend = backend
        self._max_idle = max_idle
        self._idle: list[_Held] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _take(self) -> _Held:
        with self._lock:
            if self._pid != os.getpid():
                self._idle = []  # inherited across fork: never touch the parent's connections
                self._pid = os.getpid()
            if self._idle:
                return self._idle.pop()
        try:
            proxied = self._engine.raw_connection()
        except Exception as exc:
            raise self._backend.translate_error(exc) from exc
        dbapi = proxied.dbapi_connection
        return _Held(proxied, dbapi, self._backend.prepare_connection(dbapi))

    def _give(self, held: _Held) -> None:
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < self._max_idle:
                self._idle.append(held)
                return
        self._release(held)

    def _release(self, held: _Held) -> None:
        try:
            self._backend.restore_connection(held.dbapi, held.saved)
            held.proxied.close()
        except Exception:
            held.proxied.invalidate()

    @contextmanager
    def executor(self) -> Iterator[RawExecutor]:
        held = self._take()
        try:
            yield RawExecutor(held.dbapi, self._backend)
        except BaseException as exc:
            if self._backend.is_disconnect(exc, held.dbapi):
                held.proxied.invalidate()
                raise
            self._give(held)
            raise
        self._give(held)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            same_process = self._pid == os.getpid()
        if same_process:
            for held in idle:
                self._release(held)
