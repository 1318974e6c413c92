"""SPEC §5.1–5.2: stamping, enqueue options, payload round trips, and the caller's transaction."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import alkstore_sa as alk
from tests.support import FakeClock, Target, engine_with_table


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str]


@pytest.fixture
def app_engine(db: Target):
    """The application's engine with its own table next to alkstore's (on PostgreSQL in the
    test's schema, so parallel runs never share it). It is an Engine.execution_options()
    copy: the store registered for db.engine must still be found through it."""
    yield from engine_with_table(db, Order.__table__)


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


def test_stamps_come_from_the_handle(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=30, max_attempts=7, backoff_base=2, dead_letter_retention=60)
    job = q.get_job(q.enqueue("x"))
    assert job is not None
    assert (job.visibility_timeout, job.max_attempts, job.backoff_base, job.dead_letter_retention) == (30, 7, 2, 60)
    assert job.state == "pending" and job.attempts == 0 and job.claimed_at is None
    assert job.created_at == job.run_at == _ts(clock)
    assert job.errors == [] and job.last_error is None and job.died_at is None


def test_defaults_and_timedelta_options(store: alk.Store, qname: str) -> None:
    job = store.queue(qname).get_job(store.queue(qname).enqueue(1))
    assert job is not None
    assert (job.visibility_timeout, job.max_attempts, job.backoff_base, job.dead_letter_retention) == (300, 3, 5, None)
    q = store.queue(qname, visibility_timeout=timedelta(minutes=2), backoff_base=timedelta(seconds=1.5))
    job = q.get_job(q.enqueue(1))
    assert job is not None and job.visibility_timeout == 120 and job.backoff_base == 1.5


def test_stamps_are_immutable_per_job(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """Changed opts apply to future enqueues only; claims read the job's own stamp."""
    first = store.queue(qname, visibility_timeout=10).enqueue("a")
    second = store.queue(qname, visibility_timeout=100).enqueue("b")
    q = store.queue(qname, visibility_timeout=1000)
    handles = {h.id: h for h in q.claim_batch("w", 2)}
    assert handles[first].job.claim_expires_at == _ts(clock, 10)
    assert handles[second].job.claim_expires_at == _ts(clock, 100)
    clock.advance(50)
    assert handles[first].heartbeat(5) is False  # its 10 s stamp lapsed, whatever q says
    assert handles[second].heartbeat(5) is True


def test_per_job_max_attempts_and_priority(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, max_attempts=3)
    job = q.get_job(q.enqueue(1, max_attempts=9, priority=-4))
    assert job is not None and job.max_attempts == 9 and job.priority == -4


def test_delay_wins_over_run_at(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    job = q.get_job(q.enqueue(1, delay=10, run_at=_ts(clock, 1000)))
    assert job is not None and job.run_at == _ts(clock, 10)
    job = q.get_job(q.enqueue(1, run_at=_ts(clock, 1000)))
    assert job is not None and job.run_at == _ts(clock, 1000)
    job = q.get_job(q.enqueue(1, delay=timedelta(seconds=3)))
    assert job is not None and job.run_at == _ts(clock, 3)


def test_run_at_in_another_timezone(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    tz = timezone(timedelta(hours=-5))
    job = q.get_job(q.enqueue(1, run_at=_ts(clock, 60).astimezone(tz)))
    assert job is not None and job.run_at == _ts(clock, 60) and job.run_at.tzinfo is not None


def test_expires_is_relative(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname)
    job = q.get_job(q.enqueue(1, expires=30, delay=5))
    assert job is not None and job.expires_at == _ts(clock, 30)


PAYLOADS = [
    None,
    True,
    0,
    -1.5,
    2**70,
    -(2**100),
    "plain",
    "nul \u0000 inside",
    "lone \ud800 surrogate",
    "unicode ✓ 漢字 🙂",
    [1, [2, [3]]],
    {"nested": {"list": [1, "two", None]}},
    "",
    {},
    [],
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: repr(p)[:30])
def test_payload_round_trips(store: alk.Store, qname: str, payload: object) -> None:
    q = store.queue(qname)
    job_id = q.enqueue(payload)
    job = q.get_job(job_id)
    assert job is not None and job.payload == payload and type(job.payload) is type(payload)
    h = q.claim_one("w")
    assert h is not None and h.payload == payload


def test_non_string_keys_become_strings(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job = q.get_job(q.enqueue({1: "a", None: "b", 2.5: "c"}))
    assert job is not None and job.payload == {"1": "a", "null": "b", "2.5": "c"}


def test_enqueue_many_in_payload_order(store: alk.Store, qname: str) -> None:
    q = store.queue(qname, max_attempts=4)
    payloads = [{"i": i} for i in range(250)]
    ids = q.enqueue_many(payloads, priority=2)
    assert len(ids) == 250 and ids == sorted(ids)
    for i in (0, 125, 249):
        job = q.get_job(ids[i])
        assert job is not None and job.payload == {"i": i} and job.priority == 2 and job.max_attempts == 4
    assert q.enqueue_many([]) == []
    assert [h.payload for h in q.claim_batch("w", 3)] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_session_commit_makes_job_and_row_visible(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    with Session(app_engine) as session, session.begin():
        session.add(Order(note="ok"))
        job_id = alk.enqueue(session, qname, {"order": 1})
        # not visible outside the transaction before commit
        assert store.queue(qname).stats().pending == 0
    q = store.queue(qname)
    assert q.stats().pending == 1
    assert q.get_job(job_id) is not None
    with Session(app_engine) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Order)) == 1


def test_session_rollback_leaves_no_trace(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    with pytest.raises(RuntimeError), Session(app_engine) as session, session.begin():
        session.add(Order(note="lost"))
        session.flush()
        job_id = alk.enqueue(session, qname, {"order": 2})
        ids = alk.enqueue_many(session, qname, [1, 2])
        raise RuntimeError("request failed")
    q = store.queue(qname)
    assert q.stats() == alk.QueueStats(0, 0, 0, 0, None)
    assert q.get_job(job_id) is None and all(q.get_job(i) is None for i in ids)
    assert q.claim_one("w") is None
    with Session(app_engine) as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(Order)) == 0


def test_enqueue_never_commits(db: Target, store: alk.Store, qname: str) -> None:
    with Session(db.engine) as session:
        alk.enqueue(session, qname, 1)
        session.rollback()
    assert store.queue(qname).stats().pending == 0


def test_scoped_session_and_connection_targets(db: Target, store: alk.Store, qname: str) -> None:
    scoped = scoped_session(sessionmaker(db.engine))
    a = alk.enqueue(scoped, qname, "scoped")
    scoped.commit()
    scoped.remove()
    with db.engine.connect() as conn:
        b = alk.enqueue(conn, qname, "conn")
        conn.commit()
    with db.engine.connect() as conn:
        alk.enqueue(conn, qname, "rolled back")
        conn.rollback()
    q = store.queue(qname)
    assert [h.id for h in q.claim_batch("w", 10)] == [a, b]


def test_transactional_enqueue_uses_registered_clock(app_engine: sa.Engine, store: alk.Store, qname: str, clock: FakeClock) -> None:
    """The session's bind finds the store: its clock stamps the job."""
    with Session(app_engine) as session, session.begin():
        job_id = alk.enqueue(session, qname, 1, delay=7)
    job = store.get_job(job_id)
    assert job is not None and job.created_at == _ts(clock) and job.run_at == _ts(clock, 7)


def test_transactional_enqueue_with_queue_handle_stamps(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=42, max_attempts=5)
    with Session(db.engine) as session, session.begin():
        job_id = alk.enqueue(session, q, 1)
        ids = alk.enqueue_many(session, q, [1, 2], max_attempts=6)
    job = q.get_job(job_id)
    assert job is not None and job.visibility_timeout == 42 and job.max_attempts == 5
    assert [q.get_job(i).max_attempts for i in ids] == [6, 6]  # type: ignore[union-attr]


def test_transactional_get_job_is_queue_filtered(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue("x")
    other = store.queue(qname + "-other").enqueue("y")
    with Session(db.engine) as session:
        job = alk.get_job(session, qname, job_id)
        assert job is not None and job.payload == "x"
        assert alk.get_job(session, qname, other) is None
        assert alk.get_job(session, qname, 10**12) is None
        # sees the caller's own uncommitted enqueue
        mine = alk.enqueue(session, qname, "mine")
        assert alk.get_job(session, qname, mine) is not None
        session.rollback()


def test_ids_are_never_reused(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    first = q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None and h.ack()
    second = q.enqueue(2)
    assert second > first
