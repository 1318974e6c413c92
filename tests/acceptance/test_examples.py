"""The Flask and FastAPI examples on both engines: an order and its task jobs commit together
(Flask: two tasks on two queues; FastAPI: an async task enqueued with ``aenqueue`` in an
``AsyncSession``); a request that fails after its enqueue leaves neither; the example's one
worker process runs every task and acks its jobs (the rows are gone). Each example's
one-command demo runs, and the async app under uvicorn commits each order with exactly one job."""

from __future__ import annotations

import asyncio
import base64
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.acceptance.shops import EXAMPLES, SHOPS, Shop, example_env, load, migrate, run_worker
from tests.conftest import ENGINES, require_pg
from tests.fresh_pg import fresh_pg_database
from tests.support import WAIT, wait_for


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

    @sa.event.listens_for(shop.app_engine, "before_cursor_execute")
    def _record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "INSERT INTO" in statement.upper() and "alkstore_jobs" in statement:
            seen.append(statement)

    return seen


def _task_payload(task: str, *args: object, **kwargs: object) -> dict[str, object]:
    return {"task": task, "args": list(args), "kwargs": kwargs}


def test_order_and_its_task_jobs_commit_together(shop: Shop, url: str) -> None:
    q = shop.store.queue(shop.emails)

    status, body = shop.post({"email": "ada@example.com", "item": "tea"})
    assert status == 201, body
    claimed = q.claim_batch("probe", 10)  # exactly one job, visible to a claim after the commit
    assert [h.id for h in claimed] == [body["email_job_id"]]
    assert claimed[0].payload == _task_payload(
        "shop.send_email", body["order_id"], "ada@example.com", template="order-confirmation"
    )
    assert claimed[0].ack()
    if "stock" in shop.queues:  # the Flask app's second task, on its own queue, same transaction
        stock = shop.store.queue("stock").claim_batch("probe", 10)
        assert [h.id for h in stock] == [body["stock_job_id"]]
        assert stock[0].payload == _task_payload("shop.reserve_stock", body["order_id"])
        assert stock[0].ack()

    inserts = _job_inserts(shop)
    status, _ = shop.post({"email": "bob@example.com", "item": "cake", "card": "declined"})
    assert status == 402
    assert len(inserts) == len(shop.queues)  # the jobs were written inside the request's transaction...
    for name in shop.queues:  # ...and rolled back with it, as was the order
        assert shop.store.queue(name).claim_one("probe") is None
        assert shop.store.queue(name).stats().pending == 0 and shop.store.queue(name).stats().processing == 0
    assert _orders(shop) == 1

    status, body = shop.post({"email": "cy@example.com", "item": "jam"})
    assert status == 201
    worker = run_worker(shop, url)  # one worker process, every queue of the app's registry
    assert worker.returncode == 0, worker.stderr
    assert f"sent order-confirmation to cy@example.com for order {body['order_id']}" in worker.stdout
    if "stock" in shop.queues:  # ran in the Flask application context: it read db.session
        assert f"reserved jam for order {body['order_id']} (job {body['stock_job_id']})" in worker.stdout
    assert f"worker: {len(shop.queues)} job(s) done" in worker.stdout
    assert q.get_job(body["email_job_id"]) is None  # acked: the row is gone, not dead
    for name in shop.queues:
        assert shop.store.queue(name).stats().pending == 0 and shop.store.queue(name).stats().dead == 0
    assert _orders(shop) == 2


