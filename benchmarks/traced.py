"""What tracing costs (SPEC §15, ``alkstore_sa.tracing``): the same library workload with
tracing on and off, interleaved in the same run; the "floor" is the library with tracing
off, so the ratio is traced / untraced throughput.

Tracing on is what a production process would run: an SDK ``TracerProvider`` as the
global provider, with a ``BatchSpanProcessor`` whose exporter drops every batch (so the
cost is the library's spans, the trace context it stores and the SDK's span processing,
not a collector's network). The switch is process-wide: each timed step turns it on (or
off) for itself, so the traced side's enqueues store a trace context and its executions
carry links.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import alkstore_sa as alk
from benchmarks.floor import WORKER, Steps
from benchmarks.many_queues import _Done

if TYPE_CHECKING:
    from benchmarks.workloads import Alk

CONCURRENCY = 8  # the worker's concurrency on both sides
STEP = 400  # jobs per timed step of a running worker (enqueued untimed before it)
POLL_S = 60.0  # re-poll: long, so the wake-ups drive the workers
_provider_lock = threading.Lock()
_provider_set = False


def _ensure_provider() -> None:
    """The global provider: an SDK one with a batch processor exporting to nowhere (set
    once per process; OpenTelemetry refuses a second one)."""
    global _provider_set
    if _provider_set:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )
    except ImportError as exc:  # the dev extra has it
        raise RuntimeError(f"the tracing workloads need opentelemetry-sdk: {exc}") from exc

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    with _provider_lock:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(Dropping()))
            trace.set_tracer_provider(provider)
        _provider_set = True


@contextmanager
def switched(on: bool) -> Iterator[None]:
    """Tracing on (or off) for the block; off after it."""
    from alkstore_sa import tracing

    if on:
        _ensure_provider()
        tracing.instrument()
    else:
        tracing.uninstrument()
    try:
        yield
    finally:
        tracing.uninstrument()


def _queue(alk_side: Alk, traced: bool) -> alk.Queue:
    return alk_side.store.queue("bench-traced" if traced else "bench-untraced")


def enqueue_one(alk_side: Alk, items: Sequence[Any], traced: bool) -> Steps:
    """``q.enqueue`` per job, each in its own transaction."""
    alk_side.reset()
    enqueue = _queue(alk_side, traced).enqueue

    def step(chunk: Sequence[Any]) -> None:
        with switched(traced):
            for p in chunk:
                enqueue(p)

    return Steps(step)


def enqueue_many(alk_side: Alk, items: Sequence[Any], traced: bool, per_tx: int = 1000) -> Steps:
    """``q.enqueue_many`` of 1,000 per transaction (traced: a span per job)."""
    alk_side.reset()
    enqueue_many = _queue(alk_side, traced).enqueue_many

    def step(chunk: Sequence[Any]) -> None:
        with switched(traced):
            for i in range(0, len(chunk), per_tx):
                enqueue_many(chunk[i : i + per_tx])

    return Steps(step)


def drain_worker(alk_side: Alk, items: Sequence[Any], traced: bool) -> Steps:
    """A ``Worker`` (concurrency 8, sync no-op handler) running throughout the repetition
    on its own queue. Each step enqueues its chunk (``enqueue_many``, untimed) and is timed
    from that commit until the handler has run for its last job; in steady state every
    execution's span (opened at hand-over, ended after the ack) is inside the timing, since
    a job's slot is freed only after that."""
    alk_side.reset()
    q = _queue(alk_side, traced)
    done = _Done()
    stop = alk.StopToken()
    worker = alk.Worker(alk_side.store, q, done.handle, concurrency=CONCURRENCY, poll_interval=POLL_S,
                        worker_id=f"{WORKER}-{'traced' if traced else 'untraced'}")
    thread = threading.Thread(target=worker.run, args=(stop,), name=f"bench-traced-{traced}", daemon=True)
    thread.start()

    def run(chunk: Sequence[Any]) -> float:
        target = done.count + len(chunk)
        with switched(traced):
            for i in range(0, len(chunk), 1000):
                q.enqueue_many(chunk[i : i + 1000])
            t0 = time.perf_counter()
            done.wait_for(target)
            return time.perf_counter() - t0

    def close() -> None:
        stop.stop()
        thread.join(60)
        if thread.is_alive():
            raise RuntimeError("traced drain: the worker did not stop")

    run(items[:CONCURRENCY])  # untimed: the worker is up, its threads started
    deadline = time.monotonic() + 60
    while worker.processed < CONCURRENCY:  # their acks landed too: the next prepare empties the table
        if time.monotonic() > deadline:
            raise RuntimeError("traced drain: the warm-up jobs were not acked")
        time.sleep(0.01)
    alk_side.env.settle()
    return Steps(run, close)
