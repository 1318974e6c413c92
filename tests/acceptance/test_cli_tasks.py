"""`alkstore worker MODULE:TASKS` under SIGTERM (SPEC §11, §12): with a sync and an async task
in flight, the worker stops claiming, lets both finish, acks both, and exits 0 — on both
engines, as a real subprocess."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.acceptance.test_cli_errors import ALKSTORE, STARTUP, env
from tests.support import Target, wait_for

REGISTRY = '''
import asyncio
import pathlib
import time

import alkstore_sa as alk

tasks = alk.Tasks()
HERE = pathlib.Path(__file__).parent


@tasks.task(queue="sync-q")
def slow_sync(n):
    (HERE / f"started-sync-{n}").touch()
    time.sleep(1.5)
    (HERE / f"finished-sync-{n}").touch()


@tasks.task(queue="async-q")
async def slow_async(n):
    (HERE / f"started-async-{n}").touch()
    await asyncio.sleep(1.5)
    (HERE / f"finished-async-{n}").touch()
'''


def test_sigterm_finishes_sync_and_async_tasks_in_flight(db: Target, tmp_path: Path) -> None:
    (tmp_path / "sigterm_tasks.py").write_text(REGISTRY)
    store = db.store()
    ids = [
        store.queue("sync-q").enqueue({"task": "sigterm_tasks.slow_sync", "args": [1], "kwargs": {}}),
        store.queue("async-q").enqueue({"task": "sigterm_tasks.slow_async", "args": [2], "kwargs": {}}),
    ]
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "sigterm_tasks:tasks", "--poll-interval", "3600", "--grace", "30",
         "--url", db.url, "--schema", db.schema],
        cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(
            lambda: ((tmp_path / "started-sync-1").exists() and (tmp_path / "started-async-2").exists())
            or proc.poll() is not None,
            "both tasks to start", STARTUP,
        )
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    try:
        assert proc.returncode == 0, err
        assert "received SIGTERM; stopping" in err and "Traceback" not in err, err
        assert (tmp_path / "finished-sync-1").exists() and (tmp_path / "finished-async-2").exists()
        assert [store.get_job(i) for i in ids] == [None, None]  # both acked, none left to lapse
    finally:
        store.close()


STUCK = '''
import asyncio
import pathlib
import threading

import alkstore_sa as alk

tasks = alk.Tasks()
HERE = pathlib.Path(__file__).parent
NEVER = threading.Event()


@tasks.task(queue="stuck-q")
async def stuck(n):
    (HERE / f"started-{n}").touch()
    await asyncio.to_thread(NEVER.wait)  # sync I/O kept off the loop, as docs/worker.md says; it never returns
'''


def test_a_call_an_async_task_left_in_to_thread_does_not_keep_the_worker_from_exiting(
    db: Target, tmp_path: Path
) -> None:
    """An async task waiting in ``asyncio.to_thread`` (the docs' way to do sync I/O from an
    async task) on a call that does not return: after the grace period the task is
    cancelled and its claim left to lapse, and the process exits 0 at once, as it does for a
    sync handler thread — the thread running that call dies with the process instead of
    being waited for at exit until the blocked-stop guard ends it with code 1."""
    proc, _out, err = _stopped_mid_task(db, tmp_path, "stuck_tasks", STUCK, "stuck")
    assert proc.returncode == 0, err
    assert "cancelled at shutdown" in err and "blocked in a call" not in err, err


def _stopped_mid_task(db: Target, tmp_path: Path, module: str, source: str, task: str) -> tuple[subprocess.Popen[str], str, str]:
    """Run ``alkstore worker MODULE:tasks`` (grace 0.5 s) on one job of ``task`` (queue
    ``TASK-q``), SIGTERM it once the task started, and return the ended process and its
    output; the job must be left processing, its claim to lapse, as documented."""
    (tmp_path / f"{module}.py").write_text(source)
    store = db.store()
    try:
        job_id = store.queue(f"{task}-q").enqueue({"task": f"{module}.{task}", "args": [1], "kwargs": {}})
        proc = subprocess.Popen(
            [str(ALKSTORE), "worker", f"{module}:tasks", "--poll-interval", "3600", "--grace", "0.5",
             "--url", db.url, "--schema", db.schema],
            cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            wait_for(lambda: (tmp_path / "started-1").exists() or proc.poll() is not None, "the task to start", STARTUP)
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        job = store.get_job(job_id)
        assert job is not None and job.state == "processing", (job, err)  # left to lapse, as documented
        return proc, out, err
    finally:
        store.close()

POOLED = '''
import concurrent.futures
import pathlib
import threading

import alkstore_sa as alk

tasks = alk.Tasks()
HERE = pathlib.Path(__file__).parent
NEVER = threading.Event()


@tasks.task(queue="pooled-q")
def pooled(n):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the task's own pool; its calls never return
        calls = [pool.submit(NEVER.wait) for _ in range(2)]  # each submit starts its thread
        (HERE / f"started-{n}").touch()  # only now: the threads exist when the test stops the worker
        for call in calls:
            call.result()
'''


def test_threads_a_sync_task_left_behind_do_not_keep_the_worker_from_exiting(db: Target, tmp_path: Path) -> None:
    """A sync task abandoned at the end of the grace period while waiting on threads of its
    own (a ThreadPoolExecutor it made, whose threads the interpreter joins at exit): the
    worker exits 0 once its stop is done, as documented for abandoned handler threads,
    instead of waiting at exit until the blocked-stop guard ends it with code 1 and blames
    the database."""
    proc, out, err = _stopped_mid_task(db, tmp_path, "pooled_tasks", POOLED, "pooled")
    assert proc.returncode == 0, err
    assert "still running after the 0.5s grace period" in err and "blocked in a call" not in err, err
    assert "worker: 0 job(s) done" in out, out
