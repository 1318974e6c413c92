"""The Alembic recipe for an application with its own migrations, proven with the real
``alembic`` command: the revision ``alkstore alembic-revision`` writes joins the app's chain
(one head), ``upgrade head`` installs both table families, ``check`` sees no change,
``downgrade`` past it removes only alkstore's tables, and ``--sql`` renders alkstore's DDL.
Also: a non-default alkstore schema end to end, and ``alkstore migrate --schema``."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa.cli import main
from alkstore_sa.cli.alembic_revision import previous_alkstore
from alkstore_sa.schema import VERSION_TABLE, metadata_for
from tests.conftest import require_pg
from tests.fresh_pg import fresh_pg_database
from tests.migrations.alembic_app import (
    ALEMBIC,
    ALKSTORE,
    ALKSTORE_TABLES,
    APP_REVISION,
    AlembicApp,
    write_app,
)
from tests.support import IN_CI, PG_URL, new_pg_schema, wait_for

# (engine, alkstore's PostgreSQL schema): its own non-default schema, or the app's `public`
# (where, as on SQLite, the app's autogenerate would see alkstore's tables).
ROOT = Path(__file__).resolve().parents[2]
CASES = [("sqlite", None), ("postgresql", "alk_custom"), ("postgresql", "public")]


@pytest.fixture(params=CASES, ids=["sqlite", "postgresql-own-schema", "postgresql-public"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[AlembicApp, str | None]]:
    kind, schema = request.param
    if kind == "sqlite":
        yield write_app(tmp_path, f"sqlite:///{tmp_path / 'app.db'}", kind), None
        return
    require_pg()
    with fresh_pg_database("alkapp") as url:
        yield write_app(tmp_path, url, kind), schema


def assert_refused(capsys: pytest.CaptureFixture[str], argv: list[str], pattern: str) -> None:
    """The CLI refuses ``argv`` as a usage error: exit 2 and one line on stderr matching ``pattern``."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err



def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_upgrade_check_downgrade(case: tuple[AlembicApp, str | None]) -> None:
    app, schema = case
    rev = app.generate(*(["--schema", schema] if schema else []))
    assert _ok(app.alembic("heads")).split() == [rev, "(head)"]  # one head: no branch
    _ok(app.alembic("upgrade", "head"))

    app_schema = None  # the app's tables: SQLite's main, or PostgreSQL's public
    assert "app_orders" in app.tables(app_schema)
    assert app.tables(schema) >= ALKSTORE_TABLES

    engine = sa.create_engine(app.url)
    store = alk.Store(engine, schema=schema or "alkstore")
    with Session(engine) as session, session.begin():  # the store's version check passes
        session.execute(sa.text("INSERT INTO app_orders (email) VALUES ('kept@example.com')"))
        job_id = alk.enqueue(session, store.queue("after-alembic"), {"n": 1})
    handle = store.queue("after-alembic").claim_one("w")
    assert handle is not None and handle.id == job_id and handle.ack()
    migrations.upgrade(engine, schema=schema or "alkstore")  # the packaged runner: at head already
    with engine.connect() as conn:
        assert migrations.current_revision(conn, schema or "alkstore") == migrations.head_revision()
    store.close()

    assert "No new upgrade operations detected" in _ok(app.alembic("check"))
    unfiltered = app.alembic("check", alkstore_filter=False)
    if schema in (None, "public"):  # alkstore's tables share the app's schema: the filter matters
        assert unfiltered.returncode != 0 and "remove_table" in unfiltered.stderr + unfiltered.stdout
        assert "alkstore_jobs" in unfiltered.stderr + unfiltered.stdout
    else:
        assert unfiltered.returncode == 0, unfiltered.stderr

    _ok(app.alembic("downgrade", APP_REVISION))
    assert not ALKSTORE_TABLES & app.tables(schema)
    assert {"app_orders", "alembic_version"} <= app.tables(app_schema)
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT email FROM app_orders")) == "kept@example.com"
        assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == APP_REVISION
    engine.dispose()
    _ok(app.alembic("upgrade", "head"))  # the downgrade left nothing in the way
    assert app.tables(schema) >= ALKSTORE_TABLES


def test_an_env_comparing_every_schema_needs_the_filter_too(tmp_path: Path) -> None:
    """An env.py with ``include_schemas=True`` (apps with several schemas) reflects
    alkstore's own schema as well: without ``include_name`` its ``alembic check`` fails with
    ``remove_table`` even though alkstore's tables are not in the app's schema, which
    install.md said was the case where the filter is not needed."""
    require_pg()
    with fresh_pg_database("alkschemas") as url:
        app = write_app(tmp_path, url, "postgresql")
        app.generate("--schema", "alk_own")
        every_schema = {"APP_CONFIGURE": '{"include_schemas": true}'}
        _ok(app.alembic("upgrade", "head", env_vars=every_schema))
        unfiltered = app.alembic("check", alkstore_filter=False, env_vars=every_schema)
        said = unfiltered.stdout + unfiltered.stderr
        assert unfiltered.returncode != 0 and "remove_table" in said and "alkstore_jobs" in said, said
        assert "No new upgrade operations detected" in _ok(app.alembic("check", env_vars=every_schema))
    recipe = " ".join(ROOT.joinpath("docs", "install.md").read_text().split("`include_name` skips", 1)[1]
                      .split("If your env already", 1)[0].split())
    assert "include_schemas=True" in recipe, recipe


