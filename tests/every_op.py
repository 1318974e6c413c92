"""Run every operation of a store once, on the database's own clock: the queue (enqueue,
claims, every handle transition, reclaim and exhausted bury, batch acks, cancel, reads,
dead-letter requeue, sweep, stats, next due), queue settings and limited claims, the
transactional forms, the outbox,
notify/listen, streams, locks, schedules (firing one) and a burst worker.

Used where the question is "can this store do everything?": a DML-only runtime role
(tests/migrations/test_install_rights.py) and a hostile ``search_path``
(tests/conformance/test_search_path.py). Each step asserts its result, so a refused or
broken statement fails the caller's test at the operation that broke.
"""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa._gauges import read_gauges
from alkstore_sa.dashboard.reads import stream_rows
from alkstore_sa.queue import cancel_pending
from alkstore_sa.scheduler import Scheduler
from tests.support import wait_for


def run_every_operation(store: alk.Store) -> None:
    """Every public operation (and the internal next-due read the worker makes) once."""
    tag = uuid.uuid4().hex[:8]
    _queue_ops(store, f"q-{tag}")
    _settings_ops(store, f"set-{tag}")
    _transactional_ops(store, f"tx-{tag}")
    _notify_ops(store, f"ch-{tag}")
    _stream_ops(store, f"s-{tag}")
    _lock_ops(store, f"l-{tag}")
    _schedule_ops(store, f"sched-{tag}", f"fired-{tag}")
    _worker_ops(store, f"w-{tag}")


def _queue_ops(store: alk.Store, name: str) -> None:
    q = store.queue(name, visibility_timeout=60, max_attempts=3, dead_letter_retention=0)
    first = q.enqueue({"n": 1}, priority=2)
    q.enqueue_many([{"n": 2}, {"n": 3}], delay=0)
    h = q.claim_one("w1")
    assert h is not None and h.id == first
    assert h.heartbeat(30) is True
    assert h.retry("again", delay=0) is True
    hs = q.claim_batch("w1", 3)
    assert len(hs) == 3
    assert hs[0].ack() is True
    assert hs[1].fail("broken") is True
    assert q.ack_batch([hs[2]]) == 1  # by claim
    assert q.ack_batch([10**12]) == 0  # by id
    dead = q.dead_jobs()
    assert [j.id for j in dead] == [hs[1].id]
    assert q.dead_jobs(before_id=hs[1].id) == []
    assert q.get_job(hs[1].id) is not None and store.get_job(hs[1].id) is not None
    again = q.requeue_dead(hs[1].id)
    assert again is not None and q.cancel(again) is True
    assert cancel_pending(q, q.enqueue({"n": 7})) is True  # the dashboard's pending-only cancel
    stats = q.stats()
    assert stats.pending == 0 and stats.processing == 0
    q.enqueue({"n": 4})
    assert store.queue_stats()[name].pending == 1
    assert read_gauges(store)[name].ready == 1  # the metrics scrape's one statement
    assert q.claim_one("w1").ack() is True  # type: ignore[union-attr]
    held = q.enqueue({"n": 5}, unique_key="k")  # unique jobs: the insert, then the held path
    assert q.enqueue({"n": 6}, unique_key="k") == held and q.cancel(held) is True

    # a lapsed claim is reclaimed; with its attempts used up it goes dead before the claim
    short = store.queue(name + "-short", visibility_timeout=0.01, max_attempts=1, dead_letter_retention=0)
    gone = short.enqueue("lapses")
    assert short.claim_one("w1") is not None
    time.sleep(0.05)
    assert short.claim_one("w1") is None
    job = short.get_job(gone)
    assert job is not None and job.state == "dead"
    reclaimed = store.queue(name + "-reclaim", visibility_timeout=0.01, max_attempts=2)
    reclaimed.enqueue("reclaimed")
    assert reclaimed.claim_one("w1") is not None
    time.sleep(0.05)
    h = reclaimed.claim_one("w2")
    assert h is not None and h.job.attempts == 2  # (left to lapse: its claim is 10 ms long)
    budget = store.queue(name + "-budget", max_attempts=1)
    budget.enqueue("last try")
    h = budget.claim_one("w1")
    assert h is not None and h.retry("over budget") is True  # at budget: buried, error appended
    job = budget.get_job(h.id)
    assert job is not None and job.state == "dead"
    expiring = store.queue(name + "-exp", dead_letter_retention=0)
    expiring.enqueue("expires", expires=0.01)
    time.sleep(0.05)
    assert expiring.sweep_expired().expired == 1
    assert expiring.sweep_expired().purged == 1
    with store.executor() as ex:
        store.backend.next_due(ex, {"queue": name, "now": store.now()})


