"""A small async FastAPI shop: ``create_async_engine``, an ``AsyncSession`` dependency and an
``async def`` task.

``POST /orders`` writes an order and enqueues its confirmation email with
``await send_email.aenqueue(session, ...)`` in the request's transaction: both commit
together, or neither does. A declined card is refused *after* the job was enqueued, to show
that the rollback takes the job with the order.

The operations dashboard (``alkstore_sa.dashboard.create_app``) is mounted at ``/jobs/``
behind the app's own authentication: here HTTP Basic, user ``operator`` and the password in
``$SHOP_OPERATOR_PASSWORD`` (unset: the dashboard refuses everyone) — put your real auth in
``operators_only``.

Run it: ``alembic upgrade head`` (in this directory), then
``uvicorn --factory fastapi_shop:create_app`` and ``python fastapi_worker.py`` (or
``alkstore worker fastapi_shop:tasks``). Database: ``$ALKSTORE_DATABASE_URL`` (a sync or an
async URL: see ``async_url``), else a SQLite file in the temp directory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import alkstore_sa as alk
from alkstore_sa.alembic_support import sync_url
from alkstore_sa.dashboard import create_app as create_dashboard

EMAILS = "emails"
tasks = alk.Tasks()  # the app's job kinds; `alkstore worker fastapi_shop:tasks` runs them


def database_url() -> str:
    """$ALKSTORE_DATABASE_URL, else a SQLite file that the app, its Alembic env and the
    worker all find."""
    default = os.path.join(tempfile.gettempdir(), "alkstore-fastapi-example.db")
    return os.environ.get("ALKSTORE_DATABASE_URL") or f"sqlite:///{default}"


def async_url(url: str) -> sa.URL:
    """The async form of a database URL: aiosqlite for SQLite; for PostgreSQL ``+asyncpg``
    as given, else psycopg 3's async mode. The URL is read as alkstore reads it
    (``sync_url``: ``postgres://``, ``postgresql://``, ``+psycopg2`` all name psycopg 3),
    so the app, its Alembic env and the worker agree on every form; InvalidOptions for a
    database alkstore does not support."""
    sync = sync_url(url)
    if sync.get_backend_name() == "sqlite":
        return sync.set(drivername="sqlite+aiosqlite")
    given = sa.make_url(url)
    # postgresql+psycopg: create_async_engine picks psycopg's async API
    return given if given.drivername == "postgresql+asyncpg" else sync


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(sa.String(320))
    item: Mapped[str] = mapped_column(sa.String(200))


class OrderIn(BaseModel):
    email: str
    item: str
    card: str = "ok"


# An explicit name: jobs carry it, and it must not depend on how the module was imported.
@tasks.task(queue=EMAILS, name="shop.send_email", max_attempts=5)
async def send_email(order_id: int, to: str, *, template: str = "order-confirmation") -> None:
    """An async task: the worker runs it on its event loop. Returning acks the job; raising
    retries it with backoff (dead at max_attempts); ``alk.Fail`` dead-letters it at once."""
    await asyncio.sleep(0)  # stands in for an async mail client
    print(f"sent {template} to {to} for order {order_id}", flush=True)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One AsyncSession per request. It is closed when the request ends; whatever the
    endpoint did not commit (an exception, a refusal) is rolled back, alkstore's job included."""
    async with request.app.state.sessionmaker() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def is_operator(headers: Headers) -> bool:
    """The app's own auth decides who may see and act on the job queues (the dashboard has
    no login of its own): here HTTP Basic ``operator`` / ``$SHOP_OPERATOR_PASSWORD``."""
    password = os.environ.get("SHOP_OPERATOR_PASSWORD")
    scheme, _, encoded = headers.get("authorization", "").partition(" ")
    if not password or scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(given, f"operator:{password}".encode())


def operators_only(app: ASGIApp) -> ASGIApp:
    """An ASGI wrapper in front of a mounted app (FastAPI dependencies do not reach inside a
    mount): a request without operator credentials gets 401 and never reaches ``app``."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> Any:
        if scope["type"] == "http" and not is_operator(Headers(scope=scope)):
            refusal = PlainTextResponse(
                "operators only", status_code=401, headers={"WWW-Authenticate": 'Basic realm="shop operators"'}
            )
            return await refusal(scope, receive, send)
        return await app(scope, receive, send)

    return guarded


def create_app(url: str | None = None) -> FastAPI:
    """The app factory; the engine and the store live in the lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The recipe: the app's async engine, and a Store on it. alk.Store(async_engine)
        # registers alkstore's schema and settings for that engine, which
        # task.aenqueue(session, ...) finds through the session; the store's own operations
        # (stats, claims, workers) run on a sync engine it makes from the same URL.
        engine = create_async_engine(async_url(url or database_url()))
        store = alk.Store(engine)
        try:
            # Fails startup, naming the command to run, when `alembic upgrade head` was not
            # run; a thread, because the store's own operations block.
            await asyncio.to_thread(store.check_schema)
            app.state.engine = engine
            app.state.sessionmaker = async_sessionmaker(engine, expire_on_commit=False)
            app.state.alkstore = store
            # The dashboard over the same store, at /jobs/, behind the app's auth. Mounted
            # here because the store lives in the lifespan; removed with it.
            app.mount("/jobs", operators_only(create_dashboard(store)), name="jobs-dashboard")
            yield
        finally:
            app.router.routes[:] = [r for r in app.router.routes if getattr(r, "name", None) != "jobs-dashboard"]
            store.close()
            await engine.dispose()

    app = FastAPI(title="alkstore FastAPI example", lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def create_order(body: OrderIn, session: SessionDep) -> dict[str, int]:
        order = Order(email=body.email, item=body.item)
        session.add(order)
        await session.flush()  # assigns order.id, for the job's arguments
        job_id = await send_email.aenqueue(session, order.id, order.email, template="order-confirmation")
        if body.card == "declined":
            raise HTTPException(status_code=402, detail="payment declined")  # nothing committed
        await session.commit()  # the order and its email job become visible at once
        return {"order_id": order.id, "email_job_id": job_id}

    @app.get("/orders/{order_id}")
    async def get_order(order_id: int, session: SessionDep) -> dict[str, object]:
        order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(status_code=404, detail="no such order")
        return {"order_id": order.id, "email": order.email, "item": order.item}

    return app
