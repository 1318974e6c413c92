"""alkstore_sa: durable queues stored in your database, committed in your transaction."""

from __future__ import annotations

from .errors import (
    AlkstoreError,
    DatabaseError,
    HandleConsumed,
    InvalidName,
    InvalidOptions,
    InvalidSpec,
    LeadershipLost,
    NotInstalled,
    PayloadError,
    SchemaOutdated,
    StoreClosed,
)
from .model import Job, QueueStats, SweepResult
from .notify import Notification, Subscription
from .queue import JobHandle, Queue, QueueOpts
from .schema import metadata
from .stop import StopToken
from .store import Store
from .transactional import enqueue, enqueue_many, get_job, notify
from .worker import Fail, Retry, Worker

__version__ = "0.1.0"

__all__ = [
    "AlkstoreError",
    "DatabaseError",
    "Fail",
    "HandleConsumed",
    "InvalidName",
    "InvalidOptions",
    "InvalidSpec",
    "Job",
    "Notification",
    "JobHandle",
    "LeadershipLost",
    "NotInstalled",
    "PayloadError",
    "Queue",
    "QueueOpts",
    "QueueStats",
    "Retry",
    "SchemaOutdated",
    "Store",
    "StopToken",
    "StoreClosed",
    "Subscription",
    "SweepResult",
    "Worker",
    "enqueue",
    "enqueue_many",
    "get_job",
    "notify",
    "metadata",
]
