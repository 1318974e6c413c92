"""Four processes hammer one database for a few seconds with every queue operation mixed
(enqueue, enqueue_many, the caller's-transaction enqueue, claim_batch, ack, retry, fail,
heartbeat, ack_batch, cancel, sweep_expired, stats, get_job) on two queues with 0.2 s
visibility, short expiries and delays, so reclaims, exhaustion and expiry all happen.

SPEC §1: on SQLite no operation may surface ``database is locked`` with several processes
on one file; here NO operation may raise at all, on either engine (a refused operation is
a value, SPEC §3). Afterwards the books must balance (SPEC §5.7): no job is both live and
dead, and every enqueued job is live, dead, or was removed by an ack/cancel that said so."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.concurrency import harness, workers
from tests.support import Target

PROCS = 4
SECONDS = 3.0
MIN_OPS = 50  # each process goes on past SECONDS until it made this many (a loaded machine)


@pytest.mark.slow
def test_no_operation_raises_under_hammering(db: Target, qname: str, tmp_path) -> None:
    queues = [qname + "-a", qname + "-b"]
    specs = [
        {
            "url": db.url,
            "schema": db.schema,
            "queues": queues,
            "worker_id": f"h{i % 2}",
            "seed": 1000 + i,
            "seconds": SECONDS,
            "min_ops": MIN_OPS,
        }
        for i in range(PROCS)
    ]
    results = harness.run(workers.hammer, specs, tmp_path, timeout=SECONDS + 90)

    errors = [e for r in results for e in r["errors"]]
    locked = [e for e in errors if "locked" in e.lower()]
    assert not locked, f"{len(locked)} 'database is locked' errors, first:\n{locked[0]}"
    assert not errors, f"{len(errors)} operations raised, first:\n{errors[0]}"
    ops = Counter()
    for r in results:
        ops.update(r["ops"])
        assert sum(r["ops"].values()) >= MIN_OPS, f"a hammer process barely ran: {r['ops']}"
    for op in ("enqueue", "claim", "ack_batch", "sweep_expired", "cancel"):
        assert ops[op] > 0, ops

    # the books balance
    enqueued = [i for r in results for i in r["enqueued"]]
    assert len(enqueued) == len(set(enqueued)), "an id was handed out to two enqueues"
    removed = Counter(i for r in results for i, _ in r["removed"])
    assert not [i for i, k in removed.items() if k > 1], "two acks/cancels of one job both landed"
    offered = {i for r in results for i in r["batch_offered"]}
    live = _ids(db, "alkstore_jobs", queues)
    dead = _ids(db, "alkstore_dead_jobs", queues)
    assert not live & dead, f"jobs both live and dead: {sorted(live & dead)[:10]}"
    assert not set(removed) & (live | dead), "a job whose ack/cancel landed still exists"
    lost = set(enqueued) - live - dead - set(removed) - offered
    assert not lost, f"jobs vanished without an ack or cancel: {sorted(lost)[:10]}"
    assert (live | dead) <= set(enqueued), "rows nobody enqueued"
    assert dead, "the hammer should have produced dead jobs (fail / exhaustion / expiry)"


def _ids(db: Target, table: str, queues: list[str]) -> set[int]:
    with db.engine.connect() as c:
        rows = c.exec_driver_sql(
            f"SELECT id FROM {db.table(table)} WHERE queue IN ('{queues[0]}', '{queues[1]}')"
        ).fetchall()
    return {r[0] for r in rows}
