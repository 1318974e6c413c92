"""Where an action sends the browser back to. Every form's ``next`` is the page as the
browser asked for it (its raw, percent-encoded path: a decoded ``?``, ``#`` or ``/..`` in
a queue name would point somewhere else); a ``next`` or Referer that is not one of the
app's pages (dot segments, backslashes, a scheme or host, ``//``, outside the mount) is
refused for the default page; and the ``Location`` is percent-encoded. Mounted under
``/ops`` in a host app (werkzeug's DispatcherMiddleware, Starlette's Mount), with and
without the raw path a server may give, and through the built-in server."""

from __future__ import annotations

import html
import http.client
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

import pytest

import alkstore_sa as alk
from alkstore_sa.dashboard import create_app, create_wsgi_app
from alkstore_sa.dashboard.http import Request
from alkstore_sa.dashboard.server import make_server, serve_until
from alkstore_sa.dashboard.target import own_url
from alkstore_sa.stop import StopToken
from tests.dashboard.conftest import HOST, AsgiBrowser, WsgiBrowser

PREFIX = "/ops"


def _host_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"host app"]


def _wsgi_without_raw_uri(app: Any) -> Any:
    """A WSGI server that gives only the decoded PATH_INFO (no RAW_URI, no REQUEST_URI)."""
    def stripped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ = {k: v for k, v in environ.items() if k not in ("RAW_URI", "REQUEST_URI")}
        return app(environ, start_response)  # type: ignore[no-any-return]
    return stripped


def _asgi_without_raw_path(app: Any) -> Any:
    """An ASGI server that gives only the decoded ``path`` (``raw_path`` is optional)."""
    async def stripped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await app({k: v for k, v in scope.items() if k != "raw_path"}, receive, send)
    return stripped


def mounted(kind: str, store: alk.Store, *, raw: bool = True) -> WsgiBrowser | AsgiBrowser:
    """The dashboard under PREFIX in a host app; ``raw=False``: a server without raw paths."""
    if kind == "wsgi":
        from werkzeug.middleware.dispatcher import DispatcherMiddleware

        wsgi = create_wsgi_app(store)
        wsgi = wsgi if raw else _wsgi_without_raw_uri(wsgi)
        return WsgiBrowser(DispatcherMiddleware(_host_app, {PREFIX: wsgi}), prefix=PREFIX)
    from starlette.applications import Starlette
    from starlette.routing import Mount

    asgi = create_app(store)
    asgi = asgi if raw else _asgi_without_raw_path(asgi)
    return AsgiBrowser(Starlette(routes=[Mount(PREFIX, app=asgi)]), prefix=PREFIX)


@pytest.fixture(params=["wsgi", "asgi"])
def ops(request: pytest.FixtureRequest, store: alk.Store) -> Iterator[WsgiBrowser | AsgiBrowser]:
    b = mounted(request.param, store)
    yield b
    b.close()


@pytest.fixture(params=["wsgi", "asgi"])
def ops_decoded(request: pytest.FixtureRequest, store: alk.Store) -> Iterator[WsgiBrowser | AsgiBrowser]:
    b = mounted(request.param, store, raw=False)
    yield b
    b.close()


def _next_of(page: str) -> str:
    values = {html.unescape(v) for v in re.findall(r'name="next" value="([^"]*)"', page)}
    assert len(values) == 1, values
    return values.pop()


def _names(qname: str) -> list[str]:
    """Queue names whose decoded path is not their page's URL."""
    return [
        f"{qname}?x=1",                  # "?" would start a query
        f"{qname}#top",                  # "#" would start a fragment
        f"{qname}/..",                   # a browser removes the dot segment
        f"{qname}/%2e%2e",               # ...and decodes "%2e" first
        f"//{qname}.evil.example",       # "//" after the root
        f"{qname} ü%",                   # space, non-ASCII, "%"
    ]


def _page_path(name: str) -> str:
    return "/queues/" + quote(name, safe="") + "?state=ready"


