"""StopToken: one cooperative stop signal shared by any number of loops and threads.

``stop()`` is meant to be called from a signal handler (SIGTERM, Ctrl-C). A Python signal
handler runs in the main thread between two bytecodes, possibly while that very thread is
inside the token's code or inside a wake-up the stop sets: a lock taken there — a
``threading.Lock``, the condition of a ``threading.Event`` — is one the interrupted thread
may hold, and the handler would wait for it forever. So nothing here takes a lock: the
state is plain attributes and dict operations (each one bytecode, which no handler
interrupts), and waiting threads are woken through a ``queue.SimpleQueue``, whose ``put``
is reentrant (documented as safe to call from a signal handler).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from . import _validate as v
from .errors import InvalidOptions


def _blocking(timeout: float | None) -> float | None:
    """A wait's timeout as ``SimpleQueue.get`` takes it (it refuses a negative one and
    overflows past ``threading.TIMEOUT_MAX``)."""
    return None if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)


class StopToken:
    """Set once with ``stop()``; loops poll ``stopped`` or block in ``wait(timeout)``."""

    def __init__(self) -> None:
        self._stopped = False
        # one item once stopped; a waiter that takes it puts it back for the next waiter
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # on_stop's callbacks, each under a key of its own (registration order kept); each
        # runs once, by whoever pops it: stop(), or on_stop() when the stop came first
        self._callbacks: dict[object, Callable[[], None]] = {}

    def stop(self) -> None:
        """Ask every loop holding this token to finish; idempotent and thread-safe. Safe to
        call from a signal handler: it takes no lock (the callbacks ``on_stop`` registered
        run here, in the caller's thread — those of alkstore's loops take none either)."""
        if not self._stopped:
            self._stopped = True
            self._wake.put(None)
        for key in list(self._callbacks):
            callback = self._callbacks.pop(key, None)
            if callback is not None:
                callback()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped or ``timeout`` seconds passed (None: no limit, 0: only look);
        True when stopped. InvalidOptions for anything but None or a duration >= 0."""
        seconds = v.timeout(timeout)
        if self._stopped:
            return True
        if seconds == 0:
            return False
        try:
            self._wake.get(timeout=_blocking(seconds))
        except queue.Empty:
            return self._stopped
        self._wake.put(None)  # for the next waiter: every waiter wakes
        return True

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` once when the token stops (at once if it already has). Returns a
        function that takes the callback back (a no-op once it ran): a loop that ends before
        the token stops calls it, so a long-lived token shared by many short loops (one
        subscription per client, a burst worker run per batch) does not keep every one of
        their callbacks alive."""
        if not callable(callback):
            raise InvalidOptions(f"on_stop needs a callable, got {type(callback).__name__}")
        key = object()  # one per registration: the same callback may be registered twice
        self._callbacks[key] = callback  # registered before looking: a stop from now on sees it
        if self._stopped:  # the stop came first (or meanwhile): run it unless stop() took it
            mine = self._callbacks.pop(key, None)
            if mine is not None:
                mine()
            return lambda: None
        return lambda: self._forget(key)

    def _forget(self, key: object) -> None:
        self._callbacks.pop(key, None)

    def __repr__(self) -> str:
        return f"<StopToken stopped={self.stopped}>"


class Nudge:
    """A wake-up flag for one waiting thread (a loop's sleep), like ``threading.Event`` for
    ``set``/``clear``/``wait``/``is_set`` but without its lock: a StopToken's callback sets
    it, maybe from a signal handler that interrupted the very thread waiting on it. Any
    thread may ``set`` it; one thread waits and clears it."""

    __slots__ = ("_set", "_items")

    def __init__(self) -> None:
        self._set = False
        self._items: queue.SimpleQueue[None] = queue.SimpleQueue()  # one per set() that found it clear

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._items.put(None)

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        """Until set or ``timeout`` seconds passed; True when set. (The flag is looked at
        before blocking, so a set() between it and the block leaves an item that ends it.)"""
        if not self._set:
            with contextlib.suppress(queue.Empty):
                self._items.get(timeout=_blocking(timeout))
        while True:  # drop the wake-ups of earlier sets, so they cannot cut a later wait short
            try:
                self._items.get_nowait()
            except queue.Empty:
                break
        return self._set
