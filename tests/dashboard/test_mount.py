"""Mounted under a prefix in a host application (FastAPI, Flask), every link, form action,
redirect and the CSRF cookie's path carry the prefix; the ASGI adapter runs the store's
blocking calls off the event loop."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import alkstore_sa as alk
from alkstore_sa.dashboard import create_app, create_wsgi_app
from alkstore_sa.dashboard.asgi import asgi_app
from alkstore_sa.dashboard.http import Request, Response
from tests.dashboard.conftest import AsgiBrowser, WsgiBrowser
from tests.dashboard.seed import counts_in, row_of, seed

PREFIX = "/ops/jobs"


def _check_prefixed(b: WsgiBrowser | AsgiBrowser, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    r = b.get("/")
    assert r.status == 200
    links = re.findall(r'(?:href|action|src|data-counts-url)="([^"]+)"', r.text)
    assert links and all(link.startswith(PREFIX + "/") for link in links), links
    assert f'<a id="nav-dead" href="{PREFIX}/dead">' in r.text
    assert counts_in(row_of(r.text, "data-queue", qname))["dead"] == 2
    assert f"Path={PREFIX};" in r.headers["set-cookie"]
    assert b.get("/static/dashboard.js").status == 200
    assert b.get("/api/counts").json()["queues"][qname]["ready"] == 3
    page = b.get(f"/queues/{qname}?state=dead")
    assert f'href="{PREFIX}/jobs/{s.dead[0]}"' in page.text
    r = b.post(
        "/dead/delete",
        {"csrf_token": page.token(), "id": s.dead[0], "queue": qname, "next": f"{PREFIX}/queues/{qname}?state=dead"},
    )
    assert r.status == 303 and r.headers["location"] == f"{PREFIX}/queues/{qname}?state=dead"
    assert store.get_job(s.dead[0]) is None
    r = b.post(f"/queues/{qname}/pause", {"csrf_token": page.token(), "next": "/elsewhere"})  # outside the mount
    assert r.status == 303 and r.headers["location"] == f"{PREFIX}/"
    assert store.queue(qname).settings().paused is True


def test_flask_dispatcher_middleware(store: alk.Store, qname: str) -> None:
    from flask import Flask
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app = Flask(__name__)

    @app.get("/")
    def home() -> str:
        return "host app"

    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {PREFIX: create_wsgi_app(store)})  # type: ignore[method-assign]
    b = WsgiBrowser(app, prefix=PREFIX)
    _check_prefixed(b, store, qname)
    assert b.client.get("/").get_data(as_text=True) == "host app"


def test_fastapi_mount(store: alk.Store, qname: str) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/")
    def home() -> dict[str, str]:
        return {"app": "host"}

    app.mount(PREFIX, create_app(store))
    b = AsgiBrowser(app, prefix=PREFIX)
    try:
        _check_prefixed(b, store, qname)
        assert b.get("/").status == 200  # the dashboard's own root, under the prefix
    finally:
        b.close()


def _call(app: Any, scope: dict[str, Any]) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_asgi_root_path_with_and_without_the_prefix_in_path(store: alk.Store) -> None:
    app = create_app(store)
    base = {"type": "http", "method": "GET", "query_string": b"", "headers": [(b"host", b"x")], "root_path": PREFIX}
    for path in (PREFIX + "/dead", "/dead"):  # the ASGI spec's form, and a server that strips it
        status, body = _call(app, {**base, "path": path})
        assert status == 200 and f'href="{PREFIX}/dead"'.encode() in body


def test_asgi_runs_the_handler_off_the_event_loop() -> None:
    threads: list[threading.Thread] = []

    def handler(request: Request) -> Response:
        threads.append(threading.current_thread())
        return Response(200, b"ok")

    loop_thread: list[threading.Thread] = []
    app = asgi_app(handler)

    async def main() -> None:
        loop_thread.append(threading.current_thread())
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
        assert sent[0]["status"] == 200

    asyncio.run(main())
    assert threads and threads[0] is not loop_thread[0]


def test_asgi_lifespan_is_acknowledged(store: alk.Store) -> None:
    app = create_app(store)
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["type"])

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_fastapi_with_a_middleware_answers_an_upload_cut_off_by_a_disconnect(store: alk.Store, qname: str) -> None:
    """Behind an ``@app.middleware("http")`` (the auth recipe of docs/operations.md),
    Starlette's middleware raises ``RuntimeError: No response returned.`` for an app that
    answers nothing: a client that went away mid-upload must still get an answer (400,
    nobody reads it), not a traceback in the server's log, and nothing is acted on."""
    from fastapi import FastAPI
    from fastapi import Request as FastRequest

    s = seed(store, qname, dead=2)
    app = FastAPI()
    app.mount(PREFIX, create_app(store))

    @app.middleware("http")
    async def passthrough(request: FastRequest, call_next: Any) -> Any:
        return await call_next(request)

    messages = iter([
        {"type": "http.request", "body": f"csrf_token=x&id={s.dead[0]}&".encode(), "more_body": True},
        {"type": "http.disconnect"},
    ])

    async def receive() -> dict[str, Any]:
        try:
            return next(messages)
        except StopIteration:  # the client is gone: nothing more ever comes
            await asyncio.Event().wait()
            raise

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": f"{PREFIX}/dead/delete", "raw_path": f"{PREFIX}/dead/delete".encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"x"), (b"content-type", b"application/x-www-form-urlencoded")],
        "server": ("x", 80), "client": ("127.0.0.1", 1),
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
    assert sorted(j.id for j in store.queue(qname).dead_jobs()) == s.dead
