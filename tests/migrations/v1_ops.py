"""Drives an OLD alkstore_sa (a schema-step-1 or step-2 release, exported from git onto
PYTHONPATH by tests/migrations/test_upgrades.py) against a database, in a process of its own.

Run as ``python v1_ops.py MODE URL SCHEMA PACKAGE_DIR [SHARED_JOB_ID]``; prints one JSON
object. It first proves it runs the old package (imported from PACKAGE_DIR, shipping step 1 or 2),
not the editable install of the working tree. Modes:

- ``install-populate``: install the v1 schema with the old package, then populate;
- ``populate``: the schema is there (an app's Alembic chain installed it): live (pending,
  delayed, expiring, caller's-transaction), processing and dead jobs, and a schedule;
- ``exercise``: every common operation of the old code against a (newer) database;
- ``exercise-statements``: the same for a release from before the schema compatibility
  rule, whose version check refuses every revision but its own: the refusal is recorded,
  then the check is skipped, so what runs is the old release's SQL against the new schema.

Uses only the public API the old releases share, plus ``Scheduler.tick`` for one
deterministic schedule firing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.migrations import steps

T0 = 1_900_000_000.0  # the injected clock's start: both sides of the test agree on it


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def populate(store: alk.Store) -> dict[str, Any]:
    q = store.queue("mig")
    ids = [
        q.enqueue({"n": 1}, priority=5),
        q.enqueue({"n": 2}, delay=60),
        q.enqueue({"n": 3}, expires=3600),
    ]
    with store.engine.begin() as conn:  # the caller's transaction form
        ids.append(alk.enqueue(conn, q, {"n": 4}))
    ids += q.enqueue_many([{"n": 5}, {"n": 6}])
    proc = store.queue("mig-proc", visibility_timeout=30)
    proc.enqueue({"p": 1})
    handle = proc.claim_one("v1-worker")
    assert handle is not None
    dead = store.queue("mig-dead", max_attempts=1)
    dead.enqueue({"d": 1})
    doomed = dead.claim_one("v1-worker")
    assert doomed is not None and doomed.fail("boom")
    store.schedule("mig-sched", "@every 1m", "mig", {"s": 1})
    return {"pending": ids, "processing": handle.id, "dead": doomed.id}


def exercise(store: alk.Store, clock: Clock, shared_job: int | None, *, checked: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if checked:
        store.check_schema()  # a newer, additive schema is not an error
        store.install()  # nothing to migrate: logs that the database is newer
    else:
        try:
            store.check_schema()
        except alk.SchemaOutdated as exc:
            out["refused"] = str(exc)
        store._schema_checked = True  # what follows is the old SQL itself
    q = store.queue("old", max_attempts=1)
    first = q.enqueue({"k": 1})
    many = q.enqueue_many([{"k": 2}, {"k": 3}])
    with store.engine.begin() as conn:
        in_tx = alk.enqueue(conn, q, {"k": 4})
    with store.engine.connect() as conn:
        alk.enqueue(conn, q, {"k": "rolled back"})
        conn.rollback()
    claimed = q.claim_batch("v1", 10)
    out["claimed"] = sorted(h.id for h in claimed)
    out["enqueued"] = sorted([first, *many, in_tx])
    acked = [h.ack() for h in claimed[:2]]
    out["retried"] = claimed[2].retry("again", delay=0)  # at budget: moves to dead
    out["failed"] = claimed[3].fail("bad")
    out["acked"] = acked
    out["dead"] = sorted(j.id for j in q.dead_jobs())
    requeued = q.requeue_dead(claimed[3].id)
    out["requeued_is_new"] = requeued is not None and requeued not in out["enqueued"]
    out["cancelled"] = requeued is not None and q.cancel(requeued)
    job = store.get_job(claimed[0].id)
    out["acked_job_gone"] = job is None
    dead_job = store.get_job(claimed[2].id)
    out["dead_state"] = None if dead_job is None else dead_job.state
    stats = q.stats()
    out["stats"] = [stats.pending, stats.processing, stats.dead]
    out["queue_stats"] = sorted(store.queue_stats())
    if shared_job is not None:  # a job the NEW code enqueued (with a unique key)
        shared = store.queue("shared")
        handle = shared.claim_one("v1")
        out["shared_claimed"] = handle is not None and handle.id == shared_job
        out["shared_acked"] = handle is not None and handle.ack()
    store.schedule("old-sched", "@every 1m", "old-fired", {"s": 1})
    clock.now += 180
    out["fired"] = store._scheduler().tick()
    out["fired_jobs"] = store.queue("old-fired").stats().pending
    out["schedules"] = sorted(s.name for s in store.schedules())
    out["unscheduled"] = store.unschedule("old-sched")
    lock = store.lock("old-lock")
    out["lock"] = [lock.acquire("me", 30), lock.acquire("other", 30), lock.release("me")]
    return out


def main() -> None:
    mode, url, schema, package_dir = sys.argv[1:5]
    shared_job = int(sys.argv[5]) if len(sys.argv) > 5 else None
    # The old package, not the working tree's: a wrong import would test nothing.
    assert Path(alk.__file__).resolve().is_relative_to(Path(package_dir).resolve()), alk.__file__
    assert steps.HEAD in (1, 2), steps.HEAD
    clock = Clock()
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema, clock=clock)
    try:
        if mode == "install-populate":
            store.install()
            result = populate(store)
        elif mode == "populate":
            result = populate(store)
        elif mode in ("exercise", "exercise-statements"):
            result = exercise(store, clock, shared_job, checked=mode == "exercise")
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    finally:
        store.close()
        engine.dispose()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
