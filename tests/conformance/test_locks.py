"""Locks (SPEC §8) on both engines, with the injected clock: the acquire/renew/release/holder
truth table over every lease state, expiry then takeover, a lapsed holder learning of its
loss from ``renew``, and validation that raises typed errors before any SQL runs."""

from __future__ import annotations

import hashlib
import math
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import alkstore_sa as alk
from tests.support import FakeClock, Target

TTL = 10.0
ME, OTHER = "me", "other"


@pytest.fixture
def lname(request: pytest.FixtureRequest) -> str:
    """A lock name unique to this test (tests in one PostgreSQL module share a schema)."""
    return "lk-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]


def lock_rows(db: Target) -> list[tuple[object, ...]]:
    with db.engine.connect() as c:
        return [
            tuple(r)
            for r in c.exec_driver_sql(
                f"SELECT name, owner, acquired_at, expires_at FROM {db.table('alkstore_locks')} "
                "ORDER BY name"
            )
        ]


def info(lk: alk.Lock) -> tuple[str, float, float] | None:
    h = lk.holder()
    if h is None:
        return None
    assert h.name == lk.name
    return h.owner, h.acquired_at.timestamp(), h.expires_at.timestamp()


# -- the truth table ------------------------------------------------------------------------

STATES = ["free", "released", "held-by-me", "held-by-other", "lapsed-mine", "lapsed-other"]


def setup_state(lk: alk.Lock, clock: FakeClock, state: str) -> None:
    if state == "released":
        assert lk.acquire(ME, TTL) and lk.release(ME)
    elif state in ("held-by-me", "lapsed-mine"):
        assert lk.acquire(ME, TTL)
    elif state in ("held-by-other", "lapsed-other"):
        assert lk.acquire(OTHER, TTL)
    if state.startswith("lapsed"):
        clock.advance(TTL)  # exactly at expires_at the lease is over (expires_at <= now)
    clock.advance(1.0)


# what ME gets from each operation, per state
EXPECT = {
    #                  acquire renew  release holder
    "free":          (True,  False, False, None),
    "released":      (True,  False, False, None),
    "held-by-me":    (True,  True,  True,  ME),
    "held-by-other": (False, False, False, OTHER),
    "lapsed-mine":   (True,  False, False, None),
    "lapsed-other":  (True,  False, False, None),
}


@pytest.mark.parametrize("state", STATES)
def test_truth_table_acquire(store: alk.Store, clock: FakeClock, lname: str, state: str) -> None:
    lk = store.lock(lname)
    setup_state(lk, clock, state)
    before = info(lk)
    got = lk.acquire(ME, 30)
    assert got is EXPECT[state][0]
    now = clock()
    if got:
        owner, acquired_at, expires_at = info(lk)  # type: ignore[misc]
        assert owner == ME and expires_at == now + 30
        if state == "held-by-me":
            assert before is not None
            assert acquired_at == before[1]  # extending a live lease keeps its start
        elif state != "lapsed-mine":  # (that case has its own test below)
            assert acquired_at == now  # a new tenure starts now
    else:
        assert info(lk) == before  # refused: nothing changed


@pytest.mark.parametrize("state", STATES)
def test_truth_table_renew(store: alk.Store, clock: FakeClock, lname: str, state: str) -> None:
    lk = store.lock(lname)
    setup_state(lk, clock, state)
    before = info(lk)
    got = lk.renew(ME, 30)
    assert got is EXPECT[state][1]
    if got:
        assert before is not None
        assert info(lk) == (ME, before[1], clock() + 30)
    else:
        assert info(lk) == before
        if state.startswith("lapsed"):
            assert lk.holder() is None  # a refused renew never revives a lapsed lease


