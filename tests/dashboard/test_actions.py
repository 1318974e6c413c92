"""The dashboard's actions change the database through the queue operations, and only
for a same-site POST with a valid token: a missing or wrong token, a cross-site request
or a read-only dashboard gets 403 and changes nothing."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import pytest

import alkstore_sa as alk
from alkstore_sa.dashboard import actions, create_app, create_wsgi_app
from alkstore_sa.dashboard.app import Dashboard
from alkstore_sa.dashboard.http import Request
from tests.dashboard.conftest import HOST, WsgiBrowser
from tests.dashboard.seed import Seeded, seed
from tests.support import Target


def _token(dash, path: str = "/") -> str:
    return dash.get(path).token()


def _state(store: alk.Store, s: Seeded) -> tuple[object, ...]:
    """Everything an action could change, to compare before and after a refusal."""
    q = store.queue(s.queue)
    return (q.stats(), q.settings(), [j.id for j in q.dead_jobs()], [store.get_job(i) for i in s.ready])


def test_requeue_single_dead_job(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    dead = store.get_job(s.dead[0])
    assert dead is not None
    r = dash.post(
        "/dead/requeue",
        {"csrf_token": _token(dash), "id": s.dead[0], "queue": qname, "next": f"/queues/{qname}?state=dead"},
    )
    assert r.status == 303 and r.headers["location"] == f"/queues/{qname}?state=dead"
    assert store.get_job(s.dead[0]) is None
    q = store.queue(qname)
    assert [j.id for j in q.dead_jobs()] == [s.dead[1]]
    assert q.stats().ready == len(s.ready) + 1
    newest = max(j.id for j in _ready_jobs(store, qname))
    job = store.get_job(newest)
    assert job is not None and job.payload == dead.payload and job.max_attempts == dead.max_attempts


def _ready_jobs(store: alk.Store, queue: str) -> list[alk.Job]:
    from alkstore_sa.dashboard.reads import jobs_page

    return jobs_page(store, queue, "ready").jobs


def test_bulk_requeue_and_bulk_delete(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname, dead=4)
    token = _token(dash, f"/queues/{qname}?state=dead")
    r = dash.post("/dead/requeue", [("csrf_token", token), ("queue", qname), ("id", s.dead[0]), ("id", s.dead[1])])
    assert r.status == 303
    r = dash.post("/dead/delete", [("csrf_token", token), ("queue", qname), ("id", s.dead[2]), ("id", s.dead[3])])
    assert r.status == 303
    q = store.queue(qname)
    assert q.dead_jobs() == [] and q.stats().dead == 0
    assert q.stats().ready == len(s.ready) + 2
    assert all(store.get_job(i) is None for i in s.dead)


def test_delete_single_from_every_queue_page(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    token = _token(dash, "/dead")
    r = dash.post("/dead/delete", {"csrf_token": token, "id": s.dead[1]})  # no queue field
    assert r.status == 303 and r.headers["location"] == "/dead"
    assert store.get_job(s.dead[1]) is None and store.get_job(s.dead[0]) is not None


def test_dead_actions_leave_other_jobs_alone(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    token = _token(dash)
    # a live job's id, and a dead job named with the wrong queue: nothing happens
    dash.post("/dead/delete", {"csrf_token": token, "id": s.ready[0]})
    dash.post("/dead/requeue", {"csrf_token": token, "id": s.dead[0], "queue": qname + "-other"})
    assert store.get_job(s.ready[0]) is not None
    job = store.get_job(s.dead[0])
    assert job is not None and job.state == "dead"
    assert dash.post("/dead/delete", {"csrf_token": token, "id": "x"}).status == 400
    assert dash.post("/dead/delete", {"csrf_token": token}).status == 400


def test_cancel_pending_only(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    token = _token(dash, f"/jobs/{s.ready[0]}")
    r = dash.post(f"/jobs/{s.ready[0]}/cancel", {"csrf_token": token, "next": f"/queues/{qname}"})
    assert r.status == 303 and r.headers["location"] == f"/queues/{qname}"
    assert store.get_job(s.ready[0]) is None
    r = dash.post(f"/jobs/{s.processing[0]}/cancel", {"csrf_token": token})
    job = store.get_job(s.processing[0])
    assert job is not None and job.state == "processing"  # not a pending job: left alone
    assert r.status == 409 and "was not cancelled" in r.text and "claimed" in r.text
    r = dash.post(f"/jobs/{s.dead[0]}/cancel", {"csrf_token": token})
    assert r.status == 409 and "it is dead" in r.text and store.get_job(s.dead[0]) is not None
    r = dash.post(f"/jobs/{s.ready[0]}/cancel", {"csrf_token": token})  # cancelled above
    assert r.status == 409 and "no longer live" in r.text


def _form_on(page_html: str, action_suffix: str) -> tuple[str, list[tuple[str, str]]]:
    """The action and the fields of the form on a page whose action ends so, as a browser
    submits them."""
    for action, inner in re.findall(r'<form method="post"[^>]*action="([^"]+)">(.*?)</form>', page_html, re.S):
        if html.unescape(action).endswith(action_suffix):
            fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', inner)
            return html.unescape(action), [(html.unescape(k), html.unescape(v)) for k, v in fields]
    raise AssertionError(f"no form posting to ...{action_suffix}")


def test_cancel_from_a_jobs_page_lands_on_its_queue_not_a_404(dash, store: alk.Store, qname: str) -> None:
    """The job page's cancel button came back to the job page, which the cancel had just
    removed: a successful cancel ended on "404 not found". It comes back to the job's
    queue (as the requeue and delete buttons of a dead job's page go to its dead letters)."""
    s = seed(store, qname)
    page = dash.get(f"/jobs/{s.scheduled[0]}")
    action, fields = _form_on(page.text, "/cancel")
    r = dash.post(action, fields)
    assert r.status == 303 and store.get_job(s.scheduled[0]) is None
    assert r.headers["location"] == f"/queues/{qname}"
    assert dash.get(r.headers["location"]).status == 200


def test_cancel_refuses_a_job_claimed_after_the_action_read_it(
    dash, store: alk.Store, qname: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's claim landing between the action's read of the job (pending) and its
    cancel: the cancel deletes nothing (the worker's ack lands) and the answer says so."""
    q = store.queue(qname)
    job_id = q.enqueue({"races": 1})
    token = _token(dash, f"/jobs/{job_id}")
    claimed: list[alk.JobHandle] = []
    read = actions.stored_job

    def read_then_claim(s: alk.Store, i: int) -> tuple[alk.Job, str] | None:
        found = read(s, i)
        if not claimed:  # the claim lands right after the action saw the job pending
            h = q.claim_one("racing-worker")
            assert h is not None and h.id == job_id
            claimed.append(h)
        return found

    monkeypatch.setattr(actions, "stored_job", read_then_claim)
    r = dash.post(f"/jobs/{job_id}/cancel", {"csrf_token": token, "next": f"/queues/{qname}"})
    monkeypatch.undo()
    job = store.get_job(job_id)
    assert job is not None and job.state == "processing", "the claimed job was cancelled"
    assert claimed[0].ack() is True
    assert r.status == 409 and "claimed" in r.text and f'href="/queues/{qname}"' in r.text


def test_requeue_of_a_dead_job_whose_unique_key_is_held_says_it_was_not_requeued(
    dash, store: alk.Store, qname: str
) -> None:
    """A dead job whose unique key a live job holds is not requeued (nothing is written,
    the dead row stays): the answer says so (409, with the holder), as the cancel does,
    instead of redirecting as if the selection had been requeued. The other selected jobs
    are requeued."""
    q = store.queue(qname, max_attempts=1)
    held, free = q.enqueue({"n": 1}, unique_key="invoice-42"), q.enqueue({"n": 2})
    for _ in range(2):
        h = q.claim_one("w")
        assert h is not None and h.fail("boom")
    holder = q.enqueue({"n": 3}, unique_key="invoice-42")
    token = _token(dash, f"/queues/{qname}?state=dead")
    r = dash.post(
        "/dead/requeue",
        [("csrf_token", token), ("queue", qname), ("id", held), ("id", free), ("next", f"/queues/{qname}?state=dead")],
    )
    assert r.status == 409, (r.status, r.headers.get("location"))
    assert f"job {held} was not requeued" in r.text and f"live job {holder} holds its unique key" in r.text
    assert f'href="/queues/{qname}?state=dead"' in r.text  # the way back
    assert [j.id for j in q.dead_jobs()] == [held]  # it stayed; the free one was requeued
    assert q.stats().ready == 2

def test_requeue_of_a_dead_job_whose_stamps_were_written_out_of_range_says_it_was_not_requeued(
    dash, db: Target, store: alk.Store, qname: str
) -> None:
    """The dashboard requeues a dead job with the stamps it had; one whose stamps were
    written by hand out of the range the API takes (an infinite visibility timeout,
    max_attempts 0) cannot be: the bulk requeue answered 400 ("visibility_timeout must be
    finite") after requeuing the jobs before it and skipping those after it. Such a job is
    not requeued (it stays dead, as a job whose key is held), the answer (409) says why,
    and every other selected job is requeued."""
    q = store.queue(qname, max_attempts=1)
    first, odd, last = q.enqueue({"n": 1}), q.enqueue({"n": 2}), q.enqueue({"n": 3})
    for _ in range(3):
        h = q.claim_one("w")
        assert h is not None and h.fail("boom")
    db.execute(
        f"UPDATE {db.table('alkstore_dead_jobs')} SET visibility_timeout = :inf, max_attempts = 0 WHERE id = :id",
        inf=float("inf"), id=odd,
    )
    token = _token(dash, f"/queues/{qname}?state=dead")
    r = dash.post("/dead/requeue", [("csrf_token", token), ("queue", qname), ("id", first), ("id", odd), ("id", last)])
    assert r.status == 409, (r.status, r.headers.get("location"))
    assert f"job {odd} was not requeued" in r.text and "visibility_timeout must be finite" in r.text
    assert [j.id for j in q.dead_jobs()] == [odd]
    assert q.stats().ready == 2


def test_pause_and_resume(dash, store: alk.Store, qname: str) -> None:
    seed(store, qname)
    token = _token(dash)
    assert dash.post(f"/queues/{qname}/pause", {"csrf_token": token}).status == 303
    assert store.queue(qname).settings().paused is True
    assert store.queue(qname).claim_one("w") is None
    page = dash.get("/").text
    assert f'action="/queues/{qname}/resume"' in page
    assert dash.post(f"/queues/{qname}/resume", {"csrf_token": token}).status == 303
    assert store.queue(qname).settings().paused is False


def test_actions_on_an_outboxs_backing_queue(dash, store: alk.Store, qname: str) -> None:
    """The outbox's reserved backing queue is listed like any queue: its page, pause and
    resume, cancel, and the dead-letter actions work on it (each answered 400)."""
    ob = store.outbox(qname)
    ob.enqueue({"dies": 1})
    ob.enqueue({"dies": 2})
    for h in ob.claim_batch("relay", 2):
        assert h.fail("downstream refused")
    pending = ob.enqueue({"waits": 1})
    backing = ob.queue.name
    page = "/queues/" + quote(backing, safe="")
    assert dash.get(page).status == 200
    token = _token(dash, page)
    assert dash.post(page + "/pause", {"csrf_token": token}).status == 303
    assert ob.queue.settings().paused is True
    assert dash.post(page + "/resume", {"csrf_token": token}).status == 303
    assert ob.queue.settings().paused is False
    assert dash.post(f"/jobs/{pending}/cancel", {"csrf_token": token}).status == 303
    assert store.get_job(pending) is None or store.get_job(pending).state != "pending"  # type: ignore[union-attr]
    first, second = (j.id for j in sorted(ob.queue.dead_jobs(), key=lambda j: j.id))
    assert dash.post("/dead/requeue", {"csrf_token": token, "id": first, "queue": backing}).status == 303
    assert dash.post("/dead/delete", {"csrf_token": token, "id": second, "queue": backing}).status == 303
    assert ob.queue.dead_jobs() == []
    again = ob.claim_one("relay")
    assert again is not None and again.payload == {"dies": 1}


def test_queue_names_with_slashes_and_unicode(dash, store: alk.Store, qname: str) -> None:
    name = f"{qname}/pause"  # the action's own suffix inside a name
    store.queue(name).enqueue(1)
    token = _token(dash)
    assert dash.post(f"/queues/{qname}%2Fpause/pause", {"csrf_token": token}).status == 303
    assert store.queue(name).settings().paused is True
    assert store.queue(qname).settings().paused is False
    assert dash.get(f"/queues/{qname}%2Fpause").status == 200
    wide = f"{qname}-ünï 漢字"
    job_id = store.queue(wide).enqueue(1)
    page = dash.get("/queues/" + quote(wide, safe=""))
    assert page.status == 200 and f'data-job-id="{job_id}"' in page.text
    assert dash.post("/queues/" + quote(wide, safe="") + "/pause", {"csrf_token": token}).status == 303
    assert store.queue(wide).settings().paused is True


def _followed(href: str) -> str:
    """The path a client requests for a link or form action of a page at the app's root:
    resolved as RFC 3986 (and every browser) does, dot segments removed."""
    return urlsplit(urljoin(f"http://{HOST}/", html.unescape(href))).path


@pytest.mark.parametrize("name", [".", "..", "~.", "~~..", ".~", "..."])
def test_dot_queue_names_round_trip_through_urls(dash, store: alk.Store, name: str) -> None:
    """A queue named "." or ".." is a valid name; its links and action URLs must not be
    dot segments (a client removes those before sending), and must not collide with the
    names the encoding uses to avoid them ("~." is another queue than ".")."""
    q = store.queue(name)
    job_id = q.enqueue({"in": name})
    q.resume()  # the PostgreSQL schema is the module's: start from a known state
    queues = dash.get("/").text
    row = re.search(rf'<tr data-queue="{re.escape(html.escape(name))}">(.*?)</tr>', queues, re.S)
    assert row, f"no row for {name!r}"
    link = re.search(r'class="queue-link" href="([^"]+)"', row.group(1))
    assert link is not None
    page = dash.get(_followed(link.group(1)))
    assert page.status == 200 and f"<title>Queue {html.escape(name)} " in page.text
    assert f'data-job-id="{job_id}"' in page.text
    action = re.search(r'<form method="post" class="inline" action="([^"]+)"', row.group(1))
    assert action is not None
    r = dash.post(_followed(action.group(1)), {"csrf_token": dash.get("/").token()})
    assert r.status == 303 and q.settings().paused is True
    page = dash.get(_followed(link.group(1)))
    resume = re.search(r'<form method="post" class="inline" action="([^"]+/resume)"', page.text)
    assert resume is not None
    r = dash.post(_followed(resume.group(1)), {"csrf_token": page.token()})
    assert r.status == 303 and q.settings().paused is False
    job_page = dash.get(f"/jobs/{job_id}").text
    back = re.search(r'class="queue-link" href="([^"]+)"', job_page)
    assert back is not None and _followed(back.group(1)) == _followed(link.group(1))


def test_queue_segments_are_never_dot_segments_and_decode_back() -> None:
    from urllib.parse import unquote

    from alkstore_sa.dashboard.html import seg, unseg

    names = [".", "..", "...", "~", "~.", "~..", "~~.", ".~", "a/..", "~a", "x", "../x", "漢."]
    segments = [seg(n) for n in names]
    assert len(set(segments)) == len(names)  # one name, one segment
    for name, segment in zip(names, segments, strict=True):
        assert "/" not in segment and segment not in (".", "..")
        assert unseg(unquote(segment)) == name  # what the server decodes, back to the name


def test_redirect_stays_inside_the_app(dash, store: alk.Store, qname: str) -> None:
    seed(store, qname)
    token = _token(dash)
    for evil in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        r = dash.post(f"/queues/{qname}/pause", {"csrf_token": token, "next": evil})
        assert r.status == 303 and r.headers["location"] == "/", evil
    r = dash.post(f"/queues/{qname}/resume", {"csrf_token": token}, headers={"Referer": f"http://{HOST}/dead?queue=x"})
    assert r.headers["location"] == "/dead?queue=x"


REFUSED: list[tuple[str, dict[str, str], bool]] = [
    ("no token", {}, False),
    ("wrong token", {}, True),
    ("cross-site fetch", {"Sec-Fetch-Site": "cross-site"}, True),
    ("same-site fetch", {"Sec-Fetch-Site": "same-site"}, True),
    ("foreign origin", {"Origin": "https://evil.example"}, True),
    ("null origin", {"Origin": "null"}, True),
    # malformed input made the check itself raise: a 500 and a logged traceback per request
    ("non-ASCII token", {}, True),
    ("malformed origin", {"Origin": "http://[::1"}, True),
]


@pytest.mark.parametrize(("case", "headers", "with_token"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_posts_change_nothing(
    dash, store: alk.Store, qname: str, case: str, headers: dict[str, str], with_token: bool
) -> None:
    s = seed(store, qname)
    token = _token(dash)
    if case == "wrong token":
        token = "0" * len(token)
    elif case == "non-ASCII token":
        token = "é" + token[1:]
    before = _state(store, s)
    posts = [
        ("/dead/requeue", [("id", s.dead[0]), ("queue", qname)]),
        ("/dead/delete", [("id", s.dead[1]), ("queue", qname)]),
        (f"/jobs/{s.ready[0]}/cancel", []),
        (f"/queues/{qname}/pause", []),
    ]
    for path, fields in posts:
        data = ([("csrf_token", token)] if with_token else []) + fields
        r = dash.post(path, data, headers=headers)
        assert r.status == 403, (case, path)
    assert _state(store, s) == before


def test_token_without_its_cookie_is_refused(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    token = _token(dash)
    fresh = WsgiBrowser(dash.client.application) if dash.kind == "wsgi" else None
    if fresh is None:
        from tests.dashboard.conftest import AsgiBrowser

        fresh = AsgiBrowser(dash.client._transport.app)  # type: ignore[attr-defined]
    try:
        r = fresh.post(f"/queues/{qname}/pause", {"csrf_token": token})  # no cookie sent
        assert r.status == 403
    finally:
        fresh.close()
    assert store.queue(s.queue).settings().paused is False


def test_same_origin_headers_are_accepted(dash, store: alk.Store, qname: str) -> None:
    seed(store, qname)
    token = _token(dash)
    headers = {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"}
    assert dash.post(f"/queues/{qname}/pause", {"csrf_token": token}, headers=headers).status == 303
    assert store.queue(qname).settings().paused is True


def test_behind_a_proxy_on_another_port_the_host_must_carry_the_port(store: alk.Store, qname: str) -> None:
    """The Origin of a page served on a non-default port names that port, so the Host (or
    X-Forwarded-Host) a proxy passes on must carry it too: what nginx's ``$http_host``
    passes; its ``$host`` drops the port, and every action is refused (docs/operations.md
    recommends the former)."""
    from alkstore_sa.dashboard.csrf import COOKIE, Csrf

    seed(store, qname)
    public = "ops.example:8443"
    from werkzeug.test import Client

    b = WsgiBrowser(create_wsgi_app(store, csrf_secret=b"k"))
    b.client = Client(b.client.application, use_cookies=False)  # the Cookie header as given
    cookie = "c" * 43
    token = Csrf(b"k").token_for(cookie)
    sent = {"Cookie": f"{COOKIE}={cookie}", "Origin": f"https://{public}", "Sec-Fetch-Site": "same-origin"}
    without_port = {**sent, "Host": "ops.example"}
    assert b.post(f"/queues/{qname}/pause", {"csrf_token": token}, headers=without_port).status == 403
    assert store.queue(qname).settings().paused is False
    for passed in ({"Host": public}, {"Host": "127.0.0.1:8080", "X-Forwarded-Host": public}):
        assert b.post(f"/queues/{qname}/pause", {"csrf_token": token}, headers={**sent, **passed}).status == 303
        assert store.queue(qname).settings().paused is True
        store.queue(qname).resume()


def test_the_csrf_cookie_is_read_beside_cookies_http_cookies_cannot_parse(store: alk.Store, qname: str) -> None:
    """The browser sends every cookie of the host, the application's own too: one that
    ``http.cookies`` cannot parse (a space, a JSON value) made it drop the whole header,
    the dashboard's cookie with it, so every action was refused as "missing CSRF token"
    (and every page set a new cookie)."""
    store.queue(qname).enqueue(1)
    app = Dashboard(store)
    first = app(Request("GET", "/", "", headers={"host": HOST}))
    cookie = dict(first.headers)["Set-Cookie"].split(";")[0].split("=", 1)[1]
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', first.body.decode()).group(1)  # type: ignore[union-attr]
    for jar in (
        f'cart={{"items":[1,2]}}; alkstore_dashboard_csrf={cookie}',
        f"alkstore_dashboard_csrf={cookie}; greeting=hello world",
        f'theme="dark; alkstore_dashboard_csrf={cookie}',
    ):
        page = app(Request("GET", "/", "", headers={"host": HOST, "cookie": jar}))
        assert "Set-Cookie" not in dict(page.headers), jar
        r = app(Request(
            "POST", f"/queues/{qname}/pause", "", body=f"csrf_token={token}".encode(),
            headers={"host": HOST, "cookie": jar, "content-type": "application/x-www-form-urlencoded"},
        ))
        assert r.status == 303, (jar, r.body)
        assert store.queue(qname).settings().paused is True
        store.queue(qname).resume()


def test_asgi_cookies_split_over_several_headers_are_all_read(store: alk.Store, qname: str) -> None:
    """HTTP/2 clients send each cookie as a header of its own (RFC 9113 8.2.3), and ASGI
    servers pass them on as they came: the adapter kept only the last one, so the CSRF
    cookie was lost whenever another came after it, and every action was refused."""
    import asyncio

    store.queue(qname).enqueue(1)
    app = create_app(store)

    def call(method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> dict[str, Any]:
        scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"",
                 "headers": [(b"host", HOST.encode()), *headers], "scheme": "http"}
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(app(scope, receive, send))
        start, content = sent
        return {"status": start["status"], "headers": dict(start["headers"]), "body": content["body"].decode()}

    first = call("GET", "/", [])
    cookie = first["headers"][b"set-cookie"].split(b";")[0]
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', first["body"]).group(1)  # type: ignore[union-attr]
    r = call("POST", f"/queues/{qname}/pause", [
        (b"cookie", cookie), (b"cookie", b"theme=dark"),
        (b"content-type", b"application/x-www-form-urlencoded"),
    ], f"csrf_token={token}".encode())
    assert r["status"] == 303, r["body"]
    assert store.queue(qname).settings().paused is True


def test_csrf_cookie_attributes(dash) -> None:
    cookie = dash.get("/").headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie


def test_read_only_renders_no_actions_and_refuses_posts(readonly, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    before = _state(store, s)
    for path in ("/", "/dead", f"/queues/{qname}?state=dead", f"/queues/{qname}", f"/jobs/{s.dead[0]}", f"/jobs/{s.ready[0]}"):
        r = readonly.get(path)
        assert r.status == 200
        assert '<form method="post"' not in r.text and "<button" not in r.text.replace('<button type="submit">filter', ""), path
        assert "csrf_token" not in r.text and "Set-Cookie" not in r.headers
    for path, fields in [
        ("/dead/requeue", {"id": s.dead[0], "queue": qname}), ("/dead/delete", {"id": s.dead[1]}),
        (f"/jobs/{s.ready[0]}/cancel", {}), (f"/queues/{qname}/pause", {}), (f"/queues/{qname}/resume", {}),
    ]:
        assert readonly.post(path, fields).status == 403, path
    assert _state(store, s) == before


def _interrupted_form(qname: str, ids: list[int]) -> tuple[bytes, bytes, bytes]:
    """(the Cookie header, the start of a bulk delete's body that arrived, the rest that
    never did) for a dashboard whose CSRF secret is b"k"."""
    from alkstore_sa.dashboard.csrf import COOKIE, Csrf

    cookie = "c" * 43
    start = f"csrf_token={Csrf(b'k').token_for(cookie)}&queue={quote(qname)}&id={ids[0]}&"
    rest = "&".join(f"id={i}" for i in ids[1:])
    return f"{COOKIE}={cookie}".encode(), start.encode(), rest.encode()


def test_asgi_an_upload_cut_off_by_a_disconnect_is_not_acted_on(store: alk.Store, qname: str) -> None:
    """A client that goes away half way through sending a form (a closed tab, a dropped
    connection) sent only some of its fields: the dashboard must not run the action on
    that part (here: delete one of the two selected dead jobs). It answers 400."""
    import asyncio

    s = seed(store, qname, dead=2)
    cookie, start, rest = _interrupted_form(qname, s.dead)
    app = create_app(store, csrf_secret=b"k")
    messages = iter([
        {"type": "http.request", "body": start, "more_body": True},
        {"type": "http.disconnect"},
    ])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/dead/delete", "query_string": b"", "root_path": "",
        "headers": [
            (b"host", HOST.encode()), (b"cookie", cookie),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(len(start) + len(rest)).encode()),
        ],
    }
    asyncio.run(app(scope, receive, send))
    assert sorted(j.id for j in store.queue(qname).dead_jobs()) == s.dead
    assert sent[0]["status"] == 400  # answered all the same: nobody reads it


def test_wsgi_a_body_shorter_than_its_content_length_is_refused(store: alk.Store, qname: str) -> None:
    """A WSGI server hands over what arrived before the client went away: a body shorter
    than its Content-Length is a cut-off upload, refused (400) without acting on it."""
    import io
    from wsgiref.util import setup_testing_defaults

    from alkstore_sa.dashboard import create_wsgi_app

    s = seed(store, qname, dead=2)
    cookie, start, rest = _interrupted_form(qname, s.dead)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": "/dead/delete", "HTTP_HOST": HOST,
        "HTTP_COOKIE": cookie.decode(), "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(start) + len(rest)), "wsgi.input": io.BytesIO(start),
    }
    setup_testing_defaults(environ)
    statuses: list[str] = []
    create_wsgi_app(store, csrf_secret=b"k")(environ, lambda status, headers: statuses.append(status))
    assert statuses == ["400 Bad Request"]
    assert sorted(j.id for j in store.queue(qname).dead_jobs()) == s.dead


@pytest.mark.parametrize("action", ["requeue", "delete"])
def test_a_dead_job_another_operator_took_first_is_reported_not_acted_on(
    dash, store: alk.Store, qname: str, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operators on the same dead letters: a selected job that another operator
    requeued or deleted since the page was shown — before this action read it, or between
    its read and its own write — was silently skipped and the action answered 303 as if
    the whole selection had been done (a requeue of a job the other operator had deleted
    looked done; the job was gone for good). The answer (409) names each such job and says
    it is no longer a dead letter; the other selected jobs are acted on."""
    s = seed(store, qname, dead=3)
    early, late, kept = s.dead
    q = store.queue(qname)
    token = _token(dash, f"/queues/{qname}?state=dead")
    assert q.requeue_dead(early) is not None  # the other operator, before this action runs
    read = actions.stored_job

    def read_then_delete(st: alk.Store, i: int) -> tuple[alk.Job, str] | None:
        found = read(st, i)
        if i == late:  # ... and right after this action read the job as dead
            assert q.delete_dead(late)
        return found

    monkeypatch.setattr(actions, "stored_job", read_then_delete)
    r = dash.post(
        f"/dead/{action}",
        [("csrf_token", token), ("queue", qname), ("id", early), ("id", late), ("id", kept),
         ("next", f"/queues/{qname}?state=dead")],
    )
    monkeypatch.undo()
    assert r.status == 409, (r.status, r.headers.get("location"))
    done = "requeued" if action == "requeue" else "deleted"
    for job_id in (early, late):
        assert f"job {job_id} was not {done}: it is no longer a dead letter" in r.text
    assert f"job {kept} was not" not in r.text
    assert f'href="/queues/{qname}?state=dead"' in r.text
    assert q.dead_jobs() == [] and store.get_job(kept) is None  # the third one was acted on
    assert q.stats().ready == len(s.ready) + (2 if action == "requeue" else 1)


@pytest.mark.parametrize("action", ["requeue", "delete"])
def test_a_dead_job_whose_stored_queue_name_the_api_refuses_does_not_stop_the_others(
    dash, db: Target, store: alk.Store, qname: str, action: str
) -> None:
    """A dead row written by hand (or by another tool) under a queue name the API refuses
    (empty, over 200 characters) is listed on the every-queue dead letters page; a bulk
    requeue or delete selecting it answered 400 ("queue name must not be empty") after
    acting on the jobs before it and skipping those after. The delete removes it by the
    name stored (as ``alkstore sweep`` sweeps such a queue); the requeue, which would make
    a live job no worker could name, leaves it dead and says why (409), and both act on
    every other selected job."""
    q = store.queue(qname, max_attempts=1)
    first, odd, last = q.enqueue({"n": 1}), q.enqueue({"n": 2}), q.enqueue({"n": 3})
    for _ in range(3):
        h = q.claim_one("w")
        assert h is not None and h.fail("boom")
    db.execute(f"UPDATE {db.table('alkstore_dead_jobs')} SET queue = '' WHERE id = :id", id=odd)
    token = _token(dash, "/dead")
    r = dash.post(f"/dead/{action}", [("csrf_token", token), ("id", first), ("id", odd), ("id", last)])
    assert q.dead_jobs() == []  # both of this queue's jobs were acted on
    if action == "delete":
        assert r.status == 303, (r.status, r.text[:300])
        assert store.get_job(odd) is None
    else:
        assert r.status == 409, (r.status, r.text[:300])
        assert f"job {odd} was not requeued" in r.text and "queue name" in r.text
        job = store.get_job(odd)
        assert job is not None and job.state == "dead"
        assert q.stats().ready == 2


def test_a_pending_job_whose_stored_queue_name_the_api_refuses_can_be_cancelled(
    dash, db: Target, store: alk.Store, qname: str
) -> None:
    """A pending job written by hand (or by another tool) under a queue name the API
    refuses is listed and has its own page with a cancel button, but the cancel answered
    400 "queue name must not be empty" and left it: no worker can name that queue, so
    the dashboard was the way to remove it. The cancel deletes it by the name stored."""
    job_id = store.queue(qname).enqueue({"n": 1})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET queue = '' WHERE id = :id", id=job_id)
    token = _token(dash, f"/jobs/{job_id}")
    r = dash.post(f"/jobs/{job_id}/cancel", {"csrf_token": token, "next": "/"})
    assert r.status == 303, (r.status, r.text[-300:])
    assert store.get_job(job_id) is None