# SQLAlchemy's documented naming convention, the one Flask-SQLAlchemy's docs recommend too
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _constraint_names(url: str, schema: str | None) -> dict[str, tuple[object, ...]]:
    """Per alkstore table: the names of its primary key, checks, indexes and uniques."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            return {
                table: (
                    insp.get_pk_constraint(table, schema=schema)["name"],
                    sorted(str(c["name"]) for c in insp.get_check_constraints(table, schema=schema)),
                    sorted(str(i["name"]) for i in insp.get_indexes(table, schema=schema)),
                    sorted(str(u["name"]) for u in insp.get_unique_constraints(table, schema=schema)),
                )
                for table in sorted(ALKSTORE_TABLES)
            }
    finally:
        engine.dispose()


def test_the_apps_naming_convention_does_not_rename_alkstores_constraints(
    case: tuple[AlembicApp, str | None], tmp_path: Path,
) -> None:
    """An app whose target_metadata has a naming convention (SQLAlchemy's documented one):
    Alembic builds `op.create_table`'s tables in a MetaData carrying it, so the generated
    revision named alkstore's primary keys `pk_alkstore_jobs` (not `alkstore_jobs_pkey`) and
    its check `ck_alkstore_jobs_alkstore_jobs_state_ck`: the schema depended on the way it
    was installed, and a later step naming a constraint would not find it in databases
    installed the other way. The steps now keep their own names whatever the app's env."""
    app, schema = case
    naming = {"APP_NAMING_CONVENTION": json.dumps(NAMING_CONVENTION)}
    app.generate(*(["--schema", schema] if schema else []))
    _ok(app.alembic("upgrade", "head", env_vars=naming))
    installed = _constraint_names(app.url, schema)

    if app.kind == "sqlite":  # the same release's `alkstore migrate`, elsewhere
        reference_url, reference_schema = f"sqlite:///{tmp_path / 'reference.db'}", None
    else:
        reference_url, reference_schema = app.url, new_pg_schema("alkref")
    engine = sa.create_engine(reference_url)
    migrations.upgrade(engine, schema=reference_schema or "alkstore")
    engine.dispose()
    assert installed == _constraint_names(reference_url, reference_schema)

    _ok(app.alembic("downgrade", APP_REVISION, env_vars=naming))
    assert not ALKSTORE_TABLES & app.tables(schema)


def test_two_apps_on_one_database_each_with_its_own_schema(tmp_path: Path) -> None:
    """install.md's recipe for two applications sharing one PostgreSQL database, each with
    its own Alembic chain: each its own alkstore schema (and its own Alembic version
    table). Each installs and uses its own queues, and one app's downgrade leaves the
    other's tables and jobs alone."""
    require_pg()
    with fresh_pg_database("alktwo") as url:
        a = write_app(tmp_path / "a", url, "postgresql")
        b = write_app(tmp_path / "b", url, "postgresql")
        (b.versions / f"{APP_REVISION}.py").unlink()
        b.add_migration("b_0001", None, "b_orders")
        b_env = {"APP_CONFIGURE": '{"version_table": "b_alembic_version"}'}
        a.generate("--schema", "alk_a")
        b.generate("--schema", "alk_b")
        _ok(a.alembic("upgrade", "head"))
        _ok(b.alembic("upgrade", "head", env_vars=b_env))
        with alk.Store(url, schema="alk_a") as store_a, alk.Store(url, schema="alk_b") as store_b:
            job = store_a.queue("emails").enqueue({"app": "a"})
            store_b.queue("emails").enqueue({"app": "b"})
            assert store_a.queue("emails").stats().pending == 1  # the same name, two queues
            _ok(b.alembic("downgrade", "b_0001", env_vars=b_env))
            with pytest.raises(alk.NotInstalled):
                store_b.check_schema()
            store_a.check_schema()
            found = store_a.get_job(job)
            assert found is not None and found.payload == {"app": "a"}
    said = " ".join(ROOT.joinpath("docs", "install.md").read_text().split())
    assert "### Two applications on one database" in said


def _recorded(app: AlembicApp, schema: str | None) -> str | None:
    engine = sa.create_engine(app.url)
    try:
        with engine.connect() as conn:
            return migrations.current_revision(conn, schema or "alkstore")
    finally:
        engine.dispose()


def test_chain_revision_skips_steps_alkstore_migrate_already_ran(case: tuple[AlembicApp, str | None]) -> None:
    """An app whose chain is at an older alkstore step, and whose database was moved ahead
    by `alkstore migrate` (the SchemaOutdated advice, or a deploy script): the chain's next
    generated revision applies only the steps alkstore's version table does not record (was:
    all of them again, "duplicate column name: unique_key"), never lowers the record, and
    its downgrade still takes out exactly its steps."""
    app, schema = case
    opts = ["--schema", schema] if schema else []
    first = app.generate(*opts, "--to-step", "1")
    _ok(app.alembic("upgrade", "head"))
    assert _recorded(app, schema) == "alkstore_0001"
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine, schema=schema or "alkstore")  # what `alkstore migrate` does
    engine.dispose()
    assert _recorded(app, schema) == migrations.head_revision()

    app.generate()  # steps 1 -> head, on top of the chain's step-1 revision
    _ok(app.alembic("upgrade", "head"))
    assert _recorded(app, schema) == migrations.head_revision()
    assert "No new upgrade operations detected" in _ok(app.alembic("check"))
    with alk.Store(app.url, schema=schema or "alkstore") as store:
        store.check_schema()
        job_id = store.queue("after-both").enqueue({"n": 1}, unique_key="k")
        assert store.queue("after-both").enqueue({"n": 2}, unique_key="k") == job_id

    _ok(app.alembic("downgrade", first))  # the later steps out: back at step 1
    assert _recorded(app, schema) == "alkstore_0001"
    _ok(app.alembic("downgrade", APP_REVISION))
    assert not ALKSTORE_TABLES & app.tables(schema)
    _ok(app.alembic("upgrade", "head"))  # and the whole chain runs again from nothing
    assert _recorded(app, schema) == migrations.head_revision()


def test_chain_revision_over_a_database_alkstore_migrate_installed(case: tuple[AlembicApp, str | None]) -> None:
    """A database installed by `alkstore migrate` before the app adopted the recipe: plain
    `alembic upgrade head` of the generated revisions runs nothing of alkstore's (no `stamp`
    needed), and a revision to an older step leaves the newer record as it is."""
    app, schema = case
    opts = ["--schema", schema] if schema else []
    _ok(app.alembic("upgrade", "head"))
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine, schema=schema or "alkstore")
    engine.dispose()
    app.generate(*opts, "--to-step", "1")
    _ok(app.alembic("upgrade", "head"))
    assert _recorded(app, schema) == migrations.head_revision()  # not lowered to step 1
    app.generate()
    _ok(app.alembic("upgrade", "head"))
    assert _recorded(app, schema) == migrations.head_revision()
    assert "No new upgrade operations detected" in _ok(app.alembic("check"))


# The transaction settings an app's env.py may run a SQLite chain with (alembic_app.ENV):
# the recipe as documented (Alembic's SQLite default, transactional_ddl False: a transaction
# per migration that the pysqlite driver only opens at the first INSERT, so DDL autocommits),
# transactional_ddl forced on (one SQLAlchemy transaction for the run, the driver still
# BEGIN-less before DDL), and SQLAlchemy's pysqlite recipe (driver handling off, BEGIN in a
# `begin` event: the steps run inside a real transaction).
SQLITE_TRANSACTIONS = {
    "recipe": {},
    "transactional-ddl": {"APP_CONFIGURE": '{"transactional_ddl": true, "transaction_per_migration": true}'},
    "begin-event": {"APP_SQLITE_BEGIN": "on"},
}


