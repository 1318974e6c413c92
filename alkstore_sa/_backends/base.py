"""The backend interface: one method per queue operation or state transition, assembled
from one module per mechanism. Statements are SQLAlchemy Core expressions compiled once
per backend (dialect + schema); each engine (postgresql.py, sqlite.py) overrides what
differs."""

from __future__ import annotations

from .core import Core
from .gauge_ops import GaugeOps
from .inspect_ops import InspectOps
from .lease_ops import LeaseOps
from .queue_ops import QueueOps
from .schedule_ops import ScheduleOps
from .settings_ops import SettingsOps
from .sql import Executor
from .stream_ops import StreamOps


class Backend(QueueOps, InspectOps, GaugeOps, LeaseOps, ScheduleOps, SettingsOps, StreamOps, Core):
    """Every operation of one engine; the engines subclass it."""


__all__ = ["Backend", "Executor"]
