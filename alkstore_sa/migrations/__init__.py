"""The packaged migrations: versioned steps, their Alembic revisions, and the runner.

The version table is ``alkstore_alembic_version`` (in the alkstore schema on PostgreSQL),
so it never collides with an application's own ``alembic_version``.

Revision ids carry the compatibility rule (docs/install.md, "Upgrading"): ``alkstore_NNNN``
is schema step NNNN, usable by every library release of step 1 or later (the step is
additive: new tables, new nullable or defaulted columns, new indexes — statements of older
releases keep working and keep their meaning); ``alkstore_NNNN_rMMMM`` is step NNNN, usable
only by releases that ship step MMMM or later (the step changed something older releases
rely on). A library therefore accepts a database at a step it has never seen when that
step's id says it may, and refuses with ``SchemaTooNew`` otherwise, without knowing the
step itself.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .. import _sqlite, _validate
from .._unreachable import PRIVILEGE_REFUSED, RUNTIME_GRANTS
from .._urls import engine_from_url, parse_url
from ..errors import (
    DatabaseError,
    InvalidOptions,
    NotInstalled,
    SchemaOutdated,
    SchemaTooNew,
    install_advice,
)
from ..schema import DEFAULT_SCHEMA, VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger("alkstore_sa")

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
        enable_wal(connection)
    with connection.begin():
        if connection.dialect.name == "postgresql":
            lock_installs(connection)
            connection.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
        elif connection.dialect.name == "sqlite":
            if getattr(connection.connection.driver_connection, "in_transaction", False):
                # the application's ``begin`` hook (SQLAlchemy's pysqlite recipe:
                # isolation_level=None, then BEGIN on begin) already began one, with
                # nothing in it yet: SQLite refuses a second BEGIN ("cannot start a
                # transaction within a transaction"), so that one gives way to ours
                connection.exec_driver_sql("ROLLBACK")
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield


_SESSION_TIMEOUTS = sa.text(
    "SELECT pg_catalog.current_setting('lock_timeout'), pg_catalog.current_setting('statement_timeout')"
)
_SET_TIMEOUTS = sa.text(
    "SELECT pg_catalog.set_config('lock_timeout', :lock, true), "
    "pg_catalog.set_config('statement_timeout', :statement, true)"
)


def lock_installs(connection: Connection) -> None:
    """PostgreSQL: take the advisory lock every install holds until its transaction ends, so
    installs and upgrades of the alkstore schema run one at a time.

    The wait for it is exempt from the session's ``lock_timeout`` and ``statement_timeout``
    (a migrating role's guard for its DDL: the second of two deploys waits for the first
    instead of failing), which apply again, for the rest of the transaction, once it is
    held. Separate statements: a statement's timeout is armed when it starts."""
    lock, statement = connection.execute(_SESSION_TIMEOUTS).one()
    connection.execute(_SET_TIMEOUTS, {"lock": "0", "statement": "0"})
    connection.execute(sa.text("SELECT pg_catalog.pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    connection.execute(_SET_TIMEOUTS, {"lock": lock, "statement": statement})


def run_environment(context: Any) -> None:
    """The body of env.py: online with a given connection or URL, or offline (--sql)."""
    if context.is_offline_mode():
        url = parse_url(database_url())  # the forms `alkstore migrate` takes (SPEC §4)
        dialect = url.get_dialect().name
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
    engine = engine_from_url(database_url())  # a sync engine, as `alkstore migrate` makes
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
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["alkstore_schema"] = schema
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, schema: str = DEFAULT_SCHEMA, revision: str = "heads") -> None:
    """Run the packaged migrations to ``revision`` (head by default), idempotently.

    The recorded revision is read first: at the target nothing else runs (no lock, no
    ``CREATE SCHEMA``), so a role with only the runtime GRANTs can run it against an
    installed database. A database migrated by a newer alkstore_sa is never migrated: when
    its steps are usable by this version this logs why nothing happens; otherwise it
    raises ``SchemaTooNew``. Driver errors become ``DatabaseError``s, an unknown target
    revision ``InvalidOptions``, as is a schema name ``Store`` would refuse.
    """
    from alembic.util import CommandError

    from alembic import command

    _validate.schema(schema)
    target = target_revision(revision)
    try:
        with plain_connection(engine) as connection:
            if connection.dialect.name == "sqlite":
                enable_wal(connection)  # also for an installed file that is not in WAL mode yet
            current = current_revision(connection, schema)
            unrecorded = unrecorded_tables(connection, schema) if current is None else None
            connection.rollback()  # the read's transaction ends before the install's begins
            if unrecorded is not None:
                raise DatabaseError(f"installing the alkstore schema failed: {unrecorded} with "
                                    f"{install_advice(schema, connection.dialect.name).removeprefix('run ')}")
            if current is not None and current not in packaged_revisions():
                _beyond_this_library(current)
                return
            if current == target:
                if current == head_revision():
                    _check_tables(connection, schema, current)
                return
            with installing(connection, schema):
                command.upgrade(alembic_config(connection, schema), revision)
    except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:  # TimeoutError: a pool with none to spare
        raise _driver_error("installing the alkstore schema failed", exc) from exc
    except CommandError as exc:
        raise InvalidOptions(f"alkstore migrations: {exc}") from exc


def downgrade(engine: Engine, schema: str = DEFAULT_SCHEMA, revision: str = "base") -> None:
    """Undo the packaged migrations down to ``revision`` (all of them by default); a
    database without alkstore is left as it is. ``revision`` as :func:`target_revision`."""
    from alembic.util import CommandError

    from alembic import command

    _validate.schema(schema)
    target_revision(revision)
    try:
        with plain_connection(engine) as connection:
            current = current_revision(connection, schema)
            connection.rollback()
            if current is None:
                return  # nothing installed, nothing to undo (Alembic would create its version table)
            if current not in packaged_revisions():
                raise SchemaTooNew(
                    f"this database records alkstore revision {current!r}, which this alkstore_sa "
                    f"(head {head_revision()}) does not ship, so it cannot undo it: downgrade with "
                    "the alkstore_sa release that migrated it"
                )
            with connection.begin():
                command.downgrade(alembic_config(connection, schema), revision)
    except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:
        raise _driver_error("removing the alkstore schema failed", exc) from exc
    except CommandError as exc:
        raise InvalidOptions(f"alkstore migrations: {exc}") from exc


def target_revision(revision: str) -> str | None:
    """The packaged revision a runner's ``revision`` names (None for ``base``), checked
    before the database is touched: Alembic creates its version table (and the install the
    PostgreSQL schema) before it resolves its target, so an unknown one was refused only
    after writing them. ``InvalidOptions`` for anything but ``head``, ``base`` or a revision
    id this library ships."""
    if revision in ("head", "heads"):
        return head_revision()
    if revision == "base":
        return None
    if isinstance(revision, str) and revision in packaged_revisions():
        return revision
    raise InvalidOptions(
        f"alkstore migrations: unknown revision {revision!r}: give head, base or one of "
        f"{', '.join(sorted(packaged_revisions()))}"
    )


def plain_connection(engine: Engine) -> Connection:
    """``engine.connect()`` without the streaming an application's engine may ask for
    (``stream_results``, ``yield_per``): psycopg's server-side cursor wraps every statement
    in DECLARE ... CURSOR FOR, which PostgreSQL refuses for DDL and writes.

    On PostgreSQL also without an ``isolation_level="AUTOCOMMIT"`` of the application's
    engine: under it every DDL statement of an install committed on its own (a failing
    step left the earlier ones behind) and the install's advisory transaction lock ended
    at once (concurrent installs ran into each other's tables). The server's default level
    gives the install its one transaction; the pool gives the application's level back
    when the connection returns. (SQLite's install takes BEGIN IMMEDIATE itself.)

    And without the engine's ``schema_translate_map`` (a multi-tenant engine): the store's
    statements name its schema as it is, so the DDL must too — translated, the install's
    CREATE TABLEs went to the mapped schema while its ALTER TABLEs (raw names) did not."""
    connection = engine.connect().execution_options(stream_results=False, yield_per=None, schema_translate_map=None)
    if connection.dialect.name == "postgresql":
        connection = connection.execution_options(isolation_level=connection.default_isolation_level)
    return connection


def enable_wal(connection: Connection) -> None:
    """SQLite: WAL mode is persistent in the file and cannot be switched inside a transaction,
    so whatever the caller had open is committed first."""
    if connection.in_transaction():
        connection.commit()
    # On the DBAPI connection, not through Connection.exec_driver_sql: that autobegins
    # SQLAlchemy's transaction, and a `begin` hook (SQLAlchemy's pysqlite recipe) would then
    # emit BEGIN before the PRAGMA, which SQLite refuses inside a transaction.
    # Python 3.12's autocommit=False keeps a transaction open on the driver connection
    # at all times (isolation_level is ignored there): the PRAGMA runs in autocommit
    pep249 = _sqlite.leave_pep249_mode(connection.connection.driver_connection)
    cursor = connection.connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
    except connection.dialect.loaded_dbapi.Error as exc:
        # a raw DBAPI cursor: SQLAlchemy wraps nothing here, so the driver's own exception
        # (sqlite3.OperationalError) would escape every caller's DBAPIError handling
        raise _driver_error(f"switching the SQLite database to WAL mode failed{_wal_advice(exc)}", exc) from exc
    finally:
        cursor.close()
        _sqlite.enter_pep249_mode(connection.connection.driver_connection, pep249)


def _wal_advice(exc: BaseException) -> str:
    """What to do about a failed switch to WAL mode, by SQLite's primary result code: the
    busy case has its own cure, a read-only file another, and other errors none to add."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    text = str(exc)
    if _sqlite.is_busy(exc):
        return (
            " (it can switch only while no other connection has a transaction open on the file: "
            "end the application's open transactions, or stop its processes, and install again)"
        )
    if code == _sqlite.SQLITE_READONLY or "readonly database" in text:
        return (
            " (the install writes to the file: open it read-write, and make the file and its "
            "directory, where SQLite keeps the -wal and -shm files, writable by this process)"
        )
    return ""


def _beyond_this_library(current: str) -> None:
    """``upgrade()`` on a database at a revision this library does not ship. A usable newer
    schema is past every target (each is a packaged revision): nothing to do."""
    verdict = schema_verdict(current)
    if verdict == "newer":
        log.warning(
            "this database was migrated by a newer alkstore_sa (revision %s; this version ships "
            "%s): nothing to migrate. Its later steps are additive, so this version uses the "
            "schema as it is; upgrade alkstore_sa to migrate further.",
            current, head_revision(),
        )
        return
    if verdict == "outdated":
        raise SchemaOutdated(
            f"the alkstore version table records {current!r}, a revision no alkstore_sa release "
            "ships, so the migrations cannot continue from it: set it to the revision the tables "
            "match (`alembic stamp`)"
        )
    raise SchemaTooNew(too_new_message(current))


# What a role refused a privilege (SQLSTATE 42501) lacks, by what it was doing: changing the
# schema needs the owner's rights; reading what is installed (every store, worker and command
# checks the version first) needs only the runtime GRANTs, and a migrate would not help.
MIGRATE_RIGHTS = (
    "this role lacks the rights to migrate: run `alkstore migrate` as the role that owns the "
    "alkstore schema, or one with CREATE on the database; application roles need only the "
    "runtime GRANTs of docs/install.md"
)
READ_RIGHTS = (
    f"this role may not read alkstore's tables: {RUNTIME_GRANTS}: USAGE on the schema, SELECT, "
    "INSERT, UPDATE, DELETE on its tables, USAGE, SELECT on its sequences"
)


def _driver_error(what: str, exc: BaseException, rights: str = MIGRATE_RIGHTS) -> DatabaseError:
    """``exc`` (SQLAlchemy's wrapper, or a driver's own exception) as a DatabaseError; a
    refused privilege says what to grant (``rights``)."""
    orig = getattr(exc, "orig", None) or exc
    message = f"{what}: {type(orig).__name__}: {' '.join(str(orig).split())}"
    if getattr(orig, "sqlstate", None) == PRIVILEGE_REFUSED:
        message += f" ({rights})"
    return DatabaseError(message, orig=orig)


def _version_table(connection: Connection, schema: str) -> sa.TableClause:
    return sa.table(
        VERSION_TABLE, sa.column("version_num"), schema=None if connection.dialect.name == "sqlite" else schema
    )


# Every name and operator qualified: this runs on application connections too, whatever
# their search_path (see _backends/pg_dialect.py).
_PG_HAS_VERSION_TABLE = sa.text(
    "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
    " ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
    " WHERE n.nspname OPERATOR(pg_catalog.=) :schema AND c.relname OPERATOR(pg_catalog.=) :table"
)
_SQLITE_HAS_VERSION_TABLE = sa.text("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = :table")


def current_revision(connection: Connection, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The alkstore revision recorded in this database, or None when not installed; a
    driver error (e.g. no USAGE on the schema) is a ``DatabaseError``."""
    try:
        if not _has_table(connection, schema, VERSION_TABLE):
            return None
        rows = connection.execute(sa.select(_version_table(connection, schema).c.version_num)).scalars().all()
    except sa.exc.DBAPIError as exc:
        raise _driver_error("could not read the alkstore schema version", exc, READ_RIGHTS) from exc
    if len(rows) > 1:
        raise DatabaseError(f"the alkstore version table records several revisions: {sorted(rows)}")
    return rows[0] if rows else None


def _check_tables(connection: Connection, schema: str, current: str) -> None:
    """At the head, every table of ``metadata`` exists: one dropped outside the migrations
    (by hand, or by an app revision autogenerated without ``include_name``) made every
    operation that needs it say "not installed: run alkstore migrate", and the migrate that
    followed found the head recorded and did nothing."""
    from ..schema import metadata

    try:
        missing = sorted(t.name for t in metadata.tables.values() if not _has_table(connection, schema, t.name))
    except sa.exc.DBAPIError as exc:
        raise _driver_error("could not read the alkstore schema", exc, READ_RIGHTS) from exc
    connection.rollback()
    if missing:
        raise DatabaseError(
            f"the alkstore schema in this database records {current} but lacks the tables "
            f"{', '.join(missing)}: they were dropped outside alkstore's migrations (by hand, or by a "
            "revision autogenerated without `include_name`), and no migration recreates them. "
            "Restore them from a backup, or drop alkstore's other tables and its version table "
            f"({VERSION_TABLE}; their jobs are lost) and install again"
        )


def has_version_table(connection: Connection, schema: str = DEFAULT_SCHEMA) -> bool:
    """Whether alkstore's version table exists (possibly empty: an Alembic downgrade to base
    deletes its row and keeps the table)."""
    try:
        return _has_table(connection, schema, VERSION_TABLE)
    except sa.exc.DBAPIError as exc:
        raise _driver_error("could not read the alkstore schema version", exc, READ_RIGHTS) from exc


def _has_table(connection: Connection, schema: str, table: str) -> bool:
    has_table = _SQLITE_HAS_VERSION_TABLE if connection.dialect.name == "sqlite" else _PG_HAS_VERSION_TABLE
    return connection.execute(has_table, {"schema": schema, "table": table}).first() is not None


def unrecorded_tables(connection: Connection, schema: str) -> str | None:
    """For a database without alkstore's version table: why alkstore's tables are there
    anyway (None when they are not). Made by ``metadata.create_all()`` or a revision
    autogenerated from ``alkstore_sa.metadata``, no migration can continue from them: the
    first step would fail with "table alkstore_jobs already exists"."""
    try:
        if not _has_table(connection, schema, "alkstore_jobs"):
            return None
    except sa.exc.DBAPIError as exc:
        raise _driver_error("could not read the alkstore schema", exc, READ_RIGHTS) from exc
    where = "" if connection.dialect.name == "sqlite" else f" (schema {schema!r})"
    return (
        f"alkstore's tables are in this database{where} but no version is recorded for them "
        f"(in {VERSION_TABLE}): they were made outside alkstore's migrations "
        "(`metadata.create_all()`, or a revision autogenerated with `alkstore_sa.metadata` in "
        "`target_metadata`), so no migration can continue from them. Drop them (and that "
        "revision's DDL), then install"
    )


# the schemas holding alkstore's jobs table (names compared, never interpolated)
_PG_INSTALLED_SCHEMAS = sa.text(
    "SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
    " ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
    " WHERE c.relname OPERATOR(pg_catalog.=) 'alkstore_jobs' ORDER BY n.nspname LIMIT 4"
)


def _installed_elsewhere(connection: Connection, schema: str) -> str:
    """PostgreSQL, for a schema without alkstore: the schemas of this database that have it,
    and how to name one, as the start of the advice ("" when there are none). Without it
    the advice was only `alkstore migrate`, which for a store made without the schema its
    tables are in (a worker started without ``--schema``) installs a second, empty copy."""
    try:
        found = [s for s in connection.execute(_PG_INSTALLED_SCHEMAS).scalars() if s != schema]
    except sa.exc.DBAPIError as exc:
        raise _driver_error("could not read the alkstore schema", exc, READ_RIGHTS) from exc
    if not found:
        return ""
    named = ", ".join(repr(s) for s in found[:3]) + (", ..." if len(found) > 3 else "")
    first = found[0]
    return (
        f"they are in schema{'s' if len(found) > 1 else ''} {named} of this database: give the "
        "store its schema "
        f"(alk.Store(..., schema={first!r}), `--schema {shlex.quote(first)}` or "
        f"ALKSTORE_SCHEMA={shlex.quote(first)}); or, for a separate copy in {schema!r}, "
    )


@functools.lru_cache(maxsize=1)
def head_revision() -> str:
    """The newest revision this library version ships (the highest schema step)."""
    return max(packaged_revisions(), key=lambda r: parse_revision(r) or (0, 0))


@functools.lru_cache(maxsize=1)
def packaged_revisions() -> frozenset[str]:
    """Every revision this library version ships, read off its revision files without
    importing Alembic: every process that checks the schema version (each worker, each
    ``alkstore`` command) would pay ~0.3 s for Alembic, Mako and, where installed, Pygments.
    A test checks the two readings agree."""
    found = frozenset(
        m[1] for f in (HERE / "versions").glob("alkstore_*.py") if (m := _REVISION_LINE.search(f.read_text("utf-8")))
    )
    assert found and all(parse_revision(r) is not None for r in found), found
    return found


def head_step() -> int:
    """The schema step of this library's head revision (``steps.HEAD``, without Alembic)."""
    parsed = parse_revision(head_revision())
    assert parsed is not None
    return parsed[0]


_REVISION_LINE = re.compile(r'^revision = "([^"]+)"$', re.MULTILINE)


def step_revision(step: int) -> str | None:
    """The packaged revision id of schema step ``step`` (None for step 0: not installed);
    ``InvalidOptions`` when this library ships no such step."""
    if step == 0:
        return None
    for revision in packaged_revisions():
        parsed = parse_revision(revision)
        if parsed is not None and parsed[0] == step:
            return revision
    raise InvalidOptions(f"this alkstore_sa ships no schema step {step} (its head is {head_revision()})")


_REVISION_ID = re.compile(r"alkstore_([0-9]{4})(?:_r([0-9]{4}))?")


def parse_revision(revision: str) -> tuple[int, int] | None:
    """``(step, readers_from)`` of an alkstore revision id: the schema step it brings the
    database to, and the oldest step a library must ship to use that schema; None when the
    id is not of that form."""
    m = _REVISION_ID.fullmatch(revision)
    if m is None:
        return None
    return int(m[1]), int(m[2] or 1)


Verdict = Literal["ok", "outdated", "newer", "too new"]


def schema_verdict(current: str) -> Verdict:
    """What this library makes of a database at revision ``current``: its own head (ok), an
    older step (outdated: migrate), a newer step it may use as it is (newer), or a schema it
    cannot use (too new: a newer step that requires newer readers, or an unknown id)."""
    head = head_revision()
    if current == head:
        return "ok"
    if current in packaged_revisions():
        return "outdated"
    parsed, (head_step, _) = parse_revision(current), parse_revision(head) or (0, 0)
    if parsed is None:
        return "too new"
    step, readers_from = parsed
    if step < head_step:
        return "outdated"
    if step > head_step and readers_from <= head_step:
        return "newer"
    return "too new"


def too_new_message(current: str) -> str:
    head = head_revision()
    parsed = parse_revision(current)
    if parsed is None or parsed[0] <= (parse_revision(head) or (0, 0))[0]:
        return (
            f"this database records alkstore revision {current!r}, which this alkstore_sa (head "
            f"{head}) does not know: it was presumably migrated by a newer alkstore_sa; upgrade alkstore_sa"
        )
    return (
        f"this database was migrated by a newer alkstore_sa (revision {current}), whose schema "
        f"only releases with schema step {parsed[1]} or later can use; this one ships {head}: "
        "upgrade alkstore_sa"
    )


def check_schema(connection: Connection, schema: str = DEFAULT_SCHEMA) -> None:
    """Raise unless this library can use the database's alkstore schema: NotInstalled (no
    tables), SchemaOutdated (older: migrate), SchemaTooNew (newer, and not usable by this
    version: upgrade the library). A newer schema whose steps are additive is accepted."""
    if connection.dialect.name == "sqlite":
        _sqlite.refuse_exclusive_locking(connection.connection.dbapi_connection)
    current = current_revision(connection, schema)
    advice = install_advice(schema, connection.dialect.name)
    if current is None:
        unrecorded = unrecorded_tables(connection, schema)
        if unrecorded is not None:
            raise NotInstalled(f"{unrecorded}: {advice}")
        if connection.dialect.name == "sqlite":
            raise NotInstalled(f"alkstore tables are not installed in this database: {advice}")
        raise NotInstalled(
            f"alkstore tables are not installed in this database (schema {schema!r}): "
            f"{_installed_elsewhere(connection, schema)}{advice}"
        )
    verdict = schema_verdict(current)
    if verdict == "outdated":
        raise SchemaOutdated(
            f"the alkstore schema in this database is at {current}, this library needs {head_revision()}: {advice}"
        )
    if verdict == "too new":
        raise SchemaTooNew(too_new_message(current))
    if verdict == "newer":
        log.info(
            "the alkstore schema in this database (%s) is newer than this library's (%s); its later "
            "steps are additive, so this version uses it as it is", current, head_revision(),
        )

