"""SPEC §9/§11, wake end to end across processes: an idle worker PROCESS whose re-poll
interval is an hour picks up jobs enqueued by this (another) process — only a wake can
deliver them in time; with its wake broken a worker still gets jobs from its re-poll; and
on PostgreSQL a listener connection killed with ``pg_terminate_backend`` reconnects,
re-LISTENs and loses nothing.

The time bounds are generous and prove only which path delivered a job, never speed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.concurrency import harness, wake_workers
from tests.support import Target

NO_POLL = 3600.0  # the re-poll safety net, made irrelevant: only a wake is fast enough
PROMPT = 5.0  # "promptly": a wake is milliseconds; an hour-long poll would never make it
STARTUP = 60.0  # a spawned child imports SQLAlchemy + psycopg first
SETTLE = 0.4  # after a handler finished, let the worker's follow-up claim find nothing


class IdleWorker:
    """One worker process running ``wake_workers.idle_worker``, observed through marks."""

    def __init__(self, db: Target, qname: str, tmp_path: Path, **knobs: Any) -> None:
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        spec = {
            "url": db.url, "schema": db.schema, "queue": qname, "marks": str(self.marks),
            "max_seconds": 90, **knobs,
        }
        self.group = harness.start(wake_workers.idle_worker, [spec], tmp_path)

    def handled(self, job_id: int, timeout: float) -> dict[str, Any] | None:
        """The mark of ``job_id`` once its handler ran, or None after ``timeout``."""
        path = self.marks / f"{job_id}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())  # type: ignore[no-any-return]
            proc = self.group.procs[0]
            if not proc.is_alive():
                harness.collect(self.group.procs, self.group.outs)  # raises with the story
                raise AssertionError(f"worker process exited early ({proc.exitcode})")
            time.sleep(0.005)
        return None

    def wait_running(self, q: alk.Queue) -> None:
        """Prove the worker loop runs (a warm-up job is handled), then let it go idle."""
        warm = q.enqueue({"warm": True})
        assert self.handled(warm, STARTUP) is not None, "the worker never handled its warm-up job"
        time.sleep(SETTLE)

    def marks_seen(self) -> list[int]:
        return sorted(int(p.stem) for p in self.marks.glob("*.json"))

    def finish(self) -> dict[str, Any]:
        (self.marks / "STOP").touch()
        harness.join_all(self.group.procs, 30)
        (result,) = harness.collect(self.group.procs, self.group.outs)
        return result  # type: ignore[no-any-return]

    def kill(self) -> None:
        procs = [p for p in self.group.procs if p.is_alive()]
        (self.marks / "STOP").touch()
        if procs:
            harness.join_all(procs, 30)


@pytest.fixture
def parent_store(db: Target):
    s = db.store()  # database clock, like the worker process
    yield s
    s.close()


@pytest.mark.slow
def test_idle_worker_process_is_woken_by_another_process(
    db: Target, parent_store: alk.Store, qname: str, tmp_path: Path
) -> None:
    q = parent_store.queue(qname)
    w = IdleWorker(db, qname, tmp_path, poll_interval=NO_POLL)
    try:
        w.wait_running(q)
        ids = []
        for i in range(3):  # each one lands on an idle worker: three separate wakes
            sent = time.time()
            if i == 1:  # in the caller's transaction: the wake goes out at the commit
                with Session(db.engine) as session:
                    job_id = alk.enqueue(session, qname, {"n": i})
                    session.commit()
            else:
                job_id = q.enqueue({"n": i})
            mark = w.handled(job_id, PROMPT)
            assert mark is not None, (
                f"job {i} was not picked up within {PROMPT}s by an idle worker polling hourly: "
                "the wake did not arrive"
            )
            assert mark["payload"] == {"n": i} and mark["attempts"] == 1
            assert mark["t"] >= sent - 0.5
            ids.append(job_id)
            time.sleep(SETTLE)

        # a rolled-back enqueue wakes the worker at most to find nothing
        with Session(db.engine) as session:
            alk.enqueue(session, qname, {"n": "rolled back"})
            session.rollback()
        last = q.enqueue({"n": "last"})
        assert w.handled(last, PROMPT) is not None
        result = w.finish()
    finally:
        w.kill()
    assert result["hub"] in ("PgHub", "SqliteHub")
    assert result["processed"] == 5  # warm-up, three, last: nothing twice, nothing phantom
    assert len(w.marks_seen()) == 5
    assert q.stats() == alk.QueueStats(pending=0, ready=0, processing=0, dead=0, oldest_ready_age=None)


@pytest.mark.slow
def test_broken_wake_falls_back_to_the_re_poll(
    db: Target, parent_store: alk.Store, qname: str, tmp_path: Path
) -> None:
    q = parent_store.queue(qname)
    w = IdleWorker(db, qname, tmp_path, poll_interval=0.5, break_wake=True)
    try:
        w.wait_running(q)
        ids = [q.enqueue({"n": i}) for i in range(3)]
        for job_id in ids:
            assert w.handled(job_id, PROMPT + 5) is not None, "the re-poll never picked the job up"
        result = w.finish()
    finally:
        w.kill()
    assert result["hub"] is None, "the test store's hub was supposed to be broken"
    assert result["processed"] == 4
    assert q.stats().pending == 0 and q.stats().processing == 0


def _listener_pids(db: Target, key: str) -> list[int]:
    with db.engine.connect() as c:
        return list(
            c.execute(
                # its last statement: the LISTEN, or taking/giving back the queue's wake
                # presence (both name the channel)
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND (query = :q OR query LIKE :presence)"
                ),
                {"q": f'LISTEN "{key}"', "presence": f"%pg_advisory_%lock_shared%'{key}'%"},
            ).scalars()
        )


def _wait_listener(db: Target, key: str, timeout: float, exclude: int | None = None) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in _listener_pids(db, key) if p != exclude]
        if pids:
            assert len(pids) == 1, f"several listeners for one worker: {pids}"
            return pids[0]
        time.sleep(0.02)
    raise AssertionError(f"no LISTEN connection for {key} within {timeout}s")


@pytest.mark.slow
def test_killed_listener_connection_loses_nothing(
    _pg_module_target: Target, qname: str, tmp_path: Path
) -> None:
    """PostgreSQL: terminate the worker's LISTEN backend. The listener reconnects and
    re-LISTENs on its own and wakes its queue after the reconnect (a wake sent while it was
    down is lost, never replayed): with an hourly re-poll, every job is still processed,
    each exactly once."""
    db = _pg_module_target
    store = db.store()
    q = store.queue(qname)
    key = store.backend.wake_key(qname)
    w = IdleWorker(db, qname, tmp_path, poll_interval=NO_POLL)
    try:
        w.wait_running(q)
        first_pid = _wait_listener(db, key, 10)

        with db.engine.connect() as c:
            assert c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": first_pid}).scalar()
        during = q.enqueue({"n": "sent while the listener was down"})  # its wake may be lost
        assert w.handled(during, PROMPT + 5) is not None, (
            "a job enqueued across the listener's reconnect was not picked up"
        )

        second_pid = _wait_listener(db, key, 10, exclude=first_pid)
        assert second_pid != first_pid
        time.sleep(SETTLE)
        after = []
        for i in range(3):
            job_id = q.enqueue({"n": i})
            assert w.handled(job_id, PROMPT) is not None, "no wake after the listener reconnected"
            after.append(job_id)
            time.sleep(SETTLE)

        # and once more: a second kill is survived just the same
        with db.engine.connect() as c:
            c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": second_pid})
        burst = q.enqueue_many([{"burst": i} for i in range(10)])
        for job_id in burst:
            assert w.handled(job_id, PROMPT + 5) is not None
        result = w.finish()
    finally:
        w.kill()
        store2 = db.store()
        stats = store2.queue(qname).stats()
        store2.close()
        store.close()
    assert result["processed"] == 1 + 1 + 3 + 10
    assert len(w.marks_seen()) == 15
    assert stats.pending == 0 and stats.processing == 0 and stats.dead == 0
