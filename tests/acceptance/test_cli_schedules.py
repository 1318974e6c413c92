"""The ``alkstore schedules`` and ``alkstore run-schedules`` commands, run as real
subprocesses (the installed console script) against real databases on both engines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

import alkstore_sa as alk
from alkstore_sa.scheduler import LEADER_LOCK
from tests.support import FakeClock, Target

ALKSTORE = str(Path(sys.executable).parent / "alkstore")
T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _no_leftover_schedules(request: pytest.FixtureRequest) -> None:
    """Tests of one PostgreSQL module share a schema: each starts with no schedules."""
    if "db" in request.fixturenames:
        db: Target = request.getfixturevalue("db")
        for table in ("alkstore_schedules", "alkstore_locks"):
            db.execute(f"DELETE FROM {db.table(table)}")


def env_without_database() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ALKSTORE_DATABASE_URL", None)
    env.pop("ALKSTORE_SCHEMA", None)
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ALKSTORE, *args], capture_output=True, text=True, timeout=60,
        env=env_without_database() if env is None else env, stdin=subprocess.DEVNULL,
    )


def db_args(db: Target) -> list[str]:
    return ["--url", db.url, "--schema", db.schema]


def iso(ts: float, **kw: str) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(**kw)


def test_schedules_lists_nothing(db: Target) -> None:
    out = cli("schedules", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "(no schedules)\n"
    out = cli("schedules", "--json", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


@pytest.fixture
def registered(db: Target) -> Iterator[alk.Store]:
    clock = FakeClock(T0 + 10)
    store = db.store(clock=clock)
    store.schedule("nightly", "@every 1d", "reports", {"kind": "nightly"})
    store.schedule(
        "maintenance", "@every 5m", "maint", {"queues": ["emails", "reports"]},
        priority=3, max_attempts=2, expires=240,
    )
    store.schedule("café-ticker", "@every 90s", "ünïcode", ["é", 1, None])
    yield store
    store.close()


def test_schedules_lists_every_schedule_by_name(db: Target, registered: alk.Store) -> None:
    out = cli("schedules", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"café-ticker\t@every 90s\t-> ünïcode\tnext {iso(T0 + 90, timespec='seconds')}",
        f"maintenance\t@every 5m\t-> maint\tnext {iso(T0 + 300, timespec='seconds')}",
        f"nightly\t@every 1d\t-> reports\tnext {iso(1_800_057_600.0, timespec='seconds')}",
    ]


def test_schedules_json(db: Target, registered: alk.Store) -> None:
    out = cli("schedules", "--json", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        {
            "name": "café-ticker", "spec": "@every 90s", "queue": "ünïcode", "payload": ["é", 1, None],
            "priority": 0, "max_attempts": None, "expires": None, "next_fire_at": iso(T0 + 90),
            "tz": "UTC", "next_fire_local": iso(T0 + 90),
        },
        {
            "name": "maintenance", "spec": "@every 5m", "queue": "maint",
            "payload": {"queues": ["emails", "reports"]}, "priority": 3, "max_attempts": 2,
            "expires": 240.0, "next_fire_at": iso(T0 + 300), "tz": "UTC", "next_fire_local": iso(T0 + 300),
        },
        {
            "name": "nightly", "spec": "@every 1d", "queue": "reports", "payload": {"kind": "nightly"},
            "priority": 0, "max_attempts": None, "expires": None, "next_fire_at": iso(1_800_057_600.0),
            "tz": "UTC", "next_fire_local": iso(1_800_057_600.0),
        },
    ]
    # what the CLI shows is what the library reads
    assert [s.name for s in registered.schedules()] == [d["name"] for d in json.loads(out.stdout)]


def test_schedules_lists_one_whose_stored_payload_is_not_json(db: Target, registered: alk.Store) -> None:
    """A schedule row edited by hand to a payload that is not JSON: ``schedules`` lists it
    with the others, and ``--json`` gives its payload as null with the text as stored
    (both failed with "unexpected error: JSONDecodeError")."""
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET payload = '{{oops' WHERE name = 'nightly'")
    out = cli("schedules", *db_args(db))
    assert out.returncode == 0, out.stderr
    assert [line.split("\t")[0] for line in out.stdout.splitlines()] == ["café-ticker", "maintenance", "nightly"]
    out = cli("schedules", "--json", *db_args(db))
    assert out.returncode == 0, out.stderr
    listed = {d["name"]: d for d in json.loads(out.stdout)}
    assert listed["nightly"]["payload"] is None and listed["nightly"]["stored_payload"] == "{oops"
    assert "payload_error" in listed["nightly"] and listed["maintenance"]["payload"] == {"queues": ["emails", "reports"]}
    assert "stored_payload" not in listed["maintenance"]


def test_schedules_reads_the_environment(db: Target, registered: alk.Store) -> None:
    env = env_without_database()
    env["ALKSTORE_DATABASE_URL"] = db.url
    env["ALKSTORE_SCHEMA"] = db.schema
    out = cli("schedules", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert [d["name"] for d in json.loads(out.stdout)] == ["café-ticker", "maintenance", "nightly"]


def test_schedules_without_a_database(tmp_path: Path) -> None:
    out = cli("schedules")
    assert out.returncode != 0
    assert "no database URL" in out.stderr
    empty = tmp_path / "empty.db"
    empty.touch()  # an existing database without the tables (a missing file is refused earlier)
    out = cli("schedules", "--url", f"sqlite:///{empty}")
    assert out.returncode == 2
    assert "not installed" in out.stderr


def test_run_schedules_fires_while_leading_and_stops_on_sigterm(
    db: Target, qname: str, tmp_path: Path
) -> None:
    store = db.store()
    log = tmp_path / "run-schedules.log"
    try:
        store.schedule("every-second", "@every 1s", qname, {"from": "cli"})
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [ALKSTORE, "run-schedules", "--lease", "3", *db_args(db)],
                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                env=env_without_database(),
            )
        try:
            deadline = time.monotonic() + 60
            while store.queue(qname).stats().pending < 1:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "run-schedules fired nothing"
                time.sleep(0.05)
            holder = alk.Lock._reserved(store, LEADER_LOCK).holder()
            assert holder is not None
            assert re.search(rf"scheduler {re.escape(holder.owner)} leads", log.read_text())
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert alk.Lock._reserved(store, LEADER_LOCK).holder() is None  # a stop releases the lease
        h = store.queue(qname).claim_one("w")
        assert h is not None and h.payload == {"from": "cli"}
    finally:
        store.close()
