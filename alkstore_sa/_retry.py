"""Retry pacing for the long-running loops (scheduler, stream subscriptions, and any loop
that must ride out a database outage instead of dying or spinning).

``Backoff`` gives capped exponential delays with jitter; ``Outage`` wraps one in the
logging an operator wants: one line when a failure streak starts, one when it ends, and
only DEBUG lines in between, however long it lasts and however often it is retried.
"""

from __future__ import annotations

import logging
import random
import time

from .errors import DatabaseError, NotInstalled

# What a loop retries: the database refused or dropped a statement, or its tables are
# (temporarily) not there. Anything else (StoreClosed, invalid options, a bug) propagates.
TRANSIENT: tuple[type[Exception], ...] = (DatabaseError, NotInstalled)

_MAX_EXPONENT = 62  # 2**62 * any sane base is a finite float; the cap applies long before


class Backoff:
    """Delays ``base, 2*base, 4*base, …`` up to ``cap`` seconds, each jittered down by up
    to half (so loops failing together do not retry in lockstep), never overflowing."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = max(cap, base)
        self.failures = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        """Count one more failure; the seconds to wait before the next attempt."""
        self.failures += 1
        exponent = min(self.failures - 1, _MAX_EXPONENT)
        ceiling = min(self.base * 2.0**exponent, self.cap)
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        """A success: the next failure starts again at ``base``."""
        self.failures = 0


class Outage:
    """One failure streak of a loop's operation, logged once when it starts (at ``level``)
    and once when it ends (INFO); each failure returns the backoff delay to wait."""

    def __init__(
        self, logger: logging.Logger, subject: str, backoff: Backoff, *, level: int = logging.WARNING
    ) -> None:
        self.log = logger
        self.subject = subject
        self.backoff = backoff
        self.level = level
        self._since: float | None = None

    @property
    def active(self) -> bool:
        return self._since is not None

    def failed(self, problem: str, exc: BaseException) -> float:
        """Record a failed attempt (``problem`` says what failed, e.g. "could not fire");
        returns the seconds to wait before the next one."""
        delay = self.backoff.next_delay()
        if self._since is None:
            self._since = time.monotonic()
            self.log.log(
                self.level, "%s %s (%s); retrying with backoff (up to %.1fs apart), logged again once it recovers",
                self.subject, problem, exc, self.backoff.cap,
            )
        else:
            self.log.debug(
                "%s %s again (%s); attempt %d, next in %.2fs", self.subject, problem, exc, self.backoff.failures, delay
            )
        return delay

    def recovered(self) -> None:
        """Record a success: logs the end of the streak, if there was one."""
        if self._since is not None:
            self.log.info(
                "%s recovered after %.1fs (%d failed attempt(s))",
                self.subject, time.monotonic() - self._since, self.backoff.failures,
            )
        self._since = None
        self.backoff.reset()
