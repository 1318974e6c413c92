"""The read-only inventory pages: schedules, live workers and streams."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .html import esc, preview_text, when
from .http import Response
from .reads import stream_rows
from .view import View


def _table(css: str, head: Sequence[str], rows: Iterable[str], empty: str) -> str:
    body = "".join(rows) or f'<tr><td colspan="{len(head)}">{esc(empty)}</td></tr>'
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f'<table class="{css}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _cells(values: Iterable[object]) -> str:
    return "".join(f"<td>{esc(v)}</td>" for v in values)


def schedules_page(view: View) -> Response:
    rows = (
        f'<tr data-schedule="{esc(s.name)}">'
        + _cells((s.name, s.spec, s.tz, s.queue, when(s.next_fire_at), s.priority))
        + f"<td><code>{esc(preview_text(text))}</code></td></tr>"
        for s, text in view.store._scheduler().stored()
    )
    head = ("name", "spec", "time zone", "queue", "next fire (UTC)", "priority", "payload")
    return view.page("Schedules", _table("schedules", head, rows, "no schedules"))


def workers_page(view: View) -> Response:
    rows = (
        f'<tr data-worker="{esc(w.id)}">'
        + _cells((
            w.id, w.hostname, w.pid, ", ".join(w.queues), w.concurrency, when(w.started_at), when(w.last_seen)
        ))
        + "</tr>"
        for w in view.store.workers()
    )
    head = ("id", "host", "pid", "queues", "concurrency", "started (UTC)", "last seen (UTC)")
    return view.page("Workers", _table("workers", head, rows, "no live workers"))


def streams_page(view: View) -> Response:
    parts = []
    for s in stream_rows(view.store):
        consumers = (
            f'<tr data-consumer="{esc(c.name)}">'
            + _cells((c.name, c.offset))
            + f'<td class="num" data-lag>{"-" if c.lag is None else c.lag}</td>'
            + _cells((when(c.updated_at),))
            + "</tr>"
            for c in s.consumers
        )
        parts.append(
            f'<section data-stream="{esc(s.name)}"><h2>{esc(s.name)}</h2>'
            f'<p>last offset <span class="num" data-last-offset>{esc(s.last_offset)}</span></p>'
            + _table("consumers", ("consumer", "offset", "lag", "committed (UTC)"), consumers, "no consumers")
            + "</section>"
        )
    return view.page("Streams", "".join(parts) or "<p>no streams</p>")
