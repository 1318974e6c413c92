"""The Python snippets of README.md and docs/*.md are Python, and they run as written.

Every ```python block must compile. A signature listing (``lk.acquire(owner, ttl) -> bool``:
a call followed by its return type) must compile once its pseudo-syntax is dropped, and is
not run. Every other block runs, on both engines, one top-level statement at a time, in
the order of its page and in one namespace per page (as a reader pastes them), with:

- the names the docs leave to the reader bound to small stand-ins (``engine``, ``store``,
  ``session``, ``async_session``, an ``Order`` model, ``owner``, ``deliver``, ...);
- ``alk.StopToken()`` already stopped, so ``worker.run(stop)``, ``run_schedules``,
  ``relay`` and ``subscribe`` return at once instead of blocking the test;
- an engine a snippet makes from a URL on the docs' placeholder host ``db`` made on the
  test database instead (same sync/async flavour, same options), and prometheus_client's
  default registry a fresh one (the metrics switched off again after the page);
- the open transactions of ``session`` and ``async_session`` committed between statements:
  the lines of a block are alternatives, not one transaction, and on SQLite a sync and an
  async transaction left open on one thread would wait for each other's write lock.

A block that cannot run here is in ``NOT_RUN`` with the reason, keyed by its page and first
line; a new block runs unless it is added there.
"""

from __future__ import annotations

import ast
import asyncio
import datetime
import os
import re
import socket
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import sqlalchemy as sa
from sqlalchemy.ext import asyncio as sa_asyncio
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool

import alkstore_sa as alk
from alkstore_sa import metrics
from tests.conftest import ENGINES, require_pg
from tests.fresh_pg import fresh_pg_database

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
_FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
# `lk.acquire(owner, ttl) -> bool   # ...`: a call written with its return type
_LISTING_LINE = re.compile(r"^(?!\s*(?:async\s+)?def\s)(\s*\S.*?\))\s*->\s*[^#\n]*?(\s*#.*)?$", re.M)

NOT_RUN = {
    ("docs/install.md", "from alkstore_sa.alembic_support import enable_wal, include_name"):
        "an Alembic env.py: tests/migrations/test_app_alembic.py runs the recipe with the real `alembic`",
    ("docs/install.md", "from alkstore_sa.alembic_support import sync_engine, sync_url"):
        "lines of an Alembic env.py (`context`); tests/migrations/test_alembic_urls.py runs them",
    ("docs/install.md", "import alkstore_sa as alk"):
        "a Flask app factory's fragments (`@app.post` outside the factory); examples/flask_app runs the whole app",
    ("docs/install.md", "def get_session(request: Request) -> Iterator[Session]:"):
        "FastAPI fragments (`app`, `OrderIn`); examples/fastapi_app runs the whole app",
    ("docs/install.md", "store = alk.Store(engine)"):
        "`orders.insert().values(...)` stands for the reader's own table and values",
    ("docs/tasks.md", "from alkstore_sa.flask import init_app"):
        "a Flask app factory (`db`, `Flask`); tests/acceptance/test_flask_cli.py runs init_app",
    ("docs/operations.md", "from flask import Flask"):
        "serves prometheus_client's app, not alkstore's",
    ("docs/operations.md", "from fastapi import FastAPI"):
        "serves prometheus_client's app, not alkstore's",
    ("docs/operations.md", "from opentelemetry import trace"):
        "needs an OpenTelemetry SDK and OTLP exporter (not alkstore's dependencies); tests/tracing covers instrument()",
    ("docs/operations.md", "from werkzeug.middleware.dispatcher import DispatcherMiddleware"):
        "continues a Flask app (`app.wsgi_app`) the page does not define; tests/dashboard mounts the WSGI app",
    ("docs/pgbouncer.md", 'engine = sa.create_engine('):
        "connects through a PgBouncer at `pgbouncer:6432`; tests/faults/test_pgbouncer.py runs a real one",
    ("docs/pgbouncer.md", "async_engine = create_async_engine("):
        "connects through a PgBouncer at `pgbouncer:6432`; tests/faults/test_pgbouncer.py runs a real one",
    ("docs/pgbouncer.md", 'store = alk.Store(sa.create_engine("postgresql+psycopg://app@pgbouncer:6432/app"))'):
        "connects through a PgBouncer at `pgbouncer:6432`; tests/faults/test_pgbouncer.py runs a real one",
    ("docs/worker.md", 'store.notify("orders", "order 42 paid")            # in its own transaction'):
        "`for note in sub:` waits until the subscription is closed; tests/conformance/test_notify.py runs it",
}


