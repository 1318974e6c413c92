"""The backend interface: one method per queue operation or state transition, assembled
from one module per mechanism. Statements are SQLAlchemy Core expressions compiled once
per backend (dialect + schema); each engine (postgresql.py, sqlite.py) overrides what
differs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .browse_ops import BrowseOps
from .core import Core
from .gauge_ops import GaugeOps
from .inspect_ops import InspectOps
from .lease_ops import LeaseOps
from .queue_ops import QueueOps, Turn, claim_in_turn
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

    # Whether a worker writes each batch of acks in the transaction of the claim that
    # follows it (``ack_and_claim_turns``) rather than as a statement of its own: SQLite
    # (one writer-lock hold and one commit instead of two) and PostgreSQL (pipelined: one
    # round trip and one commit instead of two).
    acks_ride_claims = False

    def ack_and_claim_turns(
        self, ex: Executor, acks: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], budget: int
    ) -> tuple[list[tuple[int, int]], list[Turn]]:
        """``ack_claims``, then claims in turns (``claim_in_turn``), in one transaction:
        both land or neither does."""
        with ex.transaction():
            landed = self.ack_claims(ex, acks)
            return landed, self._turns_in(ex, turns, budget)

    def _turns_in(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        """``claim_in_turn`` with the guarded claim, on ``ex`` as it is (in a transaction or
        not)."""
        return claim_in_turn(
            turns, budget, lambda p: self.claim(ex, p), lambda p: self.queue_settings_get(ex, p) is not None
        )


__all__ = ["Backend", "Executor"]
