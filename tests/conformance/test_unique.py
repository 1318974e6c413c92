"""Unique jobs (SPEC §14): while a live job (pending or processing) of a queue holds a
``unique_key``, an enqueue with that key writes nothing and returns the live job's id; an
ack, cancel or move to dead frees the key. Every single-job form: own transaction, the
caller's transaction (a rollback frees the key; a concurrent one waits, never fails),
async, ``Task.using``. Keys are validated; ``Job.unique_key`` shows them; ``requeue_dead``
of a job whose key is held again writes nothing and returns the holder's id."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import FakeClock, Target


def count(db: Target, table: str, queue: str) -> Any:
    return db.scalar(f"SELECT count(*) FROM {db.table(table)} WHERE queue = :q", q=queue)


def test_a_held_key_returns_the_live_job(store: alk.Store, db: Target, qname: str) -> None:
    q = store.queue(qname)
    first = q.enqueue({"v": 1}, unique_key="invoice-7")
    assert q.enqueue({"v": 2}, unique_key="invoice-7", priority=9, delay=60) == first
    job = q.get_job(first)
    assert job is not None and job.unique_key == "invoice-7"
    assert job.payload == {"v": 1} and job.priority == 0  # the duplicate wrote nothing
    assert count(db, "alkstore_jobs", qname) == 1

    other_key = q.enqueue({"v": 3}, unique_key="invoice-8")
    other_queue = store.queue(qname + "-b").enqueue({"v": 4}, unique_key="invoice-7")
    plain = [q.enqueue({"v": 5}), q.enqueue({"v": 5})]
    assert len({first, other_key, other_queue, *plain}) == 5  # keys are per queue; no key: no rule
    assert q.get_job(plain[0]).unique_key is None  # type: ignore[union-attr]


def test_a_processing_job_holds_its_key_until_acked(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue("x", unique_key="k")
    handle = q.claim_one("w")
    assert handle is not None and handle.id == job_id and handle.job.unique_key == "k"
    assert q.enqueue("y", unique_key="k") == job_id
    assert handle.ack()
    again = q.enqueue("z", unique_key="k")
    assert again != job_id and q.get_job(again).payload == "z"  # type: ignore[union-attr]


def test_cancel_frees_the_key(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue("x", unique_key="k")
    assert q.cancel(job_id)
    assert q.enqueue("y", unique_key="k") != job_id


@pytest.mark.parametrize("how", ["fail", "retry at budget", "expired", "lapsed at budget"])
def test_dead_frees_the_key_and_keeps_it_as_history(
    store: alk.Store, clock: FakeClock, qname: str, how: str
) -> None:
    q = store.queue(qname, max_attempts=1, visibility_timeout=10)
    job_id = q.enqueue("x", unique_key="k", expires=3600 if how == "expired" else None)
    if how == "expired":
        clock.advance(3600)
        assert q.sweep_expired().expired == 1
    else:
        handle = q.claim_one("w")
        assert handle is not None
        if how == "fail":
            assert handle.fail("boom")
        elif how == "retry at budget":
            assert handle.retry("boom")
        else:  # the lapsed claim has no attempt left: the next claim buries it
            clock.advance(11)
            assert q.claim_one("w") is None
    (dead,) = q.dead_jobs()
    assert dead.id == job_id and dead.state == "dead" and dead.unique_key == "k"
    fresh = q.enqueue("y", unique_key="k")
    assert fresh != job_id and q.get_job(fresh).state == "pending"  # type: ignore[union-attr]


def test_callers_transaction(dbstore: alk.Store, db: Target, qname: str) -> None:
    q = dbstore.queue(qname)
    with db.engine.connect() as conn:  # rolled back: the key was never held
        rolled = alk.enqueue(conn, q, "a", unique_key="k")
        assert alk.enqueue(conn, q, "b", unique_key="k") == rolled  # its own uncommitted job
        conn.rollback()
    assert q.get_job(rolled) is None
    with Session(db.engine) as session, session.begin():
        committed = alk.enqueue(session, qname, "c", unique_key="k")  # by name: default stamps
        assert alk.enqueue(session, q, "d", unique_key="k") == committed
    assert q.get_job(committed).payload == "c"  # type: ignore[union-attr]  # (SQLite may reuse a rolled-back id)
    assert q.enqueue("e", unique_key="k") == committed
    with db.engine.begin() as conn:
        assert alk.enqueue(conn, q, "f", unique_key="k") == committed  # held by a committed job
    assert count(db, "alkstore_jobs", qname) == 1


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_concurrent_callers_enqueue_waits_for_the_holder(db: Target, qname: str, outcome: str) -> None:
    """Two open transactions enqueue one key: the second waits for the first to end, then
    returns the first's job (commit) or its own (rollback) — it never fails."""
    store = db.store()
    q = store.queue(qname)
    result: dict[str, Any] = {}
    holder = db.engine.connect()
    try:
        first = alk.enqueue(holder, q, "first", unique_key="k")

        def second() -> None:
            try:
                with db.engine.begin() as conn:
                    result["id"] = alk.enqueue(conn, q, "second", unique_key="k")
            except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                result["error"] = exc

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not result  # it waits for the holder
        holder.commit() if outcome == "commit" else holder.rollback()
        thread.join(30)
        assert not thread.is_alive() and "error" not in result, result
    finally:
        holder.close()
    job = q.get_job(result["id"])
    assert job is not None and job.payload == ("first" if outcome == "commit" else "second")
    if outcome == "commit":
        assert result["id"] == first
    assert count(db, "alkstore_jobs", qname) == 1
    store.close()


