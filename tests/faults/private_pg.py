"""A private PostgreSQL cluster for tests that must restart the server: created with
``initdb`` in a temporary directory, run by ``pg_ctl`` as the ``postgres`` user on a free
loopback port (socket in the same directory), and always stopped and removed afterwards.
The shared server on port 5432 is never touched.

Skipped with the reason outside CI when ``runuser`` or the PostgreSQL binaries are
missing; under ``CI=true`` that is a failure."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support import IN_CI

PG_BIN = os.environ.get("ALKSTORE_TEST_PG_BIN", "/usr/lib/postgresql/15/bin")
RUN_AS = "postgres"


def _unavailable() -> str | None:
    """Why a private cluster cannot be started here, or None."""
    if shutil.which("runuser") is None:
        return "runuser is not installed (util-linux)"
    for tool in ("initdb", "pg_ctl"):
        if not os.access(os.path.join(PG_BIN, tool), os.X_OK):
            return f"{tool} not found in {PG_BIN} (set ALKSTORE_TEST_PG_BIN)"
    if os.geteuid() != 0:
        return "starting a private cluster needs root (to run initdb as the postgres user)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateCluster:
    """One running private cluster: its data directory, port and SQLAlchemy URL."""

    root: str
    port: int

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        cmd = ["runuser", "-u", RUN_AS, "--", os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, *args]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)

    def start(self) -> None:
        self._pg_ctl("-w", "-l", os.path.join(self.root, "log"), "start")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every backend is terminated, the server comes back."""
        self._pg_ctl("-w", "-m", "fast", "-l", os.path.join(self.root, "log"), "restart")

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "immediate", "stop")


def _create(root: str, port: int) -> PrivateCluster:
    cluster = PrivateCluster(root, port)
    subprocess.run(
        ["runuser", "-u", RUN_AS, "--", os.path.join(PG_BIN, "initdb"), "-D", cluster.data,
         "-A", "trust", "-U", "postgres", "--no-sync"],
        check=True, capture_output=True, timeout=120,
    )
    with open(os.path.join(cluster.data, "postgresql.conf"), "a") as conf:
        conf.write(
            f"port = {port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{root}'\n"
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            "shared_buffers = 16MB\nmax_connections = 50\n"
        )
    return cluster


def _set_port(cluster: PrivateCluster, port: int) -> None:
    with open(os.path.join(cluster.data, "postgresql.conf"), "a") as conf:
        conf.write(f"port = {port}\n")  # the last setting in the file wins
    cluster.port = port


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivateCluster]:
    """A started private cluster for the module; stopped and deleted in teardown."""
    reason = _unavailable()
    if reason:
        if IN_CI:
            pytest.fail(f"a private PostgreSQL cluster is required under CI: {reason}")
        pytest.skip(reason)
    root = tempfile.mkdtemp(prefix="alkstore-pg-")
    shutil.chown(root, RUN_AS, RUN_AS)
    cluster: PrivateCluster | None = None
    try:
        cluster = _create(root, _free_port())
        try:
            cluster.start()
        except subprocess.CalledProcessError:  # the free port was taken meanwhile: once more
            _set_port(cluster, _free_port())
            cluster.start()
        yield cluster
    finally:
        if cluster is not None:
            subprocess.run(
                ["runuser", "-u", RUN_AS, "--", os.path.join(PG_BIN, "pg_ctl"), "-D", cluster.data,
                 "-w", "-m", "immediate", "stop"],
                capture_output=True, timeout=60,
            )
        shutil.rmtree(root, ignore_errors=True)
