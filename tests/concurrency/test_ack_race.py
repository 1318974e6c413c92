"""Ack vs reclaim across processes (SPEC §5.4 validity predicate): jobs with a 0.2 s
visibility timeout on the DATABASE clock; each process acks its claims one by one so the
acks straddle the deadline, while the others reclaim whatever lapsed. All processes use the
SAME worker_id, so only the per-claim token can tell their claims apart.

Per job: at most (here: exactly) one ack returns True, and it is the ack of the job's last
claim; every ack of a claim that was later reclaimed returns False; and an ack called after
its claim deadline returns False even when nobody has reclaimed the job yet."""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import pytest

from tests.concurrency import harness, workers
from tests.support import Target

JOBS = 150
PROCS = 3
# The database is on this host, so the database clock and time.time() are one clock; the
# margin only absorbs float rounding and the gap between the call and the statement start.
CLOCK_MARGIN = 0.005


class Claim(NamedTuple):
    attempts: int
    acked: bool
    claimed_at: float
    expires_at: float
    ack_called: float
    ack_returned: float


@pytest.mark.slow
def test_late_ack_after_reclaim_never_lands(db: Target, qname: str, tmp_path) -> None:
    store = db.store()  # clock=None: deadlines come from the database clock
    try:
        q = store.queue(qname, visibility_timeout=0.2, max_attempts=1000)
        enqueued = q.enqueue_many(list(range(JOBS)))
    finally:
        store.close()

    specs = [
        {
            "url": db.url,
            "schema": db.schema,
            "queue": qname,
            "worker_id": "same-worker",
            "visibility": 0.2,
            "max_attempts": 1000,
            "batch": 10,
            "seed": i,
            # first ack ~0.12 s after the claim, then one every ~0.0175 s: the batch's acks
            # straddle the 0.2 s deadline
            "first_ack_after": [0.10, 0.14],
            "ack_gap": 0.035,
            "max_seconds": 40,
        }
        for i in range(PROCS)
    ]
    results = harness.run(workers.ack_race, specs, tmp_path, timeout=60)

    by_job: dict[int, list[Claim]] = defaultdict(list)
    for r in results:
        for job_id, *fields in r["claims"]:
            by_job[job_id].append(Claim(*fields))
    assert set(by_job) == set(enqueued), "every job was claimed (none lost)"

    late_refused = after_reclaim = past_deadline = 0
    for job_id, claims in by_job.items():
        claims.sort()
        attempts = [c.attempts for c in claims]
        assert attempts == list(range(1, len(claims) + 1)), (
            f"job {job_id}: claims {attempts} (an attempt handed out twice, or one lost)"
        )
        wins = [c.attempts for c in claims if c.acked]
        assert len(wins) == 1, f"job {job_id}: ack returned True for attempts {wins}"
        assert wins == [attempts[-1]], (
            f"job {job_id}: the ack of attempt {wins[0]} landed although the job was "
            f"reclaimed afterwards (attempts {attempts})"
        )
        late_refused += len(claims) - 1
        # acks that returned only after the next claim had already been made
        after_reclaim += sum(
            1
            for prev, nxt in zip(claims, claims[1:], strict=False)
            if prev.ack_returned > nxt.claimed_at
        )
        for c in claims:
            if c.ack_called > c.expires_at + CLOCK_MARGIN:
                past_deadline += 1
                assert not c.acked, (
                    f"job {job_id}: ack of attempt {c.attempts} called "
                    f"{c.ack_called - c.expires_at:.3f}s after its claim deadline returned True"
                )

    reclaimed = sum(1 for c in by_job.values() if len(c) > 1)
    # the race must really have happened, or the test proves nothing
    assert reclaimed >= 10 and late_refused >= 10, (reclaimed, late_refused)
    assert after_reclaim >= 3, (
        f"only {after_reclaim} acks raced a reclaim that had already happened"
    )
    assert past_deadline >= 10, f"only {past_deadline} acks were called past their deadline"
    assert reclaimed < JOBS, "some acks must land before the deadline"

    live = db.scalar(f"SELECT count(*) FROM {db.table('alkstore_jobs')} WHERE queue = :q", q=qname)
    dead = db.scalar(
        f"SELECT count(*) FROM {db.table('alkstore_dead_jobs')} WHERE queue = :q", q=qname
    )
    assert (live, dead) == (0, 0)
