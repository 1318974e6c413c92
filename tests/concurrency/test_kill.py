"""Crash recovery: a worker process claims a batch and is SIGKILLed mid-processing (while
it heartbeats its jobs). Nothing is lost: once the visibility timeout lapses, another
process reclaims every one of those jobs as attempt 2 (SPEC §5.3: a reclaim consumes an
attempt), and not before the lapsed deadline."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.concurrency import harness, workers
from tests.support import Target

BATCH = 20
VISIBILITY = 1.0


@pytest.mark.slow
def test_killed_worker_jobs_are_reclaimed(db: Target, qname: str, tmp_path) -> None:
    store = db.store()  # database clock
    try:
        q = store.queue(qname, visibility_timeout=VISIBILITY, max_attempts=3)
        enqueued = q.enqueue_many([{"i": i} for i in range(BATCH + 5)])  # 5 stay pending

        spec = {
            "url": db.url,
            "schema": db.schema,
            "queue": qname,
            "visibility": VISIBILITY,
            "n": BATCH,
        }
        claimed_path = str(tmp_path / "claimed.json")
        claimed = harness.SPAWN.Event()
        victim = harness.SPAWN.Process(
            target=workers.doomed, args=(spec, claimed_path, claimed), name="doomed", daemon=True
        )
        victim.start()
        try:
            assert claimed.wait(60), (
                f"the doomed worker never claimed (exit code {victim.exitcode})"
            )
            time.sleep(0.3)  # let it get into its processing loop
            assert victim.is_alive(), (
                f"the doomed worker died on its own (exit code {victim.exitcode})"
            )
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(10)
        finally:
            if victim.is_alive():
                os.kill(victim.pid, signal.SIGKILL)
                victim.join(10)
        assert victim.exitcode == -signal.SIGKILL

        doomed = {
            job_id: attempts
            for job_id, attempts in json.loads((tmp_path / "claimed.json").read_text())
        }
        assert len(doomed) == BATCH and set(doomed) <= set(enqueued)
        assert set(doomed.values()) == {1}
        # the dead worker's claims are still there, as it left them
        deadlines = {}
        for job_id in doomed:
            job = q.get_job(job_id)
            assert job is not None and job.state == "processing", job
            assert job.worker_id == "doomed" and job.attempts == 1
            assert job.claim_expires_at is not None
            deadlines[job_id] = job.claim_expires_at.timestamp()
    finally:
        store.close()

    rescue = {
        "url": db.url,
        "schema": db.schema,
        "queue": qname,
        "expect": sorted(doomed),
        "max_seconds": 30,
    }
    [result] = harness.run(workers.rescue, [rescue], tmp_path, timeout=60)

    reclaimed = {c[0]: c for c in result["claims"] if c[0] in doomed}
    assert set(reclaimed) == set(doomed), (
        f"lost after the crash: {sorted(set(doomed) - set(reclaimed))}"
    )
    for job_id, (_, attempts, worker_id, claimed_at, acked) in reclaimed.items():
        assert attempts == 2, f"job {job_id}: a reclaim consumes an attempt, got {attempts}"
        assert worker_id == "rescuer" and acked is True
        # (1 µs: both sides went through datetime's microsecond rounding)
        assert claimed_at >= deadlines[job_id] - 1e-6, (
            f"job {job_id} reclaimed at {claimed_at} before its claim lapsed at {deadlines[job_id]}"
        )
    others = [c for c in result["claims"] if c[0] not in doomed]
    assert sorted(c[0] for c in others) == sorted(set(enqueued) - set(doomed))
    assert all(c[1] == 1 for c in others), "the never-claimed jobs are first claims"

    live = db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=qname)
    dead = db.scalar(
        f"SELECT count(*) FROM {db.table('alkstore_dead_jobs')} WHERE queue = :q", q=qname
    )
    assert (live, dead) == (0, 0)
