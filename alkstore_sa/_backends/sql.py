"""SQL building blocks shared by every backend module: inlined constants, named bind
parameters, the Executor protocol, the column lists rows are read in."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import sqlalchemy as sa

from ..schema import JOB_FIELDS, dead_jobs, jobs

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
EXHAUSTED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXHAUSTED}'")
EXPIRED_SQL: sa.ColumnClause[Any] = sa.literal_column(f"'{EXPIRED}'")


def bp(name: str, type_: Any) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


class Executor(Protocol):
    """Runs compiled driver SQL with a dict of parameters."""

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]: ...

    def rowcount(self, sql: str, params: Mapping[str, Any]) -> int: ...

    def transaction(self) -> AbstractContextManager[None]: ...


LIVE_COLUMNS = [jobs.c[f] for f in JOB_FIELDS] + [jobs.c.state]
DEAD_COLUMNS = [dead_jobs.c[f] for f in JOB_FIELDS] + [DEAD, dead_jobs.c.last_error, dead_jobs.c.died_at]
