"""Streams (SPEC §10): append-only logs with per-consumer committed offsets.

Publishing increments the stream's counter row and keeps it locked until the publishing
transaction ends, so publishers of one stream commit in offset order: once a reader has
seen offset n, no event with an offset below n can still appear. That is the "a reader
never skips an event" guarantee; its price is that publishers of the *same* stream
serialize on their commits (different streams do not). Nothing is retained or trimmed
automatically: ``trim_to`` is the bound, called deliberately (e.g. from a schedule).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import _validate as v
from ._retry import TRANSIENT, Backoff, Outage
from ._rows import ts
from .errors import AlkstoreError, InvalidOptions, PayloadError
from .model import Event
from .stop import Nudge, StopToken

if TYPE_CHECKING:
    from .store import Store

log = logging.getLogger("alkstore_sa")

# A subscription's retries after a database error: 0.1 s, doubling, at most poll_interval
# apart (as the worker's claims) but never more than 30 s (a long poll_interval is for wakes).
RETRY_BASE, RETRY_CAP = 0.1, 30.0


def _offset(value: object, what: str = "offset") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptions(f"{what} must be an int, got {type(value).__name__}")
    if value < 0 or value > v.INT64_MAX:
        raise InvalidOptions(f"{what} must be in [0, 2**63-1], got {value}")
    return value


class Stream:
    """A handle on the stream ``name``; constructing it writes nothing."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = v.store(store)
        self.name = v.name(name, "stream name")

    def __repr__(self) -> str:
        return f"<alkstore_sa.Stream {self.name!r}>"

    def publish(self, payload: Any) -> int:
        """Append one event in its own transaction; returns its offset."""
        self.store._check_open()
        params = {
            "stream": self.name,
            "payload": v.encode_payload(payload, self.store.max_payload_bytes),
            "now": self.store.now(),
        }
        with self.store.executor() as ex:
            return self.store.backend.stream_publish(ex, params)

    def read(self, after: int = 0, limit: int = 100) -> list[Event]:
        """Events with offsets above ``after``, in offset order, at most ``limit``."""
        self.store._check_open()
        after = _offset(after, "after")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidOptions("limit must be a non-negative int")
        if limit == 0:
            return []
        params = {"stream": self.name, "after": after, "limit": min(limit, v.INT32_MAX)}
        with self.store.executor(retry=True) as ex:  # a read
            rows = self.store.backend.stream_read(ex, params)
        return [
            Event(self.name, int(offset), self._decoded(int(offset), payload), ts(created))  # type: ignore[arg-type]
            for offset, payload, created in rows
        ]

    def _decoded(self, offset: int, payload: str) -> Any:
        """An event's stored payload; a PayloadError naming the stream and the offset when
        it does not decode (a row edited by hand, or nested deeper than this process can
        decode): every read of a page holding it fails, so the consumer must know which
        event to repair or commit past."""
        try:
            return v.decode_payload(payload)
        except PayloadError as exc:
            raise PayloadError(
                f"stream {self.name!r}, event {offset}: {exc} (repair the row, or commit the "
                f"consumer past it, or trim_to({offset}))"
            ) from None

    def commit(self, consumer: str, offset: int) -> None:
        """Record that ``consumer`` has processed everything up to ``offset``."""
        self.store._check_open()
        params = {
            "stream": self.name,
            "consumer": v.name(consumer, "consumer name"),
            "offset": _offset(offset),
            "now": self.store.now(),
        }
        with self.store.executor(retry=True) as ex:  # a repeat records the same offset again
            self.store.backend.stream_commit(ex, params)

    def offset(self, consumer: str) -> int:
        """``consumer``'s committed offset; 0 when it never committed."""
        self.store._check_open()
        params = {"stream": self.name, "consumer": v.name(consumer, "consumer name")}
        with self.store.executor(retry=True) as ex:  # a read
            return self.store.backend.stream_offset(ex, params)

    def trim_to(self, offset: int) -> int:
        """Delete the events with offsets <= ``offset``; returns how many."""
        self.store._check_open()
        params = {"stream": self.name, "offset": _offset(offset)}
        with self.store.executor() as ex:
            return self.store.backend.stream_trim(ex, params)

    def subscribe(
        self, consumer: str, stop: StopToken, *, poll_interval: v.Duration = 5.0, batch: int = 100
    ) -> Iterator[Event]:
        """Events after ``consumer``'s committed offset, as they are published, until ``stop``.

        Wake-driven (with a re-poll every ``poll_interval``). The position advances in
        memory as events are yielded; call ``commit(consumer, event.offset)`` once an event
        is processed so a restart resumes after it.
        """
        self.store._check_open()
        consumer = v.name(consumer, "consumer name")
        stop = v.stop_token(stop)
        wait = v.interval(poll_interval, "poll_interval")
        v.int32(batch, "batch", minimum=1)
        return self._follow(consumer, stop, wait, batch)

    def _follow(self, consumer: str, stop: StopToken, wait: float, batch: int) -> Iterator[Event]:
        nudge = Nudge()  # set by the stop too, maybe from a signal handler: takes no lock
        unhook = stop.on_stop(nudge.set)  # taken back when this subscription ends
        pid = os.getpid()  # the process whose listener ``watch`` is registered with
        watch = self._watch(nudge.set, wait)
        backoff = Backoff(RETRY_BASE, min(wait, RETRY_CAP))
        outage = Outage(log, f"subscription {consumer!r} to stream {self.name!r}", backoff)
        position: int | None = None  # read once the database answers
        try:
            while not stop.stopped:
                if pid != os.getpid():
                    # resumed in a forked child (started before a pre-fork server forked):
                    # the wake-up is the parent's listener's, which is not here (store.hub()
                    # leaves it alone); watch on the child's own, then read again, as a
                    # publish may have come while this one waited for nothing
                    pid, watch = os.getpid(), self._watch(nudge.set, wait)
                nudge.clear()
                try:
                    if position is None:
                        position = self.offset(consumer)
                    events = self.read(after=position, limit=batch)
                except TRANSIENT as exc:
                    stop.wait(outage.failed("could not read", exc))
                    continue
                outage.recovered()
                for event in events:
                    if stop.stopped:
                        return
                    position = event.offset
                    yield event
                if len(events) < batch and pid == os.getpid():
                    nudge.wait(wait)
        finally:
            unhook()
            if watch is not None and pid == os.getpid():  # never the parent's listener
                self._unwatch(watch)

    def _watch(self, wake: Callable[[], None], wait: float) -> tuple[Any, str, int] | None:
        """Wake on this stream's publishes; None (re-polling only) if the transport fails."""
        try:
            hub = self.store.hub()
            key = self.store.backend.stream_wake_key(self.name)
            return hub, key, hub.watch_stream(key, wake)
        except TRANSIENT as exc:
            log.warning("no wake-ups for stream %r (%s): polling every %.1fs", self.name, exc, wait)
            return None

    def _unwatch(self, watch: tuple[Any, str, int]) -> None:
        hub, key, token = watch
        with contextlib.suppress(AlkstoreError):  # a closed store's hub is already gone
            hub.unwatch_stream(key, token)
