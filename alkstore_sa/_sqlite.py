"""SQLite connection settings the store relies on: a long busy timeout so concurrent
writers wait instead of failing with 'database is locked'. (WAL is switched on once, at
install time: it is persistent in the file and cannot be switched inside a transaction.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

BUSY_TIMEOUT_MS = 60_000


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # With WAL, NORMAL keeps the database consistent across crashes and skips an fsync per
    # commit; only the last commits before a power loss can be lost (SQLite's documented
    # recommendation for WAL).
    dbapi_conn.execute("PRAGMA synchronous = NORMAL")


def configure_sqlite_engine(engine: Engine) -> None:
    """Apply the settings to every connection the engine opens from now on."""
    if not event.contains(engine, "connect", _on_connect):
        event.listen(engine, "connect", _on_connect)
    # connections the pool already holds were opened without the hook
    engine.pool.dispose()
