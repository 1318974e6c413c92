"""Where the dashboard sends the browser back to after an action: this request's own URL
(the ``next`` field of every form it renders) and the check that a ``next`` or Referer
names one of this app's pages before it becomes a ``Location``.

Both work on URLs as the client sent them, percent-encoded. A server's decoded path
cannot be put back into a URL: a queue named ``a?x`` or ``a/..`` decodes to a path whose
``?`` starts a query and whose ``..`` a browser removes, so the page is taken from the
raw request path (ASGI ``raw_path``, WSGI ``RAW_URI``/``REQUEST_URI``), and only a server
that gives none has its decoded path quoted again."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from .http import Request

# Kept as they are: RFC 3986 unreserved and reserved characters, and "%" that starts an
# escape. Everything else (controls, space, non-ASCII, quotes, "\", a stray "%") is
# percent-encoded, so a Location header carries nothing a client could read otherwise.
_NOT_URI = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]")
# A decoded path quoted again: a "/" stays a separator, "?", "#" and "%" become data.
_PATH_SAFE = "/!$&'()*+,;=:@"


def encoded(url: str) -> str:
    """``url`` with every character outside the URI syntax percent-encoded (UTF-8);
    escapes already in it are kept, so encoding twice changes nothing."""
    return _NOT_URI.sub(lambda m: quote(m.group(), safe="", errors="replace"), url)


def own_url(request: Request) -> str:
    """The path and query the client asked for, encoded as it sent them. The raw path is
    used only when it decodes to the request's own ``root + path`` (a middleware that
    rewrote the path leaves a raw path of another page behind)."""
    decoded = request.root + request.path
    raw = request.raw_path
    if raw is None or unquote(raw, errors="replace") != decoded:
        raw = quote(decoded, safe=_PATH_SAFE, errors="replace")
    query = request.query_string
    return encoded(raw + (f"?{query}" if query else ""))


def local_target(request: Request, candidate: str) -> str | None:
    """``candidate`` (a path, and maybe a query) as a Location inside this app, or None
    when it is not one of its pages. Refused: anything but a path starting with ``/``
    (so a scheme or a host), a backslash, an empty segment (``//``), a dot segment
    (``.``/``..``, encoded or not: browsers decode ``%2e``), and a path outside the mount
    prefix. The fragment is dropped."""
    if "\\" in candidate:
        return None  # browsers read "\" as "/": "/\evil.example" is another host
    path, _, query = encoded(candidate.split("#", 1)[0]).partition("?")
    if not path.startswith("/") or "//" in path:
        return None
    segments = path.split("/")
    if any(unquote(s) in (".", "..") for s in segments):
        return None
    depth = request.root.count("/") + 1  # the mount prefix's own segments, and the ""
    if unquote("/".join(segments[:depth]), errors="replace") != request.root:
        return None
    return path + (f"?{query}" if query else "")


def referer_target(request: Request, referer: str) -> str | None:
    """The path and query of a Referer from this host (http or https), as ``local_target``
    takes them; None for another site's page."""
    host = request.headers.get("host", "").strip()
    for scheme in ("http", "https"):
        origin = f"{scheme}://{host}"
        if host and referer[: len(origin)].lower() == origin.lower() and referer[len(origin):].startswith("/"):
            return local_target(request, referer[len(origin):])
    return None


def default_target(request: Request, path: str) -> str:
    """``path`` (an app path, starting with ``/``) under the mount prefix, encoded."""
    return encoded(quote(request.root, safe=_PATH_SAFE, errors="replace") + path)
