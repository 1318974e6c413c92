"""The store's own driver connections: checked out of the engine's pool and, where the
pool's rules allow, kept between operations — under those same rules.

Why a cache at all: checking a connection out of SQLAlchemy's pool and back costs about
12 µs, plus switching autocommit on and off; on the one-statement operations (an enqueue
on SQLite takes about 30 µs) that is 20–35 % of the throughput (docs/connections.md has
the measurements). So the cache is the pool's *extension*, never a way around it:

- ``pool_pre_ping`` engines, and pools that must not have connections pinned (``NullPool``
  and the other non-queue pools), get a checkout per operation: the pool pings, recycles
  and closes exactly as it does for the application's sessions.
- A cached connection is handed out only if the pool would hand it out: not past
  ``pool_recycle``, not opened before the pool's last invalidation (SQLAlchemy invalidates
  every older connection after a disconnect), from the engine's current pool (not one
  replaced by ``engine.dispose()``), and not visibly dead (the backend's no-round-trip
  liveness check: on PostgreSQL a readable idle socket is the server's goodbye).
- Never a connection the application is waiting for: on a bounded pool (``pool_size``
  plus ``max_overflow``) a connection is kept only while the pool could still hand out
  another, and once any checkout leaves the pool with nothing more to hand out, the idle
  ones go back to it at once (a ``checkout`` listener). The application's checkouts never
  time out on connections the store merely keeps.
- A disconnect drops the whole cache and invalidates the pool the way SQLAlchemy does.
- ``close()`` returns every connection: the idle ones at once, the ones in use when their
  operation ends (they never go back into the emptied cache).
- Interpreter exit: the idle connections of every open store go back to their pools
  (an ``atexit`` hook), so a script that never calls ``close()`` ends quietly. Left to the
  interpreter's teardown, SQLAlchemy would reset each one after the driver's modules are
  gone, and print an "Exception during reset" traceback for it (psycopg's rollback fails).
- Fork: a child never touches its parent's connections. An at-fork handler (plus a pid
  check on every checkout, in case a fork bypassed it) forgets the parent's cached
  connections and gives each engine with an open store a fresh pool — SQLAlchemy's own
  recipe, ``engine.dispose(close=False)``. The parent's connections and pool stay referenced
  in the child, never closed: closing a SQLite connection opened by the parent can delete
  data under the parent, and a PostgreSQL one would end the parent's session. Before a
  fork, the parent closes its idle SQLite connections (``close_idle_sqlite_before_fork``
  says why: SQLite's per-process lock bookkeeping is copied by fork).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool, QueuePool

from ._backends import Backend
from ._sqlite import _SHARING_POOLS
from .errors import StoreClosed

# What a forked child inherited and must never close or use: referenced until it exits.
_orphans: list[Any] = []
# Every live cache, so the at-fork handler can reach them.
_caches: weakref.WeakSet[ConnectionCache] = weakref.WeakSet()
# engine -> the pid its current pool belongs to (whose connections it may hold)
_pool_owner: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()

# Checkouts attempted for one operation when the pool keeps handing out dead connections
# (each failure invalidates everything older, so the second is normally a new connection).
_CHECKOUT_ATTEMPTS = 3


def orphan(thing: Any) -> None:
    """Keep something a forked child inherited (a connection, a pool, a listener) referenced
    for the child's lifetime, so it is never closed from the child."""
    _orphans.append(thing)


def _full(pool: Pool) -> bool:
    """Whether the pool has handed out every connection it may (a ``QueuePool`` with a
    bounded size and overflow): its next checkout waits for a checkin."""
    if not isinstance(pool, QueuePool):
        return False
    size, overflow = pool.size(), getattr(pool, "_max_overflow", -1)
    return size > 0 and overflow >= 0 and pool.checkedout() >= size + overflow


def _may_pin(pool: Pool) -> bool:
    """Whether connections may be kept checked out between operations: only for pools that
    hold several connections anyway, and only when the pool does not want to ping each
    checkout (that ping is the rule pre-ping engines ask for). (A store never runs on a pool
    that shares one connection between checkouts: store._SHARING_POOLS.)"""
    return isinstance(pool, QueuePool) and not getattr(pool, "_pre_ping", False)


