"""The two example apps behind one small interface, so a single acceptance test drives both:
each is migrated with its own ``alembic upgrade head`` (a subprocess, as a user would run
it), served through its framework's test client, and drained by its worker script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from tests.migrations.alembic_app import ALEMBIC

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass
class Shop:
    """A running example: post an order, reach its store and engine, run its worker."""

    post: Callable[[dict[str, Any]], tuple[int, Any]]
    store: alk.Store
    engine: sa.Engine  # a sync engine on the shop's database, for the test's own reads
    app_engine: sa.Engine  # the engine the app's requests run on (an async engine's sync_engine)
    worker: Path
    emails: str
    queues: tuple[str, ...]  # every queue the app's tasks use
    # any request through the app's test client: (method, path, headers, form) -> (status, text)
    request: Callable[[str, str, dict[str, str], dict[str, str] | None], tuple[int, str]] | None = None


def load(path: Path) -> ModuleType:
    """Import an example module by file (the examples are scripts, not a package)."""
    name = path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def example_env(url: str) -> dict[str, str]:
    return {**os.environ, "ALKSTORE_DATABASE_URL": url}


def migrate(example: Path, url: str) -> None:
    proc = subprocess.run(
        [ALEMBIC, "upgrade", "head"], cwd=example, env=example_env(url),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def run_worker(shop: Shop, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(shop.worker), "--drain", "--url", url], cwd=shop.worker.parent,
        capture_output=True, text=True, timeout=120,
    )


@contextmanager
def flask_shop(url: str) -> Iterator[Shop]:
    example = EXAMPLES / "flask_app"
    migrate(example, url)
    module = load(example / "flask_shop.py")
    app = module.create_app(url)
    client = app.test_client()

    def post(body: dict[str, Any]) -> tuple[int, Any]:
        response = client.post("/orders", json=body)
        return response.status_code, response.get_json(silent=True)

    def request(method: str, path: str, headers: dict[str, str], form: dict[str, str] | None) -> tuple[int, str]:
        response = client.open(path, method=method, headers=headers, data=form, follow_redirects=True)
        return response.status_code, response.get_data(as_text=True)

    with app.app_context():
        engine = module.db.engine
    store = app.extensions["alkstore"]
    try:
        yield Shop(post, store, engine, engine, example / "flask_worker.py", module.EMAILS,
                   tuple(module.tasks.queues()), request)
    finally:
        store.close()
        engine.dispose()


@contextmanager
def fastapi_shop(url: str) -> Iterator[Shop]:
    from fastapi.testclient import TestClient

    example = EXAMPLES / "fastapi_app"
    migrate(example, url)
    module = load(example / "fastapi_shop.py")
    app = module.create_app(url)
    with TestClient(app) as client:  # runs the lifespan: closes the store and engine after

        def post(body: dict[str, Any]) -> tuple[int, Any]:
            response = client.post("/orders", json=body)
            return response.status_code, response.json()

        def request(method: str, path: str, headers: dict[str, str], form: dict[str, str] | None) -> tuple[int, str]:
            response = client.request(method, path, headers=headers, data=form, follow_redirects=True)
            return response.status_code, response.text

        store = app.state.alkstore
        yield Shop(
            post, store, store.engine, app.state.engine.sync_engine, example / "fastapi_worker.py",
            module.EMAILS, tuple(module.tasks.queues()), request,
        )


SHOPS = {"flask": flask_shop, "fastapi": fastapi_shop}
