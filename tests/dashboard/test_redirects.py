"""Where an action sends the browser back to. A ``next`` or Referer that is not one of
the app's pages (dot segments, backslashes, a scheme or host, ``//``, outside the mount)
is refused for the default page, and the ``Location`` is percent-encoded. Mounted under
``/ops`` in a host app (werkzeug's DispatcherMiddleware, Starlette's Mount)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa.dashboard import create_app, create_wsgi_app
from tests.dashboard.conftest import HOST, AsgiBrowser, WsgiBrowser

PREFIX = "/ops"


def _host_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"host app"]


def mounted(kind: str, store: alk.Store) -> WsgiBrowser | AsgiBrowser:
    """The dashboard under PREFIX in a host app."""
    if kind == "wsgi":
        from werkzeug.middleware.dispatcher import DispatcherMiddleware

        return WsgiBrowser(DispatcherMiddleware(_host_app, {PREFIX: create_wsgi_app(store)}), prefix=PREFIX)
    from starlette.applications import Starlette
    from starlette.routing import Mount

    return AsgiBrowser(Starlette(routes=[Mount(PREFIX, app=create_app(store))]), prefix=PREFIX)


@pytest.fixture(params=["wsgi", "asgi"])
def ops(request: pytest.FixtureRequest, store: alk.Store) -> Iterator[WsgiBrowser | AsgiBrowser]:
    b = mounted(request.param, store)
    yield b
    b.close()


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
