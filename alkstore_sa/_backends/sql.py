"""SQL building blocks shared by every backend module: inlined constants, named bind
parameters, the Executor protocol, the column lists rows are read in."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import sqlalchemy as sa

from ..schema import JOB_FIELDS, UNREADABLE_HISTORY, dead_jobs, jobs

# State values are inlined as literals (never bound): SQLite only uses a partial index
# when the query's WHERE literally implies the index's WHERE.
PENDING: sa.ColumnClause[Any] = sa.literal_column("'pending'")
PROCESSING: sa.ColumnClause[Any] = sa.literal_column("'processing'")
DEAD: sa.ColumnClause[Any] = sa.literal_column("'dead'")
EMPTY_ERRORS: sa.ColumnClause[Any] = sa.literal_column("'[]'")
ZERO: sa.ColumnClause[Any] = sa.literal_column("0")

ONE: sa.ColumnClause[Any] = sa.literal_column("1")
NEXT_DUE_PRIORITIES = 64
EXHAUSTED = "max attempts exceeded"
EXPIRED = "expired"
# The reserved stream name under which SQLite's watchers keep their notification reading
# places in alkstore_stream_offsets (sqlite.py); never a user stream (the prefix is reserved).
NOTIFY_READERS = "__alkstore_notify_readers"
NOTIFY_READERS_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{NOTIFY_READERS}'")
EXHAUSTED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXHAUSTED}'")
EXPIRED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXPIRED}'")
UNREADABLE_HISTORY_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{UNREADABLE_HISTORY}'")
ARRAY_SQL: sa.ColumnClause[Any] = sa.literal_column("'array'")


def bp(name: str, type_: Any) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


class _Inferred(sa.types.TypeDecorator[Any]):
    """No SQL type of its own, and not adopting the type of what it is compared with (as
    an untyped bind would): the driver SQL carries no cast for it."""

    impl = sa.types.NullType
    cache_ok = True


def arg(name: str) -> sa.BindParameter[Any]:
    """A bind parameter of no declared type, for the claim's: PostgreSQL types it from its
    use (the column it is compared with, a LIMIT), and psycopg's SQL then carries no cast
    for it — the claim must stay under psycopg's 4 KiB parse cache (PostgresBackend)."""
    return sa.bindparam(name, type_=_Inferred())


class Executor(Protocol):
    """Runs compiled driver SQL with a dict of parameters."""

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int: ...

    def transaction(self) -> AbstractContextManager[None]: ...

    def now(self) -> float | None:
        """The store's clock read again (None: the operation's parameters carry its time)."""
        ...


LIVE_COLUMNS = [jobs.c[f] for f in JOB_FIELDS] + [jobs.c.state]
DEAD_COLUMNS = [dead_jobs.c[f] for f in JOB_FIELDS] + [DEAD, dead_jobs.c.last_error, dead_jobs.c.died_at]
