"""Installing through an application engine made with ``isolation_level="AUTOCOMMIT"``
(PostgreSQL): the install is still one transaction under the install lock. Under the
engine's autocommit every DDL statement committed on its own and the advisory transaction
lock ended at once, so a failing install left steps behind, and concurrent installs ran
into each other's tables ("relation alkstore_jobs already exists")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.support import PG_URL, new_pg_schema


@pytest.fixture
def autocommit_engine() -> Iterator[tuple[sa.Engine, str]]:
    require_pg()
    engine = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    schema = new_pg_schema("autocommit")
    yield engine, schema
    with engine.connect() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    engine.dispose()


def _tables(engine: sa.Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names(schema=schema))


def test_a_failing_install_leaves_nothing_behind(autocommit_engine: tuple[sa.Engine, str]) -> None:
    engine, schema = autocommit_engine
    with engine.connect() as conn:  # a table in the way of the last step: the install fails there
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        conn.exec_driver_sql(f'CREATE TABLE "{schema}".alkstore_workers (x integer)')
    store = alk.Store(engine, schema=schema)
    with pytest.raises(alk.DatabaseError, match="alkstore_workers"):
        store.install()
    assert _tables(engine, schema) == {"alkstore_workers"}  # steps 1 and 2 rolled back with it
    with engine.connect() as conn:
        assert migrations.current_revision(conn, schema) is None
        conn.exec_driver_sql(f'DROP TABLE "{schema}".alkstore_workers')
    store.install()
    store.check_schema()
    assert store.queue("q").enqueue({"n": 1}) > 0
    store.close()


def test_the_engine_keeps_its_autocommit(autocommit_engine: tuple[sa.Engine, str]) -> None:
    """The install's transaction is its own: the application's connections come back from
    the pool in autocommit, as the application made them."""
    engine, schema = autocommit_engine
    migrations.upgrade(engine, schema=schema)
    with engine.connect() as conn:
        assert conn.connection.driver_connection.autocommit is True  # type: ignore[union-attr]