@pytest.mark.parametrize("env_vars", SQLITE_TRANSACTIONS.values(), ids=SQLITE_TRANSACTIONS.keys())
def test_chain_revision_is_all_or_nothing_on_sqlite(env_vars: dict[str, str], tmp_path: Path) -> None:
    """A generated revision failing part-way on SQLite (here step 3's CREATE TABLE
    alkstore_workers meets a table of that name: a stand-in for a crash or a full disk)
    leaves none of its steps behind, whatever transaction the app's env.py runs it in (was:
    steps 1 and 2 stayed, no version recorded anywhere, and every later `alembic upgrade
    head` or `alkstore migrate` failed with "table alkstore_jobs already exists"); once the
    cause is gone the next run installs everything. Its downgrade likewise."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'atomic.db'}", "sqlite")
    _ok(app.alembic("upgrade", "head", env_vars=env_vars))  # the app's own revision
    engine = sa.create_engine(app.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alkstore_workers (x)")
    app.generate()

    failed = app.alembic("upgrade", "head", env_vars=env_vars)
    assert failed.returncode != 0 and "alkstore_workers already exists" in failed.stdout + failed.stderr
    assert ALKSTORE_TABLES & app.tables(None) == {"alkstore_workers"}  # only the conflict itself
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == APP_REVISION

    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE alkstore_workers")
    _ok(app.alembic("upgrade", "head", env_vars=env_vars))
    assert app.tables(None) >= ALKSTORE_TABLES
    assert _recorded(app, None) == migrations.head_revision()
    with alk.Store(engine) as store:
        store.check_schema()
        job_id = store.queue("atomic").enqueue({"n": 1}, unique_key="k")
        assert store.queue("atomic").enqueue({"n": 2}, unique_key="k") == job_id

    with engine.begin() as conn:  # step 3's downgrade will fail at its last statement
        conn.exec_driver_sql("DROP TABLE alkstore_workers")
    failed = app.alembic("downgrade", APP_REVISION, env_vars=env_vars)
    assert failed.returncode != 0 and "alkstore_workers" in failed.stdout + failed.stderr
    assert app.tables(None) >= ALKSTORE_TABLES - {"alkstore_workers"}  # the version table too
    assert _recorded(app, None) == migrations.head_revision()
    with engine.connect() as conn:  # step 3's columns are still there
        assert "trace_context" in {c["name"] for c in sa.inspect(conn).get_columns("alkstore_jobs")}
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alkstore_workers (x)")
    _ok(app.alembic("downgrade", APP_REVISION, env_vars=env_vars))
    assert not ALKSTORE_TABLES & app.tables(None)
    engine.dispose()


def test_chain_revision_is_all_or_nothing_under_an_autocommit_env_on_postgresql(tmp_path: Path) -> None:
    """An env.py whose engine runs PostgreSQL in autocommit (``isolation_level="AUTOCOMMIT"``,
    an application engine reused for migrations): Alembic's transaction is then no
    transaction, and a generated revision failing part-way left steps 1 and 2 committed with
    no version recorded, after which every `alembic upgrade head` refused the tables as "made
    outside alkstore's migrations (`metadata.create_all()` ...)" (and the install lock ended
    with each statement). The steps and their record now run in a transaction of their own
    there: nothing of a failed run stays, the next run installs everything. Its downgrade
    likewise."""
    require_pg()
    autocommit = {"APP_ENGINE": '{"isolation_level": "AUTOCOMMIT"}'}
    with fresh_pg_database("alkautocommit") as url:
        app = write_app(tmp_path, url, "postgresql")
        _ok(app.alembic("upgrade", "head", env_vars=autocommit))  # the app's own revision
        engine = sa.create_engine(url)
        with engine.begin() as conn:  # a table in the way of step 3: a stand-in for a crash
            conn.exec_driver_sql("CREATE SCHEMA alkstore")
            conn.exec_driver_sql("CREATE TABLE alkstore.alkstore_workers (x integer)")
        app.generate()

        failed = app.alembic("upgrade", "head", env_vars=autocommit)
        assert failed.returncode != 0 and "alkstore_workers" in failed.stdout + failed.stderr
        assert app.tables("alkstore") == {"alkstore_workers"}  # only the conflict itself
        with engine.connect() as conn:
            assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == APP_REVISION

        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE alkstore.alkstore_workers")
        _ok(app.alembic("upgrade", "head", env_vars=autocommit))
        assert app.tables("alkstore") >= ALKSTORE_TABLES
        assert _recorded(app, "alkstore") == migrations.head_revision()
        with alk.Store(engine) as store:
            store.check_schema()
            job_id = store.queue("atomic").enqueue({"n": 1}, unique_key="k")
            assert store.queue("atomic").enqueue({"n": 2}, unique_key="k") == job_id

        with engine.begin() as conn:  # step 3's downgrade will fail at its last statement
            conn.exec_driver_sql("DROP TABLE alkstore.alkstore_workers")
        failed = app.alembic("downgrade", APP_REVISION, env_vars=autocommit)
        assert failed.returncode != 0 and "alkstore_workers" in failed.stdout + failed.stderr
        assert app.tables("alkstore") >= ALKSTORE_TABLES - {"alkstore_workers"}  # the version table too
        assert _recorded(app, "alkstore") == migrations.head_revision()
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE alkstore.alkstore_workers (x integer)")
        _ok(app.alembic("downgrade", APP_REVISION, env_vars=autocommit))
        assert not ALKSTORE_TABLES & app.tables("alkstore")
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_two_deploys_upgrading_at_once(kind: str, tmp_path: Path) -> None:
    """Two `alembic upgrade head` started together (two deploy jobs) over a pending generated
    revision: the steps run once — the second run waits for the first's install lock
    (PostgreSQL's advisory lock, SQLite's write lock), then finds them recorded — and a run
    that lost the race changes nothing and ends with Alembic's one FAILED line (its
    `alembic_version` moved under it), never a traceback. The database is then whole."""
    if kind == "postgresql":
        require_pg()
    with contextlib.ExitStack() as stack:
        url = (f"sqlite:///{tmp_path / 'deploy.db'}" if kind == "sqlite"
               else stack.enter_context(fresh_pg_database("alkdeploy")))
        app = write_app(tmp_path, url, kind)
        _ok(app.alembic("upgrade", "head"))  # the app's own revision, deployed before
        rev = app.generate()
        barrier = tmp_path / "barrier"
        barrier.mkdir()
        # SQLite: a busy timeout no slow machine outlasts while the other run holds the lock
        env_vars = {"APP_BARRIER": str(barrier), "APP_ENGINE": '{"connect_args": {"timeout": 120}}'
                    if kind == "sqlite" else "{}"}
        runs = [app.start_alembic("upgrade", "head", env_vars=env_vars) for _ in range(2)]
        try:
            wait_for(lambda: len(list(barrier.glob("ready-*"))) == 2, "both runs at the barrier", timeout=120)
            (barrier / "go").touch()
            outputs = [run.communicate(timeout=120)[0] for run in runs]
        finally:
            for run in runs:
                run.kill()
        codes = [run.returncode for run in runs]
        assert 0 in codes, outputs
        for code, said in zip(codes, outputs, strict=True):
            assert "Traceback" not in said, said
            if code != 0:
                assert "FAILED" in said and "expected to match one row" in said, said

        assert _recorded(app, "alkstore") == migrations.head_revision()
        assert app.tables("alkstore" if kind == "postgresql" else None) >= ALKSTORE_TABLES
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == rev
        with alk.Store(engine) as store:
            store.check_schema()
            assert store.queue("deployed").enqueue({"n": 1}) > 0
        engine.dispose()
        assert "No new upgrade operations detected" in _ok(app.alembic("check"))


WRITER = """\
import pathlib, sqlite3, sys, time
db, stop = sys.argv[1], pathlib.Path(sys.argv[2])
conn = sqlite3.connect(db, timeout=60)
while not stop.exists():
    with conn:  # the application's own short write transactions, one after another
        conn.execute("INSERT INTO app_orders (email) VALUES ('a@example.com')")
    time.sleep(0.001)  # not back-to-back: SQLite's busy handler is not fair to a waiting writer
