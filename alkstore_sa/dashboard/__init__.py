"""The operations dashboard (SPEC §15): server-rendered pages of queues, jobs, dead
letters, schedules, workers and streams, with HTML-form actions protected against
cross-site requests. Framework-neutral: ``create_app`` gives an ASGI application (mount it
in FastAPI/Starlette), ``create_wsgi_app`` a WSGI one (Flask, any WSGI server); both work
under any mount prefix. It has no authentication of its own: put the host application's
in front of it (docs/operations.md)."""

from __future__ import annotations

from typing import Any

from ..store import Store
from .app import Dashboard
from .asgi import asgi_app
from .wsgi import wsgi_app


def create_app(store: Store, *, read_only: bool = False, csrf_secret: bytes | None = None) -> Any:
    """An ASGI 3 application of the dashboard over ``store``. ``read_only=True`` renders no
    actions and refuses every POST (403). ``csrf_secret``: the key of the forms' tokens
    (default random per app; give every process serving one dashboard the same)."""
    return asgi_app(Dashboard(store, read_only=read_only, csrf_secret=csrf_secret))


def create_wsgi_app(store: Store, *, read_only: bool = False, csrf_secret: bytes | None = None) -> Any:
    """A WSGI application of the dashboard over ``store`` (see ``create_app``)."""
    return wsgi_app(Dashboard(store, read_only=read_only, csrf_secret=csrf_secret))


__all__ = ["create_app", "create_wsgi_app"]
