"""Child-process side of the worker/wake tests: spawn-safe, importable functions run by
``tests.concurrency.harness`` (each takes one JSON-able spec, builds its OWN store from the
spec's URL and schema, runs an ``alk.Worker`` and returns a JSON-able result).

The handlers report to the parent through the file system (``marks`` directory: one file
per handled job, written atomically) or through a table in the test database, so the
parent can watch progress while the worker process is still running."""

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
from tests.concurrency.workers import workers_claim_together


class NoWakeStore(alk.Store):
    """A store whose listener/watcher cannot start: the worker must fall back to polling."""

    def hub(self) -> Any:
        raise alk.DatabaseError("wake-ups disabled by the test")


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _stop_when(stop: alk.StopToken, done: Any, max_seconds: float, every: float = 0.05) -> threading.Thread:
    """Stop the worker once ``done()`` holds (or the time runs out: a hang fails, not blocks)."""

    def watch() -> None:
        deadline = time.monotonic() + max_seconds
        while not stop.stopped:
            if time.monotonic() >= deadline:
                stop.stop()
                return
            try:
                if done():
                    stop.stop()
                    return
            except Exception:  # noqa: BLE001 - keep watching; the deadline still holds
                pass
            time.sleep(every)

    t = threading.Thread(target=watch, name="test-stopper", daemon=True)
    t.start()
    return t


# -- an idle worker process: wake path, broken wake, listener killed --------------------------


def idle_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a worker (``spec['poll_interval']``, wake broken when ``spec['break_wake']``, the
    SQLite watcher's safety check every ``spec['safety_poll']`` seconds if given) until
    the parent creates ``marks/STOP``. Each handled job leaves ``marks/<id>.json`` with the
    epoch time its handler started, its payload and its attempt."""
    marks = Path(spec["marks"])
    if spec.get("safety_poll") is not None:
        # a long safety check leaves the SQLite watcher's file events as the only fast wake
        from alkstore_sa._backends import sqlite_watcher

        sqlite_watcher.SAFETY_POLL = spec["safety_poll"]
    cls = NoWakeStore if spec.get("break_wake") else alk.Store
    store = cls(spec["url"], schema=spec["schema"])
    try:

        def handler(job: alk.Job) -> None:
            _write_atomic(
                marks / f"{job.id}.json",
                {"t": time.time(), "payload": job.payload, "attempts": job.attempts, "pid": os.getpid()},
            )

        worker = alk.Worker(
            store, spec["queue"], handler, concurrency=spec.get("concurrency", 2),
            poll_interval=spec["poll_interval"], worker_id=spec.get("worker_id"),
        )
        stop = alk.StopToken()
        _stop_when(stop, lambda: (marks / "STOP").exists(), spec["max_seconds"])
        worker.run(stop)
        return {
            "processed": worker.processed,
            "hub": None if store._hub is None else type(store._hub).__name__,
            "pid": os.getpid(),
        }
    finally:
        store.close()


# -- two worker processes drain one queue --------------------------------------------------


def drain_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run a worker with ``spec['concurrency']`` threads whose handler records every job it
    handles in the table ``spec['table']`` (job id, this worker, attempt); stop once the
    queue holds nothing pending or processing."""
    store = alk.Store(spec["url"], schema=spec["schema"])
    try:
        insert = sa.text(f"INSERT INTO {spec['table']} (job_id, worker, attempt) VALUES (:j, :w, :a)")
        me = f"{spec['name']}:{os.getpid()}"
        handled = 0
        lock = threading.Lock()

        def handler(job: alk.Job) -> None:
            nonlocal handled
            with store.engine.begin() as conn:
                conn.execute(insert, {"j": job.id, "w": me, "a": job.attempts})
            with lock:
                handled += 1

        worker = alk.Worker(
            store, spec["queue"], handler, concurrency=spec["concurrency"], worker_id=me,
            poll_interval=spec.get("poll_interval", 1.0),
        )
        q = store.queue(spec["queue"])

        def empty() -> bool:
            s = q.stats()
            return s.pending == 0 and s.processing == 0

        stop = alk.StopToken()
        _stop_when(stop, empty, spec["max_seconds"], every=0.2)
        started = time.monotonic()
        with contextlib.ExitStack() as together:
            if "ready_dir" in spec:  # the processes' workers start claiming together
                together.enter_context(workers_claim_together(spec))
            worker.run(stop)
        return {
            "handled": handled,
            "processed": worker.processed,
            "seconds": time.monotonic() - started,
            "worker": me,
        }
    finally:
        store.close()
