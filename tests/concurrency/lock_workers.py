"""Child-process side of the lock contention test: spawn-safe, importable functions.

Each function takes one JSON-able ``spec`` dict, builds its OWN ``alk.Store(url, schema=...)``
on the database clock (never an engine inherited from the parent) and returns a JSON-able
result; ``tests.concurrency.workers.child_main`` runs it behind the start barrier.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import alkstore_sa as alk


def db_clock(spec: dict[str, Any]) -> tuple[Callable[[], float], Callable[[], None]]:
    """A reader of the database clock (the clock the lock statements use) and its closer.

    PostgreSQL: the server's clock. SQLite runs in-process: its clock is this host's
    ``time.time()``, which is what the store passes to every SQLite statement.
    """
    if spec["kind"] == "sqlite":
        return time.time, lambda: None
    engine = sa.create_engine(spec["url"], isolation_level="AUTOCOMMIT", pool_size=1)
    conn = engine.connect()

    def read() -> float:
        return float(conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar())

    def close() -> None:
        conn.close()
        engine.dispose()

    return read, close


def contend(spec: dict[str, Any]) -> dict[str, Any]:
    """Loop for ``spec["seconds"]``: acquire → hold a while, renewing every ttl/4 → release;
    or, every ``lapse_every``-th hold (shifted by ``lapse_offset``), stop renewing and let
    the lease lapse, then try a late renew.

    Every hold is reported as ``{"start", "end", "how"}`` in database-clock seconds, always
    an interval *inside* the time the lease was really held:

    - ``start``: a database-clock reading taken right after ``acquire`` returned True (not
      the lease's ``acquired_at``: PostgreSQL stamps a statement with the time it *began*,
      which can precede the moment it actually took the row by the statement's latency);
    - ``end``: a database-clock reading taken right before a successful ``release``
      ("released"); or the deadline the last successful acquire/renew set, bounded from
      below by a reading taken right before that renew ("lapsed" / "lost").
    """
    store = alk.Store(spec["url"], schema=spec["schema"])
    now, close_clock = db_clock(spec)
    rng = random.Random(spec["seed"])
    owner, ttl = spec["owner"], spec["ttl"]
    lk = store.lock(spec["name"])
    holds: list[dict[str, Any]] = []
    counts = {
        "acquire_refused": 0, "holder_not_me": 0, "lost": 0, "lapsed": 0,
        "released": 0, "release_refused": 0, "late_renew_refused": 0, "late_renew_accepted": 0,
    }
    try:
        # for spec["seconds"], and on until this owner held the lock spec["min_holds"] times
        # (a loaded machine may give a process little of those seconds), within a bound
        started = time.monotonic()
        deadline, bound = started + spec["seconds"], started + spec["seconds"] + 30
        while (t := time.monotonic()) < deadline or (len(holds) < spec.get("min_holds", 0) and t < bound):
            if not lk.acquire(owner, ttl):
                counts["acquire_refused"] += 1
                time.sleep(rng.uniform(0.0, 0.02))
                continue
            start = now()  # >= the acquire statement's own clock reading
            h = lk.holder()
            if h is None or h.owner != owner:
                counts["holder_not_me"] += 1  # stalled for a whole TTL right after acquiring
                continue
            lease_end = h.expires_at.timestamp()
            hold_until = time.monotonic() + rng.uniform(0.02, 1.25 * ttl)
            lost = False
            while time.monotonic() < hold_until:
                time.sleep(max(0.0, min(ttl / 4, hold_until - time.monotonic())))
                before_renew = now()
                if not lk.renew(owner, ttl):
                    lost = True
                    break
                lease_end = before_renew + ttl  # the renew's own reading is >= before_renew
            if lost:
                counts["lost"] += 1
                holds.append({"start": start, "end": lease_end, "how": "lost"})
                continue
            lapse = (len(holds) + spec["lapse_offset"]) % spec["lapse_every"] == 0
            if lapse:
                # stall without releasing: the lease lapses silently, others may take it
                holds.append({"start": start, "end": lease_end, "how": "lapsed"})
                counts["lapsed"] += 1
                time.sleep(ttl * 1.5)
                if lk.renew(owner, ttl):
                    counts["late_renew_accepted"] += 1  # must never happen: it had lapsed
                else:
                    counts["late_renew_refused"] += 1
                continue
            end = now()
            if lk.release(owner):
                counts["released"] += 1
                holds.append({"start": start, "end": end, "how": "released"})
            else:
                counts["release_refused"] += 1  # lapsed just before the release
                holds.append({"start": start, "end": lease_end, "how": "lost"})
            time.sleep(rng.uniform(0.0, 0.03))
        return {"owner": owner, "holds": holds, "counts": counts}
    finally:
        close_clock()
        store.close()