"""


@pytest.mark.parametrize("env_vars", [SQLITE_TRANSACTIONS["recipe"], SQLITE_TRANSACTIONS["transactional-ddl"]],
                         ids=["recipe", "transactional-ddl"])
def test_chain_upgrade_on_sqlite_while_the_app_writes(env_vars: dict[str, str], tmp_path: Path) -> None:
    """The generated revision upgrading a live SQLite database (a rolling deploy: the app
    keeps writing its own rows): it read alkstore's version inside a deferred transaction,
    and its first CREATE TABLE then failed at once with "database is locked" (a stale
    snapshot, which no busy timeout waits out) whenever the app had committed in between.
    It takes the write lock before it reads, so it waits for the app's transaction instead."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'live.db'}", "sqlite")
    app.generate("--to-step", "2")
    _ok(app.alembic("upgrade", "head", env_vars=env_vars))
    app.generate()
    stop = tmp_path / "stop"
    db = str(tmp_path / "live.db")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, db, str(stop)])
    try:
        engine = sa.create_engine(app.url)
        with engine.connect() as conn:
            wait_for(lambda: conn.scalar(sa.text("SELECT count(*) FROM app_orders")) > 0, "the app writing")
        engine.dispose()
        _ok(app.alembic("upgrade", "head", env_vars=env_vars))
    finally:
        stop.touch()
        assert writer.wait(timeout=60) == 0
    assert _recorded(app, None) == migrations.head_revision()
    assert app.tables(None) >= ALKSTORE_TABLES


def test_chain_revision_over_a_database_the_packaged_runner_took_back_to_base(
    case: tuple[AlembicApp, str | None],
) -> None:
    """A database `alkstore migrate` installed and `alkstore_sa.migrations.downgrade` (or
    the checkout's `alembic downgrade base`) took out again keeps an empty version table:
    Alembic removes its row, never the table. The generated revision then failed with
    "table alkstore_alembic_version already exists"; it records its step in that table."""
    app, schema = case
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine, schema=schema or "alkstore")
    migrations.downgrade(engine, schema=schema or "alkstore")
    engine.dispose()
    assert _recorded(app, schema) is None
    app.generate(*(["--schema", schema] if schema else []))
    _ok(app.alembic("upgrade", "head"))
    assert _recorded(app, schema) == migrations.head_revision()
    with alk.Store(app.url, schema=schema or "alkstore") as store:
        store.check_schema()
    _ok(app.alembic("downgrade", APP_REVISION))
    assert not ALKSTORE_TABLES & app.tables(schema)


def test_chain_downgrade_refuses_a_database_recorded_beyond_it(tmp_path: Path) -> None:
    """Undoing the chain's step-1 revision under steps `alkstore migrate` ran later would
    leave a schema no step describes: refused, nothing changed; once the chain has the
    revision for those steps, the downgrade takes them all out."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'beyond.db'}", "sqlite")
    app.generate("--to-step", "1")
    _ok(app.alembic("upgrade", "head"))
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine)
    engine.dispose()
    refused = app.alembic("downgrade", APP_REVISION)
    said = refused.stdout + refused.stderr  # alembic prints its FAILED: line on stdout
    assert refused.returncode != 0 and "FAILED" in said and "alkstore alembic-revision" in said, said
    assert _recorded(app, None) == migrations.head_revision()
    assert app.tables(None) >= ALKSTORE_TABLES
    app.generate()
    _ok(app.alembic("upgrade", "head"))
    _ok(app.alembic("downgrade", APP_REVISION))
    assert not ALKSTORE_TABLES & app.tables(None)


def test_chain_revision_over_tables_made_outside_the_migrations(tmp_path: Path) -> None:
    """alkstore's tables made by `metadata.create_all()` (no version table): the generated
    revision refuses them with Alembic's one FAILED line saying what they are, instead of a
    driver traceback about `alkstore_jobs` already existing; nothing changes."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'created.db'}", "sqlite")
    app.generate()
    _ok(app.alembic("upgrade", APP_REVISION))
    engine = sa.create_engine(app.url)
    metadata_for(None).create_all(engine)
    engine.dispose()
    refused = app.alembic("upgrade", "head")
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "FAILED" in said and "create_all" in said, said
    assert "Traceback" not in said, said
    assert _recorded(app, None) is None
    assert app.tables(None) >= ALKSTORE_TABLES - {VERSION_TABLE}


