"""An OpenTelemetry SDK provider with an in-memory exporter, installed once per test process
as the global provider (OpenTelemetry lets a process set it only once), and
``alkstore_sa.tracing`` switched on for each test that asks for ``spans``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from alkstore_sa import tracing

_EXPORTER = InMemorySpanExporter()


def _provider() -> TracerProvider:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return provider


@pytest.fixture(scope="session")
def provider() -> TracerProvider:
    return _provider()


@pytest.fixture
def spans(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """Tracing on, and the exporter that receives this test's finished spans."""
    _EXPORTER.clear()
    tracing.instrument()
    try:
        yield _EXPORTER
    finally:
        tracing.uninstrument()
        _EXPORTER.clear()


@pytest.fixture
def untraced(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """Tracing off (an SDK provider is set: nothing but alkstore's switch keeps spans away)."""
    tracing.uninstrument()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()
