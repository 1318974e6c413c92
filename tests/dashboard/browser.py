"""Real-browser machinery for the dashboard tests: Debian's headless Chromium driven by
Selenium through the system chromedriver (Selenium Manager is never asked for a driver or a
browser, so nothing is downloaded), and ``alkstore dashboard`` run as a subprocess.

Outside CI a missing chromium, chromedriver or selenium skips the browser tests with the
reason; under CI=true it fails them (``.ci/run`` installs the Debian packages)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import IN_CI, Target

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ALKSTORE = Path(sys.executable).with_name("alkstore")
STARTUP = 60.0  # a fresh interpreter imports SQLAlchemy (and psycopg) before it serves
SERVING = re.compile(r"alkstore dashboard: serving (http://[^/\s]+)/")

# Selenium Manager would fetch a browser or driver it does not find; with the driver's path
# given it is skipped anyway, and offline mode makes sure it never reaches the network.
os.environ.setdefault("SE_OFFLINE", "true")


def browser_problem() -> str | None:
    """None when a headless browser can be driven here, else what is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if missing:
        return f"no headless browser: missing {', '.join(missing)} (apt-get install chromium chromium-driver)"
    return None


def require_browser() -> None:
    """Skip (outside CI) or fail (CI=true) when the browser stack is missing."""
    reason = browser_problem()
    if reason:
        if IN_CI:
            pytest.fail(f"CI=true and the dashboard browser tests must run: {reason}")
        pytest.skip(reason)


def make_driver() -> Any:
    """A headless Chromium session on the Debian binaries, explicitly."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--disable-gpu", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(STARTUP)
    return driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Dashboard:
    """A running ``alkstore dashboard`` process and the base URL it serves."""

    process: subprocess.Popen[str]
    base: str
    output: list[str]

    def url(self, path: str) -> str:
        return self.base.rstrip("/") + path


def dashboard_env() -> dict[str, str]:
    """The test's environment without any ALKSTORE_* setting: the command gets its database
    from its options only."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}


@contextmanager
def serve_dashboard(target: Target, *, read_only: bool = False) -> Iterator[Dashboard]:
    """``alkstore dashboard --url URL --schema SCHEMA --port N [--read-only]`` on a free port,
    up once it printed its ``serving http://...`` line; stopped with SIGTERM afterwards."""
    port = free_port()
    cmd = [str(ALKSTORE), "dashboard", "--url", target.url, "--schema", target.schema,
           "--host", "127.0.0.1", "--port", str(port)]
    if read_only:
        cmd.append("--read-only")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env=dashboard_env(),
    )
    output: list[str] = []
    served = threading.Event()
    found: list[str] = []

    def pump() -> None:  # keeps reading so a chatty server never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            m = SERVING.search(line)
            if m and not found:
                found.append(m.group(1))
                served.set()
        served.set()  # EOF: the process ended

    reader = threading.Thread(target=pump, name="dashboard-output", daemon=True)
    reader.start()
    try:
        if not served.wait(STARTUP) or not found:
            raise AssertionError(
                f"`alkstore dashboard` did not print its serving line within {STARTUP}s "
                f"(exit code {proc.poll()}):\n{''.join(output)}"
            )
        base = found[0]
        assert urlsplit(base).port == port, f"serving {base}, asked for port {port}"
        yield Dashboard(proc, base, output)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        reader.join(timeout=10)
