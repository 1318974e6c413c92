"""Cron schedules (SPEC §14): the grammar (fields, lists, ranges, steps, names, 0/7 Sunday,
aliases, the day-of-month/day-of-week OR rule, bad specs and zones → InvalidSpec), a table of
expressions × zones × instants through both 2026 daylight-saving changes of Europe/Berlin
and America/New_York (a skipped time fires at the end of the gap, a repeated time at its
first occurrence only), a 31st-of-month and a 29-February case; then, on both engines with
the injected clock, the scheduler's tick: fires at the right instants across a change, the
64-boundary catch-up cap, re-registration, at most one fire per boundary with two tickers
and across a leader failover, and what an older (schema-step-1) runner does with a cron row.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import alkstore_sa as alk
from alkstore_sa import cron
from alkstore_sa._schedule_runner import LeaderLoop
from alkstore_sa.scheduler import CRON_INTERVAL, LEADER_LOCK, Scheduler, timing
from tests.support import FakeClock, Target

UTC = timezone.utc
BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def at(text: str) -> float:
    """Epoch seconds of an ISO instant written in UTC (``2026-03-29T01:00Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")


def fires(spec: str, tz: str, after: str, n: int) -> list[str]:
    """The next ``n`` fire instants of ``spec`` in ``tz`` strictly after ``after``."""
    when = timing(spec, tz)
    out, t = [], at(after)
    for _ in range(n):
        t = when.after(t)
        out.append(iso(t))
    return out


@pytest.fixture(autouse=True)
def _no_leftover_schedules(request: pytest.FixtureRequest) -> None:
    """Tests of one PostgreSQL module share a schema, and a tick fires every due schedule."""
    if "db" in request.fixturenames:
        db: Target = request.getfixturevalue("db")
        for table in ("alkstore_schedules", "alkstore_locks"):
            db.execute(f"DELETE FROM {db.table(table)}")


# -- the table: expressions × zones × instants ---------------------------------------------------

# Berlin: 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z).
# New York: 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z); 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).
TABLE = [
    # spring forward: a skipped time fires at the first instant after the gap (03:00 CEST) ...
    ("30 2 * * *", BERLIN, "2026-03-28T12:00Z", ["2026-03-29T01:00Z", "2026-03-30T00:30Z", "2026-03-31T00:30Z"]),
    ("0 2 * * *", BERLIN, "2026-03-28T12:00Z", ["2026-03-29T01:00Z", "2026-03-30T00:00Z"]),
    # ... once, even where it meets the time right after the gap (02:00, 02:30, 03:00 -> one fire)
    ("*/30 * * * *", BERLIN, "2026-03-29T00:15Z", ["2026-03-29T00:30Z", "2026-03-29T01:00Z", "2026-03-29T01:30Z"]),
    ("0 2,3 * * *", BERLIN, "2026-03-28T12:00Z", ["2026-03-29T01:00Z", "2026-03-30T00:00Z", "2026-03-30T01:00Z"]),
    ("0 * * * *", BERLIN, "2026-03-28T23:30Z", ["2026-03-29T00:00Z", "2026-03-29T01:00Z", "2026-03-29T02:00Z"]),
    # fall back: a repeated time fires at its first occurrence only
    ("30 2 * * *", BERLIN, "2026-10-24T12:00Z", ["2026-10-25T00:30Z", "2026-10-26T01:30Z"]),
    ("*/30 * * * *", BERLIN, "2026-10-24T23:45Z",
     ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T02:00Z", "2026-10-25T02:30Z"]),
    ("0 * * * *", BERLIN, "2026-10-24T23:30Z", ["2026-10-25T00:00Z", "2026-10-25T02:00Z", "2026-10-25T03:00Z"]),
    # asked from inside the repeated hour's second pass (02:10 CET): its times are behind us
    ("*/30 * * * *", BERLIN, "2026-10-25T01:10Z", ["2026-10-25T02:00Z"]),
    ("30 2 * * *", BERLIN, "2026-10-25T01:10Z", ["2026-10-26T01:30Z"]),
    # ... and from inside the first pass (02:40 CEST)
    ("*/15 * * * *", BERLIN, "2026-10-25T00:40Z", ["2026-10-25T00:45Z", "2026-10-25T02:00Z"]),
    # New York
    ("30 2 * * *", NEW_YORK, "2026-03-07T12:00Z", ["2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    ("*/15 * * * *", NEW_YORK, "2026-03-08T06:50Z", ["2026-03-08T07:00Z", "2026-03-08T07:15Z"]),
    ("30 1 * * *", NEW_YORK, "2026-10-31T12:00Z", ["2026-11-01T05:30Z", "2026-11-02T06:30Z"]),
    ("0 * * * *", NEW_YORK, "2026-11-01T04:30Z",
     ["2026-11-01T05:00Z", "2026-11-01T07:00Z", "2026-11-01T08:00Z"]),
    ("0 9 * * MON-FRI", NEW_YORK, "2026-03-06T15:00Z", ["2026-03-09T13:00Z", "2026-03-10T13:00Z"]),
    # a zone without DST, and UTC
    ("0 0 * * *", "Asia/Tokyo", "2026-03-29T00:00Z", ["2026-03-29T15:00Z", "2026-03-30T15:00Z"]),
    ("0 0 * * *", "UTC", "2026-03-29T00:00Z", ["2026-03-30T00:00Z"]),
    # the 31st: months without one are skipped
    ("0 12 31 * *", "UTC", "2026-01-31T13:00Z",
     ["2026-03-31T12:00Z", "2026-05-31T12:00Z", "2026-07-31T12:00Z", "2026-08-31T12:00Z", "2026-10-31T12:00Z"]),
    ("0 0 31 * *", NEW_YORK, "2026-01-01T12:00Z", ["2026-01-31T05:00Z", "2026-03-31T04:00Z"]),
    # 29 February: years apart, and 2100 is not a leap year
    ("0 0 29 2 *", BERLIN, "2026-01-01T00:00Z", ["2028-02-28T23:00Z", "2032-02-28T23:00Z"]),
    ("0 0 29 2 *", "UTC", "2096-03-01T00:00Z", ["2104-02-29T00:00Z"]),
    # aliases (2026-01-07 is a Wednesday)
    ("@hourly", "UTC", "2026-01-07T10:20Z", ["2026-01-07T11:00Z", "2026-01-07T12:00Z"]),
    ("@daily", BERLIN, "2026-01-07T10:20Z", ["2026-01-07T23:00Z"]),
    ("@midnight", "UTC", "2026-01-07T10:20Z", ["2026-01-08T00:00Z"]),
    ("@weekly", "UTC", "2026-01-07T10:20Z", ["2026-01-11T00:00Z", "2026-01-18T00:00Z"]),
    ("@monthly", NEW_YORK, "2026-01-07T10:20Z", ["2026-02-01T05:00Z", "2026-03-01T05:00Z", "2026-04-01T04:00Z"]),
    ("@yearly", "UTC", "2026-01-07T10:20Z", ["2027-01-01T00:00Z"]),
    ("@annually", "UTC", "2026-01-07T10:20Z", ["2027-01-01T00:00Z"]),
    # day of month OR day of week when both are restricted: the 1st, or a Monday
    ("0 0 1 * 1", "UTC", "2026-01-27T00:00Z", ["2026-02-01T00:00Z", "2026-02-02T00:00Z", "2026-02-09T00:00Z"]),
    ("0 0 13 * FRI", "UTC", "2026-02-01T00:00Z",
     ["2026-02-06T00:00Z", "2026-02-13T00:00Z", "2026-02-20T00:00Z", "2026-02-27T00:00Z", "2026-03-06T00:00Z",
      "2026-03-13T00:00Z"]),
    # ... but a field starting with "*" is unrestricted (crontab(5)): AND
    ("0 0 */10 * 1", "UTC", "2026-01-01T00:00Z", ["2026-05-11T00:00Z", "2026-06-01T00:00Z", "2026-08-31T00:00Z"]),
    ("0 0 * * 1", "UTC", "2026-01-01T00:00Z", ["2026-01-05T00:00Z"]),
    # Sunday is 0 and 7; names in either case; ranges through 7
    ("0 0 * * 7", "UTC", "2026-01-01T00:00Z", ["2026-01-04T00:00Z", "2026-01-11T00:00Z"]),
    ("0 0 * * 5-7", "UTC", "2026-01-01T00:00Z", ["2026-01-02T00:00Z", "2026-01-03T00:00Z", "2026-01-04T00:00Z",
                                                 "2026-01-09T00:00Z"]),
    ("0 9 * jan-Mar mon,WED", "UTC", "2026-03-30T00:00Z", ["2026-03-30T09:00Z", "2027-01-04T09:00Z"]),
    # lists, ranges and steps
    ("5-20/5,59 */6 * * *", "UTC", "2026-01-01T00:00Z",
     ["2026-01-01T00:05Z", "2026-01-01T00:10Z", "2026-01-01T00:15Z", "2026-01-01T00:20Z", "2026-01-01T00:59Z",
      "2026-01-01T06:05Z"]),
    ("10/20 * * * *", "UTC", "2026-01-01T00:00Z", ["2026-01-01T00:10Z", "2026-01-01T00:30Z", "2026-01-01T00:50Z"]),
    # strictly after: on a fire instant asks for the next one
    ("* * * * *", "UTC", "2026-01-01T00:00Z", ["2026-01-01T00:01Z", "2026-01-01T00:02Z"]),
]


@pytest.mark.parametrize(("spec", "tz", "after", "expected"), TABLE, ids=lambda x: str(x))
def test_next_fires(spec: str, tz: str, after: str, expected: list[str]) -> None:
    assert fires(spec, tz, after, len(expected)) == expected


def test_every_minute_through_both_berlin_changes_fires_each_wall_time_once() -> None:
    """A day of `* * * * *` around each change: 23 h (1380 fires) on the spring day, whose
    skipped hour collapses into its end; 25 h of instants on the autumn day, whose repeated
    hour is silent (1440 fires, one per wall-clock minute)."""
    for day, next_day, count in (("2026-03-29", "2026-03-30", 1380), ("2026-10-25", "2026-10-26", 1440)):
        when, tz = timing("* * * * *", BERLIN), cron.zone("", BERLIN)
        start = datetime.fromisoformat(f"{day}T00:00").replace(tzinfo=tz).timestamp()
        end = datetime.fromisoformat(f"{next_day}T00:00").replace(tzinfo=tz).timestamp()
        t, seen = start, []
        while (t := when.after(t)) <= end:
            seen.append(datetime.fromtimestamp(t, tz).strftime("%H:%M"))
        assert len(seen) == count and len(set(seen)) == count  # no wall-clock minute twice
        assert seen[-1] == "00:00"


def test_a_rare_expression_is_found_without_scanning() -> None:
    """29 February from just after one: four years away, found by jumping months and days
    (well under a millisecond); and a long catch-up of minutely fires stays cheap."""
    when = timing("0 0 29 2 *", NEW_YORK)
    assert iso(when.after(at("2028-02-29T05:00Z"))) == "2032-02-29T05:00Z"
    assert cron.parse("@weekly") == cron.parse("0 0 * * 0") == cron.parse("0 0 * * 7") == cron.parse("0 0 * * sun")
    assert cron.parse("@daily") == cron.parse("@midnight") == cron.parse("0 0 * * *")
    assert cron.parse("@yearly") == cron.parse("@annually") == cron.parse("0 0 1 jan *")


BAD_CRON: list[object] = [
    "* * * *", "* * * * * *", "", " ", "0 0 * * * ", " 0 0 * * *", "0 0 * *  ",
    "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 0 *", "* * * 13 *", "* * * * 8",
    "*/0 * * * *", "*/61 * * * *", "0 0 1-31/" + "9" * 5000 + " * *", "*/" + "0" * 5000 + "5 * * * *", "5-3 * * * *", "* * * DEC-JAN *", "1- * * * *", "-1 * * * *", "1,,2 * * * *",
    ",1 * * * *", "*/5/2 * * * *", "*/ * * * *", "001 * * * *", "0x1 * * * *", "\uff11 * * * *", "1.5 * * * *",
    "JAN * * * *", "* MON * * *", "* * * FOO *", "* * * * MONDAY", "* * * * SU", "* * * JANUARY *",
    "0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30-31 2 *",
    "0 0 L * *", "0 0 * * 5L", "0 0 * * MON#1", "0 0 ? * *", "0 0 15W * *", "H * * * *",
    "@reboot", "@DAILY", "@Hourly", "@daily ", "@week", "@", "@every", "@every 1 m", "@every 0s", "@every 5",
    None, 5, b"0 0 * * *", ["0", "0", "*", "*", "*"],
]


@pytest.mark.parametrize("spec", BAD_CRON, ids=lambda spec: repr(spec)[:60])
def test_bad_specs_raise_invalid_spec_with_the_spec_and_write_nothing(
    db: Target, store: alk.Store, qname: str, spec: object
) -> None:
    with pytest.raises(alk.InvalidSpec) as info:
        timing(spec, "UTC")
    assert info.value.spec is spec
    with pytest.raises(alk.InvalidSpec) as info:
        store.schedule("bad", spec, qname, {}, tz=BERLIN)  # type: ignore[arg-type]
    assert info.value.spec is spec
    assert isinstance(info.value, alk.AlkstoreError) and isinstance(info.value, ValueError)
    assert store.schedules() == []


BAD_ZONES: list[object] = [
    "Mars/Olympus_Mons", "", "Europe/Berlin ", "europe/berlin_", "localtime", "posixrules", "/etc/localtime",
    "Europe/../UTC", "../../etc/passwd", "UTC\x00", None, 0, b"UTC", BERLIN.encode(),
]


@pytest.mark.parametrize("tz", BAD_ZONES, ids=repr)
@pytest.mark.parametrize("spec", ["0 3 * * *", "@daily", "@every 1h"])
def test_unknown_zones_raise_invalid_spec_and_write_nothing(
    db: Target, store: alk.Store, qname: str, spec: str, tz: object
) -> None:
    with pytest.raises(alk.InvalidSpec) as info:
        store.schedule("bad-zone", spec, qname, {}, tz=tz)  # type: ignore[arg-type]
    assert info.value.spec is spec and repr(tz) in str(info.value)
    assert store.schedules() == []


@pytest.mark.parametrize("before", [1e-6, 5e-7, 2.4e-7])
@pytest.mark.parametrize("tz", ["UTC", BERLIN])
def test_the_next_fire_after_an_instant_just_short_of_a_boundary_is_that_boundary(tz: str, before: float) -> None:
    """An instant a fraction of a microsecond short of a boundary (a clock reading such as
    time.time()'s 59.9999998 s) is before it: the boundary is the next fire, not skipped
    for the one after (a wall-clock reading rounded to the microsecond showed the boundary's
    own minute)."""
    boundary = at("2027-01-15T09:00Z")
    assert boundary - before < boundary  # a float apart
    for spec in ("0 * * * *", "* * * * *", "0 9,10 * * *"):
        assert timing(spec, tz).after(boundary - before) == boundary, spec


def test_registering_just_short_of_a_boundary_keeps_that_boundary(store: alk.Store, clock: FakeClock, qname: str) -> None:
    clock.now = at("2027-01-15T09:00Z") - 2.4e-7  # 1800003599.9999998: 0.24 µs before it
    store.schedule("hourly", "@hourly", qname, {})
    assert store.schedules()[0].next_fire_at == datetime(2027, 1, 15, 9, tzinfo=UTC)


# -- through the scheduler's tick, on both engines ----------------------------------------------


def fire_times(store: alk.Store, clock: FakeClock, start: str, end: str, step: float) -> list[tuple[str, int]]:
    """Tick at every ``step`` seconds from ``start`` to ``end``: (instant, jobs) of each fire."""
    sch = Scheduler(store)
    out = []
    while clock() < at(end):
        clock.advance(step)
        fired = sch.tick()
        if fired:
            out.append((iso(clock()), fired))
        assert sch.tick() == 0  # the same instant again fires nothing
    return out


@pytest.mark.parametrize(
    ("spec", "tz", "start", "end", "step", "expected"),
    [
        ("*/30 * * * *", BERLIN, "2026-10-24T23:40Z", "2026-10-25T02:40Z", 300,
         ["2026-10-25T00:00Z", "2026-10-25T00:30Z", "2026-10-25T02:00Z", "2026-10-25T02:30Z"]),
        ("30 2 * * *", BERLIN, "2026-03-28T12:00Z", "2026-03-30T01:00Z", 1800,
         ["2026-03-29T01:00Z", "2026-03-30T00:30Z"]),
        ("0 * * * *", NEW_YORK, "2026-11-01T04:10Z", "2026-11-01T09:00Z", 600,
         ["2026-11-01T05:00Z", "2026-11-01T07:00Z", "2026-11-01T08:00Z", "2026-11-01T09:00Z"]),
        ("30 2 * * *", NEW_YORK, "2026-03-07T12:00Z", "2026-03-09T07:00Z", 1800,
         ["2026-03-08T07:00Z", "2026-03-09T06:30Z"]),
    ],
    ids=["berlin-fall-*/30", "berlin-spring-02:30", "ny-fall-hourly", "ny-spring-02:30"],
)
def test_tick_fires_at_the_right_instants_across_dst(
    db: Target, store: alk.Store, clock: FakeClock, qname: str,
    spec: str, tz: str, start: str, end: str, step: float, expected: list[str],
) -> None:
    clock.now = at(start)
    store.schedule("dst", spec, qname, {"spec": spec}, tz=tz)
    s = store.schedules()[0]
    assert (s.spec, s.tz, s.interval) == (spec, tz, None)
    assert iso(s.next_fire_at.timestamp()) == expected[0]
    assert fire_times(store, clock, start, end, step) == [(t, 1) for t in expected]
    assert store.queue(qname).stats().pending == len(expected)


def test_catch_up_replays_each_boundary_up_to_64_across_a_change(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Missed boundaries replay one by one (the repeated hour stays silent in a catch-up
    too); beyond 64, the schedule skips forward to the first boundary after now."""
    clock.now = at("2026-10-24T23:50Z")
    store.schedule("short", "*/30 * * * *", qname + "-short", {}, tz=BERLIN)
    store.schedule("long", "* * * * *", qname + "-long", {}, tz=BERLIN)
    clock.now = at("2026-10-25T02:10Z") + 30  # 03:10:30 CET
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        fired = Scheduler(store).tick()
    # short: 02:00 and 02:30 CEST, (silent repeated hour), 03:00 CET; long: capped
    assert fired == 3 + 64
    assert store.queue(qname + "-short").stats().pending == 3
    assert store.queue(qname + "-long").stats().pending == 64
    assert "'long': its missed boundaries beyond the catch-up cap were skipped" in caplog.text
    assert "'short'" not in caplog.text
    nxt = {s.name: iso(s.next_fire_at.timestamp()) for s in store.schedules()}
    assert nxt == {"long": "2026-10-25T02:11Z", "short": "2026-10-25T02:30Z"}
    clock.now = at("2026-10-25T02:11Z")
    assert Scheduler(store).tick() == 1


@pytest.mark.parametrize("missed", [1, 63, 64, 65])
def test_catch_up_cap_edges(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, missed: int
) -> None:
    clock.now = at("2026-06-01T00:00Z")
    store.schedule("m", "* * * * *", qname, {}, tz=NEW_YORK)
    clock.advance(60 * missed + 30)
    assert Scheduler(store).tick() == min(missed, 64)
    assert store.schedules()[0].next_fire_at.timestamp() == at("2026-06-01T00:00Z") + 60 * (missed + 1)


def test_reregistration_keeps_the_next_fire_only_for_the_same_spec_and_zone(
    db: Target, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    clock.now = at("2026-01-07T10:20Z")

    def nxt() -> str:
        return iso(store.schedules()[0].next_fire_at.timestamp())

    store.schedule("r", "0 3 * * *", qname, {"v": 1}, tz=BERLIN)
    assert nxt() == "2026-01-08T02:00Z"
    clock.now = at("2026-01-08T02:00Z") + 5  # due, unfired
    store.schedule("r", "0 3 * * *", qname, {"v": 2}, tz=BERLIN, priority=4)
    assert nxt() == "2026-01-08T02:00Z"  # same spec, same zone: kept (and still due)
    assert store.schedules()[0].payload == {"v": 2}
    store.schedule("r", "0 3 * * *", qname, {"v": 3}, tz=NEW_YORK)
    assert nxt() == "2026-01-08T08:00Z"  # another zone: recomputed from now
    store.schedule("r", "0 4 * * *", qname, {"v": 3}, tz=NEW_YORK)
    assert nxt() == "2026-01-08T09:00Z"  # another spec: recomputed
    store.schedule("r", "@every 1h", qname, {}, tz=NEW_YORK)
    s = store.schedules()[0]
    assert (s.interval, s.tz, nxt()) == (3600.0, NEW_YORK, "2026-01-08T03:00Z")  # epoch-aligned
    store.schedule("r", "@every 60m", qname, {}, tz="UTC")
    assert nxt() == "2026-01-08T03:00Z"  # @every: the zone changes nothing, the boundary is kept
    store.schedule("r", "0 3 * * *", qname, {}, tz="UTC")
    assert (store.schedules()[0].interval, nxt()) == (None, "2026-01-08T03:00Z")
    assert Scheduler(store).tick() == 0


def test_two_tickers_fire_each_boundary_once(db: Target, clock: FakeClock, qname: str) -> None:
    """Two stores (separate connections, as two runner processes would have) tick at the same
    instants across the Berlin fall-back: the row-locked advance lets one of them fire."""
    clock.now = at("2026-10-25T00:00Z") + 5
    stores = [db.store(clock=clock) for _ in range(2)]
    try:
        stores[0].schedule("race", "*/10 * * * *", qname, {}, tz=BERLIN)
        schedulers = [Scheduler(s) for s in stores]
        barrier = threading.Barrier(2)
        totals = [0, 0]
        errors: list[BaseException] = []

        def ticker(i: int) -> None:
            try:
                for _ in range(30):
                    barrier.wait(30)
                    if i == 0:
                        clock.advance(7 * 60)
                    barrier.wait(30)
                    totals[i] += schedulers[i].tick()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=ticker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        # 00:00Z + 5 s + 210 min: the boundaries are 00:10Z … 00:50Z, (01:xxZ is the silent
        # repeated hour), 02:00Z … 03:30Z
        expected = 5 + 10
        assert sum(totals) == expected
        assert stores[0].queue(qname).stats().pending == expected
        assert iso(stores[0].schedules()[0].next_fire_at.timestamp()) == "2026-10-25T03:40Z"
    finally:
        for s in stores:
            s.close()


def test_leader_failover_fires_each_boundary_at_most_once(
    db: Target, clock: FakeClock, qname: str
) -> None:
    """Two runners' rounds, driven one at a time on the injected clock: A leads and fires each
    minute; A dies (its rounds stop, its lease is not released) before Berlin's repeated hour;
    B takes over once A's lease lapses and catches up every missed boundary once (the
    repeated hour stays silent); A, resuming, loses its lease and its rogue tick fires nothing."""
    lease = 120.0
    clock.now = at("2026-10-25T00:40Z")  # 02:40 CEST
    a, b = db.store(clock=clock), db.store(clock=clock)
    try:
        a.schedule("minutely", "* * * * *", qname, {}, tz=BERLIN)
        runner_a = LeaderLoop(Scheduler(a), lease, "runner-a")
        runner_b = LeaderLoop(Scheduler(b), lease, "runner-b")
        for _ in range(10):  # 00:41Z … 00:50Z
            clock.advance(60)
            runner_a._round()
            runner_b._round()
        assert alk.Lock._reserved(a, LEADER_LOCK).holder().owner == "runner-a"  # type: ignore[union-attr]
        assert a.queue(qname).stats().pending == 10
        clock.advance(30)  # A dies here, at 00:50:30Z
        clock.now = at("2026-10-25T02:05Z")  # 03:05 CET: the lease lapsed long ago
        runner_b._round()
        assert alk.Lock._reserved(a, LEADER_LOCK).holder().owner == "runner-b"  # type: ignore[union-attr]
        # 02:51 … 02:59 CEST (00:51Z … 00:59Z), then 03:00 … 03:05 CET (02:00Z … 02:05Z)
        assert a.queue(qname).stats().pending == 10 + 9 + 6
        with pytest.raises(alk.LeadershipLost):
            runner_a._round()
        assert Scheduler(a).tick() == 0  # a rogue in-flight tick
        runner_b._round()
        assert a.queue(qname).stats().pending == 25
        clock.advance(60)
        runner_b._round()
        assert a.queue(qname).stats().pending == 26
        assert iso(a.schedules()[0].next_fire_at.timestamp()) == "2026-10-25T02:07Z"
    finally:
        a.close()
        b.close()


def test_a_zone_this_runner_does_not_know_fails_that_schedule_only(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A zone another host registered but this runner's time zone database lacks: that
    schedule fails like any schedule that cannot fire (logged, left due); others fire."""
    store.schedule("elsewhere", "* * * * *", qname, {}, tz=BERLIN)
    store.schedule("here", "* * * * *", qname + "-here", {})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET tz = 'Mars/Olympus_Mons' WHERE name = 'elsewhere'")
    clock.advance(60)
    with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
        assert Scheduler(store).tick() == 1
    assert "schedule 'elsewhere' could not fire" in caplog.text and "Mars/Olympus_Mons" in caplog.text
    assert store.queue(qname + "-here").stats().pending == 1


# -- an older runner (schema step 1, no cron) against a cron row -------------------------------

ROOT = Path(__file__).resolve().parents[2]
OLD_RUNNER = Path(__file__).with_name("cron_old_runner.py")
STEP1_COMMITS = ("e3cc8825d9906f618e6c9a1c3e960eb1570a8246", "ab81f3dbcc6d48a827ad989faddbcddfec910568")


@pytest.fixture(scope="module", params=STEP1_COMMITS, ids=lambda c: c[:7])
def old_package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A schema-step-1 release's ``alkstore_sa``, exported from git (PYTHONPATH directory)."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", request.param, "alkstore_sa"],
        capture_output=True, timeout=120,
    )
    if proc.returncode != 0:
        reason = f"needs the git history (not a shallow clone): cannot export {request.param[:7]} from git: {proc.stderr.decode().strip()}"
        pytest.skip(reason)
    dest = tmp_path_factory.mktemp(f"old-{request.param[:7]}")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")
    yield dest


def old_tick(package: Path, db: Target, now: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(OLD_RUNNER), db.url, db.schema, str(package), repr(now)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(package)},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_an_older_runner_fires_a_cron_row_at_most_once_then_a_current_one_resumes_it(
    db: Target, store: alk.Store, clock: FakeClock, qname: str, old_package: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """During a rolling deploy an old runner may lead. It reads only ``interval`` and
    ``next_fire_at``: for a cron row it fires the due boundary once, on time, then parks the
    row (the stored interval is the last second of year 9999); it never fires it off its
    boundaries or twice, and still lists it. A current runner then resumes the row at its next
    boundary after now, firing nothing for the boundary the old one fired."""
    clock.now = at("2026-10-24T12:00Z")
    store.schedule("nightly", "30 2 * * *", qname, {"n": 1}, tz=BERLIN, priority=3)
    store.schedule("every", "@every 1h", qname + "-every", {})
    (row,) = [s for s in store.schedules() if s.name == "nightly"]
    assert iso(row.next_fire_at.timestamp()) == "2026-10-25T00:30Z"

    first = old_tick(old_package, db, at("2026-10-25T00:30Z") + 20)
    assert first["fired"] == 1 + 12  # its boundary, once; and the @every schedule as usual
    assert first["next"]["nightly"] == CRON_INTERVAL
    assert first["listed"]["nightly"] == "9999-12-31T23:59:59+00:00"
    assert store.queue(qname).stats().pending == 1
    clock.now = at("2026-10-25T00:30Z") + 30
    handle = store.queue(qname).claim_one("check")  # the fire carries the schedule's stamps
    assert handle is not None and handle.payload == {"n": 1} and handle.job.priority == 3
    assert handle.ack()
    # the repeated 02:30 (01:30Z) and the next night pass: the parked row fires nothing
    again = old_tick(old_package, db, at("2026-10-26T01:30Z") + 20)
    assert again["fired"] == 25 and again["next"]["nightly"] == CRON_INTERVAL
    assert store.queue(qname).stats().pending == 0

    clock.now = at("2026-10-26T01:30Z") + 40
    parked = [s for s in store.schedules() if s.name == "nightly"][0]
    assert parked.next_fire_at.timestamp() == CRON_INTERVAL
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        assert Scheduler(store).tick() == 0
    assert "'nightly' was fired by an older alkstore runner" in caplog.text
    resumed = [s for s in store.schedules() if s.name == "nightly"][0]
    assert iso(resumed.next_fire_at.timestamp()) == "2026-10-27T01:30Z"
    clock.now = at("2026-10-27T01:30Z")
    assert Scheduler(store).tick() == 1 + 24
    assert store.queue(qname).stats().pending == 1  # 2026-10-27's fire; the 26th's was lost


# -- against a brute-force reading of the rule ---------------------------------------------------


def brute_force(spec: str, tz: str, start: float, end: float) -> list[float]:
    """The fire instants in (start, end], minute by minute, straight from the rule: instant
    ``u`` fires when a matching wall-clock time first becomes reached at ``u`` — one in
    (the latest wall-clock time shown before ``u``, the one ``u`` shows]."""
    expr, zone = cron.parse(spec), cron.zone(spec, tz)

    def wall(t: float) -> datetime:
        return datetime.fromtimestamp(t, zone).replace(tzinfo=None, fold=0)

    def matches(w: datetime) -> bool:
        return w.minute in expr.minutes and w.hour in expr.hours and w.month in expr.months and expr.day_matches(w)

    out, shown = [], wall(start)
    u = start - start % 60
    while (u := u + 60) <= end:
        now_shows = wall(u)
        w = shown.replace(second=0, microsecond=0)
        fired = False
        while not fired and (w := w + timedelta(minutes=1)) <= now_shows:
            fired = matches(w)
        if fired:
            out.append(u)
        shown = max(shown, now_shows)
    return out


# Transitions of 2026 (UTC dates) in zones with other shapes: a 30-minute DST (Lord Howe),
# a southern-hemisphere fall-back (Santiago), negative DST in the data (Dublin), +05:45.
ZONE_CHANGES = [
    (BERLIN, "2026-03-29"), (BERLIN, "2026-10-25"), (NEW_YORK, "2026-03-08"), (NEW_YORK, "2026-11-01"),
    ("Australia/Lord_Howe", "2026-04-04"), ("Australia/Lord_Howe", "2026-10-03"),
    ("America/Santiago", "2026-04-05"), ("America/Santiago", "2026-09-06"),
    ("Europe/Dublin", "2026-03-29"), ("Europe/Dublin", "2026-10-25"), ("Asia/Kathmandu", "2026-06-01"),
]
SPECS = ["* * * * *", "*/7 * * * *", "15,45 * * * *", "0 * * * *", "30 1-3 * * *", "0 0 * * *", "10 2 * * SUN"]


@pytest.mark.parametrize(("tz", "day"), ZONE_CHANGES, ids=lambda x: str(x))
def test_next_fire_agrees_with_a_brute_force_reading_of_the_rule(tz: str, day: str) -> None:
    start = at(f"{day}T00:00Z") - 36 * 3600 + 17.5  # not on a minute
    end = start + 72 * 3600
    for spec in SPECS:
        when, got, t = timing(spec, tz), [], start
        while (t := when.after(t)) <= end:
            got.append(t)
        assert [iso(x) for x in got] == [iso(x) for x in brute_force(spec, tz, start, end)], spec