@pytest.mark.parametrize("state", STATES)
def test_truth_table_release(store: alk.Store, clock: FakeClock, lname: str, state: str) -> None:
    lk = store.lock(lname)
    setup_state(lk, clock, state)
    before = info(lk)
    got = lk.release(ME)
    assert got is EXPECT[state][2]
    if got:
        assert lk.holder() is None
        assert lk.acquire(OTHER, TTL)  # released means anyone may take it at once
    else:
        assert info(lk) == before


@pytest.mark.parametrize("state", STATES)
def test_truth_table_holder(store: alk.Store, clock: FakeClock, lname: str, state: str) -> None:
    lk = store.lock(lname)
    setup_state(lk, clock, state)
    h = lk.holder()
    expected = EXPECT[state][3]
    if expected is None:
        assert h is None
    else:
        assert h is not None and h.owner == expected
        assert isinstance(h, alk.LockInfo) and h.name == lname
        assert h.expires_at.timestamp() == clock() - 1.0 + TTL
        assert h.expires_at.tzinfo is not None
    # holder() is a read: calling it changes nothing
    assert lk.holder() == h


def test_renew_sets_an_absolute_deadline(store: alk.Store, clock: FakeClock, lname: str) -> None:
    lk = store.lock(lname)
    assert lk.acquire(ME, 100)
    clock.advance(5)
    assert lk.renew(ME, 10)  # now + 10, even though the old deadline was later
    assert info(lk) == (ME, clock() - 5, clock() + 10)
    assert lk.renew(ME, timedelta(minutes=2))
    assert info(lk) == (ME, clock() - 5, clock() + 120)


def test_release_by_another_owner_is_refused(store: alk.Store, lname: str) -> None:
    lk = store.lock(lname)
    assert lk.acquire(OTHER, TTL)
    assert lk.release(ME) is False
    assert lk.renew(ME, TTL) is False
    assert lk.holder() is not None and lk.holder().owner == OTHER  # type: ignore[union-attr]
    assert lk.release(OTHER) is True
    assert lk.release(OTHER) is False  # second release: nothing held any more


def test_handles_share_the_lease_and_locks_are_independent(
    db: Target, store: alk.Store, lname: str
) -> None:
    a, b = store.lock(lname), store.lock(lname + "-b")
    assert a.acquire(ME, TTL) and b.acquire(OTHER, TTL)
    other_store = db.store(clock=store.clock)
    try:
        # another Store (another process, in real life) sees the same lease
        same = other_store.lock(lname)
        assert same.acquire(OTHER, TTL) is False
        assert same.holder().owner == ME  # type: ignore[union-attr]
    finally:
        other_store.close()
    assert b.holder().owner == OTHER  # type: ignore[union-attr]


# -- expiry, takeover, and the lapsed holder --------------------------------------------------


def test_expiry_then_takeover(store: alk.Store, clock: FakeClock, lname: str) -> None:
    lk = store.lock(lname)
    t0 = clock()
    assert lk.acquire(ME, TTL)
    clock.advance(TTL - 0.001)
    assert lk.acquire(OTHER, TTL) is False  # a hair before the deadline: still mine
    assert info(lk) == (ME, t0, t0 + TTL)
    clock.advance(0.001)  # exactly at the deadline: lapsed, silently
    assert lk.holder() is None
    assert lk.acquire(OTHER, TTL) is True
    assert info(lk) == (OTHER, clock(), clock() + TTL)
    # the old holder learns of its loss only now, and changes nothing
    assert lk.renew(ME, TTL) is False
    assert lk.release(ME) is False
    assert lk.acquire(ME, TTL) is False
    assert info(lk) == (OTHER, clock(), clock() + TTL)


def test_lapsed_holders_renew_returns_false_even_when_nobody_took_it(
    store: alk.Store, clock: FakeClock, lname: str
) -> None:
    lk = store.lock(lname)
    assert lk.acquire(ME, TTL)
    clock.advance(TTL / 2)
    assert lk.renew(ME, TTL)  # in time: extended to now + TTL
    clock.advance(TTL + 5)  # renewed too late
    assert lk.renew(ME, TTL) is False
    assert lk.holder() is None
    assert lk.release(ME) is False
    # it must acquire again, like anyone else
    assert lk.acquire(ME, TTL) is True
    assert lk.holder().owner == ME  # type: ignore[union-attr]


