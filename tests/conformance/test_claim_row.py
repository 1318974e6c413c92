"""A claimed handle's Job is the row as stored: SQLite's claim reads back only the columns
the call does not already hold and fills in the rest (queue, worker, clock, deadline, state)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

import alkstore_sa as alk
from alkstore_sa._rows import FIELD
from tests.support import FakeClock, Target


def test_claimed_job_equals_the_stored_row(store: alk.Store, qname: str, clock: FakeClock) -> None:
    q = store.queue(qname, visibility_timeout=12.345, max_attempts=4)
    ids = q.enqueue_many([{"n": i} for i in range(5)], priority=3)
    clock.advance(0.1)
    handles = q.claim_batch("worker-x", 5)
    assert sorted(h.id for h in handles) == sorted(ids)
    for h in handles:
        stored = q.get_job(h.id)
        assert stored is not None
        assert h.job == stored
        assert h.job.queue == qname and h.job.worker_id == "worker-x" and h.job.state == "processing"
    assert q.ack_batch(handles) == 5


def test_sqlite_a_stored_payload_that_is_not_utf8_is_claimed_and_undecodable(sqlite_db: Target, qname: str) -> None:
    """SQLite keeps whatever bytes a hand-written UPDATE puts in a TEXT column. A payload
    that is not UTF-8 made every claim that reached it fail ("Could not decode to UTF-8"):
    the jobs claimed with it were lost to their batch and the queue stuck behind it. It
    is claimed like any stored payload that is not JSON (the worker fails it), its
    undecodable bytes read as ``\\xNN``, and the job beside it is served."""
    store = sqlite_db.store()
    try:
        q = store.queue(qname)
        bad, good = q.enqueue({"a": 1}), q.enqueue({"b": 2})
        sqlite_db.execute(
            "UPDATE alkstore_jobs SET payload = CAST(X'7B2261223A2280FF227D' AS TEXT) WHERE id = :id", id=bad,
        )  # {"a":"<80><FF>"}
        handles = {h.id: h for h in q.claim_batch("w", 2)}
        assert set(handles) == {bad, good}
        assert handles[good].payload == {"b": 2}
        with pytest.raises(alk.PayloadError):
            handles[bad].payload  # noqa: B018 - the property decodes
        assert handles[bad]._described().payload is None
        raw = store._job_row(bad)
        assert raw is not None and raw[FIELD["payload"]] == '{"a":"\\x80\\xff"}'
        assert all(h.ack() for h in handles.values())
    finally:
        store.close()
    # the store's setting went with its connections: none the pool holds has it
    pooled = [sqlite_db.engine.connect() for _ in range(sqlite_db.engine.pool.checkedin())]  # type: ignore[attr-defined]
    try:
        assert pooled and all(c.connection.dbapi_connection.text_factory is str for c in pooled)  # type: ignore[union-attr]
    finally:
        for conn in pooled:
            conn.close()


def test_a_job_whose_timestamps_were_written_past_the_calendar_is_claimed(db: Target, store: alk.Store, qname: str) -> None:
    """A timestamp column is a float: a row written by hand may hold one no date has. The
    claim that took such a job raised OverflowError after claiming it (the whole batch
    lost, again at each reclaim); its dates read as the calendar's first or last instant."""
    q = store.queue(qname)
    odd, plain = q.enqueue({"a": 1}), q.enqueue({"b": 2})
    db.execute(
        f"UPDATE {db.table('alkstore_jobs')} SET run_at = :low, created_at = :low, expires_at = :high WHERE id = :id",
        low=float("-inf"), high=1e300, id=odd,
    )
    handles = {h.id: h for h in q.claim_batch("w", 2)}
    assert set(handles) == {odd, plain}
    job = handles[odd].job
    assert job.run_at == job.created_at == datetime.min.replace(tzinfo=timezone.utc)
    assert job.expires_at == datetime.max.replace(tzinfo=timezone.utc)
    assert all(h.ack() for h in handles.values())


SPOILED_HISTORIES = ["not json", '{"attempt": 1}', "[1, 2]", '[{"attempt": 1, "error": "e", "at": "soon"}]']


