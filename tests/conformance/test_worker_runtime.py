"""SPEC §11, the worker runtime's invariants on both engines (issue 9):

- a sync handler's result that is awaitable is never acked: the job is retried with an
  error saying why, and the awaitable never ran (an ``async def`` handler itself is
  awaited on the worker's loop: see test_tasks_worker.py);
- in-flight work is keyed by the claim (id + attempt): a job the same worker reclaimed
  while its earlier attempt's handler still ran keeps its heartbeats after that handler
  exits, and never runs a third time; a handler whose claim lapsed still holds its slot;
- an idle worker sleeps on rows no claim can take (expired, exhausted) instead of
  spinning on them;
- the claim loop's backoff is capped (no overflow) and an outage is logged once;
- a stop, and each job that goes dead through the worker, are logged.

Workers run in a thread of the test with the injected clock; every wait has a deadline."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import alkstore_sa as alk
from tests.conformance.test_worker import running
from tests.support import WAIT, FakeClock, Target, wait_for


def _messages(caplog: pytest.LogCaptureFixture, level: int, *words: str) -> list[logging.LogRecord]:
    return [
        rec for rec in caplog.records
        if rec.name == "alkstore_sa" and rec.levelno == level and all(w in rec.getMessage() for w in words)
    ]


def _count_claims(worker: alk.Worker) -> list[str]:
    """Wrap the worker's queue handle so every claim it runs is recorded ("ok" / "error")."""
    calls: list[str] = []
    claim = worker.queue.claim_batch

    def counted(worker_id: str, n: int) -> list[alk.JobHandle]:
        try:
            handles = claim(worker_id, n)
        except alk.AlkstoreError:
            calls.append("error")
            raise
        calls.append("ok")
        return handles

    worker.queue.claim_batch = counted  # type: ignore[method-assign]
    return calls


# -- item 1: an awaitable result is never acked -------------------------------------------------


class _Awaitable:
    def __await__(self) -> Iterator[None]:
        yield None


@pytest.mark.parametrize("kind", ["coroutine-of-async-def", "future", "dunder-await"])
def test_awaitable_handler_result_is_retried_never_acked(
    store: alk.Store, qname: str, kind: str, recwarn: pytest.WarningsRecorder
) -> None:
    q = store.queue(qname, max_attempts=3)
    job_id = q.enqueue({"n": 1})
    body_ran: list[int] = []
    called = threading.Event()
    loop = asyncio.new_event_loop()
    handler: Callable[[alk.Job], Any]

    if kind == "coroutine-of-async-def":
        async def handler(job: alk.Job) -> None:
            body_ran.append(job.id)

        def spy(job: alk.Job) -> Any:  # sync: hands back the coroutine, unawaited
            called.set()
            return handler(job)
    else:
        def spy(job: alk.Job) -> Any:
            called.set()
            return loop.create_future() if kind == "future" else _Awaitable()

    try:
        with running(alk.Worker(store, q, spy, concurrency=1, poll_interval=0.2)) as r:
            assert called.wait(WAIT)
            job = wait_for(
                lambda: (j := q.get_job(job_id)) is not None and j.state == "pending" and j.errors and j,
                "the job to be retried",
            )
            r.stop_and_join()
    finally:
        loop.close()
    assert job.attempts == 1  # not acked: the row is still there, back to pending
    error = job.errors[-1]["error"]
    assert "returned an awaitable" in error and "not an async def" in error, error
    assert body_ran == []
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


# -- item 2: in-flight work keyed by the claim ----------------------------------------------


