"""SPEC §5.4: the job handle — validity predicate, one-shot ops, heartbeat, retry curve."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

import alkstore_sa as alk
from alkstore_sa._backoff import backoff_delay
from alkstore_sa._validate import MAX_DURATION, MIN_LEASE
from tests.conftest import require_pg
from tests.fresh_pg import fresh_pg_database
from tests.support import FakeClock, Target


def _ts(clock: FakeClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc)


def _claimed(store: alk.Store, qname: str, **opts: object) -> tuple[alk.Queue, alk.JobHandle]:
    q = store.queue(qname, **opts)  # type: ignore[arg-type]
    q.enqueue({"n": 1})
    h = q.claim_one("w")
    assert h is not None
    return q, h


@pytest.mark.parametrize("op", ["ack", "retry", "fail", "heartbeat"])
def test_lapsed_claim_refuses_every_op(store: alk.Store, qname: str, clock: FakeClock, op: str) -> None:
    q, h = _claimed(store, qname, visibility_timeout=10)
    clock.advance(10)  # deadline reached: no longer valid
    before = q.get_job(h.id)
    result = {"ack": h.ack, "retry": lambda: h.retry("e"), "fail": h.fail, "heartbeat": lambda: h.heartbeat(30)}[op]()
    assert result is False
    assert q.get_job(h.id) == before  # nothing changed


def test_reclaim_invalidates_the_earlier_holder(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, first = _claimed(store, qname, visibility_timeout=10)
    clock.advance(11)
    second = q.claim_one("w")  # same worker_id: the claim, not the id, is what counts
    assert second is not None and second.id == first.id
    assert first.heartbeat(100) is False
    assert first.ack() is False
    assert q.get_job(first.id).state == "processing"  # type: ignore[union-attr]
    assert second.ack() is True


def test_same_worker_id_cannot_ack_another_claim(store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    q.enqueue_many([1, 2])
    a, b = q.claim_batch("dup", 2)
    forged = alk.JobHandle(q, b.job.__class__(**{**a.job.__dict__, "attempts": 2}))
    assert forged.ack() is False  # another attempt number is another claim
    assert a.ack() is True and b.ack() is True


def test_one_shot_ops_raise_handle_consumed(store: alk.Store, qname: str) -> None:
    q, h = _claimed(store, qname)
    assert h.ack() is True
    for op in (h.ack, lambda: h.retry("x"), h.fail, lambda: h.heartbeat(5)):
        with pytest.raises(alk.HandleConsumed):
            op()


def test_refused_op_still_consumes(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, h = _claimed(store, qname, visibility_timeout=5)
    clock.advance(6)
    assert h.fail("late") is False
    with pytest.raises(alk.HandleConsumed):
        h.ack()


def test_invalid_argument_does_not_consume(store: alk.Store, qname: str) -> None:
    q, h = _claimed(store, qname)
    with pytest.raises(alk.InvalidOptions):
        h.retry("e", delay=-1)
    with pytest.raises(alk.InvalidOptions):
        h.heartbeat(0)
    assert h.ack() is True


def test_heartbeat_is_an_absolute_reset(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, h = _claimed(store, qname, visibility_timeout=100)
    clock.advance(10)
    assert h.heartbeat(5) is True
    assert q.get_job(h.id).claim_expires_at == _ts(clock, 5)  # type: ignore[union-attr]  # not 100+5
    clock.advance(4)
    assert h.heartbeat(20) is True and h.heartbeat(20) is True
    clock.advance(19)
    assert h.ack() is True


def test_late_heartbeat_is_refused_and_steals_nothing(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, h = _claimed(store, qname, visibility_timeout=10)
    clock.advance(10.5)
    assert h.heartbeat(60) is False
    other = q.claim_one("w2")
    assert other is not None and other.id == h.id


def test_retry_with_explicit_delay(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q, h = _claimed(store, qname)
    assert h.retry("temporary", delay=30) is True
    job = q.get_job(h.id)
    assert job is not None and job.state == "pending" and job.run_at == _ts(clock, 30)
    assert job.errors == [{"attempt": 1, "error": "temporary", "at": _ts(clock)}]
    assert q.claim_one("w") is None
    clock.advance(30)
    again = q.claim_one("w")
    assert again is not None and again.job.attempts == 2


def test_retry_uses_the_backoff_curve(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, backoff_base=4, max_attempts=10)
    job_id = q.enqueue(1)
    for attempt in range(1, 5):
        h = q.claim_one("w")
        assert h is not None and h.job.attempts == attempt
        assert h.retry(f"e{attempt}") is True
        delay = (q.get_job(job_id).run_at - _ts(clock)).total_seconds()  # type: ignore[union-attr]
        c = 4 * 2 ** (attempt - 1)
        assert math.ceil(c / 2) <= delay <= c and delay == int(delay)
        clock.advance(delay)
    assert [e["attempt"] for e in q.get_job(job_id).errors] == [1, 2, 3, 4]  # type: ignore[union-attr]


def _retried_on_a_hand_written_base(db: Target, store: alk.Store, qname: str, base: float) -> float:
    """Claim a job whose backoff_base stamp was written by hand as ``base``, retry it on the
    curve, and return its delay."""
    q = store.queue(qname, max_attempts=5)
    job_id = q.enqueue(1)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET backoff_base = :b WHERE id = :id", b=base, id=job_id)
    h = q.claim_one("w")
    assert h is not None and h.id == job_id
    now = store.now()
    assert h.retry("boom") is True
    job = q.get_job(job_id)
    assert job is not None and job.state == "pending" and [e["error"] for e in job.errors] == ["boom"]
    return job.run_at.timestamp() - now  # type: ignore[operator]


@pytest.mark.parametrize(
    ("base", "lo", "hi"), [(-math.inf, 0, 0), (-5.0, 0, 0), (math.inf, 1800, 3600)], ids=["-inf", "negative", "inf"]
)
def test_retry_on_the_curve_of_a_backoff_base_written_by_hand_lands(
    db: Target, store: alk.Store, qname: str, base: float, lo: float, hi: float
) -> None:
    """A job row whose backoff_base stamp was written by hand as minus infinity (the API
    takes 0 to 100 years): the curve raised OverflowError in retry (not even an
    AlkstoreError), so a worker's retry of a raising handler was lost and the job died only
    by reclaim exhaustion. The curve takes a base below zero as zero (a retry now, as a
    negative base already did) and an infinite one as the cap."""
    delay = _retried_on_a_hand_written_base(db, store, qname, base)
    assert lo <= delay <= hi


def test_retry_on_the_curve_of_a_nan_backoff_base_lands(pg_db: Target, clock: FakeClock, qname: str) -> None:
    """The same for a backoff_base of NaN, which only PostgreSQL stores (SQLite stores NaN
    as NULL, and the column is NOT NULL): ValueError in retry, the outcome lost. NaN is
    no base: zero, a retry now."""
    store = pg_db.store(clock=clock)
    try:
        assert _retried_on_a_hand_written_base(pg_db, store, qname, math.nan) == 0
    finally:
        store.close()


def test_retry_on_the_curve_of_a_text_backoff_base_lands(sqlite_db: Target, clock: FakeClock, qname: str) -> None:
    """The same for a backoff_base of text, which SQLite keeps in the REAL column: the retry
    raised ValueError (its outcome lost), and so did get_job. Text is no number: read as
    NaN, no base — a retry now."""
    store = sqlite_db.store(clock=clock)
    try:
        assert _retried_on_a_hand_written_base(sqlite_db, store, qname, "five") == 0  # type: ignore[arg-type]
        job = store.queue(qname).get_job(store.queue(qname).enqueue(2))
        assert job is not None
        sqlite_db.execute("UPDATE alkstore_jobs SET backoff_base = 'five', dead_letter_retention = 'a day'")
        job = store.queue(qname).get_job(job.id)
        assert job is not None and math.isnan(job.backoff_base) and math.isnan(job.dead_letter_retention)  # type: ignore[arg-type]
    finally:
        store.close()


def _claimed_on_a_hand_written_visibility_timeout(
    db: Target, store: alk.Store, qname: str, stamp: object
) -> tuple[alk.JobHandle, float]:
    """Claim a job whose visibility_timeout stamp was written by hand as ``stamp``: its
    handle, and the claim's lease (its deadline as stored, less the claim's instant)."""
    q = store.queue(qname)
    job_id = q.enqueue(1)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET visibility_timeout = :v WHERE id = :id", v=stamp, id=job_id)
    now = store.now()
    h = q.claim_one("w")
    assert h is not None and h.id == job_id
    job = q.get_job(job_id)
    assert job is not None and job.claim_expires_at is not None
    assert h.job.claim_expires_at == job.claim_expires_at  # the handle holds what was stored
    return h, job.claim_expires_at.timestamp() - now


@pytest.mark.parametrize(
    ("stamp", "lease"),
    [(-100.0, MIN_LEASE), (0.0, MIN_LEASE), (1e-300, MIN_LEASE), (math.inf, MAX_DURATION), (1e300, MAX_DURATION)],
    ids=["negative", "zero", "tiny", "inf", "huge"],
)
def test_a_claim_on_a_visibility_timeout_written_by_hand_leases_within_the_api_range(
    db: Target, store: alk.Store, qname: str, stamp: float, lease: float
) -> None:
    """A job row whose visibility_timeout stamp was written by hand outside what the API
    takes (1 ms to 100 years): the claim's deadline was the stamp as it stood — a claim
    that had lapsed before it was made (negative), or one set past the calendar (infinite,
    read as year 9999). A claim leases the stamp within that range."""
    h, taken = _claimed_on_a_hand_written_visibility_timeout(db, store, qname, stamp)
    assert taken == pytest.approx(lease, abs=1e-5)
    assert h._visibility_timeout == lease  # what the worker's heartbeats extend it by


def test_a_claim_on_a_nan_visibility_timeout_leases_the_longest(pg_db: Target, clock: FakeClock, qname: str) -> None:
    """NaN, which only PostgreSQL stores (and orders above every number): the claim's
    deadline was NaN — never lapsing, and read back as year 1, a claim that looked lapsed.
    It leases the longest span, as infinity does."""
    store = pg_db.store(clock=clock)
    try:
        h, taken = _claimed_on_a_hand_written_visibility_timeout(pg_db, store, qname, math.nan)
        assert taken == pytest.approx(MAX_DURATION, abs=1e-5) and h._visibility_timeout == MAX_DURATION
    finally:
        store.close()


def test_a_claim_on_a_text_visibility_timeout_leases_the_longest(sqlite_db: Target, clock: FakeClock, qname: str) -> None:
    """Text, which SQLite keeps in the column (and orders above every number): the claim
    raised TypeError (not even an AlkstoreError) at every try, so no claim of the queue got
    past the job. It leases the longest span, as infinity does, and reads as NaN."""
    store = sqlite_db.store(clock=clock)
    try:
        h, taken = _claimed_on_a_hand_written_visibility_timeout(sqlite_db, store, qname, "five minutes")
        assert taken == pytest.approx(MAX_DURATION, abs=1e-5) and h._visibility_timeout == MAX_DURATION
        assert math.isnan(h.job.visibility_timeout)
    finally:
        store.close()


def test_backoff_curve_range_and_distribution() -> None:
    for base, attempts in [(5, 1), (5, 3), (1, 10), (7.5, 2)]:
        c = min(base * 2 ** (attempts - 1), 3600)
        draws = Counter(backoff_delay(base, attempts) for _ in range(4000))
        lo, hi = math.ceil(c / 2), math.floor(c)
        assert set(draws) == set(map(float, range(lo, hi + 1)))  # every integer, nothing else
        expected = 4000 / (hi - lo + 1)
        assert all(abs(n - expected) < 5 * math.sqrt(expected) + 5 for n in draws.values())


def test_backoff_curve_cap_and_huge_attempts() -> None:
    for attempts in (13, 30, 64, 1000, 2**31 - 1):
        d = backoff_delay(5, attempts)
        assert 1800 <= d <= 3600
    assert backoff_delay(0, 5) == 0


def test_retry_at_budget_goes_dead(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, max_attempts=2, backoff_base=0)
    job_id = q.enqueue("x")
    h = q.claim_one("w")
    assert h is not None and h.retry("first") is True
    h = q.claim_one("w")
    assert h is not None and h.retry("second") is True
    job = q.get_job(job_id)
    assert job is not None and job.state == "dead" and job.last_error == "max attempts exceeded"
    assert [e["error"] for e in job.errors] == ["first", "second"]
    assert job.died_at == _ts(clock)


def test_fail_none_says_failed(store: alk.Store, qname: str) -> None:
    q, h = _claimed(store, qname)
    assert h.fail() is True
    job = q.get_job(h.id)
    assert job is not None and job.state == "dead" and job.last_error == "failed" and job.errors == []


def test_fail_keeps_stamps_and_history(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=20, max_attempts=4, backoff_base=0, dead_letter_retention=99)
    job_id = q.enqueue({"k": "v"}, priority=3, expires=1000)
    h = q.claim_one("w")
    assert h is not None and h.retry("one") is True
    h = q.claim_one("w-last")
    assert h is not None and h.fail("two") is True
    job = q.get_job(job_id)
    assert job is not None
    assert (job.payload, job.priority, job.attempts, job.max_attempts) == ({"k": "v"}, 3, 2, 4)
    assert (job.visibility_timeout, job.backoff_base, job.dead_letter_retention) == (20, 0, 99)
    assert job.worker_id == "w-last" and job.expires_at == _ts(clock, 1000)
    assert [(e["attempt"], e["error"]) for e in job.errors] == [(1, "one"), (2, "two")]
    assert job.last_error == "two"


def test_error_text_with_nul_is_stored(store: alk.Store, qname: str) -> None:
    q, h = _claimed(store, qname)
    assert h.fail("bad\x00byte") is True
    job = q.get_job(h.id)
    assert job is not None and job.last_error == "bad\ufffdbyte"


@pytest.mark.parametrize("op", ["retry", "fail"])
def test_an_error_text_past_the_most_a_history_entry_holds_is_stored_cut(store: alk.Store, qname: str, op: str) -> None:
    """PostgreSQL holds no JSON string past 256 MiB, nor an error history past 256 MiB in
    all: a retry or fail carrying such a text (``Fail(response_body)``) failed in SQL
    (ProgramLimitExceeded), so the outcome was lost — the claim lapsed. Error text is
    stored as given up to 100,000 characters; past that it is cut, saying how many more
    there were (NUL and lone surrogates in what is kept become U+FFFD, as before)."""
    q, h = _claimed(store, qname)
    kept = "\U0001f642\x00\ud800" + "é" * 99_997
    assert getattr(h, op)(kept + "tail") is True
    job = q.get_job(h.id)
    expected = "\U0001f642\ufffd\ufffd" + "é" * 99_997 + "… [4 more characters]"
    assert job is not None and [e["error"] for e in job.errors] == [expected]
    if op == "fail":
        assert job.last_error == expected


def test_handle_ops_on_database_clock(dbstore: alk.Store, qname: str) -> None:
    q = dbstore.queue(qname, visibility_timeout=60)
    q.enqueue_many([1, 2])
    a, b = q.claim_batch("w", 2)
    assert a.heartbeat(120) is True
    assert a.retry("again", delay=0) is True
    assert b.ack() is True
    again = q.claim_one("w")
    assert again is not None and again.id == a.id and again.job.attempts == 2
    assert again.job.errors[0]["error"] == "again"
    assert again.fail() is True


def test_payload_and_job_agree_in_either_order(store: alk.Store, qname: str) -> None:
    """The handle decodes lazily: reading .payload first, or .job first, gives the same value."""
    q = store.queue(qname)
    q.enqueue_many([{"a": [1, 2]}, {"b": None}])
    first, second = q.claim_batch("w", 2)
    assert first.payload == {"a": [1, 2]} and first.job.payload == {"a": [1, 2]}
    assert second.job.payload == {"b": None} and second.payload == {"b": None}
    assert first.job.id == first.id and first.job.attempts == 1


@pytest.fixture(scope="module")
def latin1_url() -> Iterator[str]:
    """A PostgreSQL database in LATIN1 with alkstore installed."""
    require_pg()
    with fresh_pg_database("alklatin", encoding="LATIN1") as url:
        with alk.Store(url) as installer:
            installer.install()
        yield url


@pytest.mark.parametrize("client_encoding", [None, "utf8"])
@pytest.mark.parametrize("op", ["retry", "fail"])
def test_an_error_text_a_latin1_database_cannot_hold_is_stored_escaped(
    latin1_url: str, op: str, client_encoding: str | None
) -> None:
    """A handler's exception in Greek, on a LATIN1 database: the driver (client encoding
    LATIN1, the default) or the server (client encoding UTF8) refused the retry or fail
    that carried it, so the outcome was lost and the job died only by reclaim exhaustion.
    The characters the database cannot hold are stored as Python's backslash escapes;
    the rest (``é`` is LATIN1) as given."""
    url = latin1_url if client_encoding is None else f"{latin1_url}?client_encoding={client_encoding}"
    with alk.Store(url) as store:
        q = store.queue(f"greek-{op}-{client_encoding}", max_attempts=5)
        job_id = q.enqueue({"n": 1})
        h = q.claim_one("w")
        assert h is not None and h.id == job_id
        assert getattr(h, op)("Ωμέγα \U0001f642 é") is True
        job = q.get_job(job_id)
        assert job is not None and job.state == ("pending" if op == "retry" else "dead")
        expected = "\\u03a9\\u03bc\\u03ad\\u03b3\\u03b1 \\U0001f642 é"
        assert [e["error"] for e in job.errors] == [expected]
        if op == "fail":
            assert job.last_error == expected
            assert q.requeue_dead(job_id) is not None


def test_an_error_entry_is_at_the_operations_clock_reading(store: alk.Store, qname: str, clock: FakeClock) -> None:
    """An error history entry's ``at`` is the reading its retry or fail wrote every other
    timestamp with, to the microsecond, on both engines (SQLite wrote it with 15
    significant digits: 10 µs apart from the job's died_at and from PostgreSQL's)."""
    q = store.queue(qname, max_attempts=2, backoff_base=0)
    q.enqueue({"n": 1})
    clock.advance(1.873456)  # a reading whose microseconds need 16 significant digits
    h = q.claim_one("w")
    assert h is not None and h.retry("first", delay=2)
    job = q.get_job(h.id)
    assert job is not None and job.errors[-1]["at"] == _ts(clock) and job.run_at == _ts(clock, 2)
    clock.advance(2.000007)
    h = q.claim_one("w")
    assert h is not None and h.fail("second")
    dead = q.get_job(h.id)
    assert dead is not None and dead.died_at == _ts(clock)
    assert [e["at"] for e in dead.errors] == [job.errors[0]["at"], dead.died_at]
