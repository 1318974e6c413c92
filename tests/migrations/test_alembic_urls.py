"""`alembic upgrade head` takes every URL form `alkstore migrate` and `alk.Store(url)` take
(SPEC §1, §4): ``postgres://``, plain ``postgresql://`` with psycopg 3 alone installed (what
the ``postgres`` extra gives), and the async forms ``postgresql+asyncpg://`` and
``sqlite+aiosqlite://`` (the FastAPI example's README: the URL "may be sync or async").
Proven with the real ``alembic`` command in the checkout's environment and in both example
apps' environments, each on a fresh database."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from alkstore_sa import InvalidOptions, migrations
from alkstore_sa.alembic_support import sync_engine, sync_url
from alkstore_sa.schema import DEFAULT_SCHEMA, VERSION_TABLE
from tests.conftest import require_pg
from tests.fresh_pg import fresh_pg_database
from tests.migrations.alembic_app import ALEMBIC, ALKSTORE_TABLES

ROOT = Path(__file__).resolve().parents[2]
ENVS = {
    "checkout": ROOT,
    "fastapi-example": ROOT / "examples" / "fastapi_app",
    "flask-example": ROOT / "examples" / "flask_app",
}
EXAMPLE_HEAD = "0004"  # the examples' own chain (they share one)

# drivername of the URL handed to `alembic`; the database is always a fresh one
URL_FORMS = ["postgres", "postgresql", "postgresql+asyncpg", "postgresql+psycopg2", "sqlite+aiosqlite"]

# psycopg2 "not installed": the `postgres` extra installs psycopg 3 only
NO_PSYCOPG2 = 'raise ModuleNotFoundError("No module named \'psycopg2\'", name="psycopg2")\n'


@pytest.fixture(params=URL_FORMS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the URL in the form under test, a plain sync URL of the same database to check it)."""
    form: str = request.param
    if form.startswith("sqlite"):
        path = tmp_path / "app.db"
        yield f"{form}:///{path}", f"sqlite:///{path}"
        return
    require_pg()
    with fresh_pg_database("alkurl") as url:
        yield sa.make_url(url).set(drivername=form).render_as_string(hide_password=False), url


def alembic_upgrade(cwd: Path, url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    blocked = tmp_path / "without_psycopg2"
    (blocked / "psycopg2").mkdir(parents=True, exist_ok=True)
    (blocked / "psycopg2" / "__init__.py").write_text(NO_PSYCOPG2)
    env = {k: v for k, v in os.environ.items() if k != "ALKSTORE_SCHEMA"}
    env["ALKSTORE_DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocked), env.get("PYTHONPATH")]))
    return subprocess.run(
        [ALEMBIC, "upgrade", "head"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("where", list(ENVS))
def test_alembic_upgrade_head_takes_every_url_form(
    where: str, database: tuple[str, str], tmp_path: Path
) -> None:
    url, check_url = database
    proc = alembic_upgrade(ENVS[where], url, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    engine = sa.create_engine(check_url)
    try:
        with engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            schema = None if sqlite else DEFAULT_SCHEMA
            assert migrations.current_revision(conn, DEFAULT_SCHEMA) == migrations.head_revision()
            assert set(sa.inspect(conn).get_table_names(schema=schema)) >= ALKSTORE_TABLES | {VERSION_TABLE}
            if sqlite:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            if where != "checkout":  # the app's own chain and table went in too
                assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == EXAMPLE_HEAD
                assert "orders" in sa.inspect(conn).get_table_names()
    finally:
        engine.dispose()


@pytest.mark.parametrize("form", URL_FORMS)
@pytest.mark.parametrize("where", list(ENVS))
def test_alembic_offline_sql_takes_every_url_form(where: str, form: str, tmp_path: Path) -> None:
    """``--sql`` reads only the URL's dialect: the same forms work, and nothing connects."""
    if form.startswith("sqlite"):
        url = f"{form}:///{tmp_path / 'never.db'}"
    else:
        url = f"{form}://nobody@127.0.0.1:1/never"  # port 1: a connection attempt would fail
    env = {**os.environ, "ALKSTORE_DATABASE_URL": url}
    proc = subprocess.run(
        [ALEMBIC, "upgrade", "head", "--sql"], cwd=ENVS[where], env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CREATE TABLE" in proc.stdout and "alkstore_jobs" in proc.stdout
    assert f"'{migrations.head_revision()}'" in proc.stdout  # alkstore's version record
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+psycopg"),
        ("postgresql+psycopg2://u@h/db", "postgresql+psycopg"),
        ("sqlite+aiosqlite:///x.db", "sqlite"),
        ("sqlite:///x.db", "sqlite"),
    ],
)
def test_sync_url_and_sync_engine_read_urls_as_alkstore_does(url: str, driver: str) -> None:
    """The env.py helpers are the library's own URL handling: no connection is made."""
    assert sync_url(url).drivername == driver
    engine = sync_engine(url)
    assert engine.url.drivername == driver and engine.url.database == sa.make_url(url).database
    engine.dispose()
    with pytest.raises(InvalidOptions, match="mysql"):
        sync_engine("mysql://u@h/db")
