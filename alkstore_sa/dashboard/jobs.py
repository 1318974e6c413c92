"""Job pages: a queue's jobs by state (``GET /queues/NAME``), one job (``GET /jobs/ID``)
and the dead letters (``GET /dead``). Lists are keyset pages with a "next" link: ready and
scheduled jobs in claim order, processing and dead jobs by id."""

from __future__ import annotations

import math

from .. import _validate
from .._validate import decode_payload
from ..errors import InvalidOptions
from ..model import Job
from ..outbox import listed_queue
from .html import age, cut, esc, payload_html, preview_text, seg, url, when
from .http import Response
from .queues import describe, pause_button
from .reads import STATES, Cursor, Page, dead_page, jobs_page, stored_job
from .view import View


def int_arg(view: View, name: str) -> int | None:
    """An integer query parameter (None when absent); InvalidOptions when not an integer."""
    raw = view.request.arg(name)
    if raw is None or raw == "":
        return None
    try:
        return _validate.int_text(raw)
    except ValueError:
        raise InvalidOptions(f"{name} must be an integer, got {raw!r}") from None


def _current(flag: bool) -> str:
    return ' class="current"' if flag else ""


def _job_link(view: View, job: Job) -> str:
    return f'<a class="job-link" href="{esc(url(view.request, f"/jobs/{job.id}"))}">{job.id}</a>'


