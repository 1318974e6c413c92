"""The migrations are the one definition of the schema: what they build equals `metadata`,
on both engines; `install()` is idempotent; the checkout's `alembic` command works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

import alkstore_sa as alk
from alkstore_sa import migrations
from alkstore_sa.schema import VERSION_TABLE, metadata_for
from tests.conftest import require_pg
from tests.support import PG_URL, Target, new_pg_schema

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = str(Path(sys.executable).with_name("alembic"))


def _diff(db: Target, md: sa.MetaData) -> list[object]:
    schema = None if db.kind == "sqlite" else db.schema

    def include_name(name: str | None, type_: str, _parent: object) -> bool:
        if type_ == "schema":
            return name == schema  # None: SQLite's only schema; else only the alkstore one
        return name != VERSION_TABLE

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "include_schemas": schema is not None, "include_name": include_name},
        )
        return compare_metadata(ctx, md)


def test_migrated_schema_equals_metadata(db: Target) -> None:
    md = metadata_for(None if db.kind == "sqlite" else db.schema)
    assert _diff(db, md) == []


def test_compare_detects_a_difference(db: Target) -> None:
    """The comparison above can fail: a column the migrations never made is reported."""
    md = metadata_for(None if db.kind == "sqlite" else db.schema)
    next(t for t in md.tables.values() if t.name == "alkstore_jobs").append_column(
        sa.Column("not_migrated", sa.Integer)
    )
    diff = _diff(db, md)
    assert any(d[0] == "add_column" and d[3].name == "not_migrated" for d in diff)  # type: ignore[index]


def test_install_is_idempotent_and_recorded(db: Target) -> None:
    store = db.store()
    store.install()
    store.install()
    with db.engine.connect() as conn:
        assert migrations.current_revision(conn, db.schema) == migrations.head_revision()
    q = store.queue("idempotent")
    job_id = q.enqueue(1)
    assert q.get_job(job_id) is not None  # the tables answer after a repeated install
    store.close()


UNUSABLE = "schema must be a non-empty str of at most 63 bytes without NUL"
DOTTED = "schema must not contain '.'"
NOT_UNICODE = "schema must be valid Unicode (no lone surrogates)"


@pytest.mark.parametrize(
    ("schema", "message"),
    [("", UNUSABLE), ("s" * 64, UNUSABLE), ("a\x00b", UNUSABLE), ("a.b", DOTTED), ("tenant.", DOTTED), (".x", DOTTED),
     ("bad\udcff", NOT_UNICODE)],
    ids=["empty", "64-bytes", "nul", "a.b", "tenant.", ".x", "lone-surrogate"],
)
def test_migrations_refuse_an_unusable_schema_as_the_store_does(db: Target, schema: str, message: str) -> None:
    """``migrations.upgrade``/``downgrade`` check the schema name as ``Store`` does, before
    any SQL (an empty one was an IndexError from SQLAlchemy's quoting on PostgreSQL). A
    dotted one Alembic reads as ``database.schema``: a Store on ``a.b`` was made, and its
    install failed at the first ALTER TABLE with PostgreSQL's 'cross-database references
    are not implemented' (a DatabaseError): such a store could never work. A lone surrogate
    (what Python makes of an argument or variable that is not UTF-8, ``--schema $'bad\\xff'``)
    was taken, and the first operation on PostgreSQL failed with a UnicodeEncodeError."""
    with pytest.raises(alk.InvalidOptions, match=re.escape(message)):
        alk.Store(db.engine, schema=schema)
    for run in (migrations.upgrade, migrations.downgrade):
        with pytest.raises(alk.InvalidOptions, match=re.escape(message)):
            run(db.engine, schema=schema)
    if db.kind == "postgresql" and message == DOTTED:  # (a NUL cannot even be a parameter)
        assert db.scalar("SELECT count(*) FROM pg_namespace WHERE nspname = :s", s=schema) == 0


def test_not_installed_is_a_clear_error(tmp_path: Path) -> None:
    store = alk.Store(f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(alk.NotInstalled, match="alkstore migrate"):
        store.queue("q").enqueue(1)
    store.close()


def test_not_installed_postgresql() -> None:
    require_pg()
    store = alk.Store(PG_URL, schema=new_pg_schema("missing"))
    with pytest.raises(alk.NotInstalled):
        store.queue("q").stats()
    store.close()


def _alembic(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ALEMBIC, *args], cwd=ROOT, env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=120,
    )


def test_checkout_alembic_upgrade_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    up = _alembic("upgrade", "head", env={"ALKSTORE_DATABASE_URL": url})
    assert up.returncode == 0, up.stderr
    cur = _alembic("-x", f"url={url}", "current")
    assert f"{migrations.head_revision()} (head)" in cur.stdout
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        names = set(sa.inspect(conn).get_table_names())
    assert {"alkstore_jobs", "alkstore_dead_jobs", VERSION_TABLE} <= names
    down = _alembic("-x", f"url={url}", "downgrade", "base")
    assert down.returncode == 0, down.stderr
    with engine.connect() as conn:
        assert not {"alkstore_jobs", "alkstore_dead_jobs"} & set(sa.inspect(conn).get_table_names())
    engine.dispose()


def test_checkout_alembic_upgrade_postgresql_custom_schema() -> None:
    require_pg()
    schema = new_pg_schema("cli schema")
    try:
        up = _alembic("-x", f"url={PG_URL}", "-x", f"schema={schema}", "upgrade", "head")
        assert up.returncode == 0, up.stderr
        engine = sa.create_engine(PG_URL)
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names(schema=schema))
        assert {"alkstore_jobs", "alkstore_dead_jobs", VERSION_TABLE} <= names
        store = alk.Store(engine, schema=schema)
        q = store.queue("cli")
        job_id = q.enqueue({"x": 1})
        assert q.claim_one("w").id == job_id  # type: ignore[union-attr]
        store.close()
        engine.dispose()
    finally:
        engine = sa.create_engine(PG_URL)
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


def test_checkout_alembic_offline_sql() -> None:
    out = _alembic("-x", f"url={PG_URL}", "-x", "schema=offline_s", "upgrade", "head", "--sql")
    assert out.returncode == 0, out.stderr
    sql = out.stdout
    assert sql.index("CREATE SCHEMA IF NOT EXISTS offline_s") < sql.index("alkstore_alembic_version")
    assert "CREATE TABLE offline_s.alkstore_jobs" in sql
    assert "CREATE INDEX alkstore_jobs_pending_ix ON offline_s.alkstore_jobs (queue, priority DESC, run_at, id) WHERE state = 'pending'" in sql


def test_outdated_schema_fails_fast_naming_the_command(db: Target) -> None:
    """A store on a database whose recorded alkstore revision is not this library's head
    refuses its first operation with SchemaOutdated (a NotInstalled)."""
    version = db.table(VERSION_TABLE)
    db.execute(f"UPDATE {version} SET version_num = 'alkstore_0000'")
    try:
        store = db.store()
        with pytest.raises(alk.SchemaOutdated, match="alkstore migrate") as info:
            store.queue("outdated").enqueue(1)
        assert isinstance(info.value, alk.NotInstalled)
        assert "alkstore_0000" in str(info.value)
        store.close()
    finally:
        db.execute(f"UPDATE {version} SET version_num = :r", r=migrations.head_revision())


@pytest.fixture(params=["sqlite", "postgresql"])
def previous_step(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[alk.Store]:
    """A database migrated to the step before this library's head (the library was upgraded,
    the database not yet), with its store registered for the engine."""
    if request.param == "sqlite":
        engine, schema = sa.create_engine(f"sqlite:///{tmp_path / 'previous.db'}"), "alkstore"
    else:
        require_pg()
        engine, schema = sa.create_engine(PG_URL), new_pg_schema("previous")
    previous = migrations.step_revision(migrations.parse_revision(migrations.head_revision())[0] - 1)  # type: ignore[index]
    migrations.upgrade(engine, schema=schema, revision=previous)  # type: ignore[arg-type]
    yield from _store_then_drop(engine, schema, request.param)


def test_caller_transaction_on_an_outdated_schema_says_schema_outdated(previous_step: alk.Store) -> None:
    """The caller's-transaction forms check no version before they run (that would be a read
    in the caller's transaction); a statement that meets the older schema's missing column
    is still the SchemaOutdated the store's own operations raise, naming the command, not a
    driver error about a column."""
    engine = previous_step.engine
    with engine.connect() as conn:
        with pytest.raises(alk.SchemaOutdated, match="alkstore migrate") as info:
            alk.get_job(conn, "q", 1)
        assert isinstance(info.value, alk.NotInstalled)
        assert "older" in str(info.value)


@pytest.fixture(params=["sqlite", "postgresql"])
def created_without_migrations(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[alk.Store]:
    """alkstore's tables made by ``metadata.create_all()`` (a test setup, or a revision
    autogenerated with ``alkstore_sa.metadata`` in ``target_metadata``): no version table."""
    if request.param == "sqlite":
        engine, schema = sa.create_engine(f"sqlite:///{tmp_path / 'created.db'}"), "alkstore"
    else:
        require_pg()
        engine, schema = sa.create_engine(PG_URL), new_pg_schema("created")
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    metadata_for(None if request.param == "sqlite" else schema).create_all(engine)
    yield from _store_then_drop(engine, schema, request.param)


def test_tables_made_outside_the_migrations_are_said_so(created_without_migrations: alk.Store) -> None:
    """Tables without alkstore's version table are not "not installed": `alkstore migrate`
    would fail on them ("table alkstore_jobs already exists"). Both the store's check and
    install() say what the database holds and what to do, and install() changes nothing."""
    store = created_without_migrations
    with pytest.raises(alk.NotInstalled, match="no version is recorded") as info:
        store.check_schema()
    assert "create_all" in str(info.value)
    with pytest.raises(alk.DatabaseError, match="no version is recorded") as failed:
        store.install()
    assert "create_all" in str(failed.value)
    with store.engine.connect() as conn:
        schema = None if conn.dialect.name == "sqlite" else store.schema
        assert "alkstore_jobs" in sa.inspect(conn).get_table_names(schema=schema)
        assert migrations.current_revision(conn, store.schema) is None


def _store_then_drop(engine: sa.Engine, schema: str, kind: str) -> Iterator[alk.Store]:
    """A fixture's tail: a store on ``engine``; afterwards the PostgreSQL schema dropped."""
    store = alk.Store(engine, schema=schema)
    yield store
    store.close()
    if kind == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()
