"""SPEC §14, queue settings, on both engines: the API and its validation (bad input writes
nothing), settings stored in the database and seen by every store, pause/resume, the
concurrency limit (live claims, lapses, acks), the rate limit against the injected clock
(the window boundary exactly), both limits together, the claim path returning to the fast
one when the settings go, resume/raise waking an idle worker (an hour-long poll: only the
wake can deliver), and a worker that does not spin while its queue's limits hold it back.

Multi-process enforcement is in tests/concurrency/test_queue_limits.py."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa import _limits
from tests.conftest import require_pg
from tests.support import (
    WAIT,
    FakeClock,
    Target,
    drop_pg_schema,
    new_pg_schema,
    pg_target,
    wait_for,
)

NO_POLL = 3600.0  # a worker's re-poll, made irrelevant: only a wake delivers in time


def _rows(db: Target, table: str, queue: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table(table)} WHERE queue = :q", q=queue))  # type: ignore[arg-type]


# -- the API ------------------------------------------------------------------------------------


def test_a_queue_without_settings(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    assert q.settings() == alk.QueueSettings(paused=False, concurrency=None, rate_limit=None, rate_per=None)
    assert qname not in store.queue_settings()


def test_settings_are_stored_and_seen_by_every_store(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    assert q.set_concurrency(5) == alk.QueueSettings(False, 5, None, None)
    assert q.set_rate_limit(100, per=60) == alk.QueueSettings(False, 5, 100, 60.0)
    assert q.pause() == alk.QueueSettings(True, 5, 100, 60.0)
    other = db.store()  # another store: as another process would
    try:
        assert other.queue(qname).settings() == alk.QueueSettings(True, 5, 100, 60.0)
        assert other.queue_settings()[qname] == alk.QueueSettings(True, 5, 100, 60.0)
    finally:
        other.close()
    # an omitted setting keeps its value; fractional windows and timedeltas are durations
    assert q.set_rate_limit(7, per=timedelta(milliseconds=1500)).rate_per == 1.5
    assert q.resume() == alk.QueueSettings(False, 5, 7, 1.5)


def test_queue_settings_by_name_in_code_point_order_under_a_linguistic_collation(qname: str) -> None:
    """A PostgreSQL database made with a linguistic locale (en_US.UTF-8, the official Docker
    image's default) orders text its own way ('alpha' before 'Alpha', '_' ignored), and
    ``store.queue_settings()`` followed it, so its order differed from SQLite's. Names are
    exact values, in code point order on both engines, as ``queue_stats()`` and
    ``schedules()`` list them."""
    require_pg()
    target = pg_target(new_pg_schema())
    try:
        if target.scalar("SELECT count(*) FROM pg_collation WHERE collname = 'en-US-x-icu'") == 0:
            pytest.skip("this PostgreSQL has no ICU collation en-US-x-icu")
        # what CREATE DATABASE ... LOCALE 'en_US.UTF-8' gives every text column it creates
        target.execute(
            f'ALTER TABLE {target.table("alkstore_queue_settings")} ALTER COLUMN queue TYPE text COLLATE "en-US-x-icu"'
        )
        store = target.store()
        try:
            names = [f"{qname}-{n}" for n in ("zeta", "alpha", "Alpha", "a_b", "ab", "Zeta")]
            for name in names:
                store.queue(name).pause()
            assert list(store.queue_settings()) == sorted(names)
        finally:
            store.close()
    finally:
        drop_pg_schema(target)


def test_a_settings_row_with_no_effect_is_removed(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.pause()
    q.set_concurrency(2)
    q.set_rate_limit(3, per=1)
    q.enqueue_many([1, 2])
    assert q.claim_one("w") is None
    q.resume()
    assert len(q.claim_batch("w", 2)) == 2
    assert _rows(db, "alkstore_queue_claims", qname) == 1  # the rate log: one row per claim
    q.set_rate_limit(None)
    assert _rows(db, "alkstore_queue_claims", qname) == 0  # the log goes with the limit
    q.set_concurrency(None)
    assert q.settings() == alk.QueueSettings()
    assert _rows(db, "alkstore_queue_settings", qname) == 0
    assert qname not in store.queue_settings()


BAD_CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("concurrency 0", {"concurrency": 0}),
    ("concurrency -1", {"concurrency": -1}),
    ("concurrency float", {"concurrency": 1.5}),
    ("concurrency bool", {"concurrency": True}),
    ("concurrency str", {"concurrency": "3"}),
    ("concurrency > int32", {"concurrency": 2**31}),
    ("rate 0", {"rate": (0, 1)}),
    ("rate float", {"rate": (2.5, 1)}),
    ("rate bool", {"rate": (True, 1)}),
    ("rate without per", {"rate": (10, None)}),
    ("per 0", {"rate": (10, 0)}),
    ("per 1ns", {"rate": (10, 1e-9)}),  # below the timestamps' millisecond: cannot be measured
    ("per 0.5ms", {"rate": (10, timedelta(microseconds=500))}),
    ("per negative", {"rate": (10, -1)}),
    ("per nan", {"rate": (10, math.nan)}),
    ("per inf", {"rate": (10, math.inf)}),
    ("per over 100 years", {"rate": (10, 101 * 365.25 * 86400)}),
    ("per str", {"rate": (10, "60")}),
    # removing a limit takes its window too, but not a bad one (it was ignored, unchecked)
    ("removal with per negative", {"rate": (None, -1)}),
    ("removal with per str", {"rate": (None, "60")}),
    ("removal with per 1ns", {"rate": (None, 1e-9)}),
]


@pytest.mark.parametrize("change", [c for _, c in BAD_CHANGES], ids=[i for i, _ in BAD_CHANGES])
def test_bad_settings_are_refused_and_write_nothing(
    db: Target, store: alk.Store, qname: str, change: dict[str, Any]
) -> None:
    q = store.queue(qname)
    q.set_concurrency(4)
    q.set_rate_limit(10, per=2)
    before = q.settings()
    with pytest.raises(alk.InvalidOptions):
        if "concurrency" in change:
            q.set_concurrency(change["concurrency"])
        else:
            limit, per = change["rate"]
            q.set_rate_limit(limit, per=per)
    assert q.settings() == before
    other = store.queue(qname + "-untouched")
    with pytest.raises(alk.InvalidOptions):
        if "concurrency" in change:
            other.set_concurrency(change["concurrency"])
        else:
            limit, per = change["rate"]
            other.set_rate_limit(limit, per=per)
    assert _rows(db, "alkstore_queue_settings", qname + "-untouched") == 0


# -- pause ----------------------------------------------------------------------------------------


def test_pause_hands_out_nothing_and_enqueues_still_land(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=30)
    q.enqueue_many([1, 2, 3])
    in_flight = q.claim_one("w")
    assert in_flight is not None
    q.pause()
    assert q.claim_one("w") is None
    assert q.claim_batch("w", 10) == []
    q.enqueue(4)
    q.enqueue_many([5, 6])
    assert q.stats().pending == 5
    # claimed work finishes normally while paused
    assert in_flight.heartbeat(30) is True
    assert in_flight.ack() is True
    # a claim that lapses while paused is not handed out again until the resume
    q.resume()
    lapsing = q.claim_one("w")
    assert lapsing is not None and lapsing.payload == 2
    q.pause()
    clock.advance(31)
    assert q.claim_batch("w", 10) == []
    q.resume()
    claimed = q.claim_batch("w", 10)
    assert sorted(x.payload for x in claimed) == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("fresh", [False, True], ids=["this-store", "another-store"])
@pytest.mark.parametrize("held_by", ["pause", "concurrency", "rate"])
def test_a_claim_held_back_by_its_limits_still_moves_exhausted_reclaims_to_dead(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, held_by: str, fresh: bool
) -> None:
    """SPEC §5.3: before claiming, reclaimable rows that used every attempt move to dead, in
    the claim's transaction. That holds when the queue's settings leave no room to hand out
    anything too: a job whose last claim lapsed while its queue was paused (or its limits
    full) is dead after the next claim, and its unique key free, on both engines, whether
    the claiming store knew the queue had settings or not (SQLite buried it only then)."""
    q = store.queue(qname, visibility_timeout=10, max_attempts=1)
    doomed = q.enqueue("doomed", priority=1, unique_key="k")
    assert q.claim_one("w") is not None  # its one attempt
    store.queue(qname, visibility_timeout=1000).enqueue("other")
    if held_by == "pause":
        q.pause()
    elif held_by == "concurrency":
        assert q.claim_one("w") is not None  # "other", live for 1000 s
        q.set_concurrency(1)
    else:
        q.set_rate_limit(1, per=3600)
        assert q.claim_one("w") is not None  # "other": the window is full
    clock.advance(11)  # the doomed claim lapsed: reclaimable, with no attempt left
    claimer = db.store(clock=clock) if fresh else store
    try:
        assert claimer.queue(qname).claim_batch("w2", 5) == []
    finally:
        if fresh:
            claimer.close()
    job = q.get_job(doomed)
    assert job is not None and (job.state, job.last_error) == ("dead", "max attempts exceeded")
    assert q.enqueue("again", unique_key="k") != doomed  # the key is free


def test_pause_set_by_another_store_stops_this_stores_claims(db: Target, store: alk.Store, qname: str) -> None:
    """The store that claims does not know the queue was paused elsewhere (its claims took
    the fast path until now): the claim itself must refuse, and claim again after resume."""
    q = store.queue(qname)
    q.enqueue_many([1, 2, 3])
    assert q.claim_one("w") is not None  # the fast path, remembered as such
    operator = db.store()
    try:
        operator.queue(qname).pause()
        assert q.claim_one("w") is None
        assert q.claim_batch("w", 5) == []
        operator.queue(qname).resume()
        assert len(q.claim_batch("w", 5)) == 2
    finally:
        operator.close()


# -- concurrency ------------------------------------------------------------------------------------


def test_concurrency_limit_counts_live_claims(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=10, max_attempts=5)
    q.enqueue_many(list(range(10)))
    q.set_concurrency(3)
    first = q.claim_batch("w", 10)
    assert len(first) == 3  # min(n, N - live)
    assert q.claim_batch("w", 10) == []
    assert first[0].ack() is True  # an ack frees a place
    assert len(q.claim_batch("w", 10)) == 1
    assert first[1].retry("again", delay=100) is True  # so does a retry
    assert len(q.claim_batch("w", 1)) == 1
    assert q.claim_one("w") is None
    clock.advance(11)  # every claim lapsed: none is live any more
    again = q.claim_batch("w", 10)
    assert len(again) == 3
    assert q.set_concurrency(5).concurrency == 5  # raised: two more places
    assert len(q.claim_batch("w", 10)) == 2
    assert q.set_concurrency(1).concurrency == 1  # lowered: nothing is revoked, nothing handed out
    assert q.claim_batch("w", 10) == []
    assert q.stats().processing == 5


def test_concurrency_limit_set_by_another_store(db: Target, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many(list(range(6)))
    assert len(q.claim_batch("w", 2)) == 2  # fast path
    operator = db.store()
    try:
        operator.queue(qname).set_concurrency(3)
        assert len(q.claim_batch("w", 10)) == 1
        assert q.claim_batch("w", 10) == []
        operator.queue(qname).set_concurrency(None)
        assert len(q.claim_batch("w", 10)) == 3  # fast again once the settings are gone
    finally:
        operator.close()


# -- rate -------------------------------------------------------------------------------------------


def test_rate_limit_window_on_the_injected_clock(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many(list(range(40)))
    q.set_rate_limit(5, per=10)
    t0 = clock.now
    assert len(q.claim_batch("w", 3)) == 3  # a batch of k counts k
    clock.advance(4)
    assert len(q.claim_batch("w", 3)) == 2
    assert q.claim_one("w") is None
    clock.advance(5.999)  # t0 + 9.999: the first three are still inside [t0, t0 + 10)
    assert q.claim_batch("w", 10) == []
    clock.now = t0 + 10  # they leave the window exactly here
    assert len(q.claim_batch("w", 10)) == 3
    clock.now = t0 + 14  # and the two taken at t0 + 4 here
    assert len(q.claim_batch("w", 10)) == 2
    assert q.claim_batch("w", 10) == []
    # no window of 10 s ever held more than 5
    times = [t0] * 3 + [t0 + 4] * 2 + [t0 + 10] * 3 + [t0 + 14] * 2
    assert max(sum(1 for u in times if t <= u < t + 10) for t in times) == 5


def test_a_clock_stepping_back_never_lifts_the_rate_limit(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname)
    clock.advance(-3600)  # jobs due before any of the clock readings below
    q.enqueue_many(list(range(100)))
    clock.advance(3600)
    t0 = clock.now
    q.set_rate_limit(10, per=60)
    assert len(q.claim_batch("w", 6)) == 6
    clock.advance(-30)  # an NTP step back: the claims above now lie 30 s in the future
    assert len(q.claim_batch("w", 6)) == 4  # the window still holds those six
    for _ in range(20):  # the 20 s after the step: the window is full all along
        clock.advance(1)
        assert q.claim_batch("w", 10) == []
    # the four are counted as taken at t0 (no logged time goes back), so the window frees
    # at t0 + 60, up to the step later than the clock's readings alone would have
    assert _limits.limit_wait(store, qname) == (pytest.approx(70.0), False)
    clock.now = t0 + 59.999
    assert q.claim_one("w") is None
    clock.now = t0 + 60
    assert len(q.claim_batch("w", 20)) == 10
    assert q.claim_one("w") is None


def test_stores_whose_clocks_disagree_never_lift_the_rate_limit(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """Two stores each on a clock of its own, one 0.5 s behind the other (hosts whose
    clocks drift, each store passing its own): their claims, taken in turn, still hand out
    at most the limit in each window."""
    behind = FakeClock(clock.now - 0.5)
    other = db.store(clock=behind)
    try:
        q, r = store.queue(qname), other.queue(qname)
        clock.advance(-3600)
        q.enqueue_many(list(range(200)))
        clock.advance(3600)
        q.set_rate_limit(10, per=60)
        taken = 0
        for _ in range(120):  # two windows, a claim from each store every second
            taken += len(q.claim_batch("w", 3)) + len(r.claim_batch("w", 3))
            clock.advance(1)
            behind.advance(1)
        assert taken == 20
    finally:
        other.close()


def test_rate_log_holds_about_one_window(db: Target, store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many(list(range(100)))
    q.set_rate_limit(4, per=1)
    for _ in range(20):
        assert len(q.claim_batch("w", 2)) == 2  # two claims of 2 a second
        assert len(q.claim_batch("w", 10)) == 2
        assert q.claim_one("w") is None
        clock.advance(1)
    assert _rows(db, "alkstore_queue_claims", qname) <= 4  # pruned as claims go


@pytest.mark.parametrize("window", [None, 0.0, -5.0, math.nan], ids=["none", "zero", "negative", "nan"])
def test_a_rate_limit_written_by_hand_without_a_positive_window_is_not_in_force(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, window: float | None
) -> None:
    """A settings row written by hand (SQL, not the API, which sets both or neither and
    a window of at least a millisecond) with a rate limit and no window: no window counted
    its claims, so each claim took up to the limit (a cap per claim, which nothing
    documents), and each was logged for the rate, and the log was never pruned (a row a
    claim, forever). A window of 0, a negative one or NaN counted nothing either, the same
    cap per claim. Such a limit is not in force — no window, no rate — so nothing is
    logged; the row's other settings still hold, and the settings read back as stored
    (SQLite stores NaN as NULL)."""
    q = store.queue(qname, visibility_timeout=1000)
    q.enqueue_many(list(range(20)))
    db.execute(
        f"INSERT INTO {db.table('alkstore_queue_settings')} (queue, paused, concurrency, rate_limit, rate_per,"
        " updated_at) VALUES (:q, false, 10, 2, :per, 0)",
        q=qname, per=window,
    )
    s = q.settings()
    assert (s.paused, s.concurrency, s.rate_limit) == (False, 10, 2)
    assert s.rate_per is None if window is None else (s.rate_per is None or not s.rate_per > 0)
    for _ in range(5):
        h = q.claim_one("w")
        assert h is not None and h.ack() is True
        clock.advance(1)
    assert len(q.claim_batch("w", 20)) == 10  # the concurrency limit holds, the rate none
    assert q.claim_one("w") is None
    assert _rows(db, "alkstore_queue_claims", qname) == 0
    assert _limits.describe(s).endswith("not in force)")


def test_both_limits_take_the_smaller_room(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=1000)
    q.enqueue_many(list(range(20)))
    q.set_concurrency(4)
    q.set_rate_limit(6, per=10)
    hs = q.claim_batch("w", 10)
    assert len(hs) == 4  # concurrency is the tighter
    assert q.ack_batch(hs) == 4
    assert len(q.claim_batch("w", 10)) == 2  # now the rate is
    clock.advance(10)
    assert len(q.claim_batch("w", 10)) == 2  # concurrency again: 2 still live
    assert q.claim_one("w") is None


# -- the limit arithmetic the worker sleeps by ---------------------------------------------------


def test_limit_wait_says_how_long_the_limits_hold_claims_back(store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname, visibility_timeout=50)
    q.enqueue_many(list(range(10)))
    assert _limits.limit_wait(store, qname) is None  # no settings
    q.set_rate_limit(2, per=8)
    assert _limits.limit_wait(store, qname) is None  # room
    assert len(q.claim_batch("w", 5)) == 2
    clock.advance(3)
    assert _limits.limit_wait(store, qname) == (pytest.approx(5.0), False)  # the window frees in 5 s
    q.set_rate_limit(None)
    q.set_concurrency(2)
    assert _limits.limit_wait(store, qname) == (pytest.approx(47.0), True)  # the first claim lapses
    q.pause()
    assert _limits.limit_wait(store, qname) == (None, True)  # until resumed


# -- wakes and the worker ---------------------------------------------------------------------------


@contextmanager
def _worker(store: alk.Store, queue: str | alk.Queue, handler: Any, **kw: Any) -> Iterator[alk.Worker]:
    worker = alk.Worker(store, queue, handler, **kw)
    stop = alk.StopToken()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        stop.stop()
        thread.join(WAIT)
        assert not thread.is_alive(), "the worker did not stop"
        if errors:
            raise errors[0]


class _CountingQueue(alk.Queue):
    """A queue handle that counts its claims (to see a worker claim, or spin)."""

    def __init__(self, store: alk.Store, name: str) -> None:
        super().__init__(store, name, store.queue(name).opts)
        self.claims = 0

    def claim_batch(self, worker_id: str, n: int) -> list[alk.JobHandle]:
        self.claims += 1
        return super().claim_batch(worker_id, n)


def test_resume_and_a_raised_limit_wake_an_idle_worker(dbstore: alk.Store, qname: str) -> None:
    q = _CountingQueue(dbstore, qname)
    q.pause()
    q.enqueue_many([1, 2])
    done: list[Any] = []
    release = threading.Event()

    def handler(job: alk.Job) -> None:
        done.append(job.payload)
        if job.payload == 1:
            release.wait(WAIT)

    with _worker(dbstore, q, handler, concurrency=2, poll_interval=NO_POLL):
        # its first claim finds the queue paused: it sleeps for an hour unless woken
        wait_for(lambda: q.claims >= 1, "the worker's first claim")
        q.set_concurrency(1)  # still paused: nothing to hand out
        q.resume()
        wait_for(lambda: done == [1], "the resume to wake the worker")
        q.set_concurrency(2)  # job 1 holds the only place: raising the limit must wake it
        wait_for(lambda: sorted(done) == [1, 2], "the raised limit to wake the worker")
        release.set()


@pytest.mark.parametrize("limit", ["concurrency", "rate", "paused"])
def test_a_worker_held_back_by_its_limits_does_not_spin(dbstore: alk.Store, qname: str, limit: str) -> None:
    """Jobs are ready the whole time, so the next-due time says "now": without the limits'
    own wait the worker would claim every millisecond. Claims are counted, not timed."""
    q = _CountingQueue(dbstore, qname)
    q.enqueue_many(list(range(20)))
    started = threading.Event()
    release = threading.Event()

    def handler(job: alk.Job) -> None:
        started.set()
        release.wait(WAIT)

    if limit == "concurrency":
        q.set_concurrency(1)
    elif limit == "rate":
        q.set_rate_limit(1, per=3600)
    else:
        q.pause()
    with _worker(dbstore, q, handler, concurrency=4, poll_interval=NO_POLL):
        if limit == "paused":
            wait_for(lambda: q.claims >= 1, "the worker's first claim")
        else:
            assert started.wait(WAIT)
        before = q.claims
        threading.Event().wait(1.0)  # a spinning worker claims hundreds of times meanwhile
        spins = q.claims - before
        release.set()
    assert spins <= 3, f"{spins} claims in 1 s while the queue's limits held every claim back"


def test_a_concurrency_limited_worker_claims_again_when_its_own_job_finishes(dbstore: alk.Store, qname: str) -> None:
    """The worker's own finished job makes room: it claims the next one at once, not at
    its (hour-long) re-poll."""
    q = dbstore.queue(qname)
    q.set_concurrency(1)
    q.enqueue_many(list(range(5)))
    done: list[int] = []
    with _worker(dbstore, qname, lambda job: done.append(job.payload), concurrency=4, poll_interval=NO_POLL):
        wait_for(lambda: len(done) == 5, "the queue to drain one job at a time")
    assert sorted(done) == [0, 1, 2, 3, 4]


def test_own_job_finishing_while_the_claim_reads_the_limit_still_wakes_the_queue(
    dbstore: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between the claim's read of the limit (full: our job still runs) and its
    note that the queue is capped: our job finishing right then (its ack written, the
    claimer told) must still wake the queue, not leave it to the hour-long re-poll. The
    interleaving is forced: the job finishes after the read, before the read returns."""
    from alkstore_sa.worker import claimer as claimer_mod

    q = dbstore.queue(qname)
    q.set_concurrency(1)
    q.enqueue_many([0, 1])
    read_done, told = threading.Event(), threading.Event()
    real_limit_wait, real_finished = claimer_mod.limit_wait, claimer_mod.Claimer.finished
    reads: list[Any] = []

    def limit_wait(store: alk.Store, queue: str) -> Any:
        held = real_limit_wait(store, queue)
        reads.append(held)
        if len(reads) == 1:
            read_done.set()  # the job may finish now...
            told.wait(WAIT)  # ...and has, before this read is acted on
        return held

    def finished(self: Any, queue: str) -> None:
        real_finished(self, queue)
        told.set()

    monkeypatch.setattr(claimer_mod, "limit_wait", limit_wait)
    monkeypatch.setattr(claimer_mod.Claimer, "finished", finished)
    done: list[int] = []

    def handler(job: alk.Job) -> None:
        if job.payload == 0:
            read_done.wait(WAIT)
        done.append(job.payload)

    with _worker(dbstore, qname, handler, concurrency=4, poll_interval=NO_POLL):
        wait_for(lambda: len(done) == 2, "the second job, claimed on our own job's finish")
    assert reads[0] is not None and reads[0][1], "the first read saw the limit full"
    assert sorted(done) == [0, 1]


# -- burst: "exits once no job is ready" (SPEC §11), limits included -----------------------------


def _burst(store: alk.Store, qname: str, done: list[Any], **kw: Any) -> None:
    """Run a burst worker on ``qname`` in a thread; fail (stopping it) if it is still
    running after WAIT."""
    worker = alk.Worker(store, qname, lambda job: done.append(job.payload), poll_interval=0.2, **kw)
    stop = alk.StopToken()
    thread = threading.Thread(target=worker.run, args=(stop,), kwargs={"burst": True}, daemon=True)
    thread.start()
    thread.join(WAIT)
    if thread.is_alive():
        stop.stop()
        thread.join(WAIT)
        raise AssertionError(f"the burst worker still ran after {WAIT}s (ran {sorted(done)})")


def test_burst_waits_out_the_rate_window_for_ready_jobs(dbstore: alk.Store, qname: str) -> None:
    """Ready jobs held back by a rate limit are still ready: time alone lets them through,
    so a burst runs them all before it ends (it ended after the first window's two)."""
    q = dbstore.queue(qname)
    q.set_rate_limit(2, per=0.5)
    q.enqueue_many(list(range(5)))
    done: list[Any] = []
    _burst(dbstore, qname, done, concurrency=4)
    assert sorted(done) == [0, 1, 2, 3, 4]


def test_burst_waits_for_room_under_another_workers_concurrency(dbstore: alk.Store, qname: str) -> None:
    """The queue's one place is held by a claim made elsewhere: its ready jobs wait for it,
    and so does the burst (it ended at once, leaving them)."""
    q = dbstore.queue(qname)
    q.set_concurrency(1)
    q.enqueue("elsewhere", priority=10)
    (held,) = q.claim_batch("other-worker", 1)
    q.enqueue_many([1, 2, 3])
    done: list[Any] = []
    timer = threading.Timer(0.5, held.ack)
    timer.start()
    try:
        _burst(dbstore, qname, done, concurrency=2)
    finally:
        timer.cancel()
    assert sorted(done) == [1, 2, 3]


def test_burst_ends_with_a_paused_queue_left_as_it_is(dbstore: alk.Store, qname: str) -> None:
    """Only a resume lets a paused queue's jobs through: the burst ends, leaving them."""
    q = dbstore.queue(qname)
    q.pause()
    q.enqueue_many([1, 2])
    done: list[Any] = []
    _burst(dbstore, qname, done)
    assert done == []
    assert q.stats().ready == 2


@pytest.mark.parametrize(
    ("rate_limit", "rate_per"), [(0, 5.0), (-3, 5.0), (1, math.inf)], ids=["zero", "negative", "infinite-window"]
)
def test_burst_ends_with_a_rate_written_by_hand_that_never_lets_a_job_through(
    db: Target, dbstore: alk.Store, qname: str, rate_limit: int, rate_per: float
) -> None:
    """A settings row written by hand (the API takes a limit of at least 1 and a finite
    window) with a rate limit of 0 (an operator's way to stop a queue) or an infinite window
    that is full: time alone never lets a job through, as with a pause, yet the limits
    said to wait for the window (forever, or 0 s over and over), so a burst worker never
    ended. Only a change of the settings can let them through: the burst ends, leaving
    them, and the limits say so."""
    q = dbstore.queue(qname)
    q.set_rate_limit(1, per=60)
    q.enqueue_many([1, 2, 3])
    assert q.claim_one("w") is not None  # the window holds one claim
    db.execute(
        f"UPDATE {db.table('alkstore_queue_settings')} SET rate_limit = :n, rate_per = :per WHERE queue = :q",
        n=rate_limit, per=rate_per, q=qname,
    )
    assert _limits.limit_wait(dbstore, qname) == (None, False)
    done: list[Any] = []
    _burst(dbstore, qname, done)
    assert done == []
    assert q.stats().ready == 2


def test_burst_on_a_rate_limited_queue_with_nothing_ready_ends_at_once(dbstore: alk.Store, qname: str) -> None:
    """A full rate window over an empty queue is nothing to wait for (an hour, here)."""
    q = dbstore.queue(qname)
    q.set_rate_limit(1, per=3600)
    q.enqueue("only")
    done: list[Any] = []
    _burst(dbstore, qname, done)
    assert done == ["only"]
