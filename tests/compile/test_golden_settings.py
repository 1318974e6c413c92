"""Golden SQL of the queue-settings statements (SPEC §14), per dialect, on the features their
correctness depends on (compiled by running the real operations, read from the backend's
cache):

- the ordinary claim carries the settings guard (a queue with settings claims nothing
  through it); the limited path's claim is the same statement without it;
- PostgreSQL takes the settings row lock with a plain ``FOR UPDATE`` (it must wait, never
  skip), in a statement of its own; SQLite renders no FOR UPDATE anywhere (its writer
  lock serializes);
- the rate window is counted by index probes on the claim log (the newest running total
  and its time, the window's first claim and its time), never by counting its rows;
- PostgreSQL logs a claim and prunes the log in one statement.
"""

from __future__ import annotations

import re

from tests.support import FakeClock, Target


def _compiled(db: Target) -> dict[str, str]:
    store = db.store(clock=FakeClock())
    try:
        q = store.queue("golden-settings")
        q.enqueue_many([1, 2, 3])
        assert q.claim_one("w") is not None  # the guarded claim
        q.set_rate_limit(5, per=10)
        q.set_concurrency(2)
        assert q.claim_one("w") is not None  # the limited path, logged
        q.pause()
        q.resume()
        return {k: re.sub(r"\s+", " ", v) for k, v in store.backend._sql.items()}
    finally:
        store.close()


def test_settings_statements(db: Target) -> None:
    sql = _compiled(db)
    claim, limited = sql["claim"], sql["claim:limited"]
    assert re.search(r"NOT \(EXISTS \(SELECT 1 FROM \S*alkstore_queue_settings", claim), claim
    assert "alkstore_queue_settings" not in limited
    settings_keys = [k for k in sql if k.startswith(("settings", "limit_view", "claims_"))]
    assert {"settings_get", "settings_drop_idle", "limit_view", "claims_log"} <= set(settings_keys)
    view = sql["limit_view"]
    assert "count(" not in view.split("alkstore_queue_claims", 1)[1], "the window's jobs must not be counted row by row"
    assert len(re.findall(r"ORDER BY c\.claimed_at( DESC)?, c\.total( DESC)? LIMIT 1", view)) == 4, view
    if db.kind == "postgresql":
        lock = sql["settings_lock"]
        assert lock.endswith("FOR UPDATE"), lock
        assert ";" not in lock and "SKIP LOCKED" not in lock
        log = sql["claims_log"]
        assert log.startswith("WITH pruned AS (DELETE FROM") and "INSERT INTO" in log, log
    else:
        assert "settings_lock" not in sql
        assert not any("FOR UPDATE" in sql[k] for k in settings_keys)
        assert "claims_prune" in sql