@pytest.mark.parametrize("recorded", ["bogus", "alkstore_0009_r0009"])
def test_chain_revision_over_a_database_too_new_for_the_library(recorded: str, tmp_path: Path) -> None:
    """A pending generated revision over a database that records an alkstore revision this
    library cannot use (migrated by a newer release, or an unknown id): Alembic's one
    FAILED line saying to upgrade alkstore_sa, as the other refusals are, not a traceback;
    nothing changes."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'newer.db'}", "sqlite")
    app.generate("--to-step", "1")
    _ok(app.alembic("upgrade", "head"))
    app.generate()
    engine = sa.create_engine(app.url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = ?", (recorded,))
    engine.dispose()
    refused = app.alembic("upgrade", "head")
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "FAILED" in said and "upgrade alkstore_sa" in said, said
    assert "Traceback" not in said, said
    assert _recorded(app, None) == recorded


def _add_a_newer_releases_revision(app: AlembicApp, ours: str) -> int:
    """Add, on top of our generated revision ``ours`` (steps 0 -> head), the revision a newer
    alkstore_sa would generate for its step head + 1 (revision id ``teammates``); return head."""
    head = migrations.head_step()
    newer = next(app.versions.glob(f"{ours}_*.py")).read_text()
    assert f"ALKSTORE_STEPS = (0, {head})" in newer and f'down_revision = "{APP_REVISION}"' in newer
    newer = (newer.replace(f'revision = "{ours}"', 'revision = "teammates"')
             .replace(f'down_revision = "{APP_REVISION}"', f'down_revision = "{ours}"')
             .replace(f"ALKSTORE_STEPS = (0, {head})", f"ALKSTORE_STEPS = ({head}, {head + 1})"))
    (app.versions / f"teammates_alkstore_steps_{head}_to_{head + 1}.py").write_text(newer)
    return head


def test_generator_over_a_chain_a_newer_alkstore_extended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """`alkstore alembic-revision` of an older release over a chain that already reaches a
    newer release's step: it said only "need 0 <= from-step (4) <= to-step (3) <= 3". It
    says the chain is beyond this release and to upgrade alkstore_sa, and writes nothing."""
    app = write_app(tmp_path, "sqlite://", "sqlite")
    head = _add_a_newer_releases_revision(app, app.generate())
    before = set(app.versions.glob("*.py"))
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini)],
                   rf"reaches alkstore step {head + 1} .*ships steps up to {head}.*upgrade alkstore_sa")
    assert set(app.versions.glob("*.py")) == before


@pytest.mark.parametrize("sql", [False, True], ids=["online", "offline"])
def test_a_revision_from_a_newer_alkstore_run_by_an_older_one(sql: bool, tmp_path: Path) -> None:
    """A teammate's revision written by a newer alkstore_sa (steps 3 -> 4), run where the
    older release is still installed (the repository pulled, the requirements not yet):
    `alembic upgrade head` ended in a traceback, `KeyError: 4`, from inside the steps. It is
    refused with Alembic's one FAILED line saying to upgrade alkstore_sa, before anything
    runs; online the database is left as it was."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'older.db'}", "sqlite")
    ours = app.generate()
    _ok(app.alembic("upgrade", "head"))
    head = _add_a_newer_releases_revision(app, ours)

    refused = app.alembic("upgrade", f"{ours}:head" if sql else "head", *(["--sql"] if sql else []))
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "FAILED" in said and "upgrade alkstore_sa" in said, said
    assert f"step {head + 1}" in said and "Traceback" not in said, said
    assert _recorded(app, None) == migrations.head_revision()
    engine = sa.create_engine(app.url)
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == ours
    engine.dispose()


def test_adopting_a_database_installed_by_alkstore_migrate(tmp_path: Path) -> None:
    """The documented path for a database whose alkstore tables came from `alkstore migrate`
    or Store.install(): generate the revision, then `alembic stamp` it (its steps already
    ran). The chain then owns them: downgrade takes them out. (Engine-independent: stamp
    only writes the app's alembic_version.)"""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'adopt.db'}", "sqlite")
    _ok(app.alembic("upgrade", "head"))
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine)  # what `alkstore migrate` does
    rev = app.generate()
    _ok(app.alembic("stamp", rev))
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == rev
    store = alk.Store(engine)
    store.check_schema()
    store.close()
    _ok(app.alembic("downgrade", APP_REVISION))
    assert not ALKSTORE_TABLES & app.tables(None)
    engine.dispose()


def test_stamping_over_an_older_install_is_said_to_run_nothing(tmp_path: Path) -> None:
    """install.md said stamping the generated revision "does the same" as upgrading over a
    database `alkstore migrate` installed. It runs no step: over an older install the chain
    then claims a step the tables lack (SchemaOutdated, and nothing left to generate), which
    only `alkstore migrate` repairs. The docs say so; `alembic upgrade head` does the right
    thing (the steps it lacks)."""
    adopt = " ".join(ROOT.joinpath("docs", "install.md").read_text().split(
        "### Already installed with `alkstore migrate`", 1)[1].split("###", 1)[0].split())
    assert "does the same for alkstore's tables" not in adopt
    assert "`alembic stamp <generated revision id>` runs nothing" in adopt
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'older.db'}", "sqlite")
    _ok(app.alembic("upgrade", "head"))
    engine = sa.create_engine(app.url)
    migrations.upgrade(engine, revision=migrations.step_revision(1))  # an earlier release's install
    rev = app.generate()
    _ok(app.alembic("stamp", rev))
    store = alk.Store(engine)
    with pytest.raises(alk.SchemaOutdated):
        store.check_schema()
    before = set(app.versions.glob("*.py"))
    assert main(["alembic-revision", "-c", str(app.ini)]) == 0
    assert set(app.versions.glob("*.py")) == before  # "nothing to generate"
    migrations.upgrade(engine)  # `alkstore migrate` repairs it
    store.check_schema()
    store.close()
    engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_offline_sql_renders_alkstore_ddl(kind: str, tmp_path: Path) -> None:
    """``--sql`` needs no database: the steps are written with alembic.op."""
    url = f"sqlite:///{tmp_path / 'never.db'}" if kind == "sqlite" else PG_URL
    app = write_app(tmp_path, url, kind)
    rev = app.generate("--schema", "alk_offline")
    q = "" if kind == "sqlite" else "alk_offline."  # SQLite: prefixed tables, no schema

    up = _ok(app.alembic("upgrade", "head", "--sql"))
    assert up.index("CREATE TABLE app_orders") < up.index(f"CREATE TABLE {q}alkstore_jobs")
    assert f"CREATE INDEX alkstore_jobs_pending_ix ON {q}alkstore_jobs" in up
    assert f"INSERT INTO {q}{VERSION_TABLE} (version_num) VALUES ('{migrations.head_revision()}')" in up
    assert f"CREATE UNIQUE INDEX alkstore_jobs_unique_ix ON {q}alkstore_jobs (queue, unique_key) WHERE unique_key IS NOT NULL" in up
    assert f"UPDATE alembic_version SET version_num='{rev}'" in up
    if kind == "sqlite":  # the steps as one unit for a runner that stops at an error (sqlite3 -bail)
        assert up.index("CREATE TABLE app_orders") < up.index("SAVEPOINT alkstore_steps;") < up.index("CREATE TABLE alkstore_jobs")
        assert up.index(f"INSERT INTO {VERSION_TABLE}") < up.index("RELEASE alkstore_steps;") < up.index("UPDATE alembic_version")
    assert not (tmp_path / "never.db").exists()

    down = _ok(app.alembic("downgrade", f"{rev}:{APP_REVISION}", "--sql"))
    assert f"DROP TABLE {q}{VERSION_TABLE}" in down and f"DROP TABLE {q}alkstore_jobs" in down
    assert "DROP TABLE app_orders" not in down
    if kind == "sqlite":
        assert down.index("SAVEPOINT alkstore_steps;") < down.index(f"DROP TABLE {VERSION_TABLE}") < down.index("RELEASE alkstore_steps;")


