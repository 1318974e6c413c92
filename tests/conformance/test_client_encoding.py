"""A UTF8 PostgreSQL database whose role (or URL) sets a single-byte ``client_encoding``
(a legacy application's ``ALTER ROLE … SET client_encoding = 'LATIN1'``): psycopg encodes
every value in that encoding, so a payload, queue name or notification it cannot hold is
refused although the database could store it. The refusal says so — which encoding, and
how to give the store's connections UTF8 — rather than a bare codec error that, with
``SHOW server_encoding`` answering UTF8, points nowhere."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import alkstore_sa as alk
from tests.support import PG_URL, Target


@pytest.fixture
def latin1_role_url(pg_db: Target) -> Iterator[str]:
    """The URL of a LOGIN role whose sessions default to client_encoding LATIN1, with the
    rights on the test's schema; dropped afterwards."""
    role = f"alk_enc_{uuid.uuid4().hex[:10]}"
    schema = f'"{pg_db.schema}"'
    with pg_db.engine.begin() as c:
        c.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        c.exec_driver_sql(f"ALTER ROLE \"{role}\" SET client_encoding = 'LATIN1'")
        c.exec_driver_sql(f'GRANT USAGE ON SCHEMA {schema} TO "{role}"')
        c.exec_driver_sql(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO "{role}"')
        c.exec_driver_sql(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO "{role}"')
    try:
        yield sa.make_url(PG_URL).set(username=role).render_as_string(hide_password=False)
    finally:
        with pg_db.engine.begin() as c:
            c.exec_driver_sql(f'DROP OWNED BY "{role}"')
            c.exec_driver_sql(f'DROP ROLE "{role}"')


def test_a_value_the_client_encoding_cannot_hold_is_refused_naming_it(
    pg_db: Target, latin1_role_url: str, qname: str
) -> None:
    engine = sa.create_engine(latin1_role_url)
    try:
        with alk.Store(engine, schema=pg_db.schema) as store:
            q = store.queue(qname)
            assert q.get_job(q.enqueue({"name": "é"})) is not None  # LATIN1 holds this one
            refusals = []
            for call in (
                lambda: q.enqueue({"name": "日本"}),
                lambda: store.notify(qname, "日本"),
                lambda: store.queue("日本").enqueue(1),
            ):
                with pytest.raises(alk.DatabaseError) as info:
                    call()
                refusals.append(str(info.value))
            with pytest.raises(alk.DatabaseError) as info, Session(engine) as session, session.begin():
                alk.enqueue(session, q, {"name": "日本"})  # the caller's transaction too
            refusals.append(str(info.value))
            for message in refusals:
                assert "client_encoding" in message and "latin-1" in message, message
                assert "client_encoding=utf8" in message, message
            assert q.stats().pending == 1  # nothing refused was written
    finally:
        engine.dispose()


def test_the_store_url_can_give_its_connections_utf8(pg_db: Target, latin1_role_url: str, qname: str) -> None:
    """The remedy the refusal names: ``?client_encoding=utf8`` overrides the role's setting."""
    with alk.Store(f"{latin1_role_url}?client_encoding=utf8", schema=pg_db.schema) as store:
        q = store.queue(qname)
        job = q.get_job(q.enqueue({"name": "日本"}))
        assert job is not None and job.payload == {"name": "日本"}
