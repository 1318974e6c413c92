"""The worker's registry row (SPEC §15): written when it starts, refreshed every
``interval`` seconds on a thread of its own, deleted when it stops.

The row is keyed by the worker id alone, so workers sharing an id share one row, which
shows the latest refresher. A stop deletes the row only while no other worker of the
same id runs: one in another process is seen in the row (its hostname and pid, written
by its latest refresh, no longer this process's), one in this process in ``_running``.

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

# How many registrations of this process hold each row — a worker id in one registry table
# (the database and schema a store is on; two stores on different ones hold different
# rows) — started and not yet stopped: a row is kept while another one of it runs, at worst
# until it lapses. _lock covers the count and the delete that depends on it, so a
# registration starting meanwhile writes its row after that delete.
_running: dict[tuple[str, str, str], int] = {}
_lock = threading.Lock()


def _reset_after_fork() -> None:
    """A child runs none of its parent's workers; a lock held by another thread at fork
    time stays held in the child: start both afresh."""
    global _lock
    _lock = threading.Lock()
    _running.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


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
        # the row: the worker id in this store's registry table (its database and schema)
        url = store.engine.url.render_as_string(hide_password=True)
        self._row = (url, store.schema, worker_id)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        # an outage is logged once as it starts (WARNING) and once as it ends (INFO), not
        # every interval while it lasts
        self._outage = Outage(
            log, f"worker {self._params['id']}: registry refresh", Backoff(self.interval, self.interval)
        )

    def start(self) -> None:
        """Write the row now (the worker is listed once ``run()`` is under way), then keep
        refreshing it in the background."""
        with _lock:  # counted before the row is written: see _running
            _running[self._row] = _running.get(self._row, 0) + 1
        self._started = True
        self._refresh()
        self._thread = threading.Thread(
            target=self._loop, name=f"alkstore-registry-{self._params['id']}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing and delete the row, unless another worker of the same id still
        runs (best effort: if the database is away, the row lapses by itself)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if not self._started:
            return
        self._started = False
        wid = self._params["id"]
        with _lock:
            _running[self._row] -= 1
            if _running[self._row]:
                return  # another worker of this process runs under this id here: its row
            del _running[self._row]
            try:
                with self.store.executor(retry=True) as ex:
                    self.store.backend.worker_remove(
                        ex, {"id": wid, "hostname": self._params["hostname"], "pid": self._params["pid"]}
                    )
            except AlkstoreError as exc:
                log.warning("worker %s: could not remove its registry row (%s); it lapses by itself", wid, exc)

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