def test_dashboard_is_mounted_under_jobs_behind_the_apps_auth(shop: Shop, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example mounts the operations dashboard at /jobs/ (FastAPI: ``create_app`` in a
    Mount; Flask: ``create_wsgi_app`` under DispatcherMiddleware) behind its own HTTP Basic
    check: refused without the operator's credentials, served with them (its links carry the
    prefix), and its cancel action works through the mount (CSRF token from the page)."""
    assert shop.request is not None
    monkeypatch.setenv("SHOP_OPERATOR_PASSWORD", "s3cret")
    status, body = shop.post({"email": "ada@example.com", "item": "tea"})
    assert status == 201, body
    job_id = body["email_job_id"]

    assert shop.request("GET", "/jobs/", {}, None)[0] == 401
    wrong = {"Authorization": "Basic " + base64.b64encode(b"operator:guess").decode()}
    assert shop.request("GET", "/jobs/", wrong, None)[0] == 401
    assert shop.request("GET", f"/orders/{body['order_id']}", {}, None)[0] == 200  # the app itself: no change

    auth = {"Authorization": "Basic " + base64.b64encode(b"operator:s3cret").decode()}
    status, html = shop.request("GET", "/jobs/", auth, None)
    assert status == 200, html
    row = re.search(rf'<tr data-queue="{shop.emails}">.*?</tr>', html, re.S)
    assert row is not None, html
    assert re.search(r'data-count="ready">1<', row.group(0)), row.group(0)
    assert f'href="/jobs/queues/{shop.emails}"' in row.group(0)  # links under the mount prefix
    assert shop.request("GET", "/jobs/api/counts", auth, None)[0] == 200

    status, html = shop.request("GET", f"/jobs/jobs/{job_id}", auth, None)
    assert status == 200, html
    assert '<span id="job-state">pending</span>' in html
    form = re.search(r'<form[^>]*action="([^"]*/cancel)".*?name="csrf_token" value="([^"]+)"', html, re.S)
    assert form is not None and form.group(1) == f"/jobs/jobs/{job_id}/cancel", html
    assert shop.request("POST", form.group(1), auth, {"csrf_token": "forged"})[0] == 403
    assert shop.store.get_job(job_id) is not None  # a forged token changes nothing
    status, _ = shop.request("POST", form.group(1), auth, {"csrf_token": form.group(2)})
    assert status == 200
    assert shop.store.get_job(job_id) is None  # cancelled through the mounted dashboard


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgres://u@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql://u@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql+psycopg2://u@h/db?sslmode=require", "postgresql+psycopg"),
        ("postgresql+asyncpg://u@h/db?ssl=require", "postgresql+asyncpg"),
        ("sqlite:///shop.db", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:///shop.db", "sqlite+aiosqlite"),
    ],
)
def test_fastapi_example_takes_every_url_form_its_readme_lists(url: str, driver: str) -> None:
    """The README: "The database URL may be sync or async" — ``postgres://`` included (was
    NoSuchModuleError: the example asked SQLAlchemy for a dialect named 'postgres')."""
    from sqlalchemy.ext.asyncio import create_async_engine

    module = load(EXAMPLES / "fastapi_app" / "fastapi_shop.py")
    async_url = module.async_url(url)
    given = sa.make_url(url)
    assert async_url.drivername == driver
    assert (async_url.host, async_url.database, dict(async_url.query)) == (given.host, given.database, dict(given.query))
    engine = create_async_engine(async_url)  # the app's engine: an async driver, nothing connects
    assert engine.dialect.is_async
    asyncio.run(engine.dispose())
    with pytest.raises(alk.InvalidOptions, match="mysql"):
        module.async_url("mysql://u@h/db")


@pytest.mark.parametrize("example", sorted(SHOPS))
def test_example_serves_a_postgres_scheme_url(example: str) -> None:
    """The ``postgres://`` form of a ``DATABASE_URL``, end to end: the app starts on it and
    a request enqueues (the Flask app gave it to Flask-SQLAlchemy as it was, so after its own
    ``alembic upgrade head`` had run on it the app failed with NoSuchModuleError 'postgres')."""
    require_pg()
    with fresh_pg_database("alkshop") as pg_url:
        url = sa.make_url(pg_url).set(drivername="postgres").render_as_string(hide_password=False)
        with SHOPS[example](url) as shop:
            status, body = shop.post({"email": "ada@example.com", "item": "tea"})
            assert status == 201, body
            assert shop.store.queue(shop.emails).stats().pending == 1


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
    if example == "flask_app":  # the second task's queue, drained by the same worker
        assert "stock reservations pending before the worker: 1" in demo.stdout
        assert "stock reservations pending after the worker: 0" in demo.stdout


@pytest.mark.parametrize("driver", ["postgres", "postgresql+asyncpg"])
def test_quickstart_runs_on_each_url_form_alkstore_reads(driver: str) -> None:
    """``make demo`` with ``ALKSTORE_DATABASE_URL`` (which the quickstart says overrides its
    SQLite file) in a form the CLI takes for the same variable: the quickstart gave it to
    ``create_engine`` as it was — NoSuchModuleError 'postgres', MissingGreenlet for asyncpg."""
    require_pg()
    with fresh_pg_database("alkdemo") as pg_url:
        url = sa.make_url(pg_url).set(drivername=driver).render_as_string(hide_password=False)
        demo = subprocess.run(
            [sys.executable, str(EXAMPLES / "quickstart.py")],
            env=example_env(url), capture_output=True, text=True, timeout=120,
        )
    assert demo.returncode == 0, demo.stderr
    assert "stats: QueueStats(pending=0, ready=0, processing=0, dead=1" in demo.stdout, demo.stdout


def test_quickstart_runs_on_the_database_the_examples_use(tmp_path: Path) -> None:
    """The README: each of `make demo`, `make example-flask`, `make example-fastapi` runs on
    ``ALKSTORE_DATABASE_URL``: set once, after an example the quickstart failed (its own
    ``orders`` table was the example's, whose ``item`` is NOT NULL)."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    for script in (EXAMPLES / "flask_app" / "demo.py", EXAMPLES / "quickstart.py"):
        run = subprocess.run([sys.executable, str(script)], env=example_env(url), capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr


def test_flask_example_opens_a_relative_sqlite_path_where_its_migrations_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:///shop.db`` names ./shop.db for ``alembic upgrade head`` and alkstore, while
    Flask-SQLAlchemy opens a relative path in the app's instance folder: the app started on
    another, empty file (NotInstalled) after its migrations had run."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("alembic")), "-c", str(EXAMPLES / "flask_app" / "alembic.ini"),
         "upgrade", "head"], cwd=tmp_path, env=example_env("sqlite:///shop.db"), capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(tmp_path)
    module = load(EXAMPLES / "flask_app" / "flask_shop.py")
    app = module.web_app("sqlite:///shop.db")  # checks the schema
    try:
        with app.app_context():
            assert module.db.engine.url.database == str(tmp_path / "shop.db")
    finally:
        app.extensions["alkstore"].close()
        with app.app_context():
            module.db.engine.dispose()
    assert not (EXAMPLES / "flask_app" / "instance").exists()


@pytest.mark.parametrize("example", ["flask", "fastapi"])
def test_example_fails_fast_before_its_migrations(example: str, tmp_path: Path) -> None:
    """Web app (FastAPI: its lifespan; Flask: ``web_app()``, what its web server loads) and worker refuse
    to start on a database without alkstore's schema, naming the command that installs it."""
    url = f"sqlite:///{tmp_path / 'unmigrated.db'}"
    directory = EXAMPLES / f"{example}_app"
    module = load(directory / f"{example}_shop.py")
    with pytest.raises(alk.NotInstalled, match="alembic upgrade head"):
        if example == "flask":
            module.web_app(url)
        else:  # the async app makes its engine and store in its lifespan: startup fails
            from fastapi.testclient import TestClient

            with TestClient(module.create_app(url)):
                pass
    worker = subprocess.run(
        [sys.executable, str(directory / f"{example}_worker.py"), "--drain", "--url", url],
        capture_output=True, text=True, timeout=120,
    )
    assert worker.returncode == 2 and "alembic upgrade head" in worker.stderr


def test_flask_example_cli_worker_names_the_migration(tmp_path: Path) -> None:
    """``flask --app flask_shop alkstore worker`` on an unmigrated database: exit 2 and the
    command to run, as docs/tasks.md says (was: the app factory's check_schema() raised
    while Flask's CLI built the app, a NotInstalled traceback and exit 1)."""
    worker = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "flask_shop", "alkstore", "worker", "--burst"],
        cwd=EXAMPLES / "flask_app", env=example_env(f"sqlite:///{tmp_path / 'unmigrated.db'}"),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert worker.returncode == 2, worker.stderr
    assert "alembic upgrade head" in worker.stderr and "Traceback" not in worker.stderr, worker.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _post_orders(base: str, count: int) -> list[tuple[int, dict[str, object]]]:
    """``count`` orders, at most 16 in flight (loopback; every 5th card declined)."""
    import httpx

    gate = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:

        async def one(i: int) -> tuple[int, dict[str, object]]:
            body = {"email": f"u{i}@example.com", "item": f"item-{i}", "card": "declined" if i % 5 == 0 else "ok"}
            async with gate:
                response = await client.post("/orders", json=body)
            return response.status_code, response.json()

        return await asyncio.gather(*(one(i) for i in range(count)))


