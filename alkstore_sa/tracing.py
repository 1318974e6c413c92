"""OpenTelemetry tracing (SPEC §15), an optional extra: ``pip install 'alkstore-sa[tracing]'``.

After ``instrument()``, spans go to the global tracer provider (``opentelemetry.trace``):

- every enqueue of this process makes a PRODUCER span ``send QUEUE`` around its insert,
  one per job (``enqueue_many`` too), and stores the span's W3C trace context (what the
  global propagator injects: ``traceparent``, ``tracestate``, ...) in the job's row, as
  JSON;
- every execution of a job by a ``Worker`` of this process makes a CONSUMER span
  ``process QUEUE``, current while the handler or task runs (sync or ``async def``, so
  the spans it makes nest under it) and ended once its outcome is recorded. It starts a
  trace of its own and carries a span **link** to the enqueue's context (a retry is a new
  span with the same link); ``process_span`` does the same for code that claims jobs
  itself.

Both carry ``messaging.system="alkstore"``, ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the job id as a string) and ``messaging.operation.type``; the
consumer also ``alkstore.attempt``, ``alkstore.outcome`` and, on a ``Tasks`` worker,
``alkstore.task``. Importing ``alkstore_sa`` never imports this module or OpenTelemetry,
and until ``instrument()`` no span is made and no trace context is stored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import __version__, _tracing
from .errors import InvalidOptions, MissingExtra
from .model import Job
from .queue import JobHandle
from .worker.observe import LOST
from .worker.outcomes import Outcome, text_of

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
except ImportError as exc:
    raise MissingExtra(
        "alkstore_sa.tracing needs opentelemetry-api: pip install 'alkstore-sa[tracing]'"
    ) from exc

log = logging.getLogger("alkstore_sa")

SYSTEM = "alkstore"
_SCOPE = "alkstore_sa"


def instrument() -> None:
    """Trace the enqueues and the worker executions of this process (idempotent)."""
    global _installed
    if not isinstance(_tracing.tracer, _Tracer):
        if _installed is None:
            _installed = _Tracer()
        _tracing.install(_installed)


def uninstrument() -> None:
    """Stop tracing: later enqueues store no trace context and make no span (spans open now
    still end normally)."""
    if isinstance(_tracing.tracer, _Tracer):
        _tracing.install(None)


def is_instrumented() -> bool:
    """Whether ``instrument()`` is in effect in this process."""
    return isinstance(_tracing.tracer, _Tracer)


@contextmanager
def process_span(job: JobHandle | Job) -> Iterator[Span]:
    """A CONSUMER span ``process QUEUE`` for a job claimed by your own code (the ``Worker``
    makes its own), current inside the block and linked to the job's enqueue; an exception
    leaving the block is recorded on it. It is a child of the span current where it is
    opened, if any. Works whether or not ``instrument()`` was called (without it, jobs
    carry no trace context, so the span has no link)::

        h = q.claim_one("w1")
        with alkstore_sa.tracing.process_span(h):
            handle(h.payload)
        h.ack()
    """
    if not isinstance(job, JobHandle | Job):
        raise InvalidOptions(f"process_span(job): job must be a JobHandle or a Job, got {type(job).__name__}")
    # only the job's fields: a payload that cannot be decoded still gets its span
    j = job._described() if isinstance(job, JobHandle) else job
    with _tracer().start_as_current_span(
        f"process {j.queue}", kind=SpanKind.CONSUMER, links=_links(j.trace_context),
        attributes=_consumer_attributes(j),
    ) as span:
        yield span


def link_of(trace_context: str | None) -> Link | None:
    """The link to the enqueue a job's stored ``trace_context`` names (None: no valid one)."""
    if trace_context is not None and not isinstance(trace_context, str):
        raise InvalidOptions(
            f"link_of(trace_context): a Job.trace_context (str or None), got {type(trace_context).__name__}"
        )
    links = _links(trace_context)
    return links[0] if links else None


# -- internals -----------------------------------------------------------------------------

_installed: _Tracer | None = None  # made once: switching on again reuses its tracer


def _tracer() -> trace.Tracer:
    # the global provider's tracer: a proxy until the application sets a provider, so
    # instrument() may be called before or after that
    return trace.get_tracer(_SCOPE, __version__)


