"""Fixtures of the dashboard tests: a dash-like client over the WSGI app (werkzeug's
test client) or the ASGI app (httpx's ASGITransport), with cookies kept across requests."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from werkzeug.test import Client

import alkstore_sa as alk
from alkstore_sa.dashboard import create_app, create_wsgi_app

HOST = "dash.test"


@dataclass
class Reply:
    status: int
    text: str
    headers: Mapping[str, str]

    def json(self) -> Any:
        import json

        return json.loads(self.text)

    def token(self) -> str:
        m = re.search(r'name="csrf_token" value="([0-9a-f]+)"', self.text)
        assert m, "no csrf_token on the page"
        return m.group(1)


Form = Sequence[tuple[str, object]] | Mapping[str, object]


class WsgiBrowser:
    kind = "wsgi"

    def __init__(self, app: Any, prefix: str = "") -> None:
        self.client = Client(app)
        self.prefix = prefix

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        r = self.client.get(self.prefix + path, headers={"Host": HOST, **(headers or {})})
        return Reply(r.status_code, r.get_data(as_text=True), r.headers)

    def post(self, path: str, data: Form, headers: Mapping[str, str] | None = None) -> Reply:
        items = list(data.items()) if isinstance(data, Mapping) else list(data)
        r = self.client.post(
            self.prefix + path, data=_multi(items), headers={"Host": HOST, **(headers or {})},
            content_type="application/x-www-form-urlencoded",
        )
        return Reply(r.status_code, r.get_data(as_text=True), r.headers)

    def close(self) -> None:
        pass


def _multi(items: list[tuple[str, object]]) -> Any:
    from werkzeug.datastructures import MultiDict

    return MultiDict([(k, str(v)) for k, v in items])


class AsgiBrowser:
    kind = "asgi"

    def __init__(self, app: Any, prefix: str = "") -> None:
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{HOST}")
        self.prefix = prefix

    def _run(self, coro: Any) -> Reply:
        r = self.loop.run_until_complete(coro)
        return Reply(r.status_code, r.text, r.headers)

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        return self._run(self.client.get(self.prefix + path, headers=dict(headers or {})))

    def post(self, path: str, data: Form, headers: Mapping[str, str] | None = None) -> Reply:
        items = list(data.items()) if isinstance(data, Mapping) else list(data)
        body = httpx.QueryParams([(k, str(v)) for k, v in items])
        return self._run(self.client.post(
            self.prefix + path, content=str(body).encode(),
            headers={"content-type": "application/x-www-form-urlencoded", **(headers or {})},
        ))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.close()


def make_browser(kind: str, store: alk.Store, **kw: Any) -> WsgiBrowser | AsgiBrowser:
    if kind == "wsgi":
        return WsgiBrowser(create_wsgi_app(store, **kw))
    return AsgiBrowser(create_app(store, **kw))


@pytest.fixture(params=["wsgi", "asgi"])
def dash(request: pytest.FixtureRequest, store: alk.Store) -> Iterator[WsgiBrowser | AsgiBrowser]:
    """The dashboard of ``store`` (injected clock) through each adapter."""
    b = make_browser(request.param, store)
    yield b
    b.close()


@pytest.fixture
def readonly(store: alk.Store) -> Iterator[WsgiBrowser]:
    b = WsgiBrowser(create_wsgi_app(store, read_only=True))
    yield b
    b.close()
