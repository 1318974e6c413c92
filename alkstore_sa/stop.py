"""StopToken: one cooperative stop signal shared by any number of loops and threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

from . import _validate as v
from .errors import InvalidOptions


class StopToken:
    """Set once with ``stop()``; loops poll ``stopped`` or block in ``wait(timeout)``."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        # on_stop's callbacks, each under a key of its own (registration order kept)
        self._callbacks: dict[object, Callable[[], None]] = {}

    def stop(self) -> None:
        """Ask every loop holding this token to finish; idempotent and thread-safe."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            callbacks, self._callbacks = self._callbacks, {}
        for cb in callbacks.values():
            cb()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped or ``timeout`` seconds passed (None: no limit, 0: only look);
        True when stopped. InvalidOptions for anything but None or a duration >= 0."""
        return self._event.wait(v.timeout(timeout))

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` once when the token stops (at once if it already has). Returns a
        function that takes the callback back (a no-op once it ran): a loop that ends before
        the token stops calls it, so a long-lived token shared by many short loops (one
        subscription per client, a burst worker run per batch) does not keep every one of
        their callbacks alive."""
        if not callable(callback):
            raise InvalidOptions(f"on_stop needs a callable, got {type(callback).__name__}")
        key = object()  # one per registration: the same callback may be registered twice
        with self._lock:
            if not self._event.is_set():
                self._callbacks[key] = callback
                return lambda: self._cancel(key)
        callback()
        return lambda: None

    def _cancel(self, key: object) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

    def __repr__(self) -> str:
        return f"<StopToken stopped={self.stopped}>"
