"""Values from the database (queue and worker names, handlers' error messages, schedule
names) reach the operator's terminal inert: every human-readable form of ``status``,
``dead list``, ``schedules``, ``queue``, ``sweep``, the one-line error on stderr and the
worker's log shows their control characters escaped (``\\x1b``, ``\\n``), so a handler
raising ``Exception("\\x1b[2J…")`` can neither clear the screen nor forge a line or a
column; tables stay aligned on the escaped text; ``--json`` keeps the exact value.

Run as subprocesses (the installed console script) against both engines."""

from __future__ import annotations

import json
import signal
import time
import unicodedata
from pathlib import Path
from types import SimpleNamespace

from tests.acceptance.test_cli import STARTUP, Cli, WorkerProcess
from tests.acceptance.test_cli import cli as cli  # noqa: F401 - the fixture, shared

# clear the screen, turn red, return to the line's start and start a new one, a tab (a
# forged column), BEL, DEL, a C1 CSI and a right-to-left override
EVIL = "\x1b[2J\x1b[31mok\r\nforged line\tcol\x07\x7f\x9b1m\u202e"
SHOWN = "\\x1b[2J\\x1b[31mok\\r\\nforged line\\tcol\\x07\\x7f\\x9b1m\\u202e"
NOT_YET = SimpleNamespace(errors=[])  # the job while get_job finds none
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


def assert_inert(text: str, format_chars: str = "\n") -> None:
    """Nothing a terminal would act on: no control character but the line ends (and the
    tabs a tab-separated format puts between its fields), no bidirectional override, no
    Unicode line separator."""
    acting = [ch for ch in text if ch not in format_chars and (unicodedata.category(ch) == "Cc" or ch in BIDI)]
    assert not acting, f"{acting!r} reached the terminal in {text!r}"


def right_edges(header: str, columns: list[str]) -> list[int]:
    return [header.index(c) + len(c) for c in columns]


def test_status_escapes_queue_and_worker_names_and_stays_aligned(cli: Cli) -> None:
    s = cli.install()
    evil = s.queue(f"evil{EVIL}")
    evil.enqueue({"n": 1})
    evil.set_concurrency(2)  # the settings column too
    s.queue("emails").enqueue({"n": 2})
    with s.executor() as ex:  # a worker registry row as a worker with a hostile --worker-id writes it
        s.backend.worker_refresh(ex, {
            "id": f"w{EVIL}", "hostname": f"host{EVIL}", "pid": 4242, "queues": json.dumps([f"q{EVIL}", "emails"]),
            "concurrency": 3, "ttl": 3600.0, "now": s.now(),
        })

    out = cli.ok("status")
    assert_inert(out)
    queues, workers = out.rstrip("\n").split("\n\n")
    header, *rows = queues.splitlines()
    assert len(rows) == 2, rows  # no forged line
    assert rows[0].startswith("emails ") and rows[1].startswith(f"evil{SHOWN} "), rows
    numbers = ["pending", "ready", "processing", "dead"]
    for row in rows:  # the numbers line up under their headings, after the escaped name
        for edge in right_edges(header, numbers):
            assert row[edge - 1].isdigit() and row[edge] == " ", (row, edge)
    assert rows[1].endswith("concurrency 2") and header.index("settings") == rows[1].index("concurrency 2")

    w_header, *w_rows = workers.splitlines()
    assert len(w_rows) == 1, w_rows
    (w_row,) = w_rows
    assert w_row.startswith(f"w{SHOWN} ")
    assert w_row[w_header.index("hostname"):].startswith(f"host{SHOWN} ")
    assert w_row[w_header.index("queues"):].startswith(f"q{SHOWN},emails ")
    pid = w_header.index("pid")  # the column is as wide as 4242, its heading is not
    assert w_row[pid:pid + 6] == "4242  "

    workers_only = cli.ok("status", "--workers")
    assert_inert(workers_only)
    assert workers_only.strip() == workers.strip()

    # machine output: the exact names, as JSON escapes them
    assert f"evil{EVIL}" in json.loads(cli.ok("status", "--json"))
    (info,) = json.loads(cli.ok("status", "--workers", "--json"))
    assert (info["id"], info["hostname"], info["queues"]) == (f"w{EVIL}", f"host{EVIL}", [f"q{EVIL}", "emails"])


