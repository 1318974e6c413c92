"""SPEC §11: the worker runtime on both engines — handler outcome mapping, automatic
heartbeats, never acking a lost claim, graceful stop (and what happens past the grace
period), structured logging, and two worker processes draining one queue exactly once.

Workers run in a thread of the test (or in spawned processes for the drain); every wait
has a deadline so a bug fails the test instead of hanging it."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.concurrency import harness, wake_workers, workers
from tests.support import WAIT, FakeClock, Target, wait_for


class Running:
    """A worker running in a background thread; ``run()`` errors are re-raised on exit."""

    def __init__(self, worker: alk.Worker) -> None:
        self.worker = worker
        self.stop = alk.StopToken()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run(self.stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def stop_and_join(self, timeout: float = WAIT) -> None:
        self.stop.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"worker.run() did not return within {timeout}s of stop"
        if self.error is not None:
            raise self.error


@contextmanager
def running(worker: alk.Worker) -> Iterator[Running]:
    r = Running(worker)
    r.thread.start()
    try:
        yield r
    finally:
        if r.thread.is_alive() or r.error is not None:
            r.stop_and_join()


def _ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


# -- construction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"handler": "not callable"},
        {"concurrency": 0},
        {"concurrency": True},
        {"batch_size": 0},
        {"poll_interval": 0},
        {"poll_interval": float("nan")},
        {"poll_interval": 1e-9},  # under a millisecond: a busy loop of claims
        {"poll_interval": 0.0009},
        {"registry_interval": 0},
        {"registry_interval": 1e-9},  # under a millisecond: a busy loop of registry writes
        {"shutdown_grace": -1},
        {"worker_id": ""},
    ],
    ids=lambda kw: next(iter(kw)) + "=" + repr(next(iter(kw.values()))),
)
def test_bad_worker_options_are_refused(store: alk.Store, qname: str, kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {"handler": lambda job: None, **kw}
    handler = args.pop("handler")
    with pytest.raises(alk.InvalidOptions):
        alk.Worker(store, qname, handler, **args)


def test_burst_runs_leave_nothing_behind_on_a_long_lived_stop_token(store: alk.Store, qname: str) -> None:
    """A script that runs a burst per batch with its one StopToken: each run registers its
    wake-up on the token and must take it back when it ends."""
    stop = alk.StopToken()
    done: list[Any] = []
    worker = alk.Worker(store, qname, lambda job: done.append(job.payload), poll_interval=0.05)
    for i in range(5):
        store.queue(qname).enqueue(i)
        worker.run(stop, burst=True)
    assert done == [0, 1, 2, 3, 4]
    assert not stop._callbacks  # noqa: SLF001 - what a long-lived token holds on to


def test_run_on_an_uninstalled_database_raises_not_installed(tmp_path: Path) -> None:
    store = alk.Store(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        w = alk.Worker(store, "q", lambda job: None)
        with pytest.raises(alk.NotInstalled, match="alkstore migrate"):
            w.run(alk.StopToken())
    finally:
        store.close()


# -- outcome mapping ---------------------------------------------------------------------------


class Boom(Exception):
    pass


def _outcome_handler(calls: Counter[int]) -> Callable[[alk.Job], None]:
    def handler(job: alk.Job) -> None:
        calls[job.id] += 1
        do = job.payload["do"]
        if do == "return":
            return
        if do == "raise":
            raise Boom("disk full: /var/spool")
        if do == "fail":
            raise alk.Fail("bad input: no such user")
        if do == "fail-bare":
            raise alk.Fail()
        if do == "retry":
            raise alk.Retry(delay=42)
        if do == "retry-error":
            raise alk.Retry(delay=7, error="upstream busy")
        raise AssertionError(do)

    return handler


def test_handler_outcomes_map_to_queue_operations(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    q = store.queue(qname, backoff_base=10, max_attempts=3)
    kinds = ["return", "raise", "fail", "fail-bare", "retry", "retry-error"]
    ids = {kind: q.enqueue({"do": kind}) for kind in kinds}
    last_raise = q.enqueue({"do": "raise"}, max_attempts=1)
    last_retry = q.enqueue({"do": "retry"}, max_attempts=1)
    now = clock.now  # the fake clock never moves here: retried jobs are not due again
    calls: Counter[int] = Counter()
    w = alk.Worker(store, q, _outcome_handler(calls), concurrency=3, poll_interval=0.2)

    def settled() -> bool:
        return all(
            (j := q.get_job(i)) is None or j.state != "processing" and j.attempts == 1
            for i in [*ids.values(), last_raise, last_retry]
        ) and len(calls) == len(ids) + 2

    with running(w) as r:
        wait_for(settled, "every job to be handled and its outcome recorded")
        time.sleep(0.3)  # a few more idle loops: nothing is handled twice
        r.stop_and_join()

    assert all(n == 1 for n in calls.values()), calls

    # return → ack: the row is gone
    assert q.get_job(ids["return"]) is None

    # exception → retry on the curve, str(exc) in errors
    job = q.get_job(ids["raise"])
    assert job is not None and job.state == "pending" and job.attempts == 1
    assert job.errors == [{"attempt": 1, "error": "disk full: /var/spool", "at": _ts(now)}]
    delay = job.run_at.timestamp() - now
    assert delay in {5.0, 6.0, 7.0, 8.0, 9.0, 10.0}, delay  # equal jitter over [c/2, c], c = 10

    # Fail(msg) → dead now, with the message
    job = q.get_job(ids["fail"])
    assert job is not None and job.state == "dead"
    assert job.last_error == "bad input: no such user"
    assert job.errors[-1]["error"] == "bad input: no such user"
    assert [j.id for j in q.dead_jobs()].count(ids["fail"]) == 1
    job = q.get_job(ids["fail-bare"])
    assert job is not None and job.state == "dead" and job.last_error == "failed"

    # Retry(delay=...) → pending after exactly that delay
    job = q.get_job(ids["retry"])
    assert job is not None and job.state == "pending" and job.attempts == 1
    assert job.run_at == _ts(now + 42)
    assert job.errors[-1]["attempt"] == 1 and job.errors[-1]["error"]
    job = q.get_job(ids["retry-error"])
    assert job is not None and job.state == "pending" and job.run_at == _ts(now + 7)
    assert job.errors[-1]["error"] == "upstream busy"

    # at the attempt budget both retries bury as "max attempts exceeded", error kept
    for job_id, error in [(last_raise, "disk full: /var/spool"), (last_retry, None)]:
        job = q.get_job(job_id)
        assert job is not None and job.state == "dead", job
        assert job.last_error == "max attempts exceeded"
        if error:
            assert job.errors[-1]["error"] == error

    # structured logging: the handler's exception is logged with the job's context
    raised = [
        rec for rec in caplog.records
        if rec.name == "alkstore_sa" and getattr(rec, "job_id", None) == ids["raise"]
        and rec.levelno == logging.WARNING
    ]
    assert raised, "no warning for the job whose handler raised"
    assert raised[0].queue == qname and raised[0].attempt == 1  # type: ignore[attr-defined]
    assert raised[0].worker_id == w.worker_id  # type: ignore[attr-defined]
    assert raised[0].exc_info is not None and raised[0].exc_info[0] is Boom
    messages = [rec.getMessage() for rec in caplog.records if rec.name == "alkstore_sa"]
    assert any("started" in m and qname in m for m in messages), messages
    assert any("stopped" in m for m in messages), messages


def test_empty_exception_message_still_records_an_error(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue({})
    done = threading.Event()

    def handler(job: alk.Job) -> None:
        done.set()
        raise KeyError()

    with running(alk.Worker(store, q, handler, concurrency=1)) as r:
        wait_for(lambda: (j := q.get_job(job_id)) is not None and j.state == "pending" and j.errors, "the retry")
        r.stop_and_join()
    job = q.get_job(job_id)
    assert job is not None and job.errors[-1]["error"]  # never an empty error text


# -- heartbeats ----------------------------------------------------------------------------------


@pytest.mark.parametrize("visibility", [2.0])
def test_long_handler_is_kept_alive_by_auto_heartbeat(dbstore: alk.Store, qname: str, visibility: float) -> None:
    """A handler that runs for several visibility timeouts (database clock) is heartbeated:
    nobody can reclaim the job meanwhile, and it is acked exactly once, as attempt 1.
    (A beat comes every third of the timeout, so the claim survives a heartbeat held up by
    two thirds of it: 1.33 s here. With 0.5 s it lapsed once under the suite's full load on
    SQLite, where the beat waits for the write lock behind the rival's claims, and 0.67 s
    still lapsed whenever a beat was held up 0.8 s.)"""
    q = dbstore.queue(qname, visibility_timeout=visibility)
    job_id = q.enqueue({"slow": True})
    attempts: list[int] = []
    started, finished = threading.Event(), threading.Event()

    def handler(job: alk.Job) -> None:
        attempts.append(job.attempts)
        started.set()
        time.sleep(visibility * 2.6)
        finished.set()

    stolen: list[int] = []
    w = alk.Worker(dbstore, q, handler, concurrency=1, poll_interval=0.2)
    with running(w) as r:
        assert started.wait(WAIT)
        while not finished.is_set():  # a rival consumer keeps trying to take the job
            h = q.claim_one("rival")
            if h is not None:
                stolen.append(h.job.attempts)
            time.sleep(0.05)
        assert stolen == [], (
            f"the claim lapsed under a running handler: a rival reclaimed the job (as attempts "
            f"{stolen}) — the automatic heartbeat came too late for visibility_timeout={visibility}"
        )
        wait_for(lambda: q.get_job(job_id) is None, "the ack")
        r.stop_and_join()
    assert attempts == [1]
    assert q.stats().dead == 0


# -- a lost claim is never acked -------------------------------------------------------------


def test_worker_does_not_ack_a_claim_it_lost(dbstore: alk.Store, qname: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    q = dbstore.queue(qname, visibility_timeout=1.0)
    job_id = q.enqueue({"n": 1})
    started, release = threading.Event(), threading.Event()

    def handler(job: alk.Job) -> None:
        started.set()
        release.wait(WAIT)

    def logged(word: str) -> list[str]:
        return [
            rec.getMessage() for rec in caplog.records
            if rec.name == "alkstore_sa" and str(job_id) in rec.getMessage() and word in rec.getMessage()
        ]

    w = alk.Worker(dbstore, q, handler, concurrency=1, poll_interval=0.2)
    with running(w) as r:
        assert started.wait(WAIT)
        assert q.cancel(job_id) is True  # the claim is gone under the running handler
        wait_for(lambda: logged("claim lost"), "the heartbeat to notice the lost claim")
        release.set()
        wait_for(lambda: logged("not ack"), "the worker to give the job up")
        r.stop_and_join()
    acked = [
        rec for rec in caplog.records
        if rec.name == "alkstore_sa" and rec.levelno == logging.DEBUG and rec.getMessage() == f"job {job_id}: ack"
    ]
    assert acked == []
    assert q.get_job(job_id) is None and q.stats().dead == 0


def test_late_outcome_of_a_reclaimed_job_is_refused(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim lapses (fake clock) and a rival reclaims the job while the handler still
    runs: the first handler's return must not ack the rival's claim."""
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    q = store.queue(qname, visibility_timeout=60)
    job_id = q.enqueue({"n": 1})
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    def handler(job: alk.Job) -> None:
        started.set()
        release.wait(WAIT)
        returned.set()

    w = alk.Worker(store, q, handler, concurrency=1, poll_interval=0.2)
    with running(w) as r:
        assert started.wait(WAIT)
        clock.advance(61)  # lapsed: heartbeats (every 20 s of real time) never came
        rival = q.claim_one("rival")
        assert rival is not None and rival.id == job_id and rival.job.attempts == 2
        release.set()
        assert returned.wait(WAIT)
        wait_for(lambda: any(f"job {job_id}: ack refused" in rec.getMessage() for rec in caplog.records), "the worker to report its refused ack")
        r.stop_and_join()
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.worker_id == "rival" and job.attempts == 2
    assert rival.ack() is True


