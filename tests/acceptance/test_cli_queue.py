"""``alkstore queue pause|resume|limit`` and the settings in ``alkstore status`` (SPEC §14),
run as subprocesses against both engines: each change lands in the database (seen by a
store), an omitted option keeps its setting, bad input exits 2 with one line and changes
nothing, and a resume from the command line wakes a running ``alkstore worker`` whose
re-poll is an hour."""

from __future__ import annotations

import json
import signal
import time

import alkstore_sa as alk
from tests.acceptance.test_cli import STARTUP, Cli, WorkerProcess, _status_rows
from tests.acceptance.test_cli import cli as cli  # noqa: F401 - the fixture, shared

NO_SETTINGS = {"paused": False, "concurrency": None, "rate_limit": None, "rate_per": None}


def _settings(cli: Cli, queue: str) -> alk.QueueSettings:
    return cli.store().queue(queue).settings()


def test_pause_limit_resume_round_trip(cli: Cli) -> None:
    s = cli.install()
    s.queue("emails").enqueue({"to": "a"})

    assert cli.ok("queue", "pause", "emails").strip() == "emails: paused"
    assert _settings(cli, "emails") == alk.QueueSettings(paused=True)
    assert s.queue("emails").claim_one("w") is None

    out = cli.ok("queue", "limit", "emails", "--concurrency", "3")
    assert out.strip() == "emails: paused, concurrency 3"
    out = cli.ok("queue", "limit", "emails", "--rate", "20/2.5")  # fractional seconds; concurrency kept
    assert out.strip() == "emails: paused, concurrency 3, rate 20/2.5s"
    assert _settings(cli, "emails") == alk.QueueSettings(True, 3, 20, 2.5)

    # status: the settings column (a queue with settings but no jobs is listed too)
    cli.ok("queue", "limit", "idle", "--rate", "100/60")
    header, *lines = cli.ok("status").split("\n\n")[0].strip().splitlines()  # the queue table
    assert header.split() == ["queue", "pending", "ready", "processing", "dead", "oldest_ready_age", "settings"]
    rows = {line.split()[0]: line for line in lines}
    assert set(rows) == {"emails", "idle"}
    assert rows["emails"].endswith("paused, concurrency 3, rate 20/2.5s")
    assert rows["idle"].split()[1:6] == ["0", "0", "0", "0", "-"] and rows["idle"].endswith("rate 100/60s")
    data = json.loads(cli.ok("status", "--json"))
    assert data["emails"]["settings"] == {"paused": True, "concurrency": 3, "rate_limit": 20, "rate_per": 2.5}
    assert data["emails"]["pending"] == 1
    assert data["idle"]["settings"] == {"paused": False, "concurrency": None, "rate_limit": 100, "rate_per": 60.0}

    assert cli.ok("queue", "resume", "emails").strip() == "emails: concurrency 3, rate 20/2.5s"
    out = cli.ok("queue", "limit", "emails", "--concurrency", "none", "--rate", "NONE")
    assert out.strip() == "emails: no settings"
    assert _settings(cli, "emails") == alk.QueueSettings()
    cli.ok("queue", "limit", "idle", "--rate", "none")
    rows = _status_rows(cli.ok("status"))  # no settings anywhere: no settings column
    assert set(rows) == {"emails"} and rows["emails"][:4] == ["1", "1", "0", "0"]
    assert json.loads(cli.ok("status", "--json"))["emails"]["settings"] == NO_SETTINGS


BAD = [
    (["limit", "q", "--concurrency", "0"], "--concurrency"),
    (["limit", "q", "--concurrency", "abc"], "--concurrency"),
    (["limit", "q", "--concurrency", "99999999999"], "--concurrency: the limit must be at most 2147483647"),
    (["limit", "q", "--rate", "99999999999/60"], "--rate: the rate must allow at most 2147483647"),
    (["limit", "q", "--concurrency", "2", "--concurrency", "3"], "more than once"),
    (["limit", "q", "--rate", "10"], "--rate"),
    (["limit", "q", "--rate", "0/5"], "--rate"),
    (["limit", "q", "--rate", "10/0"], "--rate"),
    (["limit", "q", "--rate", "10/nan"], "--rate"),
    (["limit", "q", "--concurrency", "3", "--rate", "10/1e12"], "--rate: the window must be at most 100 years"),  # one good, one bad: neither
    (["limit", "q", "--concurrency", "3", "--rate", "10/1e-9"], "--rate: the window must be at least 0.001"),  # too short to measure
    # digits of another script: int() and float() read them, the CLI does not (was: set to 3)
    (["limit", "q", "--concurrency", "\u0663"], "--concurrency"),
    (["limit", "q", "--rate", "\u0663/60"], "--rate"),
    (["limit", "q", "--rate", "3/\u0666\u0660"], "--rate"),
    (["limit", "q"], "--concurrency"),
    (["limit", "__alkstore_q", "--concurrency", "3"], "reserved"),
    (["pause"], "queue"),
]


