"""The dashboard's framework-neutral HTTP core: a Request (what the ASGI and WSGI adapters
read off the wire) and a Response (what they write back). Pages and actions are plain
functions Request -> Response, so neither FastAPI nor Flask is needed to run them."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from http import HTTPStatus
from urllib.parse import parse_qs

MAX_BODY = 1 << 20  # a form of ids is small; anything bigger is refused (413)


@dataclass
class Request:
    """One request, below the mount point. ``path`` always starts with ``/``; ``root`` is
    the prefix the app is mounted under (``""`` at the server root, never a trailing ``/``),
    so ``root + path`` is what the browser asked for, decoded. ``raw_path`` is that path as
    the client sent it (percent-encoded, the prefix included) when the server gives it,
    else None: only it can say which ``/``, ``?`` or ``.`` were the name's own."""

    method: str
    path: str
    root: str
    query_string: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""
    scheme: str = "http"
    raw_path: str | None = None

    @cached_property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(self.query_string, keep_blank_values=True)

    @cached_property
    def form(self) -> dict[str, list[str]]:
        """The urlencoded form body (empty for any other content type)."""
        ctype = self.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            return {}
        return parse_qs(self.body.decode("utf-8", "replace"), keep_blank_values=True)

    @cached_property
    def cookies(self) -> dict[str, str]:
        """The cookies sent, by name (the first of a name: browsers send the cookie of the
        most specific path first). Read pair by pair: the browser sends the host
        application's cookies too, and ``http.cookies`` drops the whole header at one it
        cannot parse (a space, a JSON value), this app's own cookie with it."""
        jar: dict[str, str] = {}
        for pair in self.headers.get("cookie", "").split(";"):
            name, sep, value = pair.partition("=")
            name, value = name.strip(), value.strip()
            if not sep or not name or name in jar:
                continue
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            jar[name] = value
        return jar

    def arg(self, name: str) -> str | None:
        """The first value of a query parameter, or None."""
        values = self.query.get(name)
        return values[0] if values else None

    def field(self, name: str) -> str | None:
        """The first value of a form field, or None."""
        values = self.form.get(name)
        return values[0] if values else None


@dataclass
class Response:
    """Status, body and headers; ``content_type`` is sent as Content-Type."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status_line(self) -> str:
        try:
            return f"{self.status} {HTTPStatus(self.status).phrase}"
        except ValueError:
            return f"{self.status} Unknown"

    def all_headers(self) -> list[tuple[str, str]]:
        """Every header to send, security headers included: no framing (the action forms
        must not be clickjacked), scripts and styles only from the app itself."""
        return [
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(self.body))),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
            ("Referrer-Policy", "same-origin"),
            *self.headers,
        ]


def redirect(location: str) -> Response:
    """303 See Other: after a POST, the browser GETs ``location``."""
    return Response(303, b"", "text/plain; charset=utf-8", [("Location", location)])
