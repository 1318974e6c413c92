"""The dashboard in a real browser (headless Chromium, see ``browser.py``), served by the
``alkstore dashboard`` command on both engines: the queue counts it shows are the store's;
from a queue to the dead letters to a dead job, its requeue button moves the job back to
ready (the queues page shows dead down by one, ready up by one); a ``--read-only`` server
shows no action; a form POSTed from another origin is refused and changes nothing; and no
page loads anything from another origin. Screenshots go to each test's tmp_path."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import alkstore_sa as alk
from tests.dashboard import browser as browser_module
from tests.dashboard.browser import Dashboard, make_driver, require_browser, serve_dashboard
from tests.support import WAIT, Target

STATES = ("ready", "scheduled", "processing", "dead")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (each dashboard server has its own origin)."""
    require_browser()
    driver = make_driver()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def seeded(db: Target, qname: str) -> Iterator[tuple[alk.Store, dict[str, list[int]], dict[str, list[int]]]]:
    """Two queues of this test: ``A`` with 3 ready, 2 delayed, 1 processing and 2 dead jobs,
    ``B`` with 1 ready and 1 dead. Returns the store (real clock, as the server's), the dead
    job ids and the pending (ready and delayed) job ids by queue."""
    store = db.store()
    dead: dict[str, list[int]] = {}
    pending: dict[str, list[int]] = {}
    for name, ready, delayed, processing, dead_count in ((f"{qname}-a", 3, 2, 1, 2), (f"{qname}-b", 1, 0, 0, 1)):
        q = store.queue(name)
        for i in range(dead_count):  # enqueued and failed first: claims take the oldest
            q.enqueue({"n": i, "kind": "doomed"})
        for h in q.claim_batch("seeder", dead_count):
            assert h.fail(f"boom {h.id}")
        dead[name] = sorted(j.id for j in q.dead_jobs())
        for i in range(processing):
            q.enqueue({"n": i, "kind": "busy"})
        assert len(q.claim_batch("seeder", processing)) == processing
        pending[name] = [q.enqueue({"n": i, "kind": "ready"}) for i in range(ready)]
        pending[name] += [q.enqueue({"n": i, "kind": "later"}, delay=3600) for i in range(delayed)]
    try:
        yield store, dead, pending
    finally:
        store.close()


def store_counts(store: alk.Store, queue: str) -> dict[str, int]:
    s = store.queue(queue).stats()
    return {"ready": s.ready, "scheduled": s.pending - s.ready, "processing": s.processing, "dead": s.dead}


def page_counts(driver: Any, queue: str) -> dict[str, int]:
    """The count cells of ``queue``'s row on the queues page (integers only, by contract)."""
    from selenium.webdriver.common.by import By

    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]')
    return {
        state: int(row.find_element(By.CSS_SELECTOR, f'td[data-count="{state}"]').text.strip())
        for state in STATES
    }


def assert_same_origin(driver: Any, dash: Dashboard) -> None:
    """Every script, stylesheet/link, image and frame of the page, and every resource the
    browser actually fetched for it, comes from the dashboard's own origin."""
    origin = urlsplit(dash.base)
    urls = driver.execute_script(
        "const attrs = [...document.querySelectorAll('script[src], img[src], iframe[src]')].map(e => e.src)"
        "  .concat([...document.querySelectorAll('link[href]')].map(e => e.href));"
        "return attrs.concat(performance.getEntriesByType('resource').map(e => e.name));"
    )
    foreign = [u for u in urls if not u.startswith("data:")
               and (urlsplit(u).scheme, urlsplit(u).netloc) != (origin.scheme, origin.netloc)]
    assert not foreign, f"{driver.current_url} loads from another origin: {foreign}"


def wait_until(driver: Any, cond: Any, what: str, timeout: float = WAIT) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond, message=f"waiting for {what}")


# The page's script first refreshes the counts 5 s after it loaded (INTERVAL_MS): a wait for
# that refresh gets twelve times as long.
REFRESH_WAIT = 60.0


