"""The caller's-transaction functions called from a Session's ``after_commit`` hook (the
"send it after the commit" habit of broker queues) or ``after_rollback`` hook: there is no
transaction left to join,
so ``InvalidOptions`` says so, and nothing is written — not a DatabaseError, as if the
database had refused a statement."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import Target, engine_with_table

rows = sa.Table(
    "test_hook_rows", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("note", sa.Text, unique=True)
)


@pytest.fixture
def app_engine(db: Target) -> Iterator[sa.Engine]:
    yield from engine_with_table(db, rows)


CALLS = ["enqueue", "enqueue_many", "outbox_enqueue", "publish", "notify", "get_job", "task"]


def _call(session: Any, call: str, qname: str) -> Any:
    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def job(x: int) -> None: ...

    if call == "task":
        return job.enqueue(session, 1)
    args: dict[str, tuple[Any, ...]] = {
        "enqueue": (qname, 1), "enqueue_many": (qname, [1, 2]), "outbox_enqueue": (qname, 1),
        "publish": (qname, 1), "notify": (qname, "hi"), "get_job": (qname, 1),
    }
    return getattr(alk, call)(session, *args[call])


@pytest.mark.parametrize("hook", ["after_commit", "after_rollback"])
@pytest.mark.parametrize("call", CALLS)
def test_a_call_in_an_after_commit_or_after_rollback_hook_is_refused(
    app_engine: sa.Engine, store: alk.Store, qname: str, call: str, hook: str
) -> None:
    errors: list[BaseException] = []
    with Session(app_engine) as session:

        def ended(sess: Session) -> None:
            try:
                _call(sess, call, qname)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                errors.append(exc)

        event.listen(session, hook, ended)
        session.execute(sa.insert(rows).values(note="committed"))
        session.commit() if hook == "after_commit" else session.rollback()
        assert len(errors) == 1 and type(errors[0]) is alk.InvalidOptions, errors
        assert hook in str(errors[0]) and "Nothing was written" in str(errors[0])
        event.remove(session, hook, ended)
        # the session carries on: its next transaction takes the call
        alk.enqueue(session, qname, "next")
        session.commit()
    assert store.queue(qname).stats().pending == 1
    assert store.outbox(qname).queue.stats().pending == 0
    assert store.stream(qname).read(0, 10) == []


def test_a_call_in_an_async_sessions_after_commit_hook_is_refused(db: Target, store: alk.Store, qname: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    url = db.url.replace("+psycopg", "+asyncpg") if db.kind == "postgresql" else db.url.replace("sqlite:", "sqlite+aiosqlite:")
    engine = create_async_engine(url)
    store.register(engine)
    errors: list[BaseException] = []

    async def scenario() -> None:
        async with AsyncSession(engine) as session:

            @event.listens_for(session.sync_session, "after_commit")
            def after_commit(sess: Session) -> None:
                try:
                    alk.enqueue(sess, qname, 1)
                except Exception as exc:  # noqa: BLE001 - the test looks at it
                    errors.append(exc)

            await alk.aenqueue(session, qname, "kept")
            await session.commit()
        await engine.dispose()

    asyncio.run(scenario())
    assert len(errors) == 1 and type(errors[0]) is alk.InvalidOptions, errors
    assert store.queue(qname).stats().pending == 1



@pytest.mark.parametrize("call", CALLS)
def test_a_call_after_a_rollback_inside_a_begin_block_is_refused(
    app_engine: sa.Engine, store: alk.Store, qname: str, call: str
) -> None:
    """``session.rollback()`` inside ``with session.begin():`` closes the block's transaction;
    SQLAlchemy then refuses any statement until the block ends. That is the session's state,
    not a database failure: InvalidOptions, nothing written."""
    with Session(app_engine) as session, session.begin():
        session.execute(sa.insert(rows).values(note="rolled back"))
        session.rollback()
        with pytest.raises(alk.InvalidOptions, match="Nothing was written") as info:
            _call(session, call, qname)
        assert not isinstance(info.value, sa.exc.SQLAlchemyError)
    assert store.queue(qname).stats().pending == 0
    assert store.outbox(qname).queue.stats().pending == 0
    assert store.stream(qname).read(0, 10) == []