def test_dead_list_escapes_the_handlers_error(cli: Cli) -> None:
    s = cli.install()
    q = s.queue("reports", max_attempts=1)
    q.enqueue({"r": 1})
    h = q.claim_one("w")
    assert h is not None and h.fail(f"boom: {EVIL}")

    out = cli.ok("dead", "list", "--queue", "reports")
    assert_inert(out, "\n\t")
    (line,) = out.splitlines()  # one job, one line
    fields = line.split("\t")
    assert len(fields) == 4 and fields[0] == str(h.id) and fields[2] == "attempts=1/1", fields
    assert fields[3] == f"boom: {SHOWN}"

    (job,) = json.loads(cli.ok("dead", "list", "--queue", "reports", "--json"))
    assert job["last_error"] == f"boom: {EVIL}"
    assert json.loads(cli.ok("dead", "show", str(h.id)))["last_error"] == f"boom: {EVIL}"


def test_schedules_escapes_names_and_queues(cli: Cli) -> None:
    s = cli.install()
    s.schedule(f"nightly{EVIL}", "@every 1d", f"reports{EVIL}", {"kind": EVIL})

    out = cli.ok("schedules")
    assert_inert(out, "\n\t")
    (line,) = out.splitlines()
    fields = line.split("\t")
    assert fields[:3] == [f"nightly{SHOWN}", "@every 1d", f"-> reports{SHOWN}"], fields
    assert len(fields) == 4 and fields[3].startswith("next "), fields

    (listed,) = json.loads(cli.ok("schedules", "--json"))
    assert (listed["name"], listed["queue"], listed["payload"]) == (f"nightly{EVIL}", f"reports{EVIL}", {"kind": EVIL})


def test_queue_commands_escape_the_name(cli: Cli) -> None:
    cli.install()
    name = f"q{EVIL}"
    for argv, said in [
        (["pause", name], "paused"),
        (["limit", name, "--concurrency", "2"], "paused, concurrency 2"),
        (["resume", name], "concurrency 2"),
    ]:
        out = cli.ok("queue", *argv)
        assert_inert(out)
        assert out == f"q{SHOWN}: {said}\n", argv


def test_sweep_escapes_queue_names(cli: Cli) -> None:
    s = cli.install()
    s.queue(f"q{EVIL}").enqueue({"n": 1})

    out = cli.ok("sweep")  # the names read from the database
    assert_inert(out)
    assert out == f"q{SHOWN}: expired=0 purged=0\n"
    out = cli.ok("sweep", "--queue", f"q{EVIL}")  # the name given
    assert_inert(out)
    assert out == f"q{SHOWN}: expired=0 purged=0\n"


def test_a_failures_one_line_is_escaped(tmp_path: Path) -> None:
    """A handler module whose import raises: its message ends up in the one-line error
    (before any database is opened: one engine will do)."""
    cli = Cli("sqlite", f"sqlite:///{tmp_path / 'x.db'}", "alkstore", tmp_path)
    (cli.tmp / "evil_jobs.py").write_text(f"raise RuntimeError({EVIL!r})\n")
    res = cli.run("worker", "evil_jobs:handle", "--queue", "q")
    assert res.returncode == 2, res.stderr
    assert_inert(res.stderr)
    (line,) = res.stderr.splitlines()
    assert "RuntimeError: \\x1b[2J\\x1b[31mok forged line col\\x07\\x7f\\x9b1m\\u202e" in line, line


