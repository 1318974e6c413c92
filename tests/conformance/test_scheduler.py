"""The scheduler (SPEC §7) on both engines, mostly on the injected clock: the ``@every``
grammar and its epoch-aligned boundary math, exactly one fire per elapsed boundary, the
64-boundary catch-up cap and skip-forward, re-registration, unschedule, the stamps of fired
jobs, fire + advance atomicity (a failing enqueue or advance rolls the whole fire back), a
rogue second ticker firing nothing, the runner's leadership (LeadershipLost when its lease
is stolen or lapses, a stop returns cleanly and releases), and the maintenance recipe end
to end."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa import _validate as v
from alkstore_sa import scheduler as scheduler_module
from alkstore_sa.scheduler import (
    LEADER_LOCK,
    MAX_CATCHUP,
    Scheduler,
    fires_due,
    next_boundary,
    parse_spec,
)
from tests.conftest import require_pg
from tests.support import (
    WAIT,
    FakeClock,
    Target,
    deepest_accepted,
    drop_pg_schema,
    list_depth,
    new_pg_schema,
    pg_target,
    wait_for,
)

T0 = 1_800_000_000.0  # FakeClock's start: a multiple of 60, 90, 300, 3600, 7200 (not of 86400)


@pytest.fixture(autouse=True)
def _no_leftover_schedules(request: pytest.FixtureRequest) -> None:
    """Tests of one PostgreSQL module share a schema, and a tick fires *every* due
    schedule: each database test starts with no schedules and no leadership lease."""
    if "db" in request.fixturenames:
        db: Target = request.getfixturevalue("db")
        for table in ("alkstore_schedules", "alkstore_locks"):
            db.execute(f"DELETE FROM {db.table(table)}")


def jobs_of(db: Target, queue: str) -> list[dict[str, Any]]:
    cols = [
        "id", "payload", "priority", "max_attempts", "visibility_timeout", "backoff_base",
        "dead_letter_retention", "created_at", "run_at", "expires_at", "state", "attempts",
    ]
    with db.engine.connect() as c:
        rows = c.exec_driver_sql(
            f"SELECT {', '.join(cols)} FROM {db.table('alkstore_jobs')} WHERE queue = %s ORDER BY id"
            if db.kind == "postgresql"
            else f"SELECT {', '.join(cols)} FROM {db.table('alkstore_jobs')} WHERE queue = ? ORDER BY id",
            (queue,),
        ).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def schedule_rows(db: Target) -> list[tuple[Any, ...]]:
    with db.engine.connect() as c:
        return [tuple(r) for r in c.exec_driver_sql(f"SELECT * FROM {db.table('alkstore_schedules')} ORDER BY name")]


def the(store: alk.Store, name: str) -> alk.Schedule:
    found = [s for s in store.schedules() if s.name == name]
    assert len(found) == 1, store.schedules()
    return found[0]


def next_at(store: alk.Store, name: str) -> float:
    return the(store, name).next_fire_at.timestamp()




# -- the grammar and the boundary math --------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "seconds"),
    [
        ("@every 1s", 1), ("@every 90s", 90), ("@every 5m", 300), ("@every 2h", 7200),
        ("@every 1d", 86400), ("@every 60s", 60), ("@every 007m", 420), ("@every 36525d", 36525 * 86400),
    ],
)
def test_parse_spec_units(spec: str, seconds: int) -> None:
    assert parse_spec(spec) == seconds


BAD_SPECS: list[object] = [  # cron expressions and aliases are valid since SPEC §14 (test_cron.py)
    "@every", "@every ",
    "@every 0s", "@every 0d", "@every 00m", "@every 5", "@every 5x", "@every 5ms", "@every s",
    "@every -5s", "@every +5s", "@every 1.5h", "@every 1e3s", "@every 5 s",
    "@every  5s", " @every 5s", "@every 5s ", "@every5s", "@every\t5s", "@every 5s\n",
    "@EVERY 5s", "@Every 5s", "@every 5S", "@every 5M", "@every 5H", "@every 5D",
    "every 5s", "@every \uff15s", "@every 5s,10s", "@every 36526d", "@every 99999999999999999999d", "@every " + "9" * 5000 + "s", "",
    5, 5.0, None, b"@every 5s", ["@every 5s"], timedelta(seconds=5),
]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=lambda spec: repr(spec)[:60])
def test_invalid_spec_raises_with_the_spec_and_writes_nothing(
    db: Target, store: alk.Store, qname: str, spec: object
) -> None:
    with pytest.raises(alk.InvalidSpec) as info:
        parse_spec(spec)
    assert info.value.spec is spec
    before = schedule_rows(db)
    with pytest.raises(alk.InvalidSpec) as info:
        store.schedule("bad-spec", spec, qname, {})  # type: ignore[arg-type]
    assert info.value.spec is spec
    assert isinstance(info.value, alk.AlkstoreError) and isinstance(info.value, ValueError)
    assert schedule_rows(db) == before


def test_next_boundary_is_epoch_aligned_and_strictly_after() -> None:
    assert next_boundary(T0, 60) == T0 + 60  # on a boundary: the next one, not this one
    assert next_boundary(T0 + 0.001, 60) == T0 + 60
    assert next_boundary(T0 + 59.999, 60) == T0 + 60
    assert next_boundary(T0 + 10, 90) == T0 + 90
    assert next_boundary(T0 + 10, 300) == T0 + 300
    assert next_boundary(T0 + 10, 7200) == T0 + 7200
    day = next_boundary(T0 + 10, 86400)
    assert day % 86400 == 0 and T0 < day <= T0 + 86400 and day == 1_800_057_600.0
    assert fires_due(T0 + 60, T0 + 59, 60) == 0
    assert fires_due(T0 + 60, T0 + 60, 60) == 1
    assert fires_due(T0 + 60, T0 + 179.9, 60) == 2
    assert fires_due(T0 + 60, T0 + 180, 60) == 3


@pytest.mark.parametrize(
    ("spec", "expected_next"),
    [
        ("@every 90s", T0 + 90),
        ("@every 5m", T0 + 300),
        ("@every 2h", T0 + 7200),
        ("@every 1d", 1_800_057_600.0),  # the next UTC midnight
    ],
)
def test_registration_sets_the_next_epoch_aligned_boundary(
    store: alk.Store, clock: FakeClock, qname: str, spec: str, expected_next: float
) -> None:
    clock.advance(10)
    store.schedule("b", spec, qname, {"spec": spec})
    s = the(store, "b")
    assert s.spec == spec and s.interval == parse_spec(spec) and s.queue == qname
    assert s.payload == {"spec": spec}
    assert s.next_fire_at.timestamp() == expected_next
    assert s.next_fire_at.tzinfo is not None
    assert s.created_at.timestamp() == s.updated_at.timestamp() == T0 + 10
    # a second schedule registered later in the same interval gets the same boundary
    clock.advance(parse_spec(spec) * 0.5)
    if clock() < expected_next:
        store.schedule("b2", spec, qname, {})
        assert next_at(store, "b2") == expected_next


def test_registered_exactly_on_a_boundary_waits_for_the_next(
    store: alk.Store, clock: FakeClock, qname: str
) -> None:
    store.schedule("on-boundary", "@every 1m", qname, {})
    assert next_at(store, "on-boundary") == T0 + 60
    assert Scheduler(store).tick() == 0
    assert jobs_of_queue(store, qname) == 0


def jobs_of_queue(store: alk.Store, qname: str) -> int:
    st = store.queue(qname).stats()
    return st.pending + st.processing + st.dead


# -- firing: once per boundary, catch-up, skip-forward ----------------------------------------


def test_exactly_one_fire_per_elapsed_boundary(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    sch = Scheduler(store)
    store.schedule("tenner", "@every 10s", qname, {"n": 1})
    assert sch.tick() == 0
    clock.advance(9.999)
    assert sch.tick() == 0
    clock.advance(0.001)  # exactly on the boundary T0+10
    assert sch.tick() == 1
    assert sch.tick() == 0  # same instant again: no double fire
    assert next_at(store, "tenner") == T0 + 20
    total = 1
    for _ in range(40):  # uneven steps: sometimes no boundary, sometimes one, sometimes two
        clock.advance(7.3)
        total += sch.tick()
        assert sch.tick() == 0
    expected = math.floor((clock() - T0) / 10)
    assert total == expected
    assert len(jobs_of(db, qname)) == expected
    assert next_at(store, "tenner") == next_boundary(clock(), 10)


@pytest.mark.parametrize("missed", [1, 2, 63, 64, 65, 200])
def test_catch_up_replays_up_to_64_then_skips_forward(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, missed: int, caplog
) -> None:
    assert MAX_CATCHUP == 64
    sch = Scheduler(store)
    store.schedule("minutely", "@every 1m", qname, {"m": missed})
    clock.advance(60 * missed + 30)  # `missed` boundaries elapsed, now between two
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        fired = sch.tick()
    assert fired == min(missed, 64)
    jobs = jobs_of(db, qname)
    assert len(jobs) == min(missed, 64)
    assert all(j["payload"] == f'{{"m":{missed}}}' for j in jobs)
    # the next boundary is the first one after now, whatever was skipped
    assert next_at(store, "minutely") == T0 + 60 * (missed + 1)
    skipped = max(0, missed - 64)
    assert ("beyond the catch-up cap were skipped" in caplog.text) is (skipped > 0)
    if skipped:
        assert f"{skipped} missed boundaries" in caplog.text
    assert sch.tick() == 0
    clock.advance(30)  # exactly the next boundary
    assert sch.tick() == 1
    assert len(jobs_of(db, qname)) == min(missed, 64) + 1


@pytest.mark.parametrize("spec", ["@every 1m", "* * * * *"])
def test_catch_up_carries_at_most_one_batch_of_its_payload(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, spec: str, caplog, monkeypatch
) -> None:
    """A catch-up is one enqueue_many, which sent up to 64 payloads without the batch
    limit: a schedule with a large payload (17 MiB under a 20 MiB max_payload_bytes) that
    missed 64 boundaries sent 1.09 GB in one statement, which the database refused (SQLite:
    'string or blob too big'; PostgreSQL ends the connection) at every retry: the schedule
    never fired again. The catch-up fires at most what one batch of its payload carries and
    skips the rest, as beyond the cap (the batch limit lowered here: the size is the point,
    not the gigabyte)."""
    monkeypatch.setattr(v, "MAX_BATCH_BYTES", 10_000)
    sch = Scheduler(store)
    store.schedule("large", spec, qname, "x" * 998)  # 1000 bytes serialized: 9 to a batch
    clock.advance(60 * 64 + 30)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        assert sch.tick() == 9
    assert len(jobs_of(db, qname)) == 9
    assert "beyond the catch-up cap were skipped" in caplog.text
    if spec.startswith("@every"):
        assert "55 missed boundaries" in caplog.text
    assert next_at(store, "large") == T0 + 60 * 65
    clock.advance(30)
    assert sch.tick() == 1


@pytest.mark.parametrize("interval", [0.0, -60.0, 0.5, math.inf, "NaN or text"])
def test_a_schedule_whose_interval_was_written_by_hand_out_of_range_fails_alone(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, interval: object, caplog
) -> None:
    """A schedule row whose stored interval was edited by hand outside what a spec gives (1 s
    to 100 years): 0 raised ZeroDivisionError (NaN, PostgreSQL, ValueError; text, SQLite,
    ValueError) out of tick(), so no schedule after it in that tick fired, at every tick;
    a negative one made tick() return -1, half a second fired 64 jobs at every tick, an
    infinite one fired once and never again. Such a schedule cannot fire: it fails alone,
    logged as any schedule that cannot fire, and the others fire."""
    if interval == "NaN or text":
        interval = math.nan if db.kind == "postgresql" else "every minute"
    sch = Scheduler(store)
    store.schedule("a-broken", "@every 1m", qname + "-a", {})
    store.schedule("b-fine", "@every 1m", qname + "-b", {})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET interval = :i WHERE name = 'a-broken'", i=interval)
    clock.advance(60)
    with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
        assert sch.tick() == 1
    assert len(jobs_of(db, qname + "-a")) == 0 and len(jobs_of(db, qname + "-b")) == 1
    assert "schedule 'a-broken' could not fire" in caplog.text and "interval" in caplog.text
    assert [s.name for s in store.schedules()] == ["a-broken", "b-fine"]  # still listed


@pytest.mark.parametrize("stored", [-math.inf, -1e300])
def test_a_schedule_due_since_the_calendars_start_catches_up_as_capped(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, stored: float
) -> None:
    """A schedule whose next_fire_at was written by hand as minus infinity: counting its
    missed boundaries raised OverflowError out of tick(), the other schedules of the tick
    unfired, at every tick. It is due as long ago as can be: 64 fires, then the next
    boundary after now, as for any schedule that missed more than the cap."""
    sch = Scheduler(store)
    store.schedule("ancient", "@every 1m", qname, {})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET next_fire_at = :t WHERE name = 'ancient'", t=stored)
    assert sch.tick() == MAX_CATCHUP
    assert next_at(store, "ancient") == T0 + 60


def test_the_runners_wait_passes_over_a_next_fire_at_that_is_no_number(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """A schedule whose next_fire_at was written by hand as NaN (PostgreSQL) or text (SQLite
    keeps it), which no tick finds due (each database orders it above every number): the
    runner's wait for the next boundary was 0 on PostgreSQL — a busy loop, a round against
    the database every millisecond — and raised TypeError on SQLite, ending the runner. It
    waits for the other schedules' boundaries (none: its full period), whether or not one
    of them is failing."""
    sch = Scheduler(store)
    store.schedule("odd", "@every 1m", qname, {})
    stored = math.nan if db.kind == "postgresql" else "soon"
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET next_fire_at = :t WHERE name = 'odd'", t=stored)
    assert sch._seconds_to_next_fire() is None
    store.schedule("fine", "@every 1m", qname + "-b", {})
    assert sch._seconds_to_next_fire() == 60
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET interval = 0 WHERE name = 'fine'")
    clock.advance(60)
    assert sch.tick() == 0  # "fine" cannot fire now: its first retry (at most 0.5 s away) is what the runner waits for
    assert 0 <= sch._seconds_to_next_fire() <= 0.5  # type: ignore[operator]


def test_each_schedule_catches_up_on_its_own(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    store.schedule("a-fast", "@every 1s", qname + "-a", {})
    store.schedule("b-slow", "@every 1m", qname + "-b", {})
    clock.advance(3 * 60)
    assert Scheduler(store).tick() == 64 + 3
    assert len(jobs_of(db, qname + "-a")) == 64
    assert len(jobs_of(db, qname + "-b")) == 3


def test_a_schedule_with_the_deepest_payload_accepted_fires_from_any_stack(
    store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """A fire encodes the schedule's payload again; from a runner's stack deeper than the
    registering caller's, the deepest payload ``schedule`` accepted ran out of recursion
    depth there, and the schedule never fired ("could not fire", retried forever)."""
    depth, _ = deepest_accepted(lambda payload: store.schedule("deep", "@every 10s", qname, payload))
    clock.advance(10)

    def tick(levels: int) -> int:
        return tick(levels - 1) if levels else Scheduler(store).tick()

    assert tick(100) == 1  # a runner 100 frames down
    job = store.queue(qname).claim_one("w")
    assert job is not None and list_depth(job.payload) == depth


def test_a_schedule_whose_stored_payload_is_not_json_keeps_no_other_from_firing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule row edited by hand to a payload that is not JSON cannot fire: it is
    logged as failing and left due, like any schedule that cannot fire, and the others
    fire. Its decode error used to end the whole tick (a JSONDecodeError out of tick():
    no schedule fired, and the runner stopped)."""
    store.schedule("a-broken", "@every 10s", qname + "-broken", {"a": 1})
    store.schedule("b-fine", "@every 10s", qname, {"b": 1})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET payload = '{{oops' WHERE name = 'a-broken'")
    clock.advance(10)
    with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
        assert Scheduler(store).tick() == 1
    assert [j["payload"] for j in jobs_of(db, qname)] == ['{"b":1}']
    assert jobs_of(db, qname + "-broken") == []
    assert any("a-broken" in r.getMessage() and "not JSON" in r.getMessage() for r in caplog.records)
    fine = db.scalar(f"SELECT next_fire_at FROM {db.table('alkstore_schedules')} WHERE name = 'b-fine'")
    assert fine == T0 + 20


