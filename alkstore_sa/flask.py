"""Flask integration (optional: ``pip install 'alkstore-sa[flask]'``): a ``flask alkstore
worker`` command for an app, whose tasks each run inside the app's application context.

    from alkstore_sa.flask import init_app

    def create_app() -> Flask:
        app = Flask(__name__)
        db.init_app(app)
        with app.app_context():
            store = alk.Store(db.engine)
        init_app(app, tasks, store)
        return app

    $ flask --app myapp alkstore worker            # every queue that has a task
    $ flask --app myapp alkstore worker -q emails  # only 'emails'

Flask's own CLI loads the app (``--app``, an app factory included), so the worker uses the
app's configuration and its engine. Each task run pushes a fresh application context of
that app, so Flask-SQLAlchemy's ``db.session`` works in tasks and is removed (closed,
rolled back if uncommitted) when the task ends. SIGTERM or SIGINT stops the worker
gracefully and the command exits 0.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from . import _validate
from .errors import AlkstoreError, InvalidOptions, MissingExtra, NotInstalled

try:
    import click
    from flask import Flask, current_app
    from flask.cli import AppGroup
except ImportError as exc:
    raise MissingExtra("alkstore_sa.flask needs Flask: pip install 'alkstore-sa[flask]'") from exc

from ._urls import shown_url
from .cli._common import exit_past_abandoned_jobs, stop_on_signals, worker_options
from .cli._errors import UsageError, explain, notice
from .cli._shown import shown, stderr_handler
from .cli._worker_options import WORKER_OPTIONS, metrics_module, serve_metrics
from .store import Store
from .tasks import Task, Tasks
from .worker import Worker

EXTENSION = "alkstore"  # app.extensions[EXTENSION]: the app's Store

__all__ = ["EXTENSION", "init_app", "app_context_tasks"]


@dataclass(frozen=True)
class _State:
    tasks: Tasks


def _check_app(app: object, call: str) -> None:
    """A Flask app, or InvalidOptions at the call: anything else as ``app`` would fail only
    later — in the worker, on every attempt of every job (it has no ``app_context``)."""
    if not isinstance(app, Flask):
        raise InvalidOptions(f"{call}: app must be a Flask app, got {type(app).__name__}")


def init_app(app: Flask, tasks: Tasks, store: Store | None = None) -> None:
    """Make ``store`` the app's store (``app.extensions["alkstore"]``; None: the one already
    there) and add the ``flask alkstore worker`` command serving ``tasks``."""
    _check_app(app, "init_app(app, tasks, store)")
    if not isinstance(tasks, Tasks):
        raise InvalidOptions(f"init_app(app, tasks, store): tasks must be an alk.Tasks registry, got {type(tasks).__name__}")
    if store is None:
        store = app.extensions.get(EXTENSION)
        if not isinstance(store, Store):
            raise InvalidOptions(
                'init_app(app, tasks, store): pass the app\'s Store (or set app.extensions["alkstore"] first)'
            )
    elif not isinstance(store, Store):
        raise InvalidOptions(f"init_app(app, tasks, store): store must be an alk.Store, got {type(store).__name__}")
    app.extensions[EXTENSION] = store
    app.extensions[f"{EXTENSION}.tasks"] = _State(tasks)
    if "alkstore" not in app.cli.commands:
        app.cli.add_command(_group())


def app_context_tasks(app: Flask, tasks: Tasks) -> Tasks:
    """A registry with the same tasks (names, queues, options), each run inside a fresh
    application context of ``app``: what ``flask alkstore worker`` serves. Use it to run
    ``alk.Worker(store, app_context_tasks(app, tasks))`` yourself. InvalidOptions for an
    ``app`` that is no Flask app, or ``tasks`` that is no ``alk.Tasks`` registry."""
    _check_app(app, "app_context_tasks(app, tasks)")
    if not isinstance(tasks, Tasks):
        raise InvalidOptions(f"app_context_tasks(app, tasks): tasks must be an alk.Tasks registry, got {type(tasks).__name__}")
    wrapped = Tasks()
    for task in tasks:
        wrapped._add(Task(_with_context(app, task), name=task.name, queue=task.queue, opts=task.opts,
                          priority=task.priority))
    return wrapped


def _with_context(app: Flask, task: Task[..., Any]) -> Callable[..., Any]:
    func = task.func
    if task.is_async:
        @functools.wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with app.app_context():  # Flask keeps it in a context variable: this asyncio task's own
                return await func(*args, **kwargs)

        return run_async

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        with app.app_context():
            return func(*args, **kwargs)

    return run


class _Failed(click.ClickException):
    """A failed run, as ``alkstore worker`` reports it: one line, exit 1 (the database is
    unreachable or refused)."""

    exit_code = 1


class _CannotRun(_Failed):
    """Exit 2, as ``alkstore worker`` does when the tables are missing or outdated."""

    exit_code = 2


class _Once(click.Option):
    """An option that takes one value and refuses a second, as ``alkstore worker``'s do
    (click would keep the last one): parsed as repeatable, then checked."""

    def __init__(self, *args: Any, default: Any = None, **kw: Any) -> None:
        kw["multiple"] = True
        super().__init__(*args, **kw)
        self.single_default = default

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        values = super().process_value(ctx, value)
        if len(values) > 1:
            raise click.UsageError(f"option {self.opts[-1]}: given more than once; it takes a single value", ctx)
        return values[0] if values else self.single_default


class _Number(click.ParamType):
    """An int or float option's value, read in ASCII digits only, as ``alkstore worker``
    reads it (``int()`` alone, and so click's INT, takes '\u0663' for 3)."""

    def __init__(self, name: str, read: Callable[[str], Any]) -> None:
        self.name = name
        self.read = read

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # a default
            return value
        try:
            return self.read(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a valid {self.name}", param, ctx)


_TYPES: dict[str, Any] = {
    "int": _Number("integer", _validate.int_text), "float": _Number("number", _validate.float_text), "str": None,
}


def _with_worker_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``alkstore worker``'s options (cli._worker_options.WORKER_OPTIONS) as click options."""
    for o in reversed(WORKER_OPTIONS):
        if o.kind == "flag":
            option = click.option(*o.flags, o.dest, is_flag=True, help=o.help)
        elif o.kind == "queues":
            option = click.option(*o.flags, o.dest, multiple=True, help=o.help)
        else:
            option = click.option(*o.flags, o.dest, cls=_Once, type=_TYPES[o.kind], default=o.default,
                                  metavar=o.metavar, help=o.help)
        command = option(command)
    return command


def _group() -> AppGroup:
    group = AppGroup("alkstore", help="alkstore_sa: run the app's tasks.")

    @group.command("worker")
    @_with_worker_options
    def worker(queue: tuple[str, ...], concurrency: int | None, worker_id: str | None, batch_size: int | None,
               poll_interval: float, grace: float, burst: bool, metrics_port: int | None) -> None:
        """Run the app's tasks until SIGTERM/SIGINT (then finish in-flight jobs, exit 0)."""
        try:  # checked under the options' own names (Worker() would say 'shutdown_grace' for --grace)
            options = worker_options(concurrency=concurrency, worker_id=worker_id, batch_size=batch_size,
                                     poll_interval=poll_interval, grace=grace)
            metrics = metrics_module(metrics_port)
        except (InvalidOptions, UsageError) as exc:
            raise click.UsageError(str(exc)) from None
        _run(current_app._get_current_object(), list(queue) or None, options, burst,  # type: ignore[attr-defined]
             metrics, metrics_port)

    return group


def _run(
    app: Flask, queues: list[str] | None, options: dict[str, Any], burst: bool, metrics: Any, metrics_port: int | None
) -> None:
    log = logging.getLogger("alkstore_sa")
    if not logging.getLogger().handlers and not log.handlers:  # as `alkstore worker` logs (escaped)
        logging.basicConfig(level=logging.INFO, handlers=[stderr_handler()])
        if logging.getLogger("alembic").level == logging.NOTSET:  # its INFO is set-up chatter
            logging.getLogger("alembic").setLevel(logging.WARNING)
    state: _State = app.extensions[f"{EXTENSION}.tasks"]
    store: Store = app.extensions[EXTENSION]
    try:
        worker = Worker(store, app_context_tasks(app, state.tasks), queues=queues, **options)
    except InvalidOptions as exc:  # e.g. a --queue with no task in the registry
        raise click.UsageError(str(exc)) from exc
    stop = stop_on_signals(exit_after=worker.shutdown_grace)
    try:
        if metrics is not None:
            try:
                serve_metrics(metrics, store, metrics_port)  # type: ignore[arg-type]
            except OSError as exc:  # the port is taken: one line, exit 1
                raise _Failed(str(exc)) from exc
        worker.run(stop, burst=burst)
    except (AlkstoreError, sa.exc.DBAPIError) as exc:  # NotInstalled names the command to run
        code, message = explain(exc, None)
        if isinstance(exc, NotInstalled):  # no --url here: say which database the app opened
            message += f" (the app's database: {shown(shown_url(store.engine.url))})"
        raise (_CannotRun if code == 2 else _Failed)(message) from exc
    notice(f"worker: {worker.processed} job(s) done")
    exit_past_abandoned_jobs(worker._abandoned)  # their threads die with the process
