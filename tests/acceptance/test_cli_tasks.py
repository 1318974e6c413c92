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
