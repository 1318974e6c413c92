"""The ``alkstore`` console script, run as a subprocess against real databases (a SQLite file;
a PostgreSQL schema through ``--schema``): migrate, status (table and JSON), dead
list/show/requeue, sweep, the NotInstalled message, and ``worker`` processing jobs and
stopping gracefully on SIGTERM/SIGINT with exit code 0."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import ENGINES, require_pg
from tests.support import PG_URL, deepest_accepted, new_pg_schema, wait_for

ALKSTORE = Path(sys.executable).with_name("alkstore")
STARTUP = 60.0  # a fresh interpreter imports SQLAlchemy (and psycopg) first


@dataclass
class Cli:
    """An empty database (SQLite file, or a not-yet-created PostgreSQL schema) and the
    ``alkstore`` command pointed at it."""

    kind: str
    url: str
    schema: str
    tmp: Path
    stores: list[alk.Store] = field(default_factory=list)

    @property
    def db_args(self) -> list[str]:
        return ["--url", self.url, "--schema", self.schema]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
        env.update(extra)
        return env

    def run(self, *argv: str, db: bool = True, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(ALKSTORE), *argv, *(self.db_args if db else [])]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env or self.env(),
            stdin=subprocess.DEVNULL, cwd=self.tmp,
        )

    def ok(self, *argv: str) -> str:
        res = self.run(*argv)
        assert res.returncode == 0, f"alkstore {' '.join(argv)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        assert "Traceback" not in res.stderr, res.stderr
        return res.stdout

    def store(self, **kw: Any) -> alk.Store:
        s = alk.Store(self.url, schema=self.schema, **kw)
        self.stores.append(s)
        return s

    def install(self) -> alk.Store:
        s = self.store()
        s.install()
        return s


@pytest.fixture(params=ENGINES)
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cli]:
    assert ALKSTORE.exists(), f"the console script is not installed at {ALKSTORE}"
    if request.param == "sqlite":
        c = Cli("sqlite", f"sqlite:///{tmp_path / 'cli.db'}", "alkstore", tmp_path)
    else:
        require_pg()
        c = Cli("postgresql", PG_URL, new_pg_schema("cli"), tmp_path)
    try:
        yield c
    finally:
        for s in c.stores:
            s.close()
        if c.kind == "postgresql":
            eng = sa.create_engine(PG_URL)
            with eng.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{c.schema}" CASCADE')
            eng.dispose()


# -- --version and python -m alkstore_sa ------------------------------------------------------


def test_version_and_python_m_alkstore_sa_is_the_same_command(cli: Cli) -> None:
    """``alkstore --version`` prints the library's version; ``python -m alkstore_sa`` is
    ``alkstore`` (same output, same exit codes, same one-line usage errors), for a machine
    where the console script is not on PATH."""
    assert cli.run("--version", db=False).stdout == f"alkstore {alk.__version__}\n"
    as_module = [sys.executable, "-m", "alkstore_sa"]

    def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_module, *argv], capture_output=True, text=True, timeout=60, env=cli.env(),
            stdin=subprocess.DEVNULL, cwd=cli.tmp,
        )

    for argv in (["--version"], [], ["no-such-command"]):
        want = cli.run(*argv, db=False)
        got = run_module(*argv)
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), argv
    assert run_module("--version").returncode == 0
    assert run_module().returncode == 2
    s = cli.install()
    s.queue("m").enqueue({"n": 1}, delay=3600)  # scheduled: no age that moves between the runs
    got = run_module("status", "--json", *cli.db_args)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(cli.ok("status", "--json"))
    assert json.loads(got.stdout)["m"]["pending"] == 1


# -- migrate and NotInstalled ----------------------------------------------------------------


def test_migrate_installs_and_is_idempotent(cli: Cli) -> None:
    head = migrations.head_revision()
    first = cli.ok("migrate")
    assert first.strip() == f"alkstore schema at {head}"
    again = cli.ok("migrate")
    assert again.strip() == f"alkstore schema at {head}"
    s = cli.store()
    s.check_schema()  # the library accepts what the command installed
    s.queue("after-migrate").enqueue({"ok": True})
    assert cli.ok("migrate").strip() == f"alkstore schema at {head}"  # data is untouched
    assert s.queue("after-migrate").stats().ready == 1


def test_migrate_to_a_revision_the_database_is_past_says_nothing_was_undone(cli: Cli) -> None:
    """``migrate --revision R`` only upgrades: on a database already past R it changes
    nothing, and says so instead of printing the current revision as if it had done what
    was asked (exit 0: an older release's deploy step in a rolling deploy is no failure)."""
    head = migrations.head_revision()
    cli.ok("migrate")
    for target in ("alkstore_0001", "base"):
        out = cli.ok("migrate", "--revision", target)
        assert out.strip().startswith(f"alkstore schema at {head}"), out
        assert f"past the requested {target}" in out and "nothing was undone" in out, out
    assert cli.ok("migrate", "--revision", head).strip() == f"alkstore schema at {head}"


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "--json"],
        ["dead", "list", "--queue", "q"],
        ["sweep"],
        ["worker", "json:dumps", "--queue", "q"],
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_not_installed_exits_2_and_names_migrate(cli: Cli, argv: list[str]) -> None:
    res = cli.run(*argv)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "alkstore migrate" in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""