class _Reclaim:
    """One job whose attempt-1 claim lapses (fake clock) while its handler blocks, so the
    same worker reclaims it as attempt 2; each attempt blocks on its own release event."""

    def __init__(self, store: alk.Store, qname: str, clock: FakeClock) -> None:
        self.clock = clock
        # vt = 1 s of real time between heartbeats / 3, but the fake clock never moves on its
        # own, so only clock.advance() can make a claim lapse.
        self.q = store.queue(qname, visibility_timeout=1.0)
        self.job_id = self.q.enqueue({"n": 1})
        self.attempts: list[int] = []
        self.release = {1: threading.Event(), 2: threading.Event(), 3: threading.Event()}

    def handler(self, job: alk.Job) -> None:
        if job.id != self.job_id:
            return
        self.attempts.append(job.attempts)
        self.release[min(job.attempts, 3)].wait(2 * WAIT)  # outlives any wait_for below

    def deadline(self) -> float:
        job = self.q.get_job(self.job_id)
        assert job is not None and job.claim_expires_at is not None
        return job.claim_expires_at.timestamp()

    def reclaim(self) -> None:
        wait_for(lambda: self.attempts == [1], "attempt 1 to start")
        self.clock.advance(2)  # attempt 1's claim lapses under its running handler
        wait_for(lambda: self.attempts == [1, 2], "the same worker to reclaim the job as attempt 2")

    def release_all(self) -> None:
        for ev in self.release.values():
            ev.set()


