"""Store: binds an engine, a schema and a clock; registers itself for the transactional
functions (_registry) and runs its own operations on connections kept under the engine's
pool rules (_connections)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.pool import NullPool
from sqlalchemy.util.concurrency import await_only, in_greenlet

from . import _registry
from . import _validate as v
from ._backends import Backend, backend_for
from ._conn import Lease, SessionExecutor, session_executor
from ._connections import ConnectionCache, orphan
from ._registry import DEFAULT_MAX_PAYLOAD
from ._registry import _DefaultStore as _DefaultStore  # re-exported: queue, transactional
from ._registry import store_for as store_for
from ._rows import job_from_row, ts
from ._sqlite import _SHARING_POOLS, _main_file, configure_sqlite_engine
from ._urls import engine_from_url, in_memory_sqlite, parse_url, shared_cache_sqlite, shown_url
from .errors import AlkstoreError, DatabaseError, InvalidOptions, StoreClosed
from .model import Job, QueueSettings, QueueStats, Schedule, WorkerInfo
from .schema import DEFAULT_SCHEMA

log = logging.getLogger("alkstore_sa")
T = TypeVar("T")

# seconds the schema check waits for listen_url's database to say which it is (no answer by
# then: not a verdict, checked again at the next check)
LISTEN_CHECK_WAIT = 5.0

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .locks import Lock
    from .notify import Subscription
    from .outbox import Outbox
    from .queue import Queue
    from .scheduler import Scheduler
    from .stop import StopToken
    from .streams import Stream

Clock = Callable[[], float]


class Store:
    """The handle on alkstore's tables in one database.

    ``clock=None`` takes every timestamp from the database's clock; a zero-argument callable
    returning epoch seconds becomes the single time source (read once per operation).
    Constructing a Store registers it for its engine, so ``alk.enqueue(session, ...)`` on a
    session bound to that engine uses this store's schema, clock and payload limit.
    Given an AsyncEngine, or an Engine of another PostgreSQL driver than psycopg 3, the store
    runs its own operations on an engine it makes from the same URL (SPEC §13).
    """

    def __init__(
        self,
        engine_or_url: Engine | AsyncEngine | str | URL,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        listen_url: Engine | str | URL | None = None,
    ) -> None:
        v.schema(schema)
        if clock is not None and not callable(clock):
            raise InvalidOptions("clock must be None or a zero-argument callable returning epoch seconds")
        v.max_payload_bytes(max_payload_bytes)
        engine, self._owns_engine, app_engine = _own_engine(engine_or_url)
        self.engine: Engine = engine
        self.schema = schema
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.backend: Backend = backend_for(engine.dialect.name, schema)
        if app_engine is not None:
            try:
                self.backend.for_dialect(app_engine.dialect)  # an unsupported driver fails here
            except InvalidOptions:
                engine.dispose()  # the store's own: made above, never used
                raise
        if self.backend.name == "sqlite":
            configure_sqlite_engine(engine)
            if app_engine is not None:  # the application's aiosqlite engine waits as long
                configure_sqlite_engine(app_engine)
        self._listen_engine, self._owns_listen_engine = self._listener_engine(listen_url)
        self._listen_checked = False  # that listen_url reaches this database (check_schema)
        # the check's read of listen_url's database, still under way: (pid, its result)
        self._listen_reading: tuple[int, concurrent.futures.Future[tuple[Any, ...]]] | None = None
        self._conns = ConnectionCache(engine, self.backend)
        self._hub: Any = None
        self._hub_pid = 0
        # guards starting the listener/watcher, which connects and reads (SQLite: under the
        # engine's pool_timeout and the busy timeout); replaced in a forked child
        # (_new_hub_locks_after_fork), where a thread of the parent may have held it at fork
        self._hub_lock = threading.Lock()
        _stores.add(self)
        self._closed = False
        self._schema_checked = False
        # queues this process found to have settings (SPEC §14): their claims go straight
        # to the limited path; a hint only (both claim paths check the database)
        self._limited_queues: set[str] = set()
        # engines register()ed besides our own: held weakly, as the registry holds them
        self._extra_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
        # engines whose connections reach this store's database (checked once per engine,
        # on the first caller's-transaction call through it: see session_executor)
        self._same_database: weakref.WeakSet[Engine] = weakref.WeakSet([_registry.root_engine(engine)])
        self._identity: tuple[Any, ...] | None = None
        _registry.register(self, engine)
        if app_engine is not None:
            # not taken on trust: the store's engine came from the app engine's URL, but the
            # app engine's connect_args (another driver's, not carried over) may name
            # another database; its first caller's-transaction call checks. The application's
            # engine serves the transactional forms:
            _registry.register(self, app_engine)
            self._extra_engines.add(_registry.root_engine(app_engine))
            self._conns.fresh_pool_at_fork(_registry.root_engine(app_engine))

    def _listener_engine(self, listen_url: Engine | str | URL | None) -> tuple[Engine | None, bool]:
        """Where the PostgreSQL listener connects when not through ``engine`` (a direct
        connection beside a transaction-mode pooler, which cannot carry LISTEN): an Engine as
        given, or one the store makes from a URL (NullPool: the listener holds its one
        connection for good) and disposes at ``close()``."""
        if listen_url is None:
            return None, False
        if self.backend.name != "postgresql":
            raise InvalidOptions("listen_url is for PostgreSQL stores (SQLite wakes through its watcher)")
        if isinstance(listen_url, Engine):
            if listen_url.dialect.name != "postgresql":
                raise InvalidOptions("listen_url must reach the same PostgreSQL database as the store")
            if listen_url.dialect.driver != "psycopg" or listen_url.dialect.is_async:
                # the listener speaks psycopg 3's connection (non-blocking, its pgconn): another
                # driver's connection would fail at every reconnect, and listen() after 30 s
                raise InvalidOptions(
                    f"listen_url as an Engine must use psycopg 3 (postgresql+psycopg), not "
                    f"{listen_url.dialect.name}+{listen_url.dialect.driver}: pass its URL instead "
                    f"(the store connects the listener through psycopg 3)"
                )
            return listen_url, False
        if isinstance(listen_url, (str, URL)):
            engine = engine_from_url(listen_url, poolclass=NullPool)
            if engine.dialect.name != "postgresql":
                engine.dispose()
                raise InvalidOptions("listen_url must be a PostgreSQL URL")
            return engine, True
        raise InvalidOptions("listen_url must be a URL or an Engine")

    # -- lifecycle -------------------------------------------------------------------------

    def install(self) -> None:
        """Run the packaged migrations to head (idempotent); the only DDL alkstore runs."""
        self._check_open()
        from .migrations import upgrade

        upgrade(self.engine, schema=self.schema)
        self._read_identity_ahead()
        self._schema_checked = True
        if self.backend.name == "sqlite":
            # install switched the file to WAL: connections opened before it kept the
            # stricter synchronous setting (the connect hook relaxes it only under WAL), so
            # the pool starts afresh and every later connection gets synchronous=NORMAL
            self.engine.dispose()

    def close(self) -> None:
        """Release the store's connections; every later operation raises StoreClosed."""
        if self._closed:
            return
        self._closed = True
        _registry.unregister(self, [self.engine, *self._extra_engines])
        with self._hub_lock:
            hub, self._hub = self._hub, None
        if hub is not None and self._hub_pid == os.getpid():
            hub.close()
        self._conns.close()
        if self._owns_engine:
            self.engine.dispose()
        if self._owns_listen_engine and self._listen_engine is not None:
            self._listen_engine.dispose()

    def register(self, engine: Any) -> None:
        """Also serve ``alk.enqueue(session, ...)`` and the other transactional functions
        on sessions bound to ``engine`` — another Engine on the same database (any supported
        driver), or an ``AsyncEngine`` (for ``await alk.aenqueue(async_session, ...)``)."""
        self._check_open()
        sync_engine = getattr(engine, "sync_engine", engine)
        if not isinstance(sync_engine, Engine) or sync_engine.dialect.name != self.engine.dialect.name:
            raise InvalidOptions("register() takes an Engine or AsyncEngine of the store's database kind")
        _refuse_unusable_sqlite_engine(sync_engine)  # never the store's database, which is a file
        self.backend.for_dialect(sync_engine.dialect)  # an unsupported driver fails here
        if self.backend.name == "sqlite":
            configure_sqlite_engine(sync_engine)  # the same busy timeout as the store's own
        _registry.register(self, sync_engine)
        self._extra_engines.add(_registry.root_engine(sync_engine))
        self._conns.fresh_pool_at_fork(_registry.root_engine(sync_engine))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<alkstore_sa.Store {shown_url(self.engine.url)!r} schema={self.schema!r}>"

    # -- handles ---------------------------------------------------------------------------

    def queue(
        self,
        name: str,
        *,
        visibility_timeout: v.Duration = 300,
        max_attempts: int = 3,
        backoff_base: v.Duration = 5,
        dead_letter_retention: v.Duration | None = None,
    ) -> Queue:
        """A handle on the queue ``name``; writes nothing. Its options are stamped onto
        every job it enqueues."""
        from .queue import Queue, QueueOpts

        self._check_open()
        opts = QueueOpts.validated(
            visibility_timeout=visibility_timeout,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            dead_letter_retention=dead_letter_retention,
        )
        return Queue(self, name, opts)

    def lock(self, name: str) -> Lock:
        """A handle on the lock ``name``; writes nothing."""
        from .locks import Lock

        self._check_open()
        return Lock(self, name)

    def stream(self, name: str) -> Stream:
        """A handle on the stream ``name``; writes nothing."""
        from .streams import Stream

        self._check_open()
        return Stream(self, name)

    def outbox(self, name: str) -> Outbox:
        """A handle on the outbox ``name``; writes nothing."""
        from .outbox import Outbox

        self._check_open()
        return Outbox(self, name)

    def schedule(
        self,
        name: str,
        spec: str,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        max_attempts: int | None = None,
        expires: v.Duration | None = None,
        tz: str = "UTC",
    ) -> None:
        """Create or update (by name) a schedule firing ``payload`` into ``queue`` at every
        boundary of ``spec``: ``@every <n><s|m|h|d>``, a 5-field cron expression or an
        ``@hourly``… alias, evaluated in the IANA zone ``tz`` (SPEC §14)."""
        self._scheduler().schedule(
            name, spec, queue, payload, priority=priority, max_attempts=max_attempts, expires=expires, tz=tz
        )

    def unschedule(self, name: str) -> bool:
        """Remove a schedule; False when there was none."""
        return self._scheduler().unschedule(name)

    def schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return self._scheduler().schedules()

    def run_schedules(self, stop: StopToken, *, lease: v.Duration = 30.0) -> None:
        """Fire schedules until ``stop`` while leading (waiting to lead meanwhile); raises
        LeadershipLost if the leadership lease lapsed or was taken."""
        self._scheduler().run(stop, lease=lease)

    def _scheduler(self) -> Scheduler:
        from .scheduler import Scheduler

        self._check_open()
        return Scheduler(self)

    def notify(self, channel: str, payload: str = "") -> None:
        """Send a notification on ``channel`` in its own transaction."""
        from .notify import notify_params

        self._check_open()
        params = notify_params(channel, payload)
        params["now"] = self.now()
        with self.executor() as ex:
            self.backend.notify(ex, params)

    def listen(self, channel: str) -> Subscription:
        """Subscribe to ``channel``; listening when this returns. A ``listen_url`` that
        reaches another database is refused here too (``InvalidOptions``): no other call of
        the store's need come first, and a subscription there would never receive anything."""
        from .notify import Subscription

        self._check_open()
        name = v.name(channel, "channel name", allow_reserved=True)
        self._check_listen_database()
        return Subscription(self, name)

    def hub(self) -> Any:
        """The store's one listener/watcher, started on first use (and again after a fork)."""
        self._check_open()
        with self._hub_lock:
            if self._hub is None or self._hub_pid != os.getpid():
                if self._hub is not None:
                    orphan(self._hub)  # the parent's (forked): never closed from here
                self._hub = self.backend.create_hub(self.engine, self._listen_engine, clock=self.now)
                self._hub_pid = os.getpid()
            return self._hub

    def queue_settings(self) -> dict[str, QueueSettings]:
        """The settings of every queue that has any (paused, or a limit), by name in code
        point order on both engines, as ``queue_stats()`` and ``schedules()`` (an SQL ORDER
        BY would follow PostgreSQL's collation: a linguistic one is blind to case and
        punctuation, and names are exact values)."""
        from ._limits import settings_from_row

        self._check_open()
        with self.executor(retry=True) as ex:  # a read
            rows = self.backend.queue_settings_all(ex, {})
        return {name: settings_from_row(tuple(rest)) for name, *rest in sorted(rows, key=lambda r: r[0])}

    def queue_stats(self) -> dict[str, QueueStats]:
        """Stats of every queue that has live or dead jobs, by name (one grouped pass over
        the tables: meant for operators, not for hot paths)."""
        with self.executor(retry=True) as ex:  # a read
            rows = self.backend.overview(ex, {"now": self.now()})
        (now,) = rows.pop(None)
        if now is None:
            now = time.time()
        return {
            name: QueueStats(
                pending=p, ready=r, processing=pr, dead=d,
                oldest_ready_age=None if oldest is None else max(0.0, now - oldest),
            )
            for name, (p, r, pr, d, oldest) in sorted(rows.items())
        }

    def workers(self) -> list[WorkerInfo]:
        """The running workers that refreshed their registry row recently enough (SPEC
        §15), oldest first; one that stopped refreshing is gone after three intervals."""
        self._check_open()
        with self.executor(retry=True) as ex:  # a read
            rows = self.backend.workers_live(ex, {"now": self.now()})
        return [
            WorkerInfo(
                id=wid, hostname=host, pid=_integer_as_stored(pid), queues=_queue_names(queues),
                concurrency=_integer_as_stored(concurrency), started_at=_utc(started), last_seen=_utc(seen),
            )
            for wid, host, pid, queues, concurrency, started, seen in rows
        ]

    def get_job(self, job_id: int) -> Job | None:
        """The job with this id, live or dead, in any queue; None when there is none."""
        row = self._job_row(job_id)
        return None if row is None else job_from_row(row)

    def _job_row(self, job_id: int) -> tuple[Any, ...] | None:
        """The row of ``get_job``, its payload not decoded (the dashboard, ``dead show``)."""
        self._check_open()
        job_id = v.job_id(job_id)
        if not v.in_int64(job_id):
            return None
        with self.executor(retry=True) as ex:  # a read
            return self.backend.get_job(ex, {"id": job_id}, by_queue=False)

    # -- internals shared by the handles ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed()

    def now(self) -> float | None:
        """This operation's one clock reading; None means 'the database clock' (PostgreSQL)."""
        if self.clock is not None:
            reading = self.clock()
            if isinstance(reading, bool) or not isinstance(reading, (int, float)) or not math.isfinite(reading):
                raise InvalidOptions(f"the store's clock returned {reading!r}, not finite epoch seconds")
            return float(reading)
        if self.backend.name == "sqlite":
            return time.time()
        return None

    def check_schema(self) -> None:
        """Fail fast unless the database holds this library's schema version:
        NotInstalled (no tables) or SchemaOutdated (older), naming the command that fixes it."""
        self._check_open()
        from .migrations import check_schema, plain_connection

        for last in (False, True):
            try:
                with plain_connection(self.engine) as conn:
                    check_schema(conn, self.schema)
                break
            except Exception as exc:
                if not last and _on_invalidated_connection(exc):
                    # a pooled connection the server had ended (a restart, idle_session_timeout):
                    # SQLAlchemy invalidated it and every older one, so the read runs again on
                    # a fresh one — as the store's own connections are replaced before use
                    continue
                if isinstance(exc, AlkstoreError):
                    raise  # NotInstalled, SchemaOutdated, SchemaTooNew, DatabaseError: the answer
                # a driver error, or none at all: the pool's TimeoutError when the application
                # holds every connection of a bounded pool (SPEC §3: an AlkstoreError either way)
                raise self.backend.translate_error(exc) from exc
        self._read_identity_ahead()
        self._check_listen_database()
        self._schema_checked = True

    def _check_listen_database(self) -> None:
        """A ``listen_url`` must reach the store's database: PostgreSQL delivers a NOTIFY only
        to the sessions listening in its own database (and a replica gets none), so a
        listener elsewhere never wakes anyone — silently, since its connection reaches a
        server directly and no round-trip probe runs. A listener that cannot connect now is
        left to its own retries (the worker polls meanwhile), and checked at the next check.

        The read runs in a thread of its own, waited for up to ``LISTEN_CHECK_WAIT``: a
        server that takes the connection but does not answer (packets dropped, a server
        stalled) held the store's first operation — an enqueue in a request, a worker's
        start — for the driver's connect timeout (psycopg's default: 130 s), where the
        listener only retries in the background. A reading still under way is waited for
        again by the next check rather than started anew."""
        if self._listen_engine is None or self._listen_checked:
            return
        reading = self._listen_reading
        if reading is None or reading[0] != os.getpid():  # a forked child: that thread is the parent's
            reading = (os.getpid(), _in_thread(self._read_listen_identity))
            self._listen_reading = reading
        try:
            theirs = reading[1].result(timeout=LISTEN_CHECK_WAIT)
        except concurrent.futures.TimeoutError:
            log.debug("alkstore could not check listen_url's database now: no answer within %gs", LISTEN_CHECK_WAIT)
            return
        except Exception as exc:  # noqa: BLE001 - unreachable now: not a configuration verdict
            self._listen_reading = None
            log.debug("alkstore could not check listen_url's database now (%s)", exc)
            return
        self._listen_reading = None
        if not self._is_own_database(theirs):
            own = self._own_identity(fresh=False)
            assert self._listen_engine is not None
            raise InvalidOptions(
                f"listen_url reaches another database than the store's: {theirs[0]!r} "
                f"({shown_url(self._listen_engine.url)}), not "
                f"{own[0]!r} ({shown_url(self.engine.url)}), or the "
                f"same name on another server (a replica). PostgreSQL delivers a NOTIFY only to "
                f"the sessions listening in its own database, so no worker would ever be woken "
                f"(each would poll every poll_interval): point listen_url at the store's database"
            )
        self._listen_checked = True

    def _read_listen_identity(self) -> tuple[Any, ...]:
        from .migrations import plain_connection

        assert self._listen_engine is not None
        with plain_connection(self._listen_engine) as conn:
            ex = session_executor(conn, self.backend.for_dialect(conn.dialect))
            return ex.backend.database_identity(ex)

    def _read_identity_ahead(self) -> None:
        """What the first caller's-transaction call through an engine besides the store's
        own compares its database with (session_executor), read at startup, while no
        transaction of the caller holds a connection. Read in that call, it needs a second
        connection at that moment, which a transaction pooler with every server connection
        held by such transactions never frees: a burst of first requests behind PgBouncer
        hung until they timed out."""
        if self._extra_engines and self._identity is None:
            self._own_identity(fresh=False)

    def executor(self, *, retry: bool = False) -> Lease:
        """``with store.executor() as ex``: one of the store's connections for one operation.

        ``retry=True``: the operation's statements may be run a second time on a fresh
        connection after a disconnect, because a second run is harmless even when the
        first one landed before the connection died (reads, idempotent or claim-fenced
        writes — see ``Lease``). Never for enqueues and other writes that would repeat."""
        if self._closed:
            raise StoreClosed()
        if not self._schema_checked:  # once per store: the first operation verifies the schema
            self.check_schema()
        return Lease(self._conns, retry, self.now)

    def session_executor(self, conn: Connection) -> SessionExecutor:
        """An executor on the caller's connection, with the backend compiled for its driver.

        The first call through an engine other than the store's own (a ``register()``ed one,
        or any session given a Queue handle of this store) checks that it reaches this
        store's database: InvalidOptions otherwise, before anything is written there (a job
        in another database, even one with alkstore installed, would never be claimed)."""
        self._check_open()
        ex = session_executor(conn, self.backend.for_dialect(conn.dialect))
        root = _registry.root_engine(conn.engine)
        if root not in self._same_database:
            self._check_same_database(ex, root)
        return ex

    def _check_same_database(self, ex: SessionExecutor, root: Engine) -> None:
        theirs = ex.backend.database_identity(ex)
        try:
            same = self._is_own_database(theirs)
        except DatabaseError as exc:
            # the store's side is read on a second connection while the caller's transaction
            # holds one: behind a transaction pooler whose server connections are all held
            # that way, the read waits until the pooler gives up, and its bare error
            # ("query_wait_timeout") says nothing of why the store read anything. Reading it
            # at startup avoids that wait; it does nothing for a database that is down.
            hint = (
                " Call store.check_schema() when the application starts, after any "
                "store.register(): it reads that beforehand, so no transaction of yours waits "
                "for a second connection here, which a transaction pooler may never give "
                "(docs/pgbouncer.md)"
            ) if _waited_for_a_connection(exc) else ""
            raise DatabaseError(
                f"{exc}: reading the store's database on one of its own connections failed (the "
                f"check, before this engine's first job is written, that it reaches that "
                f"database).{hint}",
                exc.orig,
            ) from exc
        if not same:
            raise InvalidOptions(
                f"this session's engine reaches another database than the store's "
                f"({shown_url(self.engine.url)}): a job written there "
                f"would never be claimed. Bind the session to that database, or use a store on "
                f"the session's own database"
            )
        self._same_database.add(root)

    def _is_own_database(self, theirs: tuple[Any, ...]) -> bool:
        """Whether ``theirs`` (a ``database_identity``) names the store's database: as last
        read, or as read afresh (the server restarted since that reading)."""
        return theirs == self._own_identity(fresh=False) or theirs == self._own_identity(fresh=True)

    def _own_identity(self, *, fresh: bool) -> tuple[Any, ...]:
        """The store's database as ``database_identity`` names it, read on one of the store's
        own connections (no schema check: it touches none of alkstore's tables); read
        again when ``fresh`` (a PostgreSQL server restarted since the last reading).

        Called from an ``a``-function (inside ``run_sync``, on the event loop's thread), the
        read runs in a worker thread while the loop waits for it: the store's connections
        are synchronous, and getting one may mean connecting, or waiting up to the pool's
        timeout, which would hold every other task of the loop."""
        if self._identity is None or fresh:
            if in_greenlet():
                self._identity = await_only(asyncio.to_thread(self._read_own_identity))
            else:
                self._identity = self._read_own_identity()
        return self._identity

    def _read_own_identity(self) -> tuple[Any, ...]:
        with Lease(self._conns) as own:
            return self.backend.database_identity(own)


