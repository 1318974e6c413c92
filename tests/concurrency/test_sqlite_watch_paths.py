"""SPEC §9 on SQLite, wake across processes whatever the URL names the file by: the
watcher must watch the file SQLite really opened (a symlink's target, a ``file:`` URI's
path, relative or absolute), or its file events never match and a notification or a job
waits for the safety check. With that check pushed out to an hour, only the file events
can deliver in time, so a prompt delivery here proves the watcher watches the right names.

The time bounds are generous and prove only which path delivered, never speed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa._backends import sqlite_watcher
from tests.concurrency.test_wake import NO_POLL, PROMPT, IdleWorker
from tests.support import Target, sqlite_target

NO_SAFETY = 3600.0  # the watcher's safety check, made irrelevant: only file events are fast
VARIANTS = ["symlink", "relative-uri", "absolute-uri"]


def _url(variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An installed database in ``tmp_path/real``, named by a URL of the given form."""
    real = tmp_path / "real"
    real.mkdir()
    target = sqlite_target(str(real))
    target.engine.dispose()
    path = Path(target.url.removeprefix("sqlite:///"))
    if variant == "symlink":
        link = tmp_path / "link"
        link.mkdir()
        (link / path.name).symlink_to(path)
        return f"sqlite:///{link / path.name}"
    if variant == "relative-uri":
        monkeypatch.chdir(real)  # children started from here open the same relative name
        return f"sqlite:///file:{path.name}?mode=rwc&uri=true"
    return f"sqlite:///file:{path}?mode=rwc&uri=true"


def _notify_from_another_process(url: str, payload: str) -> None:
    code = f"import alkstore_sa as alk; s = alk.Store({url!r}); s.notify('ch', {payload!r}); s.close()"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.getcwd(), timeout=60)


@pytest.mark.parametrize("variant", VARIANTS)
def test_notify_from_another_process_arrives_by_file_event(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_watcher, "SAFETY_POLL", NO_SAFETY)
    url = _url(variant, tmp_path, monkeypatch)
    store = alk.Store(url)
    try:
        sub = store.listen("ch")
        if os.path.exists("/proc/sys/fs/inotify"):  # else it polls every 5 ms, by design
            assert store.hub()._watch is not None, f"the watcher polls instead of watching {url}"
        for i in range(3):
            _notify_from_another_process(url, f"n{i}")
            note = sub.get(timeout=PROMPT)
            assert note is not None, (
                f"a notify on {url} from another process did not arrive within {PROMPT}s: the "
                "watcher does not watch the file SQLite writes"
            )
            assert note.payload == f"n{i}"
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_enqueue_wakes_an_idle_worker_process(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(variant, tmp_path, monkeypatch)
    db = Target("sqlite", url, sa.create_engine(url), "alkstore")
    store = db.store()
    q = store.queue("wake-paths")
    w = IdleWorker(db, "wake-paths", tmp_path, poll_interval=NO_POLL, safety_poll=NO_SAFETY)
    try:
        w.wait_running(q)
        job_id = q.enqueue({"n": 1})
        assert w.handled(job_id, PROMPT) is not None, (
            f"a job enqueued on {url} did not wake an idle worker process within {PROMPT}s"
        )
        result = w.finish()
    finally:
        w.kill()
        store.close()
        db.engine.dispose()
    assert result["hub"] == "SqliteHub" and result["processed"] == 2

