"""Frozen value types returned by the public API."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

JobState = Literal["pending", "processing", "dead"]


@dataclass(frozen=True)
class Job:
    """A job as stored: live (``pending``/``processing``) or ``dead``.

    Durations are float seconds; timestamps are timezone-aware UTC datetimes.
    ``last_error`` and ``died_at`` are set for dead jobs only. ``unique_key`` is the key the
    job was enqueued with (SPEC §14); a dead job keeps it as history without holding it.
    ``trace_context`` is the W3C trace context of a traced enqueue (``alkstore_sa.tracing``),
    as JSON text (``{"traceparent": ..., "tracestate": ...}``); None when it was not traced.
    """

    id: int
    queue: str
    state: JobState
    payload: Any
    priority: int
    attempts: int
    max_attempts: int
    visibility_timeout: float
    backoff_base: float
    dead_letter_retention: float | None
    created_at: datetime
    run_at: datetime
    claimed_at: datetime | None
    claim_expires_at: datetime | None
    worker_id: str | None
    expires_at: datetime | None
    errors: list[dict[str, Any]] = field(default_factory=list)
    last_error: str | None = None
    died_at: datetime | None = None
    unique_key: str | None = None
    trace_context: str | None = None


@dataclass(frozen=True)
class SweepResult:
    """What one ``sweep_expired`` call did: rows moved to dead as expired, dead rows purged."""

    expired: int
    purged: int


@dataclass(frozen=True)
class QueueStats:
    """Counts for one queue at one instant.

    ``pending`` includes delayed jobs; ``ready`` is the pending jobs claimable now;
    ``oldest_ready_age`` is in seconds, ``None`` when nothing is ready.
    """

    pending: int
    ready: int
    processing: int
    dead: int
    oldest_ready_age: float | None


@dataclass(frozen=True)
class LockInfo:
    """The live holder of a lock: its owner and when its lease lapses."""

    name: str
    owner: str
    acquired_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class Schedule:
    """A registered schedule and the next boundary it will fire. ``interval`` is the seconds
    between ``@every`` boundaries (None for a cron spec); ``tz`` is the IANA zone a cron spec
    is evaluated in (SPEC §14)."""

    name: str
    spec: str
    interval: float | None
    queue: str
    payload: Any
    priority: int
    max_attempts: int | None
    expires: float | None
    next_fire_at: datetime
    created_at: datetime
    updated_at: datetime
    tz: str = "UTC"


@dataclass(frozen=True)
class Event:
    """One stream event: its offset (strictly increasing per stream), payload and time."""

    stream: str
    offset: int
    payload: Any
    created_at: datetime


@dataclass(frozen=True)
class QueueSettings:
    """A queue's settings (SPEC §14), shared by every process: ``paused`` hands out
    nothing; ``concurrency`` caps the jobs holding a live claim at once; ``rate_limit`` caps
    the jobs handed out in any ``rate_per`` seconds. ``None`` means no limit."""

    paused: bool = False
    concurrency: int | None = None
    rate_limit: int | None = None
    rate_per: float | None = None


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker as its registry row records it (SPEC §15): refreshed at least every
    30 s; one that stopped refreshing for three refresh intervals is no longer listed."""

    id: str
    hostname: str
    pid: int | str  # str: a row written by hand holding no integer, as stored
    queues: tuple[str, ...]
    concurrency: int | str  # likewise
    started_at: datetime
    last_seen: datetime
