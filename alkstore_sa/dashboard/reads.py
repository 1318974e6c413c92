"""What the dashboard reads from a store: the queue overview (the metrics gauges' one
statement plus the settings table), keyset pages of jobs, stream consumers. Each read is
bounded: a page is at most ``PAGE`` rows, never an OFFSET."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import _validate as v
from .._gauges import QueueGauges, read_gauges
from .._rows import FIELD, job_from_row, ts
from ..model import Job, QueueSettings
from ..outbox import listed_queue_name
from ..store import Store
from .html import PREVIEW

PAGE = 50
# the characters of each payload a list reads: one more than it shows says the text goes on
LISTED = PREVIEW + 1
STATES = ("ready", "scheduled", "processing", "dead")


@dataclass(frozen=True)
class QueueRow:
    """One line of the queues page."""

    name: str
    gauges: QueueGauges
    settings: QueueSettings

    def as_json(self) -> dict[str, Any]:
        g, s = self.gauges, self.settings
        return {
            "ready": g.ready, "scheduled": g.scheduled, "processing": g.processing, "dead": g.dead,
            "oldest_ready_age": g.oldest_ready_age, "paused": s.paused, "concurrency": s.concurrency,
            "rate_limit": s.rate_limit, "rate_per": s.rate_per,
        }


def queue_rows(store: Store) -> list[QueueRow]:
    """Every queue with jobs (live or dead) or settings, by name: one grouped statement over
    the indexes (the metrics gauges) and one read of the small settings table."""
    gauges = read_gauges(store)
    settings = store.queue_settings()
    return [
        QueueRow(name, gauges.get(name, QueueGauges()), settings.get(name, QueueSettings()))
        for name in sorted(set(gauges) | set(settings))
    ]


@dataclass(frozen=True)
class Page:
    """Jobs of one page, without their payloads decoded (``payload`` None), the start of
    each one's payload as stored (``payloads``, in the same order: at most LISTED
    characters, which the database cuts), and the query parameters of the next page
    (None: this is the last). A list shows the start of each stored text: no payload is
    read whole, decoded or encoded again for it, and one that is not JSON (a row written
    or edited by hand) is listed as it is."""

    jobs: list[Job]
    payloads: list[str]
    next_query: dict[str, object] | None


def _page(rows: list[tuple[Any, ...]], limit: int, key: Callable[[tuple[Any, ...]], dict[str, object]]) -> Page:
    shown = rows[:limit]
    return Page(
        [job_from_row(r, None) for r in shown],
        [r[FIELD["payload"]][:LISTED] for r in shown],  # the database's cut may hold more
        key(rows[limit - 1]) if len(rows) > limit else None,
    )


def stored_job(store: Store, job_id: int) -> tuple[Job, str] | None:
    """The job with this id, live or dead, without its payload decoded (``payload``
    None), and its payload as stored; None when there is none. What the job page and the
    actions read: a payload that is not JSON must not keep them from a job."""
    row = store._job_row(job_id)
    return None if row is None else (job_from_row(row, None), row[FIELD["payload"]])


def _by_id(row: tuple[Any, ...]) -> dict[str, object]:
    return {"after": row[0]}


def _by_claim_order(row: tuple[Any, ...]) -> dict[str, object]:
    # run_at exactly as stored (repr round-trips a float): the next page starts right after it
    return {"priority": row[FIELD["priority"]], "run_at": repr(float(row[FIELD["run_at"]])), "after": row[0]}


def _bound(key: int | None, default: int) -> int:
    return default if key is None else max(min(key, v.INT64_MAX), v.INT64_MIN)


@dataclass(frozen=True)
class Cursor:
    """Where a page of a queue's jobs starts: after the job ``after`` (its ``priority`` and
    ``run_at`` too for the claim-ordered ready and scheduled pages). All None: the start."""

    after: int | None = None
    priority: int | None = None
    run_at: float | None = None


def jobs_page(store: Store, queue: str, state: str, cursor: Cursor = Cursor(), limit: int = PAGE) -> Page:
    """Jobs of ``queue`` in ``state``: ready and scheduled ones in claim order (priority,
    then run_at, then id), processing and dead ones by id; the page after ``cursor``."""
    store._check_open()
    queue = listed_queue_name(queue)  # an outbox's backing queue is listed too
    params: dict[str, Any] = {
        "queue": queue, "after": _bound(cursor.after, 0), "limit": limit + 1, "now": store.now(), "preview": LISTED,
    }
    resume = cursor.after is not None
    if state in ("ready", "scheduled") and resume:
        priority, run_at = cursor.priority, cursor.run_at
        if priority is None or run_at is None:  # a hand-made ?after=ID: where that job stands
            row = store._job_row(_bound(cursor.after, 0))
            resume = row is not None
            priority, run_at = (row[FIELD["priority"]], float(row[FIELD["run_at"]])) if row is not None else (0, 0.0)
        params.update(priority=v.int32(priority, "priority"), run_at=run_at)
    with store.executor(retry=True) as ex:  # a read
        if state == "dead":
            return _page(store.backend.dead_page(ex, params, by_queue=True, ascending=True), limit, _by_id)
        if state == "processing":
            return _page(store.backend.processing_page(ex, params), limit, _by_id)
        rows = store.backend.pending_page(ex, params, state=state, resume=resume)
    return _page(rows, limit, _by_claim_order)


def dead_page(store: Store, queue: str | None, before: int | None, limit: int = PAGE) -> Page:
    """Dead jobs (of ``queue``, or of every queue) with ids below ``before``, newest first."""
    store._check_open()
    params: dict[str, Any] = {"before": _bound(before, v.INT64_MAX), "limit": limit + 1, "preview": LISTED}
    if queue is not None:
        params["queue"] = listed_queue_name(queue)
    with store.executor(retry=True) as ex:  # a read
        rows = store.backend.dead_page(ex, params, by_queue=queue is not None, ascending=False)
    return _page(rows, limit, lambda row: {"before": row[0]})


@dataclass(frozen=True)
class Consumer:
    name: str
    offset: int | str  # str: written by hand as no integer (SQLite keeps it), as stored
    lag: int | None  # None: an offset that is no integer
    updated_at: Any


@dataclass(frozen=True)
class StreamRow:
    name: str
    last_offset: int | str  # as Consumer.offset
    consumers: list[Consumer]


def _offset_shown(stored: Any) -> int | str:
    """An offset as stored: SQLite keeps the text an UPDATE puts in the column, and
    ``int()`` of it failed the streams page for every stream. An integer as such (a
    fraction cut as before), anything else its text as stored."""
    try:
        return int(stored)
    except (TypeError, ValueError, OverflowError):
        return str(stored)


def stream_rows(store: Store) -> list[StreamRow]:
    """Every stream with its last offset, and each consumer's committed offset and lag, as
    of one instant (one statement)."""
    store._check_open()
    with store.executor(retry=True) as ex:  # a read
        rows = store.backend.stream_overview(ex, {})
    last: dict[str, int | str] = {}
    consumers = []
    for stream, last_offset, consumer, offset, updated_at in rows:
        if consumer is None:
            last[stream] = _offset_shown(last_offset)
        else:
            consumers.append((stream, consumer, _offset_shown(offset), updated_at))
    by_stream: dict[str, list[Consumer]] = {}
    for stream, consumer, offset, updated_at in sorted(consumers, key=lambda c: (c[0], c[1])):
        top = last.get(stream, 0)
        lag = max(0, top - offset) if isinstance(top, int) and isinstance(offset, int) else None
        by_stream.setdefault(stream, []).append(Consumer(consumer, offset, lag, ts(updated_at)))
    return [StreamRow(name, last.get(name, 0), by_stream.get(name, [])) for name in sorted(set(last) | set(by_stream))]
