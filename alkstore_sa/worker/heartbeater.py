"""The heartbeat roster: every live claim of this worker, and the thread that extends them.

Entries are keyed by the claim — (job id, attempt) — never by the job id alone: the same
worker can hold a job's new claim while the handler of its lapsed earlier claim still
runs, and that old handler's exit must only ever remove its own entry.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from .._retry import Backoff, Outage
from ..errors import AlkstoreError, HandleConsumed
from ..queue import JobHandle

log = logging.getLogger("alkstore_sa")

ClaimKey = tuple[int, int]  # (job id, attempt): one claim of one job

RETRY_MIN, RETRY_MAX = 0.1, 1.0  # seconds: a failed heartbeat is retried after min(vt/10, 1 s)


@dataclass(slots=True)
class _Entry:
    handle: JobHandle
    next_beat: float  # time.monotonic() of the next heartbeat
    lost: bool = False  # a heartbeat was refused: the claim is gone
    settling: bool = False  # its outcome is being written: no more beats (``settling()``)


class Heartbeater:
    """Extends each rostered claim every third of its job's visibility timeout (a failed
    heartbeat is retried sooner); marks a claim lost when a heartbeat is refused — unless
    the claim's outcome is being written, which is what removed or moved its row.

    Heartbeats failing on the database (an outage) are one streak for the whole roster: a
    WARNING when it starts, DEBUG lines while it lasts, an INFO line once a heartbeat works
    again — not a line per job per retry."""

    def __init__(self) -> None:
        self._outage = Outage(log, "heartbeats of this worker's claims", Backoff(RETRY_MIN, RETRY_MAX))
        self._lock = threading.Lock()
        self._roster: dict[ClaimKey, _Entry] = {}
        self._nudge = threading.Event()  # the schedule changed (new claims) or stop
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # time.monotonic() the beat loop next wakes by itself (inf: awake)

    def start(self) -> None:
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="alkstore-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating (whatever still runs is left to let its claim lapse)."""
        self._stopped = True
        self._nudge.set()

    def add(self, handles: list[JobHandle]) -> None:
        now = time.monotonic()
        first = float("inf")
        with self._lock:
            for h in handles:
                beat = now + h._visibility_timeout / 3
                self._roster[h._claim] = _Entry(h, beat)
                if beat < first:
                    first = beat
        if first < self._wake_at:
            self._nudge.set()  # a short visibility timeout: its first beat is due before that wake

    def remove(self, key: ClaimKey) -> None:
        with self._lock:
            self._roster.pop(key, None)

    def settling(self, key: ClaimKey) -> bool:
        """The claim's outcome is written from now on: it is heartbeated no more, and a
        refusal of a heartbeat already on its way (the outcome's own write deleted or moved
        the row) does not mark it lost. False when it was lost before: its outcome must not
        be written."""
        with self._lock:
            entry = self._roster.get(key)
            if entry is None:
                return True
            if entry.lost:
                return False
            entry.settling = True
            return True

    def settling_all(self, keys: list[ClaimKey]) -> list[bool]:
        """``settling`` of each claim, under one lock (a batch of acks)."""
        with self._lock:
            roster = self._roster
            out = []
            for key in keys:
                entry = roster.get(key)
                if entry is None:
                    out.append(True)
                elif entry.lost:
                    out.append(False)
                else:
                    entry.settling = True
                    out.append(True)
            return out

    def remove_all(self, keys: list[ClaimKey]) -> None:
        """``remove`` each claim, under one lock."""
        with self._lock:
            pop = self._roster.pop
            for key in keys:
                pop(key, None)

    def lost(self, key: ClaimKey) -> bool:
        """Whether a heartbeat of this claim was refused (the claim lapsed, was cancelled or
        swept)."""
        entry = self._roster.get(key)  # one dict read: atomic, no lock needed
        return entry is not None and entry.lost

    def _loop(self) -> None:
        while not self._stopped:
            self._wake_at = float("inf")  # awake: a claim added from now on nudges the wait below
            now = time.monotonic()
            with self._lock:
                live = [e for e in self._roster.values() if not (e.lost or e.settling)]
            # The beats due now are one round, called at one reading of each store's clock:
            # beaten one after another, a beat that waited for SQLite's write lock (an
            # application's long write) held back the next ones, and those — judged by the
            # later time they were sent at — found claims that were live when due lapsed,
            # and marked jobs lost that nobody could have taken meanwhile.
            readings: dict[int, float | None] = {}  # by id of the store
            for entry in live:
                if entry.next_beat <= now:
                    self._beat(entry, readings)
            upcoming = min((e.next_beat for e in live), default=now + 1.0)
            wait = max(0.005, min(1.0, upcoming - time.monotonic()))
            self._wake_at = time.monotonic() + wait
            self._nudge.wait(wait)
            self._nudge.clear()

    def _beat(self, entry: _Entry, readings: dict[int, float | None] | None = None) -> None:
        """Heartbeat one claim, as called at its round's reading of its store's clock (taken
        by the round's first beat on that store: ``readings``; None: a round of its own)."""
        vt = entry.handle._visibility_timeout
        store = entry.handle._queue.store
        if readings is None:
            readings = {}
        try:
            if id(store) not in readings:
                readings[id(store)] = store.now()
            ok = entry.handle._heartbeat(vt, readings[id(store)])
        except HandleConsumed:
            return  # its outcome was recorded meanwhile
        except AlkstoreError as exc:
            self._outage.failed("failed", exc)  # its own delay is the claim's below
            entry.next_beat = time.monotonic() + min(vt / 10, RETRY_MAX)
            return
        self._outage.recovered()
        if ok:
            entry.next_beat = time.monotonic() + vt / 3
            return
        with self._lock:  # against settling(): one of the two decides
            if entry.settling:
                return  # refused because its outcome's write took the row: not lost
            entry.lost = True
        log.warning(
            "job %s (attempt %d): claim lost (lapsed, cancelled or swept); its result will not be acked",
            entry.handle.id, entry.handle._attempts,
        )
