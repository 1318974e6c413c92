"""PostgreSQL LISTEN/NOTIFY: one dedicated autocommit connection per store, on one thread,
fanning notifications out to subscriptions. It reconnects and re-LISTENs on its own after
the connection is lost (notifications sent meanwhile are lost: wakes are never replayed,
which is why every wake-driven loop also re-polls)."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from typing import Any

from sqlalchemy.engine import Engine

from .._fanout import Deliver, FanOut
from ..errors import DatabaseError, StoreClosed

log = logging.getLogger("alkstore_sa")

_HEALTH_CHECK_SECONDS = 30.0
_LISTEN_TIMEOUT = 30.0


class PgHub:
    """Owns the LISTEN connection; subscribe() returns once the channel is LISTENed."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.fanout = FanOut()
        self._queue_keys: set[str] = set()
        self._commands: queue.SimpleQueue[tuple[str, str, threading.Event]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._pipe_lock = threading.Lock()  # no write to the pipe once close() closed it
        self._closed = threading.Event()
        self._conn: Any = None
        self._listening: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="alkstore-pg-listener", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------

    def subscribe(self, key: str, deliver: Deliver) -> int:
        if self._closed.is_set():
            raise StoreClosed()
        token, first = self.fanout.add(key, deliver)
        if first:
            done = threading.Event()
            self._send("listen", key, done)
            if not done.wait(_LISTEN_TIMEOUT):
                self.fanout.remove(key, token)
                raise DatabaseError("could not LISTEN: the listener connection is not available")
        return token

    def unsubscribe(self, key: str, token: int) -> None:
        if self.fanout.remove(key, token):
            self._send("unlisten", key, threading.Event())

    def watch_queue(self, key: str, wake: Any) -> int:
        """Call ``wake()`` on every committed enqueue to the queue whose wake channel is
        ``key`` — and after every reconnection, since wakes sent meanwhile were lost."""
        self._queue_keys.add(key)
        return self.subscribe(key, lambda _seq, _payload: wake())

    def unwatch_queue(self, key: str, token: int) -> None:
        self.unsubscribe(key, token)

    # a stream's publishes wake its subscribers exactly like enqueues wake a queue's consumers
    watch_stream = watch_queue
    unwatch_stream = unwatch_queue

    def close(self) -> None:
        """Stop the listener; queue and stream watchers get one last wake so that waiting
        loops notice the closed store now rather than at their next re-poll."""
        with self._pipe_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with self._pipe_lock:
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1
        for key in list(self._queue_keys):
            self.fanout.dispatch(key, 0, "")

    def _send(self, op: str, key: str, done: threading.Event) -> None:
        with self._pipe_lock:
            if self._closed.is_set():
                done.set()  # nothing to LISTEN/UNLISTEN any more
                return
            self._commands.put((op, key, done))
            os.write(self._wake_w, b"x")

    # -- listener thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.05
        while not self._closed.is_set():
            try:
                self._connect()
                backoff = 0.05
                self._loop()
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect
                if self._closed.is_set():
                    break
                log.warning("alkstore listener connection lost (%s); reconnecting in %.2fs", exc, backoff)
                self._drop()
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._drop()

    def _connect(self) -> None:
        proxied = self._engine.raw_connection()
        proxied.detach()  # ours for good: not returned to the application's pool
        conn: Any = proxied.dbapi_connection
        conn.autocommit = True
        conn.add_notify_handler(self._on_notify)
        self._conn = conn
        self._listening = set()
        for key in self.fanout.channel_keys():
            self._listen(key)
        self._drain_commands()  # pending subscribers are satisfied by the re-LISTEN
        for key in list(self._queue_keys):
            self.fanout.dispatch(key, 0, "")

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken
                conn.close()

    def _listen(self, key: str) -> None:
        from psycopg import sql

        if key not in self._listening:
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(key)))
            self._listening.add(key)

    def _drain_commands(self) -> None:
        from psycopg import sql

        while True:
            try:
                op, key, done = self._commands.get_nowait()
            except queue.Empty:
                return
            if op == "listen" and self.fanout.has(key):
                self._listen(key)
            elif op == "unlisten" and not self.fanout.has(key) and key in self._listening:
                self._conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(key)))
                self._listening.discard(key)
            done.set()

    def _loop(self) -> None:
        conn = self._conn
        fd = conn.fileno()
        last_traffic = time.monotonic()
        while not self._closed.is_set():
            readable, _, _ = select.select([fd, self._wake_r], [], [], _HEALTH_CHECK_SECONDS)
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
                self._drain_commands()
            if fd in readable:
                last_traffic = time.monotonic()
                pgconn = conn.pgconn
                pgconn.consume_input()
                while (n := pgconn.notifies()) is not None:
                    self._dispatch(n.relname.decode(), n.extra.decode())
                if conn.closed or conn.broken or pgconn.status != 0:  # 0 = CONNECTION_OK
                    raise ConnectionError("listener connection closed by the server")
            elif not readable and time.monotonic() - last_traffic >= _HEALTH_CHECK_SECONDS:
                conn.execute("SELECT 1")  # finds half-open connections
                last_traffic = time.monotonic()

    def _on_notify(self, n: Any) -> None:
        self._dispatch(n.channel, n.payload)

    def _dispatch(self, key: str, payload: str) -> None:
        self.fanout.dispatch(key, 0, payload)