@pytest.mark.parametrize(
    "bad", ["", "x" * 201, "a\x00b", 7, b"k", "\ud800"], ids=["empty", "long", "nul", "int", "bytes", "surrogate"]
)
def test_bad_keys_are_refused_before_any_write(store: alk.Store, db: Target, qname: str, bad: object) -> None:
    q = store.queue(qname)
    with pytest.raises(alk.InvalidOptions, match="unique_key"):
        q.enqueue("x", unique_key=bad)  # type: ignore[arg-type]
    with db.engine.begin() as conn, pytest.raises(alk.InvalidOptions, match="unique_key"):
        alk.enqueue(conn, q, "x", unique_key=bad)  # type: ignore[arg-type]
    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def job() -> None: ...

    with pytest.raises(alk.InvalidOptions, match="unique_key"):
        job.using(unique_key=bad)  # type: ignore[arg-type]
    assert count(db, "alkstore_jobs", qname) == 0
    longest = "é" * 200  # 200 characters (not bytes) is the limit
    assert q.get_job(q.enqueue("x", unique_key=longest)).unique_key == longest  # type: ignore[union-attr]


def test_task_using_unique_key(store: alk.Store, db: Target, qname: str) -> None:
    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def send(to: str) -> None: ...

    once = send.using(unique_key="mail-1")
    first = once.enqueue(store, "a@example.com")
    assert once.using(priority=3).enqueue(store, "b@example.com") == first  # using keeps the key
    with db.engine.begin() as conn:
        assert once.enqueue(conn, "c@example.com") == first
    assert send.enqueue(store, "d@example.com") != first  # the task itself has no key
    job = store.get_job(first)
    assert job is not None and job.unique_key == "mail-1" and job.payload["args"] == ["a@example.com"]


def _async_url(db: Target) -> str:
    return db.url.replace("sqlite:///", "sqlite+aiosqlite:///", 1) if db.kind == "sqlite" else db.url


def test_aenqueue_unique_key(db: Target, qname: str) -> None:
    store = db.store()

    async def scenario() -> tuple[int, int, int]:
        engine = create_async_engine(_async_url(db))
        store.register(engine)
        try:
            async with AsyncSession(engine) as session, session.begin():
                a = await alk.aenqueue(session, qname, "a", unique_key="k")
                b = await alk.aenqueue(session, qname, "b", unique_key="k")
            async with AsyncSession(engine) as session, session.begin():
                c = await alk.aenqueue(session, qname, "c", unique_key="k")
            return a, b, c
        finally:
            await engine.dispose()

    a, b, c = asyncio.run(scenario())
    assert a == b == c
    assert store.get_job(a).unique_key == "k"  # type: ignore[union-attr]
    store.close()


def test_requeue_dead_while_the_key_is_held(store: alk.Store, db: Target, qname: str) -> None:
    """The requeue is an enqueue with the dead job's key: while a live job holds it, nothing
    is written (the dead row stays) and the holder's id comes back; once the key is free the
    requeued job carries it."""
    q = store.queue(qname, max_attempts=1)
    dead_id = q.enqueue("old", unique_key="k")
    handle = q.claim_one("w")
    assert handle is not None and handle.fail("boom")
    holder = q.enqueue("new", unique_key="k")
    assert q.requeue_dead(dead_id) == holder
    assert [j.id for j in q.dead_jobs()] == [dead_id]
    assert count(db, "alkstore_jobs", qname) == 1
    assert q.cancel(holder)
    requeued = q.requeue_dead(dead_id)
    assert requeued not in (None, holder, dead_id)
    job = q.get_job(requeued)  # type: ignore[arg-type]
    assert job is not None and job.payload == "old" and job.unique_key == "k"
    assert q.dead_jobs() == [] and q.enqueue("again", unique_key="k") == requeued


def test_only_single_job_forms_take_a_key() -> None:
    """enqueue_many has no unique_key: a batch with duplicate keys has no single answer."""
    batch: tuple[Callable[..., Any], ...] = (alk.Queue.enqueue_many, alk.enqueue_many)
    single: tuple[Callable[..., Any], ...] = (alk.Queue.enqueue, alk.enqueue, alk.aenqueue, alk.Task.using)
    assert not [fn for fn in batch if "unique_key" in inspect.signature(fn).parameters]
    assert not [fn for fn in single if "unique_key" not in inspect.signature(fn).parameters]


def test_the_unique_index_is_partial(db: Target, qname: str) -> None:
    """Rows without a key never conflict (the index covers keyed rows only)."""
    sql = f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q AND unique_key IS NULL"
    store = db.store()
    store.queue(qname).enqueue_many(["x"] * 5)
    assert db.scalar(sql, q=qname) == 5
    with db.engine.connect() as conn:
        index = next(
            ix for ix in sa.inspect(conn).get_indexes("alkstore_jobs", schema=None if db.kind == "sqlite" else db.schema)
            if ix["name"] == "alkstore_jobs_unique_ix"
        )
    assert index["unique"] and index["column_names"] == ["queue", "unique_key"]
    store.close()
