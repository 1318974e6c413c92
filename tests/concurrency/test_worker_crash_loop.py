"""Worker processes SIGKILLed over and over while they drain (a crash loop), on both engines:
a kill lands mid-claim, mid-ack or — on SQLite — in the transaction where a batch of acks
rides with the next claim, and still nothing is lost or stranded. Every job ran to success,
no claim (job, attempt) ran twice, the only repeats are jobs a killed process held (re-run
at a later attempt once their claims lapsed), and nothing is left pending, processing or
dead."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.concurrency import harness, task_workers
from tests.support import Target

JOBS = 3000
CONCURRENCY = 8
KILLS = 5
RUNS_BEFORE_KILL = 40  # a victim is killed once it has run this many jobs: mid-drain


@pytest.mark.slow
def test_worker_processes_killed_while_draining_lose_no_job(db: Target, qname: str, tmp_path: Path) -> None:
    table = db.table("runs_" + hashlib.sha1(qname.encode()).hexdigest()[:10])
    db.execute(
        f"CREATE TABLE {table} (job_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
        "worker TEXT NOT NULL, ok INTEGER NOT NULL)"
    )
    store = db.store()
    spawned: list[harness.Group] = []
    try:
        tasks = task_workers.crash_registry(qname)
        # the task's own options (a 1 s visibility timeout, 50 attempts), as its enqueue stamps them
        q = store.queue(tasks[task_workers.SLOW].queue, visibility_timeout=1.0, max_attempts=50)
        ids = q.enqueue_many([{"task": task_workers.SLOW, "args": [i], "kwargs": {}} for i in range(JOBS)])

        def spawn(k: int) -> harness.Group:
            spec = {
                "url": db.url, "schema": db.schema, "prefix": qname, "table": table,
                "name": f"w{k}", "concurrency": CONCURRENCY, "max_seconds": 150,
            }
            spawned.append(harness.start(task_workers.crash_worker, [spec], tmp_path))
            return spawned[-1]

        def runs_by(name: str) -> int:
            with db.engine.connect() as c:
                return int(c.execute(
                    sa.text(f"SELECT count(*) FROM {table} WHERE worker LIKE :w"), {"w": f"{name}:%"}
                ).scalar_one())

        live = [(k, spawn(k)) for k in range(2)]
        killed = 0
        while killed < KILLS:
            k, victim = live.pop(0)
            deadline = time.monotonic() + 60
            while runs_by(f"w{k}") < RUNS_BEFORE_KILL:
                assert time.monotonic() < deadline, f"w{k} never got going"
                assert q.stats().pending > 0, f"the queue drained after {killed} kill(s): too little work"
                time.sleep(0.02)
            proc = victim.procs[0]
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            assert proc.exitcode == -signal.SIGKILL
            killed += 1
            live.append((k + 2, spawn(k + 2)))  # a replacement, as a supervisor would start
        groups = [g for _, g in live]
        for g in groups:
            harness.join_all(g.procs, 150)
        for g in groups:
            harness.collect(g.procs, g.outs)  # the last two ran until the queue was empty, or fail here
        with db.engine.connect() as c:
            runs = c.execute(sa.text(f"SELECT job_id, attempt, worker FROM {table}")).all()
        stats = q.stats()
    finally:
        for g in spawned:  # on a failure above: none is left running
            for p in g.procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
        store.close()
        db.execute(f"DROP TABLE {table}")

    assert (stats.pending, stats.processing, stats.dead) == (0, 0, 0)
    per_claim = Counter((r[0], r[1]) for r in runs)
    twice = {c: n for c, n in per_claim.items() if n > 1}
    assert not twice, f"a claim ran more than once: {dict(list(twice.items())[:10])}"
    per_job = Counter(r[0] for r in runs)
    assert set(per_job) == set(ids), f"never ran: {sorted(set(ids) - set(per_job))[:10]}"
    repeated = {j for j, n in per_job.items() if n > 1}
    # only what a killed process held is run again: at most its slots' worth per kill
    assert len(repeated) <= KILLS * CONCURRENCY, len(repeated)
