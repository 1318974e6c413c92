"""``flask --app APP alkstore worker`` (alkstore_sa.flask), as a real subprocess on both
engines: Flask's CLI builds the app with its factory, the worker serves the registry that
``init_app`` was given, each task (sync and async) runs inside the app's application context
(``current_app`` and Flask-SQLAlchemy's ``db.session`` work), and SIGTERM stops it with exit 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from tests.acceptance.test_cli_errors import ALKSTORE, STARTUP, env
from tests.acceptance.test_cli_shown import EVIL, SHOWN, assert_inert
from tests.support import Target, wait_for

pytest.importorskip("flask_sqlalchemy")

APP = '''
import os

import sqlalchemy as sa
from flask import Flask, current_app
from flask_sqlalchemy import SQLAlchemy

import alkstore_sa as alk
from alkstore_sa.flask import init_app

db = SQLAlchemy()
tasks = alk.Tasks()
DONE = os.environ["DONE_TABLE"]


@tasks.task(queue=os.environ["SYNC_QUEUE"], name="flaskapp.record")
def record(n):
    # db.session needs the application context the worker pushes for each task
    db.session.execute(sa.text(f"INSERT INTO {DONE} (n, app) VALUES (:n, :app)"), {"n": n, "app": current_app.name})
    db.session.commit()


@tasks.task(queue=os.environ["ASYNC_QUEUE"], name="flaskapp.arecord")
async def arecord(n):
    db.session.execute(sa.text(f"INSERT INTO {DONE} (n, app) VALUES (:n, :app)"), {"n": n, "app": current_app.name})
    db.session.commit()


@tasks.task(queue=os.environ.get("EVIL_QUEUE", "evil"), name="flaskapp.explode")
def explode(message):
    raise RuntimeError(message)


def create_app():
    app = Flask("flaskapp")
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ["APP_DATABASE_URL"]
    db.init_app(app)
    with app.app_context():
        store = alk.Store(db.engine, schema=os.environ["APP_SCHEMA"])
    init_app(app, tasks, store)
    return app
'''


def _start(tmp_path: Path, argv: tuple[str, ...], **app_env: str) -> subprocess.Popen[str]:
    """``flask --app flaskapp alkstore worker ARGV`` in ``tmp_path``, configured by ``app_env``."""
    return subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "flaskapp", "alkstore", "worker", *argv],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env(PYTHONUNBUFFERED="1", **app_env),
    )


def _flask(db: Target, tmp_path: Path, qname: str, *argv: str) -> subprocess.Popen[str]:
    return _start(
        tmp_path, argv, APP_DATABASE_URL=db.url, APP_SCHEMA=db.schema, DONE_TABLE=_done(db, qname),
        SYNC_QUEUE=f"{qname}-sync", ASYNC_QUEUE=f"{qname}-async",
    )


def _burst_on(tmp_path: Path, url: str) -> tuple[int, str, str]:
    """The app's worker run once (``--burst``) on ``url``, where it cannot work: (exit code,
    stdout, stderr)."""
    (tmp_path / "flaskapp.py").write_text(APP)
    proc = _start(
        tmp_path, ("--burst",), APP_DATABASE_URL=url, APP_SCHEMA="alkstore", DONE_TABLE="done",
        SYNC_QUEUE="q-sync", ASYNC_QUEUE="q-async",
    )
    out, err = proc.communicate(timeout=STARTUP)
    return proc.returncode, out, err


def _done(db: Target, qname: str) -> str:
    name = "done_" + qname.replace("-", "_")
    return name if db.kind == "sqlite" else f'"{db.schema}".{name}'


def _rows(db: Target, qname: str) -> list[tuple[int, str]]:
    with db.engine.connect() as c:
        return [(r[0], r[1]) for r in c.execute(sa.text(f"SELECT n, app FROM {_done(db, qname)} ORDER BY n"))]


def test_flask_alkstore_worker_runs_tasks_in_the_app_context(db: Target, tmp_path: Path, qname: str) -> None:
    (tmp_path / "flaskapp.py").write_text(APP)
    db.execute(f"CREATE TABLE {_done(db, qname)} (n INTEGER PRIMARY KEY, app TEXT NOT NULL)")
    store = db.store()
    sync_id = store.queue(f"{qname}-sync").enqueue({"task": "flaskapp.record", "args": [1], "kwargs": {}})
    async_id = store.queue(f"{qname}-async").enqueue({"task": "flaskapp.arecord", "args": [2], "kwargs": {}})
    proc = _flask(db, tmp_path, qname, "--poll-interval", "3600")
    try:
        wait_for(lambda: len(_rows(db, qname)) == 2 or proc.poll() is not None, "both tasks to run", STARTUP)
        assert proc.poll() is None, proc.communicate()
        wait_for(lambda: store.get_job(sync_id) is None and store.get_job(async_id) is None, "both acks")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=STARTUP)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        store.close()
    assert proc.returncode == 0, (out, err)
    assert _rows(db, qname) == [(1, "flaskapp"), (2, "flaskapp")]
    assert "worker: 2 job(s) done" in out
    assert "received SIGTERM; stopping" in err


def test_flask_alkstore_worker_refuses_a_queue_with_no_task(db: Target, tmp_path: Path, qname: str) -> None:
    (tmp_path / "flaskapp.py").write_text(APP)
    proc = _flask(db, tmp_path, qname, "--queue", "nope")
    out, err = proc.communicate(timeout=STARTUP)
    assert proc.returncode == 2, (out, err)
    assert "queue 'nope' has no task in this registry" in err


def test_init_app_checks_its_arguments(dbstore: alk.Store) -> None:
    flask = pytest.importorskip("flask")
    from alkstore_sa.flask import EXTENSION, init_app

    app = flask.Flask("checks")
    with pytest.raises(alk.InvalidOptions, match="Tasks registry"):
        init_app(app, "tasks", dbstore)  # type: ignore[arg-type]
    with pytest.raises(alk.InvalidOptions, match="pass the app's Store"):
        init_app(app, alk.Tasks())
    app.extensions[EXTENSION] = dbstore
    init_app(app, alk.Tasks())  # the store already there
    assert "alkstore" in app.cli.commands


def test_app_context_tasks_and_init_app_refuse_what_is_no_flask_app_or_registry(dbstore: alk.Store, qname: str) -> None:
    """``app_context_tasks(app, tasks)`` took anything as the app, and every task of the
    registry it returned then failed in the worker on each attempt ('NoneType' object has no
    attribute 'app_context') until the job was dead; a list of tasks instead of a registry,
    or ``init_app`` given no Flask app, raised AttributeError, which is no AlkstoreError.
    Each is refused with InvalidOptions at the call, and nothing is changed."""
    flask = pytest.importorskip("flask")
    from alkstore_sa.flask import EXTENSION, app_context_tasks, init_app

    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def job(n: int) -> None: ...

    app = flask.Flask("checks")
    for not_an_app in (None, object(), "app", flask.Blueprint("bp", __name__)):
        with pytest.raises(alk.InvalidOptions, match="a Flask app"):
            app_context_tasks(not_an_app, tasks)  # type: ignore[arg-type]
        with pytest.raises(alk.InvalidOptions, match="a Flask app"):
            init_app(not_an_app, tasks, dbstore)  # type: ignore[arg-type]
    for not_a_registry in ([job], "tasks", None):
        with pytest.raises(alk.InvalidOptions, match="Tasks registry"):
            app_context_tasks(app, not_a_registry)  # type: ignore[arg-type]
    assert EXTENSION not in app.extensions
    assert [t.name for t in app_context_tasks(app, tasks)] == [job.name]


def test_flask_alkstore_worker_on_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """As ``alkstore worker``: the error is one line saying what to check, exit 1, no
    traceback (the command used to print the driver's whole traceback)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = _burst_on(tmp_path, f"postgresql+psycopg://postgres@127.0.0.1:{port}/test")
    assert code == 1, (out, err)
    assert "Traceback" not in err, err
    assert "cannot connect to the database" in err and "Connection refused" in err, err


def test_flask_alkstore_worker_without_the_tables_names_the_migration(tmp_path: Path) -> None:
    code, out, err = _burst_on(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}")
    assert code == 2, (out, err)
    assert "Traceback" not in err, err
    assert "alkstore migrate" in err, err


def test_flask_alkstore_worker_without_the_tables_says_only_that(tmp_path: Path) -> None:
    """As ``alkstore worker``: the one error line is all of stderr (the command logged at
    INFO from every library, so Alembic's plugin set-up came first, seven lines of it)."""
    code, out, err = _burst_on(tmp_path, f"sqlite:///{tmp_path / 'empty.db'}")
    assert code == 2, (out, err)
    assert [line for line in err.splitlines() if line.strip()] == [
        line for line in err.splitlines() if "alkstore migrate" in line
    ], err


def test_flask_alkstore_worker_without_the_tables_names_the_apps_database(tmp_path: Path) -> None:
    """Flask-SQLAlchemy opens a relative ``sqlite:///app.db`` in the app's instance folder, so
    ``alkstore migrate --url sqlite:///app.db`` installs another file: the command (which has
    no --url) says which database the app uses (it said only "run `alkstore migrate --url URL`")."""
    assert subprocess.run([str(ALKSTORE), "migrate", "--url", "sqlite:///app.db"], cwd=tmp_path,
                          env=env(), capture_output=True, timeout=STARTUP).returncode == 0
    code, out, err = _burst_on(tmp_path, "sqlite:///app.db")
    assert code == 2, (out, err)
    assert f"sqlite:///{tmp_path / 'instance' / 'app.db'}" in err, err


@pytest.mark.parametrize(
    "argv",
    [["-c", "2", "--concurrency", "3"], ["--worker-id", "a", "--worker-id", "b"], ["--batch-size", "1", "--batch-size", "2"],
     ["--poll-interval", "1", "--poll-interval", "2"], ["--grace", "1", "--grace", "2"]],
    ids=lambda argv: argv[-2],
)
def test_flask_alkstore_worker_refuses_a_repeated_single_valued_option(
    sqlite_db: Target, tmp_path: Path, qname: str, argv: list[str]
) -> None:
    """As ``alkstore worker``: a repeat is a usage error, not "the last one wins"."""
    (tmp_path / "flaskapp.py").write_text(APP)
    proc = _flask(sqlite_db, tmp_path, qname, "--burst", *argv)
    out, err = proc.communicate(timeout=STARTUP)
    assert proc.returncode == 2, (out, err)
    assert "given more than once" in err and argv[-2] in err, err
    assert "worker:" not in out  # nothing ran


@pytest.mark.parametrize(
    ("argv", "option"),
    [(["--grace", "-1"], "--grace"), (["--poll-interval", "0"], "--poll-interval"), (["-c", "0"], "--concurrency"),
     (["--batch-size", "0"], "--batch-size"), (["--worker-id", ""], "--worker-id")],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_flask_alkstore_worker_names_the_option_out_of_range(
    sqlite_db: Target, tmp_path: Path, qname: str, argv: list[str], option: str
) -> None:
    """As ``alkstore worker``: a value out of range is a usage error naming the option typed
    (it said "shutdown_grace must be >= 0, got -1.0" for --grace -1)."""
    (tmp_path / "flaskapp.py").write_text(APP)
    proc = _flask(sqlite_db, tmp_path, qname, "--burst", *argv)
    out, err = proc.communicate(timeout=STARTUP)
    assert proc.returncode == 2, (out, err)
    assert f"Error: {option} must" in err, err
    assert "worker:" not in out  # nothing ran


def test_flask_alkstore_workers_log_is_inert(sqlite_db: Target, tmp_path: Path, qname: str) -> None:
    """As ``alkstore worker``'s: a failing task's message reaches stderr escaped (a handler's
    exception text is not the terminal's to obey)."""
    (tmp_path / "flaskapp.py").write_text(APP)
    store = sqlite_db.store()
    store.queue(f"{qname}-evil").enqueue({"task": "flaskapp.explode", "args": [EVIL], "kwargs": {}})
    store.close()
    proc = _start(
        tmp_path, ("--burst",), APP_DATABASE_URL=sqlite_db.url, APP_SCHEMA=sqlite_db.schema,
        DONE_TABLE="done", SYNC_QUEUE=f"{qname}-sync", ASYNC_QUEUE=f"{qname}-async", EVIL_QUEUE=f"{qname}-evil",
    )
    out, err = proc.communicate(timeout=STARTUP)
    assert proc.returncode == 0, (out, err)
    assert_inert(out + err)
    assert f": {SHOWN}\n" in err, err


def test_flask_alkstore_worker_whose_stdout_is_closed_exits_with_its_own_code(
    sqlite_db: Target, tmp_path: Path, qname: str
) -> None:
    """As ``alkstore worker``: the final 'N job(s) done' into a stdout whose reader is gone
    (``| head -1``, a supervisor's log pipe closed) is dropped, and a run that ended well
    exits 0 — was exit 1 (click's own answer to EPIPE)."""
    (tmp_path / "flaskapp.py").write_text(APP)
    sqlite_db.store().close()
    proc = _flask(sqlite_db, tmp_path, qname, "--burst")
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the worker writes its line
    err = proc.stderr.read()
    assert proc.wait(timeout=STARTUP) == 0, err
    assert "Traceback" not in err, err


def test_flask_alkstore_worker_serves_metrics_as_alkstore_worker_does(
    sqlite_db: Target, tmp_path: Path, qname: str
) -> None:
    """``--metrics-port`` (it had none): the address line, then the run; a bad port or a
    number in another script's digits is a usage error, exit 2, before anything runs."""
    pytest.importorskip("prometheus_client")
    (tmp_path / "flaskapp.py").write_text(APP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _flask(sqlite_db, tmp_path, qname, "--burst", "--metrics-port", str(port))
    out, err = proc.communicate(timeout=STARTUP)
    assert proc.returncode == 0, (out, err)
    assert f"worker: metrics at http://127.0.0.1:{port}/metrics\n" in out, out
    for argv in (["--metrics-port", "0"], ["-c", "\u0663"], ["--grace", "\u0663"]):
        proc = _flask(sqlite_db, tmp_path, qname, "--burst", *argv)
        out, err = proc.communicate(timeout=STARTUP)
        assert proc.returncode == 2, (argv, out, err)
        assert argv[0] in err and "worker:" not in out, (argv, err)
