"""Installing through an application engine that streams results (``stream_results=True``
or ``yield_per`` as engine options: a reporting or export engine given to ``Store``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.support import PG_URL, new_pg_schema


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_install_and_uninstall_on_a_streaming_engine(kind: str, tmp_path: Path) -> None:
    """On PostgreSQL psycopg ran the install's DDL on a server-side cursor, DECLARE ... CURSOR
    FOR CREATE SCHEMA: a syntax error, so Store.install() failed with DatabaseError."""
    if kind == "postgresql":
        require_pg()
        url, schema = PG_URL, new_pg_schema("stream")
    else:
        url, schema = f"sqlite:///{tmp_path / 'app.db'}", "alkstore"
    engine = sa.create_engine(url).execution_options(stream_results=True, yield_per=10)
    try:
        with alk.Store(engine, schema=schema) as store:
            store.install()
            store.check_schema()
            q = store.queue("q")
            job_id = q.enqueue("x")
            handle = q.claim_one("w")
            assert handle is not None and handle.id == job_id and handle.ack()
        migrations.downgrade(engine, schema=schema)
        with engine.connect() as conn:
            assert migrations.current_revision(conn, schema) is None
    finally:
        if kind == "postgresql":
            admin = sa.create_engine(PG_URL)
            with admin.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            admin.dispose()
        engine.dispose()
