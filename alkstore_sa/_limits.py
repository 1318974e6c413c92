"""Queue settings (SPEC §14) on the Python side: validating a change, the arithmetic of
the limits (how many jobs a claim may hand out, and how long a consumer should wait before
one could hand out anything), and the claim path that picks the fast or the limited claim.

The limits, as a claim applies them under the queue's settings lock:

- paused: nothing;
- concurrency N: at most ``N - live`` jobs, where ``live`` counts the queue's jobs whose
  claim has not lapsed (acks, retries and lapses free a place);
- rate N per ``per`` seconds: at most ``N - recent``, where ``recent`` counts the jobs
  handed out after ``now - per`` (the rate log). Every claim checks the window ending at
  its own instant, and claims are serialized, so no window ``[t, t + per)`` can hold more
  than N: the last claim inside it saw every earlier one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _validate as v
from .errors import InvalidOptions
from .model import QueueSettings

if TYPE_CHECKING:
    from ._backends import Executor
    from .queue import Queue
    from .store import Store

UNSET: Any = object()  # "keep this setting" in a change of several


@dataclass(frozen=True)
class LimitView:
    """A queue's settings and the counts they are checked against, at ``now``."""

    paused: bool
    concurrency: int | None
    rate_limit: int | None
    rate_per: float | None
    live: int  # jobs of the queue under a claim that has not lapsed (when concurrency is set)
    next_lapse: float | None  # the earliest deadline among those claims
    recent: int  # jobs handed out within the last rate_per seconds (when rate_limit is set)
    oldest_recent: float | None  # the earliest of those claim times
    log_total: int  # the rate log's running total so far (the next claim's log row continues it)
    log_newest_at: float | None  # the time of the log's newest claim (when rate_limit is set)
    now: float

    @property
    def log_time(self) -> float:
        """The time a claim made now is logged at: ``now``, or the log's newest claim's time
        when the clock is behind it (it stepped back, an NTP correction, or a store's own
        clock runs behind another's). Logged times then never go back, so the running
        totals stay in the claim order the window count reads them in, and a claim counts
        every claim logged after ``now - rate_per``, later ones included: a backward step
        holds the rate back (by up to the step) but never lifts it, and no window of logged
        times holds more than the limit."""
        return self.now if self.log_newest_at is None else max(self.now, self.log_newest_at)

    def room(self, n: int) -> int:
        """How many of ``n`` wanted jobs a claim may hand out now."""
        if self.paused:
            return 0
        room = n
        if self.concurrency is not None:
            room = min(room, self.concurrency - self.live)
        if self.rate_limit is not None:
            room = min(room, self.rate_limit - self.recent)
        return max(room, 0)

    @property
    def concurrency_full(self) -> bool:
        """Whether only a claim ending (ack, retry, fail, lapse) can make room."""
        return self.concurrency is not None and self.live >= self.concurrency

    def blocked_for(self) -> float | None:
        """For a queue whose limits leave no room (``room(1) == 0``): seconds until time
        alone frees a place (the rate window's oldest claim leaves it, a live claim
        lapses), or None when only an event can (a resume). Under a full concurrency limit
        an ack may free a place sooner."""
        if self.paused:
            return None
        wait = 0.0
        if self.rate_limit is not None and self.recent >= self.rate_limit:
            # a limit below 1 or an infinite window (a row written by hand: the API refuses
            # both) never lets a job through however long one waits, as a pause
            if self.rate_limit < 1 or not math.isfinite(self.rate_per or 0.0):
                return None
            # the window frees a place when its oldest claim leaves it
            oldest = self.now if self.oldest_recent is None else self.oldest_recent
            wait = max(wait, oldest + (self.rate_per or 0.0) - self.now)
        if self.concurrency_full:
            if self.next_lapse is None:
                return None
            wait = max(wait, self.next_lapse - self.now)
        return wait


def rate_in_force(rate_per: float | None) -> bool:
    """Whether a rate limit with this window limits anything: only a window of positive
    length counts claims. The API sets a window of at least a millisecond with every limit;
    a settings row written by hand may have none, or 0, a negative one, NaN (SQLite stores
    NaN as NULL): such a limit is not in force (an infinite window is: the limit holds for
    good)."""
    return rate_per is not None and rate_per > 0


def settings_from_row(row: tuple[Any, ...] | None) -> QueueSettings:
    """A settings row (or none: no settings) as the public value."""
    if row is None:
        return QueueSettings()
    paused, concurrency, rate_limit, rate_per = row
    return QueueSettings(
        paused=bool(paused),
        concurrency=concurrency,
        rate_limit=rate_limit,
        rate_per=None if rate_per is None else float(rate_per),
    )


# -- changes -----------------------------------------------------------------------------------


