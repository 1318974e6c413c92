"""Installing on an engine set up with SQLAlchemy's pysqlite transaction recipe (SQLite
only): ``isolation_level=None`` on every connection and a ``begin`` hook emitting BEGIN, the
documented way to get working SAVEPOINTs and transactional DDL from pysqlite."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import migrations


def _recipe_engine(path: Path, begin: str) -> sa.Engine:
    engine = sa.create_engine(f"sqlite:///{path}")

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_conn: object, _record: object) -> None:
        dbapi_conn.isolation_level = None  # type: ignore[attr-defined]

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)

    return engine


@pytest.mark.parametrize("begin", ["BEGIN", "BEGIN IMMEDIATE"])
def test_install_on_an_engine_whose_begin_hook_opens_the_transaction(tmp_path: Path, begin: str) -> None:
    """The install's own BEGIN IMMEDIATE came after the hook's BEGIN: SQLite refused it
    ('cannot start a transaction within a transaction'), so Store.install() and
    migrations.upgrade() failed on a fresh file with a DatabaseError."""
    engine = _recipe_engine(tmp_path / "app.db", begin)
    store = alk.Store(engine)
    try:
        store.install()
        store.install()  # idempotent
        with engine.connect() as conn:
            assert migrations.current_revision(conn) == migrations.head_revision()
        with Session(engine) as session, session.begin():
            savepoint = session.begin_nested()
            alk.enqueue(session, "q", "rolled back with its savepoint")
            savepoint.rollback()
            kept = alk.enqueue(session, "q", "kept")
        handle = store.queue("q").claim_one("w")
        assert handle is not None and (handle.id, handle.payload) == (kept, "kept")
        assert store.queue("q").claim_one("w") is None
    finally:
        store.close()
        engine.dispose()