def test_no_database_url_is_a_clear_error(tmp_path: Path) -> None:
    c = Cli("sqlite", "", "alkstore", tmp_path)
    res = c.run("status", db=False)
    assert res.returncode != 0
    assert "ALKSTORE_DATABASE_URL" in res.stderr and "Traceback" not in res.stderr


def test_bad_handler_spec_is_a_clear_error(tmp_path: Path) -> None:
    c = Cli("sqlite", f"sqlite:///{tmp_path / 'x.db'}", "alkstore", tmp_path)
    res = c.run("worker", "no_colon_here", "--queue", "q")
    assert res.returncode != 0
    assert "MODULE:HANDLER" in res.stderr and "Traceback" not in res.stderr


# -- status ---------------------------------------------------------------------------------


def _status_rows(out: str) -> dict[str, list[str]]:
    """The queue table: the lines before the blank line that starts the workers table."""
    lines = out.strip().split("\n\n")[0].splitlines()
    assert lines[0].split() == ["queue", "pending", "ready", "processing", "dead", "oldest_ready_age"]
    return {cols[0]: cols[1:] for cols in (line.split() for line in lines[1:])}


def test_status_table_and_json(cli: Cli) -> None:
    s = cli.install()
    assert _status_rows(cli.ok("status")) == {"(no": ["jobs)"]}
    assert json.loads(cli.ok("status", "--json")) == {}

    emails = s.queue("emails")
    emails.enqueue_many([{"to": f"u{i}"} for i in range(4)])
    emails.enqueue({"to": "later"}, delay=3600)
    assert emails.claim_one("w") is not None
    reports = s.queue("reports")
    reports.enqueue({"r": 1})
    h = reports.claim_one("w")
    assert h is not None and h.fail("no printer")
    time.sleep(0.05)  # the oldest ready job has an age

    rows = _status_rows(cli.ok("status"))
    assert set(rows) == {"emails", "reports"}
    assert rows["emails"][:4] == ["4", "3", "1", "0"]  # pending (incl. delayed), ready, processing, dead
    assert re.fullmatch(r"\d+\.\ds", rows["emails"][4]), rows["emails"][4]
    assert rows["reports"] == ["0", "0", "0", "1", "-"]

    data = json.loads(cli.ok("status", "--json"))
    assert set(data) == {"emails", "reports"}
    assert {k: v for k, v in data["emails"].items() if k not in ("oldest_ready_age", "settings")} == {
        "pending": 4, "ready": 3, "processing": 1, "dead": 0,
    }
    assert isinstance(data["emails"]["oldest_ready_age"], float) and data["emails"]["oldest_ready_age"] >= 0
    assert data["reports"] == {
        "pending": 0, "ready": 0, "processing": 0, "dead": 1, "oldest_ready_age": None,
        "settings": {"paused": False, "concurrency": None, "rate_limit": None, "rate_per": None},
    }

    # the same from the environment variables instead of flags
    res = cli.run("status", "--json", db=False, env=cli.env(ALKSTORE_DATABASE_URL=cli.url, ALKSTORE_SCHEMA=cli.schema))
    assert res.returncode == 0, res.stderr
    assert set(json.loads(res.stdout)) == {"emails", "reports"}


def test_status_leaves_out_expired_jobs_waiting_for_the_sweep_as_the_dashboard_does(cli: Cli) -> None:
    """A pending job past its ``expires_at`` that no sweep moved yet is never claimed:
    ``alkstore status`` leaves it out of ``pending`` and ``ready``, as the dashboard and the
    metrics gauges do (one reading of the counts), and a queue holding nothing else is not
    listed, as on the dashboard."""
    from alkstore_sa._gauges import read_gauges

    s = cli.install()
    past = cli.store(clock=lambda: time.time() - 7200)  # writes rows as of two hours ago
    past.queue("stale").enqueue({"s": 1}, expires=60)  # expired an hour and 59 minutes ago
    past.queue("stale").enqueue({"s": 2}, delay=7200 + 3600, expires=86400)  # scheduled, fresh
    s.queue("stale").enqueue({"s": 3})  # ready
    past.queue("gone").enqueue({"g": 1}, expires=60)  # nothing but an expired job

    gauges = read_gauges(s)
    assert set(gauges) == {"stale"}
    g = gauges["stale"]
    rows = _status_rows(cli.ok("status"))
    assert set(rows) == {"stale"}
    assert rows["stale"][:4] == [str(g.ready + g.scheduled), str(g.ready), str(g.processing), str(g.dead)]
    assert rows["stale"][:4] == ["2", "1", "0", "0"]
    data = json.loads(cli.ok("status", "--json"))
    assert set(data) == {"stale"}
    assert {k: data["stale"][k] for k in ("pending", "ready", "processing", "dead")} == {
        "pending": 2, "ready": 1, "processing": 0, "dead": 0,
    }
    assert isinstance(data["stale"]["oldest_ready_age"], float)


