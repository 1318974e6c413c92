"""The core every backend module builds on: the dialect hooks an engine implements, the
statement compiler and its cache, error translation, and the shared predicates.

Statements are SQLAlchemy Core expressions, compiled once per backend (dialect + schema)
and driver (placeholder style and bind casts) into driver SQL and cached; operations then
run that SQL on an Executor, which is either one of the store's own driver connections
(autocommit, so a single-statement operation is one round trip) or the caller's SQLAlchemy
Connection (the caller's transaction, on whatever driver the caller's engine uses: the
backend of that driver is a sibling of the store's, see ``for_dialect``)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from .._unreachable import PRIVILEGE_REFUSED, RUNTIME_GRANTS
from ..errors import DatabaseError, InvalidOptions, NotInstalled, SchemaOutdated, install_advice
from ..schema import DEFAULT_SCHEMA, JOB_FIELDS, jobs
from .sql import PROCESSING, Executor, bp

T = TypeVar("T")


class Core(abc.ABC):
    """Dialect hooks, statement compilation, error translation and the predicates every
    operation module builds on."""

    name: ClassVar[str]
    # the driver of the store's own connections, and so of the SQL compiled by default
    default_driver: ClassVar[str]

    def __init__(self, schema: str = DEFAULT_SCHEMA, driver: str | None = None) -> None:
        self.schema = schema
        self.driver = driver or self.default_driver
        self._sql: dict[str, str] = {}
        # positional drivers (asyncpg's $1): the parameter names of each compiled text, in order
        self._positions: dict[str, tuple[str, ...]] = {}
        self.dialect = self.compile_dialect()
        self.positional: bool = self.dialect.positional
        # this backend and its siblings for other drivers, shared by all of them
        self._siblings: dict[str, Core] = {self.driver: self}
        # a caller's dialect class -> the member of the family compiling for it (the fast
        # path of for_dialect, which every transactional call takes)
        self._by_dialect_class: dict[type, Core] = {}

    # -- hooks -----------------------------------------------------------------------------

    @abc.abstractmethod
    def compile_dialect(self) -> Dialect:
        """The dialect statements are compiled for: ``self.driver``'s parameter style."""

    @abc.abstractmethod
    def driver_of(self, dialect: Dialect) -> str:
        """Which compiled SQL a caller's connection of this SQLAlchemy dialect takes (the
        drivers that share a placeholder style and casts share one); InvalidOptions for a
        driver the library does not support."""

    def for_dialect(self, dialect: Dialect) -> Any:
        """This backend, or its sibling compiling for the driver of ``dialect``: same schema
        and statements, another compile cache. A caller's connection may use another driver
        than the store's own connections (asyncpg, psycopg2): its SQL must be compiled for it."""
        found = self._by_dialect_class.get(type(dialect))
        if found is not None:
            return found
        if dialect.name != self.name:
            # a Queue handle of a store on the other kind of database: its SQL would be sent
            # to this one (a syntax error that aborts the caller's transaction)
            raise InvalidOptions(
                f"this store's tables are in a {self.name} database, and the session or "
                f"connection is on {dialect.name}: use a Queue handle of a store on the "
                f"session's own database"
            )
        driver = self.driver_of(dialect)
        sibling = self._siblings.get(driver)
        if sibling is None:
            sibling = type(self)(self.schema, driver)
            sibling._siblings = self._siblings  # one family: any member finds the others
            # a race may build two: either one is correct, the first stored is kept
            sibling = self._siblings.setdefault(driver, sibling)
        self._by_dialect_class[type(dialect)] = sibling
        return sibling

    def positions(self, sql: str) -> tuple[str, ...]:
        """The parameter names of a positional driver's compiled ``sql``, in order."""
        return self._positions[sql]

    @abc.abstractmethod
    def database_identity(self, ex: Executor) -> tuple[Any, ...]:
        """Which database ``ex``'s connection reaches, comparable across drivers and routes
        (a pooler, a direct connection): a store checks a caller's engine with it."""

    @abc.abstractmethod
    def target_schema(self) -> str:
        """What the declared ``alkstore`` schema is rendered as."""

    @abc.abstractmethod
    def now(self) -> sa.ColumnElement[float]:
        """The operation's single time reading: the ``now`` parameter, or the database clock."""

    @abc.abstractmethod
    def is_missing_table(self, exc: BaseException) -> bool:
        """Whether a driver error means the alkstore tables are not installed."""

    @abc.abstractmethod
    def is_missing_column(self, exc: BaseException) -> bool:
        """Whether a driver error means a column of alkstore's tables is missing: every
        statement is alkstore's own, written for this library's schema, so the database's
        schema is older (the library was upgraded, the database not migrated)."""

    @abc.abstractmethod
    def append_error(self, errors: Any, attempts: Any) -> sa.ColumnElement[str]:
        """``errors`` (a JSON array as text) with ``{attempt, error, at}`` appended, built in
        SQL so the entry's time is the operation's clock reading. A stored history that is
        not a JSON array (edited by hand) becomes one entry ``{attempt: null, error:
        UNREADABLE_HISTORY + the text, at: null}`` before the append: parsing it as it was
        failed the retry or fail that carried the outcome (the claim lapsed, the job went
        dead only by reclaim exhaustion), or, on SQLite, dropped the new entry of an object."""

    def errors_after(self, src: Any) -> sa.ColumnElement[str]:
        """The history after an op that may carry an error (``:error`` NULL = nothing to add)."""
        return sa.case(
            (bp("error", sa.Text).is_(None), src.c.errors),
            else_=self.append_error(src.c.errors, src.c.attempts),
        )

    @abc.abstractmethod
    def prepare_connection(self, dbapi_conn: Any) -> Any:
        """Put a driver connection in autocommit mode; return what restores it."""

    @abc.abstractmethod
    def restore_connection(self, dbapi_conn: Any, saved: Any) -> None:
        """Undo ``prepare_connection`` before the connection goes back to the engine's pool."""

    def statement_runner(self, dbapi_conn: Any) -> Callable[[str, Mapping[str, Any]], Any]:
        """How the store runs one statement on one of its connections: a callable taking
        (SQL, parameters) and returning a cursor holding the result. Here the connection's
        own ``execute``, a fresh cursor per statement: a sqlite3 cursor left holding a
        statement that was not stepped to its end would keep it (and an autocommit write
        transaction) open, and a fresh one costs sqlite3 next to nothing."""
        return dbapi_conn.execute  # type: ignore[no-any-return]

    # Whether a failed statement leaves the transaction it ran in unusable (PostgreSQL
    # aborts it; SQLite carries on): then the caller's commit must be made to fail.
    failure_aborts_transaction: ClassVar[bool] = False

    # A write transaction on one of the store's own (autocommit) connections.
    BEGIN = "BEGIN"

    def begin(self, dbapi_conn: Any, saved: Any = None) -> None:
        """BEGIN on one of the store's own connections (``saved``: what ``prepare_connection``
        returned for it; None on a connection it did not prepare)."""
        dbapi_conn.execute(self.BEGIN)

    def commit(self, dbapi_conn: Any) -> None:
        dbapi_conn.execute("COMMIT")

    def rollback(self, dbapi_conn: Any) -> None:
        dbapi_conn.execute("ROLLBACK")

    def is_disconnect(self, exc: BaseException, dbapi_conn: Any) -> bool:
        """Whether ``exc`` (raised using ``dbapi_conn``) means the connection is gone."""
        return False

    def storable_text(self, dbapi_conn: Any, text: str) -> str:
        """``text`` as the database behind ``dbapi_conn`` can store it, for text alkstore
        records on its own (a handler's error): the characters its encoding lacks written
        as Python backslash escapes. SQLite stores any text."""
        return text

    def waits_for_lock(self, exc: BaseException, saved: Any) -> bool:
        """Whether ``exc``, raised by a statement outside any transaction on one of the
        store's own connections (``saved``: what ``prepare_connection`` returned for it),
        says a lock it needs is taken, and the store (not the driver) waits for it there:
        ``wait_for_lock`` runs the statement again. (SQLite in WAL mode: see
        _sqlite.wait_for_lock.)"""
        return False

    def wait_for_lock(self, dbapi_conn: Any, attempt: Callable[[], T], busy: BaseException, saved: Any) -> T:
        """``attempt()``'s result (a statement on ``dbapi_conn``) once the lock ``busy``
        said was taken is free (see ``waits_for_lock``); the last such error if it stays
        taken too long."""
        raise busy

    def alive_check(self, dbapi_conn: Any) -> Callable[[], bool] | None:
        """A check, costing no round trip, that an idle connection of the store was not
        dropped by the server meanwhile; None where connections cannot be dropped."""
        return None

    @abc.abstractmethod
    def upsert(self, table: sa.Table) -> Any:
        """The dialect's INSERT construct that supports ON CONFLICT."""

    # -- notify / wake ---------------------------------------------------------------------

    @abc.abstractmethod
    def channel_key(self, channel: str) -> str:
        """How a user channel name is addressed by this engine's transport."""

    @abc.abstractmethod
    def wake_key(self, queue: str) -> str:
        """The key a queue's consumers wait on."""

    @abc.abstractmethod
    def stream_wake_key(self, stream: str) -> str:
        """The key a stream's subscribers wait on."""

    @abc.abstractmethod
    def create_hub(self, engine: Any, listen_engine: Any = None, clock: Any = None) -> Any:
        """The store's listener (PostgreSQL; on ``listen_engine`` when given) or watcher
        (SQLite; ``clock`` is the store's time reading, for its reader heartbeat)."""

    @abc.abstractmethod
    def notify(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """Send ``:payload`` on ``:channel`` (delivered when the executor's transaction commits)."""

    def _with_wake(self, insert: Any) -> sa.Executable:
        """An enqueue INSERT ... RETURNING id, plus whatever wakes the queue on commit."""
        return insert  # type: ignore[no-any-return]

    def limit(self, stmt: sa.Select[Any], key: str) -> sa.Select[Any]:
        """``LIMIT :key`` with a bound limit."""
        return stmt.limit(bp(key, sa.Integer))

    # -- compilation -----------------------------------------------------------------------

    def sql(self, key: str, build: Callable[[], Any]) -> str:
        """Driver SQL for a statement, compiled once per backend (and driver) and reused."""
        text = self._sql.get(key)
        if text is None:
            compiled: Any = build().compile(
                dialect=self.dialect,
                schema_translate_map={DEFAULT_SCHEMA: self.target_schema()},
                render_schema_translate=True,
            )
            anonymous = [b.key for b in compiled.binds.values() if b.unique]
            if anonymous:  # a literal became an anonymous parameter the executor never passes
                raise AssertionError(f"statement {key!r} has anonymous parameters {anonymous}")
            text = compiled.string
            if self.positional:
                # $n markers: the executor passes the values in this order (each name once:
                # a parameter used twice is one $n)
                self._positions[text] = tuple(compiled.positiontup)
            self._sql[key] = text
        return text

    def translate_error_on(self, exc: BaseException, dbapi_conn: Any) -> BaseException:
        """``translate_error`` for ``exc``, raised by a statement on ``dbapi_conn`` (None: not
        known), which may say more of it (SQLite: the busy timeout its handler waited out)."""
        return self.translate_error(exc)

    def translate_error(self, exc: BaseException) -> BaseException:
        """The one place driver exceptions become alkstore errors."""
        orig = getattr(exc, "orig", None) or exc
        if self.is_missing_table(orig):
            # the driver's first line names the table: when the rest is installed (one dropped
            # outside the migrations), `alkstore migrate` says so too, rather than "at head"
            missing = (str(orig).strip().splitlines() or [""])[0]
            err: BaseException = NotInstalled(
                f"alkstore tables are not installed in this database ({missing}): "
                f"{install_advice(self.schema, self.name)}"
            )
        elif self.is_missing_column(orig):
            # the caller's-transaction forms read no version first (a read in the caller's
            # transaction): the older schema shows here, and is said as the store says it
            err = SchemaOutdated(
                "the alkstore schema in this database is older than this library needs "
                f"({' '.join(str(orig).split())}): {install_advice(self.schema, self.name)}"
            )
        else:
            advice = _privilege_advice(orig) + _encoding_advice(orig)
            err = DatabaseError(f"{type(orig).__name__}: {orig}".strip() + advice, orig=orig)
        err.__cause__ = exc
        return err

    # -- shared predicates -----------------------------------------------------------------

    def not_expired(self, t: Any = jobs, now: Any = None) -> sa.ColumnElement[bool]:
        return sa.or_(t.c.expires_at.is_(None), t.c.expires_at > (self.now() if now is None else now))

    def this_claim(self) -> sa.ColumnElement[bool]:
        """The validity predicate: processing under *this* claim, deadline not passed.

        The attempt number identifies the claim (every claim increments it; no other
        transition touches it), so two workers with the same worker_id cannot act on each
        other's claims, and a reclaim invalidates the earlier holder atomically.
        """
        return sa.and_(
            jobs.c.id == bp("id", sa.BigInteger),
            jobs.c.state == PROCESSING,
            jobs.c.attempts == bp("attempts", sa.Integer),
            jobs.c.claim_expires_at > self.now(),
        )

    def dead_values(self, src: Any, last_error: Any, errors: Any = None, now: Any = None) -> list[Any]:
        """Columns for an INSERT INTO dead SELECT from a live-shaped source ``src``."""
        cols = [src.c[f] for f in JOB_FIELDS if f != "errors"]
        return cols + [src.c.errors if errors is None else errors, last_error, self.now() if now is None else now]

    DEAD_INSERT_COLUMNS = [f for f in JOB_FIELDS if f != "errors"] + ["errors", "last_error", "died_at"]

    # -- clock -----------------------------------------------------------------------------

    def read_now(self, ex: Executor, now: float | None) -> float:
        """The operation's time as a number: the injected reading, or one database read."""
        if now is not None:
            return now
        return float(ex.rows(self.sql("now", lambda: sa.select(self.now())), {"now": None})[0][0])


def _privilege_advice(orig: BaseException) -> str:
    """For a privilege the server refused the role (insufficient_privilege): what to grant.
    The server names the table or schema; the usual cause after an upgrade is a table the
    migration added that the default privileges did not reach."""
    if (getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)) != PRIVILEGE_REFUSED:
        return ""
    return (
        f" ({RUNTIME_GRANTS}; tables a later migration added are granted only by the ALTER "
        "DEFAULT PRIVILEGES of the role that ran it)"
    )


def _encoding_advice(orig: BaseException) -> str:
    """For a value the driver could not encode in the connection's client encoding (a role's,
    database's or URL's ``client_encoding`` other than UTF8: psycopg encodes in it): which
    one, and how to give the connections UTF8 — the database itself may hold the value."""
    if not isinstance(orig, UnicodeEncodeError) or orig.encoding.replace("-", "").lower() == "utf8":
        return ""
    return (
        f" (this connection's client_encoding is {orig.encoding}; on a UTF8 database give the "
        "connections UTF8: ?client_encoding=utf8 in the URL, or reset the role's or database's "
        "client_encoding; docs/install.md, PostgreSQL database encoding)"
    )