def wait_for_refresh(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    wait_until(driver, lambda d: d.find_element(By.ID, "queues").get_attribute("data-refreshed"),
               "the counts' refresh", REFRESH_WAIT)


def shot(driver: Any, tmp_path: Path, name: str) -> None:
    assert driver.save_screenshot(str(tmp_path / f"{name}.png")), f"screenshot {name} not saved"


def test_browser_launches_on_the_system_binaries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The driver runs Debian's chromedriver and chromium (Selenium Manager, which would
    download them, is never consulted) and renders a page."""
    from selenium.webdriver.common.by import By

    require_browser()
    with caplog.at_level(logging.DEBUG, logger="selenium.webdriver.common.driver_finder"):
        driver = make_driver()
    try:
        assert "Skipping Selenium Manager" in caplog.text, caplog.text
        driver.get("data:text/html,<title>probe</title><h1 id='h'>alkstore</h1>")
        assert driver.title == "probe"
        assert driver.find_element(By.ID, "h").text == "alkstore"
        caps = driver.capabilities
        assert caps["browserName"] in ("chrome", "chromium")
        # the Debian pair: chromedriver and the browser are the same build
        assert caps["chrome"]["chromedriverVersion"].split()[0] == caps["browserVersion"]
        shot(driver, tmp_path, "probe")
    finally:
        driver.quit()


@pytest.mark.parametrize("ci", [False, True])
def test_missing_browser_skips_outside_ci_and_fails_under_it(monkeypatch: pytest.MonkeyPatch, ci: bool) -> None:
    monkeypatch.setattr(browser_module, "CHROMEDRIVER", Path("/nonexistent/chromedriver"))
    monkeypatch.setattr(browser_module, "IN_CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="/nonexistent/chromedriver"):
        browser_module.require_browser()


def test_counts_navigation_and_requeue(browser: Any, db: Target, seeded: Any, qname: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    store, dead, _ = seeded
    qa, qb = f"{qname}-a", f"{qname}-b"
    target_id = dead[qa][0]
    with serve_dashboard(db) as dash:
        browser.get(dash.url("/"))
        shot(browser, tmp_path, "01-queues")
        assert_same_origin(browser, dash)
        for name in (qa, qb):
            assert page_counts(browser, name) == store_counts(store, name), name
        before = page_counts(browser, qa)
        assert before == {"ready": 3, "scheduled": 2, "processing": 1, "dead": 2}

        browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{qa}"] a.queue-link').click()
        wait_until(browser, lambda d: urlsplit(d.current_url).path.rstrip("/").endswith(f"/queues/{qa}"),
                   "the queue's page")
        shot(browser, tmp_path, "02-queue")
        assert_same_origin(browser, dash)
        assert qa in browser.find_element(By.TAG_NAME, "body").text

        browser.find_element(By.ID, "nav-dead").click()
        row = wait_until(
            browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{target_id}"]'),
            f"dead job {target_id} listed",
        )[0]
        shot(browser, tmp_path, "03-dead")
        assert_same_origin(browser, dash)
        listed = {int(r.get_attribute("data-job-id")) for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")}
        assert set(dead[qa]) | set(dead[qb]) <= listed

        row.find_element(By.CSS_SELECTOR, "a.job-link").click()
        state = wait_until(browser, lambda d: d.find_elements(By.ID, "job-state"), "the job page")[0]
        assert "dead" in state.text.lower()
        assert f"boom {target_id}" in browser.find_element(By.TAG_NAME, "body").text  # its error
        shot(browser, tmp_path, "04-job")
        assert_same_origin(browser, dash)

        browser.find_element(By.ID, "requeue-btn").click()
        wait_until(browser, lambda d: store.queue(qa).stats().dead == 1, "the requeue to land")
        shot(browser, tmp_path, "05-after-requeue")
        assert store.get_job(target_id) is None  # requeued as a fresh job (a new id)...
        assert store.queue(qa).stats().ready == before["ready"] + 1  # ...that is ready now

        browser.find_element(By.ID, "nav-queues").click()
        want = {**before, "ready": before["ready"] + 1, "dead": before["dead"] - 1}
        wait_until(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{qa}"]') and page_counts(d, qa) == want,
            f"queues page showing {want}",
        )
        shot(browser, tmp_path, "06-queues-after")
        assert page_counts(browser, qa) == store_counts(store, qa)
        assert page_counts(browser, qb) == store_counts(store, qb)  # the other queue untouched


def test_read_only_server_shows_no_action(browser: Any, db: Target, seeded: Any, qname: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    store, dead, pending = seeded
    qa = f"{qname}-a"
    actions = "#requeue-btn, #delete-btn, #cancel-btn, #bulk-requeue-btn, #bulk-delete-btn, .pause-btn, .resume-btn"
    with serve_dashboard(db, read_only=True) as dash:
        pages = [("/", "queues"), (f"/queues/{qa}", "queue"), (f"/queues/{qa}?state=scheduled", "scheduled"),
                 (f"/dead?queue={qa}", "dead"), (f"/jobs/{dead[qa][0]}", "dead-job"),
                 (f"/jobs/{pending[qa][0]}", "pending-job"), ("/schedules", "schedules"),
                 ("/workers", "workers"), ("/streams", "streams")]
        for path, name in pages:
            browser.get(dash.url(path))
            wait_until(browser, lambda d: d.find_elements(By.TAG_NAME, "nav"), f"{path} rendered")
            shot(browser, tmp_path, f"read-only-{name}")
            assert_same_origin(browser, dash)
            assert not browser.find_elements(By.CSS_SELECTOR, actions), f"{path} shows an action"
            assert not browser.find_elements(By.CSS_SELECTOR, "form[method=post], form[method=POST]"), path
        assert page_counts_after(browser, dash, qa) == store_counts(store, qa)


def page_counts_after(driver: Any, dash: Dashboard, queue: str) -> dict[str, int]:
    driver.get(dash.url("/"))
    return page_counts(driver, queue)


def test_cross_site_form_post_is_refused(browser: Any, db: Target, seeded: Any, qname: str, tmp_path: Path) -> None:
    """A page of another origin (a data: URL) auto-submits a requeue form to the dashboard,
    with the browser's own cookies: 403, and the job stays dead."""
    from selenium.webdriver.common.by import By

    store, dead, _ = seeded
    qa = f"{qname}-a"
    victim = dead[qa][0]
    with serve_dashboard(db) as dash:
        browser.get(dash.url("/"))  # the dashboard's cookies, as an operator's browser would hold
        attack = (
            f"data:text/html,<form id='f' method='post' action='{dash.url('/dead/requeue')}'>"
            f"<input name='id' value='{victim}'><input name='csrf_token' value='forged'></form>"
            "<script>document.getElementById('f').submit()</script>"
        )
        browser.get(attack)
        wait_until(browser, lambda d: d.current_url.startswith(dash.base), "the forged POST's answer")
        shot(browser, tmp_path, "cross-site")
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "403" in body or "forbidden" in body.lower(), body
    assert store.queue(qa).stats().dead == 2
    assert store.get_job(victim) is not None and store.get_job(victim).state == "dead"


