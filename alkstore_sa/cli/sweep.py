"""``alkstore sweep [--queue Q]``: move expired jobs to dead and purge old dead jobs."""

from __future__ import annotations

import argparse

from ..outbox import listed_queue, listed_queue_name, stored_queue
from ._common import add_database_options, open_store
from ._shown import shown


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("sweep", help="expire and purge (every queue unless --queue)")
    p.add_argument("--queue", "-q", action="append", help="queue to sweep (repeatable)")
    add_database_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # every name given is checked before anything is swept: bad input writes nothing
    given = list(dict.fromkeys(listed_queue_name(q) for q in args.queue)) if args.queue else None  # each once
    store = open_store(args)
    try:
        if given is not None:
            queues = [listed_queue(store, name) for name in given]
        else:
            queues = [stored_queue(store, name) for name in store.queue_stats()]
        for q in queues:
            result = q.sweep_expired()
            print(f"{shown(q.name)}: expired={result.expired} purged={result.purged}")
    finally:
        store.close()
    return 0

