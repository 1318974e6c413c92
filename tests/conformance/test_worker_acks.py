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

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import queue as queue_mod
from alkstore_sa.worker import acker, observe
from tests.support import WAIT, FakeClock, Target, sqlite_target


class Statements:
    """Calls of the store backend's single ``ack`` and batch ``ack_claims`` (on its own, or
    riding with a claim: ``ack_and_claim_turns``), with what each batch asked for and what
    landed."""

    def __init__(self, store: alk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.single = 0
        self.batches: list[tuple[list[tuple[int, int]], list[tuple[int, int]]]] = []
        self.rides = 0  # of the batches, those written with a claim
        self._riding = threading.local()  # a ride's own ack_claims call is counted once, as the ride
        backend = store.backend
        ack, ack_claims, ride = backend.ack, backend.ack_claims, backend.ack_and_claim_turns

        def counted_ack(ex: Any, params: Any) -> bool:
            self.single += 1
            return ack(ex, params)

        def counted_ack_claims(ex: Any, params: Any) -> list[tuple[int, int]]:
            landed = ack_claims(ex, params)
            if not getattr(self._riding, "on", False):
                self._count(params, landed)
            return landed

        def counted_ride(ex: Any, acks: Any, turns: Any, budget: int) -> Any:
            self._riding.on = True
            try:
                landed, taken = ride(ex, acks, turns, budget)
            finally:
                self._riding.on = False
            self._count(acks, landed)
            self.rides += 1
            return landed, taken

        monkeypatch.setattr(backend, "ack", counted_ack)
        monkeypatch.setattr(backend, "ack_claims", counted_ack_claims)
        monkeypatch.setattr(backend, "ack_and_claim_turns", counted_ride)

    def _count(self, params: Any, landed: list[tuple[int, int]]) -> None:
        self.batches.append((list(zip(params["ids"], params["attempts"], strict=True)), landed))


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


# -- SQLite: a batch of acks rides in the transaction of the claim that follows it --------


class WriteTransactions:
    """The store's SQLite statements, as its connections run them (sqlite3's trace
    callback): each write transaction — an explicit BEGIN IMMEDIATE ... COMMIT, or one
    autocommit write — with what it held (``ack``: the worker's batch ack, ``claim``)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.done: list[list[str]] = []  # committed
        self.rolled_back: list[list[str]] = []
        self._open: dict[int, list[str]] = {}
        self._lock = threading.Lock()
        sa.event.listen(engine, "connect", self._connected)

    def _connected(self, dbapi_conn: Any, _record: Any) -> None:
        key = id(dbapi_conn)
        dbapi_conn.set_trace_callback(lambda sql: self._traced(key, sql))

    def _traced(self, key: int, sql: str) -> None:
        head = sql.lstrip().upper()
        kind = None
        if head.startswith("DELETE FROM MAIN.ALKSTORE_JOBS WHERE MAIN.ALKSTORE_JOBS.ID IN"):
            kind = "ack"
        elif " UPDATE MAIN.ALKSTORE_JOBS SET STATE='PROCESSING'" in head:
            kind = "claim"
        with self._lock:
            if head.startswith("BEGIN"):
                self._open[key] = []
            elif head.startswith(("COMMIT", "ROLLBACK")):
                held = self._open.pop(key, [])
                (self.done if head.startswith("COMMIT") else self.rolled_back).append(held)
            elif kind is not None:
                if key in self._open:
                    self._open[key].append(kind)
                else:
                    self.done.append([kind])  # autocommit: a transaction of its own


def _sqlite_store(tmp_path: Any) -> tuple[Target, alk.Store, WriteTransactions]:
    target = sqlite_target(str(tmp_path))
    engine = sa.create_engine(target.url)  # fresh, so every connection the store opens is traced
    writes = WriteTransactions(engine)
    return target, alk.Store(engine), writes


def test_sqlite_acks_ride_in_the_next_claims_transaction(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    """On SQLite each batch of acks is written in the BEGIN IMMEDIATE transaction of the
    claim for the slots it frees: one writer-lock hold and one commit per batch, not two."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)  # written when every job in flight waits
    _target, store, writes = _sqlite_store(tmp_path)
    tasks = alk.Tasks()
    ran: list[int] = []
    together = threading.Barrier(4, timeout=WAIT)  # each claim's four jobs finish together

    @tasks.task(queue="rides", name="noop")
    def noop(i: int) -> None:
        together.wait()
        ran.append(i)

    for i in range(40):
        noop.enqueue(store, i)
    writes.done.clear()  # the enqueues
    _burst(alk.Worker(store, tasks, concurrency=4))

    assert sorted(ran) == list(range(40))
    assert outcomes.landed == Counter({observe.ACKED: 40})
    acks = [t for t in writes.done if "ack" in t]
    assert len(acks) == 10  # ten batches of four
    # each rode with a claim; the first may not have, if it came while the claimer's own
    # thread was still in its first round (a ride never waits for a round)
    assert all(t == ["ack", "claim"] for t in acks[1:]), acks
    assert acks[0] in (["ack"], ["ack", "claim"]), acks
    # besides the rides only claims on their own: the first one, the one after a first
    # batch that did not ride, and burst's last look with nothing in flight (acks on their
    # own would make 21 write transactions)
    alone = [t for t in writes.done if t and t != ["ack", "claim"]]
    assert alone.count(["claim"]) == len(alone) - (acks[0] == ["ack"]) <= 3, writes.done
    assert len([t for t in writes.done if t]) <= 13, writes.done
    store.close()


def test_sqlite_acks_whose_claim_fails_are_written_on_their_own(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim the acks ride with fails (a trigger refuses claims for a while): its
    transaction rolls back, the acks are written on their own, the queue backs off, and once
    claims work again the rest run — every job once, every ack landed."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    target, store, writes = _sqlite_store(tmp_path)
    with target.engine.begin() as c:
        c.execute(sa.text("CREATE TABLE refuse_claims (on_ INTEGER NOT NULL)"))
        c.execute(sa.text("INSERT INTO refuse_claims VALUES (0)"))
        c.execute(sa.text(
            "CREATE TRIGGER refuse BEFORE UPDATE OF state ON alkstore_jobs "
            "WHEN NEW.state = 'processing' AND (SELECT on_ FROM refuse_claims) = 1 "
            "BEGIN SELECT RAISE(ABORT, 'claims refused'); END"
        ))

    def refuse(on: bool) -> None:
        with target.engine.begin() as c:
            c.execute(sa.text("UPDATE refuse_claims SET on_ = :on"), {"on": int(on)})

    tasks = alk.Tasks()
    ran: list[int] = []
    together = threading.Barrier(4, timeout=WAIT)
    refused = threading.Event()

    @tasks.task(queue="refused", name="noop")
    def noop(i: int) -> None:
        # one job of the first batch refuses claims from now on, before its own ack (the
        # last one its batch waits for) comes
        if together.wait() == 0 and not refused.is_set():
            refuse(True)
            refused.set()
        ran.append(i)

    for i in range(8):
        noop.enqueue(store, i)
    stop = alk.StopToken()
    worker = alk.Worker(store, tasks, concurrency=4, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _until(lambda: outcomes.landed[observe.ACKED] == 4)  # the first batch's acks landed
        _until(lambda: "claims refused" in caplog.text)
        assert len(ran) == 4
        refuse(False)
        _until(lambda: outcomes.landed[observe.ACKED] == 8)
    finally:
        stop.stop()
        thread.join(WAIT)
        store.close()
    assert not thread.is_alive()
    assert sorted(ran) == list(range(8))
    assert outcomes.landed == Counter({observe.ACKED: 8})
    # the first batch's ride: its claim failed, so its acks were rolled back with it
    assert any(t[:2] == ["ack", "claim"] for t in writes.rolled_back), writes.rolled_back
    first_acks = [t for t in writes.done if "ack" in t][0]
    assert first_acks == ["ack"]  # so its acks were written on their own
    assert int(target.scalar("SELECT count(*) FROM alkstore_jobs")) == 0  # type: ignore[arg-type]


def test_a_draining_workers_acks_ride_with_its_claims(
    db: Target, qname: str, monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    """On both engines a worker draining a queue writes each batch of acks with the claim
    for the slots it frees (SQLite: one transaction; PostgreSQL: one pipelined round trip),
    not as a statement of its own."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)
    store = db.store()
    statements = Statements(store, monkeypatch)
    tasks = alk.Tasks()
    together = threading.Barrier(4, timeout=WAIT)

    @tasks.task(queue=qname, name="noop")
    def noop(i: int) -> None:
        together.wait()

    for i in range(40):
        noop.enqueue(store, i)
    _burst(alk.Worker(store, tasks, concurrency=4))

    assert outcomes.landed == Counter({observe.ACKED: 40})
    # ten batches: each rode, but the first may have come while the claimer's own thread
    # was still in its first round (a ride never waits for a round)
    alone = len(statements.batches) - statements.rides
    assert len(statements.batches) == 10 and alone <= 1, (statements.rides, alone)
    assert _left(db, qname) == 0
    store.close()


# -- ack_and_claim_turns: a batch of acks and the claim after it, one transaction ----------


def test_acks_and_the_claim_after_them_land_together(db: Target, qname: str) -> None:
    """``queue.ack_and_claim_turns``: the acks land (each under its own claim, a lapsed
    or foreign one refused) and the next jobs are claimed, in one call; the handles are
    consumed."""
    store = db.store()
    q = store.queue(qname)
    ids = q.enqueue_many([{"i": i} for i in range(6)])
    first = q.claim_batch("w", 3)
    stale = q.claim_one("w")  # a claim of the same attempt's job, handed in twice below
    assert stale is not None and stale.ack() is True  # already acked: its ride is refused
    landed, taken = queue_mod.ack_and_claim_turns(store, [*first, _copy(stale)], "w", [q], 8, 2)
    assert landed == {(h.id, 1) for h in first}
    ((asked, handles),) = taken
    assert asked == 2 and handles is not None and [h.id for h in handles] == ids[4:6]
    assert all(h.consumed for h in first)
    assert _left(db, qname) == 2
    assert [h.ack() for h in handles] == [True, True]
    store.close()


@pytest.mark.parametrize("turns", [1, 2])
def test_acks_do_not_land_when_the_claim_after_them_fails(db: Target, qname: str, turns: int) -> None:
    """Both land or neither: a claim refused by the database (a trigger here) rolls the acks
    back, and the handles stay usable for an ack on their own — with one queue's claim
    (PostgreSQL: pipelined) and with queues taking turns (one transaction)."""
    store = db.store()
    q = store.queue(qname)
    q.enqueue_many([{"i": i} for i in range(4)])
    handles = q.claim_batch("w", 2)
    others = [store.queue(f"{qname}-{k}") for k in range(1, turns)]
    with _refusing_claims(db), pytest.raises(alk.DatabaseError, match="claims refused"):
        queue_mod.ack_and_claim_turns(store, handles, "w", [*others, q], 8, 2)
    assert not any(h.consumed for h in handles)
    assert _left(db, qname) == 4  # nothing acked, nothing more claimed
    assert queue_mod.ack_claims(store, handles, None) == {(h.id, 1) for h in handles}
    assert _left(db, qname) == 2
    store.close()


def _copy(h: alk.JobHandle) -> alk.JobHandle:
    """Another handle of the same claim (as a second process holding it would have)."""
    return alk.JobHandle(h._queue, h._row)


@contextlib.contextmanager
def _refusing_claims(db: Target) -> Iterator[None]:
    """While open, the database refuses to set any job processing (a claim)."""
    jobs = db.table("alkstore_jobs")
    with db.engine.begin() as c:
        if db.kind == "sqlite":
            c.execute(sa.text(
                f"CREATE TRIGGER refuse_claims BEFORE UPDATE OF state ON {jobs} "
                "WHEN NEW.state = 'processing' BEGIN SELECT RAISE(ABORT, 'claims refused'); END"
            ))
        else:
            c.execute(sa.text(
                f'CREATE FUNCTION "{db.schema}".refuse_claims() RETURNS trigger LANGUAGE plpgsql '
                "AS $$ BEGIN RAISE EXCEPTION 'claims refused'; END $$"
            ))
            c.execute(sa.text(
                f"CREATE TRIGGER refuse_claims BEFORE UPDATE ON {jobs} FOR EACH ROW "
                f"WHEN (NEW.state = 'processing') EXECUTE FUNCTION \"{db.schema}\".refuse_claims()"
            ))
    try:
        yield
    finally:
        with db.engine.begin() as c:
            if db.kind == "sqlite":
                c.execute(sa.text("DROP TRIGGER refuse_claims"))
            else:
                c.execute(sa.text(f"DROP TRIGGER refuse_claims ON {jobs}"))
                c.execute(sa.text(f'DROP FUNCTION "{db.schema}".refuse_claims()'))


def test_a_batch_ack_says_exactly_which_claims_held(db: Target, qname: str, clock: FakeClock) -> None:
    """``ack_claims`` over first and later attempts together, with a claim that was
    cancelled, one that lapsed and was taken over (its stale handle and the new one both in
    the batch): exactly the claims that held land, and are the ones reported."""
    store = db.store(clock=clock)
    q = store.queue(qname, visibility_timeout=30)
    a, b, c, d = q.enqueue_many([{"i": i} for i in range(4)])
    first = {h.id: h for h in q.claim_batch("w", 4)}
    clock.advance(31)  # every claim lapses; b is claimed again (attempt 2)
    again = q.claim_one("w2")
    assert again is not None and again.id == a and again.job.attempts == 2
    fresh = {h.id: h for h in q.claim_batch("w2", 3)}  # b, c, d at attempt 2
    assert q.cancel(c) is True
    batch = [again, _copy(first[a]), fresh[b], fresh[c], fresh[d]]
    assert queue_mod.ack_claims(store, batch, None) == {(a, 2), (b, 2), (d, 2)}
    assert _left(db, qname) == 0
    # first and second attempts together, every claim holding
    e = q.enqueue("e")
    assert q.claim_one("w") is not None
    clock.advance(31)
    e2 = q.claim_one("w")
    f = q.enqueue("f")
    f1 = q.claim_one("w")
    assert e2 is not None and e2.id == e and f1 is not None and f1.id == f
    assert queue_mod.ack_claims(store, [e2, f1], None) == {(e, 2), (f, 1)}
    assert _left(db, qname) == 0
    store.close()


def test_acks_ride_with_queues_taking_turns(db: Target, qname: str) -> None:
    """Several turns in the call: the acks land, and a queue short of its turn leaves the
    rest of the budget to the next."""
    store = db.store()
    q, short, rest = (store.queue(f"{qname}-{k}") for k in range(3))
    q.enqueue_many([{"i": i} for i in range(2)])
    short_id = short.enqueue("s")
    rest_ids = rest.enqueue_many(["r1", "r2", "r3"])
    handles = q.claim_batch("w", 2)
    landed, taken = queue_mod.ack_and_claim_turns(store, handles, "w", [short, rest], 4, 3)
    assert landed == {(h.id, 1) for h in handles}
    assert [(n, [h.id for h in hs or []]) for n, hs in taken] == [(3, [short_id]), (2, rest_ids[:2])]
    assert all(_left(db, name) == n for name, n in ((q.name, 0), (short.name, 1), (rest.name, 3)))
    store.close()


def test_a_short_batch_ack_rides_with_its_claim_all_the_same(db: Target, qname: str) -> None:
    """A batch with a claim that no longer holds (its job cancelled) still lands with the
    claim after it, in one call: the others acked, the next jobs claimed."""
    store = db.store()
    q = store.queue(qname)
    ids = q.enqueue_many([{"i": i} for i in range(5)])
    handles = q.claim_batch("w", 3)
    assert q.cancel(ids[1]) is True
    landed, taken = queue_mod.ack_and_claim_turns(store, handles, "w", [q], 8, 2)
    assert landed == {(ids[0], 1), (ids[2], 1)}
    ((_asked, claimed),) = taken
    assert claimed is not None and [h.id for h in claimed] == ids[3:]
    assert _left(db, qname) == 2
    store.close()


def test_a_failed_pipelined_ride_leaves_its_connection_usable(pg_db: Target, qname: str) -> None:
    """PostgreSQL: psycopg marks a statement prepared when it sends it, on its sixth run on
    a connection — also inside a pipeline that the server then aborts before preparing it.
    A ride whose acks fail (refused here by a trigger), at every count of runs, is followed
    by one that works on the same connection: no 'prepared statement does not exist'."""
    store = pg_db.store()
    q = store.queue(qname)
    q.enqueue_many([{"i": i} for i in range(40)])
    handles = q.claim_batch("w", 1)
    for _ in range(12):
        with _refusing_acks(pg_db), pytest.raises(alk.DatabaseError, match="acks refused"):
            queue_mod.ack_and_claim_turns(store, handles, "w", [q], 1, 1)
        landed, ((_n, claimed),) = queue_mod.ack_and_claim_turns(store, handles, "w", [q], 1, 1)
        assert landed == {(handles[0].id, 1)} and claimed is not None and len(claimed) == 1
        handles = claimed
    store.close()


@contextlib.contextmanager
def _refusing_acks(db: Target) -> Iterator[None]:
    """While open, PostgreSQL refuses to delete any job (an ack)."""
    jobs = db.table("alkstore_jobs")
    function = f'"{db.schema}".refuse_acks'
    with db.engine.begin() as c:
        c.execute(sa.text(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RAISE EXCEPTION 'acks refused'; END $$"
        ))
        c.execute(sa.text(f"CREATE TRIGGER refuse_acks BEFORE DELETE ON {jobs} FOR EACH ROW EXECUTE FUNCTION {function}()"))
    try:
        yield
    finally:
        with db.engine.begin() as c:
            c.execute(sa.text(f"DROP TRIGGER refuse_acks ON {jobs}"))
            c.execute(sa.text(f"DROP FUNCTION {function}()"))


def test_without_pipeline_mode_the_ride_is_one_transaction(
    pg_db: Target, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL with a libpq older than 14 (no pipeline mode; stood in for here): the ride
    is the ordinary transaction — it works, and both land or neither."""
    from alkstore_sa._backends import postgresql as pg_backend

    monkeypatch.setattr(pg_backend, "_pipeline_supported", lambda: False)
    store = pg_db.store()
    q = store.queue(qname)
    ids = q.enqueue_many([{"i": i} for i in range(4)])
    handles = q.claim_batch("w", 2)
    with _refusing_claims(pg_db), pytest.raises(alk.DatabaseError, match="claims refused"):
        queue_mod.ack_and_claim_turns(store, handles, "w", [q], 8, 2)
    assert _left(pg_db, qname) == 4
    landed, ((_n, claimed),) = queue_mod.ack_and_claim_turns(store, handles, "w", [q], 8, 2)
    assert landed == {(i, 1) for i in ids[:2]} and claimed is not None and [h.id for h in claimed] == ids[2:]
    store.close()
