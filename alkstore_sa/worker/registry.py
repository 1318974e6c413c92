"""The worker's registry row (SPEC §15): written when it starts, refreshed every
``interval`` seconds on a thread of its own, deleted when it stops.

The row says it is live for three intervals past each refresh, so a worker killed without
a chance to delete it drops out of ``store.workers()`` on time; a refresh that fails (the
database is briefly away) is tried again at the next interval, never stopping the worker,
and the outage is logged once as it starts and once as it ends.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from typing import Any

from .._retry import Backoff, Outage
from ..errors import AlkstoreError
from ..store import Store

log = logging.getLogger("alkstore_sa")

LAPSE_INTERVALS = 3  # a row not refreshed for this many intervals is gone


class Registration:
    """One worker's registry row, kept fresh until ``stop()``."""

    def __init__(self, store: Store, worker_id: str, queues: list[str], concurrency: int, interval: float) -> None:
        self.store = store
        self.interval = interval
        self._params: dict[str, Any] = {
            "id": worker_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": json.dumps(queues),
            "concurrency": concurrency,
            "ttl": LAPSE_INTERVALS * interval,
        }
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # an outage is logged once as it starts (WARNING) and once as it ends (INFO), not
        # every interval while it lasts
        self._outage = Outage(
            log, f"worker {self._params['id']}: registry refresh", Backoff(self.interval, self.interval)
        )

    def start(self) -> None:
        """Write the row now (the worker is listed once ``run()`` is under way), then keep
        refreshing it in the background."""
        self._refresh()
        self._thread = threading.Thread(
            target=self._loop, name=f"alkstore-registry-{self._params['id']}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing and delete the row (best effort: if the database is away, the
        row lapses by itself)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        try:
            with self.store.executor(retry=True) as ex:
                self.store.backend.worker_remove(ex, {"id": self._params["id"]})
        except AlkstoreError as exc:
            log.warning("worker %s: could not remove its registry row (%s); it lapses by itself",
                        self._params["id"], exc)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            self._refresh()

    def _refresh(self) -> None:
        try:
            with self.store.executor(retry=True) as ex:  # an upsert: repeating it is harmless
                self.store.backend.worker_refresh(ex, {**self._params, "now": self.store.now()})
        except AlkstoreError as exc:
            self._outage.failed("failed", exc)  # retried at the next interval, as ever
            return
        self._outage.recovered()
