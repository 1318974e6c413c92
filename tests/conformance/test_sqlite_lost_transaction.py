"""SQLite rolls a whole transaction back after some failures of a statement — an interrupt
(``sqlite3.Connection.interrupt()``, or a progress handler used as a time limit), an I/O
error, out of memory. When that statement is a caller's-transaction call, the caller's
later commit must fail (SPEC §13), not succeed with nothing to commit (SQLite only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import Target

orders = sa.Table("lost_tx_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("note", sa.Text))


def _once() -> Callable[[], int]:
    """A progress handler that asks SQLite to stop (SQLITE_INTERRUPT) once, in the next
    statement: the application's time limit firing."""
    fired: list[bool] = []

    def handler() -> int:
        if fired:
            return 0
        fired.append(True)
        return 1

    return handler


def _interrupt_next_statement(conn: sa.Connection) -> None:
    conn.connection.driver_connection.set_progress_handler(_once(), 1)  # type: ignore[union-attr]


def _notes(target: Target) -> list[str]:
    with target.engine.connect() as conn:
        return list(conn.scalars(sa.select(orders.c.note)))


@pytest.mark.parametrize("target", ["session", "connection", "savepoint"])
def test_an_interrupted_enqueue_makes_the_commit_fail(sqlite_db: Target, qname: str, target: str) -> None:
    """SQLite rolled the caller's transaction back (its own order row with it) and the
    commit returned as if it had written the order: now it raises."""
    orders.create(sqlite_db.engine)
    store = sqlite_db.store()
    try:
        with Session(sqlite_db.engine) as session:
            conn: Any = session if target != "connection" else session.connection()
            session.execute(orders.insert().values(note="mine"))
            nested = session.begin_nested() if target == "savepoint" else None
            _interrupt_next_statement(session.connection())
            with pytest.raises(alk.DatabaseError, match="interrupted"):
                alk.enqueue(conn, qname, {"order": "mine"})
            if nested is not None:
                nested.rollback()  # what `with session.begin_nested():` does on the error
            with pytest.raises(sa.exc.SQLAlchemyError):
                session.commit()
            session.rollback()
            # usable again, on a fresh connection: the request can start over
            session.execute(orders.insert().values(note="again"))
            job_id = alk.enqueue(session, qname, {"order": "again"})
            session.commit()
        assert _notes(sqlite_db) == ["again"]
        assert store.get_job(job_id) is not None
    finally:
        store.close()


def test_an_interrupted_aenqueue_makes_the_commit_fail(sqlite_db: Target, qname: str) -> None:
    """The same through aiosqlite and ``alk.aenqueue``."""
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    orders.create(sqlite_db.engine)

    async def scenario() -> None:
        engine = create_async_engine(sqlite_db.url.replace("sqlite:///", "sqlite+aiosqlite:///", 1))
        store = alk.Store(engine)
        try:
            async with AsyncSession(engine) as session:
                await session.execute(orders.insert().values(note="mine"))
                # the store's first call through an engine not its own checks that it reaches
                # the store's database (one read): made before, so the enqueue is interrupted
                assert await alk.aget_job(session, qname, 1) is None
                raw = await (await session.connection()).get_raw_connection()
                await raw.driver_connection.set_progress_handler(_once(), 1)  # type: ignore[union-attr]
                with pytest.raises(alk.DatabaseError, match="interrupted"):
                    await alk.aenqueue(session, qname, {"order": "mine"})
                with pytest.raises(sa.exc.SQLAlchemyError):
                    await session.commit()
        finally:
            store.close()
            await engine.dispose()

    asyncio.run(scenario())
    assert _notes(sqlite_db) == []