def _blocks(page: str) -> Iterator[tuple[int, str]]:
    """(line, code) of each ```python block of ``page``, dedented to its fence."""
    text = (ROOT / page).read_text(encoding="utf-8")
    for m in _FENCE.finditer(text):
        indent = m[1]
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in m[2].splitlines())
        yield text[: m.start()].count("\n") + 1, code


def _first_line(code: str) -> str:
    return next(line for line in code.splitlines() if line.strip()).rstrip()


def _is_listing(code: str) -> bool:
    return bool(_LISTING_LINE.search(code))


def _as_python(code: str) -> str:
    """The docs' pseudo-syntax dropped: a trailing ``...`` argument (``configure(url=u, ...)``)
    and, in a listing, ``-> Type`` and the bare ``*`` of a keyword-only signature."""
    if _is_listing(code):
        code = _LISTING_LINE.sub(lambda m: m[1] + (m[2] or ""), code).replace("*, ", "")
    return code.replace(", ...)", ")")


def _compile(code: str, where: str) -> types.CodeType:
    return compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


ALL_BLOCKS = [(page, line, code) for page in PAGES for line, code in _blocks(page)]


@pytest.mark.parametrize(("page", "line", "code"), ALL_BLOCKS, ids=[f"{p}:{n}" for p, n, _ in ALL_BLOCKS])
def test_every_python_snippet_parses(page: str, line: int, code: str) -> None:
    _compile(_as_python(code), f"{page}:{line}")


def test_every_not_run_entry_names_a_block() -> None:
    """A block edited or removed must not leave a stale exemption behind."""
    firsts = {(page, _first_line(code)) for page, _, code in ALL_BLOCKS}
    assert set(NOT_RUN) <= firsts, sorted(set(NOT_RUN) - firsts)


# -- running them -----------------------------------------------------------------------------

class _Base(DeclarativeBase):
    pass


class Order(_Base):
    """The docs' ``Order``: ``Order(...)``, ``Order(email=...)``, ``Order(id=..., total=...)``."""

    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str | None]
    total: Mapped[int | None]

    def __init__(self, *placeholder: object, **columns: Any) -> None:  # `Order(...)`
        super().__init__(**columns)


class _StoppedToken(alk.StopToken):
    """``alk.StopToken()`` in a snippet: stopped from the start, so loops return at once."""

    def __init__(self) -> None:
        super().__init__()
        self.stop()


@pytest.fixture(params=ENGINES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of the snippets' own: they use alkstore's default schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'app.db'}"
        return
    require_pg()
    with fresh_pg_database("alkdocs") as url:
        yield url


def _async_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql+asyncpg://").replace("sqlite://", "sqlite+aiosqlite://")


