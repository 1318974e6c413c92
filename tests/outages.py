"""Real database outages for the loop-recovery tests: tables renamed away and back (every
statement on them fails meanwhile, on either engine) and PostgreSQL backends terminated in
a loop (only those tagged with one ``application_name``, so nothing else is touched)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from tests.support import PG_URL, Target


@contextmanager
def tables_away(db: Target, *tables: str) -> Iterator[None]:
    """Rename ``tables`` to ``<name>_away`` for the duration of the block, then back."""
    moved: list[str] = []
    try:
        for t in tables:
            db.execute(f'ALTER TABLE {db.table(t)} RENAME TO "{t}_away"')
            moved.append(t)
        yield
    finally:
        for t in reversed(moved):
            db.execute(f'ALTER TABLE {db.table(t + "_away")} RENAME TO "{t}"')


def kill_backends(app: str, seconds: float) -> int:
    """Terminate every PostgreSQL backend whose ``application_name`` starts with ``app``,
    again and again for ``seconds`` (reconnections die too); returns how many died."""
    control = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    killed = 0
    try:
        with control.connect() as c:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                killed += int(
                    c.execute(
                        sa.text(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE starts_with(application_name, :app) AND pid <> pg_backend_pid()"
                        ),
                        {"app": app},
                    ).scalar_one()
                )
                time.sleep(0.02)
    finally:
        control.dispose()
    return killed