def _shell(kind: str, url: str, script: str) -> None:
    """Apply an offline script the way its reader would: ``sqlite3 -bail`` or ``psql`` with
    ON_ERROR_STOP, each stopping at the first error."""
    if kind == "sqlite":
        argv = [shutil.which("sqlite3") or "sqlite3", "-bail", sa.make_url(url).database or ""]
    else:
        argv = [shutil.which("psql") or "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)]
    if shutil.which(argv[0]) is None:
        reason = f"needs the {Path(argv[0]).name} command"
        if IN_CI:  # .ci/run's machine has both shells: missing one there is a broken run
            pytest.fail(reason)
        pytest.skip(reason)
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("case", "offline_transaction"),
    # transactional_ddl on SQLite only: PostgreSQL's scripts are in BEGIN ... COMMIT either way
    [(c, False) for c in CASES] + [(CASES[0], True)],
    ids=["sqlite", "postgresql-own-schema", "postgresql-public", "sqlite-transactional-ddl"],
    indirect=["case"],
)
def test_offline_sql_applied_by_the_database_shell(
    case: tuple[AlembicApp, str | None], offline_transaction: bool
) -> None:
    """`alembic upgrade head --sql` applied with sqlite3 / psql builds what metadata declares
    and records its version; the downgrade script takes it out again. On SQLite the script
    switched nothing to WAL (env.py's enable_wal runs online only): every Store then warned
    "journal_mode=delete, not WAL ... enable_wal(connection) in your Alembic env.py", advice
    an offline install cannot take. The script now switches it before the steps, where no
    transaction is open (Alembic's SQLite default); in a script that Alembic wraps in BEGIN
    (transactional_ddl) SQLite refuses the switch, so it is left out there."""
    app, schema = case
    rev = app.generate(*(["--schema", schema] if schema else []))
    env = {"APP_CONFIGURE": json.dumps({"transactional_ddl": offline_transaction})}
    _shell(app.kind, app.url, _ok(app.alembic("upgrade", "head", "--sql", env_vars=env)))
    engine = sa.create_engine(app.url)
    try:
        with engine.connect() as conn:
            assert migrations.current_revision(conn, schema or "alkstore") == migrations.head_revision()
            assert conn.scalar(sa.text("SELECT version_num FROM alembic_version")) == rev
            if app.kind == "sqlite":
                mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
                assert mode == ("delete" if offline_transaction else "wal")
        diff = _schema_diff(engine, None if schema == "public" else schema)  # public: the default schema
        assert diff == [], diff
        with alk.Store(app.url, schema=schema or "alkstore") as store:
            q = store.queue("offline")
            q.enqueue({"n": 1}, unique_key="k")
            handle = q.claim_one("w")
            assert handle is not None and handle.ack()
    finally:
        engine.dispose()
    _shell(app.kind, app.url, _ok(app.alembic("downgrade", f"{rev}:{APP_REVISION}", "--sql", env_vars=env)))
    assert not ALKSTORE_TABLES & app.tables(schema)


def _schema_diff(engine: sa.Engine, schema: str | None) -> list[object]:
    """alkstore's tables as built against what metadata declares."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    def only_alkstore(name: str | None, type_: str, _parent: object) -> bool:
        if type_ == "schema":
            return name == schema
        return type_ != "table" or (str(name).startswith("alkstore_") and name != VERSION_TABLE)

    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_schemas": schema is not None, "include_name": only_alkstore}
        )
        return list(compare_metadata(ctx, metadata_for(schema)))

def test_generator_continues_from_the_marker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A later run reads the step and schema of the earlier generated revision, through the
    app's own later revisions, and writes only what is missing (here: nothing)."""
    app = write_app(tmp_path, "sqlite://", "sqlite")
    rev = app.generate("--schema", "jobs")
    app.add_migration("app_0003", rev, "app_invoices")
    script = ScriptDirectory.from_config(Config(str(app.ini)))
    assert previous_alkstore(script, "app_0003") == (migrations.steps.HEAD, "jobs")
    assert previous_alkstore(script, APP_REVISION) == (0, None)

    before = sorted(app.versions.iterdir())
    assert main(["alembic-revision", "-c", str(app.ini)]) == 0
    assert "nothing to generate" in capsys.readouterr().out
    assert sorted(app.versions.iterdir()) == before
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "--schema", "elsewhere", "--from-step", "0"], "'jobs'")  # moving the tables is not a step
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "--to-step", str(migrations.steps.HEAD + 1)], "to-step")
    assert sorted(app.versions.iterdir()) == before


def test_generator_reads_alkstore_schema_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other `alkstore` command takes its schema from $ALKSTORE_SCHEMA; the generator
    baked 'alkstore' into the revision while the worker, `status`, ... looked in the schema
    the variable names (NotInstalled there, tables in the other). It reads the variable
    too; --schema wins over it; and a variable that contradicts the chain's earlier
    revision is refused, naming it, before anything is written."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'env.db'}", "sqlite")
    monkeypatch.setenv("ALKSTORE_SCHEMA", "jobs")
    first = app.generate("--to-step", "1")
    assert _marker_schema(app, first) == "jobs"
    second = app.generate("--to-step", "2")  # the same schema: continues
    assert _marker_schema(app, second) == "jobs"
    monkeypatch.setenv("ALKSTORE_SCHEMA", "other")
    before = set(app.versions.glob("*.py"))
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini)], r"'jobs'.*'other'.*ALKSTORE_SCHEMA")
    assert set(app.versions.glob("*.py")) == before
    third = app.generate("--schema", "jobs")  # --schema wins
    assert _marker_schema(app, third) == "jobs"
    monkeypatch.setenv("ALKSTORE_SCHEMA", "")  # unset in effect: the chain's schema
    app.versions.joinpath(next(p.name for p in app.versions.glob(f"{third}_*.py"))).unlink()
    fourth = app.generate()
    assert _marker_schema(app, fourth) == "jobs"


