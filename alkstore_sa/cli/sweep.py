"""``alkstore sweep [--queue Q]``: move expired jobs to dead and purge old dead jobs."""

from __future__ import annotations

import argparse

from ..outbox import listed_queue
from ._common import add_database_options, open_store
from ._shown import shown


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("sweep", help="expire and purge (every queue unless --queue)")
    p.add_argument("--queue", "-q", action="append", help="queue to sweep (repeatable)")
    add_database_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        names = list(dict.fromkeys(args.queue)) if args.queue else list(store.queue_stats())  # each once
        for name in names:
            result = listed_queue(store, name).sweep_expired()
            print(f"{shown(name)}: expired={result.expired} purged={result.purged}")
    finally:
        store.close()
    return 0