def _inject(ctx: otel_context.Context | None = None) -> str | None:
    """The trace context of ``ctx`` (default: the current one) as the global propagator
    writes it, as compact JSON; None when it writes nothing (no valid span, e.g. the
    no-op provider)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


def _links(trace_context: str | None) -> list[Link]:
    if not trace_context:
        return []
    try:
        carrier = json.loads(trace_context)
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth:
        return []  # no flat object of headers either way
    if not isinstance(carrier, dict):
        return []
    # only text headers, as the propagator wrote them: another producer's row (or a damaged
    # one) may hold anything, and a propagator given a non-string value raises
    headers = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    try:
        span_context = trace.get_current_span(propagate.extract(headers)).get_span_context()
    except Exception:  # noqa: BLE001 - a custom propagator's parse error: no link, as for bad JSON
        return []
    return [Link(span_context)] if span_context.is_valid else []


def _untraced(queue: str) -> None:
    log.warning(
        "enqueue into %r: its trace span could not be opened; enqueued untraced", queue, exc_info=True
    )


def _producer_attributes(queue: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
    }


def _consumer_attributes(job: Job) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "messaging.operation.type": "process",
        "alkstore.attempt": job.attempts,
    }


class _Tracer:
    """The installed tracer (``_tracing.Tracer``): makes the spans, reads and writes the
    trace context."""

    def __init__(self) -> None:
        self._tracer = _tracer()

    def send(self, queue: str, params: Mapping[str, Any], run: Callable[[dict[str, Any]], int]) -> int:
        try:
            span = self._tracer.start_span(
                f"send {queue}", kind=SpanKind.PRODUCER, attributes=_producer_attributes(queue)
            )
        except Exception:  # noqa: BLE001 - the application's tracer: the job goes in untraced
            _untraced(queue)
            return run({**params, "trace_context": None})
        with trace.use_span(span, end_on_exit=True):
            try:
                context = _inject()
            except Exception:  # noqa: BLE001 - the application's propagator: as above
                _untraced(queue)
                context = None
            # the id exists only after the insert: the attribute is set then, inside the span
            job_id = run({**params, "trace_context": context})
            span.set_attribute("messaging.message.id", str(job_id))
            return job_id

    def send_many(self, queue: str, count: int, run: Callable[[list[str | None]], list[int]]) -> list[int]:
        # one span per job, siblings under the current span: each job has its own message
        # id and its own producer span for its executions to link to
        attributes = _producer_attributes(queue)
        spans: list[Span] = []
        try:
            for _ in range(count):
                spans.append(self._tracer.start_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes))
            contexts = [_inject(trace.set_span_in_context(s)) for s in spans]
        except Exception:  # noqa: BLE001 - the application's tracer or propagator: untraced
            for s in spans:
                s.end()
            _untraced(queue)
            return run([None] * count)
        try:
            ids = run(contexts)
        except BaseException as exc:
            for s in spans:
                s.record_exception(exc)
                s.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                s.end()
            raise
        for s, job_id in zip(spans, ids, strict=True):
            s.set_attribute("messaging.message.id", str(job_id))
            s.end()
        return ids

    def process(self, job: Job, attributes: Mapping[str, Any]) -> _Execution:
        span = self._tracer.start_span(
            f"process {job.queue}",
            # a trace of its own (the claim loop's context is no parent), linked to the enqueue
            context=otel_context.Context(),
            kind=SpanKind.CONSUMER,
            links=_links(job.trace_context),
            attributes={**_consumer_attributes(job), **attributes},
        )
        return _Execution(span)


class _Execution:
    """One execution's CONSUMER span (``_tracing.ExecutionSpan``)."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def wrap(self, call: Callable[[], Any], is_async: bool) -> Callable[[], Any]:
        span = self.span
        # The exception a handler raises is recorded here, not by use_span: OpenTelemetry's
        # own recording calls str(exc), and an exception whose str() fails would be replaced
        # by that failure, so the job's error would name the wrong exception. The span's
        # status is set by end(), from the outcome.
        if is_async:

            async def in_span(coro: Any) -> Any:
                with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                    try:  # in the job's own asyncio task
                        return await coro
                    except BaseException as exc:
                        _record_exception(span, exc)
                        raise

            return lambda: in_span(call())

        def run() -> Any:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                try:
                    return call()
                except BaseException as exc:
                    _record_exception(span, exc)
                    raise

        return run

    def end(self, outcome: Outcome | None, landing: str | None) -> None:
        span = self.span
        if outcome is None:
            span.set_attribute("alkstore.outcome", "abandoned")
            span.set_status(Status(StatusCode.ERROR, "abandoned: the claim will lapse"))
        elif landing is None:
            span.set_attribute("alkstore.outcome", outcome.kind)
            span.set_status(Status(StatusCode.ERROR, f"{outcome.kind} could not be recorded"))
        else:
            span.set_attribute("alkstore.outcome", landing)  # acked, retried, dead or lost
            if outcome.kind != "ack" or landing == LOST:
                span.set_status(Status(StatusCode.ERROR, outcome.error or f"{outcome.kind}: {landing}"))
        span.end()


def _record_exception(span: Span, exc: BaseException) -> None:
    """The span's ``exception`` event for what the handler raised: OpenTelemetry's own
    recording, else (its str() failed) the type and the worker's text of it."""
    try:
        span.record_exception(exc)
    except Exception:  # noqa: BLE001 - str(exc) raised inside: record what can be read
        span.add_event("exception", {"exception.type": type(exc).__qualname__, "exception.message": text_of(exc)})


__all__ = ["instrument", "is_instrumented", "link_of", "process_span", "uninstrument"]
