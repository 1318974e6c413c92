"""The database each benchmark run uses, per engine: an installed alkstore Store, the floor
table next to it, and raw driver connections.

- SQLite: fresh files in a temporary directory, removed afterwards: ``bench.db`` for the
  library, ``floor.db`` for the floor, each in WAL mode with ``synchronous=NORMAL`` on every
  connection (the Store's connect hook; the floor sets the same pragmas). Separate files
  give each side its own WAL, so each pays its own checkpoints and never the other's.
- PostgreSQL: ``ALKSTORE_TEST_PG_URL`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``),
  a fresh schema for this run, dropped afterwards. Server defaults for durability
  (``synchronous_commit``) apply to both sides alike.

The floor table (in the same PostgreSQL schema) has the same columns as ``alkstore_jobs``, the same id allocator
(``bigserial`` / SQLite ``AUTOINCREMENT``: ids never reused, which the spec requires) and
only the index its claim needs; the library's extra indexes and CHECK constraint count
against the library.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import alkstore_sa as alk

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
FLOOR = "bench_floor_jobs"
BUSY_TIMEOUT_S = 60.0


def pg_url() -> str:
    return os.environ.get("ALKSTORE_TEST_PG_URL", DEFAULT_PG_URL)


def _pg_floor_ddl(table: str, index: str) -> list[str]:
    return [
        f"""CREATE TABLE {table} (
            id bigserial PRIMARY KEY,
            state text NOT NULL,
            queue text NOT NULL,
            payload text NOT NULL,
            priority integer NOT NULL,
            attempts integer NOT NULL,
            max_attempts integer NOT NULL,
            visibility_timeout double precision NOT NULL,
            backoff_base double precision NOT NULL,
            dead_letter_retention double precision,
            created_at double precision NOT NULL,
            run_at double precision NOT NULL,
            claimed_at double precision,
            claim_expires_at double precision,
            worker_id text,
            expires_at double precision,
            errors text NOT NULL
        )""",
        f"CREATE INDEX {index} ON {table} (queue, priority DESC, run_at, id) WHERE state = 'pending'",
    ]


def _sqlite_floor_ddl(table: str, index: str) -> list[str]:
    return [
        f"""CREATE TABLE {table} (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            state TEXT NOT NULL,
            queue TEXT NOT NULL,
            payload TEXT NOT NULL,
            priority INTEGER NOT NULL,
            attempts INTEGER NOT NULL,
            max_attempts INTEGER NOT NULL,
            visibility_timeout REAL NOT NULL,
            backoff_base REAL NOT NULL,
            dead_letter_retention REAL,
            created_at REAL NOT NULL,
            run_at REAL NOT NULL,
            claimed_at REAL,
            claim_expires_at REAL,
            worker_id TEXT,
            expires_at REAL,
            errors TEXT NOT NULL
        )""",
        f"CREATE INDEX {index} ON {table} (queue, priority DESC, run_at, id) WHERE state = 'pending'",
    ]


class Unavailable(Exception):
    """The engine cannot be benchmarked here (e.g. PostgreSQL not reachable)."""


@dataclass
class Env:
    kind: str  # "sqlite" | "postgresql"
    url: str  # SQLAlchemy URL, also handed to spawned processes
    schema: str  # the Store's schema (PostgreSQL); "alkstore" (unused) on SQLite
    engine: Engine
    store: alk.Store
    jobs: str  # quoted table names for raw SQL
    dead: str
    floor: str
    floor_engine: Engine | None = None  # SQLite: the floor file's; PostgreSQL: None (``engine``)
    sqlite_path: str | None = None
    floor_path: str | None = None
    dsn: str | None = None
    tmpdir: str | None = None
    _admin: dict[bool, Any] = field(default_factory=dict, repr=False)

    # -- raw driver connections ------------------------------------------------------------

    def raw_connect(self, floor: bool = False) -> Any:
        """A new plain driver connection in autocommit mode with the run's durability, to the
        library's database or (``floor=True``) the floor's."""
        return raw_connect(self.kind, self.floor_path if floor else self.sqlite_path, self.dsn)

    def admin(self, floor: bool = False) -> Any:
        if floor not in self._admin:
            self._admin[floor] = self.raw_connect(floor)
        return self._admin[floor]

    def execute(self, sql: str, params: Any = None, *, floor: bool = False) -> list[tuple[Any, ...]]:
        conn = self.admin(floor)
        cur = conn.execute(sql, params) if params is not None else conn.execute(sql)
        return cur.fetchall() if cur.description else []

    def scalar(self, sql: str, params: Any = None, *, floor: bool = False) -> Any:
        return self.execute(sql, params, floor=floor)[0][0]

    def truncate(self, *tables: str) -> None:
        for table in tables:
            verb = "TRUNCATE" if self.kind == "postgresql" else "DELETE FROM"
            self.execute(f"{verb} {table}", floor=table == self.floor)

    def settle(self) -> None:
        """Between measurements (untimed): fold the SQLite WALs back into their files, so a
        measurement never pays for a checkpoint of what its setup wrote."""
        if self.kind == "sqlite":
            self.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.execute("PRAGMA wal_checkpoint(TRUNCATE)", floor=True)

    # -- facts for the report --------------------------------------------------------------

    def database_version(self) -> str:
        if self.kind == "postgresql":
            durability = ", ".join(
                f"{name}={self.scalar(f'SHOW {name}')}" for name in ("synchronous_commit", "fsync")
            )
            return f"PostgreSQL {self.scalar('SHOW server_version')} ({durability})"
        # read through the library's engine: its connect hook set these, not ours
        with self.engine.connect() as c:
            mode = c.exec_driver_sql("PRAGMA journal_mode").scalar()
            sync = c.exec_driver_sql("PRAGMA synchronous").scalar()
        name = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, "?")
        return f"SQLite {sqlite3.sqlite_version} (journal_mode={mode}, synchronous={name})"

    def close(self) -> None:
        try:
            for conn in self._admin.values():
                conn.close()
            self._admin.clear()
            self.store.close()
            if self.kind == "postgresql":
                with self.engine.begin() as c:
                    c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        finally:
            self.engine.dispose()
            if self.floor_engine is not None:
                self.floor_engine.dispose()
            if self.tmpdir:
                shutil.rmtree(self.tmpdir, ignore_errors=True)


def raw_connect(kind: str, sqlite_path: str | None, dsn: str | None) -> Any:
    if kind == "sqlite":
        assert sqlite_path is not None
        conn = sqlite3.connect(sqlite_path, isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
        sqlite_pragmas(conn, None)
        return conn
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    """The floor's (and the async engine's) connection settings: what the Store's connect
    hook sets on its own. Through a cursor, which sqlite3 and SQLAlchemy's aiosqlite adapter
    both have."""
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.close()


def make_env(kind: str) -> Env:
    if kind == "sqlite":
        return _sqlite_env()
    if kind == "postgresql":
        return _pg_env()
    raise ValueError(kind)


def _sqlite_env() -> Env:
    tmpdir = tempfile.mkdtemp(prefix="alkstore-bench-")
    path = os.path.join(tmpdir, "bench.db")
    floor_path = os.path.join(tmpdir, "floor.db")
    url = f"sqlite:///{path}"
    engine = sa.create_engine(url)
    floor_engine = sa.create_engine(f"sqlite:///{floor_path}")
    sa.event.listen(floor_engine, "connect", sqlite_pragmas)
    store = alk.Store(engine)
    env = Env("sqlite", url, store.schema, engine, store, '"alkstore_jobs"', '"alkstore_dead_jobs"',
              f'"{FLOOR}"', floor_engine=floor_engine, sqlite_path=path, floor_path=floor_path,
              tmpdir=tmpdir)
    try:
        store.install()  # switches the file to WAL
        env.execute("PRAGMA journal_mode = WAL", floor=True)
        for stmt in _sqlite_floor_ddl(env.floor, "bench_floor_pending_ix"):
            env.execute(stmt, floor=True)
        for floor in (False, True):
            if env.scalar("PRAGMA journal_mode", floor=floor) != "wal":
                raise RuntimeError("a SQLite benchmark file is not in WAL mode")
    except BaseException:
        env.close()
        raise
    return env


def _pg_env() -> Env:
    url = pg_url()
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            c.exec_driver_sql("SELECT 1")
    except Exception as exc:
        engine.dispose()
        raise Unavailable(f"PostgreSQL not reachable at {url}: {type(exc).__name__}: {exc}") from exc
    schema = f"alkbench_{uuid.uuid4().hex[:10]}"
    store = alk.Store(engine, schema=schema)
    dsn = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    env = Env("postgresql", url, schema, engine, store, f'"{schema}"."alkstore_jobs"',
              f'"{schema}"."alkstore_dead_jobs"', f'"{schema}"."{FLOOR}"', dsn=dsn)
    try:
        store.install()
        for stmt in _pg_floor_ddl(env.floor, "bench_floor_pending_ix"):
            env.execute(stmt)
    except BaseException:
        env.close()
        raise
    return env