def _placeholder_engines(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """``create_engine("postgresql+psycopg://app@db/app")`` in a snippet: the test database."""
    real_sync, real_async = sa.create_engine, sa_asyncio.create_async_engine

    def create_engine(doc_url: str, **kw: Any) -> sa.Engine:
        return real_sync(url if sa.make_url(doc_url).host == "db" else doc_url, **kw)

    def create_async_engine(doc_url: str, **kw: Any) -> sa_asyncio.AsyncEngine:
        if sa.make_url(doc_url).host == "db":
            return real_async(_async_url(url), poolclass=NullPool, **kw)
        return real_async(doc_url, **kw)

    monkeypatch.setattr(sa, "create_engine", create_engine)
    monkeypatch.setattr(sa_asyncio, "create_async_engine", create_async_engine)


def _namespace(store: alk.Store, engine: sa.Engine, async_engine: sa_asyncio.AsyncEngine) -> dict[str, Any]:
    tasks = alk.Tasks()

    @tasks.task(queue="billing", name="send_invoice")
    def send_invoice(order_id: int) -> None:
        """flow-control.md's task."""

    return {
        "__name__": "docs_snippet", "alk": alk, "sa": sa, "engine": engine, "store": store,
        "Session": Session, "session": Session(engine), "Order": Order, "order": Order(email="ada@example.com"),
        "async_engine": async_engine, "async_session": sa_asyncio.AsyncSession(async_engine),
        "q": store.queue("billing"), "st": store.stream("orders"), "send_invoice": send_invoice,
        "payload": {"n": 1}, "order_id": 7, "total": 10, "user_id": 7, "owner": "me", "ttl": 30,
        "consumer": "billing", "offset": 1, "stop": _StoppedToken(),
        "create_engine": sa.create_engine, "create_async_engine": sa_asyncio.create_async_engine,
        "deliver": lambda *_: None, "broker": types.SimpleNamespace(publish=lambda *_: None),
        "mailer": types.SimpleNamespace(send=lambda *_: None), "batches": lambda: [1, 2],
        "reindex": lambda _: None, "bill": lambda _: None, "handle": lambda _: None,
        "uuid4": uuid.uuid4, "uuid": uuid, "os": os, "socket": socket, "datetime": datetime.datetime,
        "timezone": datetime.timezone, "timedelta": datetime.timedelta,
    }


def _statements(page: str, line: int, code: str) -> Iterator[types.CodeType]:
    """The block's top-level statements, compiled one by one, numbered as lines of ``page``."""
    for stmt in ast.parse(code).body:
        module = ast.Module(body=[stmt], type_ignores=[])
        ast.increment_lineno(module, line)  # the block starts on the line after its fence
        yield _compile_ast(module, page)


def _compile_ast(module: ast.Module, where: str) -> types.CodeType:
    return compile(module, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _run_statement(code: types.CodeType, ns: dict[str, Any]) -> None:
    """One top-level statement; an ``await`` one on a loop of its own. Open transactions of
    the stand-in sessions are committed after it (see the module docstring)."""

    async def awaited(coro: Any) -> None:
        await coro
        if isinstance(ns.get("async_session"), sa_asyncio.AsyncSession):
            await ns["async_session"].commit()

    result = eval(code, ns)  # noqa: S307 - the repository's own documentation
    if asyncio.iscoroutine(result):
        asyncio.run(awaited(result))
    if isinstance(ns.get("session"), Session):
        ns["session"].commit()


RUN_PAGES = [page for page in PAGES
             if any(not _is_listing(code) and (page, _first_line(code)) not in NOT_RUN for _, code in _blocks(page))]


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_snippets_of_a_page_run(page: str, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = sa.create_engine(database_url)
    _Base.metadata.create_all(engine)
    async_engine = sa_asyncio.create_async_engine(_async_url(database_url), poolclass=NullPool)
    _placeholder_engines(monkeypatch, database_url)
    monkeypatch.setattr(alk, "StopToken", _StoppedToken)
    monkeypatch.setattr(prometheus_client, "REGISTRY", prometheus_client.CollectorRegistry())
    store = alk.Store(engine)
    ns: dict[str, Any] = {}
    try:
        store.install()
        store.register(async_engine)
        ns = _namespace(store, engine, async_engine)
        for line, code in _blocks(page):
            if _is_listing(code) or (page, _first_line(code)) in NOT_RUN:
                continue
            for statement in _statements(page, line, code):
                _run_statement(statement, ns)
    finally:
        metrics.uninstrument()
        _close(ns)
        store.close()
        asyncio.run(async_engine.dispose())
        engine.dispose()


def _close(ns: dict[str, Any]) -> None:
    """The sessions and stores the page left open (a snippet's own ``alk.Store(...)``)."""
    for value in ns.values():
        if isinstance(value, Session | alk.Store):
            value.close()
        elif isinstance(value, sa_asyncio.AsyncSession):
            asyncio.run(value.close())
