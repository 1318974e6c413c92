"""Every dashboard page renders the seeded data (numbers and ids), on both engines and
through both adapters; pages are keyset-paged; hostile names and payloads are escaped."""

from __future__ import annotations

import html
import logging
import socket
import threading
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.dashboard.html import esc
from tests.conftest import ENGINES, require_pg
from tests.dashboard.conftest import make_browser
from tests.dashboard.seed import counts_in, job_ids, next_link, row_of, seed
from tests.support import PG_URL, FakeClock, Target, deepest_accepted, new_pg_schema, wait_for

NAV = ("nav-queues", "nav-dead", "nav-schedules", "nav-workers", "nav-streams")


def test_queues_page_counts_settings_and_json(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    store.queue(qname).set_concurrency(7)
    idle = qname + "-paused"
    store.queue(idle).pause()  # settings but no jobs: listed too
    r = dash.get("/")
    assert r.status == 200
    for ident in NAV:
        assert f'id="{ident}"' in r.text
    row = row_of(r.text, "data-queue", qname)
    assert counts_in(row) == {"ready": 3, "scheduled": 2, "processing": 1, "dead": 2}
    assert f'<a class="queue-link" href="/queues/{qname}">{qname}</a>' in row
    assert "concurrency 7" in row and 'class="pause-btn"' in row
    idle_row = row_of(r.text, "data-queue", idle)
    assert counts_in(idle_row) == {"ready": 0, "scheduled": 0, "processing": 0, "dead": 0}
    assert "paused" in idle_row and 'class="resume-btn"' in idle_row
    counts = dash.get("/api/counts").json()["queues"]
    assert counts[qname]["ready"] == 3 and counts[qname]["scheduled"] == 2
    assert counts[qname]["processing"] == 1 and counts[qname]["dead"] == 2
    assert counts[qname]["concurrency"] == 7 and counts[idle]["paused"] is True
    assert len(s.ready) == 3


def test_oldest_ready_age(dash, store: alk.Store, clock: FakeClock, qname: str) -> None:
    store.queue(qname).enqueue("old")
    clock.advance(125)
    row = row_of(dash.get("/").text, "data-queue", qname)
    assert "2m 05s" in row
    assert dash.get("/api/counts").json()["queues"][qname]["oldest_ready_age"] == pytest.approx(125)


@pytest.mark.parametrize("state", ["ready", "scheduled", "processing", "dead"])
def test_queue_page_lists_jobs_by_state(dash, store: alk.Store, qname: str, state: str) -> None:
    s = seed(store, qname)
    r = dash.get(f"/queues/{qname}?state={state}")
    assert r.status == 200
    assert job_ids(r.text) == getattr(s, state)
    for job_id in getattr(s, state):
        assert f'<a class="job-link" href="/jobs/{job_id}">' in r.text
    assert ('class="cancel-row-btn"' in r.text) == (state in ("ready", "scheduled"))
    assert ('id="bulk-requeue-btn"' in r.text) == (state == "dead")
    assert next_link(r.text) is None


def test_queue_page_default_state_and_bad_state(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    assert job_ids(dash.get(f"/queues/{qname}").text) == s.ready
    assert dash.get(f"/queues/{qname}?state=bogus").status == 400
    assert dash.get(f"/queues/{qname}?after=x").status == 400
    # digits of another script are no number here either (int() reads '\u0663' as 3)
    arabic_3 = "%D9%A3"
    assert dash.get(f"/queues/{qname}?after={arabic_3}").status == 400
    assert dash.get(f"/queues/{qname}?state=scheduled&run_at={arabic_3}&after=1").status == 400
    assert dash.get(f"/jobs/{arabic_3}").status == 404


def _ts(clock: FakeClock, offset: float = 0.0) -> str:
    return datetime.fromtimestamp(clock.now + offset, timezone.utc).isoformat(timespec="seconds")


def test_job_page_dead(dash, store: alk.Store, clock: FakeClock, qname: str) -> None:
    q = store.queue(qname, max_attempts=5)
    job_id = q.enqueue({"to": "a@example.com", "n": [1, 2]}, priority=3)
    h = q.claim_one("w")
    assert h is not None and h.retry("first failure", delay=0)
    clock.advance(10)
    h = q.claim_one("w")
    assert h is not None and h.fail("gave up")
    r = dash.get(f"/jobs/{job_id}")
    assert r.status == 200
    assert '<span id="job-state">dead</span>' in r.text
    assert "2 / 5" in r.text  # attempts / max_attempts
    assert html.escape('"to": "a@example.com"') in r.text  # pretty-printed payload
    assert "first failure" in r.text and "gave up" in r.text
    assert _ts(clock, -10) in r.text and _ts(clock) in r.text  # created / died, UTC ISO
    assert 'id="requeue-btn"' in r.text and 'id="delete-btn"' in r.text
    assert 'id="cancel-btn"' not in r.text


def test_job_page_live(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname)
    r = dash.get(f"/jobs/{s.ready[0]}")
    assert '<span id="job-state">pending</span>' in r.text and 'id="cancel-btn"' in r.text
    assert 'id="requeue-btn"' not in r.text
    r = dash.get(f"/jobs/{s.processing[0]}")
    assert '<span id="job-state">processing</span>' in r.text and "dash-worker" in r.text
    assert 'id="cancel-btn"' not in r.text
    assert dash.get("/jobs/999999999").status == 404
    assert dash.get("/jobs/99999999999999999999999").status == 404
    assert dash.get("/jobs/" + "9" * 5000).status == 404  # past int()'s digit limit: not a 500


@pytest.mark.parametrize(("stamp", "shown"), [(float("inf"), "inf"), (1e300, "1e+300s"), (-5.0, "-5.0s")])
def test_job_page_of_a_visibility_timeout_written_by_hand(
    dash, db: Target, store: alk.Store, qname: str, stamp: float, shown: str
) -> None:
    """A job whose visibility_timeout stamp was written by hand as infinity made its page
    answer 500 (OverflowError in the duration's layout); one of 1e300 was laid out as a
    count of days 300 digits long. Such a span is shown as stored."""
    job_id = store.queue(qname).enqueue(1)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET visibility_timeout = :v WHERE id = :id", v=stamp, id=job_id)
    r = dash.get(f"/jobs/{job_id}")
    assert r.status == 200 and f"<dt>visibility timeout</dt><dd>{shown}</dd>" in r.text


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_job_page_of_a_visibility_timeout_that_is_no_number(db: Target, kind: str, qname: str) -> None:
    """NaN (PostgreSQL stores it) or text (SQLite keeps it): the job's page answered 500
    (ValueError). It shows ``nan``."""
    store = db.store()
    browser = make_browser(kind, store)
    try:
        job_id = store.queue(qname).enqueue(1)
        stamp = float("nan") if db.kind == "postgresql" else "five minutes"
        db.execute(f"UPDATE {db.table('alkstore_jobs')} SET visibility_timeout = :v WHERE id = :id", v=stamp, id=job_id)
        r = browser.get(f"/jobs/{job_id}")
        assert r.status == 200 and "<dt>visibility timeout</dt><dd>nan</dd>" in r.text
    finally:
        browser.close()
        store.close()


@pytest.mark.parametrize("column", ["run_at", "created_at", "expires_at", "claimed_at", "claim_expires_at"])
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_sqlite_job_with_text_in_a_timestamp_is_read_and_listed(
    sqlite_db: Target, kind: str, column: str, qname: str
) -> None:
    """SQLite keeps the text a hand-written UPDATE puts in a job's timestamp column:
    reading the row raised TypeError, so get_job failed, and so did the job's page and its
    queue's listing (500 for every job listed with it). Text names no instant: it reads as
    the calendar's last, as NaN does (SQLite orders it after every number)."""
    store = sqlite_db.store()
    browser = make_browser(kind, store)
    try:
        q = store.queue(qname)
        job_id, other = q.enqueue(1, expires=3600), q.enqueue(2)
        state = "processing" if column.startswith("claim") else "pending"
        if state == "processing":
            assert len(q.claim_batch("w", 2)) == 2
        sqlite_db.execute(f"UPDATE alkstore_jobs SET {column} = 'yesterday' WHERE id = :id", id=job_id)
        job = q.get_job(job_id)
        assert job is not None and getattr(job, column) == datetime.max.replace(tzinfo=timezone.utc)
        assert browser.get(f"/jobs/{job_id}").status == 200
        listed: set[int] = set()
        for shown in ("processing",) if state == "processing" else ("ready", "scheduled"):
            r = browser.get(f"/queues/{qname}?state={shown}")
            assert r.status == 200
            listed.update(job_ids(r.text))
        assert {job_id, other} <= listed
    finally:
        browser.close()
        store.close()


def _one_dead_one_live(q: alk.Queue) -> tuple[int, int]:
    """A dead job and a pending one in ``q`` (their payloads to be spoiled by hand): their ids."""
    dead = q.enqueue({"b": 2})
    h = q.claim_one("w")
    assert h is not None and h.id == dead and h.fail("undecodable")
    return dead, q.enqueue({"a": 1})


def test_a_stored_payload_that_is_not_json_is_shown_as_stored(dash, db: Target, store: alk.Store, qname: str) -> None:
    """A payload column is text: a row written or edited by hand may hold no JSON, and a
    worker fails such a job ("fix the row and requeue it"). The pages list and show it as
    stored and its actions work; it made its queue's page, the dead letters of every
    queue, its job page and the requeue, delete and cancel actions answer 500."""
    q = store.queue(qname)
    dead, live = _one_dead_one_live(q)
    for table, job_id in (("alkstore_jobs", live), ("alkstore_dead_jobs", dead)):
        db.execute(f"UPDATE {db.table(table)} SET payload = :p WHERE id = :id", p="{'<not json>", id=job_id)
    shown = html.escape("{'<not json>")
    pages = (f"/queues/{qname}", "/dead", f"/queues/{qname}?state=dead", f"/jobs/{live}", f"/jobs/{dead}")
    for path in pages:
        r = dash.get(path)
        assert r.status == 200 and shown in r.text, path
    assert 'id="payload-error"' in dash.get(f"/jobs/{live}").text
    assert dash.get(f"/queues/{qname}?after={live}").status == 200  # a page starting at it
    token = dash.get("/").token()
    assert dash.post(f"/jobs/{live}/cancel", {"csrf_token": token}).status == 303
    assert dash.post("/dead/requeue", {"csrf_token": token, "id": dead}).status == 303
    assert store.get_job(live) is None and store.get_job(dead) is None
    (requeued,) = job_ids(dash.get(f"/queues/{qname}").text)
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET payload = 'x' WHERE id = :id", id=requeued)
    h = q.claim_one("w")
    assert h is not None and h.fail("again")
    assert dash.post("/dead/delete", {"csrf_token": token, "id": requeued}).status == 303
    assert q.stats() == alk.QueueStats(0, 0, 0, 0, None)


def _store_payload_bytes(db: Target, live: int, dead: int, hex_bytes: str) -> None:
    """Write these bytes as the TEXT payload of a live and a dead job, as a hand-written
    UPDATE can on SQLite (whatever they are)."""
    for table, job_id in (("alkstore_jobs", live), ("alkstore_dead_jobs", dead)):
        db.execute(f"UPDATE {table} SET payload = CAST(X'{hex_bytes}' AS TEXT) WHERE id = :id", id=job_id)


def test_sqlite_a_stored_payload_that_is_not_utf8_is_shown_with_its_bytes_escaped(sqlite_db: Target, qname: str) -> None:
    """SQLite keeps whatever bytes a hand-written UPDATE puts in a TEXT column: a payload
    that is not UTF-8 made its queue's page, the dead letters and its job page answer 500.
    They show it like any stored payload that is not JSON, its undecodable bytes as
    ``\\xNN``, and its actions work."""
    store = sqlite_db.store()
    dash = make_browser("wsgi", store)
    try:
        q = store.queue(qname)
        dead, live = _one_dead_one_live(q)
        _store_payload_bytes(sqlite_db, live, dead, "7B2261223A2280FF227D")  # {"a":"<80><FF>"}
        shown = html.escape('{"a":"\\x80\\xff"}')
        for path in (f"/queues/{qname}", "/dead", f"/queues/{qname}?state=dead", f"/jobs/{live}", f"/jobs/{dead}"):
            r = dash.get(path)
            assert r.status == 200 and shown in r.text, (path, r.status)
        token = dash.get("/").token()
        assert dash.post(f"/jobs/{live}/cancel", {"csrf_token": token}).status == 303
        assert dash.post("/dead/delete", {"csrf_token": token, "id": dead}).status == 303
        assert store.get_job(live) is None and store.get_job(dead) is None
    finally:
        dash.close()
        store.close()


def test_sqlite_a_stored_payload_holding_a_nul_byte_is_listed_past_it(sqlite_db: Target, qname: str) -> None:
    """SQLite's text functions stop at a NUL byte, which a hand-written UPDATE can put in a
    TEXT column: a list that let the database cut each payload (substr) showed such a
    payload only up to its first NUL. Lists show it as the job page does, past the NUL,
    cut at the list's length; a long payload of multi-byte characters too."""
    store = sqlite_db.store()
    dash = make_browser("wsgi", store)
    try:
        q = store.queue(qname)
        dead, live = _one_dead_one_live(q)
        _store_payload_bytes(sqlite_db, live, dead, "7B2261223A00227A227D")  # {"a":<NUL>"z"}
        wide = q.enqueue({"w": "日本" * 100})
        listed = html.escape('{"a":\x00"z"}')  # as stored, as the job page shows it
        for path in (f"/queues/{qname}", "/dead", f"/queues/{qname}?state=dead"):
            assert f"<code>{listed}</code>" in dash.get(path).text, path
        assert html.escape('{"w":"' + "日本" * 36 + "日") + "…" in dash.get(f"/queues/{qname}").text
        assert store.get_job(wide) is not None
    finally:
        dash.close()
        store.close()


def _strict_json(text: str) -> object:
    """JSON as the standard has it: ``Infinity`` and ``NaN`` (which a browser's
    ``JSON.parse`` refuses) are errors."""
    import json

    def refuse(constant: str) -> object:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_timestamps_written_by_hand_past_the_calendar_are_shown(dash, db: Target, store: alk.Store, qname: str) -> None:
    """A timestamp column is a float: a row written by hand may hold one no date has
    (``1e300``, an infinity). Every page showing such a job answered 500 (and the counts
    JSON said ``Infinity``): the dates are shown as the calendar's first or last instant,
    and the oldest ready job's age stays a number."""
    q = store.queue(qname)
    dead = q.enqueue({"b": 2})
    h = q.claim_one("w")
    assert h is not None and h.fail("boom")
    live = q.enqueue({"a": 1})
    db.execute(
        f"UPDATE {db.table('alkstore_jobs')} SET run_at = :past, created_at = :far WHERE id = :id",
        past=float("-inf"), far=1e300, id=live,
    )
    db.execute(
        f"UPDATE {db.table('alkstore_dead_jobs')} SET died_at = :inf, created_at = :low WHERE id = :id",
        inf=float("inf"), low=-1e300, id=dead,
    )
    for path in ("/", f"/queues/{qname}", f"/queues/{qname}?state=dead", "/dead", f"/jobs/{live}", f"/jobs/{dead}"):
        r = dash.get(path)
        assert r.status == 200, (path, r.status)
    assert "9999-12-31T23:59:59+00:00" in dash.get(f"/jobs/{dead}").text
    assert "0001-01-01T00:00:00+00:00" in dash.get(f"/jobs/{live}").text
    counts = _strict_json(dash.get("/api/counts").text)["queues"][qname]  # type: ignore[index]
    assert counts["ready"] == 1 and counts["oldest_ready_age"] > 0


def test_counts_json_is_strict_json_with_a_window_written_by_hand_as_infinity(
    dash, db: Target, store: alk.Store, qname: str
) -> None:
    """A settings row written by hand with an infinite rate window: the counts JSON said
    ``Infinity``, which a browser's ``JSON.parse`` refuses (the whole document with it).
    It says the string ``"Infinity"``; the queues page says ``rate 5/inf`` (it said
    ``rate 5/infs``, as ``alkstore status`` did)."""
    q = store.queue(qname)
    q.enqueue({"a": 1})
    q.set_rate_limit(5, per=60)
    db.execute(f"UPDATE {db.table('alkstore_queue_settings')} SET rate_per = :inf WHERE queue = :q", inf=float("inf"), q=qname)
    counts = _strict_json(dash.get("/api/counts").text)["queues"][qname]  # type: ignore[index]
    assert (counts["rate_limit"], counts["rate_per"], counts["ready"]) == (5, "Infinity", 1)
    assert ">rate 5/inf</td>" in dash.get("/").text  # a unit after it read "infs"


def test_a_worker_row_with_timestamps_past_the_calendar_is_listed(dash, db: Target, store: alk.Store, qname: str) -> None:
    """A registry row written by hand with a timestamp no date has (``1e300``) made the
    workers page answer 500 and ``store.workers()`` raise OverflowError."""
    db.execute(
        f"INSERT INTO {db.table('alkstore_workers')} (id, hostname, pid, queues, concurrency, started_at, "
        "last_seen, expires_at) VALUES (:id, 'h', 1, :queues, 1, :low, :high, :high)",
        id=qname, queues=f'["{qname}"]', low=-1e300, high=1e300,
    )
    try:
        (worker,) = [w for w in store.workers() if w.id == qname]
        assert worker.started_at.year == 1 and worker.last_seen.year == 9999
        r = dash.get("/workers")
        assert r.status == 200 and f'data-worker="{qname}"' in r.text
    finally:
        db.execute(f"DELETE FROM {db.table('alkstore_workers')} WHERE id = :id", id=qname)


@pytest.mark.parametrize(
    ("stored", "queues"),
    [
        ("not json", ("not json",)),
        ("a,b", ("a,b",)),
        ('"emails"', ('"emails"',)),
        ("7", ("7",)),
        ('["emails", 5, null]', ("emails", "5", "null")),
    ],
)
def test_a_worker_row_whose_queues_are_not_a_json_list_of_names_is_listed(
    dash, db: Target, store: alk.Store, qname: str, stored: str, queues: tuple[str, ...]
) -> None:
    """A registry row written by hand (or by another tool) whose ``queues`` is not a JSON
    list of names made ``store.workers()`` raise (JSONDecodeError, TypeError), and with it
    ``alkstore status`` ("unexpected error") and the workers page, for every worker; a JSON
    string was split into its characters. The row is listed: a JSON list's items as names
    (any other item as its JSON text), anything else as one name, the text as stored."""
    db.execute(
        f"INSERT INTO {db.table('alkstore_workers')} (id, hostname, pid, queues, concurrency, started_at, "
        "last_seen, expires_at) VALUES (:id, 'h', 1, :queues, 1, 0, 0, :high)",
        id=qname, queues=stored, high=1e300,
    )
    try:
        (worker,) = [w for w in store.workers() if w.id == qname]
        assert worker.queues == queues
        r = dash.get("/workers")
        assert r.status == 200 and f'data-worker="{qname}"' in r.text
    finally:
        db.execute(f"DELETE FROM {db.table('alkstore_workers')} WHERE id = :id", id=qname)


@pytest.mark.parametrize(
    ("column", "stored", "shown"),
    [
        ("pid", "abc", "abc"),
        ("pid", 3.5, "3.5"),
        ("pid", float("inf"), "inf"),
        ("concurrency", "four", "four"),
        ("started_at", "yesterday", None),
        ("last_seen", "now", None),
    ],
)
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_sqlite_worker_row_with_text_where_a_number_belongs_is_listed(
    sqlite_db: Target, kind: str, column: str, stored: object, shown: str | None
) -> None:
    """SQLite keeps the text (or a fraction) a hand-written UPDATE puts in the registry's
    integer and timestamp columns: ``store.workers()`` raised ValueError (OverflowError for
    an infinite pid; a fraction was cut to an integer), and with it ``alkstore status`` and
    the workers page, for every worker. A pid or concurrency that is not an integer is
    listed as its text as stored; a timestamp that is not a number as the calendar's last
    instant (as NaN reads)."""
    store = sqlite_db.store()
    browser = make_browser(kind, store)
    try:
        sqlite_db.execute(
            "INSERT INTO alkstore_workers (id, hostname, pid, queues, concurrency, started_at, last_seen, "
            "expires_at) VALUES ('w', 'h', 1, '[\"a\"]', 1, 0, 0, :high)",
            high=1e300,
        )
        sqlite_db.execute(f"UPDATE alkstore_workers SET {column} = :v", v=stored)
        (worker,) = store.workers()
        value = getattr(worker, column)
        if shown is None:
            assert value == datetime.max.replace(tzinfo=timezone.utc)
        else:
            assert value == shown
        r = browser.get("/workers")
        assert r.status == 200 and 'data-worker="w"' in r.text
    finally:
        browser.close()
        store.close()


def test_a_schedule_whose_stored_payload_is_not_json_is_listed_as_stored(
    dash, db: Target, store: alk.Store, qname: str
) -> None:
    """One schedule row edited by hand to a payload that is not JSON made the schedules
    page answer 500 for every schedule; it lists that payload as stored."""
    store.schedule(f"{qname}-broken", "@every 1h", qname, {"a": 1})
    store.schedule(f"{qname}-fine", "@every 1h", qname, {"b": 2})
    db.execute(f"UPDATE {db.table('alkstore_schedules')} SET payload = '{{oops' WHERE name = :n", n=f"{qname}-broken")
    try:
        r = dash.get("/schedules")
    finally:  # tests of one PostgreSQL module share the schedules table
        store.unschedule(f"{qname}-broken")
    assert r.status == 200
    assert "{oops" in row_of(r.text, "data-schedule", f"{qname}-broken")
    assert html.escape('{"b":2}') in row_of(r.text, "data-schedule", f"{qname}-fine")


def test_dead_page_every_queue_and_filter(dash, store: alk.Store, qname: str) -> None:
    a = seed(store, qname + "-a", ready=0, scheduled=0, processing=0, dead=2)
    b = seed(store, qname + "-b", ready=0, scheduled=0, processing=0, dead=1)
    r = dash.get("/dead")
    ids = job_ids(r.text)
    mine = [i for i in ids if i in a.dead + b.dead]
    assert mine == sorted(a.dead + b.dead, reverse=True)  # newest first
    assert 'id="bulk-requeue-btn"' in r.text and 'id="bulk-delete-btn"' in r.text
    r = dash.get(f"/dead?queue={qname}-a")
    assert job_ids(r.text) == sorted(a.dead, reverse=True)


def _walk(dash, first: str) -> list[int]:
    seen: list[int] = []
    link: str | None = first
    pages = 0
    while link is not None:
        r = dash.get(link)
        assert r.status == 200
        seen += job_ids(r.text)
        link = next_link(r.text)
        pages += 1
        assert pages < 10
    return seen


def test_keyset_paging_walks_every_page(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname, ready=120, scheduled=0, processing=0, dead=101)
    ready = _walk(dash, f"/queues/{qname}?state=ready")
    assert ready == s.ready  # 50 + 50 + 20, no duplicates, no misses, id order
    dead = _walk(dash, f"/queues/{qname}?state=dead")
    assert dead == s.dead
    by_dead_page = _walk(dash, f"/dead?queue={qname}")
    assert by_dead_page == sorted(s.dead, reverse=True)
    first = dash.get(f"/queues/{qname}?state=ready")
    assert len(job_ids(first.text)) == 50
    link = next_link(first.text)
    assert link is not None and link.startswith(f"/queues/{qname}?state=ready&") and link.endswith(f"&after={s.ready[49]}")


def test_ready_and_scheduled_pages_walk_claim_order(dash, store: alk.Store, clock: FakeClock, qname: str) -> None:
    """Mixed priorities and run_at ties across page boundaries: every job once, in the
    order claims take them (priority DESC, run_at, id)."""
    q = store.queue(qname)
    ready_keys: list[tuple[int, float, int]] = []
    later_keys: list[tuple[int, float, int]] = []
    for round_ in range(3):
        for priority in (5, 0, -3):
            for job_id in q.enqueue_many([{"r": round_}] * 23, priority=priority):
                ready_keys.append((-priority, clock.now, job_id))
            for job_id in q.enqueue_many([{"later": round_}] * 7, priority=priority, delay=600 - round_):
                later_keys.append((-priority, clock.now + 600 - round_, job_id))
        clock.advance(1)
    ready = [j for (_, _, j) in sorted(ready_keys)]
    scheduled = [j for (_, _, j) in sorted(later_keys)]
    assert len(ready) == 207 and len(scheduled) == 63
    assert _walk(dash, f"/queues/{qname}?state=ready") == ready
    assert _walk(dash, f"/queues/{qname}?state=scheduled") == scheduled
    claimed = [h.id for h in q.claim_batch("w", 10)]
    assert claimed == ready[:10]
    # a hand-made ?after=ID resumes after that job's place in claim order
    assert job_ids(dash.get(f"/queues/{qname}?state=ready&after={ready[60]}").text) == ready[61:111]


def test_lists_read_only_the_start_of_each_payload(dash, db: Target, qname: str) -> None:
    """A list shows the first 80 characters of each payload, so its read fetches no more:
    fetched whole, a page of 50 jobs of the store's largest payloads (a 16 MiB limit) cost
    the dashboard process 800 MB and seconds for 4 kB of HTML. Every list (each state of
    a queue, the dead letters of one or every queue) holds at most 81 characters of a
    payload (one more than shown says it goes on), and shows the same start as before."""
    from alkstore_sa.dashboard.reads import dead_page, jobs_page

    store = db.store(max_payload_bytes=1 << 20)
    try:
        q = store.queue(qname)
        big = {"blob": "é" * 100_000, "tail": "<end>"}
        claimed = q.enqueue_many([big] * 3)
        handles = q.claim_batch("w", 3)
        assert [h.id for h in handles] == claimed
        assert handles[0].fail("boom")
        q.enqueue(big)
        q.enqueue(big, delay=3600)
        pages = [jobs_page(store, qname, state) for state in ("ready", "scheduled", "processing", "dead")]
        pages += [dead_page(store, qname, None), dead_page(store, None, None)]
        for page in pages:
            lengths = [len(text) for text in page.payloads]
            assert lengths and max(lengths) <= 81, lengths
        preview = html.escape('{"blob":"' + "é" * 70)
        for path in (f"/queues/{qname}", f"/queues/{qname}?state=dead", "/dead"):
            text = make_browser("wsgi", store).get(path).text
            assert f"<code>{preview}…</code>" in text, path
    finally:
        store.close()


def test_keyset_page_survives_rows_leaving(dash, store: alk.Store, qname: str) -> None:
    s = seed(store, qname, ready=60, scheduled=0, processing=0, dead=0)
    first = dash.get(f"/queues/{qname}?state=ready")
    store.queue(qname).cancel(s.ready[10])  # a row of the page already shown goes away
    rest = job_ids(dash.get(next_link(first.text) or "").text)
    assert rest == s.ready[50:]


def test_schedules_page(dash, store: alk.Store, qname: str) -> None:
    store.schedule(qname + "-nightly", "0 3 * * *", qname, {"job": "report"}, tz="Europe/Paris")
    r = dash.get("/schedules")
    row = row_of(r.text, "data-schedule", qname + "-nightly")
    (sched,) = [x for x in store.schedules() if x.name == qname + "-nightly"]
    assert "0 3 * * *" in row and "Europe/Paris" in row and qname in row
    assert sched.next_fire_at.isoformat(timespec="seconds") in row


def test_streams_page(dash, store: alk.Store, qname: str) -> None:
    st = store.stream(qname)
    for i in range(5):
        st.publish(i)
    st.commit("billing", 2)
    st.commit("audit", 5)
    r = dash.get("/streams")
    assert f'<section data-stream="{qname}">' in r.text
    section = r.text.split(f'<section data-stream="{qname}">')[1].split("</section>")[0]
    assert "<span class=\"num\" data-last-offset>5</span>" in section
    assert '<td class="num" data-lag>3</td>' in row_of(section, "data-consumer", "billing")
    assert '<td class="num" data-lag>0</td>' in row_of(section, "data-consumer", "audit")


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_sqlite_stream_whose_offsets_were_written_by_hand_as_text_is_listed(sqlite_db: Target, kind: str) -> None:
    """SQLite keeps the text an UPDATE puts in a stream's counter or a consumer's committed
    offset: the streams page read them with int() and answered 500, for every stream. Each
    is listed as stored (escaped), its lag as "-"; the other streams as ever."""
    store = sqlite_db.store()
    browser = make_browser(kind, store)
    try:
        for name in ("odd", "fine"):
            store.stream(name).publish(1)
            store.stream(name).commit("c", 1)
        sqlite_db.execute("UPDATE alkstore_streams SET last_offset = '<b>two</b>' WHERE name = 'odd'")
        sqlite_db.execute("UPDATE alkstore_stream_offsets SET \"offset\" = 'one' WHERE stream = 'odd'")
        r = browser.get("/streams")
        assert r.status == 200
        odd = r.text.split('<section data-stream="odd">')[1].split("</section>")[0]
        assert "data-last-offset>&lt;b&gt;two&lt;/b&gt;</span>" in odd
        assert "<td>one</td>" in row_of(odd, "data-consumer", "c") and "data-lag>-</td>" in odd
        fine = r.text.split('<section data-stream="fine">')[1].split("</section>")[0]
        assert "data-last-offset>1</span>" in fine and '<td class="num" data-lag>0</td>' in fine
    finally:
        browser.close()
        store.close()


class _Fetched:
    """A statement's rows, already fetched (what the store's statement runner returns)."""

    def __init__(self, rows: list[tuple[object, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[object, ...]]:
        return self.rows


def test_streams_page_reads_offsets_and_consumers_as_of_one_instant(
    db: Target, qname: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events are published and a consumer commits past the old end right after the page's
    first read of the streams table: the page still shows one instant, so no consumer
    stands past its stream's last offset."""
    writer = db.store()
    viewer = db.store()
    st = writer.stream(qname)
    for i in range(3):
        st.publish(i)
    st.commit("audit", 3)
    backend = viewer.backend
    make_runner = backend.statement_runner
    fired: list[str] = []

    def runner(dbapi: object) -> object:
        run = make_runner(dbapi)

        def execute(sql: str, params: object) -> object:
            result = run(sql, params)
            if not fired and "alkstore_streams" in sql and sql.lstrip().upper().startswith("SELECT"):
                fired.append(sql)
                rows = result.fetchall()  # the read is done; then the others write
                st.publish(3)
                st.publish(4)
                st.commit("audit", 5)
                return _Fetched(rows)
            return result

        return execute

    monkeypatch.setattr(backend, "statement_runner", runner)  # before the viewer connects
    dash = make_browser("wsgi", viewer)
    try:
        r = dash.get("/streams")
    finally:
        dash.close()
        viewer.close()
        writer.close()
    assert r.status == 200 and fired, r.text
    section = r.text.split(f'<section data-stream="{qname}">')[1].split("</section>")[0]
    assert '<span class="num" data-last-offset>3</span>' in section, section
    audit = row_of(section, "data-consumer", "audit")
    assert "<td>3</td>" in audit and '<td class="num" data-lag>0</td>' in audit, audit


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_workers_page(kind: str, dbstore: alk.Store, qname: str) -> None:
    """A running worker (on the database's clock: its registry row is live in real time)."""
    dash = make_browser(kind, dbstore)
    stop = alk.StopToken()
    worker = alk.Worker(dbstore, [qname, qname + "-b"], lambda job: None, concurrency=3, poll_interval=0.1)
    t = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    t.start()
    try:
        (info,) = wait_for(lambda: [w for w in dbstore.workers() if qname in w.queues], "worker registered")
        r = dash.get("/workers")
        row = row_of(r.text, "data-worker", info.id)
        assert f"<td>{info.pid}</td>" in row and f"<td>{info.hostname}</td>" in row
        assert f"<td>{qname}, {qname}-b</td>" in row and "<td>3</td>" in row
        assert info.started_at.isoformat(timespec="seconds") in row
    finally:
        stop.stop()
        t.join(30)
        dash.close()


def test_hostile_names_and_payloads_are_escaped(dash, store: alk.Store, qname: str) -> None:
    name = f'{qname}<script>alert("q")</script>&'
    q = store.queue(name)
    job_id = q.enqueue({"x": "</pre><script>alert(1)</script>", "<k>": "'\""})
    h = q.claim_one("w<img src=x>")
    assert h is not None and h.fail("<b>err</b>")
    for path in ("/", "/dead", f"/jobs/{job_id}", "/queues/" + _quote(name) + "?state=dead"):
        r = dash.get(path)
        assert r.status == 200, path
        assert "<script>alert" not in r.text and "<b>err" not in r.text and "<img" not in r.text, path
    assert html.escape(name) in dash.get("/").text
    assert f'href="/queues/{_quote(name)}"' in dash.get("/").text


def test_queues_named_with_line_breaks_have_their_pages_and_actions(dash, store: alk.Store, qname: str) -> None:
    """A queue name may hold a line break (the library takes it): the queues page links
    to its page, which answered 404 (the routes' ``.`` stopped at the newline), and its
    pause and resume buttons did too."""
    for name in (f"{qname}\nb", f"{qname}\r\nc", f"{qname}\n"):
        q = store.queue(name)
        q.enqueue({"n": 1})
        link = f'href="/queues/{_quote(name)}"'
        assert link in dash.get("/").text, name
        page = dash.get(f"/queues/{_quote(name)}")
        assert page.status == 200 and esc(name) in page.text, (name, page.status)
        token = page.token()
        assert dash.post(f"/queues/{_quote(name)}/pause", {"csrf_token": token}).status == 303, name
        assert q.settings().paused is True, name
        assert dash.post(f"/queues/{_quote(name)}/resume", {"csrf_token": token}).status == 303, name
        assert q.settings().paused is False, name


def test_payloads_with_lone_surrogates_are_shown_as_json_escapes(dash, store: alk.Store, qname: str) -> None:
    """A payload may hold lone surrogates (they round-trip, SPEC §5); the pages that show
    it (the job, its queue's list, the dead letters, the schedules) write them as the JSON
    escapes they were stored as, instead of failing to encode the page as UTF-8 (500)."""
    q = store.queue(qname)
    live = q.enqueue({"k\udfff": "a\ud800b"})
    dead = q.enqueue(["\udc00"])
    for h in q.claim_batch("w", 2):
        if h.id == dead:
            assert h.fail("boom")
        else:
            assert h.retry("again", delay=0)
    store.schedule(f"{qname}-s", "* * * * *", qname, "x\udbff")
    pages = {
        f"/jobs/{live}": ['"k\\udfff": "a\\ud800b"'],
        f"/jobs/{dead}": ['"\\udc00"'],
        f"/queues/{qname}": ['{"k\\udfff":"a\\ud800b"}'],
        "/dead": ['["\\udc00"]'],
        "/schedules": ['"x\\udbff"'],
    }
    for path, shown in pages.items():
        r = dash.get(path)
        assert r.status == 200, path
        for text in shown:
            assert html.escape(text) in r.text, (path, text)


def test_the_deepest_payload_accepted_is_shown(dash, store: alk.Store, qname: str) -> None:
    """A payload nested as deeply as enqueue accepts is shown on the job page and in its
    queue's list; encoding it again from under the web server's and the app's frames ran
    out of recursion depth (500)."""
    depth, job_id = deepest_accepted(store.queue(qname).enqueue)
    r = dash.get(f"/jobs/{job_id}")
    assert r.status == 200
    payload = html.unescape(r.text.split('<pre id="payload">')[1].split("</pre>")[0])
    assert payload.replace(" ", "").replace("\n", "") == "[" * depth + "]" * depth
    r = dash.get(f"/queues/{qname}")
    assert r.status == 200 and f'data-job-id="{job_id}"' in r.text and "[" * 70 in r.text


def test_a_payload_whose_indented_form_is_huge_is_shown_compact(dash, store: alk.Store, qname: str) -> None:
    """Indenting multiplies a deeply nested payload: 3,000 numbers 400 levels down (10 kB
    of JSON) would take 2.4 MB laid out, and a payload within the 1 MiB limit hundreds of
    MB (a page that could exhaust the dashboard's memory). Past 2 MiB the job page shows
    the payload compact, and says so."""
    nested: list[object] = []
    inner = nested
    for _ in range(399):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    inner.extend([0] * 3000)
    job_id = store.queue(qname).enqueue(nested)
    r = dash.get(f"/jobs/{job_id}")
    assert r.status == 200 and len(r.text) < 100_000
    assert 'id="payload-note"' in r.text
    assert "[" * 400 + "0,0," in r.text.split('<pre id="payload">')[1]
    small = store.queue(qname).enqueue({"a": [1]})
    r = dash.get(f"/jobs/{small}")
    assert 'id="payload-note"' not in r.text and html.escape('"a": [\n    1\n  ]') in r.text


def test_dead_lists_cut_long_errors(dash, store: alk.Store, qname: str) -> None:
    """``fail(error)`` stores an error of up to 100,000 characters (a worker cuts a
    handler's at 10,000; code that claims jobs itself may keep a whole response body): the
    dead letter lists show the start of each, as they do of payloads, and the job page all
    of it."""
    q = store.queue(qname)
    job_id = q.enqueue(1)
    h = q.claim_one("w")
    error = "E" * 200 + "x" * 99_800
    assert h is not None and h.fail(error)
    for path in ("/dead", f"/queues/{qname}?state=dead", f"/dead?queue={qname}"):
        r = dash.get(path)
        assert r.status == 200 and "E" * 200 in r.text and "x" * 1000 not in r.text, path
    assert error in dash.get(f"/jobs/{job_id}").text


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def test_unknown_paths_and_methods(dash) -> None:
    assert dash.get("/nope").status == 404
    assert dash.get("/static/../app.py").status == 404
    assert dash.get("/dead/requeue").status == 405
    assert dash.get("/static/dashboard.js").status == 200
    css = dash.get("/static/dashboard.css")
    assert css.status == 200 and css.headers["content-type"].startswith("text/css")


def test_security_headers(dash) -> None:
    r = dash.get("/")
    assert r.headers["x-frame-options"] == "DENY"
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert "<script src=\"/static/dashboard.js\"" in r.text and "http" not in r.text.split("<body")[0]


def test_extreme_priorities_are_listed(dash, store: alk.Store, qname: str) -> None:
    q = store.queue(qname)
    top = q.enqueue("top", priority=2**31 - 1)
    bottom = q.enqueue("bottom", priority=-(2**31))
    middle = q.enqueue_many(["m"] * 60)
    assert _walk(dash, f"/queues/{qname}?state=ready") == [top, *middle, bottom]


def test_invalid_queue_names_are_400(dash, store: alk.Store, qname: str) -> None:
    store.queue(qname).enqueue(1)  # a queue row, so the page has a form (and a token)
    assert dash.get("/queues/__alkstore_reserved").status == 400
    assert dash.get("/queues/" + "x" * 201).status == 400
    assert dash.get("/dead?queue=__alkstore_reserved").status == 400
    token = dash.get("/").token()
    assert dash.post("/queues/__alkstore_reserved/pause", {"csrf_token": token}).status == 400


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_database_without_the_tables_is_a_clear_503_not_an_internal_error(
    kind: str, engine: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A dashboard mounted on a database whose alkstore tables are missing (not migrated
    yet, a wrong --schema) answers 503 with the typed error's message, which says how to
    install them, and logs that one line: not 500 "internal error" with a traceback, as
    for a bug."""
    if engine == "sqlite":
        url, schema = f"sqlite:///{tmp_path / 'empty.db'}", "alkstore"
        sa.create_engine(url).dispose()
    else:
        require_pg()
        url, schema = PG_URL, new_pg_schema("never_installed")  # never created
    store = alk.Store(url, schema=schema)
    b = make_browser(kind, store)
    try:
        with caplog.at_level(logging.ERROR, logger="alkstore_sa.dashboard"):
            for path in ("/", "/api/counts", "/queues/q", "/dead"):
                r = b.get(path)
                assert r.status == 503, (path, r.status)
                assert "alkstore migrate" in html.unescape(r.text) and "internal error" not in r.text, path
        assert caplog.records and all(rec.exc_info is None for rec in caplog.records)
        assert "alkstore migrate" in caplog.records[0].getMessage()
    finally:
        b.close()
        store.close()


@pytest.mark.parametrize("how", ["refused", "timeout"])
@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_database_that_cannot_be_reached_is_a_503_not_an_internal_error(
    kind: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database outage answers 503 saying the database cannot be reached, logged as one
    line: an open queues page polls every few seconds, and a traceback per poll would bury
    the log. Other database errors (but a refused privilege, below) stay 500s with their
    traceback (they may be bugs).
    ``refused``: nothing listens where the URL points. ``timeout``: a server that never
    answers, given up on by the URL's connect_timeout as the docs advise (was a 500 and a
    traceback per request: psycopg's ConnectionTimeout was not taken for an outage)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        if how == "refused":
            s.close()  # nothing listens on the port
            url = f"postgresql://postgres@127.0.0.1:{port}/test"
        else:
            s.listen(64)  # connections accepted by the kernel, never answered
            url = f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=1"
        _unreachable_pages(kind, url, caplog)


def _unreachable_pages(kind: str, url: str, caplog: pytest.LogCaptureFixture) -> None:
    store = alk.Store(url)
    b = make_browser(kind, store)
    try:
        with caplog.at_level(logging.ERROR, logger="alkstore_sa.dashboard"):
            for path in ("/", "/api/counts", "/dead"):
                r = b.get(path)
                assert r.status == 503, (path, r.status)
                text = html.unescape(r.text)
                assert "cannot be reached" in text and "internal error" not in text, (path, text)
        assert caplog.records and all(rec.exc_info is None for rec in caplog.records)
        assert "cannot be reached" in caplog.records[0].getMessage()
    finally:
        b.close()
        store.close()


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_a_role_refused_a_privilege_is_a_clear_503_not_an_internal_error(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A dashboard served by a role that may not do what a page or an action asks (a
    monitoring role granted SELECT only, with actions left on; a table a later schema step
    added that the role was never granted) answers 503 naming what the database refused and
    what to grant or switch off, logged as one line: the role's configuration, not a bug, and
    an open queues page polls every few seconds (it was a 500 "internal error" and a
    traceback per request)."""
    require_pg()
    import uuid

    from alkstore_sa import migrations

    schema, role = new_pg_schema("dashrole"), f"alk_dash_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL)
    migrations.upgrade(admin, schema=schema)
    with admin.begin() as c:
        c.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        c.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        c.exec_driver_sql(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        c.exec_driver_sql(f'REVOKE SELECT ON "{schema}".alkstore_workers FROM "{role}"')
    with alk.Store(admin, schema=schema) as owner:
        owner.queue("q").enqueue(1)
    url = sa.make_url(PG_URL).set(username=role).render_as_string(hide_password=False)
    store = alk.Store(url, schema=schema)
    b = make_browser(kind, store)
    try:
        with caplog.at_level(logging.ERROR, logger="alkstore_sa.dashboard"):
            assert b.get("/queues/q").status == 200  # reading what it was granted works
            r = b.get("/workers")
            assert r.status == 503, r.status
            text = html.unescape(r.text)
            assert "permission denied for table alkstore_workers" in text and "internal error" not in text, text
            assert "runtime GRANTs" in text, text
            r = b.post("/queues/q/pause", {"csrf_token": b.get("/").token()})
            assert r.status == 503, r.status
            text = html.unescape(r.text)
            assert "permission denied for table alkstore_queue_settings" in text, text
            assert "read_only" in text, text
        assert len(caplog.records) == 2 and all(rec.exc_info is None for rec in caplog.records), caplog.records
        assert "permission denied" in caplog.records[0].getMessage()
        with alk.Store(admin, schema=schema) as owner:
            assert owner.queue("q").settings().paused is False  # nothing written
    finally:
        b.close()
        store.close()
        with admin.begin() as c:
            c.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
            c.exec_driver_sql(f'DROP OWNED BY "{role}"')
            c.exec_driver_sql(f'DROP ROLE "{role}"')
        admin.dispose()


@pytest.mark.parametrize("kind", ["wsgi", "asgi"])
def test_an_action_on_a_sqlite_file_opened_read_only_is_a_clear_503(
    kind: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's counterpart: the dashboard's store opened the file read-only (mode=ro). The
    pages read; an action answers 503 saying the database is read-only and to serve a
    read-only dashboard, logged as one line (was a 500 and a traceback)."""
    path = tmp_path / "app.db"
    with alk.Store(f"sqlite:///{path}") as owner:
        owner.install()
        owner.queue("q").enqueue(1)
    store = alk.Store(f"sqlite:///file:{path}?mode=ro&uri=true")
    b = make_browser(kind, store)
    try:
        with caplog.at_level(logging.ERROR, logger="alkstore_sa.dashboard"):
            assert b.get("/queues/q").status == 200
            r = b.post("/queues/q/pause", {"csrf_token": b.get("/").token()})
            assert r.status == 503, r.status
            text = html.unescape(r.text)
            assert "readonly database" in text and "read-only dashboard" in text, text
        assert len(caplog.records) == 1 and caplog.records[0].exc_info is None, caplog.records
    finally:
        b.close()
        store.close()
