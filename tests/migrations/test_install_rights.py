"""A runtime role without DDL rights (PostgreSQL): the GRANT recipe of docs/install.md ("A
runtime role"), run verbatim, lets it do every operation; ``install()`` and ``alkstore
migrate`` are no-ops for it while the database is at head (nothing that needs CREATE is
sent); where there is something to migrate, it gets a clear ``AlkstoreError``, not a driver
traceback; tables a later migration adds are covered by the default privileges.

Each test gets its own LOGIN role (trust authentication lets the test connect as it) and
schema, both dropped afterwards.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.every_op import run_every_operation
from tests.support import PG_URL, new_pg_schema

ROOT = Path(__file__).resolve().parents[2]
ALKSTORE = Path(sys.executable).with_name("alkstore")
# DDL, and the install's serializing lock (pg_advisory_xact_lock): an install in disguise. The
# wake's advisory locks (try/shared forms, no privileges needed) are runtime statements.
DDL = re.compile(r"\b(CREATE|ALTER|DROP|GRANT|REVOKE|TRUNCATE)\b|pg_advisory_xact_lock\(", re.IGNORECASE)


def recipe(schema: str, role: str) -> list[str]:
    """The statements of the ```sql block under "## A runtime role" in docs/install.md, for
    this schema and role."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text[text.index("## A runtime role"):]
    start = section.index("```sql\n") + len("```sql\n")
    block = section[start:section.index("\n```", start)]
    sql = re.sub(r"--[^\n]*", "", block)
    sql = re.sub(r"\balkstore\b", schema, sql).replace("app_runtime", role)
    return [s.strip() for s in sql.split(";") if s.strip()]


@dataclass
class Runtime:
    schema: str
    role: str
    admin: sa.Engine  # the role that ran the migrations (and the recipe)
    engine: sa.Engine  # connects as the runtime role
    url: str
    statements: list[str]  # everything the runtime engine sent

    def traced(self) -> list[str]:
        return [s for s in self.statements if DDL.search(s)]


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    require_pg()
    schema, role = new_pg_schema("rt"), f"alk_rt_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL)
    url = sa.make_url(PG_URL).set(username=role).render_as_string(hide_password=False)
    engine = sa.create_engine(url)
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda _c, _cur, stmt, *_a: statements.append(stmt))
    try:
        migrations.upgrade(admin, schema=schema)
        with admin.begin() as c:
            for stmt in recipe(schema, role):
                c.exec_driver_sql(stmt)
        yield Runtime(schema, role, admin, engine, url, statements)
    finally:
        engine.dispose()
        with admin.begin() as c:
            c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            if c.exec_driver_sql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").first():
                c.exec_driver_sql(f'DROP OWNED BY "{role}"')
                c.exec_driver_sql(f'DROP ROLE "{role}"')
        admin.dispose()


def test_the_runtime_role_has_no_ddl_rights(runtime: Runtime) -> None:
    """The premise: this role cannot create a schema or a table."""
    with runtime.engine.connect() as c:
        assert c.exec_driver_sql("SELECT has_database_privilege(current_database(), 'CREATE')").scalar() is False
        assert c.exec_driver_sql(f"SELECT has_schema_privilege('{runtime.schema}', 'CREATE')").scalar() is False
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            c.exec_driver_sql(f'CREATE TABLE "{runtime.schema}".nope (x int)')


def test_install_at_head_is_a_no_op(runtime: Runtime) -> None:
    with alk.Store(runtime.engine, schema=runtime.schema) as store:
        store.install()
        store.install()
    migrations.upgrade(runtime.engine, schema=runtime.schema)
    assert runtime.statements, "nothing was even read?"
    assert runtime.traced() == [], "install() at head sent statements that need DDL rights"
    with runtime.admin.connect() as c:
        assert migrations.current_revision(c, runtime.schema) == migrations.head_revision()


