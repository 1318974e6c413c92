"""Async applications: the transactional functions join an AsyncSession's transaction
through ``await session.run_sync(...)``; ``store.register(async_engine)`` points them at
the store's schema and clock."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import alkstore_sa as alk
from tests.support import Target


def _async_url(db: Target) -> str:
    return db.url.replace("sqlite:///", "sqlite+aiosqlite:///", 1) if db.kind == "sqlite" else db.url


def test_enqueue_in_an_async_session(db: Target, qname: str) -> None:
    store = db.store()

    async def scenario() -> tuple[int, list[int]]:
        engine = create_async_engine(_async_url(db))
        store.register(engine)
        try:
            async with AsyncSession(engine) as session, session.begin():
                job_id = await session.run_sync(alk.enqueue, qname, {"order": 1})
                ids = await session.run_sync(alk.enqueue_many, qname, [1, 2])
                await session.run_sync(alk.notify, "ch", "x")
            async with AsyncSession(engine) as session:
                await session.run_sync(alk.enqueue, qname, {"order": "rolled back"})
                await session.rollback()
            return job_id, ids
        finally:
            await engine.dispose()

    job_id, ids = asyncio.run(scenario())
    q = store.queue(qname)
    assert [h.id for h in q.claim_batch("w", 10)] == [job_id, *ids]
    assert q.stats().pending == 0
    store.close()


def test_register_refuses_another_database_kind(db: Target) -> None:
    store = db.store()
    other = "postgresql+psycopg://u@h/db" if db.kind == "sqlite" else "sqlite+aiosqlite:///x.db"
    engine = create_async_engine(other)
    with pytest.raises(alk.InvalidOptions):
        store.register(engine)
    asyncio.run(engine.dispose())
    store.close()


@pytest.mark.parametrize("how", ["Store(engine)", "register(engine)"])
def test_an_aiosqlite_engine_that_already_connected_is_configured_without_closing_from_sync_code(
    sqlite_db: Target, qname: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A FastAPI lifespan makes the store after the app's first query: the aiosqlite pool
    already holds a connection. The store's SQLite settings reach it at its next checkout;
    they used to be applied by disposing of the pool, which closed that connection from
    synchronous code — a MissingGreenlet 'Exception closing connection' logged, and the
    connection never closed."""

    async def scenario() -> tuple[int, int]:
        engine = create_async_engine(_async_url(sqlite_db))
        async with engine.begin() as conn:  # the app's startup query: a pooled connection now
            await conn.exec_driver_sql("SELECT 1")
        if how == "Store(engine)":
            store = alk.Store(engine)
        else:
            store = alk.Store(sqlite_db.url)
            store.register(engine)
        try:
            async with engine.connect() as conn:
                busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar_one()
            async with AsyncSession(engine) as session:
                job_id = await alk.aenqueue(session, qname, "x")
                await session.commit()
            return busy, job_id
        finally:
            store.close()
            await engine.dispose()

    with caplog.at_level("ERROR"):
        busy, job_id = asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert busy == 60_000
    assert job_id > 0