def test_async_app_under_uvicorn_each_committed_order_has_one_processed_job(url: str) -> None:
    """200 concurrent requests to the async FastAPI app served by uvicorn: every committed
    order has exactly one job, which the worker runs exactly once; declined ones leave neither."""
    example = EXAMPLES / "fastapi_app"
    migrate(example, url)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "fastapi_shop:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning"],
        cwd=example, env=example_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert server.poll() is None, server.communicate()[1]
            try:
                with urllib.request.urlopen(f"{base}/orders/0", timeout=5):
                    return False
            except urllib.error.HTTPError as exc:
                return exc.code == 404  # the app answers: its lifespan has run
            except OSError:
                return False

        wait_for(ready, "uvicorn serving the example", timeout=WAIT)
        results = asyncio.run(_post_orders(base, 200))
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)

    assert sorted({status for status, _ in results}) == [201, 402]
    committed = {int(str(body["order_id"])) for status, body in results if status == 201}
    assert len(committed) == 160
    store = alk.Store(url)
    try:
        with store.engine.connect() as conn:
            assert set(conn.scalars(sa.text("SELECT id FROM orders"))) == committed  # declined: no order
        assert store.queue("emails").stats().pending == 160  # ...and no job
        worker = subprocess.run(
            [sys.executable, str(example / "fastapi_worker.py"), "--drain", "--url", url], cwd=example,
            capture_output=True, text=True, timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        sent = Counter(int(n) for n in re.findall(r"sent order-confirmation to \S+ for order (\d+)", worker.stdout))
        assert set(sent) == committed and set(sent.values()) == {1}  # each order's job ran exactly once
        stats = store.queue("emails").stats()
        assert stats.pending == 0 and stats.processing == 0 and stats.dead == 0
    finally:
        store.close()


def test_flask_example_in_app_context_gives_each_job_its_own_session_under_a_worker_run_in_a_context(
    url: str,
) -> None:
    """A worker script that runs the worker inside ``with app.app_context():`` (where the
    store was made) gives every job a copy of that context (worker.md: each job runs in a copy
    of the context ``run()`` was called in). ``in_app_context`` took it for a request's and
    just ran, so every job — on every thread — shared one ``db.session``, never removed: a job
    whose flush failed left the next job a session refusing everything (PendingRollbackError).
    In a job it now pushes a fresh context of that app, removed when the job ends."""
    example = EXAMPLES / "flask_app"
    migrate(example, url)
    module = load(example / "flask_shop.py")
    app = module.create_app(url)
    tasks = alk.Tasks()
    outcomes: list[str] = []

    @tasks.task(queue="probe", name="probe.touch")
    @module.in_app_context
    def touch(spoil: bool) -> None:
        if spoil:  # a NOT NULL column left empty: the flush fails, the session needs a rollback
            module.db.session.add(module.Order(email="ada@example.com", item=None))
            module.db.session.flush()
        outcomes.append(str(module.db.session.execute(sa.text("SELECT 7")).scalar()))

    with app.app_context():
        store: alk.Store = app.extensions["alkstore"]
        first, second = touch.enqueue(store, True), touch.enqueue(store, False)
        alk.Worker(store, tasks, concurrency=1, poll_interval=0.2).run(burst=True)
        q = store.queue("probe")
        assert q.get_job(second) is None, q.get_job(second)  # acked
        spoiled = q.get_job(first)
        assert spoiled is not None and "item" in (spoiled.errors[-1]["error"] or ""), spoiled  # its NOT NULL failure
    assert outcomes == ["7"]
