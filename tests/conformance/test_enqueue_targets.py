"""SPEC §5.2: a ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) and a raw
``Connection`` as the enqueue target, each with an application row in the same transaction:
the commit shows both, a rollback leaves neither. (test_enqueue.py covers the plain
commit/rollback of each target without an application row.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import alkstore_sa as alk
from tests.support import Target, engine_with_table

rows = sa.Table("test_target_rows", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("note", sa.Text))


@pytest.fixture
def app_engine(db: Target) -> Iterator[sa.Engine]:
    """The app's engine; on PostgreSQL its table lives in the test's schema."""
    yield from engine_with_table(db, rows)


def _notes(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(rows.c.note).order_by(rows.c.id)))


def test_scoped_session_rollback_and_commit(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    scoped = scoped_session(sessionmaker(app_engine))
    scoped.execute(sa.insert(rows).values(note="rolled back"))
    lost = [alk.enqueue(scoped, qname, "lost"), *alk.enqueue_many(scoped, qname, [1, 2])]
    scoped.rollback()
    q = store.queue(qname)
    assert all(q.get_job(i) is None for i in lost) and q.stats().pending == 0
    assert _notes(app_engine) == []

    scoped.execute(sa.insert(rows).values(note="kept"))
    kept = alk.enqueue_many(scoped, q, ["a", "b"])  # a handle: its stamps, the same transaction
    assert q.stats().pending == 0  # not visible before the commit
    scoped.commit()
    scoped.remove()
    assert [h.id for h in q.claim_batch("w", 10)] == kept
    assert _notes(app_engine) == ["kept"]


def test_connection_block_rolls_back_on_error(app_engine: sa.Engine, store: alk.Store, qname: str) -> None:
    with pytest.raises(RuntimeError), app_engine.begin() as conn:
        conn.execute(sa.insert(rows).values(note="rolled back"))
        lost = alk.enqueue(conn, qname, "lost")
        raise RuntimeError("the request failed")
    q = store.queue(qname)
    assert q.get_job(lost) is None and q.claim_one("w") is None
    assert _notes(app_engine) == []

    with app_engine.begin() as conn:
        conn.execute(sa.insert(rows).values(note="kept"))
        kept = alk.enqueue(conn, qname, {"row": "kept"})
    handle = q.claim_one("w")
    assert handle is not None and handle.id == kept and handle.payload == {"row": "kept"}
    assert _notes(app_engine) == ["kept"]


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "get_job", "outbox_enqueue", "publish", "notify"])
def test_a_session_that_cannot_get_a_connection_raises_an_alkstore_error(db: Target, qname: str, call: str) -> None:
    """The session's own checkout fails (here: a pool with none to spare, as when the
    server is down) before any statement: the caller gets a DatabaseError (SPEC §3), with
    the driver's or pool's exception as ``.orig`` — SQLAlchemy's TimeoutError (or
    OperationalError) escaped from session.connection()."""
    engine = sa.create_engine(db.url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    store = alk.Store(engine, schema=db.schema)
    args = {
        "enqueue": (qname, "x"), "enqueue_many": (qname, ["x"]), "get_job": (qname, 1),
        "outbox_enqueue": (qname, "x"), "publish": (qname, "x"), "notify": (qname, "x"),
    }[call]
    try:
        with engine.connect() as held:  # someone else holds the only connection
            held.execute(sa.text("SELECT 1"))
            session = sessionmaker(engine)()
            with pytest.raises(alk.DatabaseError) as caught:
                getattr(alk, call)(session, *args)
            assert isinstance(caught.value.orig, sa.exc.TimeoutError)
            session.close()
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("via", ["engine", "session", "connection"])
def test_the_callers_stream_results_option_does_not_reach_our_statements(db: Target, qname: str, via: str) -> None:
    """An engine, session or connection with ``stream_results=True`` (or ``yield_per``: a
    reporting or export setup) made psycopg run our statements on a server-side cursor,
    DECLARE ... CURSOR FOR INSERT: a syntax error (DatabaseError) and the caller's
    transaction lost, for every function that writes."""
    store = db.store()
    try:
        if via == "engine":
            session = Session(db.engine.execution_options(stream_results=True))
        elif via == "session":
            session = Session(db.engine)
            session.connection(execution_options={"stream_results": True, "yield_per": 10})
        else:
            session = Session(bind=db.engine.connect().execution_options(stream_results=True))
        with session:
            job_id = alk.enqueue(session, qname, "one")
            more = alk.enqueue_many(session, qname, ["two", "three"])
            held = alk.enqueue(session, qname, "four", unique_key="k")
            assert alk.enqueue(session, qname, "again", unique_key="k") == held
            assert alk.get_job(session, qname, job_id) is not None
            alk.outbox_enqueue(session, qname, "out")
            alk.publish(session, qname, "event")
            alk.notify(session, qname, "ping")
            session.commit()
        q = store.queue(qname)
        assert [h.id for h in q.claim_batch("w", 10)] == [job_id, *more, held]
    finally:
        store.close()


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many", "get_job"])
def test_a_queue_handle_of_the_other_database_kind_is_refused_before_any_statement(
    db: Target, pg_db: Target, sqlite_db: Target, call: str
) -> None:
    """A Queue handle of a store on the other kind of database (a SQLite store's queue with
    a PostgreSQL session, or the reverse) raises InvalidOptions naming both, before any
    statement is sent: the caller's transaction stays usable and commits its own row."""
    other = sqlite_db if db.kind == "postgresql" else pg_db
    store = other.store()
    engine = app_engine_of(db)
    rows.create(engine, checkfirst=True)
    args = {"enqueue": ({"x": 1},), "enqueue_many": ([{"x": 1}],), "get_job": (1,)}[call]
    try:
        with Session(engine) as session:
            session.execute(sa.insert(rows).values(note="mine"))
            with pytest.raises(alk.InvalidOptions, match=f"(?s){other.kind}.*{db.kind}"):
                getattr(alk, call)(session, store.queue("q"), *args)
            session.commit()
        assert _notes(engine) == ["mine"]
    finally:
        store.close()
        with engine.begin() as conn:
            conn.execute(sa.delete(rows))


def app_engine_of(db: Target) -> sa.Engine:
    if db.kind == "postgresql":
        return db.engine.execution_options(schema_translate_map={None: db.schema})
    return db.engine


def test_an_engine_no_store_is_registered_for_says_so_when_the_default_schema_is_missing(pg_db: Target) -> None:
    """PostgreSQL: a session on an Engine object no store is registered for (the app made
    its own engine from the URL the store was given) writes to the default schema; when
    that is not installed, the NotInstalled says that no store is registered for the
    engine and how to register one — not only "run alkstore migrate", which would install
    a second copy in the default schema whose jobs the store never claims."""
    from tests.fresh_pg import fresh_pg_database

    with fresh_pg_database("alkunreg") as url:  # a database with no default-schema install
        _unregistered_engine(url, pg_db.schema)


def _unregistered_engine(url: str, schema: str) -> None:
    store = alk.Store(url, schema=schema)  # the store's own engine, made from the URL
    store.install()
    app = sa.create_engine(url)  # the application's: not registered
    try:
        with Session(app) as session:
            with pytest.raises(alk.NotInstalled, match=r"(?s)No Store is registered.*\.register\(engine\)"):
                alk.enqueue(session, "q", {"x": 1})
            session.rollback()
        store.register(app)
        with Session(app) as session:
            job_id = alk.enqueue(session, "q", {"x": 1})
            session.commit()
        job = store.get_job(job_id)
        assert job is not None and job.payload == {"x": 1}
    finally:
        store.close()
        app.dispose()