def test_the_workers_log_escapes_the_handlers_error(cli: Cli) -> None:
    """The worker logs a failing handler's message and traceback on stderr: inert too. The
    log line is one line; the traceback keeps its line breaks, the message's included (they
    cannot be told apart from the traceback's own), but nothing else acts."""
    s = cli.install()
    q = s.queue("work")
    failing = q.enqueue({"raise": EVIL})
    w = WorkerProcess(cli, "work", "-c", "1")
    try:
        w.wait_mark(failing, "started", STARTUP)
        deadline = time.monotonic() + 10
        while not (q.get_job(failing) or NOT_YET).errors and time.monotonic() < deadline:
            time.sleep(0.02)  # the failure is recorded, so it has been logged
        code, out, err = w.signal_and_wait(signal.SIGTERM)
    finally:
        w.kill()
    assert code == 0, err
    assert_inert(out + err)
    assert f": {SHOWN}\n" in err, err  # the log line "job N: ... failed: <message>"
    traced = SHOWN.replace("\\r\\n", "\\r\n")  # the traceback's line break kept
    assert f"\nRuntimeError: {traced}\n" in err, err
    assert "Traceback (most recent call last):\n  File " in err, err



def columns_of(text: str) -> int:
    """How many terminal columns ``text`` takes: East Asian wide and fullwidth characters
    two, combining marks none (what a terminal shows; unlike ``len``)."""
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def test_status_aligns_queue_and_worker_names_of_wide_and_combining_characters(cli: Cli) -> None:
    """Queue and worker names in Chinese or Japanese (two columns a character), fullwidth
    Latin, or with combining accents (none): the table is padded by what the terminal
    shows, so every count still ends under the end of its heading (padding by ``len``
    left the counts of such a row off by one column a wide character, or a combining mark)."""
    s = cli.install()
    names = ["emails", "注文の確認", "ＡＢＣ", "cafe\u0301-cre\u0300me"]
    for name in names:
        s.queue(name).enqueue({"n": 1})
    with s.executor() as ex:
        s.backend.worker_refresh(ex, {
            "id": "作業者-1", "hostname": "ホスト", "pid": 4242, "queues": json.dumps(names[1:3]),
            "concurrency": 3, "ttl": 3600.0, "now": s.now(),
        })
    res = cli.run("status", env=cli.env(PYTHONIOENCODING="utf-8"))
    assert res.returncode == 0, res.stderr
    queues, workers = res.stdout.rstrip("\n").split("\n\n")
    header, *rows = queues.splitlines()
    assert len(rows) == len(names), rows
    for row in rows:
        for heading, count in {"pending": "1", "ready": "1", "processing": "0", "dead": "0"}.items():
            edge = columns_of(header[:header.index(heading) + len(heading)])
            # the character whose last column is the heading's last, and what follows it
            at = next(i for i in range(len(row)) if columns_of(row[:i + 1]) == edge)
            assert row[at:at + 2] == f"{count} ", (row, heading)
    w_header, w_row = workers.splitlines()
    for heading in ["hostname", "queues", "started_at"]:  # these read from the left edge
        start = columns_of(w_header[:w_header.index(heading)])
        at = next(i for i in range(len(w_row)) if columns_of(w_row[:i]) == start)
        assert w_row[at - 1] == " " and w_row[at] != " ", (w_row, heading)
    edge = columns_of(w_header[:w_header.index("concurrency") + len("concurrency")])
    at = next(i for i in range(len(w_row)) if columns_of(w_row[:i + 1]) == edge)
    assert w_row[at:at + 2] == "3 ", w_row


def test_status_stays_aligned_on_a_terminal_whose_encoding_lacks_a_names_characters(cli: Cli) -> None:
    """On an ASCII (or latin-1) terminal ``alkstore status`` writes a character the encoding
    lacks as a backslash escape (``\\u6ce8``: six columns, not the two the character would
    take): the cells are padded by what is written, so the counts of a row whose name has
    such characters still end under their headings."""
    s = cli.install()
    names = ["emails", "注文の確認", "café", "cafe\u0301"]
    for name in names:
        s.queue(name).enqueue({"n": 1})
    res = cli.run("status", env=cli.env(PYTHONIOENCODING="ascii"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.isascii()
    header, *rows = res.stdout.rstrip("\n").split("\n\n")[0].splitlines()
    assert [row.split()[0] for row in rows] == [
        name.encode("ascii", "backslashreplace").decode() for name in sorted(names)
    ]
    for row in rows:
        for heading, count in {"pending": "1", "ready": "1", "processing": "0", "dead": "0"}.items():
            edge = header.index(heading) + len(heading)  # all ASCII: a character is a column
            assert row[edge - 1:edge + 1] == f"{count} ", (row, heading)
