"""``alkstore worker MODULE:HANDLER --queue Q``: run a worker until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from ..worker import Worker
from ._common import add_database_options, open_store, stop_on_signals


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("worker", help="run jobs of a queue with a handler function")
    p.add_argument("handler", metavar="MODULE:HANDLER", help="e.g. myapp.jobs:send_email")
    p.add_argument("--queue", "-q", required=True, help="the queue to consume")
    p.add_argument("-c", "--concurrency", type=int, default=4, help="handler threads (default 4)")
    p.add_argument("--worker-id", default=None, help="claimant label (default host:pid:random)")
    p.add_argument("--batch-size", type=int, default=None, help="jobs per claim (default: concurrency)")
    p.add_argument("--poll-interval", type=float, default=5.0, help="re-poll safety net, seconds")
    p.add_argument("--grace", type=float, default=30.0, help="seconds in-flight jobs get at shutdown")
    p.add_argument("--burst", action="store_true", help="exit once the queue has nothing claimable")
    add_database_options(p)
    p.set_defaults(func=run)


def load_handler(spec: str) -> Callable[..., Any]:
    """Import ``module.path:attr.path`` (the current directory is importable, as with
    ``python -m``)."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise SystemExit(f"alkstore: handler must look like MODULE:HANDLER, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise SystemExit(f"alkstore: {spec} is not callable")
    return obj  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    handler = load_handler(args.handler)
    store = open_store(args)
    stop = stop_on_signals()
    try:
        worker = Worker(
            store, args.queue, handler, concurrency=args.concurrency, worker_id=args.worker_id,
            batch_size=args.batch_size, poll_interval=args.poll_interval, shutdown_grace=args.grace,
        )
        worker.run(stop, burst=args.burst)
        print(f"worker: {worker.processed} job(s) done", flush=True)
    finally:
        store.close()
    return 0
