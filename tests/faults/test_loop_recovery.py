"""``alkstore run-schedules`` processes ride out a PostgreSQL outage (issue 9 item 12): a
leader and a standby, every backend of theirs terminated again and again for half a
second (they run with ``PGAPPNAME`` set, so only their connections are killed). Neither
exits; the schedule keeps firing afterwards; SIGTERM then stops both with exit code 0
and the leader's lease is released, not left to lapse."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import alkstore_sa as alk
from alkstore_sa.scheduler import LEADER_LOCK
from tests.outages import kill_backends
from tests.support import Target, wait_for

ALKSTORE = str(Path(sys.executable).parent / "alkstore")
LEADS = re.compile(r"scheduler (\S+) leads")


@pytest.fixture
def pg(_pg_module_target: Target) -> Target:
    for table in ("alkstore_schedules", "alkstore_locks"):
        _pg_module_target.execute(f"DELETE FROM {_pg_module_target.table(table)}")
    return _pg_module_target


def count_jobs(db: Target, queue: str) -> int:
    return int(db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=queue))  # type: ignore[arg-type]


def test_run_schedules_processes_survive_killed_connections_and_exit_0_on_sigterm(
    pg: Target, qname: str, tmp_path: Path
) -> None:
    app = f"alk-cli-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    store = pg.store()  # untagged: the kills never touch the test's own connections
    logs = [tmp_path / f"runner-{i}.log" for i in range(2)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        store.schedule("cli-killed", "@every 1s", qname, {})
        for i, log in enumerate(logs):
            with open(log, "wb") as err:
                procs.append(subprocess.Popen(
                    [ALKSTORE, "run-schedules", "--lease", "3", "--url", pg.url, "--schema", pg.schema],
                    stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                    env={**env, "PGAPPNAME": f"{app}-{i}"},  # libpq tags every connection of runner i
                ))

        def running() -> bool:
            for p, log in zip(procs, logs, strict=True):
                assert p.poll() is None, f"a runner exited ({p.returncode}):\n{log.read_text()}"
            return True

        wait_for(lambda: running() and count_jobs(pg, qname) >= 1, "the leader to fire", 60)
        wait_for(
            lambda: running() and pg.scalar(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE starts_with(application_name, :a)", a=app,
            ) == 2,
            "both runners to be connected",
        )
        assert kill_backends(app, 0.5) >= 2  # leader and standby both lost their connections
        before = count_jobs(pg, qname)
        wait_for(lambda: running() and count_jobs(pg, qname) >= before + 2, "fires after the kills", 30)
        leader = alk.Lock._reserved(store, LEADER_LOCK).holder()
        assert leader is not None
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(15) for p in procs]
        # right after exit: the leader released its lease (it would otherwise stay for 3 s)
        assert alk.Lock._reserved(store, LEADER_LOCK).holder() is None
        text = [log.read_text() for log in logs]
        assert codes == [0, 0], text
        assert any(re.search(rf"scheduler {re.escape(leader.owner)} leads", t) for t in text), text
        assert not any("Traceback" in t for t in text), text
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        store.close()
