"""OpenTelemetry tracing (SPEC §15): PRODUCER spans ``send QUEUE`` on every enqueue path,
the trace context stored in the job row (and kept through dead storage and requeue),
CONSUMER spans ``process QUEUE`` per execution carrying a link to the producer, across
processes; and nothing at all while tracing is off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa import tracing
from alkstore_sa.scheduler import Scheduler
from alkstore_sa.worker import acker
from tests.support import PG_URL, FakeClock, Target

ROOT = Path(__file__).resolve().parents[2]


# -- helpers -------------------------------------------------------------------------------


def ids_of(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def stored(job: alk.Job | None) -> tuple[str, str]:
    """(trace id, span id) of the traceparent a job carries."""
    assert job is not None and job.trace_context is not None
    _, trace_id, span_id, _ = json.loads(job.trace_context)["traceparent"].split("-")
    return trace_id, span_id


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def by_message(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})["messaging.message.id"]): s for s in spans}


def assert_producer(span: ReadableSpan, queue: str, job_id: int) -> None:
    assert span.name == f"send {queue}" and span.kind is SpanKind.PRODUCER
    assert dict(span.attributes or {}) == {
        "messaging.system": "alkstore",
        "messaging.destination.name": queue,
        "messaging.message.id": str(job_id),
        "messaging.operation.type": "send",
    }


def linked_to(span: ReadableSpan) -> list[tuple[str, str]]:
    return [(f"{lk.context.trace_id:032x}", f"{lk.context.span_id:016x}") for lk in span.links]


def run_burst(store: alk.Store, queue: str, handler: Any) -> None:
    alk.Worker(store, queue, handler, poll_interval=0.1).run(burst=True)


# -- producer side -------------------------------------------------------------------------


def test_enqueue_makes_a_producer_span_and_stores_its_context(
    spans: InMemorySpanExporter, store: alk.Store, qname: str
) -> None:
    job_id = store.queue(qname).enqueue({"x": 1})
    (span,) = spans.get_finished_spans()
    assert_producer(span, qname, job_id)
    assert stored(store.get_job(job_id)) == ids_of(span)


def test_enqueue_many_makes_one_span_per_job(spans: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    ids = store.queue(qname).enqueue_many(["a", "b", "c"])
    sent = by_message(named(spans, f"send {qname}"))
    assert sorted(sent) == sorted(str(i) for i in ids)
    for job_id in ids:
        assert_producer(sent[str(job_id)], qname, job_id)
        assert stored(store.get_job(job_id)) == ids_of(sent[str(job_id)])
    assert len({ids_of(s)[1] for s in sent.values()}) == 3


def test_enqueue_nests_under_the_current_span(
    spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str
) -> None:
    """The caller's-transaction forms, Task.enqueue (both targets) and the outbox: each job
    gets a span that is a child of the span current at the call."""
    tasks = alk.Tasks()

    @tasks.task(queue=qname)
    def work(n: int) -> None: ...

    with trace.get_tracer("tests").start_as_current_span("request") as request:
        with Session(db.engine) as session, session.begin():
            ids = [alk.enqueue(session, qname, 1)]
            ids += alk.enqueue_many(session, store.queue(qname), [2, 3])
            ids.append(work.enqueue(session, 4))
            outbox_id = alk.outbox_enqueue(session, "billing", {"n": 5})
        ids.append(work.enqueue(store, 6))
        ids.append(store.queue(qname).enqueue(7, unique_key="k"))
    parent = request.get_span_context().span_id
    sent = by_message(named(spans, f"send {qname}"))
    assert sorted(sent) == sorted(str(i) for i in ids)
    for job_id in ids:
        span = sent[str(job_id)]
        assert span.parent is not None and span.parent.span_id == parent
        assert stored(store.get_job(job_id)) == ids_of(span)
    (outbox_span,) = [s for s in spans.get_finished_spans() if s.name.startswith("send ") and "billing" in s.name]
    assert stored(store.get_job(outbox_id)) == ids_of(outbox_span)


def test_a_held_unique_key_writes_nothing(spans: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    first = q.enqueue("a", unique_key="k")
    assert q.enqueue("b", unique_key="k") == first
    holder = store.get_job(first)
    first_span = by_message(named(spans, f"send {qname}"))
    assert stored(holder) == ids_of(spans.get_finished_spans()[0])
    assert list(first_span) == [str(first)]  # the second span names the holder it found
    assert q.stats().pending == 1


def test_async_enqueue_nests_under_the_callers_span(spans: InMemorySpanExporter, db: Target, qname: str) -> None:
    url = (
        sa.make_url(db.url).set(drivername="sqlite+aiosqlite")
        if db.kind == "sqlite"
        else sa.make_url(PG_URL).set(drivername="postgresql+asyncpg")
    )
    store = db.store()

    async def scenario() -> list[int]:
        engine = create_async_engine(url)
        store.register(engine)
        try:
            with trace.get_tracer("tests").start_as_current_span("handler"):
                async with AsyncSession(engine) as session, session.begin():
                    return [await alk.aenqueue(session, qname, 1), *await alk.aenqueue_many(session, qname, [2])]
        finally:
            await engine.dispose()

    try:
        ids = asyncio.run(scenario())
        (outer,) = named(spans, "handler")
        sent = by_message(named(spans, f"send {qname}"))
        for job_id in ids:
            assert sent[str(job_id)].parent is not None
            assert sent[str(job_id)].parent.span_id == outer.get_span_context().span_id
            assert stored(store.get_job(job_id)) == ids_of(sent[str(job_id)])
    finally:
        store.close()


def test_rolled_back_enqueue_leaves_no_job(spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str) -> None:
    with Session(db.engine) as session:
        job_id = alk.enqueue(session, qname, "never")
        session.rollback()
    assert store.get_job(job_id) is None
    assert [s.name for s in spans.get_finished_spans()] == [f"send {qname}"]  # made, harmless


def test_a_failed_enqueue_records_the_error(spans: InMemorySpanExporter, sqlite_db: Target) -> None:
    sqlite_db.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON alkstore_jobs BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    store = sqlite_db.store()
    try:
        with pytest.raises(alk.DatabaseError):
            store.queue("q").enqueue(1)
        with pytest.raises(alk.DatabaseError):
            store.queue("q").enqueue_many([1, 2])
    finally:
        store.close()
    failed = named(spans, "send q")
    assert len(failed) == 3
    for span in failed:
        assert span.status.status_code is StatusCode.ERROR and "refused" in (span.status.description or "")
        assert [e.name for e in span.events] == ["exception"]
        assert "messaging.message.id" not in (span.attributes or {})


def test_schedule_fires_are_traced_as_new_traces(
    spans: InMemorySpanExporter, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """A fire has no caller: its span starts a trace, and the jobs link to it."""
    store.schedule("tick", "@every 10s", qname, {"n": 1})
    sch = Scheduler(store)
    sch.tick()
    clock.advance(20)
    assert sch.tick() == 2
    sent = named(spans, f"send {qname}")
    assert len(sent) == 2 and all(s.parent is None for s in sent)
    for job_id, span in by_message(sent).items():
        assert stored(store.get_job(int(job_id))) == ids_of(span)


# -- tracing off ---------------------------------------------------------------------------


def test_off_stores_nothing_and_makes_no_span(untraced: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    q = store.queue(qname, backoff_base=0)
    ids = [q.enqueue(1), *q.enqueue_many([2, 3]), q.enqueue(4, unique_key="k")]
    run_burst(store, qname, lambda job: None)
    assert untraced.get_finished_spans() == ()
    assert q.stats().pending == 0
    assert all(j is None or j.trace_context is None for j in map(store.get_job, ids))
    assert not any(key.endswith(":traced") for key in store.backend._sql)


def test_off_stores_null_in_the_row(untraced: InMemorySpanExporter, db: Target, store: alk.Store, qname: str) -> None:
    job_id = store.queue(qname).enqueue(1)
    assert db.scalar(f"SELECT trace_context FROM {db.table('alkstore_jobs')} WHERE id = :i", i=job_id) is None


def test_importing_and_running_untraced_never_imports_opentelemetry(db: Target, qname: str) -> None:
    code = (
        "import sys, sqlalchemy as sa, alkstore_sa as alk\n"
        f"store = alk.Store(sa.create_engine({db.url!r}), schema={db.schema!r})\n"
        f"q = store.queue({qname!r}); q.enqueue(1); q.enqueue_many([2])\n"
        f"alk.Worker(store, {qname!r}, lambda job: None, poll_interval=0.1).run(burst=True)\n"
        "assert q.stats().pending == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_opentelemetry_the_import_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "try:\n    import alkstore_sa.tracing\n"
        "except ImportError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MissingExtra ") and "alkstore-sa[tracing]" in out.stdout, out.stdout


def test_instrument_is_idempotent(spans: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    tracing.instrument()
    tracing.instrument()
    store.queue(qname).enqueue(1)
    assert len(spans.get_finished_spans()) == 1
    tracing.uninstrument()
    assert not tracing.is_instrumented()
    store.queue(qname).enqueue(2)
    assert len(spans.get_finished_spans()) == 1


# -- consumer side -------------------------------------------------------------------------


class _Unprintable(Exception):
    """An exception whose str() itself fails (an API error formatting a missing response)."""

    def __str__(self) -> str:
        raise AttributeError("'NoneType' object has no attribute 'status'")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_traced_job_raising_an_exception_whose_str_fails_records_that_exception(
    spans: InMemorySpanExporter, store: alk.Store, qname: str, kind: str
) -> None:
    """OpenTelemetry's own recording of a raised exception calls str() on it: that failure
    must not replace the job's exception (its error would name the AttributeError)."""
    q = store.queue(qname, backoff_base=0, max_attempts=1)
    job_id = q.enqueue("x")

    def sync_handler(job: alk.Job) -> None:
        raise _Unprintable()

    async def async_handler(job: alk.Job) -> None:
        raise _Unprintable()

    run_burst(store, qname, sync_handler if kind == "sync" else async_handler)
    dead = store.get_job(job_id)
    assert dead is not None and dead.state == "dead"
    assert "_Unprintable" in (dead.errors[-1]["error"] if dead.errors else "")
    assert "NoneType" not in repr(dead.errors)
    (span,) = named(spans, f"process {qname}")
    (event,) = [e for e in span.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"].endswith("_Unprintable")


def test_worker_span_links_to_the_producer_and_retries_link_again(
    spans: InMemorySpanExporter, store: alk.Store, qname: str
) -> None:
    q = store.queue(qname, backoff_base=0, max_attempts=3)
    ok, flaky = q.enqueue("ok"), q.enqueue("flaky")
    sent = by_message(named(spans, f"send {qname}"))

    def handler(job: alk.Job) -> None:
        with trace.get_tracer("tests").start_as_current_span("inside"):
            if job.payload == "flaky" and job.attempts == 1:
                raise RuntimeError("first try fails")

    run_burst(store, qname, handler)
    processed = named(spans, f"process {qname}")
    assert len(processed) == 3
    runs: dict[str, list[ReadableSpan]] = {}
    for span in processed:
        runs.setdefault(str((span.attributes or {})["messaging.message.id"]), []).append(span)
    for job_id, executions in runs.items():
        producer = ids_of(sent[job_id])
        for span in executions:
            attrs = dict(span.attributes or {})
            assert span.kind is SpanKind.CONSUMER
            assert attrs["messaging.system"] == "alkstore"
            assert attrs["messaging.destination.name"] == qname
            assert linked_to(span) == [producer]
            assert span.parent is None and ids_of(span)[0] != producer[0]  # a trace of its own
    (done,) = runs[str(ok)]
    assert done.attributes["alkstore.attempt"] == 1 and done.attributes["alkstore.outcome"] == "acked"
    assert done.status.status_code is StatusCode.UNSET
    first, second = sorted(runs[str(flaky)], key=lambda s: s.attributes["alkstore.attempt"])
    assert (first.attributes["alkstore.attempt"], first.attributes["alkstore.outcome"]) == (1, "retried")
    assert first.status.status_code is StatusCode.ERROR and first.status.description == "first try fails"
    assert any(e.name == "exception" for e in first.events)
    assert (second.attributes["alkstore.attempt"], second.attributes["alkstore.outcome"]) == (2, "acked")
    # the handler's own spans nest under the execution's span
    inside = named(spans, "inside")
    assert sorted(s.parent.span_id for s in inside if s.parent) == sorted(s.get_span_context().span_id for s in processed)


def test_async_task_runs_inside_its_span(spans: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    tasks = alk.Tasks()
    seen: list[int] = []

    @tasks.task(queue=qname)
    async def work(n: int) -> None:
        await asyncio.sleep(0)
        with trace.get_tracer("tests").start_as_current_span("async inside"):
            seen.append(n)

    job_id = work.enqueue(store, 1)
    alk.Worker(store, tasks, poll_interval=0.1).run(burst=True)
    assert seen == [1]
    (span,) = named(spans, f"process {qname}")
    assert span.attributes["alkstore.task"] == work.name and span.attributes["messaging.message.id"] == str(job_id)
    assert linked_to(span) == [ids_of(by_message(named(spans, f"send {qname}"))[str(job_id)])]
    (inside,) = named(spans, "async inside")
    assert inside.parent is not None and inside.parent.span_id == span.get_span_context().span_id


def test_dead_job_keeps_its_context_and_a_requeue_links_to_the_original(
    spans: InMemorySpanExporter, store: alk.Store, qname: str
) -> None:
    q = store.queue(qname, max_attempts=1)
    job_id = q.enqueue("doomed")
    (producer,) = named(spans, f"send {qname}")

    def fail(job: alk.Job) -> None:
        raise alk.Fail("no")

    run_burst(store, qname, fail)
    dead = store.get_job(job_id)
    assert dead is not None and dead.state == "dead" and stored(dead) == ids_of(producer)
    (died,) = named(spans, f"process {qname}")
    assert died.attributes["alkstore.outcome"] == "dead" and died.status.status_code is StatusCode.ERROR
    spans.clear()
    again = q.requeue_dead(job_id)
    assert again is not None and stored(store.get_job(again)) == ids_of(producer)
    assert spans.get_finished_spans() == ()  # a requeue makes no span of its own
    run_burst(store, qname, lambda job: None)
    (rerun,) = named(spans, f"process {qname}")
    assert linked_to(rerun) == [ids_of(producer)] and rerun.attributes["alkstore.outcome"] == "acked"


def test_reclaim_exhaustion_and_expiry_keep_the_context_in_dead_storage(
    spans: InMemorySpanExporter, store: alk.Store, clock: FakeClock, qname: str
) -> None:
    """A claim that buries a lapsed job at its attempt budget, and the expiry sweep, copy
    the context too."""
    q = store.queue(qname, max_attempts=1, visibility_timeout=5)
    job_id = q.enqueue("lapses")
    (producer,) = named(spans, f"send {qname}")
    assert q.claim_one("w") is not None
    clock.advance(10)
    assert q.claim_one("w") is None  # buries it
    dead = store.get_job(job_id)
    assert dead is not None and dead.state == "dead" and stored(dead) == ids_of(producer)
    expiring = q.enqueue("expires", expires=5)
    clock.advance(6)
    assert q.sweep_expired().expired == 1
    swept = store.get_job(expiring)
    assert swept is not None and swept.state == "dead" and swept.trace_context is not None
    assert stored(swept) == ids_of(by_message(named(spans, f"send {qname}"))[str(expiring)])


def test_process_span_for_your_own_claims(spans: InMemorySpanExporter, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    job_id = q.enqueue(1)
    h = q.claim_one("w")
    assert h is not None
    with pytest.raises(RuntimeError), tracing.process_span(h):
        raise RuntimeError("handler broke")
    (span,) = named(spans, f"process {qname}")
    assert span.kind is SpanKind.CONSUMER and span.status.status_code is StatusCode.ERROR
    assert span.attributes["messaging.message.id"] == str(job_id) and span.attributes["alkstore.attempt"] == 1
    assert linked_to(span) == [ids_of(named(spans, f"send {qname}")[0])]


def test_process_span_of_a_claim_whose_stored_payload_is_not_json(
    spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str
) -> None:
    """``process_span(h)`` for a claimed job whose payload text is not JSON (a row edited
    by hand) raised PayloadError before any span, so the code failing that job could not
    trace it (the worker's own span of such a job is made: see above). The span is made,
    linked to the enqueue; reading ``h.payload`` inside it still raises."""
    q = store.queue(qname)
    job_id = q.enqueue({"a": 1})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET payload = '{{oops' WHERE id = :i", i=job_id)
    h = q.claim_one("w")
    assert h is not None
    with pytest.raises(alk.PayloadError), tracing.process_span(h):
        h.payload  # noqa: B018 - the read that fails
    (span,) = named(spans, f"process {qname}")
    assert span.attributes["messaging.message.id"] == str(job_id) and span.status.status_code is StatusCode.ERROR
    assert linked_to(span) == [ids_of(named(spans, f"send {qname}")[0])]


def test_untraced_jobs_get_spans_without_links(
    provider: Any, spans: InMemorySpanExporter, store: alk.Store, qname: str
) -> None:
    tracing.uninstrument()
    job_id = store.queue(qname).enqueue(1)  # enqueued before tracing was on
    tracing.instrument()
    run_burst(store, qname, lambda job: None)
    (span,) = named(spans, f"process {qname}")
    assert span.links == () and span.attributes["messaging.message.id"] == str(job_id)


BAD_CONTEXTS = [
    '{"traceparent": 5}', '{"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}',
    '{"traceparent": {"a": 1}}', '{"tracestate": 7, "traceparent": "00-x"}', '{"traceparent": true}',
    "not json", "[1, 2]", "null", '"str"', "{}", '{"traceparent": "00-zz-zz-01"}', '{"traceparent": null}',
    # nested deeper than json's decoder recurses (RecursionError, no ValueError)
    '{"traceparent": "00-x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
]


@pytest.mark.parametrize("bad", BAD_CONTEXTS)
def test_a_malformed_stored_context_is_no_link_and_never_stops_the_worker(
    spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str, bad: str
) -> None:
    """A row's ``trace_context`` written by another producer (or damaged) is best effort:
    no link, the job and the jobs claimed with it run (a non-string ``traceparent`` raised
    ``TypeError`` in the propagator, which ended the worker and stranded its claims)."""
    q = store.queue(qname)
    broken, fine = q.enqueue(1), q.enqueue(2)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET trace_context = :ctx WHERE id = :i", ctx=bad, i=broken)
    assert tracing.link_of(bad) is None
    ran: list[int] = []
    run_burst(store, qname, lambda job: ran.append(job.id))
    assert sorted(ran) == [broken, fine]
    assert q.stats().pending == 0
    processed = by_message(named(spans, f"process {qname}"))
    assert processed[str(broken)].links == ()
    assert len(processed[str(fine)].links) == 1


def test_a_job_whose_stored_payload_is_not_json_is_traced_failing(
    spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose payload text is not JSON (a row edited by hand) is failed by the worker;
    its execution has its CONSUMER span, linked to its enqueue, ending in error. Opening
    the span decoded the payload, so the job went untraced, and the log blamed the tracer
    ("its trace span could not be opened", with a traceback)."""
    q = store.queue(qname)
    job_id = q.enqueue({"a": 1})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET payload = '{{oops' WHERE id = :i", i=job_id)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        run_burst(store, qname, lambda job: None)
    assert q.stats().dead == 1
    assert not [r for r in caplog.records if "trace span" in r.getMessage()]
    (span,) = named(spans, f"process {qname}")
    assert (span.attributes or {})["messaging.message.id"] == str(job_id)
    assert (span.attributes or {})["alkstore.outcome"] == "dead" and span.status.status_code is StatusCode.ERROR
    assert linked_to(span) == [ids_of(named(spans, f"send {qname}")[0])]


class _BrokenTracer:
    """An application's tracer that fails to start spans (a misconfigured SDK)."""

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter misconfigured")


def test_a_span_that_cannot_be_opened_leaves_the_job_untraced_not_stranded(
    spans: InMemorySpanExporter, store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = store.queue(qname)
    ids = q.enqueue_many([1, 2, 3])
    installed = tracing._installed
    assert installed is not None
    monkeypatch.setattr(installed, "_tracer", _BrokenTracer())
    ran: list[int] = []
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        run_burst(store, qname, lambda job: ran.append(job.id))
    assert sorted(ran) == ids and q.stats().pending == 0
    assert caplog.text.count("its trace span could not be opened; it runs untraced") == 3


class _EndFailsOnce:
    """An application's tracer whose first execution span to end raises in ``end()`` (a
    span processor of its SDK failing once): every other span ends as usual."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._failed = threading.Lock()  # taken by the one end() that raises

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        span = self._tracer.start_span(*args, **kwargs)
        if kwargs.get("kind") is SpanKind.CONSUMER:
            end = span.end

            def end_fails_once(*a: Any, **kw: Any) -> None:
                if self._failed.acquire(blocking=False):
                    raise RuntimeError("span processor failed")
                end(*a, **kw)

            span.end = end_fails_once
        return span


def test_a_span_whose_end_raises_costs_no_other_job_of_its_ack_batch_its_span(
    spans: InMemorySpanExporter, store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The acks of jobs finishing together land in one statement and are recorded together:
    one job's span whose ``end()`` raises is that job's loss alone (logged), as when each
    ack was recorded on its own — the other jobs of the batch still end their spans (and
    tell the claimer they finished, just before)."""
    monkeypatch.setattr(acker, "MAX_DELAY", 60.0)  # one batch: written once every job in flight waits
    q = store.queue(qname)
    ids = q.enqueue_many([1, 2, 3])
    installed = tracing._installed
    assert installed is not None
    monkeypatch.setattr(installed, "_tracer", _EndFailsOnce(installed._tracer))
    worker = alk.Worker(store, qname, lambda job: None, concurrency=3, poll_interval=0.1)
    with caplog.at_level(logging.ERROR, logger="alkstore_sa"):
        worker.run(burst=True)
    assert q.stats().pending == 0 and worker.processed == 3
    processed = named(spans, f"process {qname}")
    assert len(processed) == 2, f"{len(processed)} of the 2 other jobs' spans ended"
    assert {s.attributes["alkstore.outcome"] for s in processed} == {"acked"}
    assert set(by_message(processed)) < {str(i) for i in ids}
    assert caplog.text.count("recording its ack failed unexpectedly") == 1


class _BrokenProducerTracer(_BrokenTracer):
    """The same, for every way a span is started."""

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("exporter misconfigured")


class _BrokenPropagator:
    """An application's propagator that fails to write a context (a buggy custom one)."""

    fields: set[str] = set()

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        raise RuntimeError("propagator broken")

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        return context


@pytest.mark.parametrize("broken", ["tracer", "propagator"])
def test_an_enqueue_whose_span_cannot_be_opened_enqueues_untraced(
    spans: InMemorySpanExporter, db: Target, store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, broken: str,
) -> None:
    """An application tracer that cannot start spans, or a propagator that cannot write the
    context, made every enqueue raise its error (a RuntimeError, no AlkstoreError) and
    write no job: tracing kept jobs from being enqueued at all. The jobs are enqueued
    untraced (no stored context), with a WARNING per call, as the worker runs a job whose
    span it cannot open."""
    from opentelemetry import propagate

    installed = tracing._installed
    assert installed is not None
    if broken == "tracer":
        monkeypatch.setattr(installed, "_tracer", _BrokenProducerTracer())
    else:
        monkeypatch.setattr(propagate, "get_global_textmap", lambda: _BrokenPropagator())
    q = store.queue(qname)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        one = q.enqueue(1)
        keyed = q.enqueue(2, unique_key="k")
        assert q.enqueue(3, unique_key="k") == keyed
        many = q.enqueue_many([4, 5])
        with Session(db.engine) as session, session.begin():
            mine = alk.enqueue(session, q, 6)
    ids = [one, keyed, *many, mine]
    assert [j.trace_context for j in map(q.get_job, ids)] == [None] * len(ids)  # type: ignore[union-attr]
    assert caplog.text.count("could not be opened; enqueued untraced") == 5
    run_burst(store, qname, lambda job: None)
    assert q.stats().pending == 0


# -- across processes ----------------------------------------------------------------------


def test_a_worker_in_another_process_links_to_this_process_producer(
    spans: InMemorySpanExporter, db: Target, dbstore: alk.Store, qname: str, tmp_path: Path
) -> None:
    """The trace context travels in the row: a Worker in a subprocess, with its own
    provider and exporter, links each execution to the producer span made here."""
    q = dbstore.queue(qname, backoff_base=0, max_attempts=3)
    with trace.get_tracer("tests").start_as_current_span("request"):
        ok, flaky = q.enqueue("ok"), q.enqueue("flaky")
    sent = by_message(named(spans, f"send {qname}"))
    out = tmp_path / "spans.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.tracing.traced_worker", db.url, db.schema, qname, str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    remote = [s for s in json.loads(out.read_text()) if s["name"] == f"process {qname}"]
    runs: dict[str, list[dict[str, Any]]] = {}
    for s in remote:
        runs.setdefault(s["attributes"]["messaging.message.id"], []).append(s)
    assert sorted(runs) == sorted([str(ok), str(flaky)])
    assert [len(runs[str(ok)]), len(runs[str(flaky)])] == [1, 2]
    for job_id, executions in runs.items():
        trace_id, span_id = ids_of(sent[job_id])
        for s in executions:
            assert s["kind"] == "CONSUMER" and s["parent"] is None and s["trace_id"] != trace_id
            assert s["links"] == [{"trace_id": trace_id, "span_id": span_id}]
            assert s["attributes"]["messaging.system"] == "alkstore"
            assert s["attributes"]["messaging.destination.name"] == qname
    attempts = sorted((s["attributes"]["alkstore.attempt"], s["attributes"]["alkstore.outcome"], s["status"]) for s in runs[str(flaky)])
    assert attempts == [(1, "retried", "ERROR"), (2, "acked", "UNSET")]
    assert q.stats().pending == 0


@pytest.mark.parametrize("bad", ["a job id", 42, None], ids=["str", "int", "none"])
def test_process_span_of_something_else_than_a_job_is_refused(spans: InMemorySpanExporter, bad: object) -> None:
    """``process_span(job.id)`` (or a payload) raised AttributeError from inside the
    library; it is InvalidOptions naming what it takes, and no span is made."""
    with pytest.raises(alk.InvalidOptions, match="JobHandle or a Job"), tracing.process_span(bad):  # type: ignore[arg-type]
        pass
    assert spans.get_finished_spans() == ()


@pytest.mark.parametrize("bad", [42, b'{"traceparent": "x"}', {"traceparent": "x"}], ids=["int", "bytes", "dict"])
def test_link_of_something_else_than_a_stored_context_is_refused(bad: object) -> None:
    """``link_of`` takes what ``Job.trace_context`` holds (a str or None): anything else was
    a TypeError from json; it is InvalidOptions. A str that names no valid context stays a
    best-effort None."""
    with pytest.raises(alk.InvalidOptions, match="trace_context"):
        tracing.link_of(bad)  # type: ignore[arg-type]
    assert tracing.link_of("not json") is None and tracing.link_of(None) is None
