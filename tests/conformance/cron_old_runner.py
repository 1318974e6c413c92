"""Ticks an OLD alkstore_sa (a schema-step-1 release without cron, exported from git onto
PYTHONPATH by tests/conformance/test_cron.py) once against a database, in a process of its
own, as an old scheduler runner would during a rolling deploy.

Run as ``python cron_old_runner.py URL SCHEMA PACKAGE_DIR NOW``; prints one JSON object: the
jobs the tick fired, each schedule's next fire (epoch seconds) and how the old
``store.schedules()`` lists it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa.migrations import steps


def main() -> None:
    url, schema, package_dir, now = sys.argv[1:5]
    # the old package, not the working tree's: a wrong import would test nothing
    assert Path(alk.__file__).resolve().is_relative_to(Path(package_dir).resolve()), alk.__file__
    assert steps.HEAD == 1, steps.HEAD
    engine = sa.create_engine(url)
    store = alk.Store(engine, schema=schema, clock=lambda: float(now))
    # A runner that started before the database was migrated: the old code checks the schema
    # version once, at its first operation (the oldest release refuses a newer one then).
    store._schema_checked = True
    try:
        fired = store._scheduler().tick()
        listed = store.schedules()
    finally:
        store.close()
        engine.dispose()
    print(json.dumps({
        "fired": fired,
        "next": {s.name: s.next_fire_at.timestamp() for s in listed},
        "listed": {s.name: s.next_fire_at.isoformat() for s in listed},
    }))


if __name__ == "__main__":
    main()
