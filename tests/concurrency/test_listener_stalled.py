"""SPEC §9: a notify committed after ``listen()`` returned is delivered to that
subscription, also when its process was stopped (SIGSTOP: a debugger, a swapped-out or
starved process) while far more notifications committed than SQLite's table keeps for
nobody in particular. PostgreSQL's queue holds them for the stopped listener; on SQLite the
watcher's saved reading place makes notify's prune keep them (it once kept only the newest
1,024, and the stopped listener silently lost the rest)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import alkstore_sa as alk
from alkstore_sa._backends.sqlite import NOTIFY_KEEP, NOTIFY_READER_TTL
from tests.concurrency import harness, listen_workers
from tests.support import Target

STARTUP = 60.0  # a spawned child imports SQLAlchemy + psycopg first
COUNT = 3 * NOTIFY_KEEP  # sent while the listener is stopped: three times what SQLite keeps


def _stalled_run(db: Target, tmp_path: Path, notifier: alk.Store) -> dict[str, Any]:
    """Start a listener process, stop it, send COUNT notifications and END through
    ``notifier``, let it run again; its result."""
    ready = tmp_path / "ready"
    spec = {"url": db.url, "schema": db.schema, "channel": "stalled", "ready": str(ready), "wait": 60.0}
    group = harness.start(listen_workers.stalled_listener, [spec], tmp_path)
    (proc,) = group.procs
    deadline = time.monotonic() + STARTUP
    while not ready.exists():
        assert proc.is_alive(), "the listener process exited before it listened"
        assert time.monotonic() < deadline, "the listener never said it listens"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGSTOP)
    _wait_stopped(proc.pid)  # a thread running on the other core goes on until it is stopped
    try:
        for i in range(COUNT):
            notifier.notify("stalled", str(i))
        notifier.notify("stalled", listen_workers.END)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        notifier.close()
    harness.join_all(group.procs, 120)
    (result,) = harness.collect(group.procs, group.outs)
    assert result["ended"], "the END notification never arrived"
    return result  # type: ignore[no-any-return]


def _wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped (state T in /proc): SIGSTOP returns before a
    thread running on another core has stopped, and that thread could still read a
    notification sent right after."""
    deadline = time.monotonic() + STARTUP
    while True:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue  # a thread that just ended
        if states and all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"the listener's threads never stopped: {states}"
        time.sleep(0.005)


def test_a_stopped_listener_gets_every_notification_after_it_resumes(db: Target, tmp_path: Path) -> None:
    result = _stalled_run(db, tmp_path, db.store())
    got = [int(p) for p in result["got"]]
    missing = sorted(set(range(COUNT)) - set(got))
    assert not missing, f"{len(missing)} of {COUNT} notifications lost (first: {missing[:5]})"
    assert got == list(range(COUNT)), "out of order or duplicated"
    assert result["errors"] == []


def test_sqlite_a_listener_stopped_past_the_ttl_says_how_many_it_missed(sqlite_db: Target, tmp_path: Path) -> None:
    """The notifier's clock runs NOTIFY_READER_TTL ahead: to its prune the stopped process
    is gone, so its rows go. Once running again the listener gets the newest rows and logs
    exactly how many it missed, instead of missing them silently."""
    ahead = alk.Store(sqlite_db.url, clock=lambda: time.time() + NOTIFY_READER_TTL + 5)
    result = _stalled_run(sqlite_db, tmp_path, ahead)
    got = [int(p) for p in result["got"]]
    assert got and got == list(range(COUNT - len(got), COUNT)), "not the newest, in order"
    missed = COUNT - len(got)
    assert missed > 0
    (error,) = result["errors"]
    assert f"{missed} notifications were pruned before this process read them" in error, error
