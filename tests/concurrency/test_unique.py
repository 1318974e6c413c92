"""Unique jobs under real concurrency (SPEC §14), on both engines: eight processes enqueue
the same 200 keys at once, in their own transactions and in callers' transactions; the
unique index decides, so each key ends with exactly one live job, and every call returned
the id of its key's job. A variant acks jobs meanwhile, so keys are freed and taken again
while enqueues run (the path where a holder vanishes between the conflict and the read).
Another rolls back half of the callers' transactions: a rolled-back holder frees its key to
the enqueues waiting on it, and no committed call returns the id of a job that never was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.concurrency import harness, unique_workers
from tests.support import Target

PROCS = 8
KEYS = [f"key-{i:03d}" for i in range(200)]


def _specs(db: Target, queue: str, modes: list[str], rendezvous: Path, parties: int) -> list[dict[str, Any]]:
    return [
        {
            "url": db.url, "schema": db.schema, "queue": queue, "keys": KEYS, "mode": mode, "group": 5,
            "seed": 70 + i, "rendezvous": str(rendezvous), "parties": parties,
        }
        for i, mode in enumerate(modes)
    ]


def _rendezvous(tmp_path: Path) -> Path:
    path = tmp_path / "ready"
    path.mkdir()
    return path


def _live(db: Target, queue: str) -> dict[int, tuple[str, int]]:
    """Live jobs of the queue: id -> (unique key, pid of the process that made it)."""
    sql = sa.text(f"SELECT id, unique_key, payload FROM {db.table('alkstore_jobs')} WHERE queue = :q")
    with db.engine.connect() as conn:
        rows = conn.execute(sql, {"q": queue}).all()
    return {int(r[0]): (r[1], json.loads(r[2])["pid"]) for r in rows}


@pytest.mark.slow
def test_one_live_job_per_key(db: Target, qname: str, tmp_path: Path) -> None:
    """Three processes enqueue in callers' transactions (five keys each), two more in
    AsyncSessions (asyncpg / aiosqlite), while three enqueue each key in its own
    transaction: the forms wait on each other through the index."""
    modes = ["callers", "own", "async", "callers", "own", "async", "callers", "own"]
    specs = _specs(db, qname, modes, _rendezvous(tmp_path), PROCS)
    results = harness.run(unique_workers.enqueue_keys, specs, tmp_path, timeout=180)

    live = _live(db, qname)
    assert sorted(key for key, _ in live.values()) == KEYS  # exactly one live job per key
    by_key = {key: job_id for job_id, (key, _) in live.items()}
    calls = [call for r in results for call in r]
    assert len(calls) == PROCS * len(KEYS)
    wrong = [(key, got, by_key[key]) for key, got in calls if got != by_key[key]]
    assert not wrong, f"{len(wrong)} calls returned another id than their key's job, e.g. {wrong[:5]}"
    # real contention: the keys' jobs were made by several processes, whichever came first
    makers = {pid for _, pid in live.values()}
    assert len(makers) >= 2, f"only {len(makers)} process(es) inserted anything: no contention exercised"


@pytest.mark.slow
def test_keys_freed_and_taken_while_enqueueing(db: Target, qname: str, tmp_path: Path) -> None:
    """Six enqueuers (own, callers' and async callers' transactions) and two processes acking the queue's
    jobs: at most one live job per key at the end, and every id a call returned was a job
    of that call's key (live now, or acked with that key)."""
    rendezvous = _rendezvous(tmp_path)
    specs = _specs(db, qname, ["own", "callers", "async"] * 2, rendezvous, PROCS)
    ackers = [
        {
            "url": db.url, "schema": db.schema, "queue": qname, "worker_id": f"acker-{i}", "seconds": 4.0,
            "rendezvous": str(rendezvous), "parties": PROCS,
        }
        for i in range(2)
    ]
    group = harness.start(unique_workers.enqueue_keys, specs, tmp_path)
    acking = harness.start(unique_workers.ack_while_enqueued, ackers, tmp_path)
    harness.join_all(group.procs + acking.procs, timeout=180)
    calls = [c for r in harness.collect(group.procs, group.outs) for c in r]
    acked = [a for r in harness.collect(acking.procs, acking.outs) for a in r]

    live = _live(db, qname)
    assert len({key for key, _ in live.values()}) == len(live), "two live jobs hold one key"
    key_of = {job_id: key for job_id, (key, _) in live.items()}
    for job_id, key in acked:
        assert key_of.setdefault(job_id, key) == key
    assert len({job_id for job_id, _ in acked}) == len(acked), "an ack landed twice"
    strangers = [(key, got) for key, got in calls if key_of.get(got) != key]
    assert not strangers, f"calls returned ids of no job of their key, e.g. {strangers[:5]}"
    assert acked, "the ackers acked nothing: no key was freed during the run"


@pytest.mark.slow
def test_callers_transactions_that_roll_back(db: Target, qname: str, tmp_path: Path) -> None:
    """Six processes enqueue the same keys in callers' transactions, half of which roll back
    (each process alternates, out of step with the next), while two more enqueue in their
    own transactions. A key whose holder rolled back is taken by a waiting enqueue; at the
    end each key has at most one live job, a key has one exactly when some call for it
    committed, and every committed call returned that job's id."""
    modes = ["callers-rollback"] * 6 + ["own"] * 2
    results = harness.run(unique_workers.enqueue_keys, _specs(db, qname, modes, _rendezvous(tmp_path), PROCS),
                          tmp_path, timeout=180)
    calls = [(c[0], c[1], c[2] if len(c) > 2 else True) for r in results for c in r]
    assert len(calls) == PROCS * len(KEYS)
    assert any(not committed for _, _, committed in calls), "no transaction rolled back"

    live = _live(db, qname)
    assert len({key for key, _ in live.values()}) == len(live), "two live jobs hold one key"
    by_key = {key: job_id for job_id, (key, _) in live.items()}
    assert set(by_key) == {key for key, _, committed in calls if committed}
    wrong = [(key, got, by_key.get(key)) for key, got, committed in calls if committed and got != by_key.get(key)]
    assert not wrong, f"{len(wrong)} committed calls returned another id than their key's job, e.g. {wrong[:5]}"
    # (a rolled-back call's id says nothing: its job never was, and SQLite may give that id
    # to a later job, since a rollback also undoes the AUTOINCREMENT counter's step)