def _waited_for_a_connection(exc: DatabaseError) -> bool:
    """Whether a read failed waiting for a connection to be free — a transaction pooler's
    ``query_wait_timeout``, or the pool's own TimeoutError — rather than because the
    database is down, cannot be opened or refused the statement."""
    orig = exc.orig
    return isinstance(orig, sa.exc.TimeoutError) or "query_wait_timeout" in str(orig)


def _in_thread(read: Callable[[], T]) -> concurrent.futures.Future[T]:
    """``read()`` in a daemon thread of its own: its result, or its exception, in a future
    (a daemon: a read that never gets an answer does not keep the process from exiting)."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(read())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            future.set_exception(exc)

    threading.Thread(target=run, name="alkstore-listen-check", daemon=True).start()
    return future


# Every Store made in this process, for the at-fork handler below.
_stores: weakref.WeakSet[Store] = weakref.WeakSet()


def _new_hub_locks_after_fork() -> None:
    """In a forked child: a fresh hub lock for every store. Another thread of the parent
    may have been starting a listener or watcher at fork time (a SQLite watcher connects
    and reads while holding the lock, which can take up to the pool's timeout); that thread
    does not exist in the child, so its lock would stay held for good, and the child's first
    ``listen()``, ``subscribe()``, worker wake-up or ``close()`` would wait forever."""
    for store in list(_stores):
        store._hub_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_hub_locks_after_fork)


# _SHARING_POOLS (from _sqlite, whose settings must not dispose of such a pool either):
# pools whose checkouts can get the connection another checkout holds (StaticPool: every
# checkout; SingletonThreadPool: every checkout of a thread; AssertionPool allows one at a
# time): a store operation there would run inside the application's open transaction, and
# its own commit or rollback would end the application's.


def _own_engine(given: Any) -> tuple[Engine, bool, Engine | None]:
    """The engine the store's own operations run on, whether the store made it (and so
    disposes it at close), and the application's engine when that is another one.

    The store's own connections speak psycopg 3 (PostgreSQL) or sqlite3 synchronously. An
    Engine of those is used as it is; for an AsyncEngine, a PostgreSQL Engine of another
    driver (psycopg2), or an Engine whose pool hands one connection to several checkouts
    at once (``_SHARING_POOLS``), the store makes its own engine on the same database from
    the URL — and registers the application's engine for the transactional forms (SPEC §13).
    """
    if isinstance(given, (str, URL)):
        url = parse_url(given)
        _refuse_unusable_sqlite(url)
        return engine_from_url(url), True, None  # postgres:// etc. mean psycopg 3 (SPEC §4)
    app = getattr(given, "sync_engine", given)  # an AsyncEngine's synchronous facade
    if not isinstance(app, Engine):
        raise InvalidOptions("Store needs a SQLAlchemy Engine, an AsyncEngine or a database URL")
    if (
        not app.dialect.is_async
        and (app.dialect.name != "postgresql" or app.dialect.driver == "psycopg")
        and not isinstance(app.pool, _SHARING_POOLS)
    ):
        _refuse_unusable_sqlite_engine(app)
        return app, False, None
    if in_memory_sqlite(app.url) and not app.dialect.is_async and _opens_a_file(app):
        raise InvalidOptions(
            "this engine's URL names no database file (its creator= opens one) and the store "
            "cannot run on the engine itself (its pool hands one connection to several "
            "checkouts): make the store's engine on that file and register this one, "
            "Store(create_engine('sqlite:///PATH')).register(engine)"
        )
    _refuse_unusable_sqlite(app.url)
    if _has_own_creator(app):
        # the creator decides where the engine connects, whatever its URL says (nothing,
        # often: create_engine("postgresql+psycopg2://", creator=...)): an engine made from
        # that URL would run the store on whatever database the driver's defaults reach,
        # while the application's jobs go to the creator's — claimed by nobody
        raise InvalidOptions(
            "this engine connects through its own creator= (or async_creator=), so its URL "
            "does not say which database it reaches, and the store cannot run on the engine "
            "itself (an async or psycopg2 engine, or a pool that hands one connection to "
            "several checkouts): make the store's engine on that database and register this "
            "one, Store(create_engine('postgresql+psycopg://...' or 'sqlite:///PATH')).register(engine)"
        )
    if app.dialect.dispatch.do_connect:
        # as a creator: the hook decides how the engine connects (an IAM token, a vault
        # password, a database chosen at connect time), and an engine made from the URL
        # would connect without it: failing to log in, or reaching another database
        raise InvalidOptions(
            "this engine has a do_connect event listener, which decides how it connects (a "
            "token, a password, the database), and the store cannot run on the engine itself "
            "(an async or psycopg2 engine, or a pool that hands one connection to several "
            "checkouts), nor carry the listener over to an engine of another driver: make "
            "the store's engine, with the listener attached to it, and register this one, "
            "Store(create_engine('postgresql+psycopg://...' or 'sqlite:///PATH')).register(engine)"
        )
    try:
        # the application's pool rules (SPEC §4) carry over; its connect_args cannot (they
        # live in its pool's creator, and are another driver's): docs/connections.md
        own = engine_from_url(app.url, pool_pre_ping=app.pool._pre_ping, pool_recycle=app.pool._recycle)
    except InvalidOptions as exc:
        raise InvalidOptions(
            f"{exc}. The store runs its own operations through a synchronous driver (psycopg 3 "
            f"or sqlite3) on a URL made from the engine's; make that engine yourself and "
            f"register the application's: Store(create_engine(...)).register(engine)"
        ) from None
    return own, True, app


# How SQLAlchemy names the creator it makes from an engine's URL (create_engine's own
# ``connect``): any other is one the application passed (creator=, async_creator=).
_URL_CREATOR = getattr(getattr(sa.create_engine("sqlite://").pool, "_creator", None), "__qualname__", None)


def _has_own_creator(engine: Engine) -> bool:
    """Whether ``engine``'s pool connects through a creator of the application's."""
    name = getattr(getattr(engine.pool, "_creator", None), "__qualname__", None)
    return _URL_CREATOR is not None and name is not None and name != _URL_CREATOR


def _refuse_unusable_sqlite(url: URL) -> None:
    """InvalidOptions for an in-memory SQLite database, sync or async, and for one opened in
    shared-cache mode (``_refuse_shared_cache``). An in-memory database lives inside one
    connection (or one sqlite3 connection shared under StaticPool), while a store opens,
    closes and disposes its own connections and runs worker threads: install() would drop
    the database with its pool, and the worker's connections would each see another one."""
    if in_memory_sqlite(url):
        raise InvalidOptions(
            f"{shown_url(url)} is an in-memory SQLite database, private "
            "to one connection: a store opens its own connections (and its worker threads "
            "theirs), so it would lose or never see that database; use a database file "
            "(in tests, e.g. a file in pytest's tmp_path)"
        )
    _refuse_shared_cache(url)