def test_generator_reads_the_config_alembic_config_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``alembic`` reads the ini $ALEMBIC_CONFIG names when ``-c`` is not given; the generator
    looked for ./alembic.ini only ("no alembic.ini", exit 2, where ``alembic`` worked)."""
    app = write_app(tmp_path, "sqlite://", "sqlite")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("ALEMBIC_CONFIG", str(app.ini))
    assert main(["alembic-revision", "--rev-id", "alk_env"]) == 0, capsys.readouterr().err
    assert "revises" in capsys.readouterr().out
    assert list(app.versions.glob("alk_env_*.py"))


def test_generator_reads_a_flask_migrate_project(tmp_path: Path) -> None:
    """Flask-Migrate's ``flask db init`` writes ``migrations/alembic.ini`` without
    ``script_location`` (Flask-Migrate sets it to the ini's own directory at run time): the
    generator, given that ini, takes the directory too (was: "No 'script_location' key found
    in configuration.", exit 2)."""
    _ok(subprocess.run([ALEMBIC, "init", "migrations"], cwd=tmp_path, capture_output=True, text=True, timeout=120))
    ini = tmp_path / "migrations" / "alembic.ini"
    (tmp_path / "alembic.ini").rename(ini)
    ini.write_text(re.sub(r"(?m)^(script_location|sqlalchemy\.url|prepend_sys_path|path_separator) = .*$", "", ini.read_text()))
    (tmp_path / "migrations" / "versions" / "app_1_orders.py").write_text(
        'revision = "app_1"\ndown_revision = None\nbranch_labels = None\ndepends_on = None\n\n\n'
        "def upgrade() -> None:\n    pass\n\n\ndef downgrade() -> None:\n    pass\n"
    )
    out = _ok(subprocess.run([ALKSTORE, "alembic-revision", "-c", "migrations/alembic.ini", "--rev-id", "alk_1"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120))
    assert "revises app_1" in out, out
    assert list((tmp_path / "migrations" / "versions").glob("alk_1_alkstore_steps_0_to_*.py"))


def _marker_schema(app: AlembicApp, rev: str) -> str:
    script = ScriptDirectory.from_config(Config(str(app.ini)))
    return str(script.get_revision(rev).module.ALKSTORE_SCHEMA)  # type: ignore[union-attr]


def test_generator_reads_a_named_section_of_a_multi_environment_ini(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """An ini with one section per environment, run as `alembic -n appdb ...` (Alembic's
    "multiple environments from one .ini file"): the generator read only `[alembic]` and
    said "No 'script_location' key found in configuration". `-n NAME` reads the section
    `alembic -n NAME` does, and without it the refusal says to give one."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'named.db'}", "sqlite")
    app.ini.write_text(app.ini.read_text().replace("[alembic]", "[appdb]"))
    before = set(app.versions.glob("*.py"))
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini)], r"no \[alembic\] section.*-n NAME")
    assert set(app.versions.glob("*.py")) == before
    assert main(["alembic-revision", "-c", str(app.ini), "-n", "appdb"]) == 0
    (new,) = set(app.versions.glob("*.py")) - before
    assert f'down_revision = "{APP_REVISION}"' in new.read_text()
    _ok(app.alembic("-n", "appdb", "upgrade", "head"))
    assert _recorded(app, None) == migrations.head_revision()
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "-n", "nosuch"], r"no \[nosuch\] section")


def test_generator_refuses_two_heads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = write_app(tmp_path, "sqlite://", "sqlite")
    app.add_migration("app_0002a", APP_REVISION, "app_a")
    app.add_migration("app_0002b", APP_REVISION, "app_b")
    # what to do, in our terms (was Alembic's raw "Please use get_heads(), ...")
    capsys.readouterr()
    assert main(["alembic-revision", "-c", str(app.ini)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "2 heads (app_0002a, app_0002b)" in err, err
    assert "`alembic merge heads`" in err and "--down-revision REV" in err, err
    assert "get_heads" not in err and "get_current_head" not in err, err
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "--down-revision", "app_0002c"], "app_0002c")
    rev = app.generate("--down-revision", "app_0002a")
    assert 'down_revision = "app_0002a"' in next(app.versions.glob(f"{rev}_*.py")).read_text()


def test_generator_refuses_a_second_install_on_another_branch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An app with two heads (two branches it keeps apart) whose alkstore revision sits on
    one of them: after a library upgrade the generator asks for --down-revision, and given
    the other branch's head it wrote a second install, steps 0 -> 3, beside the first (which
    it did not see): `alembic upgrade heads` ran it as 2 -> 3, and downgrading that branch
    alone then dropped every alkstore table under the other branch's revision (online), and
    `upgrade heads --sql` created them twice. The generator refuses, naming the earlier
    revision and the head that continues from it, and writes nothing: one chain, one line of
    alkstore revisions."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'branches.db'}", "sqlite")
    app.add_migration("other_0001", None, "app_other")  # a second root: the app has two heads
    first = app.generate("--down-revision", APP_REVISION, "--to-step", "2")
    before = sorted(app.versions.iterdir())
    capsys.readouterr()
    assert main(["alembic-revision", "-c", str(app.ini)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"2 heads ({first}, other_0001)" in err and f"alkstore's revisions continue on {first}" in err, err
    for down in ("other_0001", APP_REVISION):  # another branch; below the earlier revision
        assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "--down-revision", down],
                       rf"{first} \(alkstore steps 0 -> 2, schema 'alkstore'\) is not below {down}.*--down-revision {first}")
    assert sorted(app.versions.iterdir()) == before
    # on the branch that carries it: the missing steps only
    rev = app.generate("--down-revision", first)
    assert next(app.versions.glob(f"{rev}_*.py")).name.endswith(f"_alkstore_steps_2_to_{migrations.steps.HEAD}.py")
    _ok(app.alembic("upgrade", "heads"))
    assert _recorded(app, None) == migrations.head_revision()
    # nor a second line for another schema: once the heads were merged, later runs continued
    # one schema and refused the other ("cannot move the tables")
    before = sorted(app.versions.iterdir())
    assert_refused(capsys, ["alembic-revision", "-c", str(app.ini), "--down-revision", "other_0001",
                            "--schema", "app_b"], rf"is not below other_0001.*--down-revision {rev}")
    assert sorted(app.versions.iterdir()) == before


@pytest.mark.parametrize("down", ["head", "app_00", "app_0001@head"])
def test_generator_writes_the_revision_a_symbolic_down_revision_names(tmp_path: Path, down: str) -> None:
    """--down-revision takes what alembic takes (`head`, a unique prefix of an id, a
    `rev@head`): it was checked as such, then written into the file as given, e.g.
    `down_revision = "head"`, which is no revision, so every alembic command of the app
    then failed with a KeyError traceback until the file was deleted. The file names the
    revision's full id."""
    app = write_app(tmp_path, f"sqlite:///{tmp_path / 'symbolic.db'}", "sqlite")
    rev = app.generate("--down-revision", down)
    assert f'down_revision = "{APP_REVISION}"' in next(app.versions.glob(f"{rev}_*.py")).read_text()
    assert _ok(app.alembic("heads")).split() == [rev, "(head)"]

def test_generator_without_an_alembic_ini(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a config every choice must be explicit; then it writes where it is told."""
    monkeypatch.chdir(tmp_path)  # no ./alembic.ini here
    assert_refused(capsys, ["alembic-revision", "--version-path", "out", "--down-revision", "app_9"], "--from-step")
    assert not (tmp_path / "out").exists()
    assert main(["alembic-revision", "--version-path", "out", "--down-revision", "app_9",
                 "--from-step", "0", "--rev-id", "r1"]) == 0
    text = (tmp_path / "out" / f"r1_alkstore_steps_0_to_{migrations.steps.HEAD}.py").read_text()
    assert 'revision = "r1"' in text and 'down_revision = "app_9"' in text
    assert f"ALKSTORE_STEPS = (0, {migrations.steps.HEAD})" in text
    compile(text, "generated", "exec")  # valid Python


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("alembic.ini", b"[alembic\nscript_location = migrations\n"),
        ("alembic.ini", b"[alembic]\nscript_location = %(here)s/%(oops\n"),
        ("alembic.ini", b"\xff\xfe[alembic]\n"),
        ("pyproject.toml", b"[tool.alembic\nscript_location = 'migrations'\n"),
    ],
    ids=["ini-no-section", "ini-interpolation", "ini-not-utf8", "toml-syntax"],
)
def test_generator_names_an_app_config_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, content: bytes
) -> None:
    """A broken alembic.ini or pyproject.toml is the app's file to fix: a usage error (exit
    2) saying which configuration could not be read, and nothing written — was "unexpected
    error: MissingSectionHeaderError …" (or InterpolationSyntaxError, UnicodeDecodeError,
    TOMLDecodeError), exit 1, with the hint to look for a bug in alkstore."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes(content)
    if name == "pyproject.toml" and "toml_file" not in inspect.signature(Config).parameters:
        pytest.skip("Alembic < 1.16 does not read pyproject.toml")
    assert_refused(capsys, ["alembic-revision"], r"^alkstore: alembic-revision: the app's Alembic configuration \(alembic\.ini")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.skipif("toml_file" not in inspect.signature(Config).parameters, reason="Alembic < 1.16: no pyproject template")
def test_generator_reads_a_pyproject_toml_project(tmp_path: Path) -> None:
    """``alembic init --template pyproject`` keeps ``script_location`` in pyproject.toml's
    [tool.alembic], not in alembic.ini: the generator reads both, as ``alembic`` does (was:
    "No 'script_location' key found in configuration.", exit 2)."""
    project = tmp_path / "proj"
    project.mkdir()
    _ok(subprocess.run([ALEMBIC, "init", "--template", "pyproject", "migrations"], cwd=project,
                       capture_output=True, text=True, timeout=120))
    ini = project / "alembic.ini"
    ini.write_text(re.sub(r"(?m)^sqlalchemy\.url = .*$", f"sqlalchemy.url = sqlite:///{project / 'app.db'}", ini.read_text()))
    alembic = [ALEMBIC, "-c", str(ini)]
    _ok(subprocess.run([*alembic, "revision", "-m", "orders", "--rev-id", "app_1"], cwd=project,
                       capture_output=True, text=True, timeout=120))

    out = _ok(subprocess.run([ALKSTORE, "alembic-revision", "--rev-id", "alk_1"], cwd=project,
                             capture_output=True, text=True, timeout=120))
    assert "revises app_1" in out, out
    # -c from another directory: the pyproject.toml next to that ini is the one read
    out = _ok(subprocess.run([ALKSTORE, "alembic-revision", "-c", str(ini)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120))
    assert "nothing to generate" in out, out
    assert _ok(subprocess.run([*alembic, "heads"], cwd=project, capture_output=True, text=True, timeout=120)).split() == ["alk_1", "(head)"]
    _ok(subprocess.run([*alembic, "upgrade", "head"], cwd=project, capture_output=True, text=True, timeout=120))
    with alk.Store(f"sqlite:///{project / 'app.db'}") as store:
        store.check_schema()  # alkstore's tables at this library's head


@pytest.mark.skipif("toml_file" not in inspect.signature(Config).parameters, reason="Alembic < 1.16: no pyproject template")
def test_generator_reads_a_project_whose_only_config_is_pyproject_toml(tmp_path: Path) -> None:
    """A project configured in pyproject.toml's [tool.alembic] alone, which ``alembic`` runs
    (its alembic.ini is optional; ``-c pyproject.toml`` names that file): the generator read
    it the same way (was: "no alembic.ini: pass -c path/to/alembic.ini ...", exit 2)."""
    project = tmp_path / "proj"
    project.mkdir()
    _ok(subprocess.run([ALEMBIC, "init", "--template", "pyproject", "migrations"], cwd=project,
                       capture_output=True, text=True, timeout=120))
    (project / "alembic.ini").unlink()
    _ok(subprocess.run([ALEMBIC, "revision", "-m", "orders", "--rev-id", "app_1"], cwd=project,
                       capture_output=True, text=True, timeout=120))
    out = _ok(subprocess.run([ALKSTORE, "alembic-revision", "--rev-id", "alk_1"], cwd=project,
                             capture_output=True, text=True, timeout=120))
    assert "revises app_1" in out, out
    out = _ok(subprocess.run([ALKSTORE, "alembic-revision", "-c", str(project / "pyproject.toml")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120))
    assert "nothing to generate" in out, out
    assert _ok(subprocess.run([ALEMBIC, "heads"], cwd=project, capture_output=True, text=True,
                              timeout=120)).split() == ["alk_1", "(head)"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_cli_migrate_with_a_custom_schema(kind: str, tmp_path: Path) -> None:
    """``alkstore migrate --schema`` (the console script), then a store and a transactional
    enqueue on that schema."""
    if kind == "postgresql":
        require_pg()
        url, schema = PG_URL, new_pg_schema("cli_custom")
    else:
        url, schema = f"sqlite:///{tmp_path / 'cli.db'}", "ignored_on_sqlite"
    try:
        for _ in range(2):  # idempotent
            out = subprocess.run(
                [ALKSTORE, "migrate", "--url", url, "--schema", schema],
                capture_output=True, text=True, timeout=120,
            )
            assert out.returncode == 0, out.stderr
            assert f"alkstore schema at {migrations.head_revision()}" in out.stdout
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names(schema=None if kind == "sqlite" else schema))
        assert names >= ALKSTORE_TABLES
        store = alk.Store(engine, schema=schema)
        with Session(engine) as session, session.begin():  # finds the schema via the registry
            job_id = alk.enqueue(session, "custom", {"schema": schema})
        handle = store.queue("custom").claim_one("w")
        assert handle is not None and handle.id == job_id and handle.payload == {"schema": schema}
        assert handle.ack()
        store.close()
        engine.dispose()
    finally:
        if kind == "postgresql":
            cleanup = sa.create_engine(PG_URL)
            with cleanup.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            cleanup.dispose()
