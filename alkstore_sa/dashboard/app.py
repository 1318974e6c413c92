"""The dashboard as one handler, Request -> Response: routing, the read-only and
cross-site gates in front of every action, the vendored static files, and how errors are
answered (400 for bad input, 404, 403, 405; 503 with the message when the database's
alkstore tables are missing or of another version; a 500 logs and shows no internals)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from importlib import resources

from .. import _validate as v
from .._unreachable import driver_error, is_connect_failure, refusal_advice
from ..errors import DatabaseError, InvalidName, InvalidOptions, NotInstalled, SchemaTooNew
from ..store import Store
from . import actions, inventory, jobs, queues
from .csrf import Csrf
from .html import error_page, unseg
from .http import Request, Response
from .view import View

log = logging.getLogger("alkstore_sa.dashboard")

Route = tuple[re.Pattern[str], Callable[..., Response | None]]

STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}


def _path(pattern: str) -> re.Pattern[str]:
    """A route's path pattern. DOTALL: a queue name may hold a line break, which ``.``
    alone would not match (its page and actions would be 404)."""
    return re.compile(pattern, re.DOTALL | re.ASCII)  # ASCII: \d is no other script's digit


# queue names are greedy (.+): a name may itself contain "/" (sent encoded, decoded by the
# server); each is taken back from its segment by ``unseg`` (see ``html.seg``)
GET: list[Route] = [
    (_path(r"/"), queues.queues_page),
    (_path(r"/api/counts"), queues.counts_json),
    (_path(r"/queues/(.+)"), lambda view, q: jobs.queue_page(view, unseg(q))),
    (_path(r"/jobs/(-?\d{1,19})"), lambda view, i: jobs.job_page(view, int(i))),
    (_path(r"/dead"), jobs.dead_page_view),
    (_path(r"/schedules"), inventory.schedules_page),
    (_path(r"/workers"), inventory.workers_page),
    (_path(r"/streams"), inventory.streams_page),
]
POST: list[Route] = [
    (_path(r"/dead/requeue"), actions.requeue_dead),
    (_path(r"/dead/delete"), actions.delete_dead),
    (_path(r"/jobs/(-?\d{1,19})/cancel"), lambda view, i: actions.cancel(view, int(i))),
    (_path(r"/queues/(.+)/pause"), lambda view, q: actions.pause(view, unseg(q), True)),
    (_path(r"/queues/(.+)/resume"), lambda view, q: actions.pause(view, unseg(q), False)),
]


def _match(routes: list[Route], path: str) -> tuple[Callable[..., Response | None], tuple[str, ...]] | None:
    for pattern, handler in routes:
        m = pattern.fullmatch(path)
        if m:
            return handler, m.groups()
    return None


class Dashboard:
    """The framework-neutral dashboard application of one store."""

    def __init__(self, store: Store, *, read_only: bool = False, csrf_secret: bytes | None = None) -> None:
        # checked here, not at the first request: there a wrong argument was a 500 on every page
        v.store(store, "the dashboard's store")
        if not isinstance(read_only, bool):
            raise InvalidOptions(f"read_only must be a bool, got {type(read_only).__name__}")
        if csrf_secret is not None and not (isinstance(csrf_secret, bytes) and csrf_secret):
            raise InvalidOptions(
                "csrf_secret must be non-empty bytes (the same in every process serving the "
                f"dashboard) or None for a random one, got {csrf_secret!r:.40}"
            )
        self.store = store
        self.read_only = read_only
        self.csrf = Csrf(csrf_secret)

    def __call__(self, request: Request) -> Response:
        view = View(request, self.store, self.read_only)
        try:
            return self._dispatch(view)
        except (InvalidName, InvalidOptions) as exc:
            return error_page(request, 400, str(exc))
        except (NotInstalled, SchemaTooNew) as exc:
            # the database, not the request or a bug: its tables are missing, outdated or
            # newer than this library. The message says what to run; no traceback helps.
            log.error("dashboard: %s %s: %s", request.method, request.root + request.path, exc)
            return error_page(request, 503, str(exc))
        except DatabaseError as exc:
            advice = refusal_advice(exc)
            if advice is not None:
                # the role's grants or a read-only database, not a bug: one line, and the
                # page says what was refused and what to change
                orig = driver_error(exc)
                text = f"the database refused: {' '.join(str(orig).split())} ({advice})"
                log.error("dashboard: %s %s: %s", request.method, request.root + request.path, text)
                return error_page(request, 503, text)
            if not is_connect_failure(exc):
                return _internal_error(request)
            # an outage, not a bug: one line per request (an open queues page polls every
            # few seconds), and the page says what is wrong
            orig = driver_error(exc)
            text = f"the database cannot be reached: {type(orig).__name__}: {orig}"
            log.error("dashboard: %s %s: %s", request.method, request.root + request.path, text)
            return error_page(request, 503, text)
        except Exception:
            return _internal_error(request)

    def _dispatch(self, view: View) -> Response:
        request = view.request
        if request.path.startswith("/static/"):
            return self._static(request)
        if request.method in ("GET", "HEAD"):
            found = _match(GET, request.path)
            if found is None:
                return self._not_allowed_or_missing(request, POST)
            if not self.read_only:
                view.token, view.cookie = self.csrf.issue(request)
            handler, args = found
            response = handler(view, *args)
            return response if response is not None else error_page(request, 404, "not found")
        if request.method == "POST":
            found = _match(POST, request.path)
            if found is None:
                return self._not_allowed_or_missing(request, GET)
            if self.read_only:
                return error_page(request, 403, "read-only dashboard: actions are disabled")
            refusal = self.csrf.refusal(request)
            if refusal is not None:
                return error_page(request, 403, refusal)
            handler, args = found
            return handler(view, *args) or error_page(request, 404, "not found")
        return self._method_not_allowed(request)

    def _not_allowed_or_missing(self, request: Request, other: list[Route]) -> Response:
        if _match(other, request.path) is not None:
            return self._method_not_allowed(request)
        return error_page(request, 404, "not found")

    def _method_not_allowed(self, request: Request) -> Response:
        response = error_page(request, 405, f"method {request.method} not allowed")
        response.headers.append(("Allow", "POST" if _match(POST, request.path) else "GET, HEAD"))
        return response

    def _static(self, request: Request) -> Response:
        name = request.path[len("/static/"):]
        ctype = STATIC.get(name)
        if ctype is None or request.method not in ("GET", "HEAD"):
            return error_page(request, 404, "not found")
        data = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
        return Response(200, data, ctype, headers=[("Cache-Control", "public, max-age=300")])


def _internal_error(request: Request) -> Response:
    """(In an ``except`` block.) A bug, or a database error that may be one: logged with its
    traceback; the page shows no internals."""
    log.exception("dashboard: %s %s failed", request.method, request.root + request.path)
    return error_page(request, 500, "internal error (see the server log)")
