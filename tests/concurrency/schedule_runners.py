"""Two ``alkstore run-schedules`` processes on one database, for the leader tests: how they
are started, how to tell which leads, and the jobs their fires enqueued."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import Target

ALKSTORE = str(Path(sys.executable).parent / "alkstore")
LEASE = 2.0
INTERVAL = 1.0
LEADS = re.compile(r"scheduler (\S+) leads")


def start_runners(db: Target, logs: list[Path], procs: list[subprocess.Popen[bytes]]) -> None:
    """One runner per log file (its stderr), with a LEASE-second lease, appended to
    ``procs`` as each starts (the caller's cleanup sees every one started)."""
    for log in logs:
        with open(log, "wb") as err:
            procs.append(
                subprocess.Popen(
                    [ALKSTORE, "run-schedules", "--lease", str(LEASE), "--url", db.url, "--schema", db.schema],
                    stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                )
            )


def fired(db: Target, queue: str) -> list[tuple[int, float]]:
    """(id, created_at) of the jobs the schedule's fires enqueued, in order."""
    param = "%s" if db.kind == "postgresql" else "?"
    with db.engine.connect() as c:
        rows = c.exec_driver_sql(
            f"SELECT id, created_at FROM {db.table('alkstore_jobs')} WHERE queue = {param} ORDER BY id",
            (queue,),
        ).fetchall()
    return [(int(i), float(t)) for i, t in rows]
