"""A small Flask + Flask-SQLAlchemy shop.

``POST /orders`` writes an order and enqueues its confirmation email in ``db.session``'s
transaction: both commit together, or neither does. A declined card is refused *after* the
job was enqueued, to show that the rollback takes the job with the order.

Run it: ``alembic upgrade head`` (in this directory), then ``flask --app flask_shop run``
and ``python flask_worker.py``. Database: ``$ALKSTORE_DATABASE_URL``, else a SQLite file in
the temp directory.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from werkzeug.exceptions import HTTPException

import alkstore_sa as alk

EMAILS = "emails"


def database_url() -> str:
    """$ALKSTORE_DATABASE_URL, else a SQLite file that the app, its Alembic env and the
    worker all find."""
    default = os.path.join(tempfile.gettempdir(), "alkstore-flask-example.db")
    return os.environ.get("ALKSTORE_DATABASE_URL") or f"sqlite:///{default}"


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    item: Mapped[str] = mapped_column(String(200))


class PaymentDeclined(HTTPException):
    code = 402
    description = "payment declined"


def create_app(url: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = url or database_url()
    db.init_app(app)
    with app.app_context():
        # The Store registers alkstore's schema and settings for db.engine, which
        # alk.enqueue(db.session, ...) finds through the session; check_schema fails fast,
        # naming the command to run, when `alembic upgrade head` was not run.
        store = alk.Store(db.engine)
        store.check_schema()
    app.extensions["alkstore"] = store

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        data = request.get_json(force=True)
        order = Order(email=data["email"], item=data["item"])
        db.session.add(order)
        db.session.flush()  # assigns order.id, for the job's payload
        job_id = alk.enqueue(
            db.session, EMAILS, {"template": "order-confirmation", "order_id": order.id, "to": order.email}
        )
        if data.get("card") == "declined":
            # Nothing was committed: Flask-SQLAlchemy removes db.session when the request
            # ends, which rolls back the order and its job together.
            raise PaymentDeclined()
        db.session.commit()  # the order and its email job become visible at once
        return {"order_id": order.id, "email_job_id": job_id}, 201

    @app.errorhandler(PaymentDeclined)
    def declined(exc: PaymentDeclined) -> tuple[dict[str, Any], int]:
        return {"error": exc.description}, 402

    @app.get("/orders/<int:order_id>")
    def get_order(order_id: int) -> dict[str, Any]:
        order = db.get_or_404(Order, order_id)
        return {"order_id": order.id, "email": order.email, "item": order.item}

    return app