def test_next_is_the_page_the_browser_asked_for(ops, store: alk.Store, qname: str) -> None:
    for name in _names(qname):
        q = store.queue(name)
        q.enqueue({"in": name})
        here = _page_path(name)
        page = ops.get(here)
        assert page.status == 200 and f"<title>Queue {html.escape(name)} " in page.text, name
        assert _next_of(page.text) == PREFIX + here, name
        r = ops.post("/queues/" + quote(name, safe="") + "/pause", {"csrf_token": page.token(), "next": PREFIX + here})
        assert r.status == 303 and r.headers["location"] == PREFIX + here, name
        assert q.settings().paused is True, name
        again = ops.get(r.headers["location"][len(PREFIX):])
        assert f"<title>Queue {html.escape(name)} " in again.text, name


def test_without_a_raw_path_next_is_the_decoded_path_quoted_again(ops_decoded, store: alk.Store, qname: str) -> None:
    """A server that gives no raw path: the decoded path's "?", "#", "%" and spaces are
    quoted back; a "/" cannot be told from a separator, so a page whose name holds "/.."
    or "//" (a dot or empty segment once decoded) comes back as the default page, never as
    another one."""
    for name in _names(qname):
        store.queue(name).enqueue({"in": name})
        page = ops_decoded.get(_page_path(name))
        assert page.status == 200, name
        r = ops_decoded.post(
            "/queues/" + quote(name, safe="") + "/pause", {"csrf_token": page.token(), "next": _next_of(page.text)}
        )
        assert r.status == 303, name
        if "/.." in name or "//" in name:
            assert r.headers["location"] == f"{PREFIX}/", name
            continue
        assert r.headers["location"].endswith("?state=ready"), name
        again = ops_decoded.get(r.headers["location"][len(PREFIX):])
        assert f"<title>Queue {html.escape(name)} " in again.text, name


def test_own_url_prefers_the_raw_path_that_decodes_to_the_request() -> None:
    def req(path: str, raw: str | None, query: str = "") -> Request:
        return Request("GET", path, PREFIX, query_string=query, raw_path=raw)

    assert own_url(req("/queues/a?b", "/ops/queues/a%3Fb", "state=dead")) == "/ops/queues/a%3Fb?state=dead"
    assert own_url(req("/queues/a/..", "/ops/queues/a%2F..")) == "/ops/queues/a%2F.."
    assert own_url(req("/queues/a#b c%", None)) == "/ops/queues/a%23b%20c%25"
    # a raw path of another page (a middleware rewrote the path): the decoded one, quoted
    assert own_url(req("/dead", "/ops/elsewhere")) == "/ops/dead"
    assert own_url(req("/queues/ü", "/ops/queues/\u00fc")) == "/ops/queues/%C3%BC"  # a raw path not encoded


REFUSED_NEXT = [
    "/ops/../elsewhere", "/ops/%2e%2e/elsewhere", "/ops/.%2E/x", "/ops/dead/..", "/ops/./dead",
    "/ops/%2E", "/ops\\evil.example", "/ops/\\evil.example", "/ops/%5C/../x",
    "https://evil.example/ops/dead", f"http://{HOST}/ops/dead", "//evil.example/ops/dead",
    "/ops//evil.example", "/ops/dead//x", "ops/dead", "/opsx/dead", "/elsewhere", "/", "",
    "?x=1", "javascript:alert(1)", "\t/ops/../x",
]


def test_next_that_is_not_one_of_our_pages_is_refused(ops, store: alk.Store, qname: str) -> None:
    store.queue(qname).enqueue(1)
    token = ops.get("/").token()
    for evil in REFUSED_NEXT:
        r = ops.post(f"/queues/{qname}/pause", {"csrf_token": token, "next": evil})
        assert r.status == 303 and r.headers["location"] == f"{PREFIX}/", evil
    for fine in ("/ops", "/ops/dead?queue=a", "/ops/queues/a%2F..", "/ops/queues/a%2F%2Fb", "/ops/dead#frag"):
        r = ops.post(f"/queues/{qname}/pause", {"csrf_token": token, "next": fine})
        assert r.headers["location"] == fine.split("#")[0], fine


