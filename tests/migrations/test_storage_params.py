"""Step 3's PostgreSQL storage parameters (autovacuum, fillfactor of the job tables): the
migrations set exactly ``schema.STORAGE_PARAMS``, ``metadata.create_all`` sets the same,
a downgrade past step 3 resets them, and SQLite (no storage parameters) migrates as before."""

from __future__ import annotations

import sqlalchemy as sa

from alkstore_sa import migrations
from alkstore_sa.schema import STORAGE_PARAMS, metadata_for
from tests.conftest import require_pg
from tests.support import PG_URL, Target, new_pg_schema


def _reloptions(engine: sa.Engine, schema: str) -> dict[str, dict[str, str]]:
    with engine.connect() as c:
        rows = c.execute(
            sa.text(
                "SELECT c.relname, c.reloptions FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relkind = 'r' AND c.reloptions IS NOT NULL"
            ),
            {"schema": schema},
        ).all()
    return {name: dict(opt.split("=", 1) for opt in opts) for name, opts in rows}


def _drop(engine: sa.Engine, schema: str) -> None:
    with engine.begin() as c:
        c.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
    engine.dispose()


def test_migrated_tables_carry_the_storage_params(pg_db: Target) -> None:
    assert _reloptions(pg_db.engine, pg_db.schema) == STORAGE_PARAMS


def test_create_all_sets_the_same_params() -> None:
    require_pg()
    schema = new_pg_schema('storage "create_all" %s')  # quotes, a space, a %: the ALTER quotes it
    engine = sa.create_engine(PG_URL)
    try:
        with engine.begin() as c:
            c.execute(sa.schema.CreateSchema(schema))
            metadata_for(schema).create_all(c)
        assert _reloptions(engine, schema) == STORAGE_PARAMS
    finally:
        _drop(engine, schema)


def test_downgrade_past_step_3_resets_them_and_upgrade_sets_them_again() -> None:
    require_pg()
    schema = new_pg_schema("storage")
    engine = sa.create_engine(PG_URL)
    try:
        migrations.upgrade(engine, schema=schema)
        migrations.downgrade(engine, schema=schema, revision="alkstore_0002")
        assert _reloptions(engine, schema) == {}
        migrations.upgrade(engine, schema=schema)
        assert _reloptions(engine, schema) == STORAGE_PARAMS
    finally:
        _drop(engine, schema)


def test_sqlite_migrates_up_and_down_without_them(sqlite_db: Target) -> None:
    migrations.downgrade(sqlite_db.engine, schema=sqlite_db.schema, revision="alkstore_0002")
    migrations.upgrade(sqlite_db.engine, schema=sqlite_db.schema)
    with sqlite_db.engine.connect() as c:
        assert "alkstore_jobs" in sa.inspect(c).get_table_names()
