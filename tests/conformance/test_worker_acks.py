"""The worker's batched acks (alkstore_sa/worker/acker.py), on both engines: the acks of jobs
that finish together are written as one statement, each still fenced by its own job's
claim, so a claim that lapsed is not acked while the rest of its batch is; outcome counts
stay exact; a graceful stop writes every pending ack.

Statements are counted at the backend (each backend operation is one statement here:
``ack`` for a single ack, ``ack_claims`` for a batch), wrapping the store's own backend
object while the real database runs them. ``MAX_DELAY`` is raised where a test needs its
batches to be exactly "full, or every job in flight waiting" rather than timed.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.worker import acker, observe
from tests.support import WAIT, FakeClock, Target


class Statements:
    """Calls of the store backend's single ``ack`` and batch ``ack_claims``, with what each
    batch asked for and what landed."""

    def __init__(self, store: alk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.single = 0
        self.batches: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []
        backend = store.backend
        ack, ack_claims = backend.ack, backend.ack_claims

        def counted_ack(ex: Any, params: Any) -> bool:
            self.single += 1
            return ack(ex, params)

        def counted_ack_claims(ex: Any, params: Any) -> list[tuple[int, int]]:
            landed = ack_claims(ex, params)
            self.batches.append((list(zip(params["ids"], params["attempts"], strict=True)), landed))
            return landed

        monkeypatch.setattr(backend, "ack", counted_ack)
        monkeypatch.setattr(backend, "ack_claims", counted_ack_claims)


class Outcomes:
    """The worker's metrics hook, counting how outcomes landed."""

    def __init__(self) -> None:
        self.landed: Counter[str] = Counter()
        self._lock = threading.Lock()

    def started(self, claim: alk.JobHandle) -> None:
        pass

    def finished(self, claim: alk.JobHandle, outcome: str, duration: float | None) -> None:
        with self._lock:
            self.landed[outcome] += 1


@pytest.fixture
def outcomes() -> Iterator[Outcomes]:
    hook = Outcomes()
    previous = observe.install(hook)
    yield hook
    observe.install(previous)


def _burst(worker: alk.Worker) -> None:
    thread = threading.Thread(target=worker.run, kwargs={"burst": True}, daemon=True)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive(), "the burst run did not end"


def _left(db: Target, queue: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=queue))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_jobs_finishing_together_are_acked_in_one_statement(
    db: Target, qname: str, kind: str, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)  # written when full / everyone waits, never by time
    store = db.store()
    statements = Statements(store, monkeypatch)
    tasks = alk.Tasks()
    ran: list[int] = []
    seen: list[int | None] = []

    if kind == "sync":
        @tasks.task(queue=qname, name="noop")
        def noop(i: int) -> None:
            job = alk.current_job()
            seen.append(None if job is None else job.id)
            ran.append(i)
    else:
        @tasks.task(queue=qname, name="noop")
        async def noop(i: int) -> None:
            job = alk.current_job()
            seen.append(None if job is None else job.id)
            ran.append(i)

    ids = [noop.enqueue(store, i) for i in range(24)]
    worker = alk.Worker(store, tasks, concurrency=8)
    _burst(worker)

    assert sorted(ran) == list(range(24))
    assert sorted(seen) == sorted(ids)  # alk.current_job() is each job's own
    assert statements.single == 0
    # 24 jobs, 8 slots: three claims of 8, each batch acked by one statement
    assert [len(asked) for asked, _ in statements.batches] == [8, 8, 8]
    assert all(sorted(asked) == sorted(landed) for asked, landed in statements.batches)
    assert worker.processed == 24 and outcomes.landed == Counter({observe.ACKED: 24})
    assert _left(db, qname) == 0
    store.close()


