"""PostgreSQL LISTEN/NOTIFY: one dedicated autocommit connection per store, on one thread,
fanning notifications out to subscriptions. It reconnects and re-LISTENs on its own after
the connection is lost (notifications sent meanwhile are lost: wakes are never replayed,
which is why every wake-driven loop also re-polls).

Nothing the thread does can block without a bound: every statement it sends (LISTEN,
UNLISTEN, the idle health check) must be answered within ``HEALTH_CHECK_TIMEOUT`` or the
connection is declared dead, and the socket carries TCP keepalives and a
``TCP_USER_TIMEOUT``, so a half-open connection is found in well under a minute (the
bounded I/O is in ``pg_wire``). It waits with ``selectors`` (poll), never ``select()``,
which fails for descriptors >= 1024."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import selectors
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .._fanout import Deliver, FanOut, new_selector
from ..errors import DatabaseError, StoreClosed
from .pg_wire import ListenConnection, idle_alive_check, tune_socket

log = logging.getLogger("alkstore_sa")

# Module-level so that an application (or a test) can tune them; read at each use.
HEALTH_CHECK_INTERVAL = 30.0  # idle seconds before the listener checks its connection
HEALTH_CHECK_TIMEOUT = 10.0  # seconds any statement of the listener may wait for its answer
LISTEN_TIMEOUT = 30.0  # how long listen() waits for a listener that cannot connect
# an unsettled presence (an enqueue that may have missed it is still uncommitted): the
# listener tries the barrier again after this long, doubling up to SETTLE_RETRY_MAX
SETTLE_RETRY, SETTLE_RETRY_MAX = 0.001, 0.016
PROBE_TIMEOUT = 10.0  # how long the round-trip probe waits for its own notification
PROBE_ROUNDS = 2  # round trips in a row that must miss before the probe rules "LISTEN does not work"
PROBE_RETRY, PROBE_RETRY_MAX = 1.0, 30.0  # a probe that could not notify tries again (doubling)
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3  # seconds, seconds, probes
TCP_USER_TIMEOUT_MS = 30_000  # unacknowledged data older than this kills the connection
CHECKOUT_ATTEMPTS = 3  # pooled connections tried at connect (each dead one invalidates all older)

_PROBE_WARNING = (
    "alkstore: LISTEN does not work through this connection: %d probe notifications sent "
    "from another connection did not arrive, each within %.0fs (PgBouncer in transaction pooling "
    "mode?). Workers and stream subscribers fall back to polling every poll_interval and "
    "store.listen() receives nothing; give the listener a direct connection (docs/pgbouncer.md)."
)


def _health_check_interval(conn: ListenConnection) -> float:
    """Idle seconds before the health check: ``HEALTH_CHECK_INTERVAL``, or a third of the
    server's ``idle_session_timeout`` when that is shorter — the LISTEN connection idles
    by design, and a session the server ends loses the notifications sent until the
    listener is back. (Never more often than every 0.1 s: a timeout of a few milliseconds
    cannot be kept up with, and the checks would keep the server busy.)"""
    return min(HEALTH_CHECK_INTERVAL, max(conn.idle_limit / 3, 0.1))


class PgHub:
    """Owns the LISTEN connection; subscribe() returns once the channel is LISTENed.

    ``listen_engine`` (default: ``engine``) is where the listener connects — a direct
    connection when the application's engine goes through a transaction pooler."""

    def __init__(self, engine: Engine, listen_engine: Engine | None = None) -> None:
        self._engine = engine
        self._listen_engine = listen_engine or engine
        self.fanout = FanOut()
        # the wake keys of the queue and stream watches (woken after every reconnection), with
        # how many watches each has: a key goes when its last watch does (guarded by _state)
        self._queue_keys: dict[str, int] = {}
        self._commands: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._pipe_lock = threading.Lock()  # no write to the pipe once close() closed it
        self._closed = threading.Event()
        # _state guards what subscribers wait on: the keys LISTENed on the live connection,
        # and how many connection attempts failed (a watch stops waiting on a failure)
        self._state = threading.Condition()
        self._active: set[str] = set()
        # wake presence (advertise): the queue keys asked for and not yet taken, those whose
        # shared presence lock the live connection holds, and for those whose barrier has
        # not passed yet, when to try it again and the delay after that; the keys whose
        # lock is to be given back (a wake arrived: the waiter it announced waits no more)
        self._asked: set[str] = set()
        # asked before the probe's verdict: a presence is a session lock, and through a
        # transaction pooler the "session" is whichever server connection ran it (the lock
        # would stay there for other clients), so it is taken only once LISTEN is known to work
        self._deferred: set[str] = set()
        self._held: set[str] = set()
        self._unsettled: dict[str, tuple[float, float]] = {}
        self._release: set[str] = set()
        self._failures = 0
        self._last_error = "not connected yet"
        self._conn: ListenConnection | None = None
        self._generation = 0  # connections made so far: a probe spanning a reconnect proves nothing
        self._probe_key = "__alkstore_probe_" + uuid.uuid4().hex
        self._probe_seen = threading.Event()
        # set while the live connection LISTENs on the probe channel (from the end of its
        # connect until it is lost): only then can a probe's notification arrive
        self._probe_ready = threading.Event()
        self._probe_thread: threading.Thread | None = None
        # the round-trip probe's verdict: None until it ran, False where notifications do
        # not come through (PgBouncer's transaction pooling; logged once as a WARNING)
        self.listen_works: bool | None = None
        self._thread = threading.Thread(target=self._run, name="alkstore-pg-listener", daemon=True)
        self._thread.start()

    @property
    def backend_pid(self) -> int | None:
        """The listener connection's server process id, None while disconnected
        (diagnostics: find it in ``pg_stat_activity``)."""
        conn = self._conn
        return None if conn is None else conn.backend_pid

    # -- caller side -------------------------------------------------------------------

    def subscribe(self, key: str, deliver: Deliver, on_close: Callable[[], None] | None = None) -> int:
        """Register ``deliver`` and return once ``key`` is LISTENed on a live connection —
        also when another subscriber's LISTEN of it is still in flight. A listener that
        cannot get there within ``LISTEN_TIMEOUT`` raises DatabaseError (registration undone).
        ``on_close`` runs once when the hub closes (the store closed)."""
        return self._register(key, deliver, strict=True, on_close=on_close)

    def unsubscribe(self, key: str, token: int) -> None:
        if self.fanout.remove(key, token):
            self._send("unlisten", key)

    def watch_queue(self, key: str, wake: Any) -> int:
        """Call ``wake()`` on every committed enqueue to the queue whose wake channel is
        ``key`` — and after every reconnection, since wakes sent meanwhile were lost.
        Never fails for an unreachable database: the watch stays registered, is LISTENed
        when the listener connects, and the consumer's re-poll covers the gap."""
        with self._state:
            self._queue_keys[key] = self._queue_keys.get(key, 0) + 1
        try:
            return self._register(key, lambda _seq, _payload: wake(), strict=False)
        except BaseException:
            self._unwatched(key)
            raise

    def unwatch_queue(self, key: str, token: int) -> None:
        self.unsubscribe(key, token)
        self._unwatched(key)

    def _unwatched(self, key: str) -> None:
        with self._state:
            left = self._queue_keys.get(key, 0) - 1
            if left > 0:
                self._queue_keys[key] = left
            else:
                self._queue_keys.pop(key, None)

    def _watched_keys(self) -> list[str]:
        with self._state:
            return list(self._queue_keys)

    def advertise(self, key: str) -> None:
        """Say that a consumer of the queue whose wake channel is ``key`` found it empty and
        now waits for a wake: enqueues into it notify only while some listener advertises
        (docs/performance.md, "Wakes"). Never waits: the listener thread takes the presence.

        Presence is one-shot: the next wake of the queue withdraws it, and the consumer
        advertises again when it next finds the queue empty. An enqueue that looked before
        the presence was taken found nobody waiting; once every such enqueue has committed
        (the barrier, tried again until it passes), the queue's consumers here get one
        wake: their claim once more sees those jobs. A listener that is down takes nothing:
        the consumers' re-poll covers."""
        with self._state:
            if self.listen_works is False:
                return  # behind a transaction pooler: no wake would arrive, and a session lock is not ours
            if key in self._asked or key in self._held or key not in self._active or self._closed.is_set():
                return
            self._asked.add(key)
            if self.listen_works is None:
                self._deferred.add(key)  # taken when the probe passes (``_verdict``)
                return
        self._send("hold", key)

    # a stream's publishes wake its subscribers exactly like enqueues wake a queue's consumers
    watch_stream = watch_queue
    unwatch_stream = unwatch_queue

    def close(self) -> None:
        """Stop the listener; queue and stream watchers get one last wake so that waiting
        loops notice the closed store now rather than at their next re-poll, and every
        subscription its ``on_close``."""
        with self._pipe_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            os.write(self._wake_w, b"x")
        with self._state:
            self._state.notify_all()
        self._probe_seen.set()  # a probe in progress stops waiting (and judges nothing)
        self._probe_ready.set()  # (and one waiting for a connection stops too)
        self._thread.join(timeout=5)
        if self._probe_thread is not None:
            self._probe_thread.join(timeout=5)  # it may hold one of the engine's connections
        with self._pipe_lock:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        for key in self._watched_keys():
            self.fanout.dispatch(key, 0, "")
        self.fanout.close()

    def _register(
        self, key: str, deliver: Deliver, *, strict: bool, on_close: Callable[[], None] | None = None
    ) -> int:
        if self._closed.is_set():
            raise StoreClosed()
        token, first = self.fanout.add(key, deliver, on_close)
        if first:
            self._send("listen", key)
        try:
            self._await_listen(key, strict)
        except BaseException:
            self.unsubscribe(key, token)
            raise
        return token

    def _await_listen(self, key: str, strict: bool) -> None:
        deadline = time.monotonic() + LISTEN_TIMEOUT
        with self._state:
            failures = self._failures
            while key not in self._active:
                if self._closed.is_set():
                    raise StoreClosed()
                if not strict and self._failures != failures:
                    return  # the listener is down: LISTENed (and woken) once it reconnects
                left = deadline - time.monotonic()
                if left <= 0:
                    if not strict:
                        return
                    raise DatabaseError(
                        f"could not LISTEN within {LISTEN_TIMEOUT:g}s: the listener connection "
                        f"is not available ({self._last_error})"
                    )
                self._state.wait(left)

    def _send(self, op: str, key: str) -> None:
        with self._pipe_lock:
            if self._closed.is_set():
                return  # nothing to LISTEN/UNLISTEN any more
            self._commands.put((op, key))
            os.write(self._wake_w, b"x")

    # -- listener thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.05
        down_since: float | None = None
        while not self._closed.is_set():
            try:
                conn = self._connect()
                if down_since is not None:
                    log.info("alkstore listener reconnected after %.1fs", time.monotonic() - down_since)
                down_since, backoff = None, 0.05
                self._loop(conn)
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                if self._closed.is_set():
                    break
                self._lost(exc)
                if down_since is None:  # once per outage, not per attempt
                    down_since = time.monotonic()
                    log.warning("alkstore listener connection lost (%s); reconnecting", exc)
                else:
                    log.debug("alkstore listener still cannot connect (%s)", exc)
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._drop()

    def _checkout(self) -> Any:
        """A connection of the listen engine's pool, ours for good (detached: not returned
        to the application's pool). One the server ended while it idled there (a restart,
        pg_terminate_backend, ``idle_session_timeout``) is invalidated with every older one
        — SQLAlchemy's rule after a disconnect — and another taken, so the listener does not
        start on it (a 'connection lost', and a reconnect backoff, per dead connection)."""
        pool = self._listen_engine.pool
        for _ in range(CHECKOUT_ATTEMPTS - 1):
            proxied = self._listen_engine.raw_connection()
            if idle_alive_check(proxied.dbapi_connection)():
                break
            pool._invalidate(proxied, None)
        else:
            proxied = self._listen_engine.raw_connection()  # (still dead: its first statement says why)
        proxied.detach()
        return proxied

    def _connect(self) -> ListenConnection:
        proxied = self._checkout()
        self._conn = conn = ListenConnection(proxied.dbapi_connection, self._dispatch)
        self._generation += 1
        tune_socket(
            conn.fileno, idle=KEEPALIVE_IDLE, interval=KEEPALIVE_INTERVAL, count=KEEPALIVE_COUNT,
            user_timeout_ms=TCP_USER_TIMEOUT_MS,
        )
        conn.read_idle_limit(HEALTH_CHECK_TIMEOUT)
        if self.listen_works is None and conn.reaches_server_directly(HEALTH_CHECK_TIMEOUT):
            # the session is this connection's own: LISTEN works and a presence lock stays
            # ours, known now rather than after a round trip whose notification a loaded
            # machine may hold up past the probe's bound (no probe: it could only be wrong)
            self._verdict(True)
        probe = self.listen_works is None and self._probe_thread is None  # one probe, run until a verdict
        if self.listen_works is None:  # first, so the last query shown is a real LISTEN
            self._execute("LISTEN", self._probe_key)  # also for a probe running since the last connection
        for key in self.fanout.channel_keys():
            self._listen(key)
        self._drain_commands()
        for key in self._watched_keys():
            self.fanout.dispatch(key, 0, "")
        self._probe_ready.set()
        if probe:
            self._probe_thread = threading.Thread(target=self._run_probe, name="alkstore-listen-probe", daemon=True)
            self._probe_thread.start()
        return conn

    def _lost(self, exc: BaseException) -> None:
        self._probe_ready.clear()
        if self._closed.is_set():
            # close() set it (after setting _closed) for a probe waiting on it, maybe just
            # before this clear: it stays set, or that probe waits for good
            self._probe_ready.set()
        self._drop()
        with self._state:
            self._active.clear()
            self._held.clear()  # the session's locks went with it
            self._asked.clear()
            self._deferred.clear()
            self._unsettled.clear()
            self._release.clear()
            self._failures += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            self._state.notify_all()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _listen(self, key: str) -> None:
        if not self.fanout.has(key) or key in self._active:
            return
        if self.listen_works is not False:
            self._execute("LISTEN", key)
        # else behind a transaction pooler (the probe): a LISTEN would register whichever
        # server connection ran it, which then gets the channel's notifications while idle in
        # the pool or hands them to another client; nothing would come here anyway
        with self._state:
            self._active.add(key)
            self._state.notify_all()

    def _unlisten(self, key: str) -> None:
        with self._state:
            # Atomic with a new subscriber's "add, then check _active": either it was added
            # before this check (nothing to do), or it waits for its own queued LISTEN.
            if self.fanout.has(key) or key not in self._active:
                return
            self._active.discard(key)
            held = key in self._held
            self._forget(key)
        if held:
            self._release_presence(key)
        if self.listen_works is not False:  # (nothing was LISTENed: ``_listen``)
            self._execute("UNLISTEN", key)

    def _drain_commands(self) -> None:
        self._release_woken()
        while True:
            try:
                op, key = self._commands.get_nowait()
            except queue.Empty:
                return
            if op == "listen":
                self._listen(key)
            elif op == "hold":
                self._hold(key)
            else:
                self._unlisten(key)
            self._release_woken()

    def _hold(self, key: str) -> None:
        """Take the presence lock of ``key`` and try its barrier (an advertise)."""
        with self._state:
            self._asked.discard(key)
            kept = key in self._release
            if kept:  # its lock is still held: keep it instead of giving it back
                self._release.discard(key)
                self._held.add(key)
            elif key in self._held or key not in self._active:
                return
        if kept:
            self._settle(key)
            return
        settled = self._connection().hold_presence(key, HEALTH_CHECK_TIMEOUT)
        with self._state:
            self._held.add(key)
        self._settled(key, settled)

    def _settle(self, key: str) -> None:
        """Try the barrier of a held presence (again)."""
        with self._state:
            if key not in self._held:
                return  # withdrawn meanwhile (a wake: its consumers were woken)
        self._settled(key, self._connection().settle(key, HEALTH_CHECK_TIMEOUT))

    def _settled(self, key: str, settled: bool) -> None:
        """The barrier's verdict: passed — wake the queue's consumers here for their claim
        once more; not yet — try again after a delay (doubling, capped)."""
        with self._state:
            if key not in self._held:
                return  # withdrawn while the barrier was tried: its consumers were woken
            last = self._unsettled.pop(key, None)
            if not settled:
                delay = SETTLE_RETRY if last is None else min(last[1] * 2, SETTLE_RETRY_MAX)
                self._unsettled[key] = (time.monotonic() + delay, delay)
                return
        self.fanout.dispatch(key, 0, "")

    def _settle_due(self) -> None:
        """Try the barriers whose retry time has come."""
        now = time.monotonic()
        with self._state:
            due = [k for k, (at, _) in self._unsettled.items() if at <= now]
        for key in due:
            self._settle(key)

    def _next_settle(self) -> float | None:
        with self._state:
            return min((at for at, _ in self._unsettled.values()), default=None)

    def _connection(self) -> ListenConnection:
        if self._conn is None:
            raise ConnectionError("the listener has no connection")
        return self._conn

    def _forget(self, key: str) -> None:
        """Drop what is known of ``key``'s presence (caller holds ``_state``)."""
        self._held.discard(key)
        self._unsettled.pop(key, None)

    def _release_woken(self) -> None:
        """Give back the presence locks of the queues whose wake arrived (``_dispatch``)."""
        while self._release:
            self._release_presence(self._release.pop())

    def _release_presence(self, key: str) -> None:
        self._connection().release_presence(key, HEALTH_CHECK_TIMEOUT)

    def _loop(self, conn: ListenConnection) -> None:
        with new_selector() as sel:
            sel.register(conn.fileno, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._closed.is_set():
                interval = _health_check_interval(conn)
                now = time.monotonic()
                wait = conn.last_traffic + interval - now
                settle_at = self._next_settle()
                if settle_at is not None:
                    wait = min(wait, settle_at - now)
                ready = {k.fd for k, _ in sel.select(max(0.0, wait))}
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                if conn.fileno in ready:
                    conn.receive()
                self._drain_commands()
                self._settle_due()
                if time.monotonic() - conn.last_traffic >= interval:
                    # finds half-open connections, within a bound; and keeps the session
                    # from ending at the server's idle_session_timeout
                    self._execute("SELECT 1")

    def _execute(self, command: str, key: str | None = None) -> None:
        if self._conn is None:
            raise ConnectionError("the listener has no connection")
        self._conn.execute(command, key, HEALTH_CHECK_TIMEOUT)

    def _dispatch(self, key: str, payload: str) -> None:
        if key == self._probe_key:
            self._probe_seen.set()
            return
        with self._state:
            if key in self._held:  # withdrawn before anyone is woken: a re-advertise follows the wake
                self._forget(key)
                self._release.add(key)
        self.fanout.dispatch(key, 0, payload)

    # -- the round-trip probe ----------------------------------------------------------

    def _run_probe(self) -> None:
        """Notify the probe channel (LISTENed at connect) from another connection of the
        application's engine — the path every real notify takes — and warn once if it
        never arrives: behind a transaction pooler LISTEN is silently useless. Runs until
        there is a verdict (or the hub closes): a notify that failed is tried again, and so
        is a probe that spanned a reconnection (the LISTEN it relied on is gone)."""
        notify = sa.select(
            sa.func.pg_catalog.pg_notify(sa.bindparam("channel", type_=sa.Text), sa.literal_column("''"))
        )
        retry, missed = PROBE_RETRY, 0
        while True:
            self._probe_ready.wait()  # a connection LISTENs on the probe channel (or closed)
            if self.listen_works is not None:
                return  # a direct reconnection gave the verdict (and LISTENs on no probe channel)
            generation = self._generation
            if not self._probe_ready.is_set():
                continue  # lost meanwhile: that generation may be the next, not yet LISTENing
            self._probe_seen.clear()  # before the closed check: close() sets it after setting closed
            if self._closed.is_set():
                return
            try:
                with self._engine.begin() as conn:
                    conn.execute(notify, {"channel": self._probe_key})
            except Exception as exc:  # noqa: BLE001 - no verdict yet: try again
                log.debug("alkstore listener probe could not notify (%s)", exc)
                if self._closed.wait(retry):
                    return
                retry = min(retry * 2, PROBE_RETRY_MAX)
                continue
            arrived = self._probe_seen.wait(PROBE_TIMEOUT)
            if self._closed.is_set():
                return
            if arrived:
                self._verdict(True)
                return
            if self._generation != generation or not self._probe_ready.is_set():
                missed = 0  # reconnected meanwhile: probe the new connection
                continue
            missed += 1
            if missed == PROBE_ROUNDS:  # each round's notification, sent anew, missed its bound
                if self._verdict(False):
                    log.warning(_PROBE_WARNING, PROBE_ROUNDS, PROBE_TIMEOUT)
                return

    def _verdict(self, works: bool) -> bool:
        """Record whether LISTEN works here; the presences asked for meanwhile are taken
        now, or dropped (no wake would come through a transaction pooler). The first verdict
        stands: a probe still running when a direct reconnection gave one (that connection
        LISTENs on no probe channel) would otherwise rule against it. Whether it recorded."""
        with self._state:
            if self.listen_works is not None:
                return False
            self.listen_works = works
            deferred, self._deferred = self._deferred, set()
            if not works:
                self._asked -= deferred
        if works:
            for key in deferred:
                self._send("hold", key)
        return True
