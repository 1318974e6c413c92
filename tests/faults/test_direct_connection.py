"""The store prepares statements only on a connection that provably reaches the server
directly (docs/connections.md): through anything else — a pooler, any proxy — prepared
statements would be named per client and collide across the clients the proxy mixes.

A real TCP proxy stands in for a pooler that listens on the server's port number: it
listens on the IPv6 loopback (the server on the IPv4 one) and leaves for the server *from
the client's own port number* (what any proxy does by chance, about once in 28,000
connections). The ports the server sees then match the client's exactly; only the
addresses tell the two apart. The proxy counts the named Parse messages (server-side
prepared statements) passing through.

The client's port number may be taken on the IPv4 loopback (another connection to the
server uses it): the proxy then drops that client, and the engine connects again.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.support import IN_CI, Target

PROXY_ADDRESS = "::1"


class SamePortProxy:
    """Forwards each client to the server, leaving from the client's port number; records
    the names of the statements clients prepare."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.prepared: list[str] = []
        self.connections = 0
        self.dropped = 0  # clients whose port number was taken on the server's side
        self.listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((PROXY_ADDRESS, server[1]))
        self.listener.listen(16)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, (_host, port, *_scope) = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                upstream.bind((self.server[0], port))
                upstream.connect(self.server)
            except OSError:
                self.dropped += 1
                for s in (upstream, client):
                    s.close()
                continue
            self.connections += 1
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, sniff: bool) -> None:
        buf, started = b"", False
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if sniff:
                    buf, started = self._read(buf + data, started)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _read(self, buf: bytes, started: bool) -> tuple[bytes, bool]:
        """Consume the whole protocol messages in ``buf``; note each named Parse."""
        while True:
            if not started:  # the untyped startup packet (or an SSL/GSS request first)
                if len(buf) < 8 or len(buf) < struct.unpack("!i", buf[:4])[0]:
                    return buf, started
                size, code = struct.unpack("!ii", buf[:8])
                buf, started = buf[size:], code not in (80877103, 80877104)
                continue
            if len(buf) < 5 or len(buf) < 1 + struct.unpack("!i", buf[1:5])[0]:
                return buf, started
            kind, size = buf[:1], struct.unpack("!i", buf[1:5])[0]
            body, buf = buf[5 : 1 + size], buf[1 + size :]
            name = body.split(b"\0", 1)[0]
            if kind == b"P" and name:
                self.prepared.append(name.decode())

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxied_engine(pg_db: Target) -> Iterator[tuple[sa.Engine, SamePortProxy]]:
    url = sa.engine.make_url(pg_db.url)
    host, port = url.host or "127.0.0.1", url.port or 5432
    if host not in ("127.0.0.1", "localhost"):
        pytest.fail(f"this test needs PostgreSQL on the loopback (ALKSTORE_TEST_PG_URL names {host})")
    try:
        proxy = SamePortProxy(("127.0.0.1", port))
    except OSError as exc:  # no IPv6 loopback, or the server listens on it too
        reason = f"cannot listen on [{PROXY_ADDRESS}]:{port} for the proxy: {exc}"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    engine = sa.create_engine(url.set(host=PROXY_ADDRESS))

    @sa.event.listens_for(engine, "do_connect")
    def _again_when_dropped(dialect: sa.Dialect, _rec: object, cargs: tuple, cparams: dict) -> object:
        for _ in range(20):
            dropped = proxy.dropped
            try:
                return dialect.loaded_dbapi.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError:
                if proxy.dropped == dropped:
                    raise
        raise AssertionError("the proxy dropped 20 connections in a row")

    try:
        yield engine, proxy
    finally:
        engine.dispose()
        proxy.close()


def test_a_proxy_on_the_servers_port_from_the_clients_port_is_not_direct(
    pg_db: Target, proxied_engine: tuple[sa.Engine, SamePortProxy]
) -> None:
    engine, proxy = proxied_engine
    with alk.Store(engine, schema=pg_db.schema) as store:
        q = store.queue("through-a-proxy")
        for i in range(12):  # psycopg would prepare each statement at its fifth run
            q.enqueue({"i": i})
            h = q.claim_one("w")
            assert h is not None and h.ack() is True
    assert proxy.connections >= 1
    assert proxy.prepared == [], f"statements prepared through a proxy: {proxy.prepared[:5]}"


def test_a_direct_connection_still_prepares(pg_db: Target) -> None:
    """The other half: straight to the server, the store's statements are prepared."""
    with pg_db.store() as store:
        q = store.queue("direct")
        for i in range(8):
            q.enqueue({"i": i})
        held = store._conns.take()
        try:
            names = held.dbapi.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        finally:
            store._conns.give(held)
    assert names >= 1
