"""The example's worker: one alkstore Worker serving the app's ``Tasks`` registry — the
"emails" and "stock" queues — with the Flask app made first, so that tasks using
``db.session`` run in its application context.

    python flask_worker.py            # run until Ctrl-C
    python flask_worker.py --drain    # exit once both queues are empty

The same registry runs under the CLI, with graceful SIGTERM handling (this module's import
gives ``tasks``; the app for the tasks' context is made from $ALKSTORE_DATABASE_URL on first use):
    alkstore worker flask_worker:tasks --url "$ALKSTORE_DATABASE_URL"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flask_shop import create_app, tasks

import alkstore_sa as alk

__all__ = ["main", "tasks"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: $ALKSTORE_DATABASE_URL or the example's SQLite file)")
    parser.add_argument("--drain", action="store_true", help="exit once the queues are empty")
    args = parser.parse_args(argv)
    # The app (and its store) first: it is the app the tasks' application context comes from.
    app = create_app(args.url)
    store: alk.Store = app.extensions["alkstore"]
    try:
        store.check_schema()  # fails fast, naming the command to run, on a missing or older schema
    except alk.NotInstalled as exc:
        print(f"worker: {exc}", file=sys.stderr)
        store.close()
        return 2
    try:
        worker = alk.Worker(store, tasks, concurrency=2)  # both queues, fairly shared
        worker.run(alk.StopToken(), burst=args.drain)  # Ctrl-C stops it (KeyboardInterrupt)
        done = worker.processed
    except KeyboardInterrupt:
        return 0
    finally:
        store.close()
    print(f"worker: {done} job(s) done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
