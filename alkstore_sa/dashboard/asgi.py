"""The ASGI adapter: an ASGI ``http`` scope becomes a Request; the handler runs in a worker
thread (the store's calls block), never on the event loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .http import MAX_BODY, Request, Response

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Handler = Callable[[Request], Response]


async def _in_thread(handler: Handler, request: Request) -> Response:
    """Run ``handler`` on a worker thread of the running event loop's library (anyio when
    installed, as under Starlette/FastAPI, so trio works too; else asyncio)."""
    try:
        from anyio import to_thread
    except ImportError:  # pragma: no cover - anyio comes with every ASGI framework we know
        import asyncio

        return await asyncio.to_thread(handler, request)
    return await to_thread.run_sync(handler, request)


def request_from_scope(scope: Scope, body: bytes) -> Request:
    """A Request from an ASGI http scope. ASGI says ``path`` includes ``root_path``
    (Starlette's Mount and uvicorn's ``--root-path`` do so); a server that already
    stripped it is handled too. ``raw_path`` is optional in ASGI; some servers leave the
    query string on it."""
    root = str(scope.get("root_path") or "").rstrip("/")
    path = str(scope.get("path") or "/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    raw = scope.get("raw_path")
    raw_path = raw.split(b"?", 1)[0].decode("utf-8", "replace") if isinstance(raw, bytes) and raw else None
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers") or []:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name in headers:
            # repeated fields join with ","; cookies, which HTTP/2 sends one per field
            # (RFC 9113 8.2.3), with "; " as in one Cookie header
            value = headers[name] + ("; " if name == "cookie" else ", ") + value
        headers[name] = value
    return Request(
        method=str(scope.get("method", "GET")).upper(),
        path=path or "/",
        root=root,
        query_string=(scope.get("query_string") or b"").decode("latin-1"),
        headers=headers,
        body=body,
        scheme=str(scope.get("scheme") or "http"),
        raw_path=raw_path,
    )


class _Disconnected(Exception):
    """The client went away before its whole body arrived."""


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None once it exceeds MAX_BODY; ``_Disconnected`` when
    the client left before the end of it (what arrived is part of a form: acting on it
    could run an action on some of the selected jobs, or on a cut-off id)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Served alone (uvicorn), the app has nothing to start or stop: acknowledge both."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def asgi_app(handler: Handler) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI 3 application serving ``handler``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets: not served
            await send({"type": "websocket.close", "code": 1000})
            return
        try:
            body = await _read_body(receive)
        except _Disconnected:
            # nothing to act on; answered all the same (nobody reads it): a host app's
            # middleware (Starlette's BaseHTTPMiddleware) raises for an app that answers nothing
            response = Response(400, b"request body incomplete", "text/plain; charset=utf-8")
        else:
            if body is None:
                response = Response(413, b"request body too large", "text/plain; charset=utf-8")
            else:
                response = await _in_thread(handler, request_from_scope(scope, body))
        await send({
            "type": "http.response.start",
            "status": response.status,
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.all_headers()],
        })
        await send({"type": "http.response.body", "body": response.body if scope.get("method") != "HEAD" else b""})

    return app
