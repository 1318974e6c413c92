"""The hook tracing hangs on: one process-wide tracer, None unless
``alkstore_sa.tracing.instrument()`` installed one.

Every enqueue and every job a worker hands over reads ``tracer`` once (an attribute read);
while it is None nothing else happens: no span, no trace context in the row, the same
statements as an uninstrumented process, and no OpenTelemetry import (this module imports
nothing). The implementation lives in ``alkstore_sa.tracing``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .model import Job
    from .worker.outcomes import Outcome


class ExecutionSpan(Protocol):
    """The span of one execution of a job in a worker, open until its outcome is recorded."""

    def wrap(self, call: Callable[[], Any], is_async: bool) -> Callable[[], Any]:
        """``call`` (the handler or task) with this span current while it runs."""

    def end(self, outcome: Outcome | None, landing: str | None) -> None:
        """End it: ``outcome`` is what the handler called for (None: the job was
        abandoned), ``landing`` how that landed (acked, retried, dead, lost; None: it could
        not be recorded)."""


class Tracer(Protocol):
    """What the library asks of the installed tracer."""

    def send(self, queue: str, params: Mapping[str, Any], run: Callable[[dict[str, Any]], int]) -> int:
        """A PRODUCER span around ``run(params + trace_context)``, which inserts one job."""

    def send_many(self, queue: str, count: int, run: Callable[[list[str | None]], list[int]]) -> list[int]:
        """One PRODUCER span per job around ``run(contexts)``, which inserts ``count`` jobs."""

    def process(self, job: Job, attributes: Mapping[str, Any]) -> ExecutionSpan:
        """Open the CONSUMER span of one execution of ``job`` (linked to its enqueue)."""


tracer: Tracer | None = None


def install(new: Tracer | None) -> Tracer | None:
    """Make ``new`` the process's tracer (None: none); return the one it replaces."""
    global tracer
    old, tracer = tracer, new
    return old