def test_reclaimed_attempt_keeps_its_heartbeats_after_the_old_handler_exits(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    job = _Reclaim(store, qname, clock)
    w = alk.Worker(store, job.q, job.handler, concurrency=2, poll_interval=0.2)
    try:
        with running(w) as r:
            job.reclaim()
            job.release[1].set()  # attempt 1's handler exits (its outcome is refused)
            for _ in range(4):
                # Each step moves the clock by half a visibility timeout: only a heartbeat of
                # attempt 2 after the step keeps its claim alive (deadline = now + 1).
                clock.advance(0.5)
                wait_for(
                    lambda: job.deadline() >= clock() + 1.0,
                    "attempt 2's claim to be heartbeated after attempt 1's handler exited",
                )
            assert job.attempts == [1, 2], "the job ran a third time"
            job.release[2].set()
            wait_for(lambda: job.q.get_job(job.job_id) is None, "attempt 2's ack")
            r.stop_and_join()
    finally:
        job.release_all()
    assert job.attempts == [1, 2]
    assert job.q.stats().dead == 0


def test_handler_whose_claim_lapsed_still_holds_its_slot(
    store: alk.Store, qname: str, clock: FakeClock
) -> None:
    """Two threads, both busy (attempt 1 with a lapsed claim, attempt 2): the worker claims
    nothing more until a handler actually returns."""
    job = _Reclaim(store, qname, clock)
    other: list[int] = []
    w = alk.Worker(
        store, job.q, lambda j: other.append(j.id) if j.id != job.job_id else job.handler(j),
        concurrency=2, poll_interval=0.2,
    )
    try:
        with running(w) as r:
            job.reclaim()
            waiting = job.q.enqueue({"n": 2})
            time.sleep(0.6)  # several claim-loop turns (poll 0.2 s) with both threads busy
            queued = job.q.get_job(waiting)
            assert queued is not None and queued.state == "pending" and queued.attempts == 0, (
                "the worker claimed a job with no free thread to run it"
            )
            job.release[1].set()  # attempt 1's handler returns: its thread is free again
            wait_for(lambda: other == [waiting], "the waiting job to run in the freed slot")
            job.release[2].set()
            wait_for(lambda: job.q.get_job(job.job_id) is None, "attempt 2's ack")
            r.stop_and_join()
    finally:
        job.release_all()
    assert job.attempts == [1, 2]


# -- item 10: no busy loop on rows a claim cannot take ---------------------------------------


@pytest.mark.parametrize(
    "row", ["expired-pending", "expired-lapsed", "exhausted-lapsed", "expired-exhausted-lapsed"]
)
def test_idle_worker_does_not_spin_on_rows_no_claim_takes(
    store: alk.Store, qname: str, clock: FakeClock, row: str
) -> None:
    q = store.queue(qname, visibility_timeout=10)
    if row == "expired-pending":
        job_id = q.enqueue({}, expires=5)
        clock.advance(6)  # expired, not swept: pending forever, never claimable
    else:
        job_id = q.enqueue(
            {}, expires=15 if "expired" in row else None, max_attempts=1 if "exhausted" in row else 3
        )
        h = q.claim_one("gone")  # a worker that died holding it
        assert h is not None and h.id == job_id
        clock.advance(16)  # the claim lapsed (at +10), and the row expired (+15) if asked
    ran: list[int] = []
    w = alk.Worker(store, q, lambda job: ran.append(job.id), concurrency=1, poll_interval=5)
    claims = _count_claims(w)
    with running(w) as r:
        wait_for(lambda: claims, "the first claim")
        time.sleep(1.5)
        r.stop_and_join()
    # one claim at start (an exhausted row goes dead in it), perhaps one after a wake; an
    # idle wait of ~1 ms would have run hundreds of write transactions in 1.5 s
    assert len(claims) <= 3, f"{len(claims)} claim transactions in 1.5 s with poll_interval=5"
    assert ran == []
    job = q.get_job(job_id)
    assert job is not None
    if row == "exhausted-lapsed":
        assert job.state == "dead" and job.last_error == "max attempts exceeded"
    else:
        assert job.state != "dead"  # left for sweep_expired


def test_next_due_counts_only_rows_a_claim_would_take(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=30)

    def next_due() -> float | None:
        with store.executor() as ex:
            return store.backend.next_due(ex, {"queue": qname, "now": store.now()})

    q.enqueue({}, expires=1, priority=9)  # the top priority, and it expires unclaimed
    q.enqueue({}, delay=50, expires=10)  # due only after it expired: never claimable
    clock.advance(2)
    assert next_due() is None
    doomed = q.enqueue({}, expires=20)
    h = q.claim_one("gone")  # claim deadline +30, but the row expires at +20: no reclaim
    assert h is not None and h.id == doomed
    assert next_due() is None
    live = q.enqueue({})
    h = q.claim_one("gone")
    assert h is not None and h.id == live
    assert next_due() == pytest.approx(30)  # a live claim's deadline counts
    q.enqueue({}, delay=7, priority=-3)  # a live delayed job behind them all
    assert next_due() == pytest.approx(7)
    clock.advance(8)
    assert next_due() == 0.0  # ready now: a claim would take it


def test_next_due_of_many_queues_is_each_queues_next_due(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """``next_due_many`` (a worker's queues that went idle in one round; PostgreSQL: one
    statement) gives every queue what ``next_due`` gives it, in each state that counts."""
    names = {k: f"{qname}-{k}" for k in ("empty", "expiring", "delayed", "lapse", "ready", "mixed")}
    store.queue(names["expiring"]).enqueue({}, delay=50, expires=10)  # never claimable: None
    store.queue(names["delayed"]).enqueue({}, delay=7, priority=-3)
    store.queue(names["delayed"]).enqueue({}, delay=12, priority=4)
    lapse = store.queue(names["lapse"], visibility_timeout=30)
    lapse.enqueue({})
    assert lapse.claim_one("gone") is not None
    store.queue(names["ready"]).enqueue({})
    mixed = store.queue(names["mixed"], visibility_timeout=20)
    mixed.enqueue({}, delay=25)
    mixed.enqueue({})
    assert mixed.claim_one("gone") is not None
    clock.advance(1)
    with store.executor() as ex:
        now = store.now()
        each = {k: store.backend.next_due(ex, {"queue": n, "now": now}) for k, n in names.items()}
        many = store.backend.next_due_many(ex, {"queues": list(names.values()), "now": now})
    assert each == {
        "empty": None, "expiring": None, "delayed": pytest.approx(6), "lapse": pytest.approx(29),
        "ready": 0.0, "mixed": pytest.approx(19),
    }
    assert many == {names[k]: v for k, v in each.items()}


# -- item 13: capped claim backoff, one log line per outage ---------------------------------


def test_claim_backoff_is_capped_and_never_overflows() -> None:
    from alkstore_sa.worker.claimer import claim_backoff

    delays = [claim_backoff(n, 5.0) for n in range(0, 2_000)]
    assert delays[0] > 0 and all(0 < d <= 5.0 for d in delays)
    assert delays == sorted(delays)  # never shrinks while an outage lasts
    assert claim_backoff(10_000, 5.0) == 5.0
    assert claim_backoff(10**9, 3600.0) <= 3600.0


@contextmanager
def _claims_refused(db: Target, qname: str) -> Iterator[None]:
    """A trigger that makes every UPDATE of this queue's jobs (so every claim that finds a
    job) fail inside the database, until the block ends."""
    lit = qname.replace("'", "''")
    name = "alk_test_refuse_claims"
    if db.kind == "sqlite":
        db.execute(
            f"CREATE TRIGGER {name} BEFORE UPDATE ON {db.table('alkstore_jobs')} "
            f"WHEN NEW.queue = '{lit}' BEGIN SELECT RAISE(ABORT, 'claims refused by the test'); END"
        )
        drop = [f"DROP TRIGGER {name}"]
    else:
        fn = f'"{db.schema}".{name}'
        db.execute(
            f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
            "$body$ BEGIN RAISE EXCEPTION 'claims refused by the test'; END $body$"
        )
        db.execute(
            f"CREATE TRIGGER {name} BEFORE UPDATE ON {db.table('alkstore_jobs')} "
            f"FOR EACH ROW WHEN (NEW.queue = '{lit}') EXECUTE FUNCTION {fn}()"
        )
        drop = [f"DROP TRIGGER {name} ON {db.table('alkstore_jobs')}", f"DROP FUNCTION {fn}()"]
    try:
        yield
    finally:
        for sql in drop:
            db.execute(sql)


def test_claim_outage_is_survived_and_logged_once(
    db: Target, store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    q = store.queue(qname)
    handled = threading.Event()
    w = alk.Worker(store, q, lambda job: handled.set(), concurrency=1, poll_interval=0.3)
    claims = _count_claims(w)
    with running(w) as r:
        wait_for(lambda: claims, "the first claim")
        with _claims_refused(db, qname):
            job_id = q.enqueue({"n": 1})
            wait_for(lambda: claims.count("error") >= 4, "several failed claims")
        assert handled.wait(WAIT), "the worker did not recover after the outage"
        wait_for(lambda: q.get_job(job_id) is None, "the ack")
        r.stop_and_join()
    assert len(_messages(caplog, logging.WARNING, "claim", qname, "failed")) == 1
    recovered = _messages(caplog, logging.INFO, "claim", qname, "again")
    assert len(recovered) == 1, [rec.getMessage() for rec in caplog.records]


# -- item 21: stop and dead jobs are logged --------------------------------------------------


def test_stop_is_logged_with_the_in_flight_count(store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    q = store.queue(qname)
    q.enqueue({"n": 1})
    started, release = threading.Event(), threading.Event()

    def handler(job: alk.Job) -> None:
        started.set()
        release.wait(WAIT)

    w = alk.Worker(store, q, handler, concurrency=2, poll_interval=0.2, shutdown_grace=12.5)
    with running(w) as r:
        assert started.wait(WAIT)
        r.stop.stop()
        wait_for(lambda: _messages(caplog, logging.INFO, "stop requested"), "the stop line")
        release.set()
        r.stop_and_join()
    (line,) = _messages(caplog, logging.INFO, "stop requested")
    assert "finishing 1 in-flight job(s)" in line.getMessage() and "12.5s" in line.getMessage()


def test_each_job_that_goes_dead_is_logged_once(
    store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    q = store.queue(qname, max_attempts=3)
    failed = q.enqueue({"do": "fail"})
    exhausted = q.enqueue({"do": "raise"}, max_attempts=1)
    retried = q.enqueue({"do": "raise"})  # attempts left: retried, not dead

    def handler(job: alk.Job) -> None:
        if job.payload["do"] == "fail":
            raise alk.Fail("no such user: 42")
        raise RuntimeError("disk full: /var/spool")

    def settled() -> bool:
        jobs = [q.get_job(i) for i in (failed, exhausted, retried)]
        return all(j is not None and j.state != "processing" and j.attempts == 1 for j in jobs)

    w = alk.Worker(store, q, handler, concurrency=3, poll_interval=0.2)
    with running(w) as r:
        wait_for(settled, "every job handled once")
        r.stop_and_join()

    dead = _messages(caplog, logging.WARNING, "dead")
    by_job = {getattr(rec, "job_id", None): rec for rec in dead}
    assert sorted(by_job) == sorted([failed, exhausted]) and len(dead) == 2, [d.getMessage() for d in dead]
    for job_id, last_error, error in [
        (failed, "no such user: 42", "no such user: 42"),
        (exhausted, "max attempts exceeded", "disk full: /var/spool"),
    ]:
        rec = by_job[job_id]
        text = rec.getMessage()
        assert qname in text and str(job_id) in text and last_error in text and error in text, text
        assert "1/" in text  # attempts used / budget
        assert rec.queue == qname and rec.attempt == 1  # type: ignore[attr-defined]


# -- alk.current_job() inside a worker's handler -----------------------------------------------


def test_current_job_is_the_job_being_handled(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    ids = q.enqueue_many([{"n": 1}, {"n": 2}])
    seen: dict[int, int | None] = {}

    def handler(job: alk.Job) -> None:
        current = alk.current_job()
        seen[job.id] = None if current is None else current.id

    with running(alk.Worker(store, q, handler, concurrency=2)) as r:
        wait_for(lambda: len(seen) == 2, "both jobs handled")
        r.stop_and_join()
    assert seen == {i: i for i in ids}
    assert alk.current_job() is None  # nothing leaks out of the handler's context


# -- each job of a claim gets a thread of its own, wherever the claim ran ------------------------


def test_every_job_of_a_claim_starts_at_once_on_its_own_thread(store: alk.Store, qname: str) -> None:
    """The runner hands a claim's jobs out in a chain (one thread woken at a time), and slots
    freed by finishing jobs are claimed for on the thread that freed them: still, every job
    of a claim must start without waiting for another to finish. Eight jobs, four slots:
    each job waits on a barrier of four, which only passes while four run at the same time.
    The first four start the threads; the second four are claimed by the thread that wrote
    the first four's acks and must wake the three threads asleep by then, not just one."""
    q = store.queue(qname)
    together = threading.Barrier(4, timeout=WAIT)  # cyclic: one pass per four jobs
    ran: list[tuple[int, str]] = []
    lock = threading.Lock()

    def handler(job: alk.Job) -> None:
        together.wait()  # raises BrokenBarrierError (a retry) unless four run at once
        with lock:
            ran.append((job.attempts, threading.current_thread().name))

    q.enqueue_many([{"n": i} for i in range(8)])
    w = alk.Worker(store, q, handler, concurrency=4, batch_size=4, poll_interval=0.2)
    with running(w) as r:
        wait_for(lambda: len(ran) == 8 or together.broken, "all eight jobs")
        r.stop_and_join()
    assert not together.broken
    assert [attempt for attempt, _ in ran] == [1] * 8  # no job ran twice
    assert len({name for _, name in ran[4:]}) == 4  # the second four on four threads
    assert q.stats().pending == 0 and q.stats().processing == 0


def test_a_long_job_does_not_hold_up_the_jobs_claimed_with_it_on_a_worker_thread(store: alk.Store, qname: str) -> None:
    """A claim made on a worker thread wakes no other thread at first: that thread runs the
    claimed jobs itself, and the runner's watcher wakes another for a job still queued
    after its next tick. The first job of the second claim blocks until the rest of that
    claim ran; they must run meanwhile, on other threads."""
    q = store.queue(qname)
    rest_ran = threading.Event()
    order: list[int] = []
    lock = threading.Lock()

    def handler(job: alk.Job) -> None:
        n = job.payload["n"]
        if n == 4 and not rest_ran.wait(WAIT):  # the second claim's first job
            raise AssertionError("the jobs claimed with a blocked one never ran")
        with lock:
            order.append(n)
            if {5, 6, 7} <= set(order):
                rest_ran.set()

    q.enqueue_many([{"n": i} for i in range(8)])
    w = alk.Worker(store, q, handler, concurrency=4, batch_size=4, poll_interval=0.2)
    with running(w) as r:
        wait_for(lambda: len(order) == 8, "all eight jobs")
        r.stop_and_join()
    assert sorted(order) == list(range(8)) and order.index(4) > max(order.index(n) for n in (5, 6, 7))
    assert q.stats().pending == 0 and q.stats().processing == 0


def test_the_runners_watcher_stops_ticking_once_the_worker_is_idle(store: alk.Store, qname: str) -> None:
    """The watcher ticks only while jobs claimed on worker threads come: an idle worker costs
    no wake-ups."""
    q = store.queue(qname)
    done = threading.Semaphore(0)
    q.enqueue_many([{"n": i} for i in range(200)])
    w = alk.Worker(store, q, lambda job: done.release(), concurrency=4, batch_size=4, poll_interval=0.2)
    with running(w) as r:
        for _ in range(200):
            assert done.acquire(timeout=WAIT)
        wait_for(lambda: q.stats().processing == 0, "the last acks")
        runner = w._runner
        assert runner is not None and runner.ticks > 0  # claims on worker threads were watched
        time.sleep(0.2)  # a hundred ticks, were it still ticking
        before = runner.ticks
        time.sleep(0.3)
        assert runner.ticks == before
        r.stop_and_join()


@pytest.mark.parametrize("kind", ["worker", "relay"])
def test_closing_the_store_under_a_running_worker_ends_run_with_store_closed(
    db: Target, qname: str, kind: str
) -> None:
    """A worker (or an outbox relay) whose store is closed while it runs: no claim can work
    again, so run() ends with StoreClosed (SPEC §3) after its usual drain, instead of
    retrying its claims with backoff for as long as its stop token is not set."""
    store = db.store()
    ran = threading.Event()
    outcome: list[BaseException | str] = []
    stop = alk.StopToken()

    def target() -> None:
        try:
            if kind == "worker":
                store.queue(qname).enqueue({"n": 1})
                alk.Worker(store, qname, lambda job: ran.set(), poll_interval=0.2).run(stop)
            else:
                ob = store.outbox(qname)
                ob.enqueue({"n": 1})
                ob.relay(lambda payload: ran.set(), stop, poll_interval=0.2)
            outcome.append("returned")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        assert ran.wait(WAIT)
        store.close()
        thread.join(WAIT)
        assert not thread.is_alive(), f"the {kind} kept running on a closed store"
        assert len(outcome) == 1 and isinstance(outcome[0], alk.StoreClosed), outcome
    finally:
        stop.stop()
        thread.join(WAIT)


def test_a_second_run_of_a_running_worker_is_refused(store: alk.Store, qname: str) -> None:
    """A run keeps its heartbeat roster, runner and claimer on the Worker: a second run()
    of the same Worker in another thread replaced them under the first, whose outcomes
    then went to the second run's roster (a lost claim no longer noticed) and whose
    heartbeat thread was never stopped — left running after both runs returned. One
    Worker runs once at a time (sequential runs are fine); the second run() raises
    InvalidOptions before it claims or starts anything."""
    q = store.queue(qname)
    worker = alk.Worker(store, q, lambda job: None, poll_interval=0.2)
    before = {t for t in threading.enumerate() if t.name == "alkstore-heartbeat"}
    with running(worker) as r:
        wait_for(lambda: worker._runner is not None, "the first run to start")
        stopped = alk.StopToken()
        stopped.stop()  # so that, were it not refused, the second run would return at once
        with pytest.raises(alk.InvalidOptions, match="already running"):
            worker.run(stopped)
        job_id = q.enqueue({"n": 1})
        wait_for(lambda: q.get_job(job_id) is None, "the first run to ack a job")
        r.stop_and_join()
    job_id = q.enqueue({"n": 2})
    worker.run(burst=True)  # a run after the first one ended is fine
    assert q.get_job(job_id) is None
    wait_for(
        lambda: not {t for t in threading.enumerate() if t.name == "alkstore-heartbeat"} - before,
        "no heartbeat thread left running",
    )
