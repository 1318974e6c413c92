"""The example's email worker: alkstore's Worker running ``send_email`` on the "emails" queue.

The same handler runs under the CLI, with graceful SIGTERM handling:
    alkstore worker flask_worker:send_email --queue emails --url "$ALKSTORE_DATABASE_URL"

    python flask_worker.py            # run until Ctrl-C
    python flask_worker.py --drain    # exit once the queue is empty
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flask_shop import EMAILS, database_url

import alkstore_sa as alk


def send_email(job: alk.Job) -> None:
    """The handler: returning acks the job; raising retries it with backoff (and
    dead-letters it at max_attempts); ``alk.Fail`` dead-letters it at once."""
    payload = job.payload
    print(f"sent {payload['template']} to {payload['to']} for order {payload['order_id']}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: $ALKSTORE_DATABASE_URL or the example's SQLite file)")
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    args = parser.parse_args(argv)
    store = alk.Store(args.url or database_url())
    try:
        store.check_schema()  # fails fast, naming the command, on a missing or older schema
        worker = alk.Worker(store, EMAILS, send_email, concurrency=2)
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
