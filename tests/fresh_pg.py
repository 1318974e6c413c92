"""A PostgreSQL database of its own, created for one test and dropped after it.

For tests whose application owns what a real app owns (``public``, the default
``alembic_version``, alkstore's default schema), so parallel runs never meet.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from tests.support import PG_URL


@contextmanager
def fresh_pg_database(prefix: str = "alk") -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it (closing its sessions) afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
