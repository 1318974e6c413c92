"""The dashboard's actions (POST only, after the CSRF checks in ``app``): requeue or delete
dead jobs, cancel a pending job, pause or resume a queue. Each goes through the queue
operations and answers 303 back to the page it came from; an action that could not be
carried out on a job (a cancel that finds it no longer pending, a requeue or delete of a
job that is no longer dead, a requeue stopped by a held unique key) answers 409 with the
reason, after acting on the rest of the selection."""

from __future__ import annotations

import re

from .. import _validate
from .._backends.queue_ops import Requeued
from ..errors import InvalidName, InvalidOptions
from ..model import Job
from ..outbox import listed_queue, stored_queue
from ..queue import cancel_pending
from .html import esc
from .http import Request, Response, redirect
from .reads import stored_job
from .target import default_target, local_target, referer_target
from .view import View

MAX_IDS = 1000  # one bulk form holds a page of ids; more is not a form we rendered


def back_to(request: Request, default: str = "/") -> str:
    """Where to go after an action, percent-encoded: the form's ``next`` or the Referer
    when it is one of this app's pages (``target.local_target``), else ``default``."""
    nxt = request.field("next")
    if nxt:
        found = local_target(request, nxt)
        if found is not None:
            return found
    referer = request.headers.get("referer")
    if referer:
        found = referer_target(request, referer)
        if found is not None:
            return found
    return default_target(request, default)


def form_ids(request: Request) -> list[int]:
    raw = request.form.get("id", [])
    if not raw:
        raise InvalidOptions("no job selected")
    if len(raw) > MAX_IDS:
        raise InvalidOptions(f"at most {MAX_IDS} jobs at once")
    try:
        return list(dict.fromkeys(_validate.int_text(x) for x in raw))
    except ValueError:
        raise InvalidOptions("job ids must be integers") from None


def _form_text(text: str) -> str:
    """``text`` as an HTML form submits it: a browser turns every line break in a field's
    value (CR, LF or CRLF) into CRLF, so a queue name holding one comes back so."""
    return re.sub(r"\r\n|\r|\n", "\r\n", text)


GONE = "it is no longer a dead letter (requeued, deleted or purged since the page was shown)"


def _dead_jobs(view: View) -> tuple[list[Job], list[tuple[int, str]]]:
    """The selected dead jobs (of the form's ``queue`` when given, compared as a form
    carries a name), and the other selected ids with why each is not one: another
    operator may have requeued or deleted it since the page was shown."""
    queue = view.request.field("queue") or None
    wanted = None if queue is None else _form_text(queue)
    jobs: list[Job] = []
    refused: list[tuple[int, str]] = []
    for job_id in form_ids(view.request):
        found = stored_job(view.store, job_id)
        job = None if found is None else found[0]
        if job is None:
            refused.append((job_id, GONE))
        elif job.state != "dead":
            refused.append((job_id, f"it is not a dead letter (it is {job.state})"))
        elif wanted is not None and _form_text(job.queue) != wanted:
            refused.append((job_id, f"it is a dead letter of another queue ({job.queue!r})"))
        else:
            jobs.append(job)
    return jobs, refused


def requeue_dead(view: View) -> Response:
    """Each selected dead job back as a fresh job with the stamps it had. A job whose
    unique key a live job holds, or whose stamps (written by hand) are out of the range
    the API takes, is not requeued (nothing written, it stays dead); nor is one that is no
    longer dead (another operator's requeue or delete came first, even between this
    action's read and its write): the answer (409) lists those and why, after the others
    were requeued."""
    jobs, refused = _dead_jobs(view)
    for job in jobs:
        try:
            q = listed_queue(
                view.store, job.queue, visibility_timeout=job.visibility_timeout, max_attempts=job.max_attempts,
                backoff_base=job.backoff_base, dead_letter_retention=job.dead_letter_retention,
            )
        except InvalidName:  # a row written by hand: no worker could name the live job
            refused.append((job.id, f"its queue name {job.queue!r} is one the API refuses (a row written by hand?); it stays in the dead letters"))
            continue
        except InvalidOptions as exc:  # the job's own stamps, not the form: the rest still go
            refused.append((job.id, f"its stamps cannot be used ({exc}; `alkstore dead requeue` gives the queue's defaults); it stays in the dead letters"))
            continue
        done = q._requeue_dead(job.id)
        if done is None:  # taken since it was read: the requeue found no dead row to move
            refused.append((job.id, GONE))
        elif not done.moved:
            refused.append((job.id, _held(done)))
    return _done_or_refused(view, "requeued", refused)


def _held(done: Requeued) -> str:
    """Why a requeue that a held unique key stopped did not happen."""
    return f"live job {done.job_id} holds its unique key {done.unique_key!r}; it stays in the dead letters"


def delete_dead(view: View) -> Response:
    """Delete each selected dead job; one that is no longer dead (another operator's
    requeue or delete came first) is named in the answer (409), after the others went."""
    jobs, refused = _dead_jobs(view)
    for job in jobs:
        # by the name stored: a row written by hand under a name the API refuses goes too
        if not stored_queue(view.store, job.queue).delete_dead(job.id):
            refused.append((job.id, GONE))
    return _done_or_refused(view, "deleted", refused)


def _done_or_refused(view: View, done: str, refused: list[tuple[int, str]]) -> Response:
    """Back to the page (303) when every selected job was acted on; else 409 naming each
    one that was not, and why, in the order selected."""
    back = back_to(view.request, "/dead")
    if not refused:
        return redirect(back)
    order = {job_id: i for i, job_id in enumerate(form_ids(view.request))}
    refused.sort(key=lambda r: order.get(r[0], 0))
    items = "".join(f"<li>job {job_id} was not {done}: {esc(why)}</li>" for job_id, why in refused)
    body = f'<ul class="error" id="refusal">{items}</ul><p><a id="back-link" href="{esc(back)}">back</a></p>'
    return view.page(f"Not {done}", body, status=409)


def cancel(view: View, job_id: int) -> Response:
    """Cancel a pending job. The delete itself requires the job to be pending (one
    statement, ``cancel_pending``): a job a worker claimed since the page was read — even
    between this action's own read and its delete — is left alone, and the answer (409)
    says what became of it instead of pretending it was cancelled."""
    back = back_to(view.request)
    found = stored_job(view.store, job_id)
    job = None if found is None else found[0]
    # by the name stored: a job written by hand under a name the API refuses can go too
    if job is not None and job.state == "pending" and cancel_pending(stored_queue(view.store, job.queue), job_id):
        return redirect(back)
    return _not_cancelled(view, job_id, back)


def _not_cancelled(view: View, job_id: int, back: str) -> Response:
    """409: the job was not cancelled, and why (read after the refused delete)."""
    found = stored_job(view.store, job_id)
    job = None if found is None else found[0]
    if job is None:
        why = "it is no longer live (a worker finished it, or it was cancelled or expired)"
    elif job.state == "processing":
        why = f"a worker ({job.worker_id}) claimed it since the page was shown; it keeps running"
    elif job.state == "dead":
        why = "it is dead (requeue or delete it from the dead letters)"
    else:
        why = "it was not pending when the cancel ran; reload the page and try again"
    body = f'<p class="error" id="refusal">job {job_id} was not cancelled: {esc(why)}</p>'
    body += f'<p><a id="back-link" href="{esc(back)}">back</a></p>'
    return view.page("Not cancelled", body, status=409)


def pause(view: View, queue: str, paused: bool) -> Response:
    q = listed_queue(view.store, queue)
    if paused:
        q.pause()
    else:
        q.resume()
    return redirect(back_to(view.request))
