"""The ``alkstore`` command's failures, run as real subprocesses: every failure is ONE line on
stderr (what went wrong, what to do) with the documented exit code — 2 when the command
cannot run as given (usage, URL, handler, missing database or tables), 1 when it ran and
the database or the operation failed — and never a traceback unless ``--traceback`` asks
for it. Also: the URL forms of SPEC §4 and driver options in ``--url``, and the log line of
a worker told to stop by a signal."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import alkstore_sa as alk
from alkstore_sa.cli import build_parser, main
from tests.conftest import require_pg
from tests.support import (
    PG_URL,
    Target,
    drop_pg_schema,
    new_pg_schema,
    pg_target,
    sqlite_target,
    wait_for,
)

ALKSTORE = Path(sys.executable).with_name("alkstore")
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1
STARTUP = 60.0  # a fresh interpreter imports SQLAlchemy (and psycopg) first


def env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    clean.update(extra)
    return clean


def alkstore(*argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ALKSTORE), *argv], capture_output=True, text=True, timeout=timeout, env=env(),
        stdin=subprocess.DEVNULL, cwd=cwd,
    )


def one_line_failure(res: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert the command failed with ``code`` and exactly one line on stderr; return it."""
    detail = f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert res.returncode == code, detail
    assert "Traceback" not in res.stderr, detail
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, detail
    assert lines[0].startswith("alkstore"), detail
    assert res.stdout == "", detail
    return lines[0]


def pg_url(drivername: str, query: str = "") -> str:
    url = make_url(PG_URL).set(drivername=drivername).render_as_string(hide_password=False)
    return f"{url}?{query}" if query else url


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Target]:
    target = sqlite_target(str(tmp_path))
    yield target
    target.engine.dispose()


@pytest.fixture(scope="module")
def pg_db() -> Iterator[Target]:
    require_pg()
    target = pg_target(new_pg_schema("clierr"))
    yield target
    drop_pg_schema(target)


# -- the documented exit codes -------------------------------------------------------------------