def test_next_at_the_server_root(dash, store: alk.Store, qname: str) -> None:
    store.queue(qname).enqueue(1)
    token = dash.get("/").token()
    for evil in ("//evil.example", "/%2F/evil.example", "/..//evil.example", "/%2e%2e/x", "/\\evil.example"):
        r = dash.post(f"/queues/{qname}/pause", {"csrf_token": token, "next": evil})
        expected = "/%2F/evil.example" if evil.startswith("/%2F") else "/"  # one encoded segment: a path
        assert r.status == 303 and r.headers["location"] == expected, evil


def test_referer_that_is_not_one_of_our_pages_is_refused(ops, store: alk.Store, qname: str) -> None:
    store.queue(qname).enqueue(1)
    token = ops.get("/").token()
    cases = {
        f"http://{HOST}/ops/dead?queue=x": "/ops/dead?queue=x",
        f"https://{HOST}/ops/queues/a%3Fb": "/ops/queues/a%3Fb",
        f"http://{HOST}/ops/../elsewhere": "/ops/",
        f"http://{HOST}/ops/%2e%2e/elsewhere": "/ops/",
        f"http://{HOST}//evil.example/ops/": "/ops/",
        f"http://{HOST}.evil.example/ops/dead": "/ops/",
        f"http://{HOST}@evil.example/ops/dead": "/ops/",
        "https://evil.example/ops/dead": "/ops/",
        f"http://{HOST}/elsewhere": "/ops/",
    }
    for referer, expected in cases.items():
        r = ops.post(f"/queues/{qname}/pause", {"csrf_token": token}, headers={"Referer": referer})
        assert r.status == 303 and r.headers["location"] == expected, referer


ENCODED = {
    "/ops/queues/ünï 漢字": "/ops/queues/%C3%BCn%C3%AF%20%E6%BC%A2%E5%AD%97",
    "/ops/dead?queue=a b&x=ü": "/ops/dead?queue=a%20b&x=%C3%BC",
    "/ops/dead\r\nSet-Cookie: x=1": "/ops/dead%0D%0ASet-Cookie:%20x=1",
    "/ops/dead?q=\x00\x7f": "/ops/dead?q=%00%7F",
    "/ops/queues/100%": "/ops/queues/100%25",
    '/ops/queues/"<a>"': "/ops/queues/%22%3Ca%3E%22",
    "/ops/queues/%C3%BC": "/ops/queues/%C3%BC",
}


def test_location_is_percent_encoded(ops, store: alk.Store, qname: str) -> None:
    store.queue(qname).enqueue(1)
    token = ops.get("/").token()
    for target, expected in ENCODED.items():
        r = ops.post(f"/queues/{qname}/pause", {"csrf_token": token, "next": target})
        assert r.status == 303 and r.headers["location"] == expected, target
        assert re.fullmatch(r"[\x21-\x7e]+", r.headers["location"]), target


def test_builtin_server_gives_the_raw_path(store: alk.Store, qname: str) -> None:
    """``alkstore dashboard``'s wsgiref server passes the request target on as
    REQUEST_URI: a page whose name holds "/.." gets itself as ``next``."""
    name = f"{qname}/.."
    store.queue(name).enqueue(1)
    server = make_server(create_wsgi_app(store), "127.0.0.1", 0)
    stop = StopToken()
    thread = threading.Thread(target=serve_until, args=(server, stop))
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        here = _page_path(name)
        conn.request("GET", here, headers={"Host": HOST})
        reply = conn.getresponse()
        page = reply.read().decode()
        assert reply.status == 200 and f"<title>Queue {html.escape(name)} " in page
        assert _next_of(page) == here
        conn.close()
    finally:
        stop.stop()
        thread.join(30)
