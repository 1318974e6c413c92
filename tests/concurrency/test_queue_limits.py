"""SPEC §14 across processes, on both engines: queue settings are enforced inside the claim,
so they hold for every worker process at once.

- Concurrency limit 3, four worker processes with 8 threads each on slow jobs: the live
  claims, sampled from the database by a fifth process, never exceed 3 (nor do the
  handlers' own run intervals overlap more than 3 deep), and every job finishes.
- Rate limit 20 per 2 s, four processes draining 200 jobs: no 2 s window of the recorded
  claim times holds more than 20, and the drain is not far slower than the limit allows.
- Concurrency limit 2 across a worker killed with SIGKILL while it runs a job: its claim
  holds its place until it lapses, then another process reclaims it (attempt 2); the live
  claims never exceed 2 and every job finishes.
- Pause: four worker processes hand out nothing while the queue is paused (enqueues wake
  them, their claims refuse), and a resume wakes them promptly — their re-poll is an
  hour, so only the wake can deliver.

Time bounds are generous and prove which path delivered, never speed (that is the
benchmark's: `python -m benchmarks --only limited_concurrency,limited_rate`)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import alkstore_sa as alk
from tests.concurrency import harness, limit_workers
from tests.concurrency import workers as workers_mod
from tests.support import Target, wait_for

STARTUP = 60.0  # spawned children import SQLAlchemy + psycopg first
NO_POLL = 3600.0
PROMPT = 10.0  # a wake is milliseconds; an hour-long re-poll would never make it

pytestmark = pytest.mark.slow


def _marks(marks: Path) -> list[dict[str, Any]]:
    out = []
    for p in marks.glob("*-*.json"):
        out.append(json.loads(p.read_text()))
    return out


def _spec(db: Target, qname: str, marks: Path, **knobs: Any) -> dict[str, Any]:
    return {"url": db.url, "schema": db.schema, "kind": db.kind, "queue": qname, "marks": str(marks),
            "max_seconds": 120, **knobs}


def _finish(groups: list[harness.Group], marks: Path) -> list[Any]:
    (marks / "STOP").touch()
    results = []
    for g in groups:
        harness.join_all(g.procs, 60)
        results += harness.collect(g.procs, g.outs)
    return results


def test_concurrency_limit_holds_across_worker_processes(db: Target, qname: str, tmp_path: Path) -> None:
    store = db.store()
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        q = store.queue(qname)
        q.set_concurrency(3)
        ids = q.enqueue_many(list(range(36)))
        # the sampler samples before any worker claims: all five meet once ready
        ready = {"ready_dir": workers_mod.ready_dir(tmp_path), "parties": 5}
        sampler = harness.start(limit_workers.live_sampler, [_spec(db, qname, marks, **ready)], tmp_path)
        workers = harness.start(
            limit_workers.limited_worker,
            [_spec(db, qname, marks, concurrency=8, poll_interval=0.3, job_seconds=0.15, **ready) for _ in range(4)],
            tmp_path,
        )
        wait_for(lambda: len(_marks(marks)) >= len(ids), "every job to finish", timeout=STARTUP + 60)
        wait_for(lambda: q.stats().processing == 0, "the last ack")
        results = _finish([workers, sampler], marks)
        assert q.stats().pending == 0
    finally:
        store.close()
    *worker_results, sampled = results
    done = _marks(marks)
    assert len(done) == len(ids), "a job ran twice (or a claim lapsed)"
    assert sum(r["processed"] for r in worker_results) == len(ids)
    assert sampled["samples"] > 50, f"the sampler hardly sampled: {sampled}"
    assert 1 <= sampled["max_live"] <= 3, f"live claims exceeded the limit: {sampled}"
    # the handlers' own view: never more than 3 running at once, across processes
    edges = sorted([(m["start"], 1) for m in done] + [(m["end"], -1) for m in done], key=lambda e: (e[0], e[1]))
    running = deepest = 0
    for _, step in edges:
        running += step
        deepest = max(deepest, running)
    assert deepest <= 3, f"{deepest} handlers ran at once under a concurrency limit of 3"


def test_rate_limit_holds_across_worker_processes(db: Target, qname: str, tmp_path: Path) -> None:
    limit, per, total = 20, 1.0, 200  # ten windows' worth; a shorter window only paces faster
    store = db.store()
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        q = store.queue(qname)
        q.set_rate_limit(limit, per=per)
        q.enqueue_many(list(range(total)))
        workers = harness.start(
            limit_workers.limited_worker,
            [_spec(db, qname, marks, concurrency=8, poll_interval=NO_POLL) for _ in range(4)],
            tmp_path,
        )
        wait_for(lambda: len(_marks(marks)) >= total, "the drain", timeout=STARTUP + 60)
        results = _finish([workers], marks)
    finally:
        store.close()
    times = sorted(m["claimed_at"] for m in _marks(marks))
    assert len(times) == total
    assert sum(r["processed"] for r in results) == total
    # every window [t, t + per) starting at a claim (the fullest windows start at one); a
    # Job's claimed_at is the stored time rounded to the microsecond, so two claims a window
    # apart by less than that may read as inside one: the window is narrowed by it
    j = 0
    fullest = 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + per - 1e-6:
            j += 1
        fullest = max(fullest, j - i)
    assert fullest <= limit, f"{fullest} claims within {per}s under a limit of {limit}"
    # close to the limit: 200 jobs at 20 per 1 s need 9 s from the first claim to the last;
    # a worker that slept past the window's freeing (or polled) would take far longer
    span = times[-1] - times[0]
    ideal = (total / limit - 1) * per
    assert ideal - 0.01 <= span <= ideal + 8.0, f"the drain took {span:.1f}s, {ideal:.0f}s is the limit's pace"


def test_pause_holds_across_processes_and_resume_wakes_them(db: Target, qname: str, tmp_path: Path) -> None:
    store = db.store()
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        q = store.queue(qname)
        workers = harness.start(
            limit_workers.limited_worker,
            [_spec(db, qname, marks, concurrency=4, poll_interval=NO_POLL) for _ in range(4)],
            tmp_path,
        )
        wait_for(lambda: len(list(marks.glob("claimed-*"))) == 4, "every worker to claim", timeout=STARTUP)
        q.enqueue_many(list(range(8)))  # unpaused: the wake delivers them
        wait_for(lambda: len(_marks(marks)) == 8, "the first jobs", timeout=PROMPT)
        q.pause()
        ids = q.enqueue_many(list(range(20)))  # each enqueue wakes the workers: they claim, and get nothing
        time.sleep(1.5)
        assert len(_marks(marks)) == 8, "a job was handed out while the queue was paused"
        stats = q.stats()
        assert (stats.pending, stats.processing) == (20, 0)
        q.resume()
        # their re-poll is an hour: only the resume's wake can get these done this soon
        wait_for(lambda: len(_marks(marks)) == 28, "the resume to wake the workers", timeout=PROMPT)
        results = _finish([workers], marks)
        assert q.settings() == alk.QueueSettings()
    finally:
        store.close()
    assert sum(r["processed"] for r in results) == 28
    assert {p.name.split("-")[0] for p in marks.glob("*-1.json")} >= {str(i) for i in ids}


def test_concurrency_limit_holds_across_a_killed_worker_and_its_reclaim(
    db: Target, qname: str, tmp_path: Path
) -> None:
    """A worker process is SIGKILLed while running a job of a queue limited to 2: its claim
    keeps its place until it lapses (no heartbeats), another process then reclaims the job
    as attempt 2, and the other jobs keep running through the other place; the database
    never shows more than 2 live claims, and every job finishes."""
    store = db.store()
    marks = tmp_path / "marks"
    marks.mkdir()
    try:
        q = store.queue(qname, visibility_timeout=1.0, max_attempts=5)
        q.set_concurrency(2)
        held = q.enqueue("held", priority=10)  # claimed first, by one of the workers
        ids = [held, *q.enqueue_many(list(range(16)))]
        ready = {"ready_dir": workers_mod.ready_dir(tmp_path), "parties": 4}
        sampler = harness.start(limit_workers.live_sampler, [_spec(db, qname, marks, **ready)], tmp_path)
        workers = harness.start(
            limit_workers.limited_worker,
            [_spec(db, qname, marks, concurrency=4, poll_interval=0.3, job_seconds=0.1, hold="held", **ready)
             for _ in range(3)],
            tmp_path,
        )
        [flag] = wait_for(lambda: list(marks.glob("held-*")), "a worker to run the held job", timeout=STARTUP)
        pid = int(flag.name.split("-")[1])
        victim = next(p for p in workers.procs if p.pid == pid)
        os.kill(pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
        wait_for(lambda: len({m.name.split("-")[0] for m in marks.glob("*-*.json")}) >= len(ids),
                 "every job to finish, the held one reclaimed", timeout=60)
        wait_for(lambda: q.stats().processing == 0, "the last ack")
        (marks / "STOP").touch()
        survivors = [p for p in workers.procs if p is not victim]
        harness.join_all(survivors + sampler.procs, 60)
        harness.collect(survivors, [o for p, o in zip(workers.procs, workers.outs, strict=True) if p is not victim])
        [sampled] = harness.collect(sampler.procs, sampler.outs)
        assert (q.stats().pending, q.get_job(held)) == (0, None)  # the held job acked by its reclaim
    finally:
        store.close()
    # (the killed process's own runs count too: it may have finished others before the kill)
    assert {int(m.name.split("-")[0]) for m in marks.glob("*-*.json")} == set(ids)
    again = json.loads((marks / f"{held}-2.json").read_text())
    assert again["pid"] != pid, "the held job's second attempt ran in the killed process"
    assert sampled["samples"] > 50, f"the sampler hardly sampled: {sampled}"
    assert 1 <= sampled["max_live"] <= 2, f"live claims exceeded the limit: {sampled}"