def test_bad_input_exits_2_and_changes_nothing(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("q")
    q.set_concurrency(7)
    q.set_rate_limit(5, per=1)
    # parsing and validation happen before the store is opened, the same for both engines:
    # PostgreSQL runs the range checks and the library's own name validation
    cases = BAD if cli.kind == "sqlite" else [c for c in BAD if "must be at" in c[1] or c[1] == "reserved"]
    for argv, says in cases:
        res = cli.run("queue", *argv)
        assert res.returncode == 2, (argv, res.returncode, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, (argv, res.stderr)
        assert says in lines[0], (argv, lines[0])
        assert res.stdout == "", argv
        assert q.settings() == alk.QueueSettings(False, 7, 5, 1.0), argv
        assert set(s.queue_settings()) == {"q"}, argv


def test_resume_from_the_command_line_wakes_a_worker(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("held")
    w = WorkerProcess(cli, "held", "-c", "2", "--poll-interval", "3600")
    try:
        warm = q.enqueue({"warm": True})
        w.wait_mark(warm, "done", STARTUP)
        cli.ok("queue", "pause", "held")
        held = q.enqueue({"n": 1})  # the enqueue wakes the worker; its claim gets nothing
        time.sleep(1.0)
        assert not (w.marks / f"{held}.started").exists(), "handed out while paused"
        cli.ok("queue", "resume", "held")
        w.wait_mark(held, "done", 10)  # the re-poll is an hour: only the resume's wake is this fast
        code, _out, err = w.signal_and_wait(signal.SIGTERM)
    finally:
        w.kill()
    assert code == 0, err


def test_the_rate_window_is_shown_as_stored(cli: Cli) -> None:
    """The window an operator set is the one ``queue limit`` and ``status`` print: not
    rounded to six digits (1234567 s shown as ``1.23457e+06s``, a window that was never
    set) nor put in exponent form."""
    s = cli.install()
    s.queue("slow").enqueue({"n": 1})
    for text in ("1234567", "31536000", "0.0015", "86400.25"):
        out = cli.ok("queue", "limit", "slow", "--rate", f"5/{text}")
        assert out.strip() == f"slow: rate 5/{text}s", (text, out)
        line = next(ln for ln in cli.ok("status").splitlines() if ln.startswith("slow "))
        assert line.endswith(f"rate 5/{text}s"), (text, line)


def test_status_shows_a_settings_row_written_by_hand_without_its_window(cli: Cli) -> None:
    """A settings row written by hand (SQL, not the API) with a rate limit and no window
    made ``alkstore status`` fail ('unexpected error: TypeError', exit 1) for every queue,
    as the dashboard's queues page did: the settings' wording formatted the missing window
    as a number. Such a row is shown as it is."""
    import sqlalchemy as sa

    s = cli.install()
    s.queue("fine").enqueue(1)
    table = "alkstore_queue_settings" if cli.kind == "sqlite" else f'"{cli.schema}".alkstore_queue_settings'
    engine = sa.create_engine(cli.url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO {table} (queue, paused, rate_limit, updated_at) VALUES ('byhand', false, 5, 0)"
            )
    finally:
        engine.dispose()
    header, *lines = cli.ok("status").split("\n\n")[0].strip().splitlines()  # the queue table
    assert header.split()[-1] == "settings"
    rows = {line.split()[0]: line for line in lines}
    assert set(rows) == {"fine", "byhand"}
    assert rows["byhand"].endswith(" rate 5 (no window: not in force)"), rows["byhand"]
    assert json.loads(cli.ok("status", "--json"))["byhand"]["settings"]["rate_per"] is None
