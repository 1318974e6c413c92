"""alkstore_sa.alembic_support on both engines, in-process: the autogenerate filters hide
exactly alkstore's tables from an app's comparison, and record_version moves alkstore's
version table through all three of its paths (create, update, drop), online and offline."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext

from alkstore_sa import migrations
from alkstore_sa.alembic_support import enable_wal, include_name, include_object, record_version
from alkstore_sa.schema import VERSION_TABLE
from tests.conftest import require_pg
from tests.support import PG_URL, Target, new_pg_schema


@pytest.fixture
def app_table(db: Target) -> Iterator[sa.MetaData]:
    """An app's metadata with one table, created next to alkstore's (same schema on
    PostgreSQL, same file on SQLite: where the filters matter)."""
    md = sa.MetaData(schema=None if db.kind == "sqlite" else db.schema)
    sa.Table("filter_app_rows", md, sa.Column("id", sa.Integer, primary_key=True))
    md.create_all(db.engine)
    yield md
    md.drop_all(db.engine)


def _diff(db: Target, md: sa.MetaData, **opts: Any) -> list[Any]:
    schema = None if db.kind == "sqlite" else db.schema
    app_filter: Callable[..., bool] | None = opts.pop("include_name", None)

    def only_this_schema(name: str | None, type_: str, parents: dict[str, Any]) -> bool:
        if type_ == "schema":
            return name == schema
        return app_filter is None or app_filter(name, type_, parents)

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_schemas": schema is not None, "include_name": only_this_schema, **opts}
        )
        return compare_metadata(ctx, md)


def test_without_a_filter_autogenerate_would_drop_alkstore(db: Target, app_table: sa.MetaData) -> None:
    removed = {d[1].name for d in _diff(db, app_table) if d[0] == "remove_table"}
    assert {"alkstore_jobs", "alkstore_dead_jobs", VERSION_TABLE} <= removed


@pytest.mark.parametrize("hook", ["include_name", "include_object"])
def test_filters_hide_only_alkstore(db: Target, app_table: sa.MetaData, hook: str) -> None:
    opts = {"include_name": include_name} if hook == "include_name" else {"include_object": include_object}
    assert _diff(db, app_table, **opts) == []
    # the app's own tables are still compared: a model change is still detected
    sa.Table("filter_app_new", app_table, sa.Column("id", sa.Integer, primary_key=True))
    added = [d[1].name for d in _diff(db, app_table, **opts) if d[0] == "add_table"]
    assert added == ["filter_app_new"]


@pytest.fixture(params=["sqlite", "postgresql"])
def blank(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[sa.Engine, str]]:
    """An engine on a database without alkstore, and the schema record_version is given."""
    if request.param == "sqlite":
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'blank.db'}")
        yield engine, "ignored_on_sqlite"
        engine.dispose()
        return
    require_pg()
    engine, schema = sa.create_engine(PG_URL), new_pg_schema("recver")
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(schema))
    yield engine, schema
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()


def _record(engine: sa.Engine, schema: str, from_: str | None, to: str | None) -> str | None:
    with engine.begin() as conn:
        with Operations.context(MigrationContext.configure(conn)):
            record_version(from_, to, schema=schema)
        return migrations.current_revision(conn, schema)


def test_record_version_create_update_drop(blank: tuple[sa.Engine, str]) -> None:
    engine, schema = blank
    assert _record(engine, schema, None, "alkstore_0001") == "alkstore_0001"
    assert _record(engine, schema, "alkstore_0001", "alkstore_0002") == "alkstore_0002"
    assert _record(engine, schema, "alkstore_0002", "alkstore_0002") == "alkstore_0002"
    assert _record(engine, schema, "alkstore_0002", None) is None
    with engine.connect() as conn:
        insp_schema = None if engine.dialect.name == "sqlite" else schema
        assert VERSION_TABLE not in sa.inspect(conn).get_table_names(schema=insp_schema)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_record_version_offline(dialect: str) -> None:
    buf = io.StringIO()
    ctx = MigrationContext.configure(dialect_name=dialect, opts={"as_sql": True, "output_buffer": buf})
    with Operations.context(ctx):
        record_version(None, "alkstore_0001", schema="s")
        record_version("alkstore_0001", "alkstore_0002", schema="s")
        record_version("alkstore_0002", None, schema="s")
    q = "" if dialect == "sqlite" else "s."
    sql = buf.getvalue()
    assert f"CREATE TABLE {q}{VERSION_TABLE}" in sql
    assert f"INSERT INTO {q}{VERSION_TABLE} (version_num) VALUES ('alkstore_0001')" in sql
    assert f"UPDATE {q}{VERSION_TABLE} SET version_num='alkstore_0002'" in sql
    assert f"DROP TABLE {q}{VERSION_TABLE}" in sql


@pytest.mark.parametrize("begin_event", [False, True], ids=["driver-transactions", "begin-event"])
def test_enable_wal_under_either_pysqlite_transaction_handling(begin_event: bool, tmp_path: Any) -> None:
    """env.py's ``enable_wal(connection)`` right after ``connect()`` switches the file to WAL
    with the driver's default transaction handling and with SQLAlchemy's pysqlite recipe
    (driver handling off, BEGIN in a ``begin`` event), where the PRAGMA used to autobegin
    SQLAlchemy's transaction, emit BEGIN and fail ("cannot change into wal mode from within
    a transaction"); the connection then takes its migration transaction as usual."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'wal.db'}")
    if begin_event:
        @sa.event.listens_for(engine, "connect")
        def _no_driver_transactions(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN")

    with engine.connect() as conn:
        enable_wal(conn)
        assert not conn.in_transaction()
        with conn.begin():
            conn.exec_driver_sql("CREATE TABLE wal_rows (x)")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("SELECT count(*) FROM wal_rows").scalar() == 0
    engine.dispose()