def _refuse_unusable_sqlite_engine(engine: Engine) -> None:
    """``_refuse_unusable_sqlite`` for an Engine, whose URL may name no file while its
    ``creator=`` opens one: a sync engine's such URL is checked against the database a
    connection actually opened (SQLite's ``PRAGMA database_list``); an async engine's
    facade cannot connect here, so its URL's word stands."""
    if in_memory_sqlite(engine.url) and (engine.dialect.is_async or not _opens_a_file(engine)):
        _refuse_unusable_sqlite(engine.url)
    _refuse_shared_cache(engine.url)


def _refuse_shared_cache(url: URL) -> None:
    """InvalidOptions for a SQLite database opened in shared-cache mode (``cache=shared``).
    There the connections of one process share one cache and lock whole tables, and SQLite
    reports a taken table lock at once ('database table is locked'), never waiting the busy
    timeout: the store's watcher failed its looks and could not save its reading place (a
    listener then missed notifications the prune deleted), and writes failed in the
    caller's transaction. WAL mode already lets readers and the writer run together."""
    if shared_cache_sqlite(url):
        raise InvalidOptions(
            f"{shown_url(url)} opens the SQLite database with cache=shared: its connections "
            "lock whole tables and fail at once with 'database table is locked' instead of "
            "waiting, which the store's watcher and workers (and your own concurrent "
            "writes) cannot work with; drop cache=shared (in WAL mode readers and the "
            "writer already run together)"
        )