class Held:
    """One connection checked out of the pool for the store: the pool's proxy, the driver
    connection, what ``prepare_connection`` changed, how a statement is run on it, and
    where it came from."""

    __slots__ = ("proxied", "dbapi", "saved", "execute", "pool", "generation", "pid", "alive", "pinnable")

    def __init__(self, proxied: Any, backend: Backend, pool: Pool, generation: int) -> None:
        self.proxied = proxied
        self.dbapi = proxied.dbapi_connection
        self.saved = backend.prepare_connection(self.dbapi)
        self.execute = backend.statement_runner(self.dbapi)
        self.pool = pool
        self.generation = generation
        self.pid = os.getpid()
        self.alive: Callable[[], bool] | None = backend.alive_check(self.dbapi)
        self.pinnable = _may_pin(pool)  # its pool's rule, asked once (give() runs per operation)

    def usable(self, pool: Pool) -> bool:
        """What the pool would check before handing this connection out again."""
        if self.pool is not pool:
            return False  # engine.dispose() replaced the pool: fresh connections wanted
        record = getattr(self.proxied, "_connection_record", None)
        if record is None or record.dbapi_connection is not self.dbapi:
            return False  # invalidated underneath us
        started = record.starttime
        if pool._invalidate_time > started:
            return False  # opened before a disconnect seen anywhere on this engine
        recycle = pool._recycle
        return not (recycle > -1 and time.time() - started > recycle)


class ConnectionCache:
    """Up to ``max_idle`` of the engine's connections kept between operations, under the
    engine's pool rules (see the module docstring)."""

    def __init__(self, engine: Engine, backend: Backend, max_idle: int = 4) -> None:
        self._engine = engine
        self.backend = backend
        self._max_idle = max_idle
        self._idle: list[Held] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._generation = 0  # bumped by a disconnect, close() and fork: older ones never return
        self._closed = False
        _caches.add(self)
        _pool_owner.setdefault(engine, self._pid)
        self._also_forked: weakref.WeakSet[Engine] = weakref.WeakSet()  # fresh_pool_at_fork()
        self._on_checkout = _returning_idle_when_full(weakref.ref(self))
        event.listen(engine, "checkout", self._on_checkout)

    # -- checkout / return -----------------------------------------------------------------

    def take(self) -> Held:
        """A connection for one operation: a cached one the pool would still hand out, else
        one checked out of the pool now."""
        if self._pid != os.getpid():
            self._forked()
        pool = self._engine.pool
        while True:
            with self._lock:
                if self._closed:
                    raise StoreClosed()
                if not self._idle:
                    break
                held = self._idle.pop()
                generation = self._generation
            if held.generation != generation or not held.usable(pool):
                self.release(held)  # back to its pool, which recycles it by its own rules
            elif held.alive is not None and not held.alive():
                self.disconnected(held)  # the server is gone or restarted: so is the rest
            else:
                return held
        return self._checkout(pool)

    def _checkout(self, pool: Pool) -> Held:
        attempt = 1
        while True:
            try:
                proxied = self._engine.raw_connection()
            except Exception as exc:
                raise self.backend.translate_error(exc) from exc
            try:
                held = Held(proxied, self.backend, pool, self._generation)
            except Exception as exc:
                # Making it ours runs its first statements: a connection the store never
                # used (the application's, the schema check's), ended by the server while
                # idle in the pool, fails here — dead as surely as one the liveness check
                # finds, and replaced the same way
                if attempt == _CHECKOUT_ATTEMPTS or not self.backend.is_disconnect(exc, proxied.dbapi_connection):
                    self._invalidate(proxied, exc)
                    raise self.backend.translate_error(exc) from exc
                self._disconnected(proxied, pool, exc)
                attempt += 1
                continue
            if held.alive is None or attempt == _CHECKOUT_ATTEMPTS or held.alive():
                return held  # (still dead after fresh attempts: the statement reports why)
            self.disconnected(held)  # a dead pooled connection: everything older goes too
            attempt += 1

    def give(self, held: Held) -> None:
        """The operation is over: keep the connection if the rules allow, else return it."""
        pid = os.getpid()
        if held.pid != pid:
            orphan(held)  # a parent's connection reached the child (forked mid-operation)
            return
        with self._lock:
            if (
                not self._closed
                and held.generation == self._generation
                and len(self._idle) < self._max_idle
                and held.pool is self._engine.pool
                and held.pinnable
                and not _full(held.pool)
            ):
                self._idle.append(held)
                return
        self.release(held)

    def release(self, held: Held) -> None:
        """Return a connection to the engine's pool (restored as the pool lent it)."""
        try:
            self.backend.restore_connection(held.dbapi, held.saved)
            held.proxied.close()
        except Exception:  # noqa: BLE001 - a broken connection is simply dropped
            self._invalidate(held.proxied, None)

    # -- disconnects, close, fork ----------------------------------------------------------

    def disconnected(self, held: Held, exc: BaseException | None = None) -> None:
        """``held`` turned out dead. The pool's rule: invalidate it and every connection
        opened before it (likely dead too: the server restarted or cut them). The whole
        cache goes; connections in use by other operations are returned, not re-cached."""
        self._disconnected(held.proxied, held.pool, exc)

    def _disconnected(self, proxied: Any, pool: Pool, exc: BaseException | None) -> None:
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        self._invalidate(proxied, exc, pool=pool)
        for other in idle:
            with contextlib.suppress(Exception):
                other.proxied.invalidate()

    @staticmethod
    def _invalidate(proxied: Any, exc: BaseException | None, pool: Pool | None = None) -> None:
        with contextlib.suppress(Exception):  # closing a dead connection may fail: it is gone either way
            target = pool if pool is not None else proxied._pool
            target._invalidate(proxied, exc if isinstance(exc, Exception) else None)

    def close(self) -> None:
        """Return every idle connection now; those in use go back when their operation
        ends (``give`` sees the cache closed)."""
        with contextlib.suppress(Exception):  # a listener the engine no longer has
            event.remove(self._engine, "checkout", self._on_checkout)
        with self._lock:
            self._closed = True
            self._generation += 1
            idle, self._idle = self._idle, []
        if self._pid != os.getpid():
            return  # the parent's (already orphaned by _forked)
        for held in idle:
            self.release(held)

    def return_idle(self) -> None:
        """Return the idle connections to the pool now, and the ones in use when their
        operation ends; the cache stays open (the next operation checks one out)."""
        if self._pid != os.getpid():
            return  # the parent's: never touched from a child
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for held in idle:
            self.release(held)

    def _forked(self) -> None:
        """In a forked child: forget the parent's connections without touching them, and
        give the engine a pool of the child's own. Runs in the at-fork handler, so it takes
        no lock (another thread may have held one at fork time: it stays held forever)."""
        self._lock = threading.Lock()
        orphan(self._idle)
        self._idle = []
        self._generation += 1
        pid = self._pid = os.getpid()
        for engine in (self._engine, *self._also_forked):
            _fresh_pool(engine, pid)

    def close_idle_sqlite_before_fork(self) -> None:
        """(In the parent, about to fork.) Close the idle connections of the SQLite engines
        this store serves: its kept ones and those its engines' pools hold.

        SQLite keeps its lock bookkeeping per process (which connection of the process holds
        which of the file's locks), and a fork copies it. A child whose parent had a
        connection open to the file believes its own new connections already hold the
        file's shared locks, so they never take them: when the parent later closed its last
        connection (``store.close()``, ``engine.dispose()``, the parent exiting), SQLite saw
        no other process on the file, checkpointed and deleted the WAL, and the child's
        later commits went to the deleted file — lost. Connections in use at the fork
        (another thread's operation, the watcher of a running subscription or worker) cannot
        be closed here: docs/connections.md says what that leaves."""
        if self.backend.name != "sqlite" or self._closed or self._pid != os.getpid():
            return
        self.return_idle()
        for engine in (self._engine, *self._also_forked):
            # only where idle means idle: a sharing pool's one connection may be carrying
            # the application's transaction, and an async engine's cannot be closed here
            if not engine.dialect.is_async and not isinstance(engine.pool, _SHARING_POOLS):
                engine.dispose()  # idle connections closed; those in use go back to the old pool

    def fresh_pool_at_fork(self, engine: Engine) -> None:
        """Give ``engine`` too a pool of the child's own in a forked child: an application
        engine the store serves but does not run on (psycopg2, an AsyncEngine, any engine
        ``register()``ed), whose sessions would otherwise use the parent's connections."""
        _pool_owner.setdefault(engine, self._pid)
        self._also_forked.add(engine)