# -- graceful stop -----------------------------------------------------------------------------


def test_stop_finishes_in_flight_jobs_and_claims_no_more(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    q = store.queue(qname)
    ids = q.enqueue_many([{"n": i} for i in range(6)])
    started: list[int] = []
    finished: list[int] = []
    release = threading.Event()

    def handler(job: alk.Job) -> None:
        started.append(job.id)
        release.wait(WAIT)
        time.sleep(0.05)
        finished.append(job.id)

    w = alk.Worker(store, q, handler, concurrency=3, poll_interval=0.2, shutdown_grace=WAIT)
    with running(w) as r:
        wait_for(lambda: len(started) == 3, "three jobs in flight")
        r.stop.stop()
        r.thread.join(0.5)
        assert r.thread.is_alive(), "run() returned while its jobs were still running"
        release.set()
        r.stop_and_join()
    assert sorted(finished) == sorted(started) == ids[:3]
    for job_id in ids[:3]:
        assert q.get_job(job_id) is None  # finished and acked before run() returned
    for job_id in ids[3:]:
        job = q.get_job(job_id)
        assert job is not None and job.state == "pending" and job.attempts == 0  # never claimed
    assert not any("grace period" in rec.getMessage() for rec in caplog.records)


def test_after_the_grace_period_the_claim_is_left_to_lapse(
    store: alk.Store, qname: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    q = store.queue(qname, visibility_timeout=120)
    job_id = q.enqueue({"stuck": True})
    started, release = threading.Event(), threading.Event()

    def handler(job: alk.Job) -> None:
        started.set()
        release.wait(WAIT)

    w = alk.Worker(store, q, handler, concurrency=1, poll_interval=0.2, shutdown_grace=0.3)
    try:
        with running(w) as r:
            assert started.wait(WAIT)
            r.stop_and_join(timeout=5)  # returns after the grace period, handler still stuck
        assert not release.is_set()
        job = q.get_job(job_id)
        assert job is not None and job.state == "processing" and job.worker_id == w.worker_id
        assert any("grace period" in rec.getMessage() for rec in caplog.records)

        assert q.claim_one("next") is None  # not released early: the claim must lapse first
        clock.advance(120)
        nxt = q.claim_one("next")
        assert nxt is not None and nxt.id == job_id and nxt.job.attempts == 2
    finally:
        release.set()
    time.sleep(0.2)  # the abandoned handler returns; its late outcome must not land
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.worker_id == "next"
    assert nxt.ack() is True


# -- wake inside one process ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["queue", "session"])
def test_in_process_enqueue_wakes_an_idle_worker(db: Target, dbstore: alk.Store, qname: str, how: str) -> None:
    q = dbstore.queue(qname)
    handled = threading.Event()
    w = alk.Worker(dbstore, q, lambda job: handled.set(), concurrency=1, poll_interval=3600)
    with running(w) as r:
        time.sleep(0.3)  # idle: the first claim found nothing; the next poll is an hour away
        if how == "queue":
            q.enqueue({"n": 1})
        else:
            with Session(db.engine) as session:
                alk.enqueue(session, qname, {"n": 1})
                session.commit()
        assert handled.wait(5), "the idle worker was not woken by the enqueue"
        wait_for(lambda: q.stats().processing == 0 and q.stats().pending == 0, "the ack")
        r.stop_and_join()


def test_delayed_job_is_run_when_due_without_a_wake(dbstore: alk.Store, qname: str) -> None:
    """A delayed job sends no wake at its due time: the worker sleeps until next_due."""
    q = dbstore.queue(qname)
    handled = threading.Event()
    w = alk.Worker(dbstore, q, lambda job: handled.set(), concurrency=1, poll_interval=3600)
    with running(w) as r:
        time.sleep(0.2)
        q.enqueue({"n": 1}, delay=0.5)
        assert handled.wait(5), "a delayed job was not run once due (poll interval is an hour)"
        r.stop_and_join()


# -- two worker processes × concurrency 4 drain 2,000 jobs exactly once -----------------------


@pytest.mark.slow
def test_two_worker_processes_drain_exactly_once(db: Target, dbstore: alk.Store, qname: str, tmp_path: Path) -> None:
    jobs = 2_000
    table = db.table("done_" + hashlib.sha1(qname.encode()).hexdigest()[:10])
    db.execute(f"CREATE TABLE {table} (job_id BIGINT NOT NULL, worker TEXT NOT NULL, attempt INTEGER NOT NULL)")
    try:
        q = dbstore.queue(qname)
        enqueued = q.enqueue_many([{"i": i} for i in range(jobs)])
        ready = workers.ready_dir(tmp_path)  # the workers start claiming together once running
        specs = [
            {
                "url": db.url, "schema": db.schema, "queue": qname, "table": table,
                "name": f"w{i}", "concurrency": 4, "max_seconds": 90, "ready_dir": ready, "parties": 2,
            }
            for i in range(2)
        ]
        results = harness.run(wake_workers.drain_worker, specs, tmp_path, timeout=120)
        with db.engine.connect() as c:
            rows = c.execute(sa.text(f"SELECT job_id, worker, attempt FROM {table}")).all()
    finally:
        db.execute(f"DROP TABLE {table}")

    per_job = Counter(r[0] for r in rows)
    twice = {j: n for j, n in per_job.items() if n > 1}
    assert not twice, f"handled more than once: {dict(list(twice.items())[:10])}"
    assert set(per_job) == set(enqueued), f"lost: {sorted(set(enqueued) - set(per_job))[:10]}"
    assert {r[2] for r in rows} == {1}
    by_worker = Counter(r[1] for r in rows)
    assert set(by_worker) == {r["worker"] for r in results}, by_worker  # both took part
    assert sum(r["handled"] for r in results) == jobs
    assert sum(r["processed"] for r in results) == jobs
    stats = q.stats()
    assert (stats.pending, stats.processing, stats.dead) == (0, 0, 0)
