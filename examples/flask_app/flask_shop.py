"""A small Flask + Flask-SQLAlchemy shop with a ``Tasks`` registry.

``POST /orders`` writes an order and enqueues two tasks in ``db.session``'s transaction — the
confirmation email (queue "emails") and the stock reservation (queue "stock"): all three
commit together, or none does. A declined card is refused *after* the jobs were enqueued,
to show that the rollback takes the jobs with the order. One worker serves both queues.

The operations dashboard (``alkstore_sa.dashboard.create_wsgi_app``) is mounted at ``/jobs/``
with werkzeug's ``DispatcherMiddleware``, behind the app's own authentication: here HTTP
Basic, user ``operator`` and the password in ``$SHOP_OPERATOR_PASSWORD`` (unset: the
dashboard refuses everyone) — put your real auth in ``operators_only``.

Run it: ``alembic upgrade head`` (in this directory), then ``flask --app 'flask_shop:web_app()'
run`` and ``flask --app flask_shop alkstore worker`` (or ``python flask_worker.py``). Database:
``$ALKSTORE_DATABASE_URL``, else a SQLite file in the temp directory.
"""

from __future__ import annotations

import functools
import hmac
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any, ParamSpec, TypeVar

from flask import Flask, current_app, has_app_context, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from werkzeug.exceptions import HTTPException
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.wrappers import Request as WsgiRequest
from werkzeug.wrappers import Response as WsgiResponse

import alkstore_sa as alk
from alkstore_sa.alembic_support import sync_url
from alkstore_sa.dashboard import create_wsgi_app
from alkstore_sa.flask import init_app

EMAILS = "emails"
STOCK = "stock"

P = ParamSpec("P")
R = TypeVar("R")


def database_url() -> str:
    """$ALKSTORE_DATABASE_URL, else a SQLite file that the app, its Alembic env and the
    worker all find."""
    default = os.path.join(tempfile.gettempdir(), "alkstore-flask-example.db")
    return os.environ.get("ALKSTORE_DATABASE_URL") or f"sqlite:///{default}"


def app_database_uri(url: str) -> str:
    """``url`` as alkstore and this app's Alembic env read it, so one URL serves the app, its
    migrations and `alkstore worker`: `postgres://`, `postgresql://` mean psycopg 3, and a
    relative SQLite path is taken from the current directory (Flask-SQLAlchemy would open it
    in the app's instance folder: another file than the one `alembic upgrade head` migrated)."""
    parsed = sync_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() == "sqlite" and path not in ("", ":memory:") and not path.startswith("file:"):
        parsed = parsed.set(database=os.path.abspath(path))
    return parsed.render_as_string(hide_password=False)


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
tasks = alk.Tasks()  # every job kind of the app; `alkstore worker flask_worker:tasks` runs them all


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    item: Mapped[str] = mapped_column(String(200))


# --- running tasks inside a Flask application context ------------------------------------
# A worker runs tasks on its own threads, outside any request: `db.session` there needs an
# application context. `in_app_context` gives each run one, of the app the worker process
# made with `create_app()` (or, when none was made, one made from database_url() on first use).

_worker_app: Flask | None = None
_worker_app_lock = threading.Lock()


def _app_for_tasks() -> Flask:
    global _worker_app
    with _worker_app_lock:  # the worker's threads may start their first tasks together
        if _worker_app is None:
            create_app()
        assert _worker_app is not None
        return _worker_app


