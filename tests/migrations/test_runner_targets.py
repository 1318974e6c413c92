"""The packaged runner's target revision (``migrations.upgrade`` / ``downgrade``, ``alkstore
migrate --revision``) is checked before the database is touched, and a target the database
is already at changes nothing: Alembic creates its version table (and ``installing`` the
PostgreSQL schema) before it resolves a revision, so an unknown target, or ``base`` on a
database without alkstore, used to leave an empty schema and version table behind."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.support import PG_URL, new_pg_schema

ALKSTORE = str(Path(sys.executable).with_name("alkstore"))


class Blank:
    """A database without alkstore: a SQLite file, or a PostgreSQL schema name not in use."""

    def __init__(self, kind: str, url: str, schema: str) -> None:
        self.kind, self.url, self.schema = kind, url, schema
        self.engine = sa.create_engine(url)

    def untouched(self) -> bool:
        with self.engine.connect() as conn:
            if self.kind == "sqlite":
                return sa.inspect(conn).get_table_names() == []
            return not sa.inspect(conn).has_schema(self.schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def blank(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Blank]:
    if request.param == "sqlite":
        target = Blank("sqlite", f"sqlite:///{tmp_path / 'blank.db'}", "alkstore")
        with target.engine.connect():
            pass  # the file exists (the runner creates none itself; `alkstore migrate` does)
        yield target
        target.engine.dispose()
        return
    require_pg()
    target = Blank("postgresql", PG_URL, new_pg_schema("blank"))
    yield target
    with target.engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
    target.engine.dispose()


@pytest.mark.parametrize("revision", ["nosuchrev", "alkstore_9999", "alkstore_0002:alkstore_0003", "+1", ""])
def test_an_unknown_target_is_refused_before_anything_is_written(blank: Blank, revision: str) -> None:
    for run in (migrations.upgrade, migrations.downgrade):
        with pytest.raises(alk.InvalidOptions, match="revision"):
            run(blank.engine, schema=blank.schema, revision=revision)
        assert blank.untouched(), run.__name__


@pytest.mark.parametrize("revision", ["base", "alkstore_0001"])
def test_a_downgrade_of_a_database_without_alkstore_changes_nothing(blank: Blank, revision: str) -> None:
    migrations.downgrade(blank.engine, schema=blank.schema, revision=revision)
    assert blank.untouched()


def test_an_upgrade_to_base_of_a_database_without_alkstore_changes_nothing(blank: Blank) -> None:
    migrations.upgrade(blank.engine, schema=blank.schema, revision="base")
    assert blank.untouched()
    out = subprocess.run([ALKSTORE, "migrate", "--url", blank.url, "--schema", blank.schema, "--revision", "base"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "alkstore schema at base (not installed)", out.stdout
    assert blank.untouched()


def test_a_known_target_still_moves_the_database(blank: Blank) -> None:
    migrations.upgrade(blank.engine, schema=blank.schema, revision="alkstore_0001")
    with blank.engine.connect() as conn:
        assert migrations.current_revision(conn, blank.schema) == "alkstore_0001"
    migrations.upgrade(blank.engine, schema=blank.schema, revision="head")
    migrations.downgrade(blank.engine, schema=blank.schema, revision="alkstore_0002")
    with blank.engine.connect() as conn:
        assert migrations.current_revision(conn, blank.schema) == "alkstore_0002"
    migrations.downgrade(blank.engine, schema=blank.schema, revision="base")
    with blank.engine.connect() as conn:
        assert migrations.current_revision(conn, blank.schema) is None
