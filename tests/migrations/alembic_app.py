"""A throwaway application with an Alembic environment of its own, written into a temporary
directory: alembic.ini, an env.py with alkstore's two lines, a model module and one
migration of its own. Tests drive it with the real ``alembic`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from alkstore_sa.cli import main as alkstore_main
from alkstore_sa.schema import VERSION_TABLE, metadata

BIN = Path(sys.executable).parent
ALEMBIC = str(BIN / "alembic")
ALKSTORE = str(BIN / "alkstore")
APP_REVISION = "app_0001"
ALKSTORE_TABLES = {t.name for t in metadata.tables.values()} | {VERSION_TABLE}

INI = """\
[alembic]
script_location = %(here)s/migrations
prepend_sys_path = %(here)s
path_separator = os
"""

# APP_NAMING_CONVENTION (JSON): the naming convention of the app's target_metadata
MODELS = """\
import json
import os

import sqlalchemy as sa

metadata = sa.MetaData(naming_convention=json.loads(os.environ.get("APP_NAMING_CONVENTION", "null")))
orders = sa.Table(
    "app_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(200), nullable=False),
)
"""

# A standard env.py plus alkstore's two lines; APP_ALKSTORE_FILTER=off drops the autogenerate
# filter so a test can show what it protects against. APP_CONFIGURE (JSON) adds keywords to
# context.configure (transactional_ddl, transaction_per_migration), APP_SQLITE_BEGIN=on
# takes SQLAlchemy's pysqlite recipe (the driver's own transaction handling off, BEGIN in a
# `begin` event), APP_ENGINE (JSON) adds keywords to create_engine (isolation_level):
# the transaction settings an app's env.py may have. APP_BARRIER (a directory): the run
# writes ready-<pid> there, then waits for a file `go` before it migrates.
ENV = """\
import json
import os
import time

import sqlalchemy as sa
from alembic import context

from alkstore_sa.alembic_support import enable_wal, include_name
from app_models import metadata

url = os.environ["APP_DATABASE_URL"]
name_filter = include_name if os.environ.get("APP_ALKSTORE_FILTER", "on") == "on" else None
configure_kw = json.loads(os.environ.get("APP_CONFIGURE", "{}"))

if context.is_offline_mode():
    context.configure(url=url, target_metadata=metadata, literal_binds=True, include_name=name_filter, **configure_kw)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = sa.create_engine(url, **json.loads(os.environ.get("APP_ENGINE", "{}")))
    if os.environ.get("APP_SQLITE_BEGIN") == "on":
        @sa.event.listens_for(engine, "connect")
        def _no_driver_transactions(dbapi_connection, record):
            dbapi_connection.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin(conn):
            conn.exec_driver_sql("BEGIN")
    with engine.connect() as connection:
        enable_wal(connection)
        context.configure(connection=connection, target_metadata=metadata, include_name=name_filter, **configure_kw)
        barrier = os.environ.get("APP_BARRIER")
        if barrier:  # a test starting several runs at once: say so, then wait for its go
            open(os.path.join(barrier, f"ready-{os.getpid()}"), "w").close()
            while not os.path.exists(os.path.join(barrier, "go")):
                time.sleep(0.01)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
"""

APP_MIGRATION = """\
import sqlalchemy as sa
from alembic import op

revision = {rev!r}
down_revision = {down!r}
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        {table!r},
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("email", sa.String(200), nullable=False),
    )


def downgrade():
    op.drop_table({table!r})
"""


@dataclass
class AlembicApp:
    """The app on disk plus the database its env.py migrates."""

    root: Path
    url: str
    kind: str  # "sqlite" | "postgresql"

    @property
    def ini(self) -> Path:
        return self.root / "alembic.ini"

    @property
    def versions(self) -> Path:
        return self.root / "migrations" / "versions"

    def _env(self, alkstore_filter: bool, env_vars: dict[str, str] | None) -> dict[str, str]:
        return {**os.environ, "APP_DATABASE_URL": self.url, "APP_ALKSTORE_FILTER": "on" if alkstore_filter else "off",
                **(env_vars or {})}

    def alembic(
        self, *args: str, alkstore_filter: bool = True, env_vars: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ALEMBIC, "-c", str(self.ini), *args], cwd=self.root, env=self._env(alkstore_filter, env_vars),
            capture_output=True, text=True, timeout=120,
        )

    def start_alembic(self, *args: str, env_vars: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``alembic`` in the background (``communicate()`` for its output)."""
        return subprocess.Popen(
            [ALEMBIC, "-c", str(self.ini), *args], cwd=self.root, env=self._env(True, env_vars),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def add_migration(self, rev: str, down: str | None, table: str) -> None:
        (self.versions / f"{rev}.py").write_text(APP_MIGRATION.format(rev=rev, down=down, table=table))

    def generate(self, *args: str) -> str:
        """Run ``alkstore alembic-revision`` for this app; the id of the file it wrote."""
        before = set(self.versions.glob("*.py"))
        assert alkstore_main(["alembic-revision", "-c", str(self.ini), *args]) == 0
        (new,) = set(self.versions.glob("*.py")) - before
        return new.name.split("_alkstore_", 1)[0]

    def tables(self, schema: str | None) -> set[str]:
        engine = sa.create_engine(self.url)
        try:
            with engine.connect() as conn:
                return set(sa.inspect(conn).get_table_names(schema=schema))
        finally:
            engine.dispose()


def write_app(root: Path, url: str, kind: str) -> AlembicApp:
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "alembic.ini").write_text(INI)
    (root / "app_models.py").write_text(MODELS)
    (root / "migrations" / "env.py").write_text(ENV)
    app = AlembicApp(root, url, kind)
    app.add_migration(APP_REVISION, None, "app_orders")
    return app