def test_cli_migrate_at_head_as_the_runtime_role(runtime: Runtime) -> None:
    res = subprocess.run(
        [str(ALKSTORE), "migrate", "--url", runtime.url, "--schema", runtime.schema],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == f"alkstore schema at {migrations.head_revision()}"
    assert "Traceback" not in res.stderr


def test_install_that_needs_rights_is_a_clear_alkstore_error(runtime: Runtime) -> None:
    """Not at head (here: nothing installed in a schema the role cannot create): an
    AlkstoreError naming the missing rights; the CLI prints one line, no traceback."""
    missing = new_pg_schema("rtnew")
    with alk.Store(runtime.engine, schema=missing) as store, pytest.raises(alk.DatabaseError) as info:
        store.install()
    message = str(info.value)
    assert "permission denied" in message and "rights" in message, message
    assert isinstance(info.value.orig, Exception) and not isinstance(info.value, sa.exc.SQLAlchemyError)
    res = subprocess.run(
        [str(ALKSTORE), "migrate", "--url", runtime.url, "--schema", missing],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "permission denied" in res.stderr, res.stderr
    with runtime.admin.connect() as c:
        assert c.exec_driver_sql(f"SELECT to_regnamespace('{missing}')").scalar() is None


def test_install_into_a_schema_it_may_only_use(runtime: Runtime) -> None:
    """An empty schema the role has USAGE on (but no CREATE): same clear error, nothing made."""
    empty = new_pg_schema("rtempty")
    with runtime.admin.begin() as c:
        c.exec_driver_sql(f'CREATE SCHEMA "{empty}"')
        c.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{empty}" TO "{runtime.role}"')
    try:
        with alk.Store(runtime.engine, schema=empty) as store, pytest.raises(alk.DatabaseError, match="permission denied"):
            store.install()
        with runtime.admin.connect() as c:
            assert migrations.current_revision(c, empty) is None
    finally:
        with runtime.admin.begin() as c:
            c.exec_driver_sql(f'DROP SCHEMA "{empty}" CASCADE')


def test_the_runtime_role_can_do_every_operation(runtime: Runtime) -> None:
    with alk.Store(runtime.engine, schema=runtime.schema) as store:
        run_every_operation(store)
    assert runtime.traced() == []


def test_tables_a_later_migration_adds_are_granted_by_default(runtime: Runtime) -> None:
    """ALTER DEFAULT PRIVILEGES: a table (and its sequence) the migrating role creates after
    the recipe ran is usable by the runtime role; the version record is read-only for it."""
    with runtime.admin.begin() as c:  # what a later schema step would do
        c.exec_driver_sql(f'CREATE TABLE "{runtime.schema}".alkstore_future (id bigserial PRIMARY KEY, v text)')
    table = f'"{runtime.schema}".alkstore_future'
    with runtime.engine.begin() as c:
        new_id = c.exec_driver_sql(f"INSERT INTO {table} (v) VALUES ('a') RETURNING id").scalar()
        c.exec_driver_sql(f"UPDATE {table} SET v = 'b' WHERE id = {new_id}")
        assert c.exec_driver_sql(f"SELECT v FROM {table}").scalar() == "b"
        c.exec_driver_sql(f"DELETE FROM {table}")
    with runtime.engine.connect() as c:
        assert migrations.current_revision(c, runtime.schema) == migrations.head_revision()
        c.rollback()
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            c.exec_driver_sql(f"UPDATE \"{runtime.schema}\".alkstore_alembic_version SET version_num = 'x'")


def _revoke(runtime: Runtime, statement: str) -> None:
    with runtime.admin.begin() as c:
        c.exec_driver_sql(statement.format(schema=f'"{runtime.schema}"', role=f'"{runtime.role}"'))


@pytest.mark.parametrize(
    "revoke",
    [
        "REVOKE USAGE ON SCHEMA {schema} FROM {role}",
        "REVOKE SELECT ON {schema}.alkstore_alembic_version FROM {role}",
    ],
    ids=["schema-usage", "version-select"],
)
def test_a_runtime_role_missing_a_grant_is_told_which_grants_not_to_migrate(runtime: Runtime, revoke: str) -> None:
    """A role without the runtime GRANTs (a DBA forgot one) cannot read the schema version
    every store and worker checks first: the error says what was refused and points to the
    runtime GRANTs, not to migrating (the database is at head: a migrate would not help) nor
    to running the application as the schema's owner."""
    _revoke(runtime, revoke)
    with alk.Store(runtime.engine, schema=runtime.schema) as store:
        with pytest.raises(alk.DatabaseError) as info:
            store.queue("q").enqueue({})
        with pytest.raises(alk.DatabaseError) as worker_info:
            alk.Worker(store, store.queue("q"), lambda job: None).run(burst=True)
    for message in (str(info.value), str(worker_info.value)):
        assert "permission denied" in message and "runtime GRANTs" in message, message
        assert "alkstore migrate" not in message and "lacks the rights to migrate" not in message, message
    res = subprocess.run(
        [str(ALKSTORE), "status", "--url", runtime.url, "--schema", runtime.schema],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    line = res.stderr.strip()
    assert "permission denied" in line and "runtime GRANTs" in line, line
    assert "owner" not in line.split("permission denied", 1)[1], line


def test_a_runtime_role_missing_a_table_grant_is_told_which_grants(runtime: Runtime) -> None:
    """A table a later step added without the default privileges reaching this role (the
    migrations ran as another role): the CLI names the table and the runtime GRANTs."""
    _revoke(runtime, "REVOKE ALL ON {schema}.alkstore_workers FROM {role}")
    res = subprocess.run(
        [str(ALKSTORE), "status", "--url", runtime.url, "--schema", runtime.schema],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    line = res.stderr.strip()
    assert "permission denied for table alkstore_workers" in line and "runtime GRANTs" in line, line


def test_a_table_a_later_step_added_without_grants_is_refused_with_the_remedy(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A step's new tables that the runtime role was never granted (the migration ran as a
    role other than the one whose ALTER DEFAULT PRIVILEGES name it): every claim reads the
    queue settings, so the operations and the worker's claim WARNING say what to grant, not
    only the server's 'permission denied'."""
    import logging

    _revoke(runtime, "REVOKE ALL ON {schema}.alkstore_queue_settings, {schema}.alkstore_queue_claims FROM {role}")
    with alk.Store(runtime.engine, schema=runtime.schema) as store:
        q = store.queue("q")
        q.enqueue({})
        with pytest.raises(alk.DatabaseError) as info:
            q.claim_one("w")
        message = str(info.value)
        assert "permission denied for table alkstore_queue_settings" in message, message
        assert "runtime GRANTs" in message and "ALTER DEFAULT PRIVILEGES" in message, message
        stop = alk.StopToken()
        with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
            worker = alk.Worker(store, q, lambda job: None, poll_interval=0.2)
            import threading

            runner = threading.Thread(target=worker.run, args=(stop,))
            runner.start()
            try:
                from tests.support import wait_for

                wait_for(lambda: any("claim on 'q' failed" in r.getMessage() for r in caplog.records), "the WARNING")
            finally:
                stop.stop()
                runner.join(30)
        (line,) = [r.getMessage() for r in caplog.records if "claim on 'q' failed" in r.getMessage()]
        assert "runtime GRANTs" in line, line
