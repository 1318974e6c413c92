"""``alkstore dashboard`` serves the WSGI dashboard alone: it prints the URL it serves,
answers pages, refuses POSTs in read-only mode, and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard.seed import counts_in, row_of, seed
from tests.support import Target

ALKSTORE = Path(sys.executable).with_name("alkstore")
STARTUP = 60.0


def _start(db: Target, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    proc = subprocess.Popen(
        [str(ALKSTORE), "dashboard", "--port", "0", "--url", db.url, "--schema", db.schema, *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server is listening (or the command died)
    if not line:
        proc.wait(STARTUP)
        pytest.fail(f"alkstore dashboard exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
    assert line.startswith("alkstore dashboard: serving http://127.0.0.1:"), line
    return proc, line.split("serving ", 1)[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STARTUP)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return code, proc.stderr.read() if proc.stderr else ""


def test_serves_and_exits_cleanly_on_sigterm(db: Target, qname: str) -> None:
    store = db.store()
    try:
        seed(store, qname)
    finally:
        store.close()
    proc, url = _start(db)
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200
            page = r.read().decode()
        assert counts_in(row_of(page, "data-queue", qname)) == {"ready": 3, "scheduled": 2, "processing": 1, "dead": 2}
        # a POST without the page's token and cookie: refused
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{url}queues/{qname}/pause", data=b"x=1"), timeout=30)
        assert refused.value.code == 403
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert "Traceback" not in err
    check = db.store()
    try:
        assert check.queue(qname).settings().paused is False
    finally:
        check.close()


def test_read_only_flag(sqlite_db: Target) -> None:
    proc, url = _start(sqlite_db, "--read-only")
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            assert "<form method=\"post\"" not in r.read().decode()
    finally:
        code, err = _stop(proc)
    assert code == 0, err


def test_bad_port_is_a_usage_error(sqlite_db: Target) -> None:
    res = subprocess.run(
        [str(ALKSTORE), "dashboard", "--port", "70000", "--url", sqlite_db.url],
        capture_output=True, text=True, timeout=STARTUP, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2 and "--port" in res.stderr and len(res.stderr.strip().splitlines()) == 1



def test_missing_file_and_missing_schema_are_one_line_exit_2(tmp_path: Path) -> None:
    def run(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ALKSTORE), "dashboard", "--port", "0", "--url", url], cwd=tmp_path,
            capture_output=True, text=True, timeout=STARTUP, stdin=subprocess.DEVNULL,
        )

    res = run("sqlite:///typo.db")
    assert res.returncode == 2 and "does not exist" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "typo.db").exists() and res.stdout == ""
    (tmp_path / "empty.db").touch()  # a database without alkstore's tables: said before serving
    res = run("sqlite:///empty.db")
    assert res.returncode == 2 and "alkstore migrate" in res.stderr and res.stdout == "", res.stderr


def _serve_on(db: Target, host: str) -> tuple[str, str]:
    """``alkstore dashboard --host HOST --port 0``: its serving line, and its stderr once
    stopped with SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    proc = subprocess.Popen(
        [str(ALKSTORE), "dashboard", "--host", host, "--port", "0", "--read-only", "--url", db.url,
         "--schema", db.schema],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    code, err = _stop(proc)
    assert line.startswith("alkstore dashboard: serving http://"), (line, err)
    assert code == 0 and "Traceback" not in err, err
    return line, err


def test_listening_beyond_loopback_warns_once_on_stderr(sqlite_db: Target) -> None:
    """The dashboard has no login: bound to every interface it says so in one line on
    stderr (and serves anyway); on a loopback address it says nothing of the kind."""
    for host in ("0.0.0.0", ""):  # "": every interface too
        _, err = _serve_on(sqlite_db, host)
        warned = [line for line in err.splitlines() if "no login" in line]
        assert len(warned) == 1, err
        assert "WARNING" in warned[0] and "listening on 0.0.0.0," in warned[0], warned
    for host in ("127.0.0.1", "localhost"):
        _, err = _serve_on(sqlite_db, host)
        assert "no login" not in err and "WARNING" not in err, (host, err)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_an_ipv6_host_in_brackets_as_in_a_url(sqlite_db: Target) -> None:
    """``--host [::1]`` (the address as a URL writes it, and as the serving line prints
    it) failed with "Name or service not known"; it serves on ::1, like ``--host ::1``."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    for host in ("::1", "[::1]"):
        line, err = _serve_on(sqlite_db, host)
        assert line.startswith("alkstore dashboard: serving http://[::1]:"), (host, line)
        assert "WARNING" not in err, err