def _opens_a_file(engine: Engine) -> bool:
    """Whether the SQLite database ``engine``'s connections open is a file."""
    try:
        with engine.connect() as conn:
            return bool(_main_file(conn.connection.driver_connection))
    except Exception:  # noqa: BLE001 - cannot connect: the URL's word stands
        return False


def _on_invalidated_connection(exc: BaseException) -> bool:
    """Whether ``exc`` (or the error it was raised from) is SQLAlchemy's report of a
    disconnect, after which it has invalidated the connection and the pool's older ones."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, sa.exc.DBAPIError) and cause.connection_invalidated:
            return True
        cause = cause.__cause__
    return False


def _queue_names(text: str) -> tuple[str, ...]:
    """A registry row's ``queues`` (a JSON list of names, as a worker writes it) as names.
    A row written by hand (or by another tool) may hold anything: one that is not a list
    failed ``store.workers()``, and so ``alkstore status`` and the workers page for every
    worker. A list's items are names (any other item as its JSON text); anything else is
    one name, the text as stored."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return (text,)
    if not isinstance(value, list):
        return (text,)
    return tuple(item if isinstance(item, str) else json.dumps(item) for item in value)


def _integer_as_stored(value: Any) -> int | str:
    """A registry row's ``pid`` or ``concurrency`` (an integer, as a worker writes it).
    SQLite keeps whatever a hand-written UPDATE stores in an integer column: text, a
    fraction or an infinity failed ``store.workers()`` (a fraction was cut short). Anything
    but an integer is its text as stored."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return str(value)


def _utc(epoch: Any) -> datetime:
    """A stored timestamp as an aware UTC datetime (``ts``: one past the calendar, written
    by hand, is its first or last instant; text SQLite kept from a hand-written UPDATE,
    which names no instant either, the last, as NaN)."""
    try:
        seconds = float(epoch)
    except (TypeError, ValueError):
        seconds = math.nan
    value = ts(seconds)
    assert value is not None
    return value