def change_params(
    *, paused: Any = UNSET, concurrency: Any = UNSET, rate_limit: Any = UNSET, per: Any = UNSET
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Validate a settings change (every part before anything is written): the statement
    parameters and the fields it sets. ``per`` goes with ``rate_limit``."""
    params: dict[str, Any] = {}
    fields: list[str] = []
    if paused is not UNSET:
        params["paused"] = bool(paused)
        fields.append("paused")
    if concurrency is not UNSET:
        params["concurrency"] = None if concurrency is None else v.int32(concurrency, "concurrency", minimum=1)
        fields.append("concurrency")
    if rate_limit is not UNSET:
        if rate_limit is None:
            if per is not UNSET and per is not None:
                v.lease(per, "per")  # a window given with the removal: still a valid one
            params["rate_limit"] = params["rate_per"] = None
        else:
            params["rate_limit"] = v.int32(rate_limit, "rate limit", minimum=1)
            if per is UNSET or per is None:
                raise InvalidOptions("a rate limit needs its window: set_rate_limit(100, per=60) for 100 per minute")
            params["rate_per"] = v.lease(per, "per")  # a window the clock can measure
        fields.append("rate")
    return params, tuple(fields)


def update(queue: Queue, params: dict[str, Any], fields: tuple[str, ...]) -> QueueSettings:
    """Apply a validated change to ``queue``'s settings in one transaction. Every change but
    a pause wakes the queue's idle consumers (a resume or a raised limit may let them claim
    now; a lowered one costs each of them one empty claim)."""
    store = queue.store
    store._check_open()
    wake = fields != ("paused",) or not params["paused"]
    with store.executor() as ex:
        row = store.backend.queue_settings_update(ex, {"queue": queue.name, "now": store.now(), **params}, fields, wake=wake)
    if row is None:
        store._limited_queues.discard(queue.name)
    else:  # this process's next claim goes straight to the limited path
        store._limited_queues.add(queue.name)
    return settings_from_row(row)


# -- the claim path ----------------------------------------------------------------------------


def claim_rows(queue: Queue, ex: Executor, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Claim through the fast path, or the limited one for a queue with settings.

    The fast claim's guard refuses queues with a settings row, so an empty fast claim is
    followed by one primary-key probe to tell "no jobs" from "limited". A queue found
    limited is remembered by the store, and its claims go straight to the limited path
    until one finds its settings gone.
    """
    store, backend = queue.store, queue.store.backend
    limited = store._limited_queues
    if queue.name not in limited:
        rows = backend.claim(ex, params)
        if rows or backend.queue_settings_get(ex, params) is None:
            return rows
        limited.add(queue.name)
    within_limits = backend.claim_limited(ex, params, store.now)
    if within_limits is None:  # the settings are gone: the ordinary claim again
        limited.discard(queue.name)
        return backend.claim(ex, params)
    return within_limits


def limit_wait(store: Store, queue: str) -> tuple[float | None, bool] | None:
    """For a queue the store knows has settings: (seconds until its limits could let a
    claim take a job — None for "only an event can", whether only a finished claim can make
    room). None when the limits do not hold a claim back (or the queue has no settings)."""
    if queue not in store._limited_queues:
        return None
    with store.executor(retry=True) as ex:  # a read
        view = store.backend.limit_view(ex, {"queue": queue, "now": store.now()})
    if view is None:
        store._limited_queues.discard(queue)
        return None
    if view.room(1) > 0:
        return None
    return view.blocked_for(), view.concurrency_full


def describe(settings: QueueSettings) -> str:
    """One line for people: what holds the queue back ("-": nothing)."""
    parts = ["paused"] if settings.paused else []
    if settings.concurrency is not None:
        parts.append(f"concurrency {settings.concurrency}")
    if settings.rate_limit is not None:
        if settings.rate_per is None:  # a row written by hand: the API sets both or neither
            parts.append(f"rate {settings.rate_limit} (no window: not in force)")
        elif not rate_in_force(settings.rate_per):  # written by hand too: 0, negative, NaN
            parts.append(f"rate {settings.rate_limit}/{_window(settings.rate_per)} (not in force)")
        else:
            parts.append(f"rate {settings.rate_limit}/{_window(settings.rate_per)}")
    return ", ".join(parts) or "-"


def _window(seconds: float) -> str:
    """A rate window for people: ``60s``, or ``inf`` / ``nan`` for one written by hand (a
    unit after them read ``infs``)."""
    # 15 significant digits: the window as stored (":g" kept six, so 1234567 s read
    # "1.23457e+06s"), and no exponent inside the allowed range of 100 years
    text = f"{seconds:.15g}"
    return f"{text}s" if math.isfinite(seconds) else text
