"""notify / listen (SPEC §9): text notifications on named channels, delivered to every
subscription that was listening when the notify committed."""

from __future__ import annotations

import os
import queue
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _validate as v
from .errors import PayloadError, StoreClosed

if TYPE_CHECKING:
    from .store import Store

MAX_NOTIFY_BYTES = 7999  # PostgreSQL's NOTIFY payload limit, applied on both engines
_CLOSED = object()  # the subscription closed
_STORE_CLOSED = object()  # its store closed


@dataclass(frozen=True)
class Notification:
    """One delivered notification: the channel name as given, and its text payload."""

    channel: str
    payload: str


def notify_params(channel: object, payload: object) -> dict[str, Any]:
    """Validate a notify before any SQL."""
    name = v.name(channel, "channel name")  # the reserved prefix is refused (SPEC §3)
    if not isinstance(payload, str):
        raise PayloadError(f"notify payload must be a str, got {type(payload).__name__}")
    if "\x00" in payload:
        raise PayloadError("notify payload must not contain NUL")
    try:
        size = len(payload.encode("utf-8"))
    except UnicodeEncodeError:
        raise PayloadError("notify payload must be valid Unicode (no lone surrogates)") from None
    if size > MAX_NOTIFY_BYTES:
        raise PayloadError(f"notify payload is {size} bytes; the limit is {MAX_NOTIFY_BYTES}")
    return {"channel": name, "payload": payload}


class Subscription:
    """Notifications of one channel, from the moment ``store.listen()`` returned until
    ``close()``. Iterating blocks for each next notification and ends at ``close()``.

    ``store.close()`` ends every live subscription of the store: a blocked ``get()`` or
    iteration raises ``StoreClosed`` (as a running ``stream.subscribe`` does), and so
    does every later ``get()``; the subscription's own ``close()`` stays a no-op.

    ``listen()`` returns only once the channel is really listened to (on PostgreSQL: its
    LISTEN completed on the listener's live connection, also when another subscriber's
    LISTEN of it was still in flight); a PostgreSQL listener that cannot connect within
    ``LISTEN_TIMEOUT`` (30 s) makes it raise ``DatabaseError`` instead of returning deaf."""

    def __init__(self, store: Store, channel: str) -> None:
        # a user channel: names with the reserved prefix are refused (the library's own
        # wake-ups do not go through channels at all: see the hubs' watch_queue/watch_stream)
        store = v.store(store)
        self.channel = v.name(channel, "channel name")
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._key = store.backend.channel_key(channel)
        self._store = store
        self._closed = False
        self._subscribe()

    def _subscribe(self) -> None:
        """Register with the store's listener of this process."""
        self._pid = os.getpid()
        self._hub = hub = self._store.hub()
        # The hub keeps only weak references: a subscription dropped without close() is
        # freed, nothing queues notifications for it any more, and the next listen()
        # unsubscribes it (its finalizer only records that: it may run in any thread).
        while hub.fanout.dropped:
            try:
                key, token = hub.fanout.dropped.popleft()
            except IndexError:  # another listen() took it
                break
            hub.unsubscribe(key, token)
        me = weakref.ref(self)

        def deliver(_seq: int, payload: str) -> None:
            sub = me()
            if sub is not None:
                sub._deliver(payload)

        def store_closed() -> None:
            sub = me()
            if sub is not None:
                sub._store_closed()

        self._token = hub.subscribe(self._key, deliver, store_closed)
        self._finalizer = weakref.finalize(self, hub.fanout.dropped.append, (self._key, self._token))

    def _deliver(self, payload: str) -> None:
        self._items.put(Notification(self.channel, payload))

    def _store_closed(self) -> None:
        """The store's hub closed (``store.close()``): wake a blocked ``get()``."""
        self._items.put(_STORE_CLOSED)

    def _forked(self) -> bool:
        """Whether this is a forked child of the process that subscribed: the parent's
        listener thread is not here (and its connection not ours), so nothing would come."""
        if self._pid == os.getpid():
            return False
        self._finalizer.detach()  # the parent's listener: never touched from here
        self._items = queue.SimpleQueue()
        return True

    def get(self, timeout: v.Duration | None = None) -> Notification | None:
        """The next notification, waiting up to ``timeout`` seconds (None: until one
        arrives or the subscription closes); None on timeout or once closed.
        ``StoreClosed`` once the store is closed, also while waiting. ``timeout=0`` only
        looks; anything but None or a duration >= 0 raises InvalidOptions. In a forked
        child a subscription made before the fork listens again, from its first use there."""
        self._store._check_open()
        wait = v.timeout(timeout)
        if self._forked():
            if self._closed:
                self._pid = os.getpid()
            else:
                self._subscribe()
        if self._closed and self._items.empty():
            return None
        try:
            item = self._items.get(timeout=wait)
        except queue.Empty:
            return None
        if item is _CLOSED or item is _STORE_CLOSED:
            self._items.put(item)  # every later get() sees it too
            if item is _STORE_CLOSED:
                raise StoreClosed()
            return None
        self._store._check_open()  # closed while a notification was queued
        return item  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Notification]:
        while True:
            item = self.get()
            if item is None:
                return
            yield item

    def close(self) -> None:
        """Stop listening; a blocked ``get()`` or iteration returns (idempotent, also
        after ``store.close()``)."""
        if self._closed:
            return
        self._closed = True
        if self._forked():  # (a child leaves its parent's listener alone)
            self._pid = os.getpid()
        else:
            self._finalizer.detach()
            self._hub.unsubscribe(self._key, self._token)
        self._items.put(_CLOSED)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
