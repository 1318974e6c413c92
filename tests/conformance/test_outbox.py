"""The outbox (SPEC §6) on both engines: messages written in the caller's transaction
(rolled back: nothing; committed: claimable), the fixed stamps of the reserved backing
queue, the reserved name unreachable through the queue surface, and the relay (delivery in
order, at least once, retries on exception on the fixed 5 s backoff base, dead after 5
attempts) driven on the injected clock."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa.outbox import backing_queue_name
from tests.support import WAIT, FakeClock, Target, wait_for


@pytest.fixture
def obname(request: pytest.FixtureRequest) -> str:
    """An outbox name unique to this test (tests in one PostgreSQL module share a schema)."""
    return "ob-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]




def counts(ob: alk.Outbox) -> tuple[int, int, int]:
    st = ob.queue.stats()
    return st.pending, st.processing, st.dead


@pytest.fixture
def orders(db: Target) -> Iterator[str]:
    """An application table of the caller's own, next to alkstore's."""
    table = db.table("app_orders") if db.kind == "postgresql" else '"app_orders"'
    db.execute(f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, ref TEXT NOT NULL)")
    yield table


# -- writing in the caller's transaction ------------------------------------------------------


def test_outbox_enqueue_in_a_rolled_back_session_leaves_nothing(
    db: Target, store: alk.Store, obname: str, orders: str
) -> None:
    ob = store.outbox(obname)
    with Session(db.engine) as session:
        session.execute(sa.text(f"INSERT INTO {orders} (id, ref) VALUES (:id, :ref)"), {"id": 1001, "ref": obname})
        msg_id = alk.outbox_enqueue(session, obname, {"order": 1001})
        assert isinstance(msg_id, int)
        session.rollback()
    assert ob.claim_one("relay") is None
    assert ob.get_job(msg_id) is None
    assert counts(ob) == (0, 0, 0)
    assert db.scalar(f"SELECT count(*) FROM {orders} WHERE ref = :ref", ref=obname) == 0


def test_outbox_enqueue_commits_with_the_callers_rows(
    db: Target, store: alk.Store, clock: FakeClock, obname: str, orders: str
) -> None:
    ob = store.outbox(obname)
    with Session(db.engine) as session:
        session.execute(sa.text(f"INSERT INTO {orders} (id, ref) VALUES (:id, :ref)"), {"id": 2002, "ref": obname})
        msg_id = alk.outbox_enqueue(session, obname, {"order": 2002})
        # not visible to anyone else before the caller's commit
        assert ob.get_job(msg_id) is None
        session.commit()
    assert db.scalar(f"SELECT count(*) FROM {orders} WHERE ref = :ref", ref=obname) == 1
    h = ob.claim_one("relay")
    assert h is not None and h.id == msg_id and h.payload == {"order": 2002}
    assert h.job.queue == backing_queue_name(obname) == f"__alkstore_outbox:{obname}"
    assert h.job.created_at.timestamp() == clock()
    assert h.ack()
    assert ob.claim_one("relay") is None


def test_outbox_enqueue_on_a_connection(db: Target, store: alk.Store, obname: str) -> None:
    ob = store.outbox(obname)
    with db.engine.connect() as conn:
        with conn.begin():
            rolled = alk.outbox_enqueue(conn, obname, "rolled back")
            conn.rollback()
        with conn.begin():
            kept = alk.outbox_enqueue(conn, obname, "kept")
    job = ob.get_job(kept)
    assert job is not None and job.payload == "kept"
    assert isinstance(rolled, int)  # (SQLite may hand a rolled-back id out again)
    assert [h.payload for h in ob.claim_batch("relay", 10)] == ["kept"]


def test_ob_enqueue_and_the_fixed_stamps(store: alk.Store, clock: FakeClock, obname: str) -> None:
    ob = store.outbox(obname)
    ids = [ob.enqueue({"i": i}) for i in range(3)]
    with Session(store.engine) as session, session.begin():
        ids.append(alk.outbox_enqueue(session, obname, {"i": 3}))
    for job_id in ids:
        job = ob.get_job(job_id)
        assert job is not None
        assert job.queue == f"__alkstore_outbox:{obname}" and job.state == "pending"
        assert (job.visibility_timeout, job.max_attempts, job.backoff_base) == (60.0, 5, 5.0)
        assert job.dead_letter_retention is None and job.expires_at is None
        assert job.priority == 0 and job.attempts == 0
    batch = ob.claim_batch("relay", 10)
    assert [h.id for h in batch] == ids  # in enqueue order
    assert [h.payload for h in batch] == [{"i": i} for i in range(4)]
    for h in batch:
        assert h.job.claim_expires_at is not None and h.job.claimed_at is not None
        assert h.job.claim_expires_at.timestamp() == clock() + 60
        assert h.ack()


def test_outboxes_and_queues_of_the_same_name_are_apart(
    db: Target, store: alk.Store, obname: str
) -> None:
    ob = store.outbox(obname)
    with Session(db.engine) as session, session.begin():
        qid = alk.enqueue(session, obname, "a plain job")
    oid = ob.enqueue("an outbox message")
    assert store.queue(obname).claim_one("w").id == qid  # type: ignore[union-attr]
    assert ob.claim_one("relay").id == oid  # type: ignore[union-attr]
    assert store.outbox(obname + "-other").claim_one("relay") is None


# -- the reserved backing name ---------------------------------------------------------------


def test_the_reserved_backing_name_is_unreachable_through_queues(
    db: Target, store: alk.Store, obname: str
) -> None:
    ob = store.outbox(obname)
    backing = backing_queue_name(obname)
    assert backing.startswith("__alkstore")
    with Session(db.engine) as session:
        with pytest.raises(alk.InvalidName):
            alk.enqueue(session, backing, {"sneaky": True})
        with pytest.raises(alk.InvalidName):
            alk.enqueue(session, "__alkstore_outbox:anything", {})
        with pytest.raises(alk.InvalidName):
            alk.enqueue_many(session, backing, [{}])
        session.commit()
    with pytest.raises(alk.InvalidName):
        store.queue(backing)
    with pytest.raises(alk.InvalidName):
        store.queue("__alkstore_outbox:x")
    with pytest.raises(alk.InvalidName):
        alk.Worker(store, backing, lambda job: None)
    assert counts(ob) == (0, 0, 0)


@pytest.mark.parametrize("name", ["", "__alkstore", "__alkstore_outbox:x", None, 42, "a\x00b"], ids=repr)
def test_bad_outbox_names_raise_invalid_name(db: Target, store: alk.Store, name: object) -> None:
    with pytest.raises(alk.InvalidName):
        store.outbox(name)  # type: ignore[arg-type]
    with Session(db.engine) as session:
        with pytest.raises(alk.InvalidName):
            alk.outbox_enqueue(session, name, {})  # type: ignore[arg-type]
        session.commit()


# -- the relay -------------------------------------------------------------------------------


class Relay:
    """``ob.relay(deliver, stop)`` in a thread, polling fast (the clock is injected: the
    relay's own waits are real time, the message deadlines are the FakeClock's)."""

    def __init__(self, ob: alk.Outbox, deliver: Callable[[Any], Any]) -> None:
        self.stop = alk.StopToken()
        self.outcome: list[Any] = []

        def target() -> None:
            try:
                ob.relay(deliver, self.stop, worker_id="relay-test", poll_interval=0.05)
                self.outcome.append("returned")
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.outcome.append(exc)

        self.thread = threading.Thread(target=target, name="relay", daemon=True)
        self.thread.start()

    def close(self) -> Any:
        self.stop.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the relay did not stop"
        return self.outcome[0]


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for r in started:
        if r.thread.is_alive():
            r.close()


def test_relay_delivers_every_message_in_order_then_acks(
    store: alk.Store, obname: str, relays: list[Relay]
) -> None:
    ob = store.outbox(obname)
    ids = [ob.enqueue({"seq": i}) for i in range(8)]
    delivered: list[Any] = []
    relays.append(r := Relay(ob, delivered.append))
    wait_for(lambda: len(delivered) >= 8 and counts(ob) == (0, 0, 0), "all 8 messages delivered and acked")
    assert delivered == [{"seq": i} for i in range(8)]
    # new messages keep flowing while it runs
    with Session(store.engine) as session, session.begin():
        ids.append(alk.outbox_enqueue(session, obname, {"seq": 8}))
    wait_for(lambda: len(delivered) == 9 and counts(ob) == (0, 0, 0), "the ninth message")
    assert delivered[-1] == {"seq": 8}
    assert r.close() == "returned"
    assert all(ob.get_job(i) is None for i in ids)  # acked: gone


def test_relay_awaits_an_async_deliver(store: alk.Store, obname: str, relays: list[Relay]) -> None:
    """An ``async def`` deliver (an async Kafka or HTTP client) is awaited on the relay's
    event loop, as a Worker awaits an async handler. It used to be called by a plain
    wrapper whose coroutine was discarded unrun: every message went dead, its errors saying
    the deliver was "not an async def function"."""
    ob = store.outbox(obname)
    ids = [ob.enqueue({"seq": i}) for i in range(3)]
    delivered: list[Any] = []

    async def deliver(payload: Any) -> None:
        await asyncio.sleep(0)
        delivered.append(payload)

    relays.append(r := Relay(ob, deliver))
    wait_for(lambda: len(delivered) == 3 and counts(ob) == (0, 0, 0), "all 3 messages delivered and acked")
    assert delivered == [{"seq": i} for i in range(3)]
    assert r.close() == "returned"
    assert all(ob.get_job(i) is None for i in ids)


def test_relay_stop_waits_for_the_delivery_in_flight_up_to_its_grace(store: alk.Store, obname: str) -> None:
    """``shutdown_grace``: how long a stop lets the delivery in flight finish (the Worker's
    30 s before, with no way to change it)."""
    ob = store.outbox(obname)
    oid = ob.enqueue("slow")
    started, release = threading.Event(), threading.Event()

    def deliver(payload: Any) -> None:
        started.set()
        release.wait(WAIT)

    stop = alk.StopToken()
    thread = threading.Thread(
        target=ob.relay, args=(deliver, stop), kwargs={"poll_interval": 0.05, "shutdown_grace": 0.2}, daemon=True
    )
    thread.start()
    try:
        assert started.wait(WAIT)
        stop.stop()
        thread.join(WAIT / 3)
        assert not thread.is_alive(), "the relay waited past its shutdown_grace"
        job = ob.get_job(oid)
        assert job is not None and job.state == "processing"  # left to its claim
    finally:
        release.set()
        thread.join(WAIT)


@pytest.mark.parametrize(
    ("deliver", "stop", "match"),
    [
        (print, None, "stop must be an alkstore_sa.StopToken"),
        (print, "x", "stop must be an alkstore_sa.StopToken"),
        ("not callable", alk.StopToken(), "deliver must be callable"),
        (None, alk.StopToken(), "deliver must be callable"),
    ],
    ids=["stop=None", "stop=str", "deliver=str", "deliver=None"],
)
def test_relay_refuses_bad_arguments_at_the_call(store: alk.Store, obname: str, deliver: Any, stop: Any, match: str) -> None:
    """InvalidOptions before any claim: ``stop=None`` used to run a relay nobody could stop,
    and a ``deliver`` that is no callable failed every message until it was dead."""
    ob = store.outbox(obname)
    msg = ob.enqueue({"x": 1})
    outcome: list[BaseException | str] = []

    def call() -> None:
        try:
            ob.relay(deliver, stop, poll_interval=0.05)
            outcome.append("returned")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(3.0)
    if t.is_alive() and isinstance(stop, alk.StopToken):
        stop.stop()
        t.join(WAIT)
    assert outcome and isinstance(outcome[0], alk.InvalidOptions), f"the relay ran: {outcome}"
    assert re.search(match, str(outcome[0]))
    job = ob.get_job(msg)
    assert job is not None and job.state == "pending" and job.attempts == 0


def test_relay_retries_on_exception_after_the_backoff(
    store: alk.Store, clock: FakeClock, obname: str, relays: list[Relay]
) -> None:
    ob = store.outbox(obname)
    flaky = [ob.enqueue({"seq": 0}), ob.enqueue({"seq": 1, "flaky": True}), ob.enqueue({"seq": 2})]
    calls: list[int] = []

    def deliver(payload: Any) -> None:
        calls.append(payload["seq"])
        if payload.get("flaky") and calls.count(payload["seq"]) <= 2:
            raise ConnectionError("broker unavailable")

    relays.append(r := Relay(ob, deliver))
    wait_for(lambda: calls[:3] == [0, 1, 2], "a first pass over the three messages")
    job = wait_for(
        lambda: (j := ob.get_job(flaky[1])) is not None and j.state == "pending" and j,
        "the failed message back to pending",
    )
    assert job.attempts == 1 and [e["error"] for e in job.errors] == ["broker unavailable"]
    # base 5 s, first retry: an integer delay in [3, 5] seconds
    delay = job.run_at.timestamp() - clock()
    assert 3 <= delay <= 5
    time.sleep(0.3)
    assert calls == [0, 1, 2]  # not redelivered before its backoff passed
    clock.advance(5)
    wait_for(lambda: calls.count(1) == 2, "the second attempt")
    job = wait_for(
        lambda: (j := ob.get_job(flaky[1])) is not None and j.state == "pending" and j.attempts == 2 and j,
        "the second failure to land",
    )
    assert 5 <= job.run_at.timestamp() - clock() <= 10  # second retry: [5, 10]
    clock.advance(10)
    wait_for(lambda: calls.count(1) == 3 and counts(ob) == (0, 0, 0), "the third attempt to succeed")
    assert calls == [0, 1, 2, 1, 1]
    assert r.close() == "returned"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_relay_retries_a_delivery_that_raises_generatorexit_and_goes_on(
    store: alk.Store, clock: FakeClock, obname: str, relays: list[Relay], is_async: bool
) -> None:
    """A ``GeneratorExit`` that ``deliver`` raises itself is its error like any other: the
    message is retried and the relay goes on. From an ``async def`` deliver it was taken
    for the coroutine being closed at shutdown: nothing was recorded and the relay's one
    slot stayed taken, so it delivered nothing more (and a stop waited out its grace)."""
    ob = store.outbox(obname)
    first, second = ob.enqueue({"seq": 0}), ob.enqueue({"seq": 1})
    delivered: list[Any] = []

    def sync_deliver(payload: Any) -> None:
        if payload["seq"] == 0:
            raise GeneratorExit
        delivered.append(payload)

    async def async_deliver(payload: Any) -> None:
        await asyncio.sleep(0)
        sync_deliver(payload)

    relays.append(r := Relay(ob, async_deliver if is_async else sync_deliver))
    wait_for(lambda: delivered == [{"seq": 1}] and ob.get_job(second) is None, "the next message delivered")
    job = ob.get_job(first)
    assert job is not None and job.state == "pending" and job.attempts == 1, job
    assert [e["error"] for e in job.errors] == ["GeneratorExit"]
    assert 3 <= job.run_at.timestamp() - clock() <= 5  # on the backoff curve
    assert r.close() == "returned"


def test_relay_dead_letters_after_5_attempts(
    store: alk.Store, clock: FakeClock, obname: str, relays: list[Relay]
) -> None:
    ob = store.outbox(obname)
    poison = ob.enqueue({"poison": True})
    fine = ob.enqueue({"poison": False})
    calls: list[Any] = []

    def deliver(payload: Any) -> None:
        calls.append(payload)
        if payload["poison"]:
            raise ValueError("cannot deliver this one")

    relays.append(r := Relay(ob, deliver))
    for attempt in range(1, 5):
        wait_for(
            lambda a=attempt: (j := ob.get_job(poison)) is not None and j.state == "pending" and j.attempts == a,
            f"failed attempt {attempt} to land",
        )
        clock.advance(60)  # past any of the four retry delays (at most 5, 10, 20, 40 s)
    dead = wait_for(
        lambda: (j := ob.get_job(poison)) is not None and j.state == "dead" and j,
        "the poison message to be dead-lettered",
    )
    assert dead.attempts == 5 and dead.last_error == "max attempts exceeded"
    assert [e["error"] for e in dead.errors] == ["cannot deliver this one"] * 5
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3, 4, 5]
    assert calls.count({"poison": True}) == 5
    assert {"poison": False} in calls and ob.get_job(fine) is None  # not held up by the poison
    assert counts(ob) == (0, 0, 1)
    assert [j.id for j in ob.queue.dead_jobs()] == [poison]
    clock.advance(3600)
    time.sleep(0.2)
    assert calls.count({"poison": True}) == 5  # dead is dead: no sixth attempt
    assert r.close() == "returned"


def test_relay_redelivers_a_message_whose_relay_died_mid_delivery(
    store: alk.Store, clock: FakeClock, obname: str, relays: list[Relay]
) -> None:
    """At least once: a relay that claimed a message and died before its ack (simulated by a
    claim nobody acks) leaves it to be delivered again once the 60 s visibility lapses."""
    ob = store.outbox(obname)
    msg = ob.enqueue({"n": 1})
    orphan = ob.claim_one("relay-that-died")
    assert orphan is not None and orphan.id == msg
    delivered: list[Any] = []
    relays.append(r := Relay(ob, delivered.append))
    time.sleep(0.3)
    assert delivered == []  # still claimed by the dead relay
    clock.advance(60)
    wait_for(lambda: delivered == [{"n": 1}] and counts(ob) == (0, 0, 0), "the redelivery")
    assert orphan.ack() is False  # the dead relay's claim is void
    assert r.close() == "returned"
