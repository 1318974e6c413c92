"""HTML building blocks: escaping, prefix-carrying URLs, the page layout with its nav, and
action forms. Every value that came from a user or the database goes through ``esc``."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from .._json_shown import compact, indented_within
from .._rows import ts
from .._validate import MAX_DURATION
from .csrf import FIELD
from .http import Request, Response
from .target import own_url

NAV = (
    ("nav-queues", "/", "Queues"),
    ("nav-dead", "/dead", "Dead letters"),
    ("nav-schedules", "/schedules", "Schedules"),
    ("nav-workers", "/workers", "Workers"),
    ("nav-streams", "/streams", "Streams"),
)


def esc(value: object) -> str:
    """Text for HTML content or a quoted attribute value. A carriage return is written as a
    character reference: a browser reads a raw one in the source as a line feed (HTML
    input preprocessing), so an attribute or a form field would carry another name."""
    return html.escape("" if value is None else str(value), quote=True).replace("\r", "&#13;")


def url(request: Request, path: str, query: Mapping[str, object] | None = None) -> str:
    """``path`` (already encoded, starting with ``/``) under the mount prefix, plus a query."""
    q = {k: v for k, v in (query or {}).items() if v is not None}
    return request.root + path + (f"?{urlencode(q)}" if q else "")


# A path segment "." or ".." is removed by every client before it sends the request (RFC
# 3986 remove_dot_segments; browsers also read "%2e" as a dot), so percent-encoding cannot
# carry such a name: ``seg`` puts one "~" in front of it, and of every name of that shape
# already led by "~" (so "~." stays another name than "."); ``unseg`` takes one off.
_DOTS = re.compile(r"~*\.\.?")
_LED_DOTS = re.compile(r"~+\.\.?")


def seg(name: str) -> str:
    """A name as one URL path segment: ``/`` and every other special character encoded, and
    never a dot segment (``unseg`` is the way back)."""
    if _DOTS.fullmatch(name):
        name = "~" + name
    return quote(name, safe="")


def unseg(segment: str) -> str:
    """The name a path segment made by ``seg`` stands for, from the segment as the server
    decoded it."""
    return segment[1:] if _LED_DOTS.fullmatch(segment) else segment


def when(value: datetime | float | None) -> str:
    """A timestamp as UTC ISO 8601 (seconds), or ``-``."""
    if value is None:
        return "-"
    if not isinstance(value, datetime):
        value = ts(float(value))
        assert value is not None
    return value.astimezone(timezone.utc).isoformat(timespec="seconds")


def age(seconds: float | None) -> str:
    """A duration for people: ``-``, ``4.2s``, ``3m 04s``, ``2h 05m``, ``3d 04h``. A span
    no API call writes (a stamp written by hand into a row) is shown as stored: ``inf``,
    ``nan`` (int() of it failed the page), or past 100 years ``1e+300s`` (not a count of
    days 300 digits long)."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return str(seconds)
    if abs(seconds) > MAX_DURATION:
        return f"{seconds:g}s"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _utf8_json(text: str) -> str:
    """JSON text (of ``ensure_ascii=False``) that a UTF-8 page can carry: a payload's lone
    surrogates (they round-trip, so a payload may hold them) become the ``\\u`` escapes
    they were stored as, which is what ``backslashreplace`` writes for them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


PRETTY_MAX = 1 << 21  # characters of a laid-out payload; a longer one is shown compact


def payload_html(payload: Any) -> str:
    """A payload's JSON laid out in a ``<pre>`` (as deep as enqueue accepts, under the
    server's frames: see ``_json_shown``), or compact when laid out it would be over
    PRETTY_MAX: indenting a deeply nested payload of a few hundred kB makes hundreds of MB."""
    text = compact(payload, ensure_ascii=False, sort_keys=True)
    pretty = indented_within(text, PRETTY_MAX)
    note = ""
    if pretty is None:
        note = (
            f'<p id="payload-note">shown compact: laid out, this payload would be over '
            f"{PRETTY_MAX // (1 << 20)} MiB</p>"
        )
    return f'{note}<pre id="payload">{esc(_utf8_json(text if pretty is None else pretty))}</pre>'


def cut(text: str, limit: int = 300) -> str:
    """The start of a long text for a list (an error: ``fail()`` stores any length), at
    most ``limit`` characters; the job page shows it whole."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


PREVIEW = 80  # characters of a payload a list shows


def preview_text(text: str, limit: int = PREVIEW) -> str:
    """The start of a payload's JSON text (as stored, or encoded), cut at ``limit``."""
    return _utf8_json(cut(text, limit))


def hidden(fields: Iterable[tuple[str, object]]) -> str:
    return "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields)


def action_form(
    request: Request, token: str, action: str, button: str, fields: Iterable[tuple[str, object]] = (),
    *, form_id: str | None = None, next_url: str | None = None, css: str = "inline",
) -> str:
    """A POST form to ``action`` (an app path) with the CSRF token, the page to come back
    to (``next_url``, default this one), extra hidden ``fields`` and ``button`` (its HTML)."""
    ident = f' id="{esc(form_id)}"' if form_id else ""
    back = [(FIELD, token), ("next", own_url(request) if next_url is None else next_url)]
    return (
        f'<form method="post" class="{css}"{ident} action="{esc(url(request, action))}">'
        f"{hidden([*back, *fields])}{button}</form>"
    )


def page(request: Request, title: str, body: str, *, status: int = 200, cookie: str | None = None) -> Response:
    """A whole page: head (the vendored CSS/JS), nav, ``title`` and ``body`` (HTML)."""
    nav = "".join(
        f'<a id="{ident}" href="{esc(url(request, path))}"{_current(request.path, path)}>{label}</a>'
        for ident, path, label in NAV
    )
    document = (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · alkstore</title>"
        f'<link rel="stylesheet" href="{esc(url(request, "/static/dashboard.css"))}">'
        f'<script src="{esc(url(request, "/static/dashboard.js"))}" defer></script>'
        "</head><body>"
        f'<header><span class="brand">alkstore</span><nav>{nav}</nav></header>'
        f"<main><h1>{esc(title)}</h1>{body}</main></body></html>\n"
    )
    headers = [("Cache-Control", "no-store")]
    if cookie is not None:
        headers.append(("Set-Cookie", cookie))
    return Response(status, document.encode("utf-8"), headers=headers)


def _current(path: str, nav_path: str) -> str:
    """The attribute marking the nav link of the page shown."""
    here = path == "/" or path.startswith("/queues/") if nav_path == "/" else path == nav_path
    return ' class="current"' if here else ""


def error_page(request: Request, status: int, message: str) -> Response:
    return page(request, f"{status}", f'<p class="error">{esc(message)}</p>', status=status)
