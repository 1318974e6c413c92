"""alkstore_sa: durable queues stored in your database, committed in your transaction."""

from __future__ import annotations

from ._current import current_job
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
    SchemaTooNew,
    StoreClosed,
)
from .locks import Lock
from .model import (
    Event,
    Job,
    LockInfo,
    QueueSettings,
    QueueStats,
    Schedule,
    SweepResult,
    WorkerInfo,
)
from .notify import Notification, Subscription
from .outbox import Outbox
from .queue import JobHandle, Queue, QueueOpts
from .schema import metadata
from .stop import StopToken
from .store import Store
from .streams import Stream
from .tasks import Task, Tasks
from .transactional import (
    aenqueue,
    aenqueue_many,
    aget_job,
    anotify,
    aoutbox_enqueue,
    apublish,
    enqueue,
    enqueue_many,
    get_job,
    notify,
    outbox_enqueue,
    publish,
)
from .worker import Fail, Retry, Worker

__version__ = "0.1.0"

__all__ = [
    "AlkstoreError",
    "DatabaseError",
    "Event",
    "Fail",
    "HandleConsumed",
    "InvalidName",
    "InvalidOptions",
    "InvalidSpec",
    "Job",
    "Notification",
    "JobHandle",
    "Lock",
    "LockInfo",
    "LeadershipLost",
    "NotInstalled",
    "Outbox",
    "PayloadError",
    "Queue",
    "QueueOpts",
    "QueueSettings",
    "QueueStats",
    "Retry",
    "Schedule",
    "SchemaOutdated",
    "SchemaTooNew",
    "Store",
    "StopToken",
    "StoreClosed",
    "Stream",
    "Subscription",
    "SweepResult",
    "Task",
    "Tasks",
    "Worker",
    "WorkerInfo",
    "aenqueue",
    "aenqueue_many",
    "aget_job",
    "anotify",
    "aoutbox_enqueue",
    "apublish",
    "current_job",
    "enqueue",
    "enqueue_many",
    "get_job",
    "notify",
    "outbox_enqueue",
    "publish",
    "metadata",
]