def _settings_ops(store: alk.Store, name: str) -> None:
    """Queue settings (SPEC §14): pause, limits, the limited claim and its rate log, the
    worker's limit read, and back to no settings."""
    from alkstore_sa._limits import limit_wait

    q = store.queue(name)
    q.enqueue_many([{"s": i} for i in range(4)])
    assert q.pause().paused is True
    assert q.claim_one("w1") is None
    assert q.resume().paused is False
    assert q.set_concurrency(2).concurrency == 2
    assert q.set_rate_limit(3, per=60).rate_limit == 3
    assert len(q.claim_batch("w1", 4)) == 2
    assert limit_wait(store, name) is not None  # the concurrency limit is full
    assert store.queue_settings()[name] == q.settings()
    assert q.set_concurrency(None).concurrency is None
    assert q.set_rate_limit(None).rate_limit is None
    assert name not in store.queue_settings()
    assert len(q.claim_batch("w1", 4)) == 2


def _transactional_ops(store: alk.Store, name: str) -> None:
    q = store.queue(name)
    with Session(store.engine) as session, session.begin():
        one = alk.enqueue(session, name, {"tx": 1})
        alk.enqueue_many(session, q, [{"tx": 2}])
        assert alk.get_job(session, q, one) is not None
        alk.outbox_enqueue(session, name, {"out": 1})
        alk.publish(session, name, {"event": 1})
        alk.notify(session, name, "tx")
    assert q.stats().pending == 2
    ob = store.outbox(name)
    h = ob.claim_one("relay")
    assert h is not None and h.payload == {"out": 1} and h.ack()
    ob.enqueue({"out": 2})


def _notify_ops(store: alk.Store, channel: str) -> None:
    with store.listen(channel) as sub:
        store.notify(channel, "hello")
        assert sub.get(timeout=15) == alk.Notification(channel, "hello")


def _stream_ops(store: alk.Store, name: str) -> None:
    s = store.stream(name)
    assert s.publish({"e": 1}) == 1
    assert s.publish({"e": 2}) == 2
    assert [e.offset for e in s.read(after=0)] == [1, 2]
    s.commit("c1", 1)
    assert s.offset("c1") == 1
    (row,) = [r for r in stream_rows(store) if r.name == name]  # the dashboard's one statement
    assert (row.last_offset, [(c.name, c.offset, c.lag) for c in row.consumers]) == (2, [("c1", 1, 1)])
    assert s.trim_to(1) == 1


def _lock_ops(store: alk.Store, name: str) -> None:
    lock = store.lock(name)
    assert lock.acquire("me", 30) is True
    assert lock.acquire("other", 30) is False
    assert lock.renew("me", 30) is True
    holder = lock.holder()
    assert holder is not None and holder.owner == "me"
    assert lock.release("me") is True


def _schedule_ops(store: alk.Store, name: str, queue: str) -> None:
    store.schedule(name, "@every 1s", queue, {"tick": True})
    assert any(s.name == name for s in store.schedules())
    # the next 1 s boundary is at most a second away: tick until it fires
    wait_for(lambda: Scheduler(store).tick() > 0, "the schedule to fire")
    Scheduler(store)._seconds_to_next_fire()
    assert store.unschedule(name) is True
    assert store.queue(queue).stats().pending >= 1


def _worker_ops(store: alk.Store, name: str) -> None:
    q = store.queue(name)
    q.enqueue_many([{"w": i} for i in range(3)])
    seen: list[object] = []
    alk.Worker(store, q, lambda job: seen.append(job.payload), concurrency=2, poll_interval=0.1).run(burst=True)
    assert sorted(p["w"] for p in seen) == [0, 1, 2]  # type: ignore[index]


def engine_with_search_path(url: str | sa.URL, search_path: str, **kw: object) -> sa.Engine:
    """An engine whose every connection starts with ``search_path`` (a libpq option)."""
    return sa.create_engine(url, connect_args={"options": f"-csearch_path={search_path}"}, **kw)
