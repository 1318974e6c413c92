"""``alkstore status``: per-queue counts and settings, and the live workers, as tables or
JSON (``--json`` keeps its shape, a dict of queues; ``--workers`` lists the workers alone).
The counts are the dashboard's and the metrics gauges' (``read_gauges``): expired jobs
waiting for the sweep are in none of them."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from .._gauges import read_gauges
from .._json_shown import strict
from ..model import QueueSettings, QueueStats, WorkerInfo
from ._common import add_database_options, open_store
from ._shown import as_written, padded, shown, width
from .queue import describe

COLUMNS = ("queue", "pending", "ready", "processing", "dead", "oldest_ready_age")
WORKER_COLUMNS = ("worker", "hostname", "pid", "queues", "concurrency", "started_at", "last_seen")
NO_JOBS = QueueStats(pending=0, ready=0, processing=0, dead=0, oldest_ready_age=None)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="per-queue pending/ready/processing/dead counts, and settings")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--workers", action="store_true", help="list the live workers only (SPEC §15 registry)")
    add_database_options(p)
    p.set_defaults(func=run)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        if args.workers:
            return _print_workers(store.workers(), as_json=args.json)
        stats = {name: g.as_stats() for name, g in read_gauges(store).items()}
        settings = store.queue_settings()
        workers = [] if args.json else store.workers()
    finally:
        store.close()
    # a paused or limited queue is listed even while it holds no jobs
    names = sorted(set(stats) | set(settings))
    if args.json:
        print(strict(json.dumps(
            {
                name: {**asdict(stats.get(name, NO_JOBS)), "settings": asdict(settings.get(name, QueueSettings()))}
                for name in names
            },
            indent=2,
        )))
        return 0
    columns = COLUMNS + (("settings",) if settings else ())  # the column only when some queue has any
    rows: list[list[str]] = []
    for name in names:
        s = stats.get(name, NO_JOBS)
        row = [name, str(s.pending), str(s.ready), str(s.processing), str(s.dead), _age(s.oldest_ready_age)]
        if settings:
            row.append(describe(settings.get(name, QueueSettings())))
        rows.append(row)
    # names and settings read left to right; numbers line up on the right
    _table(columns, rows, left={0, 6})
    if not rows:
        print("(no jobs)")
    print()
    _print_workers(workers, as_json=False)
    return 0


def _print_workers(workers: list[WorkerInfo], *, as_json: bool) -> int:
    if as_json:
        print(strict(json.dumps(
            [{**asdict(w), "queues": list(w.queues), "started_at": w.started_at.isoformat(),
              "last_seen": w.last_seen.isoformat()} for w in workers],
            indent=2,
        )))
        return 0
    rows = [
        [w.id, w.hostname, str(w.pid), ",".join(w.queues), str(w.concurrency),
         w.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"), w.last_seen.strftime("%Y-%m-%dT%H:%M:%SZ")]
        for w in workers
    ]
    _table(WORKER_COLUMNS, rows, left={0, 1, 3, 5, 6})
    if not rows:
        print("(no workers)")
    return 0


def _table(columns: tuple[str, ...], rows: list[list[str]], *, left: set[int]) -> None:
    """Print the columns' names and the rows, each cell shown escaped and padded to its
    column's width: measured in terminal columns (a CJK character takes two, a combining
    accent none) on the escaped text as stdout writes it (a character its encoding lacks
    as a backslash escape), which is what the terminal shows."""
    rows = [[as_written(shown(v)) for v in row] for row in rows]
    widths = [max(width(c), *(width(r[i]) for r in rows)) if rows else width(c) for i, c in enumerate(columns)]
    print("  ".join(padded(c, w, left=True) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        cells = [padded(v, w, left=i in left) for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        print("  ".join(cells).rstrip())
