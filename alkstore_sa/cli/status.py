"""``alkstore status``: per-queue counts and settings, as a table or JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..model import QueueSettings, QueueStats
from ._common import add_database_options, open_store
from .queue import describe

COLUMNS = ("queue", "pending", "ready", "processing", "dead", "oldest_ready_age")
NO_JOBS = QueueStats(pending=0, ready=0, processing=0, dead=0, oldest_ready_age=None)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="per-queue pending/ready/processing/dead counts, and settings")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_database_options(p)
    p.set_defaults(func=run)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        stats = store.queue_stats()
        settings = store.queue_settings()
    finally:
        store.close()
    # a paused or limited queue is listed even while it holds no jobs
    names = sorted(set(stats) | set(settings))
    if args.json:
        print(json.dumps(
            {
                name: {**asdict(stats.get(name, NO_JOBS)), "settings": asdict(settings.get(name, QueueSettings()))}
                for name in names
            },
            indent=2,
        ))
        return 0
    columns = COLUMNS + (("settings",) if settings else ())  # the column only when some queue has any
    rows: list[list[str]] = []
    for name in names:
        s = stats.get(name, NO_JOBS)
        row = [name, str(s.pending), str(s.ready), str(s.processing), str(s.dead), _age(s.oldest_ready_age)]
        if settings:
            row.append(describe(settings.get(name, QueueSettings())))
        rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        # names and settings read left to right; numbers line up on the right
        cells = [v.ljust(w) if i in (0, 6) else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        print("  ".join(cells).rstrip())
    if not rows:
        print("(no jobs)")
    return 0
