"""PostgreSQL: a sweep and a worker's batched ack of the same expired jobs never deadlock.

A job past its ``expires_at`` may still be under a live claim (its handler running): a
batched ack deletes such jobs while a sweep moves them to dead. Both are multi-row
statements; ``ack_batch`` of ids takes its rows' locks in id order (an index scan of the
sorted ids), so the sweep must too, or each can hold a row the other waits for.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

from tests.support import Target, wait_for


def _waiting_for_locks(db: Target) -> int:
    return int(db.scalar(  # type: ignore[arg-type]
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE '%alkstore_jobs%'"
    ))


def test_a_sweep_and_a_batched_ack_of_the_same_expired_jobs_do_not_deadlock(pg_db: Target) -> None:
    """The sweep deleted the expired rows in the order of the expiry index: with the job
    of the lower id expiring later, it locked the higher id first, ack_batch the lower one,
    and PostgreSQL failed one of them ('deadlock detected': `alkstore sweep` ended with
    an error, or the worker's acks were not written). The sweep now locks its rows in id
    order, so one waits for the other and both end."""
    db = pg_db
    store = db.store()
    q = store.queue("sweep-vs-ack", visibility_timeout=600)
    low = q.enqueue({"n": 1}, expires=20)  # lower id, later expiry
    high = q.enqueue({"n": 2}, expires=10)
    handles = q.claim_batch("w", 2)
    assert sorted(h.id for h in handles) == [low, high]
    # both expired now (the claims stay live), the expiry order kept: high before low
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET expires_at = expires_at - 1000 WHERE queue = :q",
               q="sweep-vs-ack")
    out: dict[str, Any] = {}

    def run(name: str, fn: Any) -> threading.Thread:
        def target() -> None:
            try:
                out[name] = fn()
            except Exception as exc:  # the deadlock's victim
                out[name] = exc
        t = threading.Thread(target=target)
        t.start()
        return t

    sweeper = db.store()
    with db.engine.connect() as holder:  # holds the higher id's row: both must queue behind it
        holder.execute(sa.text(f"SELECT id FROM {db.table('alkstore_jobs')} WHERE id = :i FOR UPDATE"), {"i": high})
        sweep = run("sweep", lambda: sweeper.queue("sweep-vs-ack").sweep_expired())
        wait_for(lambda: _waiting_for_locks(db) >= 1, "the sweep waiting for a row lock")
        ack = run("ack", lambda: q.ack_batch([h.id for h in handles]))
        wait_for(lambda: _waiting_for_locks(db) >= 2, "the ack waiting for a row lock")
        holder.rollback()
    sweep.join(30)
    ack.join(30)
    sweeper.close()
    store.close()
    assert not isinstance(out["sweep"], Exception), out["sweep"]
    assert not isinstance(out["ack"], Exception), out["ack"]
    # whichever got the rows first: each job acked or swept, exactly once
    assert out["sweep"].expired + out["ack"] == 2
