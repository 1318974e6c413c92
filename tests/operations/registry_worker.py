"""A worker process for the registry tests: ``python registry_worker.py URL SCHEMA QUEUE
WORKER_ID INTERVAL`` runs a Worker with that id and registry interval until SIGTERM (or a
SIGKILL)."""

from __future__ import annotations

import signal
import sys

import alkstore_sa as alk


def main() -> None:
    url, schema, queue, worker_id, interval = sys.argv[1:6]
    stop = alk.StopToken()
    signal.signal(signal.SIGTERM, lambda *_: stop.stop())
    with alk.Store(url, schema=schema) as store:
        alk.Worker(
            store, queue, lambda job: None, concurrency=2, worker_id=worker_id,
            registry_interval=float(interval), poll_interval=0.2,
        ).run(stop)


if __name__ == "__main__":
    main()
