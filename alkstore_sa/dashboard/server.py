"""Serving the WSGI dashboard alone (``alkstore dashboard``): the standard library's WSGI
server with a thread per request, stopped by a StopToken."""

from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ..stop import StopToken

log = logging.getLogger("alkstore_sa.dashboard")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client never holds up the shutdown
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    def get_environ(self) -> dict[str, Any]:
        """wsgiref's environ, plus the request target as sent (``REQUEST_URI``, as uwsgi
        and mod_wsgi give it): PATH_INFO alone is decoded, and cannot say which ``/`` or
        ``?`` of a page's URL were percent-encoded."""
        environ = super().get_environ()
        environ["REQUEST_URI"] = self.path
        return environ

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        log.debug("%s %s", self.address_string(), format % args)


def make_server(app: Any, host: str, port: int) -> WSGIServer:
    """A threading WSGI server bound to ``host:port`` (port 0: a free one), not yet serving."""
    cls = _Server6 if ":" in host else _Server
    server = cls((host, port), _Handler)
    server.set_app(app)
    return server


def serve_until(server: WSGIServer, stop: StopToken) -> None:
    """Serve on a thread until ``stop``; then stop accepting, and close the socket."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="alkstore-dashboard", daemon=True
    )
    thread.start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def served_url(server: WSGIServer) -> str:
    address = server.server_address
    host, port = str(address[0]), int(address[1])
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"
