"""The store's own statements run at READ COMMITTED whatever isolation level the
application's sessions default to (PostgreSQL only: a role's or database's ``SET
default_transaction_isolation``, or ``options=-c default_transaction_isolation=...`` in the
URL), and the application's connections keep their own level; likewise they read doubles
(every timestamp) with every digit whatever the session's ``extra_float_digits``."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import PG_URL, Target, wait_for


@pytest.mark.parametrize("level", ["serializable", "repeatable read"])
def test_a_handle_op_racing_a_row_update_lands_under_a_strict_session_default(
    pg_db: Target, qname: str, level: str
) -> None:
    """An ack waiting for a row another transaction updates lands once that one commits,
    as it does at READ COMMITTED — under a stricter session default it failed with
    'could not serialize access due to concurrent update' (DatabaseError), and a busy
    queue's claims and acks failed by the dozen the same way."""
    engine = sa.create_engine(
        PG_URL, pool_size=1, max_overflow=0,
        connect_args={"options": "-c default_transaction_isolation=" + level.replace(" ", "\\ ")},
    )
    store = alk.Store(engine, schema=pg_db.schema)
    try:
        q = store.queue(qname)
        job_id = q.enqueue("x")
        h = q.claim_one("w")
        assert h is not None and h.id == job_id
        result: list[object] = []
        with pg_db.engine.connect() as other:  # another session (READ COMMITTED) updates the row
            other.exec_driver_sql(
                f"UPDATE {pg_db.table('alkstore_jobs')} SET priority = priority WHERE id = %(id)s", {"id": job_id}
            )

            def ack() -> None:
                try:
                    result.append(h.ack())
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    result.append(exc)

            acker = threading.Thread(target=ack)
            acker.start()
            wait_for(
                lambda: pg_db.scalar("SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT granted"),
                "the ack to wait for the row lock",
            )
            other.commit()
            acker.join()
        assert result == [True]
        assert q.get_job(job_id) is None
        with Session(engine) as session:  # the pool's one connection keeps the app's level
            assert session.execute(sa.text("SHOW transaction_isolation")).scalar() == level
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("digits", ["0", "-15"])
def test_the_stores_timestamps_are_exact_whatever_the_sessions_extra_float_digits(
    pg_db: Target, qname: str, digits: str
) -> None:
    """Timestamps are epoch seconds in double columns, read back as text: a session default
    of ``extra_float_digits`` below 1 (PostgreSQL 11's default was 0; a role's or the URL's
    ``-c extra_float_digits=…``) rounds them to 15 + N significant digits — a clock
    reading's microseconds were lost at 0, and at -15 every timestamp read as 2e9 (years
    off) and a due schedule never fired. The store's own reads get every digit; the
    application's connection keeps its setting."""
    from datetime import datetime, timezone

    from alkstore_sa.scheduler import Scheduler
    from tests.support import FakeClock

    engine = sa.create_engine(
        PG_URL, pool_size=1, max_overflow=0, connect_args={"options": f"-c extra_float_digits={digits}"}
    )
    clock = FakeClock(1_800_000_000.873456)  # microseconds need 16 significant digits
    store = alk.Store(engine, schema=pg_db.schema, clock=clock)
    try:
        q = store.queue(qname)
        job = q.get_job(q.enqueue("x", delay=30))
        assert job is not None
        assert job.created_at == datetime.fromtimestamp(clock.now, timezone.utc)
        assert job.run_at == datetime.fromtimestamp(clock.now + 30, timezone.utc)
        store.schedule(qname, "@every 1h", qname + "-fired", {})
        clock.advance(3600)
        assert Scheduler(store).tick() == 1
        with Session(engine) as session:
            assert session.execute(sa.text("SHOW extra_float_digits")).scalar() == digits
    finally:
        store.close()
        engine.dispose()
