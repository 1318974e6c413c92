"""Read/write-splitting sessions (a ``Session`` subclass whose ``get_bind`` sends writes to
the primary and reads to a replica, as in SQLAlchemy's "custom vertical partitioning"
recipe and Flask-SQLAlchemy routing sessions): every caller's-transaction write reaches
the primary, in the session's transaction there, and never the replica."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from sqlalchemy.sql import Delete, Insert, Update

import alkstore_sa as alk
from tests.support import Target


@pytest.fixture
def replica(db: Target, tmp_path: Any) -> Iterator[sa.Engine]:
    """An engine where a write fails or lands where no worker looks: on PostgreSQL the
    same database read-only (as a hot standby is); on SQLite another, empty file."""
    if db.kind == "postgresql":
        engine = sa.create_engine(db.url, connect_args={"options": "-c default_transaction_read_only=on"})
    else:
        engine = sa.create_engine(f"sqlite:///{tmp_path}/replica.db")
    yield engine
    engine.dispose()


def routing_session(primary: sa.Engine, replica: sa.Engine) -> Session:
    class RoutingSession(Session):
        def get_bind(self, mapper: Any = None, clause: Any = None, **kw: Any) -> Any:
            if self._flushing or isinstance(clause, (Insert, Update, Delete)):
                return primary
            return replica

    return RoutingSession()


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "outbox_enqueue", "publish", "notify", "task"])
def test_a_routing_session_writes_to_the_primary(
    db: Target, replica: sa.Engine, store: alk.Store, qname: str, call: str
) -> None:
    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def job(x: int) -> None: ...

    with routing_session(store.engine, replica) as session:
        if call == "enqueue":
            alk.enqueue(session, qname, 1)
        elif call == "enqueue_many":
            alk.enqueue_many(session, qname, [1, 2])
        elif call == "outbox_enqueue":
            alk.outbox_enqueue(session, qname, 1)
        elif call == "publish":
            alk.publish(session, qname, 1)
        elif call == "notify":
            alk.notify(session, qname, "hi")  # SQLite: a row in the primary's notifications
        else:
            job.enqueue(session, 1)
        session.commit()
    if call == "outbox_enqueue":
        assert store.outbox(qname).queue.stats().pending == 1
    elif call == "publish":
        assert [e.payload for e in store.stream(qname).read(0, 10)] == [1]
    elif call != "notify":
        assert store.queue(qname).stats().pending >= 1


def test_an_async_routing_session_writes_to_the_primary(db: Target, store: alk.Store, qname: str, tmp_path: Any) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    if db.kind == "postgresql":
        url = db.url.replace("+psycopg", "+asyncpg")
        primary = create_async_engine(url)
        replica = create_async_engine(url, connect_args={"server_settings": {"default_transaction_read_only": "on"}})
    else:
        primary = create_async_engine(db.url.replace("sqlite:", "sqlite+aiosqlite:"))
        replica = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/replica.db")
    store.register(primary)

    class RoutingSession(Session):
        def get_bind(self, mapper: Any = None, clause: Any = None, **kw: Any) -> Any:
            if self._flushing or isinstance(clause, (Insert, Update, Delete)):
                return primary.sync_engine
            return replica.sync_engine

    async def scenario() -> list[int]:
        async with AsyncSession(sync_session_class=RoutingSession) as session:
            ids = [await alk.aenqueue(session, qname, 1), *await alk.aenqueue_many(session, qname, [2, 3])]
            await session.commit()
        await primary.dispose()
        await replica.dispose()
        return ids

    ids = asyncio.run(scenario())
    assert [h.id for h in store.queue(qname).claim_batch("w", 10)] == ids


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "outbox_enqueue", "publish", "notify", "task"])
def test_a_sharded_session_is_refused_with_invalid_options_and_its_shard_connection_works(
    store: alk.Store, qname: str, call: str
) -> None:
    """A ShardedSession cannot name a shard for a statement of no mapped class (SQLAlchemy
    asserts it has a mapper): InvalidOptions saying to pass the shard's Connection, not an
    AssertionError; and that Connection takes the job in the session's transaction."""
    from sqlalchemy.ext.horizontal_shard import ShardedSession

    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def job(x: int) -> None: ...

    def write(target: Any) -> None:
        if call == "task":
            job.enqueue(target, 1)
            return
        args: dict[str, tuple[Any, ...]] = {
            "enqueue": (qname, 1), "enqueue_many": (qname, [1]), "outbox_enqueue": (qname, 1),
            "publish": (qname, 1), "notify": (qname, "hi"),
        }
        getattr(alk, call)(target, *args[call])

    session = ShardedSession(
        shards={"east": store.engine},
        shard_chooser=lambda mapper, instance, **kw: "east",
        identity_chooser=lambda *args, **kw: ["east"],
        execute_chooser=lambda context: ["east"],
    )
    with session:
        with pytest.raises(alk.InvalidOptions, match="shard_id") as info:
            write(session)
        assert isinstance(info.value.__cause__, AssertionError)
        write(session.connection(bind_arguments={"shard_id": "east"}))
        session.commit()
    if call == "task" or call.startswith("enqueue"):
        assert store.queue(qname).stats().pending == 1
    elif call == "outbox_enqueue":
        assert store.outbox(qname).queue.stats().pending == 1
    elif call == "publish":
        assert len(store.stream(qname).read(0, 10)) == 1
