"""``alkstore worker MODULE:OBJ``: run a worker until SIGTERM/SIGINT.

``OBJ`` is a ``Tasks`` registry (serves every queue that has a task; ``--queue`` narrows) or
a handler function (``--queue`` required; repeatable: the same handler for each queue)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import InvalidOptions
from ..tasks import Task, Tasks
from ..worker import Worker
from ..worker.outcomes import text_of
from ._common import (
    add_database_options,
    exit_past_abandoned_jobs,
    keep_stop_handlers,
    open_store,
    stop_handlers,
    stop_on_signals,
    worker_options,
)
from ._errors import TRACEBACK_HINT, UsageError, notice
from ._worker_options import add_worker_options, metrics_module, serve_metrics

log = logging.getLogger("alkstore_sa.cli")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("worker", help="run the jobs of a Tasks registry, or of queues with a handler")
    p.add_argument(
        "handler", metavar="MODULE:OBJ",
        help="a Tasks registry (e.g. myapp.jobs:tasks) or a handler function (e.g. myapp.jobs:send_email)",
    )
    add_worker_options(p)
    add_database_options(p)
    p.set_defaults(func=run)


def load_handler(spec: str) -> Callable[..., Any] | Tasks:
    """Import ``module.path:attr.path`` (the current directory is importable, as with
    ``python -m``). Every way it can fail is a UsageError naming the part to fix."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError(f"handler must look like MODULE:HANDLER (e.g. myapp.jobs:send_email), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = _import(module_name, spec)
    where = module_name
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"handler {spec!r}: {where!r} has no attribute {part!r}; check the spelling") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the application's code (a lazy module attribute, a property) raised
            raise UsageError(
                f"handler {spec!r}: reading {part!r} of {where!r} failed: {type(exc).__name__}: {text_of(exc)} "
                f"({TRACEBACK_HINT})"
            ) from exc
        where = f"{where}:{part}" if where == module_name else f"{where}.{part}"
    if not callable(obj) and not isinstance(obj, Tasks):
        raise UsageError(
            f"handler {spec!r} is neither a Tasks registry nor callable (it is a {type(obj).__name__})"
        )
    return obj  # type: ignore[no-any-return]


def _as_path(module_name: str, spec: str, attr_path: str) -> UsageError:
    """MODULE given as a file path (``app/jobs.py``, ``./jobs``): said so, with the dotted
    name it probably means."""
    dotted = module_name.replace("\\", "/").removesuffix(".py")
    while dotted.startswith("./"):
        dotted = dotted[2:]
    dotted = dotted.strip("/.").replace("/", ".")
    return UsageError(
        f"handler {spec!r}: MODULE is a module's dotted name, as for python -m, not a file path: "
        f"try '{dotted}:{attr_path}' (run from the directory that contains it)"
    )


def _import(module_name: str, spec: str) -> Any:
    attr_path = spec.partition(":")[2]
    if "/" in module_name or "\\" in module_name or module_name.startswith("."):
        raise _as_path(module_name, spec, attr_path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if module_name.endswith(".py") and exc.name in (module_name, module_name.removesuffix(".py")):
            raise _as_path(module_name, spec, attr_path) from exc
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(
                f"handler {spec!r}: no module named {exc.name!r}; check the spelling, and run from "
                f"the directory that contains it or add that directory to PYTHONPATH"
            ) from exc
        # the handler's module exists but one of its own imports is missing
        raise UsageError(f"handler {spec!r}: importing {module_name!r} failed: {text_of(exc)}") from exc
    except SystemExit as exc:  # a script's main code, run at import: it would end the worker unstarted
        raise UsageError(
            f"handler {spec!r}: importing {module_name!r} called sys.exit({exc.code!r}); is it a "
            "script? Run its main code under `if __name__ == '__main__':`"
        ) from exc
    except KeyboardInterrupt:  # Ctrl-C under a SIGINT handler of the application's own
        raise
    except BaseException as exc:  # noqa: BLE001 - the module's own code raised while being imported
        # (also a BaseException that is no Exception: asyncio's CancelledError, a framework's own)
        raise UsageError(
            f"handler {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {text_of(exc)} "
            f"({TRACEBACK_HINT})"
        ) from exc


def run(args: argparse.Namespace) -> int:
    try:
        options = worker_options(
            concurrency=args.concurrency, worker_id=args.worker_id, batch_size=args.batch_size,
            poll_interval=args.poll_interval, grace=args.grace,
        )
    except InvalidOptions as exc:
        raise UsageError(f"{exc}; see alkstore worker --help") from None
    # Installed before the application is imported and the database opened, which can take a
    # while: a SIGTERM from a process manager meanwhile is a graceful stop (exit 0, nothing
    # claimed), not the signal's default of ending the process. The worker itself then logs
    # what it is finishing; a stop blocked past the grace period (an import or a connection
    # that hangs) ends the process.
    stop = stop_on_signals(exit_after=options["shutdown_grace"])
    ours = stop_handlers()
    target = load_handler(args.handler)
    keep_stop_handlers(ours)  # the stop stays the worker's, as when its handlers came after the import
    queues: list[str] | None = args.queue
    if isinstance(target, Task):  # with or without --queue: a task is called with its args, not the Job
        raise UsageError(
            f"{args.handler!r} is a task ({target.name!r}), not a handler: serve the Tasks registry "
            f"it belongs to, alkstore worker MODULE:REGISTRY (optionally --queue {target.queue})"
        )
    if not isinstance(target, Tasks) and not queues:
        raise UsageError(
            f"--queue is required with a handler ({args.handler!r} is a function, not a Tasks registry); "
            "see alkstore worker --help"
        )
    metrics = metrics_module(args.metrics_port)
    store = open_store(args)
    try:
        try:
            if isinstance(target, Tasks):
                worker = Worker(store, target, queues=queues, **options)
            else:
                assert queues  # checked above: a handler needs --queue
                worker = Worker(store, queues, target, **options)
        except InvalidOptions as exc:  # e.g. a --queue with no task in the registry
            raise UsageError(str(exc)) from exc
        if stop.signalled:  # while starting (set in the handler itself: no race with its thread)
            stop.wait()  # the signal's own log line is out once the stop has landed
            log.info("worker: stopped before it started; no job was claimed")
            return 0
        if metrics is not None:
            serve_metrics(metrics, store, args.metrics_port)
        worker.run(stop, burst=args.burst)
        notice(f"worker: {worker.processed} job(s) done")
    finally:
        store.close()
    exit_past_abandoned_jobs(worker._abandoned)  # their threads die with the process
    return 0