def test_reacquiring_ones_own_lapsed_lease_starts_a_new_tenure(
    store: alk.Store, clock: FakeClock, lname: str
) -> None:
    """A lapsed lease is over, even if nobody else took it meanwhile: acquiring it again is a
    new tenure, so ``acquired_at`` is the new acquisition time (the holder did not hold the
    lock during the gap; ``acquired_at`` must not claim it did)."""
    lk = store.lock(lname)
    assert lk.acquire(ME, TTL)
    clock.advance(TTL + 20)
    assert lk.holder() is None
    assert lk.acquire(ME, TTL)
    assert info(lk) == (ME, clock(), clock() + TTL)


# -- validation: typed errors, nothing written ------------------------------------------------

BAD_NAMES = [
    "",
    "__alkstore_scheduler",
    "__alkstore",
    "__alkstore_mine",
    "a\x00b",
    "x" * 201,
    "\ud800",
    None,
    7,
    b"bytes",
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_lock_names_raise_invalid_name(db: Target, store: alk.Store, name: object) -> None:
    before = lock_rows(db)
    with pytest.raises(alk.InvalidName):
        store.lock(name)  # type: ignore[arg-type]
    assert lock_rows(db) == before


BAD_OWNERS = ["", None, 5, "x" * 201, "a\x00b", "\udc80"]


@pytest.mark.parametrize("owner", BAD_OWNERS, ids=repr)
@pytest.mark.parametrize("op", ["acquire", "renew", "release"])
def test_bad_owner_raises_invalid_options(
    db: Target, store: alk.Store, lname: str, op: str, owner: object
) -> None:
    lk = store.lock(lname)
    before = lock_rows(db)
    args = (owner,) if op == "release" else (owner, TTL)
    with pytest.raises(alk.InvalidOptions):
        getattr(lk, op)(*args)
    assert lock_rows(db) == before


def test_an_owner_is_a_label_the_name_rules_do_not_apply_to(
    db: Target, store: alk.Store, lname: str
) -> None:
    """SPEC §3 lists no owner among the names: an owner with the reserved prefix is an
    ordinary label on the caller's own lock, and the scheduler's lock stays out of reach
    (its name is reserved, and a runner's owner is its own random id)."""
    before = lock_rows(db)
    lk = store.lock(lname)
    assert lk.acquire("__alkstore_scheduler", TTL) is True
    assert lk.holder().owner == "__alkstore_scheduler"  # type: ignore[union-attr]
    assert lk.release("__alkstore_scheduler") is True
    with pytest.raises(alk.InvalidName):
        store.lock("__alkstore_scheduler")
    assert lock_rows(db) == before


BAD_TTLS = [0, 0.0, -1, -0.001, math.nan, math.inf, -math.inf, "10", True, None, 1e12, [1]]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
@pytest.mark.parametrize("op", ["acquire", "renew"])
def test_bad_ttl_raises_invalid_options(
    db: Target, store: alk.Store, lname: str, op: str, ttl: object
) -> None:
    lk = store.lock(lname)
    if op == "renew":
        assert lk.acquire(ME, TTL)
    before = lock_rows(db)
    with pytest.raises(alk.InvalidOptions):
        getattr(lk, op)(ME, ttl)
    assert lock_rows(db) == before


@pytest.mark.parametrize("ttl", [1e-7, 0.0009, timedelta(microseconds=999)], ids=repr)
def test_a_ttl_under_a_millisecond_is_refused_so_two_owners_are_never_both_told_they_hold(
    db: Target, store: alk.Store, lname: str, ttl: object
) -> None:
    """now + 1e-7 is now again in epoch seconds (a float's step there is 2.4e-7): such a
    lease lapsed as it was written, yet acquire said True, to each owner in turn. Leases
    are at least a millisecond (SPEC §1: timestamps at millisecond precision)."""
    lk = store.lock(lname)
    for op in ("acquire", "renew"):
        with pytest.raises(alk.InvalidOptions, match="0.001"):
            getattr(lk, op)(ME, ttl)
    assert [r for r in lock_rows(db) if r[0] == lname] == []
    assert lk.acquire(ME, 0.001) and not lk.acquire(OTHER, 0.001)
    with pytest.raises(alk.InvalidOptions, match="0.001"):
        store.run_schedules(alk.StopToken(), lease=0.0005)


def test_a_lock_handle_writes_nothing_and_closed_store_raises(
    db: Target, store: alk.Store, lname: str
) -> None:
    before = lock_rows(db)
    lk = store.lock(lname)
    assert lock_rows(db) == before
    assert lk.holder() is None
    store.close()
    with pytest.raises(alk.StoreClosed):
        lk.acquire(ME, TTL)
    with pytest.raises(alk.StoreClosed):
        lk.holder()
    with pytest.raises(alk.StoreClosed):
        store.lock(lname)


def test_a_lock_whose_expiry_is_no_number_reads_as_held(
    db: Target, store: alk.Store, clock: FakeClock, lname: str
) -> None:
    """A lock row whose expires_at was written by hand as NaN (PostgreSQL) or text (SQLite
    keeps it): each database orders it above every number, so the lock never lapses — no
    other owner acquires it — yet holder() read its expiry as the calendar's first instant,
    a lease that looked lapsed since year 1. It reads as the last instant, as held forever
    as it is (an infinite expiry reads so too)."""
    lock = store.lock(lname)
    assert lock.acquire("a", 10)
    stored = math.nan if db.kind == "postgresql" else "later"
    db.execute(f"UPDATE {db.table('alkstore_locks')} SET expires_at = :e WHERE name = :n", e=stored, n=lname)
    clock.advance(3600)
    assert lock.acquire("b", 10) is False
    holder = lock.holder()
    assert holder is not None and holder.owner == "a"
    assert holder.expires_at == datetime.max.replace(tzinfo=timezone.utc)


def _documented_cleanup(kind: str) -> str:
    """The statement docs/locks.md gives for deleting rows lapsed for a day, on ``kind``."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "locks.md").read_text()
    statements = re.findall(r"`(DELETE FROM [^`]+)`", text)
    pg, sqlite = (s for s in statements if "alkstore_locks" in s)
    return sqlite if kind == "sqlite" else pg


def test_the_documented_cleanup_deletes_only_rows_lapsed_for_a_day(db: Target, lname: str) -> None:
    """docs/locks.md's cleanup statement, as written there (the table under its default
    schema and name, which the test's schema stands in for): a row lapsed two days ago goes;
    a live lease and one lapsed an hour ago stay. It must run on the oldest SQLite the
    library supports (3.35: ``unixepoch()`` came in 3.38)."""
    clock = FakeClock(time.time() - 2 * 86400)
    old = alk.Store(db.engine, schema=db.schema, clock=clock)
    assert old.lock(f"{lname}-old").acquire("a", 60)
    clock.advance(2 * 86400 - 3600 - 60)
    assert old.lock(f"{lname}-recent").acquire("a", 60)
    now = alk.Store(db.engine, schema=db.schema)  # the database statement reads the real clock
    assert now.lock(f"{lname}-live").acquire("a", 600)
    sql = _documented_cleanup(db.kind)
    sql = sql.replace("alkstore.alkstore_locks", db.table("alkstore_locks")) if db.kind == "postgresql" else sql
    with db.engine.begin() as c:
        c.exec_driver_sql(sql)
    names = {r[0] for r in lock_rows(db)}
    old.close()
    now.close()
    assert f"{lname}-old" not in names
    assert {f"{lname}-recent", f"{lname}-live"} <= names
