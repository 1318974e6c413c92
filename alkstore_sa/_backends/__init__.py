"""Internal: the only place that branches on the database dialect. Not public API."""

from __future__ import annotations

from ..errors import InvalidOptions
from .base import Backend, Executor
from .postgresql import PostgresBackend
from .sqlite import SQLiteBackend

_BACKENDS: dict[str, type[Backend]] = {"postgresql": PostgresBackend, "sqlite": SQLiteBackend}


def backend_for(dialect_name: str, schema: str) -> Backend:
    """The backend registered for a SQLAlchemy dialect name."""
    try:
        cls = _BACKENDS[dialect_name]
    except KeyError:
        raise InvalidOptions(
            f"alkstore_sa supports PostgreSQL (psycopg 3) and SQLite, not {dialect_name!r}"
        ) from None
    return cls(schema)


__all__ = ["Backend", "Executor", "backend_for"]
