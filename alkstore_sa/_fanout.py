"""Subscriber bookkeeping shared by the engines' listener/watcher threads."""

from __future__ import annotations

import collections
import itertools
import logging
import selectors
import threading
from collections.abc import Callable

log = logging.getLogger("alkstore_sa")

Deliver = Callable[[int, str], None]
"""Called with (sequence, payload); sequence orders SQLite rows (0 on PostgreSQL)."""


class FanOut:
    """Channel key → subscribers; dispatch runs on the listener thread, so callbacks must
    be quick (put on a queue, set an event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, dict[int, Deliver]] = {}
        self._closers: dict[int, Callable[[], None]] = {}
        self._closed = False
        self._ids = itertools.count(1)
        # (key, token) of subscribers freed without unsubscribing (Subscription's finalizer:
        # a deque's append takes no lock, so the garbage collector may run it in any thread);
        # the hub's next subscribe() unsubscribes them
        self.dropped: collections.deque[tuple[str, int]] = collections.deque()

    def add(
        self, key: str, deliver: Deliver, on_close: Callable[[], None] | None = None
    ) -> tuple[int, bool]:
        """Register; returns (token, whether this is the key's first subscriber).
        ``on_close`` runs once at ``close()`` (at once if that already happened), so a
        subscriber blocked waiting for deliveries learns that none will come."""
        with self._lock:
            token = next(self._ids)
            subs = self._subs.setdefault(key, {})
            subs[token] = deliver
            first = len(subs) == 1
            closed = self._closed
            if on_close is not None and not closed:
                self._closers[token] = on_close
        if on_close is not None and closed:
            on_close()
        return token, first

    def close(self) -> None:
        """The hub stops: run every registered ``on_close`` once."""
        with self._lock:
            self._closed = True
            closers, self._closers = list(self._closers.values()), {}
        for on_close in closers:
            try:
                on_close()
            except Exception:  # noqa: BLE001 - one bad subscriber must not stop the others
                log.exception("alkstore notification subscriber failed at close")

    def remove(self, key: str, token: int) -> bool:
        """Unregister; returns whether the key has no subscriber left."""
        with self._lock:
            self._closers.pop(token, None)
            subs = self._subs.get(key)
            if subs is None:
                return False
            subs.pop(token, None)
            if subs:
                return False
            del self._subs[key]
            return True

    def channel_keys(self) -> list[str]:
        with self._lock:
            return list(self._subs)

    def has_any(self) -> bool:
        with self._lock:
            return bool(self._subs)

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._subs

    def dispatch(self, key: str, seq: int, payload: str) -> None:
        with self._lock:
            targets = list(self._subs.get(key, {}).values())
        for deliver in targets:
            try:
                deliver(seq, payload)
            except Exception:  # noqa: BLE001 - one bad subscriber must not stop the others
                log.exception("alkstore notification subscriber failed")

    def dispatch_all(self, payload: str = "") -> None:
        for key in self.channel_keys():
            self.dispatch(key, 0, payload)


def new_selector() -> selectors.BaseSelector:
    """What the listener/watcher threads wait with: poll() where available (select() fails
    for descriptors >= 1024; epoll would cost a descriptor per selector), else the default."""
    if hasattr(selectors, "PollSelector"):
        return selectors.PollSelector()
    return selectors.DefaultSelector()
