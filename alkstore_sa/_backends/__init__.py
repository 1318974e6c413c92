"""Internal: the only place that branches on the database dialect. Not public API."""

from __future__ import annotations

from ..errors import InvalidOptions
from .base import Backend, Executor


def backend_for(dialect_name: str, schema: str) -> Backend:
    """The backend registered for a SQLAlchemy dialect name, its module imported when a
    store first needs it (a SQLite application never loads the PostgreSQL one's)."""
    cls: type[Backend]
    if dialect_name == "postgresql":
        from .postgresql import PostgresBackend as cls
    elif dialect_name == "sqlite":
        from .sqlite import SQLiteBackend as cls
    else:
        raise InvalidOptions(f"alkstore_sa supports PostgreSQL (psycopg 3) and SQLite, not {dialect_name!r}")
    return cls(schema)


__all__ = ["Backend", "Executor", "backend_for"]
