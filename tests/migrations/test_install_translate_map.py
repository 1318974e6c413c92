"""Installing through an application engine with a ``schema_translate_map`` (a multi-tenant
engine given to ``Store``): the store's own statements and the caller's-transaction forms
name the store's schema as it is, so the install must too."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.conftest import require_pg
from tests.support import PG_URL, new_pg_schema


def test_install_ignores_the_engines_schema_translate_map() -> None:
    """An engine whose map also names the store's schema (``{schema: "tenant_x"}``, or a
    ``None`` key): the install's CREATE TABLEs were translated into the other schema while
    its ALTER TABLEs (and every runtime statement) were not, so install() failed half-way
    with DatabaseError, leaving tables in the other schema."""
    require_pg()
    schema, other = new_pg_schema("tmap"), new_pg_schema("tmapo")
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{other}"')
    engine = sa.create_engine(PG_URL).execution_options(schema_translate_map={schema: other, None: other})
    try:
        with alk.Store(engine, schema=schema) as store:
            store.install()
            store.check_schema()
            with Session(engine) as session:
                job_id = alk.enqueue(session, "q", {"x": 1})
                session.commit()
            handle = store.queue("q").claim_one("w")
            assert handle is not None and handle.id == job_id and handle.ack()
        with admin.connect() as conn:
            in_other = conn.exec_driver_sql(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %(s)s", {"s": other}
            ).scalar()
        assert in_other == 0
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{other}" CASCADE')
        admin.dispose()
        engine.dispose()