def test_a_link_from_another_site_keeps_the_other_tabs_actions_working(
    browser: Any, db: Target, seeded: Any, qname: str, tmp_path: Path,
) -> None:
    """An operator opens the dashboard from a link on another site (an alert, a chat
    message) while another tab of it is open. With a ``SameSite=Strict`` cookie that
    navigation carried no cookie, so the page set a new one, and every form of the tab
    already open (whose tokens belong to the old cookie) was refused with 403 until
    reloaded. The cookie now goes along on such a navigation, and the older tab's pause
    works."""
    from selenium.webdriver.common.by import By

    store, _, _ = seeded
    qa = f"{qname}-a"
    with serve_dashboard(db) as dash:
        browser.get(dash.url("/"))
        first_tab = browser.current_window_handle
        before = browser.get_cookie("alkstore_dashboard_csrf")
        browser.switch_to.new_window("tab")
        try:
            browser.get(f"data:text/html,<a id='l' href='{dash.url('/dead')}'>dashboard</a>")
            browser.find_element(By.ID, "l").click()
            wait_until(browser, lambda d: d.current_url.startswith(dash.base), "the dashboard, from the link")
            assert browser.get_cookie("alkstore_dashboard_csrf") == before
        finally:
            browser.close()
            browser.switch_to.window(first_tab)
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{qa}"]')
        row.find_element(By.CSS_SELECTOR, "button.pause-btn").click()
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{qa}"] button.resume-btn')
                   or d.find_elements(By.CSS_SELECTOR, "p.error"), "the pause's answer")
        shot(browser, tmp_path, "paused-from-the-older-tab")
        assert not browser.find_elements(By.CSS_SELECTOR, "p.error"), browser.find_element(By.TAG_NAME, "main").text
    assert store.queue(qa).settings().paused is True


