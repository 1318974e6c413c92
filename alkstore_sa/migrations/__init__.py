"""The packaged migrations: versioned steps, their Alembic revisions, and the runner.

The version table is ``alkstore_alembic_version`` (in the alkstore schema on PostgreSQL),
so it never collides with an application's own ``alembic_version``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

from alembic import command

from ..schema import DEFAULT_SCHEMA, VERSION_TABLE

HERE = Path(__file__).resolve().parent
_LOCK_KEY = 0x616C6B73  # "alks": serializes concurrent installs on PostgreSQL


def configured_schema() -> str:
    """The schema of the running migration: Config attribute, ``-x schema=``, ALKSTORE_SCHEMA,
    or the default."""
    from alembic import context

    attr = context.config.attributes.get("alkstore_schema")
    if attr:
        return str(attr)
    x = context.get_x_argument(as_dictionary=True)
    return x.get("schema") or os.environ.get("ALKSTORE_SCHEMA") or DEFAULT_SCHEMA


def database_url() -> str:
    from alembic import context

    x = context.get_x_argument(as_dictionary=True)
    url = x.get("url") or os.environ.get("ALKSTORE_DATABASE_URL") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("no database URL: pass `-x url=...` or set ALKSTORE_DATABASE_URL")
    return url


def _configure(context: Any, connection: Connection | None, dialect_name: str, **kw: Any) -> None:
    schema = configured_schema()
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=None if dialect_name == "sqlite" else schema,
        transactional_ddl=dialect_name != "sqlite" or None,
        **kw,
    )


@contextmanager
def installing(connection: Connection, schema: str) -> Iterator[None]:
    """One install transaction, serialized against concurrent installs: on PostgreSQL an
    advisory transaction lock, then the schema Alembic's version table lives in; on SQLite
    WAL mode first (persistent in the file, impossible inside a transaction), then
    BEGIN IMMEDIATE (the writer lock)."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")
        connection.commit()
    with connection.begin():
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            connection.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
        elif connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield


def run_environment(context: Any) -> None:
    """The body of env.py: online with a given connection or URL, or offline (--sql)."""
    if context.is_offline_mode():
        url = database_url()
        dialect = sa.engine.make_url(url).get_dialect().name
        _configure(context, None, dialect, url=url, literal_binds=True)
        with context.begin_transaction():
            if dialect != "sqlite":  # the version table lives in the schema: create it first
                context.execute(sa.schema.CreateSchema(configured_schema(), if_not_exists=True))
            context.run_migrations()
        return
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run_online(context, connection)
        return
    engine = sa.create_engine(database_url())
    try:
        with engine.connect() as connection, installing(connection, configured_schema()):
            _run_online(context, connection)
    finally:
        engine.dispose()


def _run_online(context: Any, connection: Connection) -> None:
    _configure(context, connection, connection.dialect.name)
    with context.begin_transaction():
        context.run_migrations()


def alembic_config(connection: Connection | None = None, schema: str = DEFAULT_SCHEMA) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["alkstore_schema"] = schema
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, schema: str = DEFAULT_SCHEMA, revision: str = "heads") -> None:
    """Run the packaged migrations to ``revision`` (head by default), idempotently."""
    with engine.connect() as connection, installing(connection, schema):
        command.upgrade(alembic_config(connection, schema), revision)


def downgrade(engine: Engine, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    with engine.connect() as connection, connection.begin():
        command.downgrade(alembic_config(connection, schema), revision)


def current_revision(connection: Connection, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The alkstore revision recorded in this database, or None when not installed."""
    from alembic.runtime.migration import MigrationContext

    opts = {"version_table": VERSION_TABLE}
    if connection.dialect.name != "sqlite":
        opts["version_table_schema"] = schema
    return MigrationContext.configure(connection, opts=opts).get_current_revision()


@functools.lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest revision this library version ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def check_schema(connection: Connection, schema: str = DEFAULT_SCHEMA) -> None:
    """Raise NotInstalled / SchemaOutdated unless the database is at this library's head."""
    from ..errors import NotInstalled, SchemaOutdated

    try:
        current = current_revision(connection, schema)
    except sa.exc.DBAPIError:
        current = None
    if current is None:
        raise NotInstalled()
    head = head_revision()
    if current != head:
        raise SchemaOutdated(
            f"the alkstore schema in this database is at {current}, this library needs {head}: "
            "run `alkstore migrate --url URL` (or your app's `alembic upgrade head`)"
        )