def float_arg(view: View, name: str) -> float | None:
    raw = view.request.arg(name)
    if raw is None or raw == "":
        return None
    try:
        value = _validate.float_text(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise InvalidOptions(f"{name} must be a finite number, got {raw!r}")
    return value


def _next_link(view: View, path: str, query: dict[str, object], page: Page) -> str:
    if page.next_query is None:
        return ""
    href = esc(url(view.request, path, {**query, **page.next_query}))
    return f'<p class="pager"><a id="next-page" rel="next" href="{href}">next page →</a></p>'


def _live_table(view: View, page: Page, state: str) -> str:
    extra = ("worker", "claim expires") if state == "processing" else ("run at",)
    head = "".join(f"<th>{h}</th>" for h in ("id", "priority", "attempts", *extra, "created", "payload", ""))
    rows = []
    for j, text in zip(page.jobs, page.payloads, strict=True):
        cells = (j.worker_id, when(j.claim_expires_at)) if state == "processing" else (when(j.run_at),)
        cancel = "" if state == "processing" else view.form(
            f"/jobs/{j.id}/cancel", '<button class="cancel-row-btn" type="submit">cancel</button>'
        )
        rows.append(
            f'<tr data-job-id="{j.id}"><td>{_job_link(view, j)}</td><td class="num">{j.priority}</td>'
            f'<td class="num">{j.attempts}/{j.max_attempts}</td>'
            + "".join(f"<td>{esc(c)}</td>" for c in cells)
            + f'<td>{esc(when(j.created_at))}</td><td><code>{esc(preview_text(text))}</code></td>'
            f"<td>{cancel}</td></tr>"
        )
    body = "".join(rows) or f'<tr><td colspan="8">no {esc(state)} jobs</td></tr>'
    return f'<table class="jobs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def dead_table(view: View, page: Page, *, queue: str | None, show_queue: bool) -> str:
    """Dead jobs with a checkbox each and bulk requeue/delete, plus a single requeue and
    delete per row (separate forms: the row buttons never carry the checked ids)."""
    bulk = ""
    if not view.read_only:
        fields = [("queue", queue)] if queue is not None else []
        bulk = view.form(
            "/dead/requeue",
            '<button id="bulk-requeue-btn" type="submit">requeue selected</button>'
            f'<button id="bulk-delete-btn" type="submit" formaction="{esc(url(view.request, "/dead/delete"))}">'
            "delete selected</button>",
            fields, form_id="bulk-form",
        )
    head = ["", "id"] + (["queue"] if show_queue else []) + ["died", "attempts", "last error", "payload", ""]
    rows = []
    for j, text in zip(page.jobs, page.payloads, strict=True):
        check = "" if view.read_only else (
            f'<input type="checkbox" name="id" value="{j.id}" form="bulk-form" aria-label="select {j.id}">'
        )
        queue_cell = f"<td>{esc(j.queue)}</td>" if show_queue else ""
        actions = view.form("/dead/requeue", '<button class="requeue-row-btn" type="submit">requeue</button>',
                            [("id", j.id), ("queue", j.queue)])
        actions += view.form("/dead/delete", '<button class="delete-row-btn" type="submit">delete</button>',
                             [("id", j.id), ("queue", j.queue)])
        rows.append(
            f'<tr data-job-id="{j.id}"><td>{check}</td><td>{_job_link(view, j)}</td>{queue_cell}'
            f'<td>{esc(when(j.died_at))}</td><td class="num">{j.attempts}/{j.max_attempts}</td>'
            f"<td>{esc(cut(j.last_error or ''))}</td><td><code>{esc(preview_text(text))}</code></td><td>{actions}</td></tr>"
        )
    cols = len(head)
    body = "".join(rows) or f'<tr><td colspan="{cols}">no dead jobs</td></tr>'
    head_html = "".join(f"<th>{h}</th>" for h in head)
    return f'{bulk}<table class="jobs dead"><thead><tr>{head_html}</tr></thead><tbody>{body}</tbody></table>'


def queue_page(view: View, name: str) -> Response:
    state = view.request.arg("state") or "ready"
    if state not in STATES:
        raise InvalidOptions(f"state must be one of {', '.join(STATES)}, got {state!r}")
    cursor = Cursor(int_arg(view, "after"), int_arg(view, "priority"), float_arg(view, "run_at"))
    page = jobs_page(view.store, name, state, cursor)
    # no counts here: they are the queues page's (one grouped pass over every queue's
    # index entries); this page reads only its page of jobs and the queue's settings row
    settings = listed_queue(view.store, name).settings()
    path = f"/queues/{seg(name)}"
    tabs = "".join(
        f'<a href="{esc(url(view.request, path, {"state": s}))}" data-state="{s}"{_current(s == state)}>{s}</a>'
        for s in STATES
    )
    summary = (
        f'<p class="summary">settings: {esc(describe(settings))} '
        f"{pause_button(view, name, settings.paused)}</p>"
    )
    if state == "dead":
        table = dead_table(view, page, queue=name, show_queue=False)
    else:
        table = _live_table(view, page, state)
    more = _next_link(view, path, {"state": state}, page)
    return view.page(f"Queue {name}", f'{summary}<p class="tabs">{tabs}</p>{table}{more}')


def dead_page_view(view: View) -> Response:
    queue = view.request.arg("queue") or None
    before = int_arg(view, "before")
    page = dead_page(view.store, queue, before)
    filter_form = (
        f'<form method="get" class="filter" action="{esc(url(view.request, "/dead"))}">'
        f'<label>queue <input name="queue" value="{esc(queue or "")}"></label>'
        '<button type="submit">filter</button></form>'
    )
    table = dead_table(view, page, queue=queue, show_queue=queue is None)
    more = _next_link(view, "/dead", {"queue": queue}, page)
    title = f"Dead letters of {queue}" if queue else "Dead letters"
    return view.page(title, filter_form + table + more)


def _dl(items: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _payload(text: str) -> str:
    """The payload section: its JSON laid out, or (not JSON: a row written or edited by
    hand) the text as stored, and why it could not be decoded."""
    try:
        payload = decode_payload(text)
    except ValueError as exc:
        return (
            f'<p class="error" id="payload-error">{esc(exc)}; shown as stored</p>'
            f'<pre id="payload">{esc(preview_text(text, len(text)))}</pre>'
        )
    return payload_html(payload)


def job_page(view: View, job_id: int) -> Response | None:
    found = stored_job(view.store, job_id)
    if found is None:
        return None
    job, text = found
    queue_href = esc(url(view.request, f"/queues/{seg(job.queue)}"))
    facts = [
        ("state", f'<span id="job-state">{esc(job.state)}</span>'),
        ("queue", f'<a class="queue-link" href="{queue_href}">{esc(job.queue)}</a>'),
        ("attempts", f"{job.attempts} / {job.max_attempts}"),
        ("priority", str(job.priority)),
        ("created", esc(when(job.created_at))),
        ("run at", esc(when(job.run_at))),
        ("claimed", esc(when(job.claimed_at))),
        ("claim expires", esc(when(job.claim_expires_at))),
        ("worker", esc(job.worker_id or "-")),
        ("expires", esc(when(job.expires_at))),
        ("visibility timeout", esc(age(job.visibility_timeout))),
        ("unique key", esc(job.unique_key or "-")),
    ]
    if job.state == "dead":
        facts += [("died", esc(when(job.died_at))), ("last error", esc(job.last_error))]
    buttons = ""
    if job.state == "pending":
        # this page is gone after the cancel: come back to the job's queue
        buttons = view.form(
            f"/jobs/{job.id}/cancel", '<button id="cancel-btn" type="submit">cancel</button>',
            next_url=url(view.request, f"/queues/{seg(job.queue)}"),
        )
    elif job.state == "dead":
        # the job page is gone after either action: come back to the queue's dead letters
        fields = [("id", job.id), ("queue", job.queue)]
        back = url(view.request, f"/queues/{seg(job.queue)}", {"state": "dead"})
        buttons = view.form(
            "/dead/requeue", '<button id="requeue-btn" type="submit">requeue</button>', fields, next_url=back
        )
        buttons += view.form(
            "/dead/delete", '<button id="delete-btn" type="submit">delete</button>', fields, next_url=back
        )
    errors = "".join(
        f'<tr><td class="num">{esc(e.get("attempt"))}</td><td>{esc(when(e.get("at")))}</td>'
        f"<td><pre>{esc(e.get('error'))}</pre></td></tr>"
        for e in job.errors
    )
    history = (
        f'<table class="errors"><thead><tr><th>attempt</th><th>at</th><th>error</th></tr></thead><tbody>{errors}</tbody></table>'
        if errors else "<p>no errors recorded</p>"
    )
    body = (
        f'<div class="actions">{buttons}</div>{_dl(facts)}'
        f"<h2>Payload</h2>{_payload(text)}"
        f"<h2>Error history</h2>{history}"
    )
    return view.page(f"Job {job.id}", body)