@pytest.fixture(params=["sqlite", "postgresql"])
def own_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A database of this test alone (a SQLite file, or a PostgreSQL schema of its own): its
    queue names are fixed words, which other tests of a shared schema must not meet."""
    from tests.conftest import require_pg
    from tests.support import drop_pg_schema, new_pg_schema, pg_target, sqlite_target

    if request.param == "sqlite":
        target = sqlite_target(str(tmp_path))
        yield target
        target.engine.dispose()
        return
    require_pg()
    target = pg_target(new_pg_schema())
    try:
        yield target
    finally:
        drop_pg_schema(target)


# names of the properties every plain JavaScript object inherits
INHERITED = ("constructor", "__proto__", "toString", "hasOwnProperty", "valueOf")


def test_refresh_of_queues_named_like_object_properties(browser: Any, own_db: Target, tmp_path: Path) -> None:
    """Queue names are user data: a queue named like a property every JavaScript object
    inherits (``constructor``, ``__proto__``, ...) that empties and so leaves the polled
    counts shows zeros after the in-place refresh, as any other queue does, not the
    inherited property's missing fields (``undefined``)."""
    from selenium.webdriver.common.by import By

    store = own_db.store()
    try:
        ids = {name: store.queue(name).enqueue({"n": name}) for name in (*INHERITED, "plain")}
        with serve_dashboard(own_db) as dash:
            browser.get(dash.url("/"))
            for name in ids:
                assert page_counts(browser, name) == {"ready": 1, "scheduled": 0, "processing": 0, "dead": 0}
            for name, job_id in ids.items():  # each queue empties: it leaves the counts
                assert store.queue(name).cancel(job_id)
            wait_for_refresh(browser)
            shot(browser, tmp_path, "refreshed")
            for name in ids:
                row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{name}"]')
                cells = {c.get_attribute("data-count"): c.text for c in row.find_elements(By.CSS_SELECTOR, "td[data-count]")}
                assert cells == {state: "0" for state in STATES}, name
                assert row.find_element(By.CSS_SELECTOR, "td[data-age]").text == "-", name
    finally:
        store.close()


def test_queues_named_with_line_breaks_keep_their_counts_and_actions(
    browser: Any, db: Target, qname: str, tmp_path: Path,
) -> None:
    """A browser reads a carriage return in the page's source as a line feed (HTML input
    preprocessing), so a queue name holding one, written into an attribute as it is, was
    another name once parsed: the refresh found no counts for its row (zeros). And a form
    submits every line break of a field as CRLF, so the requeue button of a dead job whose
    queue name holds one posted another name, which requeued nothing."""
    from selenium.webdriver.common.by import By

    store = db.store()
    try:
        names = (f"{qname}\r\nb", f"{qname}\rc", f"{qname}\nd")
        dead = {}
        for name in names:
            q = store.queue(name)
            dead[name] = q.enqueue({"n": 1})
            h = q.claim_one("w")
            assert h is not None and h.fail("boom")
            q.enqueue({"n": 2})
        with serve_dashboard(db) as dash:
            browser.get(dash.url("/"))
            wait_for_refresh(browser)
            shot(browser, tmp_path, "refreshed")
            rows = {r.get_attribute("data-queue"): r for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-queue]")}
            for name in names:
                assert name in rows, (name, list(rows))
                cells = {c.get_attribute("data-count"): c.text
                         for c in rows[name].find_elements(By.CSS_SELECTOR, "td[data-count]")}
                assert cells == {"ready": "1", "scheduled": "0", "processing": "0", "dead": "1"}, repr(name)
            for name in names:
                browser.get(dash.url(f"/jobs/{dead[name]}"))
                browser.find_element(By.ID, "requeue-btn").click()
                wait_until(browser, lambda d, name=name: store.queue(name).stats().dead == 0,
                           f"the requeue of {name!r}")
                assert store.queue(name).stats().ready == 2
    finally:
        store.close()
