"""The worker's hook for metrics: one process-wide observer, None unless something (such
as ``alkstore_sa.metrics.instrument()``) installs one.

The worker tells it when a job starts running and how its outcome landed. With no
observer installed each call site costs one attribute read, so a worker that exports no
metrics pays nothing for them and the worker never imports a metrics library. It is told
about the job's claim handle, not a ``Job``: what a counter needs (the queue, the claim's
wait) is read off the claimed row, and the ``Job`` value is built only by an observer
that asks for ``handle.job``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..queue import JobHandle

log = logging.getLogger("alkstore_sa")

# How a job's outcome landed, as the metrics name it: its ack, a retry (the job runs
# again), a move to dead storage (``fail``, or a retry at the attempt budget), or
# ``lost`` — refused because the worker's claim lapsed, was taken over or the job was
# cancelled before the outcome landed.
ACKED, RETRIED, DEAD, LOST = "acked", "retried", "dead", "lost"


class Observer(Protocol):
    """Told about every job a worker of this process runs."""

    def started(self, claim: JobHandle) -> None:
        """The claimed job (``claim.job``: ``claimed_at`` is this claim's) was handed to
        the runner."""

    def finished(self, claim: JobHandle, outcome: str, duration: float | None) -> None:
        """Its outcome landed as ``outcome`` (ACKED, RETRIED, DEAD or LOST); ``duration``
        is the seconds its handler ran (None when nothing ran: a task this worker lacks)."""


observer: Observer | None = None


def install(new: Observer | None) -> Observer | None:
    """Make ``new`` the process's observer (None: none); return the one it replaces."""
    global observer
    old, observer = observer, new
    return old


def started(claim: JobHandle) -> None:
    """Tell the observer, if any, that the claimed job starts; its errors never reach the worker."""
    obs = observer
    if obs is not None:
        try:
            obs.started(claim)
        except Exception:  # noqa: BLE001 - metrics must not break job processing
            log.exception("the metrics observer failed on job %s", claim.id)


def finished(claim: JobHandle, outcome: str, duration: float | None) -> None:
    """Tell the observer, if any, how the claimed job's outcome landed; its errors never
    reach the worker."""
    obs = observer
    if obs is not None:
        try:
            obs.finished(claim, outcome, duration)
        except Exception:  # noqa: BLE001 - metrics must not break job processing
            log.exception("the metrics observer failed on job %s", claim.id)
