"""Live→dead moves are atomic: no failure at any point may leave a job in neither table or
in both (SPEC §5.7).

For every move path — ``fail()``, ``retry()`` at the attempt budget, the pre-claim move of
exhausted reclaimables inside ``claim_one``, and ``sweep_expired()`` — a trigger makes the
INSERT into dead storage fail. The operation must raise ``AlkstoreError`` (the driver's
error propagates; it is never turned into ``False`` or "no job"), and the job must still be
in live storage exactly once, byte-for-byte unchanged, and absent from dead storage. With
the trigger dropped, the same move then succeeds. ``requeue_dead`` is the mirror image: a
failing INSERT into live storage leaves the dead row where it was.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.support import FakeClock, Target, sqlite_target

TRIGGER = "alkstore_test_boom"
BOOM = "boom: injected failure"


@contextmanager
def failing_insert(db: Target, table: str, message: str = BOOM, action: str = "ABORT") -> Iterator[None]:
    """Every INSERT into ``table`` raises ``message`` until the block ends."""
    if db.kind == "postgresql":
        fn = f'"{db.schema}".{TRIGGER}'
        db.execute(
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$"
        )
        db.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {db.table(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {fn}()"
        )
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER {TRIGGER} ON {db.table(table)}")
            db.execute(f"DROP FUNCTION {fn}()")
    else:
        db.execute(
            f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {table} "
            f"BEGIN SELECT RAISE({action}, '{message}'); END"
        )
        try:
            yield
        finally:
            db.execute(f"DROP TRIGGER {TRIGGER}")


def live_rows(db: Target, job_id: int) -> list[dict[str, Any]]:
    with db.engine.connect() as c:
        rows = c.execute(
            sa.text(f"SELECT * FROM {db.table('alkstore_jobs')} WHERE id = :id"), {"id": job_id}
        )
        return [dict(r._mapping) for r in rows]


def dead_rows(db: Target, job_id: int) -> list[dict[str, Any]]:
    with db.engine.connect() as c:
        rows = c.execute(
            sa.text(f"SELECT * FROM {db.table('alkstore_dead_jobs')} WHERE id = :id"), {"id": job_id}
        )
        return [dict(r._mapping) for r in rows]


def queue_rows(db: Target, table: str, queue: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table(table)} WHERE queue = :q", q=queue))  # type: ignore[arg-type]


def assert_still_live_unchanged(db: Target, job_id: int, before: list[dict[str, Any]]) -> None:
    assert len(before) == 1
    after = live_rows(db, job_id)
    assert len(after) == 1, f"job {job_id} is in live storage {len(after)} times"
    assert after == before, "the failed move changed the live row"
    assert dead_rows(db, job_id) == [], f"job {job_id} is in BOTH live and dead storage"


def assert_moved(db: Target, job_id: int, last_error: str) -> dict[str, Any]:
    assert live_rows(db, job_id) == [], f"job {job_id} is still live after its move"
    dead = dead_rows(db, job_id)
    assert len(dead) == 1, f"job {job_id} is in dead storage {len(dead)} times"
    assert dead[0]["last_error"] == last_error
    return dead[0]


def assert_driver_error(exc: pytest.ExceptionInfo[alk.AlkstoreError], message: str = BOOM) -> None:
    assert isinstance(exc.value, alk.DatabaseError), type(exc.value)
    assert message in str(exc.value), f"the driver's error was replaced: {exc.value!r}"
    assert exc.value.__cause__ is not None


# -- fail ----------------------------------------------------------------------------------


def test_fail_that_cannot_insert_dead_leaves_the_job_live(
    db: Target, store: alk.Store, qname: str
) -> None:
    q = store.queue(qname)
    job_id = q.enqueue({"k": "fail"}, priority=3)
    h = q.claim_one("w1")
    assert h is not None and h.id == job_id
    before = live_rows(db, job_id)

    with failing_insert(db, "alkstore_dead_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        h.fail("broken")
    assert_driver_error(exc)
    assert_still_live_unchanged(db, job_id, before)
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.attempts == 1 and job.errors == []

    # the claim survived untouched, so a handle on it can still finish the move
    assert alk.JobHandle(q, h.job).fail("broken") is True
    dead = assert_moved(db, job_id, "broken")
    assert dead["payload"] == before[0]["payload"] and dead["attempts"] == 1
    assert [e["error"] for e in q.get_job(job_id).errors] == ["broken"]  # type: ignore[union-attr]


# -- retry at the attempt budget -----------------------------------------------------------


def test_retry_at_budget_that_cannot_insert_dead_leaves_the_job_live(
    db: Target, store: alk.Store, qname: str
) -> None:
    q = store.queue(qname, max_attempts=2)
    job_id = q.enqueue({"k": "retry"})
    h1 = q.claim_one("w1")
    assert h1 is not None and h1.retry("first", delay=0) is True
    h2 = q.claim_one("w2")
    assert h2 is not None and h2.id == job_id and h2.job.attempts == 2  # the last attempt
    before = live_rows(db, job_id)

    with failing_insert(db, "alkstore_dead_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        h2.retry("second")
    assert_driver_error(exc)
    assert_still_live_unchanged(db, job_id, before)
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.attempts == 2
    assert [e["error"] for e in job.errors] == ["first"]

    assert alk.JobHandle(q, h2.job).retry("second") is True
    assert_moved(db, job_id, "max attempts exceeded")
    assert [e["error"] for e in q.get_job(job_id).errors] == ["first", "second"]  # type: ignore[union-attr]


# -- the pre-claim move of exhausted reclaimables ------------------------------------------


def test_claim_that_cannot_bury_an_exhausted_job_raises_and_claims_nothing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    q = store.queue(qname, max_attempts=1, visibility_timeout=30)
    exhausted = q.enqueue({"k": "exhausted"}, priority=5)
    h = q.claim_one("w1")
    assert h is not None and h.id == exhausted
    clock.advance(31)  # its claim lapsed, and it has no attempt left
    waiting = q.enqueue({"k": "waiting"})  # claimable by the same claim
    before, before_waiting = live_rows(db, exhausted), live_rows(db, waiting)

    with failing_insert(db, "alkstore_dead_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        q.claim_one("w2")
    assert_driver_error(exc)
    assert_still_live_unchanged(db, exhausted, before)
    # all or nothing: the claim that rode with the failed move did not happen either
    assert live_rows(db, waiting) == before_waiting
    assert q.stats().processing == 1 and q.stats().dead == 0

    h2 = q.claim_one("w2")
    assert h2 is not None and h2.id == waiting and h2.job.attempts == 1
    dead = assert_moved(db, exhausted, "max attempts exceeded")
    assert dead["attempts"] == 1 and dead["payload"] == before[0]["payload"]


def test_claim_batch_that_cannot_bury_raises_too(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    q = store.queue(qname, max_attempts=1, visibility_timeout=30)
    ids = q.enqueue_many([1, 2, 3])
    assert len(q.claim_batch("w1", 3)) == 3
    clock.advance(31)
    before = {i: live_rows(db, i) for i in ids}
    with failing_insert(db, "alkstore_dead_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        q.claim_batch("w2", 10)
    assert_driver_error(exc)
    for i in ids:
        assert_still_live_unchanged(db, i, before[i])
    assert q.claim_batch("w2", 10) == []
    for i in ids:
        assert_moved(db, i, "max attempts exceeded")


# -- sweep_expired -------------------------------------------------------------------------


def test_sweep_that_cannot_insert_dead_moves_and_purges_nothing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    q = store.queue(qname, dead_letter_retention=60)
    # a dead row already past its retention: the sweep's purge must roll back with it
    old = q.enqueue("old")
    h = q.claim_one("w1")
    assert h is not None and h.fail("old") is True
    clock.advance(61)

    pending = q.enqueue({"k": "pending"}, expires=10)
    processing = q.enqueue({"k": "processing"}, expires=10, priority=1)
    h = q.claim_one("w1")
    assert h is not None and h.id == processing
    clock.advance(11)
    before = {i: live_rows(db, i) for i in (pending, processing)}
    old_before = dead_rows(db, old)
    assert len(old_before) == 1

    with failing_insert(db, "alkstore_dead_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        q.sweep_expired()
    assert_driver_error(exc)
    for i in (pending, processing):
        assert_still_live_unchanged(db, i, before[i])
    assert dead_rows(db, old) == old_before, "the sweep's purge was not rolled back"

    result = q.sweep_expired()
    assert (result.expired, result.purged) == (2, 1)
    for i in (pending, processing):
        assert_moved(db, i, "expired")
    assert dead_rows(db, old) == []


# -- requeue_dead: the mirror image ---------------------------------------------------------


def test_requeue_dead_that_cannot_insert_live_keeps_the_dead_row(
    db: Target, store: alk.Store, qname: str
) -> None:
    q = store.queue(qname)
    job_id = q.enqueue({"k": "requeue"}, priority=4)
    h = q.claim_one("w1")
    assert h is not None and h.fail("x") is True
    dead_before = dead_rows(db, job_id)
    assert len(dead_before) == 1

    with failing_insert(db, "alkstore_jobs"), pytest.raises(alk.AlkstoreError) as exc:
        q.requeue_dead(job_id)
    assert_driver_error(exc)
    assert dead_rows(db, job_id) == dead_before, "the dead row was lost or changed"
    assert queue_rows(db, "alkstore_jobs", qname) == 0

    new_id = q.requeue_dead(job_id)
    assert new_id is not None and new_id != job_id
    assert dead_rows(db, job_id) == []
    job = q.get_job(new_id)
    assert job is not None and job.state == "pending" and job.payload == {"k": "requeue"}
    assert job.priority == 4 and job.attempts == 0
    assert queue_rows(db, "alkstore_jobs", qname) == 1


# -- SQLite: a failure that ends the transaction by itself ----------------------------------


@pytest.mark.parametrize("action", ["ROLLBACK", "FAIL"])
def test_sqlite_failure_that_ends_the_transaction_still_surfaces_the_driver_error(
    tmp_path, clock: FakeClock, action: str
) -> None:
    """SQLite ends the whole transaction itself on some errors (RAISE(ROLLBACK), and e.g.
    SQLITE_FULL/IOERR/INTERRUPT); RAISE(FAIL) keeps the statement's earlier changes. Either
    way the move is undone and the error the caller sees is the database's, not a follow-up
    'cannot rollback' from the library's own cleanup. (SQLite only: PostgreSQL has no such
    RAISE actions.)"""
    db = sqlite_target(str(tmp_path))
    store = db.store(clock=clock)
    try:
        q = store.queue("moves", max_attempts=1, visibility_timeout=30)
        exhausted = q.enqueue("x")
        assert q.claim_one("w1") is not None
        clock.advance(31)
        before = live_rows(db, exhausted)

        with failing_insert(db, "alkstore_dead_jobs", action=action):
            with pytest.raises(alk.AlkstoreError) as exc:
                q.claim_one("w2")
            assert_driver_error(exc)
        assert_still_live_unchanged(db, exhausted, before)

        assert q.claim_one("w2") is None  # the store's connection is usable again
        assert_moved(db, exhausted, "max attempts exceeded")
    finally:
        store.close()
        db.engine.dispose()


# -- a failure at COMMIT time ----------------------------------------------------------------


def _sqlite_path(db: Target) -> str:
    return db.engine.url.database or ""


@contextmanager
def failing_commit(db: Target, table: str) -> Iterator[None]:
    """Every transaction that inserted into ``table`` fails at COMMIT (PostgreSQL: a
    deferred constraint trigger; SQLite: a deferred foreign-key violation planted by a
    trigger, which needs ``PRAGMA foreign_keys=ON`` on the store's connections)."""
    if db.kind == "postgresql":
        fn = f'"{db.schema}".{TRIGGER}'
        db.execute(
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{BOOM}'; END $$"
        )
        db.execute(
            f"CREATE CONSTRAINT TRIGGER {TRIGGER} AFTER INSERT ON {db.table(table)} "
            f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {fn}()"
        )
        try:
            yield
        finally:
            with db.engine.begin() as c:  # never wait forever behind a stuck transaction
                c.exec_driver_sql("SET LOCAL lock_timeout = '5s'")
                c.exec_driver_sql(f"DROP TRIGGER {TRIGGER} ON {db.table(table)}")
                c.exec_driver_sql(f"DROP FUNCTION {fn}()")
        return
    db.execute("CREATE TABLE alkstore_test_parent (id INTEGER PRIMARY KEY)")
    db.execute(
        "CREATE TABLE alkstore_test_child (parent INTEGER REFERENCES alkstore_test_parent (id)"
        " DEFERRABLE INITIALLY DEFERRED)"
    )
    db.execute(
        f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON {table} "
        "BEGIN INSERT INTO alkstore_test_child VALUES (-1); END"
    )
    try:
        yield
    finally:
        # a separate connection with a short timeout: if the store kept the failed
        # transaction open it holds the write lock, and this must fail, not hang
        other = sqlite3.connect(_sqlite_path(db), timeout=2, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute(f"DROP TRIGGER {TRIGGER}")
            other.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            pytest.fail(f"after a failed COMMIT another writer cannot get the write lock: {exc}")
        finally:
            other.close()


@pytest.mark.parametrize("path", ["fail", "claim"])
def test_move_whose_commit_fails_leaves_the_store_clean(
    db: Target, clock: FakeClock, qname: str, path: str
) -> None:
    """A COMMIT can fail too (deferred constraints; on SQLite also SQLITE_FULL, IOERR,
    BUSY). The move must be undone, the error raised, and the store's connection must not
    keep the failed transaction open: later operations must commit, and other writers
    must not be locked out."""
    if db.kind == "sqlite":
        sa.event.listen(db.engine, "connect", lambda c, _r: c.execute("PRAGMA foreign_keys = ON"))
    store = db.store(clock=clock)  # opened after the hook: its connections enforce FKs
    try:
        q = store.queue(qname, max_attempts=1, visibility_timeout=30)
        job_id = q.enqueue({"k": path})
        h = q.claim_one("w1")
        assert h is not None
        if path == "claim":
            clock.advance(31)
        before = live_rows(db, job_id)

        with failing_commit(db, "alkstore_dead_jobs"):
            with pytest.raises(alk.AlkstoreError) as exc:
                h.fail("broken") if path == "fail" else q.claim_one("w2")
            assert_driver_error(exc, "FOREIGN KEY" if db.kind == "sqlite" else BOOM)
            assert_still_live_unchanged(db, job_id, before)
            # the store's next write commits (it does not join a stale transaction)
            later = q.enqueue({"k": "later"}, delay=3600)
            assert len(live_rows(db, later)) == 1, "an enqueue after the failed COMMIT was lost"

        if path == "fail":
            assert alk.JobHandle(q, h.job).fail("broken") is True
            assert_moved(db, job_id, "broken")
        else:
            assert q.claim_one("w2") is None
            assert_moved(db, job_id, "max attempts exceeded")
    finally:
        store.close()
