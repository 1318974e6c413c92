"""The example's worker: one alkstore Worker serving the app's ``Tasks`` registry (the async
``send_email`` task on the "emails" queue; async tasks run on the worker's event loop).

    python fastapi_worker.py            # run until Ctrl-C
    python fastapi_worker.py --drain    # exit once the queue is empty

The same registry runs under the CLI, with graceful SIGTERM handling:
    alkstore worker fastapi_shop:tasks --url "$ALKSTORE_DATABASE_URL"
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fastapi_shop import database_url, tasks

import alkstore_sa as alk


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: $ALKSTORE_DATABASE_URL or the example's SQLite file)")
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    args = parser.parse_args(argv)
    store = alk.Store(args.url or database_url())  # the worker needs no async engine
    try:
        store.check_schema()  # fails fast, naming the command, on a missing or older schema
        worker = alk.Worker(store, tasks, concurrency=8)
        worker.run(alk.StopToken(), burst=args.drain)  # Ctrl-C stops it (KeyboardInterrupt)
        done = worker.processed
    except alk.NotInstalled as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        store.close()
    print(f"worker: {done} job(s) done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
