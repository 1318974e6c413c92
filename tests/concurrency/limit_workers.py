"""Child-process side of the queue-limit tests (SPEC §14): spawn-safe functions run by
``tests.concurrency.harness``. Each builds its OWN store from the spec's URL and schema.

- ``limited_worker`` runs an ``alk.Worker`` until the parent creates ``marks/STOP``; its
  handler leaves one file per job attempt (claim time, handler start and end, process);
  the first attempt of the job whose payload is ``spec["hold"]`` instead leaves
  ``marks/held-<pid>`` and runs until the end (the parent kills that process).
- ``live_sampler`` reads the queue's live claims from the database in a loop until
  ``marks/STOP`` and reports the largest count it saw.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk
from tests.concurrency.workers import meet_when_ready, workers_claim_together


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _stop_on_file(stop: alk.StopToken, marks: Path, max_seconds: float) -> None:
    def watch() -> None:
        deadline = time.monotonic() + max_seconds
        while not stop.stopped and time.monotonic() < deadline and not (marks / "STOP").exists():
            time.sleep(0.02)
        stop.stop()

    threading.Thread(target=watch, name="test-stopper", daemon=True).start()


class _FirstClaim(alk.Queue):
    """A queue handle that leaves ``marks/claimed-<pid>`` at its first claim (the parent
    waits for every worker to be claiming before it acts)."""

    def __init__(self, store: alk.Store, name: str, marks: Path) -> None:
        super().__init__(store, name, store.queue(name).opts)
        self._flag = marks / f"claimed-{os.getpid()}"

    def claim_batch(self, worker_id: str, n: int) -> list[alk.JobHandle]:
        handles = super().claim_batch(worker_id, n)
        if not self._flag.exists():
            self._flag.touch()
        return handles


def limited_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """A worker (``concurrency``, ``poll_interval``) whose handler sleeps ``job_seconds``
    and records ``marks/<id>-<attempt>.json``: claimed_at (the claim's time, epoch), start,
    end, pid."""
    marks = Path(spec["marks"])
    store = alk.Store(spec["url"], schema=spec["schema"])
    try:

        def handler(job: alk.Job) -> None:
            if "hold" in spec and job.payload == spec["hold"] and job.attempts == 1:
                # the job this process is killed holding: say so, then run until the end
                (marks / f"held-{os.getpid()}").touch()
                while not (marks / "STOP").exists():
                    time.sleep(0.02)
                return
            start = time.time()
            time.sleep(spec.get("job_seconds", 0.0))
            assert job.claimed_at is not None
            _write_atomic(
                marks / f"{job.id}-{job.attempts}.json",
                {"claimed_at": job.claimed_at.timestamp(), "start": start, "end": time.time(), "pid": os.getpid()},
            )

        worker = alk.Worker(
            store, _FirstClaim(store, spec["queue"], marks), handler,
            concurrency=spec["concurrency"], poll_interval=spec["poll_interval"],
        )
        stop = alk.StopToken()
        _stop_on_file(stop, marks, spec["max_seconds"])
        with contextlib.ExitStack() as together:
            if "ready_dir" in spec:  # the workers (and the sampler) start together
                together.enter_context(workers_claim_together(spec))
            worker.run(stop)
        return {"processed": worker.processed, "pid": os.getpid()}
    finally:
        store.close()


def live_sampler(spec: dict[str, Any]) -> dict[str, Any]:
    """Count the queue's live claims (processing, deadline not passed) straight from the
    database, as often as it can, until ``marks/STOP``."""
    marks = Path(spec["marks"])
    engine = sa.create_engine(spec["url"])
    if spec["kind"] == "postgresql":
        sql = sa.text(
            f'SELECT count(*) FROM "{spec["schema"]}".alkstore_jobs WHERE queue = :q '
            "AND state = 'processing' AND claim_expires_at > extract(epoch FROM clock_timestamp())"
        )
    else:
        sql = sa.text(
            "SELECT count(*) FROM alkstore_jobs WHERE queue = :q AND state = 'processing' "
            "AND claim_expires_at > :now"
        )
    samples, most = 0, 0
    deadline = time.monotonic() + spec["max_seconds"]
    try:
        with engine.connect() as conn:
            if "ready_dir" in spec:  # connected: the workers claim only once it samples
                meet_when_ready(spec)
            while not (marks / "STOP").exists() and time.monotonic() < deadline:
                live = conn.execute(sql, {"q": spec["queue"], "now": time.time()}).scalar_one()
                conn.rollback()  # a fresh snapshot for the next sample
                samples += 1
                most = max(most, int(live))
                time.sleep(0.002)
    finally:
        engine.dispose()
    return {"samples": samples, "max_live": most}
