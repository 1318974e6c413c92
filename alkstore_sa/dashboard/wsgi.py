"""The WSGI adapter: a WSGI environ becomes a Request (``SCRIPT_NAME`` is the mount prefix,
as ``DispatcherMiddleware`` and every WSGI server set it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .http import MAX_BODY, Request, Response

Handler = Callable[[Request], Response]
StartResponse = Callable[..., Any]


def _text(environ: dict[str, Any], key: str) -> str:
    # PEP 3333: environ strings are the raw bytes as latin-1; URLs are UTF-8
    return str(environ.get(key) or "").encode("latin-1").decode("utf-8", "replace")


def _raw_path(environ: dict[str, Any]) -> str | None:
    """The request target's path as sent: gunicorn's ``RAW_URI``, else the ``REQUEST_URI``
    of uwsgi, mod_wsgi, werkzeug and the built-in server (an absolute URI: its path)."""
    uri = _text(environ, "RAW_URI") or _text(environ, "REQUEST_URI")
    if not uri.startswith("/"):
        scheme, sep, rest = uri.partition("://")
        if not sep or not scheme.isalpha():
            return None
        uri = "/" + rest.partition("/")[2]
    return uri.split("?", 1)[0].split("#", 1)[0]


class IncompleteBody(Exception):
    """The body ended before its Content-Length: the client went away while sending it."""


def _read(stream: Any, length: int) -> bytes:
    """``length`` bytes of ``stream`` (a read may return fewer than asked, PEP 3333);
    IncompleteBody when it ends first."""
    chunks: list[bytes] = []
    left = length
    while left > 0:
        chunk = stream.read(left)
        if not chunk:
            raise IncompleteBody
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def request_from_environ(environ: dict[str, Any]) -> Request | None:
    """A Request from a WSGI environ; None when the body is over MAX_BODY, IncompleteBody
    when it is shorter than its Content-Length (what arrived is part of a form: acting on
    it could run an action on some of the selected jobs, or on a cut-off id)."""
    headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            headers[key.replace("_", "-").lower()] = str(environ[key])
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY:
        return None
    body = _read(environ["wsgi.input"], length) if length > 0 else b""
    return Request(
        method=str(environ.get("REQUEST_METHOD", "GET")).upper(),
        path=_text(environ, "PATH_INFO") or "/",
        root=_text(environ, "SCRIPT_NAME").rstrip("/"),
        query_string=str(environ.get("QUERY_STRING") or ""),
        headers=headers,
        body=body,
        scheme=str(environ.get("wsgi.url_scheme") or "http"),
        raw_path=_raw_path(environ),
    )


def wsgi_app(handler: Handler) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """A WSGI application serving ``handler``."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            request = request_from_environ(environ)
        except IncompleteBody:
            response = Response(400, b"request body incomplete", "text/plain; charset=utf-8")
        else:
            if request is None:
                response = Response(413, b"request body too large", "text/plain; charset=utf-8")
            else:
                response = handler(request)
        start_response(response.status_line, response.all_headers())
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else response.body]

    return app