def test_output_on_a_terminal_that_cannot_show_a_name(cli: Cli) -> None:
    """A terminal whose encoding lacks a character of a queue name (a latin-1 locale, an
    emoji) made ``status`` and ``dead list`` end with "unexpected error:
    UnicodeEncodeError"; the character is written as a backslash escape instead."""
    s = cli.install()
    q = s.queue("mail-\U0001f600", max_attempts=1)
    q.enqueue({"n": 1})
    h = q.claim_one("w")
    assert h is not None and h.fail("boom \u2603")
    env = cli.env(PYTHONIOENCODING="latin-1")
    res = cli.run("status", env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "mail-\\U0001f600" in res.stdout, res.stdout
    res = cli.run("dead", "list", "--queue", "mail-\U0001f600", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip("\n").endswith("boom \\u2603"), res.stdout


# -- dead list / show / requeue ----------------------------------------------------------------


def test_dead_list_show_requeue(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("reports", max_attempts=1)
    first, second = q.enqueue({"r": "first"}), q.enqueue({"r": "second"})
    live = s.queue("other").enqueue({"live": True})
    h1 = q.claim_one("w")
    assert h1 is not None and h1.id == first and h1.fail("boom: no printer\tin room 2")
    h2 = q.claim_one("w")
    assert h2 is not None and h2.id == second and h2.retry("timeout")  # at the budget: dead

    lines = cli.ok("dead", "list", "--queue", "reports").strip().splitlines()
    listed = [line.split("\t") for line in lines]
    assert [int(cols[0]) for cols in listed] == [second, first]  # newest first
    assert listed[0][2] == "attempts=1/1" and listed[0][3] == "max attempts exceeded"
    assert listed[1][3:] == ["boom: no printer\\tin room 2"]  # the message's tab shown, not a column

    data = json.loads(cli.ok("dead", "list", "--queue", "reports", "--json"))
    assert [(j["id"], j["state"], j["last_error"]) for j in data] == [
        (second, "dead", "max attempts exceeded"), (first, "dead", "boom: no printer\tin room 2"),
    ]
    assert data[0]["errors"][-1]["error"] == "timeout"
    limited = json.loads(cli.ok("dead", "list", "--queue", "reports", "--json", "--limit", "1"))
    assert [j["id"] for j in limited] == [second]
    paged = json.loads(cli.ok("dead", "list", "--queue", "reports", "--json", "--before", str(second)))
    assert [j["id"] for j in paged] == [first]

    shown = json.loads(cli.ok("dead", "show", str(first)))
    assert shown["id"] == first and shown["state"] == "dead" and shown["queue"] == "reports"
    assert shown["payload"] == {"r": "first"} and shown["attempts"] == 1
    assert shown["last_error"] == "boom: no printer\tin room 2" and shown["died_at"]
    assert json.loads(cli.ok("dead", "show", str(live)))["state"] == "pending"
    res = cli.run("dead", "show", "987654321")
    assert res.returncode == 1 and "no job 987654321" in res.stdout

    out = cli.ok("dead", "requeue", "--queue", "reports", str(first))
    m = re.fullmatch(rf"{first} -> (\d+)\n", out)
    assert m, out
    new_id = int(m.group(1))
    assert new_id != first
    job = q.get_job(new_id)
    assert job is not None and job.state == "pending" and job.attempts == 0 and job.payload == {"r": "first"}
    assert q.get_job(first) is None

    res = cli.run("dead", "requeue", "--queue", "reports", str(second), "424242")
    assert res.returncode == 1, res.stdout
    out_lines = res.stdout.strip().splitlines()
    assert re.fullmatch(rf"{second} -> \d+", out_lines[0]), out_lines
    assert out_lines[1].startswith("424242: no dead job")
    assert cli.ok("dead", "list", "--queue", "reports").strip() == "(no dead jobs)"
    assert q.stats().ready == 2


def test_dead_requeue_of_an_id_given_twice_requeues_it_once_and_succeeds(cli: Cli) -> None:
    """``dead requeue --queue Q 3 3`` (an id pasted twice, a shell glob over a list)
    requeued job 3, then said ``3: no dead job with this id`` and exited 1, as if part of
    the request had failed; the dashboard's requeue takes each selected id once. Each id
    is requeued once, in the order given, and the command succeeds."""
    s = cli.install()
    q = s.queue("twice", max_attempts=1)
    first, second = q.enqueue({"n": 1}), q.enqueue({"n": 2})
    for _ in range(2):
        h = q.claim_one("w")
        assert h is not None and h.fail("boom")
    out = cli.ok("dead", "requeue", "--queue", "twice", str(second), str(first), str(second))
    assert [line.split(" -> ")[0] for line in out.strip().splitlines()] == [str(second), str(first)], out
    assert q.dead_jobs() == [] and q.stats().ready == 2


def test_dead_show_and_list_print_the_deepest_payload_accepted(cli: Cli) -> None:
    """A payload nested as deeply as enqueue accepts is printed by ``dead show`` and
    ``dead list --json`` (they copied it level by level, then encoded it again under the
    CLI's frames: "unexpected error: RecursionError")."""
    q = cli.install().queue("deep", max_attempts=1)
    depth, job_id = deepest_accepted(q.enqueue)
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    nested = "[" * depth + "]" * depth
    shown = re.sub(r"\s", "", cli.ok("dead", "show", str(job_id)))
    assert f'"payload":{nested},' in shown and f'"id":{job_id},' in shown
    listed = re.sub(r"\s", "", cli.ok("dead", "list", "--queue", "deep", "--json"))
    assert f'"payload":{nested},' in listed and listed.startswith("[{") and listed.endswith("}]")


def test_dead_list_and_show_a_job_whose_stored_payload_is_not_json(cli: Cli) -> None:
    """A worker fails a job whose stored payload is not JSON (a row edited by hand) and
    says: fix the row and requeue it. ``dead list`` and ``dead show`` find it, the JSON
    forms with ``payload`` null and the text as stored (they failed with
    "unexpected error: JSONDecodeError", so the row could not even be found)."""
    s = cli.install()
    q = s.queue("bad", max_attempts=1)
    job_id, good = q.enqueue({"a": 1}), q.enqueue({"b": 2})
    for h in q.claim_batch("w", 2):
        assert h.fail("boom")
    table = f'"{cli.schema}"."alkstore_dead_jobs"' if cli.kind == "postgresql" else "alkstore_dead_jobs"
    with sa.create_engine(cli.url).begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET payload = '{{broken' WHERE id = :id"), {"id": job_id})
    lines = cli.ok("dead", "list", "--queue", "bad").splitlines()
    assert [int(line.split("\t")[0]) for line in lines] == [good, job_id]
    listed = json.loads(cli.ok("dead", "list", "--queue", "bad", "--json"))
    assert [(j["id"], j["payload"], j.get("stored_payload")) for j in listed] == [
        (good, {"b": 2}, None), (job_id, None, "{broken"),
    ]
    shown = json.loads(cli.ok("dead", "show", str(job_id)))
    assert shown["payload"] is None and shown["stored_payload"] == "{broken" and shown["payload_error"]


def test_dead_list_and_show_a_job_whose_stored_payload_is_not_utf8_on_sqlite(tmp_path: Path) -> None:
    """SQLite stores whatever bytes a hand-written UPDATE puts in a TEXT column; one payload
    that is not UTF-8 made ``dead list`` of the whole queue and ``dead show`` fail ("Could
    not decode to UTF-8"). The job is listed and shown like any stored payload that is not
    JSON, its undecodable bytes as ``\\xNN``."""
    cli = Cli("sqlite", f"sqlite:///{tmp_path / 'cli.db'}", "alkstore", tmp_path)
    try:
        s = cli.install()
        q = s.queue("bin", max_attempts=1)
        job_id, good = q.enqueue({"a": 1}), q.enqueue({"b": 2})
        for h in q.claim_batch("w", 2):
            assert h.fail("boom")
        with sa.create_engine(cli.url).begin() as conn:
            conn.execute(
                sa.text("UPDATE alkstore_dead_jobs SET payload = CAST(X'7B2261223A2280FF227D' AS TEXT) WHERE id = :id"),
                {"id": job_id},
            )  # {"a":"<80><FF>"}
        lines = cli.ok("dead", "list", "--queue", "bin").splitlines()
        assert [int(line.split("\t")[0]) for line in lines] == [good, job_id]
        listed = json.loads(cli.ok("dead", "list", "--queue", "bin", "--json"))
        assert [(j["id"], j["payload"], j.get("stored_payload")) for j in listed] == [
            (good, {"b": 2}, None), (job_id, None, '{"a":"\\x80\\xff"}'),
        ]
        shown = json.loads(cli.ok("dead", "show", str(job_id)))
        assert shown["payload"] is None and shown["stored_payload"] == '{"a":"\\x80\\xff"}' and shown["payload_error"]
    finally:
        for st in cli.stores:
            st.close()


def test_timestamps_written_by_hand_past_the_calendar_are_listed(cli: Cli) -> None:
    """A timestamp column is a float: a row written by hand may hold one no date has
    (``1e300``, an infinity). ``dead list`` and ``dead show`` failed ("unexpected error:
    OverflowError") and ``status --json`` printed ``Infinity`` (not JSON): the dates are the
    calendar's first or last instant, the oldest ready job's age a number."""
    s = cli.install()
    q = s.queue("odd", max_attempts=1)
    dead = q.enqueue({"a": 1})
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    live = q.enqueue({"b": 2})
    prefix = f'"{cli.schema}".' if cli.kind == "postgresql" else ""
    with sa.create_engine(cli.url).begin() as conn:
        conn.execute(sa.text(f"UPDATE {prefix}alkstore_dead_jobs SET died_at = :inf WHERE id = :id"),
                     {"inf": float("inf"), "id": dead})
        conn.execute(sa.text(f"UPDATE {prefix}alkstore_jobs SET run_at = :v, created_at = :v WHERE id = :id"),
                     {"v": -1e300, "id": live})
    (line,) = cli.ok("dead", "list", "--queue", "odd").splitlines()
    assert line.split("\t")[:2] == [str(dead), "9999-12-31T23:59:59+00:00"]
    assert json.loads(cli.ok("dead", "show", str(dead)))["died_at"].startswith("9999-12-31T23:59:59")
    assert json.loads(cli.ok("dead", "show", str(live)))["run_at"].startswith("0001-01-01T00:00:00")

    def refuse(constant: str) -> object:
        raise AssertionError(f"not JSON: {constant}")

    status = json.loads(cli.ok("status", "--json"), parse_constant=refuse)
    assert status["odd"]["ready"] == 1 and status["odd"]["oldest_ready_age"] > 0


def test_json_output_is_strict_json_whatever_numbers_rows_written_by_hand_hold(cli: Cli) -> None:
    """A float column written by hand may hold an infinity (a rate limit's window, a dead
    job's stamps, a schedule's ``expires``) and a payload ``NaN``: ``status --json``,
    ``dead list --json``, ``dead show`` and ``schedules --json`` printed ``Infinity`` and
    ``NaN``, which no strict JSON parser (a browser's ``JSON.parse``, ``jq``) reads. Such
    a number is written as the string ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``, which
    ``float()`` reads back."""
    s = cli.install()
    q = s.queue("odd", max_attempts=1)
    q.set_rate_limit(5, per=60)
    dead = q.enqueue({"a": 1})
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    s.schedule("odd-every", "@every 1h", "odd", {"s": 1}, expires=60)
    prefix = f'"{cli.schema}".' if cli.kind == "postgresql" else ""
    with sa.create_engine(cli.url).begin() as conn:
        conn.execute(sa.text(f"UPDATE {prefix}alkstore_queue_settings SET rate_per = :inf"), {"inf": float("inf")})
        conn.execute(
            sa.text(f"UPDATE {prefix}alkstore_dead_jobs SET visibility_timeout = :inf, backoff_base = :minus, "
                    "payload = '[NaN, Infinity, \"NaN\"]' WHERE id = :id"),
            {"inf": float("inf"), "minus": float("-inf"), "id": dead},
        )
        conn.execute(sa.text(f"UPDATE {prefix}alkstore_schedules SET expires = :inf"), {"inf": float("inf")})

    def strict(text: str) -> object:
        def refuse(constant: str) -> object:
            raise AssertionError(f"not JSON: {constant}")

        return json.loads(text, parse_constant=refuse)

    status = strict(cli.ok("status", "--json"))
    assert status["odd"]["settings"]["rate_per"] == "Infinity"  # type: ignore[index]
    (listed,) = strict(cli.ok("dead", "list", "--queue", "odd", "--json"))  # type: ignore[misc]
    shown = strict(cli.ok("dead", "show", str(dead)))
    for job in (listed, shown):
        assert (job["visibility_timeout"], job["backoff_base"]) == ("Infinity", "-Infinity")  # type: ignore[index]
        assert job["payload"] == ["NaN", "Infinity", "NaN"]  # type: ignore[index]
    (schedule,) = strict(cli.ok("schedules", "--json"))  # type: ignore[misc]
    assert schedule["expires"] == "Infinity"


def test_dead_requeue_of_a_job_whose_unique_key_is_held_says_it_was_not_requeued(cli: Cli) -> None:
    """A dead job whose unique key a live job holds is not requeued (SPEC §14: nothing is
    written, the dead row stays): the command must say so and exit 1, not print
    ``ID -> LIVE_ID`` as if it had been requeued."""
    s = cli.install()
    q = s.queue("keyed", max_attempts=1)
    dead, free = q.enqueue({"n": 1}, unique_key="invoice-42"), q.enqueue({"n": 2})
    for _ in range(2):
        h = q.claim_one("w")
        assert h is not None and h.fail("boom")
    holder = q.enqueue({"n": 3}, unique_key="invoice-42")

    res = cli.run("dead", "requeue", "--queue", "keyed", str(dead), str(free))
    assert res.returncode == 1, (res.stdout, res.stderr)
    first, second = res.stdout.strip().splitlines()
    assert first == f"{dead}: not requeued: live job {holder} holds its unique key 'invoice-42' (the dead job stays)"
    assert re.fullmatch(rf"{free} -> \d+", second), second
    assert [j.id for j in q.dead_jobs()] == [dead]  # the dead row stayed, as the output says


# -- sweep -------------------------------------------------------------------------------------


def test_sweep_expires_and_purges(cli: Cli) -> None:
    cli.install()
    past = cli.store(clock=lambda: time.time() - 7200)  # writes rows as of two hours ago
    stale = past.queue("stale").enqueue({"s": 1}, expires=60)  # expired an hour and 59 min ago
    fresh = past.queue("stale").enqueue({"s": 2}, expires=86400)
    pq = past.queue("purge", dead_letter_retention=60)
    pq.enqueue({"p": 1})
    h = pq.claim_one("w")
    assert h is not None and h.fail("old failure")  # died two hours ago, kept for a minute

    assert cli.ok("sweep", "--queue", "stale").strip() == "stale: expired=1 purged=0"
    now = cli.store()
    job = now.get_job(stale)
    assert job is not None and job.state == "dead" and job.last_error == "expired"
    assert now.get_job(fresh) is not None and now.get_job(fresh).state == "pending"  # type: ignore[union-attr]
    assert now.get_job(h.id) is not None  # --queue stale left the other queue alone

    lines = sorted(cli.ok("sweep").strip().splitlines())
    assert lines == ["purge: expired=0 purged=1", "stale: expired=0 purged=0"]
    assert now.get_job(h.id) is None
    assert cli.ok("sweep", "-q", "purge", "-q", "stale").strip().splitlines() == [
        "purge: expired=0 purged=0", "stale: expired=0 purged=0",
    ]
    # a queue named twice is swept (and reported) once
    assert cli.ok("sweep", "-q", "stale", "-q", "purge", "-q", "stale").strip().splitlines() == [
        "stale: expired=0 purged=0", "purge: expired=0 purged=0",
    ]


def test_sweep_and_dead_reach_an_outboxs_backing_queue(cli: Cli) -> None:
    """An outbox is a queue under a reserved name: ``sweep`` without ``--queue`` must not
    stop at it (it sorted first and refused every queue after it), and ``dead`` works on
    the name ``status`` shows for it."""
    cli.install()
    past = cli.store(clock=lambda: time.time() - 7200)
    stale = past.queue("stale").enqueue({"s": 1}, expires=60)
    ob = past.outbox("billing")
    ob.enqueue({"e": 1})
    h = ob.claim_one("relay")
    assert h is not None and h.fail("refused downstream")
    backing = ob.queue.name

    lines = sorted(cli.ok("sweep").strip().splitlines())
    assert lines == [f"{backing}: expired=0 purged=0", "stale: expired=1 purged=0"]
    now = cli.store()
    assert now.get_job(stale).state == "dead"  # type: ignore[union-attr]

    listed = cli.ok("dead", "list", "--queue", backing)
    assert str(h.id) in listed and "refused downstream" in listed
    cli.ok("dead", "requeue", "--queue", backing, str(h.id))
    again = now.outbox("billing").claim_one("relay")
    assert again is not None and again.payload == {"e": 1}


def test_sweep_sweeps_a_queue_whose_stored_name_the_api_would_refuse(cli: Cli) -> None:
    """``sweep`` without ``--queue`` sweeps every queue the database lists, as stored. A row
    written by hand or by another tool may name a queue ``store.queue`` refuses (empty,
    reserved, too long): the sweep stopped there with ``InvalidName: queue name must not be
    empty``, exit 2 (a usage error for a command given no name), and every queue sorted
    after it went unswept — expired jobs never moved, dead letters never purged."""
    s = cli.install()
    past = cli.store(clock=lambda: time.time() - 7200)
    odd = {name: past.queue("stale").enqueue({"n": name}, expires=60) for name in ("", "__alkstore_x", "q" * 300)}
    stale = past.queue("stale").enqueue({"s": 1}, expires=60)
    prefix = f'"{cli.schema}".' if cli.kind == "postgresql" else ""
    with sa.create_engine(cli.url).begin() as conn:
        for name, job_id in odd.items():
            conn.execute(sa.text(f"UPDATE {prefix}alkstore_jobs SET queue = :q WHERE id = :id"), {"q": name, "id": job_id})
    lines = sorted(cli.ok("sweep").splitlines())
    assert lines == sorted([": expired=1 purged=0", "__alkstore_x: expired=1 purged=0",
                            f"{'q' * 300}: expired=1 purged=0", "stale: expired=1 purged=0"])
    for job_id in (*odd.values(), stale):
        job = s.get_job(job_id)
        assert job is not None and job.state == "dead" and job.last_error == "expired", job


def test_sweep_with_an_invalid_queue_name_sweeps_nothing(cli: Cli) -> None:
    """Bad input writes nothing: a ``--queue`` that is no valid name is refused (exit 2)
    before any queue is swept, not after the valid ones before it were."""
    cli.install()
    past = cli.store(clock=lambda: time.time() - 7200)
    stale = past.queue("stale").enqueue({"s": 1}, expires=60)  # expired long ago
    for bad in ("", "__alkstore_x"):
        res = cli.run("sweep", "-q", "stale", "-q", bad)
        assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
        assert "queue name" in res.stderr and res.stdout == "", (res.stdout, res.stderr)
        job = cli.store().get_job(stale)
        assert job is not None and job.state == "pending", job


# -- worker ------------------------------------------------------------------------------------

HANDLERS = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path

    MARKS = Path(os.environ["ALK_TEST_MARKS"])

    def handle(job):
        (MARKS / f"{job.id}.started").write_text(str(time.time()))
        time.sleep(job.payload.get("sleep", 0))
        if job.payload.get("raise"):
            raise RuntimeError(job.payload["raise"])
        (MARKS / f"{job.id}.done").write_text(json.dumps({"attempts": job.attempts, "pid": os.getpid()}))
    """
)


class WorkerProcess:
    def __init__(self, cli: Cli, queue: str, *extra: str, via: str = "cwd") -> None:
        moddir = cli.tmp / "app"
        moddir.mkdir()
        (moddir / "cli_test_jobs.py").write_text(HANDLERS)
        self.marks = cli.tmp / "marks"
        self.marks.mkdir()
        env = cli.env(ALK_TEST_MARKS=str(self.marks), PYTHONUNBUFFERED="1")
        if via == "pythonpath":
            env["PYTHONPATH"] = str(moddir)
            cwd = cli.tmp
        else:
            cwd = moddir
        self.proc = subprocess.Popen(
            [str(ALKSTORE), "worker", "cli_test_jobs:handle", "--queue", queue, *extra, *cli.db_args],
            cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def wait_mark(self, job_id: int, kind: str, timeout: float) -> None:
        path = self.marks / f"{job_id}.{kind}"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise AssertionError(f"the worker exited ({self.proc.returncode}) early:\n{out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not {kind} within {timeout}s")
            time.sleep(0.01)

    def signal_and_wait(self, sig: int, timeout: float = 30) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"the worker did not exit within {timeout}s of {sig!r}:\n{err}") from None
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def test_worker_processes_jobs_and_sigterm_finishes_in_flight(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("work")
    w = WorkerProcess(cli, "work", "-c", "2")
    try:
        quick = q.enqueue_many([{"n": i} for i in range(5)])
        for job_id in quick:
            w.wait_mark(job_id, "done", STARTUP)
        failing = q.enqueue({"raise": "smtp down"})
        w.wait_mark(failing, "started", 10)

        def retried() -> bool:
            j = q.get_job(failing)
            return j is not None and j.state == "pending" and bool(j.errors)

        deadline = time.monotonic() + 10
        while not retried() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert retried(), q.get_job(failing)
        assert q.get_job(failing).errors[-1]["error"] == "smtp down"  # type: ignore[union-attr]

        slow = q.enqueue_many([{"sleep": 1.5, "n": i} for i in range(3)])
        w.wait_mark(slow[0], "started", 10)
        w.wait_mark(slow[1], "started", 10)  # -c 2: two in flight, the third waits
        assert q.get_job(slow[2]).state == "pending"  # type: ignore[union-attr]
        code, _out, err = w.signal_and_wait(signal.SIGTERM)
    finally:
        w.kill()
    assert code == 0, err
    # the one traceback logged is the failing handler's, with its message
    assert err.count("Traceback") == err.count("\nRuntimeError: smtp down\n") >= 1, err
    for job_id in [*quick, *slow[:2]]:
        assert (w.marks / f"{job_id}.done").exists(), f"in-flight job {job_id} was not finished"
        assert q.get_job(job_id) is None, f"job {job_id} was not acked"
    third = q.get_job(slow[2])
    assert third is not None and third.state == "pending" and third.attempts == 0, "claimed after SIGTERM"
    assert not (w.marks / f"{slow[2]}.started").exists()
    assert "started on queue 'work'" in err and "stopped after" in err  # logging to stderr


def test_worker_sigint_is_graceful_too(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("interrupted")
    w = WorkerProcess(cli, "interrupted", "-c", "1", "--poll-interval", "3600", via="pythonpath")
    try:
        job_id = q.enqueue({"sleep": 1.0})
        w.wait_mark(job_id, "started", STARTUP)
        code, _out, err = w.signal_and_wait(signal.SIGINT)
    finally:
        w.kill()
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert (w.marks / f"{job_id}.done").exists()
    assert q.get_job(job_id) is None


def test_a_second_ctrl_c_ends_the_worker_at_once(cli: Cli) -> None:
    """Ctrl-C stops gracefully (the job in flight gets the grace period); a second Ctrl-C,
    pressed later, ends the process at once with 130, as Celery and RQ do, and the job's
    claim lapses (retried: at least once). (A SIGINT right after the first: test_signal_handoff.)"""
    s = cli.install()
    q = s.queue("cold")
    moddir = cli.tmp / "app"
    moddir.mkdir()
    (moddir / "cli_test_jobs.py").write_text(HANDLERS)
    marks = cli.tmp / "marks"
    marks.mkdir()
    errfile = cli.tmp / "stderr.txt"
    job_id = q.enqueue({"sleep": 600})
    with errfile.open("w") as err_out:
        proc = subprocess.Popen(
            [str(ALKSTORE), "worker", "cli_test_jobs:handle", "--queue", "cold", "--grace", "600", *cli.db_args],
            cwd=moddir, env=cli.env(ALK_TEST_MARKS=str(marks), PYTHONUNBUFFERED="1"),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_out, text=True,
        )
    try:
        deadline = time.monotonic() + STARTUP
        while not (marks / f"{job_id}.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, errfile.read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while "received SIGINT" not in errfile.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, errfile.read_text()
            time.sleep(0.01)
        time.sleep(1.5)  # a person's second press comes later
        assert proc.poll() is None, "the first Ctrl-C did not wait for the job in flight"
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a second Ctrl-C did not end the worker:\n{errfile.read_text()}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = errfile.read_text()
    assert code == 130, err
    assert "Ctrl-C again" in err and "exiting now" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing", job  # its claim lapses: retried
    assert not (marks / f"{job_id}.done").exists()


def test_every_option_of_every_command_says_what_it_is_and_its_default() -> None:
    """``--help`` explains each option: ``dead list --limit LIMIT``, ``--json`` and ``-q`` had
    no text at all, and ``run-schedules --lease``, ``worker --grace`` and ``--poll-interval``
    did not say the value used when they are left out."""
    from alkstore_sa.cli import _subcommand_parsers, build_parser

    unexplained = []
    for parser in _subcommand_parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            numeric_default = isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
            if not action.help or (numeric_default and "default" not in action.help):
                unexplained.append(f"{parser.prog} {action.option_strings[0]}")
    assert unexplained == []


STUBBORN = textwrap.dedent(
    """
    import asyncio, os
    from pathlib import Path

    async def handle(job):
        Path(os.environ["ALK_TEST_MARKS"], "started").write_text("")
        while True:  # ignores the cancellation at shutdown
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
    """
)


def test_an_async_job_that_ignores_cancellation_is_dropped_quietly_at_exit(cli: Cli) -> None:
    """An ``async def`` job still running after the grace period is cancelled; one that
    ignores the cancellation is dropped (one warning says so). Its coroutine was then closed
    when the interpreter exited — and the worker's wrapper took that GeneratorExit for an
    outcome: "job N raised ValueError: <Token ...> was created in a different Context" (the
    current-job variable reset outside the task), "the event loop caught an unexpected error",
    asyncio's "Task was destroyed but it is pending!", and a retry recorded for a job whose
    claim was meant to lapse. Now it goes quietly: the claim is left as it was."""
    s = cli.install()
    q = s.queue("stubborn")
    job_id = q.enqueue("x")
    (cli.tmp / "stubborn_jobs.py").write_text(STUBBORN)
    marks = cli.tmp / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "stubborn_jobs:handle", "--queue", "stubborn", "--grace", "0", *cli.db_args],
        cwd=cli.tmp, env=cli.env(ALK_TEST_MARKS=str(marks), PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: (marks / "started").exists() or proc.poll() is not None, "the job to start", timeout=STARTUP)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "ignored cancellation at shutdown and were dropped" in err, err
    for noise in ("Traceback", "raised", "unexpected error", "Task was destroyed"):
        assert noise not in err, err
    job = q.get_job(job_id)
    assert job is not None and job.state == "processing" and job.errors == [], job  # its claim lapses


SLOW_IMPORT = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import alkstore_sa as alk

    MARKS = Path(os.environ["ALK_TEST_MARKS"])
    (MARKS / "importing").write_text("")
    deadline = time.monotonic() + 120
    while not (MARKS / "go on").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # an application whose import takes a while (configuration, a framework)

    tasks = alk.Tasks()

    @tasks.task(queue="early")
    def mark(n):
        (MARKS / f"ran {n}").write_text("")
    """
)


def test_a_stop_while_the_worker_is_still_starting_is_graceful(cli: Cli) -> None:
    """A SIGTERM while ``alkstore worker`` is still starting (importing the application, here
    held at its import until the test has sent the signal) was not handled yet: the process
    died of it (exit -15, "143") instead of exiting 0. The handlers are installed before the
    application is imported, and a worker stopped before it started claims nothing."""
    s = cli.install()
    job_id = s.queue("early").enqueue({"task": "slow_app.mark", "args": [1], "kwargs": {}})
    (cli.tmp / "slow_app.py").write_text(SLOW_IMPORT)
    marks = cli.tmp / "marks"
    marks.mkdir()
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "slow_app:tasks", *cli.db_args],
        cwd=cli.tmp, env=cli.env(ALK_TEST_MARKS=str(marks), PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: (marks / "importing").exists() or proc.poll() is not None, "the import", timeout=STARTUP)
        proc.send_signal(signal.SIGTERM)  # taken (or fatal) before the import can go on
        (marks / "go on").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "received SIGTERM" in err and "Traceback" not in err, err
    assert not (marks / "ran 1").exists()
    job = s.queue("early").get_job(job_id)
    assert job is not None and job.state == "pending" and job.attempts == 0, job


OWN_HANDLER = textwrap.dedent(
    """
    import signal
    import alkstore_sa as alk

    signal.signal(signal.SIGTERM, lambda *_: print("the application's handler", flush=True))
    tasks = alk.Tasks()

    @tasks.task(queue="own")
    def nothing():
        pass
    """
)


def test_a_sigterm_handler_the_application_installs_at_import_does_not_replace_the_workers(cli: Cli) -> None:
    """The worker's stop handlers are installed before the application is imported; one the
    application installs at import must not take SIGTERM from the worker (which then never
    stopped): the worker's are put back after the import, as when they came after it."""
    cli.install()
    (cli.tmp / "own_handler_app.py").write_text(OWN_HANDLER)
    errfile = cli.tmp / "stderr.txt"
    with errfile.open("w") as err_out:
        proc = subprocess.Popen(
            [str(ALKSTORE), "worker", "own_handler_app:tasks", *cli.db_args],
            cwd=cli.tmp, env=cli.env(PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=err_out, text=True,
        )
    try:
        wait_for(lambda: "started on" in errfile.read_text() or proc.poll() is not None, "the start", timeout=STARTUP)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = errfile.read_text()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "received SIGTERM" in err and "the application's handler" not in out, (out, err)
