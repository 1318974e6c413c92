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
def fresh_pg_database(prefix: str = "alk", encoding: str | None = None) -> Iterator[str]:
    """Yield the URL of a new, empty database; drop it (closing its sessions) afterwards.
    ``encoding`` (e.g. ``"LATIN1"``): a database in that encoding (C locale, from
    template0, which any encoding may copy)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        if encoding is None:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        else:
            conn.exec_driver_sql(
                f"CREATE DATABASE \"{name}\" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
            )
    try:
        yield sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