def test_help_documents_exit_codes_and_traceback_flag(tmp_path: Path) -> None:
    res = alkstore("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "exit codes" in res.stdout.lower() and "--traceback" in res.stdout


@pytest.mark.parametrize("command", ["dead-list", "status"])
def test_a_closed_stdout_ends_quietly_with_141(sqlite_db: Target, tmp_path: Path, command: str) -> None:
    """``alkstore dead list | head -1``: the reader goes away, and the command ends as Unix
    tools do (128 + SIGPIPE), with nothing on stderr — was "alkstore: [Errno 32] Broken
    pipe", exit 1. ``dead list`` breaks while printing; ``status`` (a few lines) only at the
    final flush."""
    store = alk.Store(sqlite_db.url)
    q = store.queue("d", max_attempts=1)
    q.enqueue_many([{"i": i} for i in range(300)])
    for handle in q.claim_batch("w", 300):
        handle.fail("x")
    store.close()
    argv = {"dead-list": ["dead", "list", "--queue", "d", "--limit", "300"], "status": ["status"]}[command]
    proc = subprocess.Popen(
        [str(ALKSTORE), *argv, "--url", sqlite_db.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, env=env(), cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes its first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=STARTUP) == 141, err
    assert err == ""


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ([], "COMMAND"),
        (["nosuchcommand"], "nosuchcommand"),
        (["status", "--bogus"], "--bogus"),
        (["dead", "show", "abc"], "abc"),
        (["worker", "builtins:repr"], "--queue"),
        (["dead", "list", "--queue", "a", "-q", "b"], "--queue"),
        (["dead", "requeue", "--queue", "a", "-q", "b", "1"], "--queue"),
        (["status", "--url", "sqlite:///a.db", "--url", "sqlite:///b.db"], "--url"),
        (["status", "--schema", "a", "--schema", "b"], "--schema"),
        (["dead", "list", "-q", "a", "--limit", "1", "--limit", "2"], "--limit"),
        (["migrate", "--listen-url", "nonsense"], "--listen-url"),  # migrate never listens: it ignored it
        # a worker option out of range names the option typed, not Worker()'s parameter
        # (was "shutdown_grace must be >= 0, got -1.0" for --grace -1)
        (["worker", "builtins:repr", "-q", "a", "--grace", "-1"], "--grace"),
        (["worker", "builtins:repr", "-q", "a", "--poll-interval", "0"], "--poll-interval"),
        (["worker", "builtins:repr", "-q", "a", "--poll-interval", "0.0001"], "--poll-interval"),
        (["worker", "builtins:repr", "-q", "a", "-c", "0"], "--concurrency"),
        (["worker", "builtins:repr", "-q", "a", "--batch-size", "0"], "--batch-size"),
        (["worker", "builtins:repr", "-q", "a", "--worker-id", ""], "--worker-id"),
        # run-schedules' lease the same (was "InvalidOptions: lease must be >= 0.001", raised
        # by run_schedules() once the store was open and the signal handlers installed)
        (["run-schedules", "--lease", "0"], "--lease"),
        (["run-schedules", "--lease", "0.0005"], "--lease"),
        (["run-schedules", "--lease", "nan"], "--lease"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_usage_errors_are_one_line_exit_2(sqlite_db: Target, tmp_path: Path, argv: list[str], says: str) -> None:
    db_args = ["--url", sqlite_db.url] if argv and argv[0] in ("status", "worker", "dead", "migrate", "run-schedules") and argv[1:2] != ["show"] else []
    line = one_line_failure(alkstore(*argv, *db_args, cwd=tmp_path), 2)
    assert says in line and "--help" in line, line


def test_a_repeated_queue_serves_every_queue_given(sqlite_db: Target, tmp_path: Path) -> None:
    """``--queue a --queue b`` with a handler: the same handler for both (never only the last)."""
    store = sqlite_db.store()
    try:
        store.queue("a").enqueue({"n": 1})
        store.queue("b").enqueue({"n": 2})
        store.queue("c").enqueue({"n": 3})
        res = alkstore("worker", "builtins:repr", "--queue", "a", "--queue", "b", "--burst", "--url", sqlite_db.url, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert [store.queue(q).stats().ready for q in "abc"] == [0, 0, 1]
    finally:
        store.close()


# -- a single-valued option given twice -------------------------------------------------------------

# the options documented as repeatable (docs/worker.md): each value given is used (with the
# positionals their command needs)
REPEATABLE = {("worker", "--queue"): ["builtins:repr"], ("sweep", "--queue"): []}


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    """Every option (not positional) of every (sub)command, with the command path that reaches it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # an alias maps to the same parser
                    seen.add(id(child))
                    yield from _options(child, (*path, name))
        elif action.option_strings and action.nargs != 0:  # takes a value (not a flag, not --help)
            yield path, action


def _a_value(action: argparse.Action) -> str:
    """A value the option's type accepts."""
    for text in ("1", "1/1"):
        try:
            (action.type or str)(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        return text
    raise AssertionError(f"no sample value for {action.option_strings}")


def _long(action: argparse.Action) -> str:
    return next(o for o in action.option_strings if o.startswith("--"))


def _valued_options() -> list[tuple[tuple[str, ...], argparse.Action]]:
    return list(_options(build_parser()))


def test_every_option_that_takes_a_value_is_seen() -> None:
    found = {(" ".join(path), opt) for path, action in _valued_options() for opt in action.option_strings}
    assert len(found) > 40, found  # the walk reaches every subcommand
    for expected in [("status", "--url"), ("status", "--schema"), ("worker", "-c"), ("worker", "--grace"),
                     ("worker", "--poll-interval"), ("worker", "--worker-id"), ("dead list", "--limit"),
                     ("queue limit", "--rate"), ("alembic-revision", "--down-revision"), ("dashboard", "--port")]:
        assert expected in found
    assert {(" ".join(path), _long(action)) for path, action in _valued_options()
            if isinstance(action, argparse._AppendAction)} == set(REPEATABLE)


@pytest.mark.parametrize(
    ("path", "action"), _valued_options(),
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else "/".join(v.option_strings),
)
def test_a_single_valued_option_given_twice_is_refused(
    path: tuple[str, ...], action: argparse.Action, capsys: pytest.CaptureFixture[str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every option of every command that takes one value refuses a second one (exit 2, one
    line naming it) rather than silently keeping the last; the repeatable ones keep both."""
    monkeypatch.chdir(tmp_path)  # a command that ran anyway writes nothing into the checkout
    for name in [k for k in os.environ if k.startswith("ALKSTORE_")]:
        monkeypatch.delenv(name)  # ... nor reaches a database
    value = _a_value(action)
    for option in action.option_strings:  # e.g. -c twice, and -c then --concurrency
        argv = [*path, option, value, action.option_strings[0], value]
        if (" ".join(path), _long(action)) in REPEATABLE:
            args = build_parser().parse_args([*argv, *REPEATABLE[" ".join(path), _long(action)]])
            assert getattr(args, action.dest) == [value, value]
            continue
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert _long(action) in lines[0] and "more than once" in lines[0], lines[0]


# -- an unusable --schema ------------------------------------------------------------------------------

# every command that takes --schema (all but one take --url too), with the rest of a command
# line it would run with
COMMANDS = {
    "migrate": [], "alembic-revision": ["--version-path", "out", "--down-revision", "base", "--from-step", "0"],
    "worker": ["builtins:repr", "--queue", "q", "--burst"], "status": [], "queue pause": ["q"],
    "queue resume": ["q"], "queue limit": ["q", "--concurrency", "1"], "dead list": ["--queue", "q"],
    "dead show": ["1"], "dead requeue": ["--queue", "q", "1"], "sweep": [], "schedules": [],
    "run-schedules": [], "dashboard": ["--port", "0"],
}


def test_every_command_with_a_schema_option_is_checked() -> None:
    assert {" ".join(path) for path, action in _valued_options() if "--schema" in action.option_strings} == set(COMMANDS)


ENVIRONMENT = ("ALKSTORE_DATABASE_URL", "ALKSTORE_SCHEMA", "ALKSTORE_LISTEN_URL")
UNUSABLE_SCHEMA = "schema must be a non-empty str of at most 63 bytes without NUL"


@pytest.mark.parametrize(
    ("schema", "message"),
    [("", UNUSABLE_SCHEMA), ("s" * 64, UNUSABLE_SCHEMA),
     ("bad\udcff", "schema must be valid Unicode (no lone surrogates)")],
    ids=["empty", "64-bytes", "not-utf8"],
)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unusable_schema_is_refused_by_every_command(
    sqlite_db: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], command: str, schema: str, message: str,
) -> None:
    """The library's own check (as ``alk.Store`` makes it), exit 2, before anything is
    written: ``migrate`` creates no SQLite file, ``alembic-revision`` writes no revision.
    ``not-utf8``: ``--schema $'bad\\xff'`` (Python's surrogate for the byte) was taken: on
    PostgreSQL every command failed at its first statement, exit 1, and alembic-revision
    wrote a revision no upgrade could run."""
    monkeypatch.chdir(tmp_path)
    url = ["--url", f"sqlite:///{tmp_path / 'new.db'}" if command == "migrate" else sqlite_db.url]
    argv = [*command.split(), *COMMANDS[command], "--schema", schema]
    capsys.readouterr()
    assert main(argv if command == "alembic-revision" else [*argv, *url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"alkstore: InvalidOptions: {message}"]
    assert not (tmp_path / "new.db").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("variable", "value", "url", "says"),
    [
        ("ALKSTORE_SCHEMA", "a.b", "sqlite", "$ALKSTORE_SCHEMA (the default of --schema): schema must not contain '.'"),
        ("ALKSTORE_DATABASE_URL", "not a url", None, "$ALKSTORE_DATABASE_URL (the default of --url): not a database URL"),
        ("ALKSTORE_LISTEN_URL", PG_URL, "sqlite",
         "$ALKSTORE_LISTEN_URL (the default of --listen-url): --listen-url is for PostgreSQL"),
        ("ALKSTORE_LISTEN_URL", "not a url", "pg", "$ALKSTORE_LISTEN_URL (the default of --listen-url): not a database URL"),
    ],
    ids=["schema", "url", "listen-url-on-sqlite", "listen-url"],
)
def test_an_unusable_value_from_the_environment_names_its_variable(
    sqlite_db: Target, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    variable: str, value: str, url: str | None, says: str,
) -> None:
    """The options default to $ALKSTORE_DATABASE_URL, $ALKSTORE_SCHEMA, $ALKSTORE_LISTEN_URL:
    a refusal of a value the environment gave names the variable, as nothing the operator
    typed holds it — was ``InvalidOptions: listen_url is for PostgreSQL stores`` for
    ``alkstore status --url sqlite:///app.db`` in a shell whose ALKSTORE_LISTEN_URL is
    another deployment's (naming the Store's parameter), ``schema must not contain '.'`` for
    a command given no --schema. (Refused before anything connects.)"""
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    given = {"sqlite": ["--url", sqlite_db.url], "pg": ["--url", PG_URL], None: []}[url]
    capsys.readouterr()
    assert main(["status", *given]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_value_given_on_the_command_line_is_refused_in_the_options_words(
    sqlite_db: Target, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--listen-url with a SQLite --url names the option (was the store's parameter,
    ``listen_url``); a value on the command line wins over its variable, which is then
    neither used nor named."""
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    assert main(["status", "--url", sqlite_db.url, "--listen-url", PG_URL]) == 2
    assert capsys.readouterr().err.strip() == (
        "alkstore: InvalidOptions: --listen-url is for PostgreSQL stores (SQLite wakes through its watcher)"
    )
    monkeypatch.setenv("ALKSTORE_SCHEMA", "a.b")
    monkeypatch.setenv("ALKSTORE_DATABASE_URL", "not a url")
    assert main(["status", "--url", sqlite_db.url, "--schema", "alkstore"]) == 0
    assert main(["status", "--url", sqlite_db.url, "--schema", "x.y"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("alkstore: InvalidOptions: schema must not contain '.' ('x.y')")


def test_migrate_refuses_an_empty_schema_on_postgresql(pg_db: Target, tmp_path: Path) -> None:
    """Was ``unexpected error: IndexError: string index out of range`` (exit 1)."""
    line = one_line_failure(alkstore("migrate", "--url", PG_URL, "--schema", "", cwd=tmp_path), 2)
    assert line == "alkstore: InvalidOptions: schema must be a non-empty str of at most 63 bytes without NUL"


# -- an in-memory SQLite database ------------------------------------------------------------------

IN_MEMORY = ["sqlite://", "sqlite:///:memory:", "sqlite:///file:mem?mode=memory&uri=true",
             "sqlite:///file::memory:?uri=true", "sqlite+pysqlite://"]


def test_every_command_with_a_url_option_is_checked() -> None:
    with_url = {" ".join(path) for path, action in _valued_options() if "--url" in action.option_strings}
    assert with_url == set(COMMANDS) - {"alembic-revision"}


@pytest.mark.parametrize("url", IN_MEMORY)
@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"alembic-revision"}))
def test_an_in_memory_sqlite_url_is_refused_by_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, url: str,
) -> None:
    """An in-memory database dies with the command: ``migrate`` reported success on one (a
    typo that looks like an install), the others said the tables were not installed."""
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main([*command.split(), *COMMANDS[command], "--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in-memory SQLite database" in err[0], err
    assert "needs a database file or server it can share with the application" in err[0], err
    assert list(tmp_path.iterdir()) == []  # not even a file named like the URL


def test_migrate_refuses_an_in_memory_sqlite_url(tmp_path: Path) -> None:
    line = one_line_failure(alkstore("migrate", "--url", "sqlite://", cwd=tmp_path), 2)
    assert "in-memory SQLite database" in line and "alkstore schema at" not in line, line


REGISTRY = """
import alkstore_sa as alk

tasks = alk.Tasks()


@tasks.task(queue="emails")
def send(n):
    print("sent", n, flush=True)


@tasks.task(queue="reports")
async def build(day):
    print("built", day, flush=True)
"""


def test_worker_serves_a_tasks_registry(sqlite_db: Target, tmp_path: Path) -> None:
    """``worker MODULE:TASKS`` serves every queue of the registry; ``--queue`` narrows it, and
    a ``--queue`` with no task in the registry is a usage error that consumes nothing."""
    (tmp_path / "jobs_registry.py").write_text(REGISTRY)
    store = sqlite_db.store()
    try:
        send_id = store.queue("emails").enqueue({"task": "jobs_registry.send", "args": [1], "kwargs": {}})
        store.queue("reports").enqueue({"task": "jobs_registry.build", "args": ["mon"], "kwargs": {}})
        bad = alkstore("worker", "jobs_registry:tasks", "--queue", "nosuch", "--burst", "--url", sqlite_db.url, cwd=tmp_path)
        line = one_line_failure(bad, 2)
        assert "'nosuch'" in line and "'emails'" in line, line
        narrowed = alkstore("worker", "jobs_registry:tasks", "-q", "emails", "--burst", "--url", sqlite_db.url, cwd=tmp_path)
        assert narrowed.returncode == 0, narrowed.stderr
        assert "sent 1" in narrowed.stdout and "built" not in narrowed.stdout
        assert store.get_job(send_id) is None and store.queue("reports").stats().ready == 1
        everything = alkstore("worker", "jobs_registry:tasks", "--burst", "--url", sqlite_db.url, cwd=tmp_path)
        assert everything.returncode == 0, everything.stderr
        assert "built mon" in everything.stdout
        assert store.queue("reports").stats().pending == 0
        for argv in (["jobs_registry:send"], ["jobs_registry:send", "--queue", "emails"]):
            res = alkstore("worker", *argv, "--burst", "--url", sqlite_db.url, cwd=tmp_path)
            line = one_line_failure(res, 2)  # a task, not a handler: its registry is what to serve
            assert "is a task" in line and "jobs_registry:tasks" not in line and "Tasks registry" in line, line
    finally:
        store.close()


def test_no_database_url_is_one_line_exit_2(tmp_path: Path) -> None:
    line = one_line_failure(alkstore("status", cwd=tmp_path), 2)
    assert "--url" in line and "ALKSTORE_DATABASE_URL" in line


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("not a url", "not a database URL"),
        ("mysql://u@h/db", "mysql"),
        ("postgresql://u@h/db?prepare_threshold=often", "prepare_threshold"),
        ("postgresql://u:s3cr3t@h/db?no_such_option=1", "no_such_option"),
    ],
)
def test_unusable_url_is_one_line_exit_2(tmp_path: Path, url: str, says: str) -> None:
    line = one_line_failure(alkstore("status", "--url", url, cwd=tmp_path), 2)
    assert says in line and "s3cr3t" not in line, line


def test_not_installed_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sa.create_engine(f"sqlite:///{path}").connect().close()  # an existing database without the tables
    line = one_line_failure(alkstore("status", "--url", f"sqlite:///{path}", cwd=tmp_path), 2)
    assert "alkstore migrate" in line


def test_not_installed_in_another_schema_names_it(pg_db: Target, tmp_path: Path) -> None:
    """The advice for a store on a schema of its own says `--schema NAME` (without it,
    `alkstore migrate` installs into the default schema and the store still finds none)."""
    line = one_line_failure(alkstore("status", "--url", pg_db.url, "--schema", "nosuch", cwd=tmp_path), 2)
    assert "`alkstore migrate --url URL --schema nosuch`" in line, line
    assert "`alkstore alembic-revision --schema nosuch`" in line, line


# -- handler paths ---------------------------------------------------------------------------------

MODULES = {
    "broken_jobs.py": "raise RuntimeError('boom at import')\n",
    "needs_dep.py": "import no_such_dependency_xyz\n\ndef handle(job):\n    pass\n",
    "good_jobs.py": "VALUE = 3\n\ndef handle(job):\n    pass\n",
    "script_jobs.py": "import sys\n\ndef handle(job):\n    pass\n\nsys.exit(0)\n",  # a script's unguarded main
    # BaseExceptions that are no Exception: asyncio's cancellation, a framework's own
    "cancelled_jobs.py": "import asyncio\n\nraise asyncio.CancelledError('cancelled at import')\n",
    "exotic_jobs.py": "class Halt(BaseException):\n    pass\n\nraise Halt('halted at import')\n",
    # a lazy attribute (PEP 562) whose own import fails
    "lazy_jobs.py": "def __getattr__(name):\n    raise ImportError(f'lazy load of {name} failed')\n",
    # an exception whose str() raises, at import and from a lazy attribute: the message said
    # 'unexpected error: ZeroDivisionError' (exit 1), the str() failure, naming no module
    "unprintable_jobs.py": "class Odd(Exception):\n    def __str__(self):\n        return 1 / 0\n\nraise Odd('odd')\n",
    "unprintable_lazy.py": (
        "class Odd(Exception):\n    def __str__(self):\n        return 1 / 0\n\n"
        "def __getattr__(name):\n    raise Odd('odd')\n"
    ),
    # a message of 200,000 characters was printed whole as the one line
    "huge_jobs.py": "raise ValueError('x' * 200_000)\n",
}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nosuchmodule:handler", "nosuchmodule"),
        ("good_jobs:nosuchattr", "nosuchattr"),
        ("good_jobs:handle.nope", "nope"),
        ("good_jobs.handle", "MODULE:HANDLER"),
        (":handle", "MODULE:HANDLER"),
        ("good_jobs:VALUE", "neither a Tasks registry nor callable"),
        ("broken_jobs:handle", "boom at import"),
        ("needs_dep:handle", "no_such_dependency_xyz"),
        ("good_jobs.py:handle", "not a file path: try 'good_jobs:handle'"),
        ("./good_jobs:handle", "not a file path: try 'good_jobs:handle'"),
        ("app/good_jobs.py:handle", "not a file path: try 'app.good_jobs:handle'"),
        ("script_jobs:handle", "called sys.exit(0)"),
        ("cancelled_jobs:handle", "importing 'cancelled_jobs' failed: CancelledError: cancelled at import"),
        ("exotic_jobs:handle", "importing 'exotic_jobs' failed: Halt: halted at import"),
        ("lazy_jobs:tasks", "reading 'tasks' of 'lazy_jobs' failed: ImportError: lazy load of tasks failed"),
        ("unprintable_jobs:tasks", "importing 'unprintable_jobs' failed: Odd: Odd('odd')"),
        ("unprintable_lazy:tasks", "reading 'tasks' of 'unprintable_lazy' failed: Odd: Odd('odd')"),
        ("huge_jobs:tasks", "importing 'huge_jobs' failed: ValueError: xxx"),
    ],
)
def test_handler_path_mistakes_are_one_line_exit_2(sqlite_db: Target, tmp_path: Path, spec: str, says: str) -> None:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    res = alkstore("worker", spec, "--queue", "q", "--url", sqlite_db.url, cwd=tmp_path)
    line = one_line_failure(res, 2)
    assert says in line, line
    assert len(line) < 11_000, len(line)  # the application's text cut as the worker cuts it


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_flag_shows_the_traceback(sqlite_db: Target, tmp_path: Path, where: str) -> None:
    (tmp_path / "broken_jobs.py").write_text(MODULES["broken_jobs.py"])
    argv = ["worker", "broken_jobs:handle", "--queue", "q", "--url", sqlite_db.url]
    argv = ["--traceback", *argv] if where == "before" else [*argv, "--traceback"]
    res = alkstore(*argv, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "Traceback" in res.stderr and "RuntimeError: boom at import" in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("alkstore")  # the summary comes last


def test_unexpected_error_is_one_line_with_a_hint(tmp_path: Path) -> None:
    """An error the command has no words for — here one of the app's own revision files
    raising as Alembic loads it — is one line naming it, with the flag that shows where."""
    (tmp_path / "alembic.ini").write_text("[alembic]\nscript_location = migrations\n")
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "migrations" / "script.py.mako").write_text("")
    (versions / "a1_broken.py").write_text(
        'revision = "a1"\ndown_revision = None\nraise ZeroDivisionError("a broken revision file")\n'
    )
    line = one_line_failure(alkstore("alembic-revision", cwd=tmp_path), 1)
    assert "ZeroDivisionError: a broken revision file" in line and "--traceback" in line, line


def test_alembic_revision_usage_error_is_one_line_exit_2(tmp_path: Path) -> None:
    line = one_line_failure(alkstore("alembic-revision", cwd=tmp_path), 2)
    assert "alembic.ini" in line


def test_migrate_to_an_unknown_revision_is_one_line_exit_2(tmp_path: Path) -> None:
    res = alkstore("migrate", "--revision", "nosuchrev", "--url", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path)
    assert "nosuchrev" in one_line_failure(res, 2)
    assert not (tmp_path / "m.db").exists()  # refused before the file (and a version table) was made


# -- URL forms (SPEC §4) and driver options ----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "query"),
    [("postgresql", ""), ("postgres", ""), ("postgresql+psycopg", ""), ("postgresql", "prepare_threshold=0"),
     ("postgres", "prepare_threshold=none&connect_timeout=5&keepalives_idle=30")],
)
def test_postgres_url_forms_work(pg_db: Target, tmp_path: Path, scheme: str, query: str) -> None:
    store = pg_db.store()
    queue = f"forms-{uuid.uuid4().hex[:8]}"
    try:
        store.queue(queue).enqueue_many([{"n": i} for i in range(6)])
        url = pg_url(scheme, query)
        res = alkstore("status", "--json", "--url", url, "--schema", pg_db.schema, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)[queue]["ready"] == 6
        res = alkstore("worker", "builtins:repr", "--queue", queue, "--burst", "--url", url, "--schema", pg_db.schema, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr
        assert store.queue(queue).stats().pending == 0
    finally:
        store.close()


# -- the database cannot be reached, or refuses ------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"], ["dead", "list", "--queue", "q"], ["dead", "show", "1"], ["dead", "requeue", "-q", "q", "1"],
        ["sweep"], ["schedules"], ["worker", "builtins:repr", "--queue", "q"], ["migrate"],
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_unreachable_server_is_one_line_exit_1(tmp_path: Path, argv: list[str]) -> None:
    line = one_line_failure(alkstore(*argv, "--url", UNREACHABLE, cwd=tmp_path), 1)
    assert "127.0.0.1" in line and "--url" in line, line


@pytest.mark.parametrize(
    ("query", "code"),
    [("password=s3cr3t-pw", 1), ("sslpassword=s3cr3t-pw&password=s3cr3t-pw", 1), ("password=s3cr3t-pw&bogus=1", 2)],
    ids=["password", "sslpassword", "refused-option"],
)
def test_a_password_in_the_urls_query_is_not_shown(tmp_path: Path, query: str, code: int) -> None:
    """libpq takes the password (and the SSL key's, ``sslpassword``) as a query option too:
    the one-line error hides it as it hides one in the user part — was ``cannot connect to
    the database postgresql://postgres@127.0.0.1:1/test?password=s3cr3t-pw: …``, a secret
    on stderr, in a CI log or the journal. So does the store's repr."""
    url = f"{UNREACHABLE}?{query}"
    line = one_line_failure(alkstore("status", "--url", url, cwd=tmp_path), code)
    assert "s3cr3t" not in line and "password=***" in line, line
    if code == 2:  # the store refuses the URL as the command did, in the same words
        with pytest.raises(alk.InvalidOptions) as refused:
            alk.Store(url)
        assert "s3cr3t" not in str(refused.value) and "password=***" in str(refused.value), refused.value
        return
    with alk.Store(url) as store:
        assert "s3cr3t" not in repr(store) and "password=***" in repr(store), repr(store)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port where connections are accepted by the kernel and never answered: a server
    that hangs, or a firewall that drops packets, as libpq's connect_timeout sees it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


@pytest.mark.parametrize("where", ["timeout", "no-such-host"])
def test_a_database_that_cannot_be_reached_in_other_ways_is_said_so(
    tmp_path: Path, silent_port: int, where: str
) -> None:
    """A connect that timed out (``?connect_timeout=``, which the docs recommend) or a host
    name that does not resolve is the database being unreachable, said with the URL and
    what to check, like a refused connection — was ``database error: ConnectionTimeout:
    connection timeout expired`` (and ``failed to resolve host …``), naming neither."""
    url = {
        "timeout": f"postgresql://postgres@127.0.0.1:{silent_port}/test?connect_timeout=1",
        "no-such-host": "postgresql://postgres@no-such-host.invalid/test",
    }[where]
    for argv in (["status"], ["dead", "show", "1"]):
        line = one_line_failure(alkstore(*argv, "--url", url, cwd=tmp_path), 1)
        assert line.startswith("alkstore: cannot connect to the database postgresql://"), line
        assert "check --url" in line, line


@pytest.fixture
def norights_role(pg_db: Target) -> Iterator[str]:
    """A real login role with no CREATE on the database and no USAGE on any alkstore schema."""
    role = f"alk_norights_{uuid.uuid4().hex[:10]}"
    with pg_db.engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role
    finally:
        with pg_db.engine.begin() as conn:
            conn.exec_driver_sql(f'DROP ROLE IF EXISTS "{role}"')


def test_migrate_without_create_rights_is_one_line_exit_1(pg_db: Target, norights_role: str, tmp_path: Path) -> None:
    url = make_url(PG_URL).set(drivername="postgresql", username=norights_role, password=None).render_as_string(hide_password=False)
    fresh = new_pg_schema("clierr_fresh")
    res = alkstore("migrate", "--url", url, "--schema", fresh, cwd=tmp_path)
    line = one_line_failure(res, 1)
    assert "permission denied" in line, line
    assert pg_db.scalar("SELECT count(*) FROM pg_namespace WHERE nspname = :s", s=fresh) == 0


def test_commands_without_schema_rights_are_one_line_exit_1(pg_db: Target, norights_role: str, tmp_path: Path) -> None:
    url = make_url(PG_URL).set(drivername="postgresql", username=norights_role, password=None).render_as_string(hide_password=False)
    for argv in (["status"], ["dead", "list", "-q", "q"]):
        res = alkstore(*argv, "--url", url, "--schema", pg_db.schema, cwd=tmp_path)
        assert "permission denied" in one_line_failure(res, 1)


# -- a SQLite file that does not exist ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"], ["dead", "list", "--queue", "q"], ["dead", "show", "1"], ["dead", "requeue", "-q", "q", "1"],
        ["sweep"], ["schedules"], ["run-schedules"], ["worker", "builtins:repr", "--queue", "q"],
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_missing_sqlite_file_is_refused_not_created(tmp_path: Path, argv: list[str]) -> None:
    line = one_line_failure(alkstore(*argv, "--url", "sqlite:///typo.db", cwd=tmp_path), 2)
    assert "does not exist" in line and "typo.db" in line, line
    assert not (tmp_path / "typo.db").exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["migrate", "status"])
def test_a_question_mark_in_a_sqlite_path_is_refused_not_cut(tmp_path: Path, command: str) -> None:
    """``sqlite:///what?dir/app.db``: the '?' starts the URL's options, so the path would be
    'what' (migrate created and installed that file)."""
    (tmp_path / "what?dir").mkdir()
    line = one_line_failure(alkstore(command, "--url", "sqlite:///what?dir/app.db", cwd=tmp_path), 2)
    assert "'dir/app.db'" in line and "%3F" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["what?dir"]
    assert list((tmp_path / "what?dir").iterdir()) == []


def test_a_question_mark_in_a_sqlite_path_works_in_a_file_uri(tmp_path: Path) -> None:
    (tmp_path / "what?dir").mkdir()
    url = "sqlite:///file:what%3Fdir/app.db?mode=rwc&uri=true"
    res = alkstore("migrate", "--url", url, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "what?dir" / "app.db").exists()
    res = alkstore("status", "--url", url, cwd=tmp_path)
    assert res.returncode == 0 and "(no jobs)" in res.stdout, res.stderr


def test_migrate_creates_a_missing_sqlite_file(tmp_path: Path) -> None:
    res = alkstore("migrate", "--url", "sqlite:///new.db", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "new.db").exists()
    res = alkstore("status", "--url", "sqlite:///new.db", cwd=tmp_path)
    assert res.returncode == 0 and "(no jobs)" in res.stdout, res.stderr


def test_migrate_into_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    """migrate creates the file, not its directory: a mistyped directory is the --url's fault,
    exit 2 naming it (was exit 1, "unable to open database file (check --url and that the
    server is running)")."""
    line = one_line_failure(alkstore("migrate", "--url", "sqlite:///nodir/app.db", cwd=tmp_path), 2)
    assert "'nodir'" in line and "does not exist" in line and "server" not in line, line
    assert list(tmp_path.iterdir()) == []


# -- the worker says why it stops -----------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_worker_logs_the_signal_that_stops_it(sqlite_db: Target, tmp_path: Path, sig: signal.Signals) -> None:
    store = sqlite_db.store()
    q = store.queue("signalled")
    job_id = q.enqueue({"n": 1})
    proc = subprocess.Popen(
        [str(ALKSTORE), "worker", "builtins:repr", "--queue", "signalled", "--poll-interval", "3600", "--url", sqlite_db.url],
        cwd=tmp_path, env=env(PYTHONUNBUFFERED="1"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: q.get_job(job_id) is None or proc.poll() is not None, "the worker to ack its job", STARTUP)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        store.close()
    assert proc.returncode == 0, err
    assert f"received {sig.name}; stopping" in err, err
    assert "Traceback" not in err



@pytest.mark.parametrize(("command", "database"), [("status", "a-directory"), ("migrate", "a-directory"),
                                                   ("migrate", "read-only-uri-of-a-missing-file")])
def test_a_sqlite_file_that_cannot_be_opened_is_not_blamed_on_a_server(tmp_path: Path, command: str,
                                                                      database: str) -> None:
    """SQLite has no server: "unable to open database file" said "check --url and that the
    server is running". It says what SQLite needs instead, naming the file."""
    (tmp_path / "a-directory").mkdir()
    url = (f"sqlite:///{tmp_path / 'a-directory'}" if database == "a-directory"
           else f"sqlite:///file:{tmp_path / 'missing.db'}?mode=ro&uri=true")
    line = one_line_failure(alkstore(command, "--url", url, cwd=tmp_path), 1)
    assert "unable to open database file" in line and "server" not in line, line
    assert "--url" in line and "SQLite" in line, line
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.parametrize("metrics", [False, True], ids=["plain", "metrics-port"])
def test_a_worker_whose_stdout_is_closed_still_exits_with_its_own_code(
    sqlite_db: Target, tmp_path: Path, metrics: bool
) -> None:
    """A worker's stdout lines (the metrics address, the final 'N job(s) done') are notices,
    not the command's output: a reader gone (``| head -1``, a supervisor's log pipe closed)
    leaves the worker's work and exit code as they were — was exit 141 after a run that
    ended well (and, with ``--metrics-port``, before the worker claimed anything)."""
    sqlite_db.store().close()
    store = alk.Store(sqlite_db.url)
    store.queue("q").enqueue({"n": 1})
    argv = ["worker", "builtins:repr", "--queue", "q", "--burst", "--url", sqlite_db.url]
    if metrics:
        pytest.importorskip("prometheus_client")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            argv += ["--metrics-port", str(s.getsockname()[1])]
    proc = subprocess.Popen(
        [str(ALKSTORE), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, env=env(), cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the worker writes its first line
    err = proc.stderr.read().decode()
    try:
        assert proc.wait(timeout=STARTUP) == 0, err
        assert "Traceback" not in err, err
        assert store.queue("q").stats().ready == 0  # the job ran
    finally:
        store.close()


@pytest.mark.parametrize("digits", ["\u0663", "\uff13", "\u0969", "1\u0660"], ids=["arabic-indic", "fullwidth", "devanagari", "mixed"])
def test_every_numeric_option_refuses_digits_of_another_script(digits: str, capsys: pytest.CaptureFixture[str]) -> None:
    """int() and float() read any Unicode decimal digit ('٣' is 3): a number on the command
    line is ASCII digits, and anything else is the usual usage error, exit 2."""
    numeric = [(path, a) for path, a in _options(build_parser()) if a.type in (int, float)]
    assert numeric  # --limit, --before, -c, --grace, --metrics-port, --port, --lease, ...
    for path, action in numeric:
        positionals = {"worker": ["builtins:repr"], "alembic-revision": []}.get(path[0], [])
        argv = [*path, *positionals, action.option_strings[-1], digits]
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2, argv
        assert action.option_strings[-1] in capsys.readouterr().err, argv
    for argv in (["dead", "show", digits], ["dead", "requeue", "--queue", "q", digits]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(argv)
        assert exc.value.code == 2, argv
