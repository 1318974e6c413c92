"""The pinned retry curve: equal-jitter exponential, capped at one hour."""

from __future__ import annotations

import math
import random

CAP = 3600.0
_MAX_EXPONENT = 64  # base <= 100 years, so base * 2**64 stays a finite float


def backoff_delay(base: float, attempts: int, rng: random.Random | None = None) -> float:
    """Seconds before retry ``attempts`` (the post-claim count) of a job with ``base``.

    ``c = min(base * 2**(a-1), 3600)``; the delay is uniform over the integers in
    ``[ceil(c/2), c]``. When that range holds no integer (``c < 1``), the delay is ``c``;
    a ``c`` below zero (or NaN) is no delay.
    """
    exponent = min(max(attempts - 1, 0), _MAX_EXPONENT)
    c = min(base * 2.0**exponent, CAP)
    if not c > 0:
        # a stamp written by hand (the API takes 0 to 100 years): a base below zero or NaN
        # is no wait (minus infinity and NaN failed below, and the retry's outcome was lost)
        return 0.0
    lo, hi = math.ceil(c / 2), math.floor(c)
    if hi < lo:
        return c
    return float((rng or random).randint(lo, hi))
