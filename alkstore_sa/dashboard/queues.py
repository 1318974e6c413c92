"""The queues page (``GET /``) and its counts as JSON (``GET /api/counts``), which the
vendored script polls to refresh the count cells in place."""

from __future__ import annotations

import json

from .._json_shown import strict
from .._limits import describe
from .html import age, esc, seg, url
from .http import Response
from .reads import STATES, QueueRow, queue_rows
from .view import View


def pause_button(view: View, row_name: str, paused: bool) -> str:
    """The pause or resume form of a queue (nothing in read-only mode)."""
    if paused:
        return view.form(f"/queues/{seg(row_name)}/resume", '<button class="resume-btn" type="submit">resume</button>')
    return view.form(f"/queues/{seg(row_name)}/pause", '<button class="pause-btn" type="submit">pause</button>')


def _row(view: View, row: QueueRow) -> str:
    g = row.gauges
    counts = "".join(f'<td class="num" data-count="{s}">{getattr(g, s)}</td>' for s in STATES)
    link = esc(url(view.request, f"/queues/{seg(row.name)}"))
    return (
        f'<tr data-queue="{esc(row.name)}">'
        f'<td><a class="queue-link" href="{link}">{esc(row.name)}</a></td>{counts}'
        f'<td class="num" data-age>{esc(age(g.oldest_ready_age if g.ready else None))}</td>'
        f'<td class="settings">{esc(describe(row.settings))}</td>'
        f"<td>{pause_button(view, row.name, row.settings.paused)}</td></tr>"
    )


def queues_page(view: View) -> Response:
    rows = queue_rows(view.store)
    head = "".join(f"<th>{h}</th>" for h in ("queue", *STATES, "oldest ready", "settings", ""))
    body = "".join(_row(view, r) for r in rows) or '<tr><td colspan="8">no queues yet</td></tr>'
    counts_url = esc(url(view.request, "/api/counts"))
    table = (
        f'<table id="queues" data-counts-url="{counts_url}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )
    return view.page("Queues", table)


def counts_json(view: View) -> Response:
    data = {"queues": {r.name: r.as_json() for r in queue_rows(view.store)}}
    return Response(
        200, strict(json.dumps(data)).encode("utf-8"), "application/json",
        headers=[("Cache-Control", "no-store")],
    )
