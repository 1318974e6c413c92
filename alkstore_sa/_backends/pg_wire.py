"""The PostgreSQL listener's connection, driven through libpq's async API so that no call
can block without a bound: psycopg's own ``execute`` waits as long as the kernel keeps
retransmitting (about 16 minutes on a half-open connection). Waits use ``selectors``
(poll), never ``select()``, which fails for descriptors >= 1024. Internal."""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import select
import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._fanout import new_selector
from ..errors import DatabaseError

# Advisory-lock classes (first key of the two-int form; the second is hashtext(wake channel))
# of conditional wakes (docs/performance.md, "Wakes"; the enqueue side is in postgresql.py):
# - presence ("alkw"): a listener session holds it SHARED while a consumer of the queue waits
#   for a wake; an enqueue notifies only when it cannot take it EXCLUSIVE for an instant;
# - barrier ("alkb"): every enqueue holds it SHARED until it commits; a listener that has
#   just taken the presence takes it EXCLUSIVE for an instant — once it could, every enqueue
#   that looked for the presence before it was taken has committed, and one more claim sees it.
# The two-int form is a key space of its own: no bigint advisory lock can collide with it.
WAKE_PRESENCE_CLASS = 0x616C6B77
WAKE_BARRIER_CLASS = 0x616C6B62

# The server's view of a connection: its backend, and the two ends it sees (for
# ``reaches_server_directly``; the store's connections read one more column after these).
PEER_SQL = (
    "SELECT pg_catalog.pg_backend_pid(), pg_catalog.inet_client_addr(), pg_catalog.inet_client_port(),"
    " pg_catalog.inet_server_addr(), pg_catalog.inet_server_port()"
)


def reaches_server_directly(fd: int, row: Sequence[Any]) -> bool:
    """Whether the connection on socket ``fd``, whose server answered ``row`` to
    ``PEER_SQL``, reaches that server directly (no pooler or proxy in between): for TCP,
    the server sees our local address and port and we see its address and port (the whole
    connection, not the ports alone: a proxy listening on the server's port whose own
    connection happens to leave from our port number matches those); for a Unix socket,
    our peer is the postmaster that forked the backend. False when it cannot be shown
    (a NAT between us, for one: the safe side)."""
    backend_pid, client_addr, client_port, server_addr, server_port = row
    with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves fd open
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            ours, theirs = sock.getsockname(), sock.getpeername()
            return (
                (_address(client_addr), client_port) == (_address(ours[0]), ours[1])
                and (_address(server_addr), server_port) == (_address(theirs[0]), theirs[1])
            )
        if sock.family == socket.AF_UNIX and client_port is None and hasattr(socket, "SO_PEERCRED"):
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid = struct.unpack("3i", creds)[0]
            with open(f"/proc/{int(backend_pid)}/status") as status:
                parent = next(line for line in status if line.startswith("PPid:"))
            return peer_pid == int(parent.split()[1])
    return False


