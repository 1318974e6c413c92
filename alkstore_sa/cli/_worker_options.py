"""The options of a worker command, defined once for both that run one: ``alkstore worker``
(argparse) and ``flask alkstore worker`` (click, alkstore_sa.flask). The database options
(``--url``, ``--schema``, ``--listen-url``) are not among them: ``alkstore worker`` takes
them as every command does, and ``flask alkstore worker`` serves the app's own Store, which
carries its database, schema and ``listen_url``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ._errors import UsageError, notice


@dataclass(frozen=True)
class WorkerOption:
    """One option: its flags, where its value goes (``dest``), what it takes (``kind``:
    "int", "float", "str", "flag" — given or not — or "queues" — repeatable), its default,
    metavar and help."""

    flags: tuple[str, ...]
    dest: str
    kind: str
    help: str
    default: Any = None
    metavar: str | None = None


WORKER_OPTIONS = (
    WorkerOption(
        ("--queue", "-q"), "queue", "queues",
        "a queue to serve; repeatable (default: every queue that has a task). Required with a "
        "handler; narrows a Tasks registry",
    ),
    WorkerOption(
        ("-c", "--concurrency"), "concurrency", "int",
        "jobs in flight at once (default 8 for a Tasks registry, 4 for a handler)",
    ),
    WorkerOption(("--worker-id",), "worker_id", "str", "claimant label (default host:pid:random)"),
    WorkerOption(("--batch-size",), "batch_size", "int", "jobs per claim (default: concurrency)"),
    WorkerOption(("--poll-interval",), "poll_interval", "float", "re-poll safety net, seconds (default 5)", 5.0),
    WorkerOption(
        ("--grace",), "grace", "float", "seconds in-flight jobs get at shutdown (default 30)", 30.0,
    ),
    WorkerOption(("--burst",), "burst", "flag", "exit once no queue has anything claimable", False),
    WorkerOption(
        ("--metrics-port",), "metrics_port", "int",
        "serve Prometheus metrics at http://127.0.0.1:N/metrics (needs alkstore-sa[metrics])",
        metavar="N",
    ),
)


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """WORKER_OPTIONS as argparse options (``Parser`` makes each single-valued one refuse a
    repeat, and reads numbers in ASCII digits only)."""
    types = {"int": int, "float": float, "str": None}
    for o in WORKER_OPTIONS:
        kw: dict[str, Any] = {"dest": o.dest, "help": o.help}
        if o.kind == "flag":
            kw["action"] = "store_true"
        elif o.kind == "queues":
            kw.update(action="append", default=None)
        else:
            kw.update(default=o.default, metavar=o.metavar)
            if types[o.kind] is not None:
                kw["type"] = types[o.kind]
        parser.add_argument(*o.flags, **kw)


def metrics_module(port: int | None) -> Any:
    """``alkstore_sa.metrics`` when ``--metrics-port`` was given (None otherwise); a
    UsageError for a bad port or a missing extra, before anything starts."""
    if port is None:
        return None
    if not 1 <= port <= 65535:
        raise UsageError(f"--metrics-port must be a TCP port between 1 and 65535, got {port}")
    try:
        import alkstore_sa.metrics as metrics
    except ImportError as exc:
        raise UsageError(
            "--metrics-port needs prometheus_client: pip install 'alkstore-sa[metrics]'"
        ) from exc
    return metrics


def serve_metrics(metrics: Any, store: Any, port: int) -> None:
    """Serve the store's metrics on ``port`` (the one-line OSError of a port that is taken)."""
    try:
        metrics.serve(store, port)
    except OSError as exc:  # e.g. the port is taken: said as the one-line error, exit 1
        raise OSError(f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc}") from exc
    notice(f"worker: metrics at http://127.0.0.1:{port}/metrics")