def in_app_context(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` in an application context: in a worker's job, a fresh one per run, so
    ``db.session`` is the job's own and is removed — closed, rolled back if uncommitted —
    when the task ends; within a request or any other active context (a plain call), it
    just runs there.

    A context active in a job is not the job's own: the worker runs each job in a copy of
    the context its ``run()`` was called in, so a worker started inside ``with
    app.app_context():`` would otherwise give every job, on every thread, that one
    ``db.session`` — and a job whose flush failed would leave the next one a session that
    refuses everything until rolled back."""

    @functools.wraps(func)  # keeps the signature: tasks check enqueue arguments against it
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if not has_app_context():
            app = _app_for_tasks()
        elif alk.current_job() is None:
            return func(*args, **kwargs)
        else:  # a job: a fresh context of the app whose context it inherited
            app = current_app._get_current_object()  # type: ignore[attr-defined]
        with app.app_context():
            return func(*args, **kwargs)

    return run


# Explicit names: jobs carry them, and they must not depend on how the module was imported.
@tasks.task(queue=EMAILS, name="shop.send_email", max_attempts=5)
def send_email(order_id: int, to: str, *, template: str = "order-confirmation") -> None:
    """Returning acks the job; raising retries it with backoff (dead at max_attempts);
    ``alk.Fail`` dead-letters it at once."""
    print(f"sent {template} to {to} for order {order_id}", flush=True)


@tasks.task(queue=STOCK, name="shop.reserve_stock")
@in_app_context
def reserve_stock(order_id: int) -> None:
    """Reads the order through ``db.session``: needs the application context above."""
    order = db.session.get(Order, order_id)
    if order is None:  # cannot happen: the job committed with its order
        raise alk.Fail(f"order {order_id} does not exist")
    job = alk.current_job()
    print(f"reserved {order.item} for order {order.id} (job {job.id if job else '-'})", flush=True)


def is_operator(request: WsgiRequest) -> bool:
    """The app's own auth decides who may see and act on the job queues (the dashboard has
    no login of its own): here HTTP Basic ``operator`` / ``$SHOP_OPERATOR_PASSWORD``."""
    password = os.environ.get("SHOP_OPERATOR_PASSWORD")
    auth = request.authorization
    if not password or auth is None or auth.type != "basic":
        return False
    given = f"{auth.username}:{auth.password}".encode()
    return hmac.compare_digest(given, f"operator:{password}".encode())


def operators_only(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A WSGI wrapper in front of a mounted app: a request without operator credentials gets
    401 and never reaches ``app``."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not is_operator(WsgiRequest(environ)):
            refusal = WsgiResponse("operators only", 401, {"WWW-Authenticate": 'Basic realm="shop operators"'})
            return refusal(environ, start_response)
        return app(environ, start_response)

    return guarded


class PaymentDeclined(HTTPException):
    code = 402
    description = "payment declined"


def create_app(url: str | None = None) -> Flask:
    """The app factory. The first app made in a process is also the one its tasks run in
    when a worker runs them (see ``in_app_context``)."""
    global _worker_app
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = app_database_uri(url or database_url())
    db.init_app(app)
    with app.app_context():
        # The Store registers alkstore's schema and settings for db.engine, which
        # task.enqueue(db.session, ...) finds through the session. No check_schema() here:
        # Flask's CLI builds the app with this factory for every command, and an error here
        # would end `flask --app flask_shop alkstore worker` (which checks the schema itself:
        # exit 2, naming the command to run) with a traceback. web_app() checks it.
        store = alk.Store(db.engine)
    # app.extensions["alkstore"] = store, and the `flask --app flask_shop alkstore worker`
    # command, which runs every task in an application context of the app it builds
    init_app(app, tasks, store)
    # The dashboard over the same store at /jobs/, behind the app's auth; every other path
    # still goes to the Flask app.
    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/jobs": operators_only(create_wsgi_app(store))}
    )
    if _worker_app is None:
        _worker_app = app

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        data = request.get_json(force=True)
        order = Order(email=data["email"], item=data["item"])
        db.session.add(order)
        db.session.flush()  # assigns order.id, for the jobs' arguments
        email_job = send_email.enqueue(db.session, order.id, order.email, template="order-confirmation")
        stock_job = reserve_stock.enqueue(db.session, order.id)
        if data.get("card") == "declined":
            # Nothing was committed: Flask-SQLAlchemy removes db.session when the request
            # ends, which rolls back the order and its jobs together.
            raise PaymentDeclined()
        db.session.commit()  # the order and both jobs become visible at once
        return {"order_id": order.id, "email_job_id": email_job, "stock_job_id": stock_job}, 201

    @app.errorhandler(PaymentDeclined)
    def declined(exc: PaymentDeclined) -> tuple[dict[str, Any], int]:
        return {"error": exc.description}, 402

    @app.get("/orders/<int:order_id>")
    def get_order(order_id: int) -> dict[str, Any]:
        order = db.get_or_404(Order, order_id)
        return {"order_id": order.id, "email": order.email, "item": order.item}

    return app


def web_app(url: str | None = None) -> Flask:
    """The app as the web server loads it (``flask --app 'flask_shop:web_app()' run``,
    ``gunicorn 'flask_shop:web_app()'``): ``create_app()`` plus the schema check, so the
    server fails at startup, naming the command to run, when `alembic upgrade head` was not
    run — rather than in the first request."""
    app = create_app(url)
    app.extensions["alkstore"].check_schema()
    return app
