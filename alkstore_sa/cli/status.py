"""``alkstore status``: per-queue counts, as a table or JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ._common import add_database_options, open_store

COLUMNS = ("queue", "pending", "ready", "processing", "dead", "oldest_ready_age")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="per-queue pending/ready/processing/dead counts")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_database_options(p)
    p.set_defaults(func=run)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        stats = store.queue_stats()
    finally:
        store.close()
    if args.json:
        print(json.dumps({name: asdict(s) for name, s in stats.items()}, indent=2))
        return 0
    rows = [
        (name, str(s.pending), str(s.ready), str(s.processing), str(s.dead), _age(s.oldest_ready_age))
        for name, s in stats.items()
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True))))
    if not rows:
        print("(no jobs)")
    return 0
