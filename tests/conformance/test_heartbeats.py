"""The heartbeat roster against its two neighbours (docs/worker.md, "Heartbeats"): the write
of a job's own outcome, which a heartbeat on its way can race, and a database outage, which
is logged once for the whole worker rather than once per job per retry. The registry row's
refresh logs its outages the same way. Real databases, both engines."""

from __future__ import annotations

import logging
import math

import pytest

import alkstore_sa as alk
from alkstore_sa._validate import MAX_DURATION, MIN_LEASE
from alkstore_sa.worker.heartbeater import Heartbeater
from alkstore_sa.worker.registry import Registration
from tests.conformance.test_scheduler import FailingTrigger
from tests.support import FakeClock, Target


def _claimed(store: alk.Store, qname: str, n: int) -> list[alk.JobHandle]:
    q = store.queue(qname, visibility_timeout=30)
    q.enqueue_many(list(range(n)))
    handles = q.claim_batch("w", n)
    assert len(handles) == n
    return handles


def test_a_heartbeat_beaten_by_its_jobs_ack_is_no_lost_claim(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The ack writer takes the claim for writing; its ack lands while a heartbeat of the
    same claim is on its way (past the handle's consumed check). The heartbeat is refused —
    the row is gone — but the claim was not lost: no warning, and the job's outcome is
    recorded as acked (it was logged 'claim lost' and counted as lost)."""
    (h,) = _claimed(store, qname, 1)
    roster = Heartbeater()
    roster.add([h])
    key = h._claim
    in_flight = roster._roster[key]
    assert roster.settling(key)  # the writer's turn: from now on its outcome is written
    assert store.queue(qname).ack_batch([h.id]) == 1  # the ack lands first
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa"):
        roster._beat(in_flight)  # refused: the row is gone
    assert roster.lost(key) is False
    assert roster.settling(key) is True
    assert "claim lost" not in caplog.text


def test_a_claim_lost_before_its_outcome_is_not_written(
    store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The other order: a heartbeat refused because the claim lapsed marks it lost, and the
    writer that comes for it afterwards is told not to write its outcome."""
    (h,) = _claimed(store, qname, 1)
    roster = Heartbeater()
    roster.add([h])
    key = h._claim
    clock.advance(31)  # past the visibility timeout: the heartbeat comes too late
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        roster._beat(roster._roster[key])
    assert roster.lost(key) is True
    assert "claim lost" in caplog.text
    assert roster.settling(key) is False


@pytest.mark.parametrize(("stamp", "lease"), [(-100.0, MIN_LEASE), (0.0, MIN_LEASE), (math.inf, MAX_DURATION)])
def test_a_heartbeat_of_a_visibility_timeout_written_by_hand_extends_the_claims_lease(
    db: Target, store: alk.Store, qname: str, stamp: float, lease: float, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose visibility_timeout stamp was written by hand outside what the API takes:
    the worker's heartbeat extended its claim by the stamp, which ``heartbeat()`` refuses as
    bad input — logged as a database outage ("heartbeats of this worker's claims failed"),
    the claim never extended, and for a stamp of zero or less retried in a busy loop (its
    next beat due at once). A heartbeat extends the claim by the lease the claim took."""
    q = store.queue(qname)
    job_id = q.enqueue(1)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET visibility_timeout = :v WHERE id = :id", v=stamp, id=job_id)
    h = q.claim_one("w")
    assert h is not None
    roster = Heartbeater()
    roster.add([h])
    key = h._claim
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        roster._beat(roster._roster[key])
    assert [r.getMessage() for r in caplog.records if r.name.startswith("alkstore_sa")] == []
    assert roster.lost(key) is False
    job = q.get_job(job_id)
    assert job is not None and job.claim_expires_at is not None
    assert job.claim_expires_at.timestamp() - store.now() == pytest.approx(lease, abs=1e-5)


def test_failing_heartbeats_are_one_warning_per_outage(
    db: Target, store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    handles = _claimed(store, qname, 3)
    roster = Heartbeater()
    roster.add(handles)
    entries = list(roster._roster.values())
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa"):
        with FailingTrigger(db, "alkstore_jobs", "UPDATE", "queue", qname):
            for _ in range(4):  # every job, retried: twelve failures
                for entry in entries:
                    roster._beat(entry)
        for entry in entries:
            roster._beat(entry)  # the database is back
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "heartbeats of this worker's claims failed" in warnings[0] and "refused by the test trigger" in warnings[0]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "failed again" in r.getMessage()]
    assert len(debug) == 11
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "recovered" in infos[0] and "12 failed attempt(s)" in infos[0], infos
    assert not any(roster.lost(h._claim) for h in handles)


def test_a_failing_registry_refresh_is_one_warning_per_outage(
    db: Target, store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    registration = Registration(store, qname, [qname], 4, 60.0)
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa"):
        with FailingTrigger(db, "alkstore_workers", "INSERT", "id", qname):
            for _ in range(5):
                registration._refresh()
        registration._refresh()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"worker {qname}: registry refresh failed" in warnings[0], warnings
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "recovered" in infos[0] and "5 failed attempt(s)" in infos[0], infos
    assert [w.id for w in store.workers()] == [qname]