def _address(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address as one comparable value (an IPv4-mapped IPv6 address as the IPv4 one,
    a link-local scope dropped); None when there is none (the server's side of a Unix
    socket)."""
    if value is None:
        return None
    address = ipaddress.ip_address(str(value).split("%", 1)[0].split("/", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def idle_alive_check(dbapi_conn: Any) -> Callable[[], bool]:
    """A check, costing no round trip, that an idle psycopg connection in autocommit is
    alive. The store's connections never LISTEN between operations, and neither has a
    pooled one the listener takes yet: the server has nothing to tell them. A readable
    socket is therefore its goodbye (a FATAL "terminating connection" from a restart or
    pg_terminate_backend, or EOF), seen before any statement is sent on it. poll() rather
    than select(): descriptors may be >= 1024."""
    try:
        fd = dbapi_conn.pgconn.socket
    except Exception:  # noqa: BLE001 - no socket: the connection is already lost
        return lambda: False
    poller = select.poll()
    poller.register(fd, select.POLLIN)

    def alive() -> bool:
        return not (dbapi_conn.closed or dbapi_conn.broken or poller.poll(0))

    return alive


class ListenConnection:
    """One autocommit psycopg connection: bounded statements, and the notifications that
    arrive handed to ``on_notify(channel, payload)`` (never to psycopg's handlers)."""

    def __init__(self, dbapi_conn: Any, on_notify: Callable[[str, str], None]) -> None:
        dbapi_conn.autocommit = True
        self._conn = dbapi_conn
        self._pg = dbapi_conn.pgconn
        self._on_notify = on_notify
        self._encoding = dbapi_conn.info.encoding
        self.fileno: int = self._pg.socket
        self.backend_pid: int = dbapi_conn.info.backend_pid
        self.last_traffic = time.monotonic()
        # the longest this connection may stay idle: the server ends a session idle for
        # its idle_session_timeout (set per role, database or connection); infinite when off
        self.idle_limit = math.inf

    def read_idle_limit(self, timeout: float) -> None:
        """Read the session's ``idle_session_timeout`` (PostgreSQL 14 and later; none before)
        into ``idle_limit``. Bounded like ``execute``."""
        from psycopg import sql

        # the operator qualified too: a search_path may put someone's text = first
        text = sql.SQL(
            "SELECT setting FROM pg_catalog.pg_settings WHERE name OPERATOR(pg_catalog.=) 'idle_session_timeout'"
        )
        ms = self._run(text, "SHOW idle_session_timeout", timeout)
        self.idle_limit = int(ms) / 1000 if ms and int(ms) > 0 else math.inf

    def reaches_server_directly(self, timeout: float) -> bool:
        """Whether this connection reaches the server directly (``reaches_server_directly``):
        only then is its session its own — through a transaction pooler each statement may
        run on another server connection. Bounded like ``execute``."""
        from psycopg import sql

        row = self._run(sql.SQL(PEER_SQL), "SELECT pg_backend_pid()", timeout, whole_row=True)
        if row is None:
            return False
        pid, client_addr, client_port, server_addr, server_port = (
            None if v is None else v.decode(self._encoding) for v in row
        )
        ports = [None if p is None else int(p) for p in (client_port, server_port)]
        try:
            return reaches_server_directly(self.fileno, (pid, client_addr, ports[0], server_addr, ports[1]))
        except Exception:  # noqa: BLE001 - unproven means "not direct": the safe side
            return False

    def receive(self) -> None:
        """Read what the server sent (never waits) and hand on the notifications in it."""
        from psycopg import pq

        self._pg.consume_input()
        self.last_traffic = time.monotonic()
        while (n := self._pg.notifies()) is not None:
            self._on_notify(n.relname.decode(self._encoding), n.extra.decode(self._encoding))
        if self._pg.status != pq.ConnStatus.OK:
            raise ConnectionError("listener connection closed by the server")

    def execute(self, command: str, key: str | None, timeout: float) -> None:
        """Run ``command`` (with ``key`` as a quoted identifier after it); TimeoutError when
        the server has not answered within ``timeout`` seconds: the connection is dead."""
        from psycopg import sql

        text = sql.SQL(command) if key is None else sql.SQL(command + " {}").format(sql.Identifier(key))
        self._run(text, command, timeout)

    def hold_presence(self, key: str, timeout: float) -> bool:
        """Take this session's shared presence lock of the wake channel ``key`` (while it is
        held, enqueues into that queue notify), then try the barrier: True when no enqueue
        that could have missed the presence is still uncommitted. Bounded like ``execute``."""
        from psycopg import sql

        # OFFSET 0 fences the subquery: the presence is taken before the barrier is tried
        text = sql.SQL(
            "SELECT {barrier} FROM (SELECT pg_catalog.pg_advisory_lock_shared({p}, pg_catalog.hashtext({k})) "
            "OFFSET 0) AS held"
        ).format(barrier=self._barrier(key), p=sql.Literal(WAKE_PRESENCE_CLASS), k=sql.Literal(key))
        return self._run(text, "pg_advisory_lock_shared", timeout) == b"t"

    def settle(self, key: str, timeout: float) -> bool:
        """Try the barrier of ``key`` again (see ``hold_presence``)."""
        from psycopg import sql

        return self._run(sql.SQL("SELECT {}").format(self._barrier(key)), "pg_try_advisory_lock", timeout) == b"t"

    def release_presence(self, key: str, timeout: float) -> None:
        from psycopg import sql

        text = sql.SQL("SELECT pg_catalog.pg_advisory_unlock_shared({}, pg_catalog.hashtext({}))").format(
            sql.Literal(WAKE_PRESENCE_CLASS), sql.Literal(key)
        )
        self._run(text, "pg_advisory_unlock_shared", timeout)

    @staticmethod
    def _barrier(key: str) -> Any:
        from psycopg import sql

        return sql.SQL(
            "CASE WHEN pg_catalog.pg_try_advisory_lock({b}, pg_catalog.hashtext({k})) "
            "THEN pg_catalog.pg_advisory_unlock({b}, pg_catalog.hashtext({k})) ELSE false END"
        ).format(b=sql.Literal(WAKE_BARRIER_CLASS), k=sql.Literal(key))

    def _run(self, text: Any, command: str, timeout: float, *, whole_row: bool = False) -> Any:
        """Send one statement, wait (bounded) for its end; the first value it returned (the
        first row, as a list of values, with ``whole_row``), None when it returned none."""
        from psycopg import pq

        self._pg.send_query(text.as_bytes(self._conn))
        deadline = time.monotonic() + timeout
        while self._pg.flush():  # a nonblocking connection: 1 means "more to send"
            self._wait(selectors.EVENT_WRITE, deadline, timeout)
        self.receive()
        while self._pg.is_busy():
            self._wait(selectors.EVENT_READ, deadline, timeout)
            self.receive()
        error, value = None, None
        while (result := self._pg.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                error = (result.error_message or b"").decode(errors="replace").strip()
            elif result.status == pq.ExecStatus.TUPLES_OK and result.ntuples:
                columns = range(result.nfields) if whole_row else range(1)
                values = [result.get_value(0, i) for i in columns]
                value = values if whole_row else values[0]
        if error:
            raise DatabaseError(f"listener statement {command} failed: {error}")
        return value

    def _wait(self, events: int, deadline: float, timeout: float) -> None:
        left = deadline - time.monotonic()
        if left > 0:
            with new_selector() as sel:
                sel.register(self.fileno, events)
                if sel.select(left):
                    return
        raise TimeoutError(f"the listener connection did not answer within {timeout:g}s")

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already broken
            self._conn.close()


def tune_socket(fd: int, *, idle: int, interval: int, count: int, user_timeout_ms: int) -> None:
    """TCP keepalives and TCP_USER_TIMEOUT on a connection's socket (where the platform has
    them): the kernel then kills a connection whose peer vanished instead of retrying for
    many minutes. Set on the socket itself, so any way the engine connects is covered."""
    with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves fd open
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a Unix-domain socket cannot go half-open
        options = [
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), idle),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), interval),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), count),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), user_timeout_ms),
        ]
        for level, option, value in options:
            if option is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(level, option, value)
