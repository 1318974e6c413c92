"""A small FastAPI shop with a ``Session`` dependency.

``POST /orders`` writes an order and enqueues its confirmation email in the request's
session: both commit together, or neither does. A declined card is refused *after* the job
was enqueued, to show that the rollback takes the job with the order.

Run it: ``alembic upgrade head`` (in this directory), then
``uvicorn --factory fastapi_shop:create_app`` and
``python fastapi_worker.py``. Database: ``$ALKSTORE_DATABASE_URL``, else a SQLite file in the
temp directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

import alkstore_sa as alk

EMAILS = "emails"


def database_url() -> str:
    """$ALKSTORE_DATABASE_URL, else a SQLite file that the app, its Alembic env and the
    worker all find."""
    default = os.path.join(tempfile.gettempdir(), "alkstore-fastapi-example.db")
    return os.environ.get("ALKSTORE_DATABASE_URL") or f"sqlite:///{default}"


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


def get_session(request: Request) -> Iterator[Session]:
    """One Session per request. It is closed when the request ends; whatever the endpoint
    did not commit (an exception, a refusal) is rolled back, alkstore's job included."""
    with request.app.state.sessionmaker() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def create_app(url: str | None = None) -> FastAPI:
    engine = sa.create_engine(url or database_url())
    # The Store registers alkstore's schema and settings for this engine, which
    # alk.enqueue(session, ...) finds through the session; check_schema fails fast, naming
    # the command to run, when `alembic upgrade head` was not run.
    store = alk.Store(engine)
    store.check_schema()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()
        engine.dispose()

    app = FastAPI(title="alkstore FastAPI example", lifespan=lifespan)
    app.state.sessionmaker = sessionmaker(engine)
    app.state.alkstore = store

    @app.post("/orders", status_code=201)
    def create_order(body: OrderIn, session: SessionDep) -> dict[str, int]:
        order = Order(email=body.email, item=body.item)
        session.add(order)
        session.flush()  # assigns order.id, for the job's payload
        job_id = alk.enqueue(
            session, EMAILS, {"template": "order-confirmation", "order_id": order.id, "to": order.email}
        )
        if body.card == "declined":
            raise HTTPException(status_code=402, detail="payment declined")  # nothing committed
        session.commit()  # the order and its email job become visible at once
        return {"order_id": order.id, "email_job_id": job_id}

    @app.get("/orders/{order_id}")
    def get_order(order_id: int, session: SessionDep) -> dict[str, object]:
        order = session.get(Order, order_id)
        if order is None:
            raise HTTPException(status_code=404, detail="no such order")
        return {"order_id": order.id, "email": order.email, "item": order.item}

    return app


