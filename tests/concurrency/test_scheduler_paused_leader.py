"""A leader frozen past its lease (SIGSTOP, as a VM pause or a debugger does) and thawed
(SIGCONT) after a standby took over (SPEC §7, docs/scheduler.md "The runner and
leadership"): two ``alkstore run-schedules`` processes on the database clock, a 2 s lease
and an ``@every 1s`` schedule. The thawed runner must learn from its refused renewal that it
lost the lease (``LeadershipLost``: the CLI logs it and waits as a standby) and fire nothing on the
old lease; every boundary from the first is fired exactly once across both leaders."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import alkstore_sa as alk
from alkstore_sa.scheduler import LEADER_LOCK
from tests.concurrency.schedule_runners import INTERVAL, LEADS, fired, start_runners
from tests.support import Target, wait_for


@pytest.mark.slow
def test_a_leader_frozen_past_its_lease_fires_nothing_once_thawed(db: Target, qname: str, tmp_path: Path) -> None:
    store = db.store()
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"runner-{i}.log" for i in range(2)]
    frozen: int | None = None
    # registered, and its first boundary read, before any runner starts: once one leads, it
    # may fire that boundary between the two statements (a stall of a second on a loaded
    # machine), and the first boundary read would be the second one
    store.schedule("paused", "@every 1s", qname, {})
    first_boundary = store.schedules()[0].next_fire_at.timestamp()
    try:
        start_runners(db, logs, procs)

        def leaders() -> list[str]:
            for p in procs:
                assert p.poll() is None, "a runner exited:\n" + "\n".join(x.read_text() for x in logs)
            return [m for log in logs for m in LEADS.findall(log.read_text())]

        def leading(i: int) -> bool:
            return bool(LEADS.search(logs[i].read_text()))

        wait_for(leaders, "a runner to lead", 60)
        first = 0 if leading(0) else 1
        other = 1 - first
        wait_for(lambda: len(fired(db, qname)) >= 2, "the first leader to fire", 15)

        os.kill(procs[first].pid, signal.SIGSTOP)
        frozen = first
        wait_for(lambda: leading(other), "the standby to take over", 15)
        wait_for(lambda: len(fired(db, qname)) >= 6, "the new leader to fire", 15)
        os.kill(procs[first].pid, signal.SIGCONT)
        frozen = None
        # the CLI logs the LeadershipLost of its refused renewal and waits as a standby
        wait_for(lambda: "waiting to lead again" in logs[first].read_text(), "the thawed runner to learn it lost the lease", 15)
        thawed_at = time.time()
        wait_for(lambda: time.time() > thawed_at + 3 * INTERVAL, "a few more boundaries", 10)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(15) == 0
    finally:
        for p in procs:
            if frozen is not None:
                os.kill(p.pid, signal.SIGCONT)
            if p.poll() is None:
                p.kill()
                p.wait(10)
    try:
        jobs = [created for _, created in fired(db, qname)]
        final_next = store.schedules()[0].next_fire_at.timestamp()
        assert alk.Lock._reserved(store, LEADER_LOCK).holder() is None
    finally:
        store.close()
    n = len(jobs)
    # each fire advanced the schedule by the boundaries it fired: a double fire makes n larger
    assert final_next == first_boundary + n * INTERVAL, (first_boundary, final_next, n, logs[first].read_text())
    lateness = [created - (first_boundary + k * INTERVAL) for k, created in enumerate(jobs)]
    assert min(lateness) >= -1e-3, lateness
    assert "leads" in logs[other].read_text()
