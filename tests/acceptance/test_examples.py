"""The Flask and FastAPI examples on both engines: an order and its email job commit together;
a request that fails after its enqueue leaves neither; the example's worker process
processes the job and acks it (the row is gone). And each example's one-command demo runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.acceptance.shops import EXAMPLES, SHOPS, Shop, example_env, load, run_worker
from tests.conftest import ENGINES, require_pg
from tests.fresh_pg import fresh_pg_database


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of the example's own (the example owns `public`/`alembic_version`)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shop.db'}"
        return
    require_pg()
    with fresh_pg_database("alkshop") as pg_url:
        yield pg_url


@pytest.fixture(params=sorted(SHOPS))
def shop(request: pytest.FixtureRequest, url: str) -> Iterator[Shop]:
    with SHOPS[request.param](url) as running:
        yield running


def _orders(shop: Shop) -> int:
    with shop.engine.connect() as conn:
        return int(conn.scalar(sa.text("SELECT count(*) FROM orders")))


def _job_inserts(shop: Shop) -> list[str]:
    """Records every INSERT into alkstore's job table on the app's engine: proof that the
    failing request did enqueue before it failed."""
    seen: list[str] = []

    @sa.event.listens_for(shop.engine, "before_cursor_execute")
    def _record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "INSERT INTO" in statement.upper() and "alkstore_jobs" in statement:
            seen.append(statement)

    return seen


def test_order_and_email_job_commit_together(shop: Shop, url: str) -> None:
    q = shop.store.queue(shop.emails)

    status, body = shop.post({"email": "ada@example.com", "item": "tea"})
    assert status == 201, body
    claimed = q.claim_batch("probe", 10)  # exactly one job, visible to a claim after the commit
    assert [h.id for h in claimed] == [body["email_job_id"]]
    assert claimed[0].payload == {"template": "order-confirmation", "order_id": body["order_id"], "to": "ada@example.com"}
    assert claimed[0].ack()

    inserts = _job_inserts(shop)
    status, _ = shop.post({"email": "bob@example.com", "item": "cake", "card": "declined"})
    assert status == 402
    assert len(inserts) == 1  # the job was written inside the request's transaction...
    assert q.claim_one("probe") is None  # ...and rolled back with it, as was the order
    assert q.stats().pending == 0 and q.stats().processing == 0
    assert _orders(shop) == 1

    status, body = shop.post({"email": "cy@example.com", "item": "jam"})
    assert status == 201
    worker = run_worker(shop, url)
    assert worker.returncode == 0, worker.stderr
    assert f"sent order-confirmation to cy@example.com for order {body['order_id']}" in worker.stdout
    assert "worker: 1 job(s) done" in worker.stdout
    assert q.get_job(body["email_job_id"]) is None  # acked: the row is gone, not dead
    assert q.stats().pending == 0 and q.stats().dead == 0
    assert _orders(shop) == 2


@pytest.mark.parametrize("example", ["flask_app", "fastapi_app"])
def test_demo_runs_in_one_command(example: str, tmp_path: Path) -> None:
    """What `make example-flask` / `make example-fastapi` run (on a SQLite file of its own)."""
    demo = subprocess.run(
        [sys.executable, str(EXAMPLES / example / "demo.py")],
        env=example_env(f"sqlite:///{tmp_path / 'demo.db'}"), capture_output=True, text=True, timeout=120,
    )
    assert demo.returncode == 0, demo.stderr
    assert "declined order -> 402" in demo.stdout
    assert "orders in the database: 1" in demo.stdout
    assert "emails pending before the worker: 1" in demo.stdout
    assert "emails pending after the worker: 0" in demo.stdout


@pytest.mark.parametrize("example", ["flask", "fastapi"])
def test_example_fails_fast_before_its_migrations(example: str, tmp_path: Path) -> None:
    """App and worker refuse to start on a database without alkstore's schema, naming the
    command that installs it."""
    url = f"sqlite:///{tmp_path / 'unmigrated.db'}"
    directory = EXAMPLES / f"{example}_app"
    module = load(directory / f"{example}_shop.py")
    with pytest.raises(alk.NotInstalled, match="alembic upgrade head"):
        module.create_app(url)
    worker = subprocess.run(
        [sys.executable, str(directory / f"{example}_worker.py"), "--drain", "--url", url],
        capture_output=True, text=True, timeout=120,
    )
    assert worker.returncode == 2 and "alembic upgrade head" in worker.stderr