def test_jobs_of_several_queues_finishing_together_are_acked_in_one_statement(
    db: Target, qname: str, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    """The batch is not split by queue: the claim fences each row on its own."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    store = db.store()
    statements = Statements(store, monkeypatch)
    tasks = alk.Tasks()
    queues = [f"{qname}-{k}" for k in range(4)]
    ran: list[int] = []
    together = threading.Barrier(8, timeout=WAIT)  # every job in flight before any finishes

    def noop(i: int) -> None:
        together.wait()
        ran.append(i)

    per_queue = [tasks.task(queue=q, name=f"noop-{k}")(noop) for k, q in enumerate(queues)]
    ids = [per_queue[i % 4].enqueue(store, i) for i in range(8)]
    worker = alk.Worker(store, tasks, concurrency=8, queues=queues)
    _burst(worker)

    assert sorted(ran) == list(range(8))
    assert statements.single == 0
    asked = [a for a, _ in statements.batches]
    assert sorted(c for a in asked for c in a) == sorted((i, 1) for i in ids)
    # all eight in flight, then all waiting for their acks: one batch of four queues
    assert len(statements.batches) == 1
    assert sorted(statements.batches[0][1]) == sorted((i, 1) for i in ids)
    assert outcomes.landed == Counter({observe.ACKED: 8})
    assert all(_left(db, q) == 0 for q in queues)
    store.close()


def test_a_queue_acks_only_its_own_claims(db: Target, qname: str) -> None:
    """``Queue._ack_claims`` (and so ``ack_batch`` of handles) is fenced by its queue as
    well: a handle of another queue is consumed there but its job stays claimed."""
    store = db.store()
    mine, other = store.queue(qname), store.queue(qname + "-other")
    mine.enqueue("a")
    other.enqueue("b")
    h_mine, h_other = mine.claim_one("w"), other.claim_one("w")
    assert h_mine is not None and h_other is not None
    landed = mine._ack_claims([h_mine, h_other])
    assert landed == {(h_mine.id, 1)}
    job = other.get_job(h_other.id)
    assert job is not None and job.state == "processing"
    store.close()


def test_a_lapsed_claim_is_not_acked_while_the_rest_of_its_batch_is(
    db: Target, qname: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    store = db.store(clock=clock)
    statements = Statements(store, monkeypatch)
    tasks = alk.Tasks()
    attempts: list[int] = []

    @tasks.task(queue=qname, name="noop", visibility_timeout=1000)
    def noop(i: int) -> None:
        pass

    @tasks.task(queue=qname, name="lapses", visibility_timeout=30)
    def lapses() -> None:
        job = alk.current_job()
        assert job is not None
        attempts.append(job.attempts)
        if job.attempts == 1:
            clock.advance(60)  # this claim's deadline passes; the others' (1000 s) do not

    lapsing = lapses.enqueue(store)
    others = [noop.enqueue(store, i) for i in range(7)]
    worker = alk.Worker(store, tasks, concurrency=8)
    _burst(worker)

    first_asked, first_landed = statements.batches[0]
    assert sorted(first_asked) == sorted([(lapsing, 1)] + [(i, 1) for i in others])
    assert sorted(first_landed) == sorted((i, 1) for i in others)  # all but the lapsed claim
    # the lapsed job was claimed again (attempt 2) and acked then
    assert attempts == [1, 2]
    assert statements.batches[1] == ([(lapsing, 2)], [(lapsing, 2)])
    assert statements.single == 0
    assert outcomes.landed == Counter({observe.ACKED: 8, observe.LOST: 1})
    assert worker.processed == 9
    assert _left(db, qname) == 0
    store.close()


def test_the_batch_ack_is_fenced_by_each_claim(db: Target, qname: str, clock: FakeClock) -> None:
    """``Queue._ack_claims``: a handle whose job was reclaimed acks nothing, not even the
    new claim's row; the others in the statement land."""
    store = db.store(clock=clock)
    q = store.queue(qname)
    short = store.queue(qname, visibility_timeout=10).enqueue({"n": 0})
    long_ids = [store.queue(qname, visibility_timeout=100).enqueue({"n": i}) for i in (1, 2)]
    first = {h.id: h for h in q.claim_batch("w1", 3)}
    clock.advance(20)
    again = q.claim_one("w2")
    assert again is not None and again.id == short and again.job.attempts == 2

    landed = q._ack_claims(list(first.values()))

    assert landed == {(i, 1) for i in long_ids}
    assert all(h.consumed for h in first.values())
    job = q.get_job(short)
    assert job is not None and job.state == "processing" and job.attempts == 2
    assert again.ack() is True  # the new claim is untouched
    assert _left(db, qname) == 0
    store.close()


def test_a_graceful_stop_writes_the_pending_acks(
    db: Target, qname: str, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    """Acks waiting for a slow job's (never written by time here) are written when the
    grace period ends, before ``run()`` returns; the slow job's claim is left to lapse."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    store = db.store()
    statements = Statements(store, monkeypatch)
    tasks = alk.Tasks()
    gate = threading.Event()
    quick_done = threading.Semaphore(0)

    @tasks.task(queue=qname, name="slow")
    def slow() -> None:
        gate.wait(2 * WAIT)

    @tasks.task(queue=qname, name="quick")
    def quick(i: int) -> None:
        quick_done.release()

    slow_id = slow.enqueue(store)
    quick_ids = [quick.enqueue(store, i) for i in range(3)]
    stop = alk.StopToken()
    worker = alk.Worker(store, tasks, concurrency=8, shutdown_grace=0.3)
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in quick_ids:
            assert quick_done.acquire(timeout=WAIT)
        # the slow job holds a slot, so the three acks wait (by time only after 60 s)
        assert statements.batches == [] and outcomes.landed == Counter()
        assert _live(db, qname) == sorted([slow_id, *quick_ids])
        stop.stop()
        thread.join(WAIT)
        assert not thread.is_alive()
        assert [sorted(asked) for asked, _ in statements.batches] == [sorted((i, 1) for i in quick_ids)]
        assert outcomes.landed == Counter({observe.ACKED: 3})
        assert _live(db, qname) == [slow_id]
    finally:
        gate.set()
        store.close()


def _live(db: Target, queue: str) -> list[int]:
    with db.engine.connect() as c:
        rows = c.execute(sa.text(f"SELECT id FROM {db.table('alkstore_jobs')} WHERE queue = :q ORDER BY id"), {"q": queue})
        return [r[0] for r in rows]


def test_an_ack_waiting_for_a_running_job_is_written_by_time_after_a_batch_went_out(
    db: Target, qname: str, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    """The ack writer only wakes for an ack due before it would wake anyway: after a batch a
    runner thread wrote (slowly, so the writer waited on that write), a later lone ack —
    its job's slot-mate still running — is still written by time, not when that job ends."""
    monkeypatch.setattr(acker, "MAX_DELAY", 0.05)
    store = db.store()
    backend = store.backend
    ack_claims = backend.ack_claims

    def slow_first_write(ex: Any, params: Any) -> list[tuple[int, int]]:
        if not statements.batches:  # the writer wakes (MAX_DELAY) while this one is written
            threading.Event().wait(0.5)
        return ack_claims(ex, params)

    monkeypatch.setattr(backend, "ack_claims", slow_first_write)
    statements = Statements(store, monkeypatch)  # counts around the slowed write
    tasks = alk.Tasks()
    gate, slow_started = threading.Event(), threading.Event()

    @tasks.task(queue=qname, name="quick")
    def quick(i: int) -> None:
        pass

    @tasks.task(queue=qname, name="slow")
    def slow() -> None:
        slow_started.set()
        gate.wait(2 * WAIT)

    first = [quick.enqueue(store, i) for i in range(2)]
    stop = alk.StopToken()
    worker = alk.Worker(store, tasks, concurrency=2)
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _until(lambda: outcomes.landed[observe.ACKED] == 2)
        assert [sorted(asked) for asked, _ in statements.batches] == [sorted((i, 1) for i in first)]
        slow_id = slow.enqueue(store)
        assert slow_started.wait(WAIT)
        lone = quick.enqueue(store, 2)
        _until(lambda: outcomes.landed[observe.ACKED] == 3)  # while the slow job still runs
        assert not gate.is_set() and _live(db, qname) == [slow_id]
        assert statements.batches[-1][0] == [(lone, 1)]
    finally:
        gate.set()
        stop.stop()
        thread.join(WAIT)
        store.close()
    assert not thread.is_alive()


def _until(done: Any) -> None:
    deadline = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if done():
            return
        deadline.wait(0.01)
    raise AssertionError("not done in time")
