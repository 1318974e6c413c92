"""SPEC §4 (issue 9 item 5): which store a by-name transactional call (``alk.enqueue(session,
"name", ...)``, ``alk.notify``, ``alk.publish``, ``alk.outbox_enqueue``, ``alk.get_job``)
uses. The registration belongs to the engine object: it survives ``engine.dispose()``,
``Engine.execution_options()`` copies and a replaced pool; ``close()`` removes only that
store's registration; two open stores that would write differently make the call raise
``InvalidOptions`` instead of silently picking one, and a ``Queue`` handle always writes to
its own store.

Which store served a call is read from the job's ``created_at``: each test store has its
own injected clock, and the defaults (no store) use the wall clock."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import FakeClock, Target, new_pg_schema, pg_target


def _created_at(store: alk.Store, job_id: int) -> float:
    job = store.get_job(job_id)
    assert job is not None, "the job is not in this store's tables"
    return job.created_at.timestamp()


def _enqueue_by_name(engine: sa.Engine, queue: str) -> int:
    with Session(engine) as session, session.begin():
        return alk.enqueue(session, queue, {"by": "name"})


def test_registration_survives_engine_dispose(store: alk.Store, clock: FakeClock, qname: str) -> None:
    store.engine.dispose()  # a new pool: the registration must not hang on the old one
    job_id = _enqueue_by_name(store.engine, qname)
    assert _created_at(store, job_id) == clock.now  # this store's clock, not the defaults


def test_registration_is_found_through_execution_options_copies(
    store: alk.Store, clock: FakeClock, qname: str
) -> None:
    copy = store.engine.execution_options(logging_token="copy")
    # (another option than logging_token: SQLAlchemy before 2.0.38, which pyproject admits,
    # cannot give a logging_token to a copy that has one: "No such event 'engine_connect'")
    copy_of_copy = copy.execution_options(alkstore_test="copy-of-copy")
    copy_of_copy.dispose()  # disposing a copy replaces the shared pool
    for engine in (copy, copy_of_copy):
        assert _created_at(store, _enqueue_by_name(engine, qname)) == clock.now


def test_closing_one_store_keeps_the_other_registration(db: Target, clock: FakeClock, qname: str) -> None:
    first = db.store(clock=clock)
    second = db.store(clock=clock)  # same schema and settings: either serves by-name calls
    try:
        second.close()
        job_id = _enqueue_by_name(db.engine, qname)
        assert _created_at(first, job_id) == clock.now  # still served by `first`, not the defaults
    finally:
        first.close()


def test_same_schema_different_settings_is_ambiguous(db: Target, clock: FakeClock, qname: str) -> None:
    first = db.store(clock=clock)
    other_clock = FakeClock(start=clock.now + 1000)
    second = db.store(clock=other_clock)
    try:
        with pytest.raises(alk.InvalidOptions, match="clock") as info:
            _enqueue_by_name(db.engine, qname)
        assert "Queue" in str(info.value)  # the cure: pass a Queue handle
        # a Queue handle picks its store explicitly
        with Session(db.engine) as session, session.begin():
            job_id = alk.enqueue(session, second.queue(qname), "explicit")
        assert _created_at(second, job_id) == other_clock.now
        second.close()  # the ambiguity ends with it
        assert _created_at(first, _enqueue_by_name(db.engine, qname)) == clock.now
    finally:
        first.close()
        second.close()


def test_stores_with_equal_settings_on_one_engine_are_not_ambiguous(db: Target, clock: FakeClock, qname: str) -> None:
    stores = [db.store(clock=clock, max_payload_bytes=4096) for _ in range(3)]
    try:
        for _ in range(2):
            assert _created_at(stores[0], _enqueue_by_name(db.engine, qname)) == clock.now
        with Session(db.engine) as session, session.begin(), pytest.raises(alk.PayloadError):
            alk.enqueue(session, qname, "x" * 5000)  # their shared limit applies
    finally:
        for s in stores:
            s.close()


def test_store_register_serves_another_engine_without_keeping_it_alive(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    other = sa.create_engine(db.url)
    store.register(other)
    assert _created_at(store, _enqueue_by_name(other, qname)) == clock.now
    other.dispose()
    assert _created_at(store, _enqueue_by_name(other, qname)) == clock.now  # survives dispose
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None, "a registration must not keep the app's engine alive"


# -- PostgreSQL: two schemas on one engine ---------------------------------------------------


@pytest.fixture
def second_schema(pg_db: Target) -> Any:
    """A second installed alkstore schema on the same PostgreSQL database (SQLite has no
    schemas: every store on a file shares its tables)."""
    target = pg_target(new_pg_schema("reg"))
    yield target.schema
    with target.engine.begin() as c:
        c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
    target.engine.dispose()


BY_NAME: dict[str, Callable[[Session, str], object]] = {
    "enqueue": lambda s, n: alk.enqueue(s, n, {"x": 1}),
    "enqueue_many": lambda s, n: alk.enqueue_many(s, n, [1, 2]),
    "get_job": lambda s, n: alk.get_job(s, n, 1),
    "notify": lambda s, n: alk.notify(s, n, "x"),
    "outbox_enqueue": lambda s, n: alk.outbox_enqueue(s, n, {"x": 1}),
    "publish": lambda s, n: alk.publish(s, n, {"x": 1}),
}


@pytest.mark.parametrize("call", sorted(BY_NAME))
def test_two_schemas_on_one_engine_make_by_name_calls_raise(
    pg_db: Target, second_schema: str, call: str, qname: str
) -> None:
    db = pg_db
    first = db.store()
    second = alk.Store(db.engine, schema=second_schema)
    try:
        with Session(db.engine) as session:
            with pytest.raises(alk.InvalidOptions) as info:
                BY_NAME[call](session, qname)
            message = str(info.value)
            assert db.schema in message and second_schema in message, message
            assert "Queue" in message, message  # names the cure
            session.rollback()
        assert first.queue(qname).stats().pending == second.queue(qname).stats().pending == 0
    finally:
        second.close()
        first.close()


def test_a_queue_handle_writes_to_its_own_schema(pg_db: Target, second_schema: str, qname: str) -> None:
    db = pg_db
    first = db.store()
    second = alk.Store(db.engine, schema=second_schema)
    try:
        with Session(db.engine) as session, session.begin():
            alk.enqueue(session, first.queue(qname), "first")
            alk.enqueue_many(session, second.queue(qname), ["second"])
        assert [h.payload for h in first.queue(qname).claim_batch("w", 10)] == ["first"]
        assert [h.payload for h in second.queue(qname).claim_batch("w", 10)] == ["second"]
        second.close()
        # one open store left: by-name calls are unambiguous again and go to its schema
        job_id = _enqueue_by_name(db.engine, qname)
        assert first.get_job(job_id) is not None
    finally:
        second.close()
        first.close()


def test_created_at_reference_is_the_injected_clock(store: alk.Store, clock: FakeClock, qname: str) -> None:
    """Guards the method the other tests rely on: the defaults would stamp the wall clock."""
    job_id = _enqueue_by_name(store.engine, qname)
    assert _created_at(store, job_id) == clock.now
    assert abs(datetime.now(timezone.utc).timestamp() - clock.now) > 3600
