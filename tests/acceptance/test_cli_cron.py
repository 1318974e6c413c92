"""``alkstore schedules`` with cron schedules (SPEC §14), run as a real subprocess on both
engines: the spec as registered, and the next fire in the schedule's own zone (named unless
UTC); ``--json`` adds the zone and that local time beside the UTC instant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

import alkstore_sa as alk
from alkstore_sa.scheduler import CRON_INTERVAL
from tests.acceptance.test_cli_schedules import cli, db_args
from tests.support import FakeClock, Target

T0 = datetime(2026, 3, 28, 12, 0, tzinfo=timezone.utc).timestamp()  # the day before Berlin springs forward


@pytest.fixture(autouse=True)
def _no_leftover_schedules(db: Target) -> None:
    db.execute(f"DELETE FROM {db.table('alkstore_schedules')}")


@pytest.fixture
def registered(db: Target) -> Iterator[alk.Store]:
    store = db.store(clock=FakeClock(T0))
    store.schedule("berlin-night", "30 2 * * *", "reports", {"k": 1}, tz="Europe/Berlin")
    store.schedule("ny-weekdays", "0 9 * * MON-FRI", "mail", {}, tz="America/New_York")
    store.schedule("utc-hourly", "@hourly", "ticks", [])
    store.schedule("every", "@every 1d", "daily", {}, tz="Asia/Tokyo")
    yield store
    store.close()


def test_schedules_show_cron_specs_and_the_next_fire_in_their_zone(db: Target, registered: alk.Store) -> None:
    out = cli("schedules", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        # 02:30 does not exist on 2026-03-29 in Berlin: it fires at 03:00 CEST
        "berlin-night\t30 2 * * *\t-> reports\tnext 2026-03-29T03:00:00+02:00 (Europe/Berlin)",
        "every\t@every 1d\t-> daily\tnext 2026-03-29T09:00:00+09:00 (Asia/Tokyo)",  # UTC midnight
        "ny-weekdays\t0 9 * * MON-FRI\t-> mail\tnext 2026-03-30T09:00:00-04:00 (America/New_York)",
        "utc-hourly\t@hourly\t-> ticks\tnext 2026-03-28T13:00:00+00:00",
    ]


def test_schedules_json_has_the_zone_and_the_local_next_fire(db: Target, registered: alk.Store) -> None:
    out = cli("schedules", "--json", *db_args(db))
    assert out.returncode == 0, out.stderr
    by_name = {d["name"]: d for d in json.loads(out.stdout)}
    assert by_name["berlin-night"] == {
        "name": "berlin-night", "spec": "30 2 * * *", "tz": "Europe/Berlin", "queue": "reports",
        "payload": {"k": 1}, "priority": 0, "max_attempts": None, "expires": None,
        "next_fire_at": "2026-03-29T01:00:00+00:00", "next_fire_local": "2026-03-29T03:00:00+02:00",
    }
    assert (by_name["utc-hourly"]["tz"], by_name["utc-hourly"]["next_fire_local"]) == (
        "UTC", "2026-03-28T13:00:00+00:00",
    )


def test_a_row_an_older_runner_parked_is_listed_in_utc(db: Target, registered: alk.Store) -> None:
    """An older runner parks a cron row it fired at the end of year 9999 (docs/scheduler.md),
    which no zone east of UTC can show: the listing falls back to UTC instead of failing."""
    db.execute(
        f"UPDATE {db.table('alkstore_schedules')} SET next_fire_at = :parked WHERE name = 'berlin-night'",
        parked=CRON_INTERVAL,
    )
    out = cli("schedules", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        "berlin-night\t30 2 * * *\t-> reports\tnext 9999-12-31T23:59:59+00:00 (Europe/Berlin)"
    )
