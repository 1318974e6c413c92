"""A traced Worker in a process of its own, for the cross-process test:

    python -m tests.tracing.traced_worker URL SCHEMA QUEUE OUT_JSON

It installs its own SDK provider with an in-memory exporter, runs a burst Worker on QUEUE
(a job whose payload is ``"flaky"`` raises on its first attempt; ``"doomed"`` always
fails), and writes every finished span to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import alkstore_sa as alk
from alkstore_sa import tracing


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """What the test reads of a span, in plain JSON (ids as hex, like a traceparent)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [{"trace_id": f"{lk.context.trace_id:032x}", "span_id": f"{lk.context.span_id:016x}"} for lk in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


def handler(job: alk.Job) -> None:
    with trace.get_tracer("tests").start_as_current_span("handler work"):
        if job.payload == "doomed" or (job.payload == "flaky" and job.attempts == 1):
            raise RuntimeError(f"{job.payload} attempt {job.attempts}")


def main(url: str, schema: str, queue: str, out: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracing.instrument()
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema)
    try:
        alk.Worker(store, queue, handler, poll_interval=0.2).run(burst=True)
    finally:
        store.close()
        engine.dispose()
    provider.force_flush()
    with open(out, "w") as f:
        json.dump([span_dict(s) for s in exporter.get_finished_spans()], f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
