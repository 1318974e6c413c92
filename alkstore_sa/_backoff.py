"""The pinned retry curve: equal-jitter exponential, capped at one hour."""

from __future__ import annotations

import math
import random

CAP = 3600.0
_MAX_EXPONENT = 64  # base <= 100 years, so base * 2**64 stays a finite float


def backoff_delay(base: float, attempts: int, rng: random.Random | None = None) -> float:
    """Seconds before retry ``attempts`` (the post-claim count) of a job with ``base``.

    ``c = min(base * 2**(a-1), 3600)``; the delay is uniform over the integers in
    ``[ceil(c/2), c]``. When that range holds no integer (``c < 1``), the delay is ``c``.
    """
    exponent = min(max(attempts - 1, 0), _MAX_EXPONENT)
    c = min(base * 2.0**exponent, CAP)
    lo, hi = math.ceil(c / 2), math.floor(c)
    if hi < lo:
        return c
    return float((rng or random).randint(lo, hi))
