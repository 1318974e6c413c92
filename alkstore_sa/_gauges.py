"""Internal: the per-queue gauges a metrics scrape reports (SPEC §15), read in one statement.

Kept apart from ``metrics`` (which needs ``prometheus_client``) so the reading itself is
plain library code: tested, and run by the every-operation checks, on any install.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._rows import in_calendar
from .model import QueueStats

if TYPE_CHECKING:
    from .store import Store


@dataclass(frozen=True)
class QueueGauges:
    """One queue's jobs by state at one instant, and the age in seconds of its oldest ready
    job (0.0 when none is ready). ``ready`` and ``scheduled`` leave out expired jobs that
    wait for the sweep."""

    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    dead: int = 0
    oldest_ready_age: float = 0.0

    def as_stats(self) -> QueueStats:
        """The same counts as a ``QueueStats`` (``alkstore status``): ``pending`` is ready
        plus scheduled, so it too leaves out the expired jobs; no age when none is ready."""
        return QueueStats(
            pending=self.ready + self.scheduled, ready=self.ready, processing=self.processing,
            dead=self.dead, oldest_ready_age=self.oldest_ready_age if self.ready else None,
        )


def read_gauges(store: Store) -> dict[str, QueueGauges]:
    """Every queue with live or dead jobs, by name, from ONE statement on the store's clock."""
    with store.executor(retry=True) as ex:  # a read
        now, rows = store.backend.gauges(ex, {"now": store.now()})
    counts: dict[str, list[int]] = {}
    oldest: dict[str, float] = {}
    # a queue comes in up to three rows (pending, processing, dead indexes): add them up
    for queue, *numbers, first_run_at in rows:
        c = counts.setdefault(queue, [0, 0, 0, 0])
        for i, n in enumerate(numbers):
            c[i] += int(n)
        if first_run_at is not None:
            oldest[queue] = in_calendar(float(first_run_at))  # a hand-written -inf: still an age
    result: dict[str, QueueGauges] = {}
    for queue in sorted(counts):
        ready, scheduled, processing, dead = counts[queue]
        age = max(0.0, now - oldest[queue]) if queue in oldest else 0.0
        result[queue] = QueueGauges(ready, scheduled, processing, dead, age)
    return result
