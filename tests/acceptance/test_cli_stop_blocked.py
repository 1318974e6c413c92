"""`alkstore worker` stopped while its database server does not answer.

A server that accepts the TCP connection and then says nothing (a hung host, a half-open
network path) leaves the driver waiting without a timeout of its own. The stop token is
set by SIGTERM, but the main thread never gets back to look at it: the worker ignored every
SIGTERM and SIGINT until its process manager's SIGKILL. The command bounds its stop: past
the grace period and the drain's own margin (STOP_MARGIN) it exits with code 1, saying why.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from alkstore_sa.cli import _common

STOP_MARGIN: float = getattr(_common, "STOP_MARGIN", 20.0)

ALKSTORE = Path(sys.executable).with_name("alkstore")
STARTUP = 60.0  # a fresh interpreter imports SQLAlchemy and psycopg first


def test_a_worker_whose_database_never_answers_still_exits_after_sigterm(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(textwrap.dedent(
        """
        def handle(job):
            pass
        """
    ))
    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts, never answers
        port = server.getsockname()[1]
        proc = subprocess.Popen(
            [str(ALKSTORE), "worker", "jobs:handle", "--queue", "q", "--grace", "0",
             "--url", f"postgresql://postgres@127.0.0.1:{port}/test"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            server.settimeout(STARTUP)
            conn, _ = server.accept()  # the worker is now waiting for the server's first answer
            with conn:
                out, err = _sigterm_and_wait(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "received SIGTERM" in err and "still running" in err and "after SIGTERM" in err, err


def test_a_worker_held_at_exit_by_a_thread_of_the_app_says_so_rather_than_blame_the_database(
    tmp_path: Path,
) -> None:
    """The application's module starts a non-daemon thread of its own that never ends. The
    worker's stop is done — nothing in flight, its lines logged — but the interpreter waits
    for that thread at exit, until the guard ends the process: its line names the thread
    that holds the exit, not a blocked call or an unresponsive database server, and no
    jobs in flight."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(
        """
        import threading

        threading.Thread(target=threading.Event().wait, name="app-poller").start()  # non-daemon, never ends

        def handle(job):
            pass
        """
    ))
    db = tmp_path / "app.db"
    url = f"sqlite:///{db}"
    assert subprocess.run([str(ALKSTORE), "migrate", "--url", url], capture_output=True, timeout=STARTUP).returncode == 0
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "jobs:handle", "--queue", "q", "--grace", "0", "--url", url],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stderr.readline() if proc.stderr is not None else ""
        assert "started" in line, line
        out, err = _sigterm_and_wait(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "stopped after 0 jobs" in err and "'app-poller'" in err, err
    assert "blocked in a call" not in err and "database" not in err.split("stopped after")[1], err


def _sigterm_and_wait(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM the worker and collect its output; it must exit within its stop's bound and
    a margin (the caller kills it otherwise)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=STOP_MARGIN + 30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the worker was still running long after SIGTERM") from None
