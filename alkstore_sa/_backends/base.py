"""The backend interface: one method per queue operation or state transition, assembled
from one module per mechanism. Statements are SQLAlchemy Core expressions compiled once
per backend (dialect + schema); each engine (postgresql.py, sqlite.py) overrides what
differs."""

from __future__ import annotations

from .browse_ops import BrowseOps
from .core import Core
from .gauge_ops import GaugeOps
from .inspect_ops import InspectOps
from .lease_ops import LeaseOps
from .queue_ops import QueueOps
from .schedule_ops import ScheduleOps
from .settings_ops import SettingsOps
from .sql import Executor
from .stream_ops import StreamOps
from .worker_ops import WorkerOps


class Backend(
    QueueOps, InspectOps, GaugeOps, BrowseOps, LeaseOps, ScheduleOps, SettingsOps, StreamOps,
    WorkerOps, Core,
):
    """Every operation of one engine; the engines subclass it."""


__all__ = ["Backend", "Executor"]