def _fresh_pool(engine: Engine, pid: int) -> None:
    """(In a forked child.) SQLAlchemy's fork recipe, once per engine: a new pool, the
    parent's left untouched and referenced."""
    if _pool_owner.get(engine) != pid:
        orphan(engine.pool)
        engine.dispose(close=False)  # no I/O: an AsyncEngine's facade is reset the same way
        _pool_owner[engine] = pid


def _before_fork() -> None:
    for cache in list(_caches):
        with contextlib.suppress(Exception):  # never keeps the fork from happening
            cache.close_idle_sqlite_before_fork()


def _after_fork_in_child() -> None:
    for cache in list(_caches):
        if not cache._closed:  # a closed store's engine is no longer the store's business
            cache._forked()


def _returning_idle_when_full(cache: weakref.ref[ConnectionCache]) -> Callable[..., None]:
    """A pool ``checkout`` listener: once a checkout (the application's or the store's)
    leaves the pool with nothing more to hand out, the store's idle connections go back
    to it, so a checkout that would have to wait gets one of them."""

    def on_checkout(_dbapi: Any, _record: Any, _proxy: Any) -> None:
        c = cache()
        if c is not None and c._idle and _full(c._engine.pool):
            c.return_idle()

    return on_checkout


def _return_idle_at_exit() -> None:
    for cache in list(_caches):
        cache.return_idle()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
atexit.register(_return_idle_at_exit)