@pytest.mark.parametrize("history", SPOILED_HISTORIES)
def test_a_job_whose_error_history_was_spoiled_by_hand_is_claimed_and_read(
    db: Target, store: alk.Store, qname: str, history: str
) -> None:
    """The error history is a text column of JSON entries. One written by hand as anything
    else made building the claimed job raise (JSONDecodeError, KeyError, TypeError), and so
    did every read of it (``get_job``, the dead letters, the dashboard). It reads as one
    entry saying the stored history is unreadable, quoting it; in an array, each spoiled
    entry reads so, quoting the entry."""
    q = store.queue(qname)
    odd, plain = q.enqueue({"a": 1}), q.enqueue({"b": 2})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET errors = :e WHERE id = :id", e=history, id=odd)
    handles = {h.id: h for h in q.claim_batch("w", 2)}
    assert set(handles) == {odd, plain}
    entries = handles[odd].job.errors
    if history.startswith("["):  # an array: each entry reads on its own
        said = [f"the stored error history entry is unreadable: {json.dumps(e)!r}" for e in json.loads(history)]
    else:
        said = [f"the stored error history is unreadable: {history!r}"]
    assert [e["error"] for e in entries] == said, entries
    assert all(e["attempt"] is None and e["at"] is None for e in entries), entries
    stored = q.get_job(odd)
    assert stored is not None and stored.errors == entries
    assert handles[plain].job.errors == []
    assert all(h.ack() for h in handles.values())


READABLE_HISTORIES = [
    "[ ]",
    '[{"at":2,"error":"by hand","attempt":3}]\n',
    '[{"attempt": 1, "error": "a \\"quoted\\"\\nline \\u001f \\/ é € 😀", "at": 1765134000.123456}]',
    '[{"attempt": 1, "error": "e", "at": 1e20}, {"attempt": 2, "error": "", "at": -0.5E-3}]',
]


@pytest.mark.parametrize("history", READABLE_HISTORIES)
def test_a_hand_written_error_history_that_is_a_list_of_entries_is_appended_to(
    db: Target, store: alk.Store, qname: str, clock: FakeClock, history: str
) -> None:
    """The retry and fail of a job whose stored history is not a JSON array keep what is
    stored as an "unreadable" entry (test_tasks_worker.py); one written by hand that is an
    array of entries, spaced and escaped any way JSON allows, is appended to as it is."""
    q = store.queue(qname)
    retried, failed = q.enqueue({"a": 1}), q.enqueue({"b": 2})
    for job_id in (retried, failed):
        db.execute(f"UPDATE {db.table('alkstore_jobs')} SET errors = :e WHERE id = :i", e=history, i=job_id)
    before = q.get_job(retried)
    assert before is not None and all(e["attempt"] is not None for e in before.errors), before.errors
    handles = {h.id: h for h in q.claim_batch("w", 2)}
    assert handles[retried].retry("again", delay=5) and handles[failed].fail("no")
    at = datetime.fromtimestamp(clock.now, timezone.utc)
    for job_id, error in [(retried, "again"), (failed, "no")]:
        job = q.get_job(job_id)
        assert job is not None and job.errors == [*before.errors, {"attempt": 1, "error": error, "at": at}], job


@pytest.mark.parametrize(
    ("history", "readable"),
    [
        ("[1, 2]", [False, False]),
        ('[{"attempt": 1, "error": "e", "at": "soon"}]', [False]),
        ('[{"attempt": 1, "error": "kept", "at": 1.5}, {"attempt": 2}, null]', [True, False, False]),
        # Job.errors promises {"attempt": int, "error": str, "at": datetime}
        ('[{"attempt": 1, "error": 5, "at": 1.5}, {"attempt": "1", "error": "e", "at": 1.5}]', [False, False]),
        ('[{"attempt": true, "error": "e", "at": 1.5}, {"attempt": 1, "error": "e", "at": false}]', [False, False]),
    ],
)
def test_a_retry_of_a_job_whose_error_history_has_entries_spoiled_by_hand_reads_after_them(
    db: Target, store: alk.Store, qname: str, clock: FakeClock, history: str, readable: list[bool]
) -> None:
    """A history that is a JSON array is appended to as it is, spoiled entries and all.
    It read as one "unreadable" entry quoting its first 200 characters, so the entries
    every later retry and fail added (and the good ones before) were lost in that quote.
    Each entry reads on its own: a spoiled one as an "unreadable" entry quoting it."""
    q = store.queue(qname)
    job_id = q.enqueue({"a": 1})
    db.execute(f"UPDATE {db.table('alkstore_jobs')} SET errors = :e WHERE id = :i", e=history, i=job_id)
    (handle,) = q.claim_batch("w", 1)
    assert handle.retry("again", delay=5)
    job = q.get_job(job_id)
    assert job is not None
    *old, new = job.errors
    assert new == {"attempt": 1, "error": "again", "at": datetime.fromtimestamp(clock.now, timezone.utc)}
    assert [e["attempt"] is not None for e in old] == readable, old
    for entry, ok in zip(old, readable, strict=True):
        if ok:
            assert entry == {"attempt": 1, "error": "kept", "at": datetime.fromtimestamp(1.5, timezone.utc)}
        else:
            assert entry["at"] is None and entry["error"].startswith("the stored error history"), entry