def test_fired_jobs_carry_the_schedules_stamps_over_the_defaults(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    store.schedule(
        "stamped", "@every 1m", qname, {"kind": "stamped"}, priority=7, max_attempts=9, expires=120
    )
    store.schedule("plain", "@every 1m", qname + "-plain", ["plain"])
    clock.advance(60)
    assert Scheduler(store).tick() == 2
    (job,) = jobs_of(db, qname)
    assert job["priority"] == 7 and job["max_attempts"] == 9
    assert job["created_at"] == job["run_at"] == T0 + 60  # enqueued at the tick, ready now
    assert job["expires_at"] == T0 + 60 + 120
    assert job["visibility_timeout"] == 300 and job["backoff_base"] == 5  # the defaults
    assert job["dead_letter_retention"] is None
    assert job["state"] == "pending" and job["attempts"] == 0
    got = store.get_job(job["id"])
    assert got is not None and got.payload == {"kind": "stamped"} and got.queue == qname
    (plain,) = jobs_of(db, qname + "-plain")
    assert plain["priority"] == 0 and plain["max_attempts"] == 3 and plain["expires_at"] is None
    # and the schedule lists them
    s = the(store, "stamped")
    assert (s.priority, s.max_attempts, s.expires) == (7, 9, 120.0)
    p = the(store, "plain")
    assert (p.priority, p.max_attempts, p.expires, p.payload) == (0, None, None, ["plain"])
    # a fired job is an ordinary job: claimable in priority order
    handle = store.queue(qname).claim_one("w")
    assert handle is not None and handle.payload == {"kind": "stamped"} and handle.ack()


# -- re-registration, unschedule, listing ------------------------------------------------------


def test_reregistering_updates_and_keeps_the_boundary_when_the_interval_is_unchanged(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    sch = Scheduler(store)
    store.schedule("r", "@every 1m", qname, {"v": 1})
    clock.advance(30)
    store.schedule("r", "@every 60s", qname + "-new", {"v": 2}, priority=5, max_attempts=2, expires=90)
    s = the(store, "r")
    assert s.next_fire_at.timestamp() == T0 + 60  # same interval: boundary kept
    assert (s.spec, s.queue, s.payload, s.priority, s.max_attempts, s.expires) == (
        "@every 60s", qname + "-new", {"v": 2}, 5, 2, 90.0,
    )
    assert s.created_at.timestamp() == T0 and s.updated_at.timestamp() == T0 + 30
    assert len(store.schedules()) == 1  # an upsert, not a second schedule
    clock.advance(30)
    assert sch.tick() == 1
    assert jobs_of(db, qname) == []
    (job,) = jobs_of(db, qname + "-new")
    assert (job["payload"], job["priority"], job["max_attempts"]) == ('{"v":2}', 5, 2)
    assert job["expires_at"] == T0 + 60 + 90
    # back to no options: they are cleared, not kept
    store.schedule("r", "@every 1m", qname + "-new", {"v": 3})
    s = the(store, "r")
    assert (s.priority, s.max_attempts, s.expires) == (0, None, None)


def test_a_reregistration_committed_after_the_ticks_read_fires_the_new_definition(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick reads the due schedules, then fires each in its own transaction. A
    re-registration (same interval: the boundary is kept) that commits in between must not
    be fired with the definition the tick read: the fire enqueues what the row holds under
    the row lock of its advance, so the new queue, payload and stamps."""
    sch = Scheduler(store)
    store.schedule("changed", "@every 1m", qname + "-old", {"v": 1})
    clock.advance(60)
    backend = store.backend
    listed = backend.schedule_list

    def list_then_reregister(ex: Any, params: Any, *, due: bool) -> list[tuple[Any, ...]]:
        rows = listed(ex, params, due=due)
        if due:  # the tick's read is done: another process re-registers now
            store.schedule("changed", "@every 1m", qname + "-new", {"v": 2}, priority=7, max_attempts=4)
        return rows

    monkeypatch.setattr(backend, "schedule_list", list_then_reregister)
    assert sch.tick() == 1
    monkeypatch.undo()
    assert jobs_of(db, qname + "-old") == []
    (job,) = jobs_of(db, qname + "-new")
    assert (job["payload"], job["priority"], job["max_attempts"]) == ('{"v":2}', 7, 4)
    assert next_at(store, "changed") == T0 + 2 * 60


def test_reregistering_with_a_new_interval_recomputes_the_boundary(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    sch = Scheduler(store)
    store.schedule("r", "@every 1m", qname, {})
    clock.advance(70)  # T0+60 elapsed, unfired
    store.schedule("r", "@every 1h", qname, {})
    assert next_at(store, "r") == T0 + 3600  # recomputed from now; the missed minute is gone
    assert sch.tick() == 0
    clock.advance(3600 - 70)
    assert sch.tick() == 1
    store.schedule("r", "@every 90s", qname, {})
    assert next_at(store, "r") == T0 + 3600 + 90
    assert len(jobs_of(db, qname)) == 1


def test_unschedule_stops_fires(db: Target, store: alk.Store, clock: FakeClock, qname: str) -> None:
    sch = Scheduler(store)
    store.schedule("u", "@every 1m", qname, {})
    store.schedule("keep", "@every 1m", qname + "-keep", {})
    clock.advance(60)
    assert sch.tick() == 2
    assert store.unschedule("u") is True
    assert [s.name for s in store.schedules()] == ["keep"]
    clock.advance(600)
    assert sch.tick() == 10  # only "keep"'s ten boundaries
    assert len(jobs_of(db, qname)) == 1
    assert len(jobs_of(db, qname + "-keep")) == 11
    assert store.unschedule("u") is False
    assert store.unschedule("never-was") is False
    # pause = unregister + re-register: it restarts from the next boundary after now
    store.schedule("u", "@every 1m", qname, {})
    assert next_at(store, "u") == next_boundary(clock(), 60)
    assert sch.tick() == 0


def test_schedules_lists_by_name(store: alk.Store, qname: str) -> None:
    assert store.schedules() == []
    for name in ("zeta", "Alpha", "mid", "alpha"):
        store.schedule(name, "@every 5m", qname, {"name": name})
    listed = store.schedules()
    assert [s.name for s in listed] == sorted(["zeta", "Alpha", "mid", "alpha"])
    assert all(isinstance(s, alk.Schedule) for s in listed)
    assert {s.name: s.payload["name"] for s in listed} == {n: n for n in ("zeta", "Alpha", "mid", "alpha")}


def test_schedules_list_in_code_point_order_under_a_linguistic_collation(qname: str) -> None:
    """A PostgreSQL database made with a linguistic locale (en_US.UTF-8, the official Docker
    image's default) orders text its own way ('alpha' before 'Alpha', '_' ignored): names
    are exact values, listed in code point order as on SQLite, whatever the collation."""
    require_pg()
    target = pg_target(new_pg_schema())
    try:
        if target.scalar("SELECT count(*) FROM pg_collation WHERE collname = 'en-US-x-icu'") == 0:
            pytest.skip("this PostgreSQL has no ICU collation en-US-x-icu")
        # what CREATE DATABASE ... LOCALE 'en_US.UTF-8' gives every text column it creates
        target.execute(
            f'ALTER TABLE {target.table("alkstore_schedules")} ALTER COLUMN name TYPE text COLLATE "en-US-x-icu"'
        )
        store = target.store()
        try:
            names = ["zeta", "alpha", "Alpha", "a_b", "ab", "Zeta"]
            for name in names:
                store.schedule(name, "@every 5m", qname, {})
            assert [s.name for s in store.schedules()] == sorted(names)
        finally:
            store.close()
    finally:
        drop_pg_schema(target)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, alk.InvalidName),
        ({"name": "__alkstore_x"}, alk.InvalidName),
        ({"name": None}, alk.InvalidName),
        ({"queue": ""}, alk.InvalidName),
        ({"queue": "__alkstore_outbox:x"}, alk.InvalidName),
        ({"queue": 3}, alk.InvalidName),
        ({"priority": 2**31}, alk.InvalidOptions),
        ({"priority": True}, alk.InvalidOptions),
        ({"max_attempts": 0}, alk.InvalidOptions),
        ({"expires": 0}, alk.InvalidOptions),
        ({"expires": math.nan}, alk.InvalidOptions),
        ({"expires": 1e-7}, alk.InvalidOptions),  # under a millisecond: each fire dead on arrival
        ({"expires": 0.0009}, alk.InvalidOptions),
        ({"payload": {"x": math.nan}}, alk.PayloadError),
        ({"payload": {1, 2}}, alk.PayloadError),
    ],
    ids=repr,
)
def test_schedule_validation_raises_typed_errors_and_writes_nothing(
    db: Target, store: alk.Store, qname: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    args: dict[str, Any] = {"name": "v", "spec": "@every 1m", "queue": qname, "payload": {}}
    args.update(kwargs)
    before = schedule_rows(db)
    with pytest.raises(error):
        store.schedule(
            args.pop("name"), args.pop("spec"), args.pop("queue"), args.pop("payload"), **args
        )
    assert schedule_rows(db) == before
    with pytest.raises(alk.InvalidName):
        store.unschedule("__alkstore_scheduler")


# -- atomicity: the fire and the boundary advance commit together -----------------------------


class FailingTrigger:
    """A trigger that makes INSERTs into the job table (for one queue) or UPDATEs of the
    schedule table (for one schedule) fail inside the database, dropped afterwards."""

    def __init__(self, db: Target, table: str, event: str, column: str, value: str) -> None:
        self.db, self.table, self.event, self.column, self.value = db, table, event, column, value
        self.name = f"alk_test_fail_{event.lower()}"

    def __enter__(self) -> FailingTrigger:
        db, lit = self.db, self.value.replace("'", "''")
        if db.kind == "sqlite":
            db.execute(
                f"CREATE TRIGGER {self.name} BEFORE {self.event} ON {db.table(self.table)} "
                f"WHEN NEW.{self.column} = '{lit}' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
            )
        else:
            fn = f'"{db.schema}".{self.name}'
            db.execute(
                f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS "
                "$body$ BEGIN RAISE EXCEPTION 'refused by the test trigger'; END $body$"
            )
            db.execute(
                f"CREATE TRIGGER {self.name} BEFORE {self.event} ON {db.table(self.table)} "
                f"FOR EACH ROW WHEN (NEW.{self.column} = '{lit}') EXECUTE FUNCTION {fn}()"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        db = self.db
        if db.kind == "sqlite":
            db.execute(f"DROP TRIGGER IF EXISTS {self.name}")
        else:
            db.execute(f"DROP TRIGGER IF EXISTS {self.name} ON {db.table(self.table)}")
            db.execute(f'DROP FUNCTION IF EXISTS "{db.schema}".{self.name}()')


def test_a_failing_enqueue_rolls_the_advance_back(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    sch = Scheduler(store)
    store.schedule("atomic", "@every 1m", qname, {"x": 1})
    clock.advance(3 * 60)  # three boundaries due
    with FailingTrigger(db, "alkstore_jobs", "INSERT", "queue", qname), caplog.at_level("ERROR", "alkstore_sa"):
        assert sch.tick() == 0  # the failure is logged, not raised: other schedules still fire
    assert any("'atomic' could not fire" in r.getMessage() for r in caplog.records)
    # the advance ran first and succeeded, then the enqueue failed: both rolled back
    assert jobs_of(db, qname) == []
    assert next_at(store, "atomic") == T0 + 60
    # once the enqueue works again, the same boundaries fire, once each
    assert sch.tick() == 3
    assert len(jobs_of(db, qname)) == 3
    assert next_at(store, "atomic") == T0 + 4 * 60
    assert sch.tick() == 0


def test_a_schedule_row_with_a_malformed_payload_fails_alone(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose stored payload is not JSON (written by hand, or by a bug) is a schedule
    that cannot fire: logged, left due, while the others fire; reading it raises
    PayloadError, an AlkstoreError (SPEC §3), not json's own error, naming the schedule
    (it said only "a stored payload is not JSON", and one such row fails the whole list)."""
    sch = Scheduler(store)
    store.schedule("a-broken", "@every 1m", qname + "-broken", {})  # ticked first, by name
    store.schedule("b-fine", "@every 1m", qname, {"x": 1})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET payload = '{{oops' WHERE name = 'a-broken'")
    clock.advance(60)
    with caplog.at_level("ERROR", "alkstore_sa"):
        assert sch.tick() == 1
    assert any("'a-broken' could not fire" in r.getMessage() for r in caplog.records)
    assert len(jobs_of(db, qname)) == 1 and jobs_of(db, qname + "-broken") == []
    with pytest.raises(alk.PayloadError, match=r"^schedule 'a-broken': .*not JSON.*register it again"):
        store.schedules()


def test_a_failing_advance_fires_nothing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    sch = Scheduler(store)
    store.schedule("stuck", "@every 1m", qname, {"x": 1})
    store.schedule("healthy", "@every 1m", qname + "-ok", {"y": 1})
    clock.advance(60)
    with FailingTrigger(db, "alkstore_schedules", "UPDATE", "name", "stuck"):
        assert sch.tick() == 1  # "healthy" fired; "stuck" failed alone
    assert len(jobs_of(db, qname + "-ok")) == 1
    assert jobs_of(db, qname) == []
    assert next_at(store, "stuck") == T0 + 60
    assert sch.tick() == 1
    assert len(jobs_of(db, qname)) == 1


def test_a_second_ticker_at_the_same_instant_fires_nothing(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    other = db.store(clock=clock)  # another Store: another process's scheduler, in real life
    try:
        store.schedule("once", "@every 1m", qname, {})
        clock.advance(60)
        assert Scheduler(store).tick() == 1
        assert Scheduler(other).tick() == 0
        assert len(jobs_of(db, qname)) == 1
    finally:
        other.close()


def test_racing_tickers_that_both_saw_the_boundary_due_fire_it_once(
    db: Target, clock: FakeClock, qname: str
) -> None:
    """Two schedulers both read the schedule as due, then race for the advance: the row-locked
    advance (checking the boundary each read) lets exactly one of them fire. The test holds
    the schedule table's write lock until both tickers are past their read."""
    stores = [db.store(clock=clock) for _ in range(2)]
    try:
        stores[0].schedule("raced", "@every 1m", qname, {})
        clock.advance(5 * 60)  # five boundaries due
        results: list[Any] = []

        def tick(s: alk.Store) -> None:
            try:
                results.append(Scheduler(s).tick())
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                results.append(exc)

        threads = [threading.Thread(target=tick, args=(s,), daemon=True) for s in stores]
        if db.kind == "postgresql":
            blocker = db.engine.connect()
            try:
                blocker.exec_driver_sql(
                    f"SELECT name FROM {db.table('alkstore_schedules')} WHERE name = 'raced' FOR UPDATE"
                )
                for t in threads:
                    t.start()
                wait_for(
                    lambda: db.scalar(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE :q",
                        q=f"%{db.schema}%alkstore_schedules%",
                    ) == 2,
                    "both tickers to wait on the schedule's row lock",
                )
                blocker.rollback()
            finally:
                blocker.close()
        else:
            path = db.engine.url.database
            assert path
            blocker = sqlite3.connect(path, isolation_level=None)
            try:
                blocker.execute("BEGIN IMMEDIATE")  # the writer lock: both ticks can only read
                for t in threads:
                    t.start()
                time.sleep(0.5)  # both read the schedule as due, then wait for the writer lock
                blocker.execute("ROLLBACK")
            finally:
                blocker.close()
        for t in threads:
            t.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert sorted(results, key=repr) == [0, 5], results
        assert len(jobs_of(db, qname)) == 5
        assert next_at(stores[0], "raced") == T0 + 6 * 60
    finally:
        for s in stores:
            s.close()


# -- the runner: leadership, LeadershipLost, stop ---------------------------------------------


class Runner:
    """``store.run_schedules(stop, lease=...)`` in a thread; its outcome kept for the test."""

    def __init__(self, store: alk.Store, lease: float) -> None:
        self.stop = alk.StopToken()
        self.outcome: list[Any] = []

        def target() -> None:
            try:
                store.run_schedules(self.stop, lease=lease)
                self.outcome.append("returned")
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.outcome.append(exc)

        self.thread = threading.Thread(target=target, name="run_schedules", daemon=True)
        self.thread.start()

    def join(self) -> Any:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "run_schedules did not return"
        assert len(self.outcome) == 1
        return self.outcome[0]

    def close(self) -> None:
        self.stop.stop()
        self.thread.join(WAIT)


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for r in started:
        r.close()


def leader(store: alk.Store) -> alk.LockInfo | None:
    return alk.Lock._reserved(store, LEADER_LOCK).holder()


def test_a_ticker_stuck_holding_one_schedules_row_does_not_stall_the_leader(
    pg_db: Target, clock: FakeClock, qname: str
) -> None:
    """A ticker paused mid-fire (a stopped process, a frozen VM: its connection stays up)
    holds its schedule's row lock for as long as it is paused. The leader must not wait
    on it forever: the other schedules keep firing, the stuck one fires once the lock is
    gone, and nothing fires twice. (PostgreSQL: on SQLite the paused writer holds the
    database's one writer lock, which no statement can step around.)"""
    store = pg_db.store(clock=clock)
    stuck, free = qname + "-a-stuck", qname + "-b-free"
    store.schedule(stuck, "@every 1m", stuck, {})
    store.schedule(free, "@every 1m", free, {})
    clock.advance(60)
    stop = alk.StopToken()
    blocker = pg_db.engine.connect()
    runner: threading.Thread | None = None
    try:
        # the paused ticker: it took the row lock of the schedule that sorts first
        blocker.exec_driver_sql(
            f"SELECT name FROM {pg_db.table('alkstore_schedules')} WHERE name = %s FOR UPDATE", (stuck,)
        )
        runner = threading.Thread(target=store.run_schedules, args=(stop,), kwargs={"lease": 3.0}, daemon=True)
        runner.start()
        wait_for(lambda: len(jobs_of(pg_db, free)) == 1, "the other schedule to fire despite the stuck row")
        assert jobs_of(pg_db, stuck) == []
        blocker.rollback()  # the paused ticker dies: its transaction rolls back
        wait_for(lambda: len(jobs_of(pg_db, stuck)) == 1, "the stuck schedule to fire once its row is free")
        stop.stop()
        runner.join(WAIT)
        assert not runner.is_alive()
        assert len(jobs_of(pg_db, stuck)) == 1 and len(jobs_of(pg_db, free)) == 1
        assert next_at(store, stuck) == next_at(store, free) == T0 + 2 * 60
    finally:
        blocker.close()
        stop.stop()
        if runner is not None:
            runner.join(WAIT)
        store.close()


def test_a_schedule_another_ticker_fired_while_it_held_the_row_is_not_held_back_by_backoff(
    pg_db: Target, clock: FakeClock, qname: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ticker paused mid-fire that then commits (its process thawed) fired its boundary;
    the leader's fires of that schedule failed meanwhile on the row lock and were put on the
    schedule's retry backoff (which grows to 60 s over a long pause). Once the row shows the
    boundary moved, the obstacle is gone: the next due boundary fires at the leader's next
    tick, as for a re-registered schedule, not after the rest of the backoff (docs: "fires,
    once, as soon as the lock is gone"). The backoff is lengthened here so that waiting it
    out cannot pass for that."""
    monkeypatch.setattr(scheduler_module, "SCHEDULE_RETRY", (30.0, 60.0))
    store = pg_db.store(clock=clock)
    store.schedule(qname, "@every 1m", qname, {})
    clock.advance(120)  # T0 + 60 and T0 + 120 are due
    stop = alk.StopToken()
    blocker = pg_db.engine.connect()
    runner: threading.Thread | None = None
    try:
        # the paused ticker, which read the time at T0 + 60: it advanced the boundary T0 + 60
        # (its fire) to T0 + 120 and holds the row
        blocker.exec_driver_sql(
            f"UPDATE {pg_db.table('alkstore_schedules')} SET next_fire_at = %s WHERE name = %s AND next_fire_at = %s",
            (T0 + 120, qname, T0 + 60),
        )
        with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
            runner = threading.Thread(target=store.run_schedules, args=(stop,), kwargs={"lease": 3.0}, daemon=True)
            runner.start()
            wait_for(lambda: "could not fire" in caplog.text, "the leader's fire to fail on the held row")
        blocker.commit()  # the paused ticker thaws and commits its fire
        # the leader ticks every second (lease / 3); 10 s is well inside the 15 s the
        # lengthened backoff holds the schedule back at least
        wait_for(lambda: len(jobs_of(pg_db, qname)) == 1, "the next boundary to fire once the row is free", 10)
        assert next_at(store, qname) == T0 + 180
        stop.stop()
        runner.join(WAIT)
        assert not runner.is_alive()
        assert len(jobs_of(pg_db, qname)) == 1
    finally:
        blocker.close()
        stop.stop()
        if runner is not None:
            runner.join(WAIT)
        store.close()


def test_a_schedule_of_a_task_call_fires_a_job_its_registry_runs_with_the_schedules_stamps(
    store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """docs/scheduler.md, "Scheduling a task": the task's queue and the pinned payload of a
    call make a schedule whose jobs a worker serving the registry runs as calls of the task;
    the job carries the schedule's stamps (max_attempts, priority), the queue defaults
    otherwise (the task's visibility timeout and backoff base are not the job's)."""
    tasks = alk.Tasks()
    calls: list[tuple[Any, ...]] = []

    @tasks.task(queue=qname, name="reports.nightly", max_attempts=5, visibility_timeout=600, backoff_base=1)
    def nightly_report(kind: str) -> None:
        calls.append((kind,))

    store.schedule(
        "nightly-report", "@every 1m", nightly_report.queue,
        {"task": nightly_report.name, "args": ["full"], "kwargs": {}}, max_attempts=5, priority=2,
    )
    clock.advance(60)
    assert Scheduler(store).tick() == 1
    handle = store.queue(qname).claim_one("w")
    assert handle is not None
    job = handle.job
    task, args, kwargs = tasks.resolve(job.payload)
    assert task is nightly_report and args == ["full"] and kwargs == {}
    task(*args, **kwargs)
    assert calls == [("full",)]
    assert (job.max_attempts, job.priority) == (5, 2)
    assert (job.visibility_timeout, job.backoff_base) == (300.0, 5.0)  # the queue defaults


def test_the_leader_lock_name_is_reserved(store: alk.Store) -> None:
    assert LEADER_LOCK == "__alkstore_scheduler"
    with pytest.raises(alk.InvalidName):
        store.lock(LEADER_LOCK)
    with pytest.raises(alk.InvalidName):
        alk.Lock(store, LEADER_LOCK)  # the public class, not only the store's factory


@pytest.mark.parametrize("bad", [None, "x", True, threading.Event()], ids=lambda v: type(v).__name__)
def test_run_schedules_refuses_a_stop_that_is_no_stop_token(
    store: alk.Store, clock: FakeClock, qname: str, bad: Any
) -> None:
    """Refused at the call: no lease taken, nothing fired."""
    store.schedule("s", "@every 1s", qname, "p")
    clock.advance(5)
    with pytest.raises(alk.InvalidOptions, match="stop must be an alkstore_sa.StopToken"):
        store.run_schedules(bad)
    assert leader(store) is None
    assert store.queue(qname).stats().pending == 0


def test_runner_fires_while_leading_and_a_stop_returns_cleanly_and_releases(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, runners: list[Runner]
) -> None:
    store.schedule("led", "@every 1s", qname, {"led": True})
    r = Runner(store, lease=1.5)
    runners.append(r)
    held = wait_for(lambda: leader(store), "the runner to lead")
    assert held.owner.startswith("scheduler-")
    assert held.expires_at.timestamp() == T0 + 1.5
    clock.advance(1.0)  # one boundary; the lease (renewed at T0) has 0.5 s left
    wait_for(lambda: len(jobs_of(db, qname)) == 1, "the runner to fire the boundary")
    wait_for(
        lambda: (h := leader(store)) is not None and h.expires_at.timestamp() == T0 + 1.0 + 1.5,
        "the runner to renew its lease at the new time",
    )
    r.stop.stop()
    assert r.join() == "returned"
    assert leader(store) is None  # released on stop, not left to lapse
    assert len(jobs_of(db, qname)) == 1


def test_leadership_lost_when_the_lease_is_stolen(
    store: alk.Store, clock: FakeClock, runners: list[Runner]
) -> None:
    r = Runner(store, lease=0.3)  # renews every 0.1 s (real time) on a frozen clock
    runners.append(r)
    first = wait_for(lambda: leader(store), "the runner to lead")
    clock.advance(1.0)  # the lease lapses (nobody renews a lapsed lease) ...
    thief = alk.Lock._reserved(store, LEADER_LOCK)
    assert thief.acquire("thief", 60)  # ... and another owner takes it
    outcome = r.join()
    assert isinstance(outcome, alk.LeadershipLost), outcome
    # the loser did not touch the new holder's lease
    h = leader(store)
    assert h is not None and h.owner == "thief" and h.owner != first.owner
    assert h.expires_at.timestamp() == clock() + 60


def test_leadership_lost_when_the_lease_lapsed_before_renewal(
    store: alk.Store, clock: FakeClock, runners: list[Runner]
) -> None:
    r = Runner(store, lease=0.3)
    runners.append(r)
    wait_for(lambda: leader(store), "the runner to lead")
    clock.advance(0.3)  # lapsed exactly at the deadline; nobody else takes it
    outcome = r.join()
    assert isinstance(outcome, alk.LeadershipLost), outcome
    assert leader(store) is None


def test_a_waiting_runner_takes_over_after_a_stop_and_a_stop_while_waiting_returns(
    db: Target, store: alk.Store, clock: FakeClock, runners: list[Runner]
) -> None:
    other = db.store(clock=clock)
    try:
        a = Runner(store, lease=0.6)
        runners.append(a)
        first = wait_for(lambda: leader(store), "runner a to lead")
        b = Runner(other, lease=0.6)
        runners.append(b)
        time.sleep(0.5)  # b tries to acquire a few times (every 0.2 s) and waits
        assert leader(store).owner == first.owner  # type: ignore[union-attr]
        a.stop.stop()
        assert a.join() == "returned"
        second = wait_for(
            lambda: (h := leader(store)) is not None and h.owner != first.owner and h,
            "runner b to take over",
        )
        # a third runner that never leads: its stop returns and leaves b's lease alone
        c = Runner(store, lease=0.6)
        runners.append(c)
        time.sleep(0.3)
        c.stop.stop()
        assert c.join() == "returned"
        assert leader(store).owner == second.owner  # type: ignore[union-attr]
        b.stop.stop()
        assert b.join() == "returned"
        assert leader(store) is None
    finally:
        other.close()


def test_run_schedules_validates_the_lease(store: alk.Store) -> None:
    for bad in (0, -1, math.nan, "30"):
        with pytest.raises(alk.InvalidOptions):
            store.run_schedules(alk.StopToken(), lease=bad)  # type: ignore[arg-type]
    assert leader(store) is None


# -- the maintenance recipe ------------------------------------------------------------------


def test_maintenance_recipe_moves_an_expired_job_to_dead(
    db: Target, dbstore: alk.Store, qname: str
) -> None:
    """SPEC §7's recipe on the database clock, end to end: one schedule fires into a
    maintenance queue; its worker calls ``sweep_expired`` on each queue it names."""
    work, maintenance = qname + "-work", qname + "-maintenance"
    doomed = dbstore.queue(work).enqueue({"too": "late"}, expires=0.2)
    keeper = dbstore.queue(work).enqueue({"no": "expiry"})
    dbstore.schedule("maintenance", "@every 1s", maintenance, {"queues": [work]})
    swept: list[alk.SweepResult] = []

    def maintain(job: alk.Job) -> None:
        for name in job.payload["queues"]:
            swept.append(dbstore.queue(name).sweep_expired())

    stop = alk.StopToken()
    worker = alk.Worker(dbstore, maintenance, maintain, concurrency=1, poll_interval=0.2, shutdown_grace=5)
    threads = [
        threading.Thread(target=dbstore.run_schedules, args=(stop,), kwargs={"lease": 3.0}, daemon=True),
        threading.Thread(target=worker.run, args=(stop,), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        # the sweep's count is noted once sweep_expired returned, just after its commit
        # made the job dead: wait for both
        dead = wait_for(
            lambda: any(s.expired == 1 for s in swept)
            and (j := dbstore.get_job(doomed)) is not None and j.state == "dead" and j,
            "the maintenance job to sweep the expired job",
            timeout=20,
        )
        assert dead.last_error == "expired" and dead.died_at is not None
        kept = dbstore.get_job(keeper)
        assert kept is not None and kept.state == "pending"
    finally:
        stop.stop()
        for t in threads:
            t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    assert worker.processed >= 1
    assert leader(dbstore) is None
