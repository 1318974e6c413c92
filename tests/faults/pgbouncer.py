"""A PgBouncer in transaction-pooling mode in front of the test PostgreSQL, on loopback.

``.ci/run`` starts one and exports ``ALKSTORE_TEST_PGBOUNCER_URL``; elsewhere the tests
start their own (Debian's ``pgbouncer`` package) on a free port, for the test module only.
Also runnable as ``python -m tests.faults.pgbouncer DIR PORT`` to write a config (CI)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import sqlalchemy as sa

from tests.support import PG_URL

URL_ENV = "ALKSTORE_TEST_PGBOUNCER_URL"


def write_config(
    directory: str, port: int, pg_url: str = PG_URL, *, pool_size: int = 20, query_wait_timeout: int = 120
) -> str:
    """Write pgbouncer.ini + userlist.txt into ``directory``; returns the ini's path.
    ``pool_size``: server connections per database and user; ``query_wait_timeout``: seconds
    a client's query may wait for one before PgBouncer fails it (its default, 120)."""
    pg = sa.make_url(pg_url)
    user = pg.username or "postgres"
    with open(os.path.join(directory, "userlist.txt"), "w") as f:
        f.write(f'"{user}" ""\n')  # auth_type=trust still needs the user listed
    ini = os.path.join(directory, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(
            "[databases]\n"
            f"* = host={pg.host or '127.0.0.1'} port={pg.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory}/userlist.txt\n"
            "pool_mode = transaction\nmax_client_conn = 500\n"
            f"default_pool_size = {pool_size}\nquery_wait_timeout = {query_wait_timeout}\n"
            f"logfile = {directory}/pgbouncer.log\npidfile = {directory}/pgbouncer.pid\n"
            f"admin_users = {user}\n"
        )
    os.chmod(directory, 0o755)
    if os.geteuid() == 0:  # pgbouncer drops root for the postgres user, who writes log + pid here
        shutil.chown(directory, "postgres")
    for name in ("pgbouncer.ini", "userlist.txt"):
        os.chmod(os.path.join(directory, name), 0o644)
    return ini


def bouncer_url(port: int, pg_url: str = PG_URL) -> str:
    return sa.make_url(pg_url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    try:
        eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with eng.connect() as c:
            c.execute(sa.text("SELECT 1"))
        eng.dispose()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not there"
        return False


@dataclass
class Bouncer:
    url: str
    proc: subprocess.Popen[bytes] | None
    directory: str | None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def start() -> Bouncer:
    """The CI's PgBouncer if one is announced, else a private one (raises if impossible)."""
    announced = os.environ.get(URL_ENV)
    if announced:
        if not answers(announced):
            raise RuntimeError(f"{URL_ENV}={announced} does not answer")
        return Bouncer(announced, None, None)
    return start_private()


def start_private(*, pool_size: int = 20, query_wait_timeout: int = 120) -> Bouncer:
    """A PgBouncer of the caller's own (even under CI), configured as ``write_config`` says."""
    binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if binary is None:
        raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")
    directory = tempfile.mkdtemp(prefix="alkstore-pgbouncer-")
    port = _free_port()
    ini = write_config(directory, port, pool_size=pool_size, query_wait_timeout=query_wait_timeout)
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []  # pgbouncer refuses to run as root
    proc = subprocess.Popen([binary, *as_user, ini], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bouncer = Bouncer(bouncer_url(port), proc, directory)
    deadline = time.monotonic() + 30
    while not answers(bouncer.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None and proc.stderr else ""
            bouncer.stop()
            raise RuntimeError(f"pgbouncer did not start: {err.strip()[-1000:]}")
        time.sleep(0.1)
    return bouncer


if __name__ == "__main__":
    print(write_config(sys.argv[1], int(sys.argv[2])))
