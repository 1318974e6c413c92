"""Database URLs (SPEC §4): ``postgresql://``, ``postgres://`` and ``postgresql+psycopg://``
all mean psycopg 3 for the store's own connections; driver options in the URL's query arrive
with the types psycopg expects; a URL alkstore cannot use is an ``InvalidOptions`` that says
why, before anything connects. The scheme forms connect to the real PostgreSQL server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

import alkstore_sa as alk
from alkstore_sa._urls import engine_from_url
from tests.conftest import require_pg
from tests.support import PG_URL, Target, new_pg_schema


def pg_url(drivername: str, query: str = "") -> str:
    """The test server's URL under another scheme, with an optional query string."""
    url = make_url(PG_URL).set(drivername=drivername).render_as_string(hide_password=False)
    return f"{url}?{query}" if query else url


def dbapi(engine: sa.Engine) -> object:
    """A driver connection of ``engine`` (the caller closes the engine)."""
    return engine.raw_connection().dbapi_connection


@pytest.fixture
def engines() -> Iterator[list[sa.Engine]]:
    made: list[sa.Engine] = []
    yield made
    for e in made:
        e.dispose()


# -- the scheme forms ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"])
def test_postgres_schemes_connect_with_psycopg3(scheme: str, engines: list[sa.Engine]) -> None:
    require_pg()
    import psycopg

    engine = engine_from_url(pg_url(scheme))
    engines.append(engine)
    assert engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    assert isinstance(dbapi(engine), psycopg.Connection)


def test_url_object_is_accepted(engines: list[sa.Engine]) -> None:
    require_pg()
    engine = engine_from_url(make_url(pg_url("postgres")))
    engines.append(engine)
    assert engine.dialect.driver == "psycopg"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_store_from_a_database_url_form_works(scheme: str) -> None:
    require_pg()
    schema = new_pg_schema("urls")
    store = alk.Store(pg_url(scheme), schema=schema)
    try:
        store.install()
        q = store.queue("from-url")
        job_id = q.enqueue({"scheme": scheme})
        handle = q.claim_one("w")
        assert handle is not None and handle.id == job_id and handle.ack()
        assert store.engine.dialect.driver == "psycopg"
    finally:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        store.close()


# -- driver options in the query ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("0", 0), ("7", 7), ("none", None), ("None", None)])
def test_prepare_threshold_in_url(text: str, expected: int | None, engines: list[sa.Engine]) -> None:
    require_pg()
    engine = engine_from_url(pg_url("postgresql", f"prepare_threshold={text}"))
    engines.append(engine)
    conn = dbapi(engine)
    assert conn.prepare_threshold == expected  # type: ignore[attr-defined]
    with engine.connect() as c:
        for _ in range(8):  # past psycopg's default threshold: prepared (or not) without error
            assert c.execute(sa.text("SELECT 1")).scalar() == 1


def test_store_with_prepare_threshold_zero_runs_operations() -> None:
    require_pg()
    schema = new_pg_schema("urls")
    store = alk.Store(pg_url("postgresql", "prepare_threshold=0"), schema=schema)
    try:
        store.install()
        q = store.queue("prepared")
        for i in range(6):
            q.enqueue({"i": i})
        assert len(q.claim_batch("w", 6)) == 6
    finally:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        store.close()


def test_libpq_options_in_url_reach_the_connection(engines: list[sa.Engine]) -> None:
    require_pg()
    query = "connect_timeout=5&keepalives=1&keepalives_idle=30&keepalives_interval=5&keepalives_count=3&tcp_user_timeout=9000&application_name=alk-urls"
    engine = engine_from_url(pg_url("postgres", query))
    engines.append(engine)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW application_name").scalar() == "alk-urls"
    params = dbapi(engine).info.get_parameters()  # type: ignore[attr-defined]
    assert params["connect_timeout"] == "5" and params["keepalives_idle"] == "30"
    assert params["keepalives_count"] == "3" and params["tcp_user_timeout"] == "9000"


def test_engine_keywords_pass_through_and_merge(engines: list[sa.Engine]) -> None:
    require_pg()
    engine = engine_from_url(
        pg_url("postgresql", "prepare_threshold=0"),
        pool_pre_ping=True,
        connect_args={"application_name": "alk-kw"},
    )
    engines.append(engine)
    assert engine.pool._pre_ping  # type: ignore[attr-defined]
    assert dbapi(engine).prepare_threshold == 0  # type: ignore[attr-defined]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW application_name").scalar() == "alk-kw"


# -- SQLite ----------------------------------------------------------------------------------


def test_sqlite_urls_are_left_alone(tmp_path: Path, engines: list[sa.Engine]) -> None:
    path = tmp_path / "u.db"
    for url in (f"sqlite:///{path}", f"sqlite+pysqlite:///{path}?timeout=7", f"sqlite+aiosqlite:///{path}"):
        engine = engine_from_url(url)
        engines.append(engine)
        assert engine.dialect.name == "sqlite" and engine.dialect.driver == "pysqlite"
        assert engine.url.database == str(path)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1


# SQLAlchemy's pysqlite dialect reads six sqlite3 options from the query and, only with
# uri=true, passes the rest on to a file: URI; any other name it drops without a word. A '?'
# in a path starts the query, so the path is cut there and another file is used.
SQLITE_REFUSED = [
    ("what?dir/app.db", "'dir/app.db'"),  # the query "dir/app.db" (no '='): the file 'what'
    ("app.db?journal_mode=wal", "'journal_mode'"),
    ("app.db?mode=ro", "uri=true"),  # a URI parameter, ignored without uri=true
    ("app.db?uri=true&mode=rwc", "file:"),  # appended to a plain name: the file 'app.db?mode=rwc'
    ("file:app.db?uri=true&mode=rwc&nosuch=1", "'nosuch'"),
    ("app.db?timeout=1&timeout=2", "more than once"),
]


@pytest.mark.parametrize(("tail", "says"), SQLITE_REFUSED, ids=[t for t, _ in SQLITE_REFUSED])
def test_sqlite_url_options_sqlite_does_not_know_are_refused_and_create_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    absolute = f"file:{tmp_path}/{tail[5:]}" if tail.startswith("file:") else f"{tmp_path}/{tail}"
    for url in (f"sqlite:///{tail}", f"sqlite:///{absolute}", f"sqlite+aiosqlite:///{tail}"):
        for make in (engine_from_url, alk.Store):
            with pytest.raises(alk.InvalidOptions) as info:
                make(url)
            message = str(info.value)
            assert says in message and "\n" not in message, message
        if "'" in says:  # an unknown name: the message says how to write a '?' in a path
            assert "%3F" in message and "uri=true" in message, message
    assert list(tmp_path.iterdir()) == []


def test_a_question_mark_in_a_path_works_percent_encoded_in_a_file_uri(tmp_path: Path) -> None:
    (tmp_path / "what?dir").mkdir()
    url = f"sqlite:///file:{tmp_path}/what%3Fdir/app.db?mode=rwc&uri=true"
    with alk.Store(url) as store:
        store.install()
        store.queue("q").enqueue({"n": 1})
    assert (tmp_path / "what?dir" / "app.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["what?dir"]


def test_sqlite_options_sqlite_knows_still_work(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    for url in (
        f"sqlite:///file:{path}?mode=rwc&uri=true",
        f"sqlite:///file:{path}?uri=true&cache=private&timeout=5",
        f"sqlite:///{path}?timeout=7",
        f"sqlite:///{path}?timeout=7&check_same_thread=false&cached_statements=50&detect_types=0",
        f"sqlite+aiosqlite:///{path}?timeout=7",
    ):
        with alk.Store(url) as store:
            store.install()
            store.queue("q").enqueue({"url": url})
    with alk.Store(f"sqlite:///{path}") as store:
        assert store.queue("q").stats().pending == 5
    engine = engine_from_url(f"sqlite:///{path}?timeout=7")
    assert engine.dialect.create_connect_args(engine.url)[1]["timeout"] == 7.0
    engine.dispose()


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("not a url", "not a database URL"),
        ("postgresql://u@h:notaport/db", "not a database URL"),
        ("mysql://u@h/db", "PostgreSQL (psycopg 3) and SQLite, not 'mysql'"),
        ("oracle+oracledb://u@h/db", "not 'oracle'"),
        ("postgresql://u@h/db?prepare_threshold=soon", "prepare_threshold"),
        ("postgresql://u@h/db?prepare_threshold=-1", "prepare_threshold"),
        ("postgresql://u@h/db?prepare_threshold=1&prepare_threshold=2", "more than once"),
        ("postgresql://u@h/db?connect_timeout=soon", "connect_timeout"),
        ("postgres://u@h/db?keepalives_idle=1.5", "keepalives_idle"),
        ("postgresql://u@h/db?tcp_user_timeout=1e3", "tcp_user_timeout"),
        ("postgresql://u@h/db?no_such_option=1", "no_such_option"),
        ("postgresql://u@h/db?autocommit=false", "autocommit"),
        ("postgresql+asyncpg://u@h/db?ssl=require", "'ssl'"),
    ],
)
def test_unusable_urls_raise_invalid_options(url: str, says: str) -> None:
    with pytest.raises(alk.InvalidOptions) as info:
        engine_from_url(url)
    assert says in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_store_refuses_an_unusable_url_before_connecting() -> None:
    with pytest.raises(alk.InvalidOptions, match="prepare_threshold"):
        alk.Store("postgresql://nobody@127.0.0.1:1/none?prepare_threshold=often")
    with pytest.raises(alk.InvalidOptions, match="not a database URL"):
        alk.Store("nonsense")


IN_MEMORY = ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://", "sqlite:///file:mem?mode=memory&uri=true"]


@pytest.mark.parametrize("url", IN_MEMORY)
def test_store_refuses_an_in_memory_sqlite_url(url: str) -> None:
    """A store keeps its own connections: an in-memory database would be another (empty)
    one on each of them, so it is refused up front, as the CLI refuses it."""
    with pytest.raises(alk.InvalidOptions, match="in-memory SQLite.*use a database file"):
        alk.Store(url)


@pytest.mark.parametrize("static", [False, True], ids=["default-pool", "StaticPool"])
def test_store_refuses_an_in_memory_sqlite_engine_and_writes_nothing(static: bool) -> None:
    """Was: under StaticPool (the one shared connection IS the database) Store() took the
    engine and install() disposed it, dropping the application's own tables with it."""
    kw: dict[str, object] = {"poolclass": sa.pool.StaticPool, "connect_args": {"check_same_thread": False}} if static else {}
    engine = sa.create_engine("sqlite://", **kw)  # type: ignore[arg-type]
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        with pytest.raises(alk.InvalidOptions, match="in-memory SQLite.*use a database file"):
            alk.Store(engine)
        with engine.connect() as conn:
            names = conn.exec_driver_sql("SELECT name FROM sqlite_master").scalars().all()
        assert names == ["users"]  # the application's table is still there
    finally:
        engine.dispose()


def test_register_refuses_an_in_memory_sqlite_engine(tmp_path: Path) -> None:
    engine = sa.create_engine("sqlite://")
    with alk.Store(f"sqlite:///{tmp_path / 'r.db'}") as store, pytest.raises(alk.InvalidOptions, match="in-memory SQLite"):
        store.register(engine)
    engine.dispose()


def test_an_engine_whose_creator_opens_a_file_is_no_in_memory_database(tmp_path: Path) -> None:
    """``create_engine("sqlite://", creator=...)``: the URL names no file, the creator opens
    one. The store runs on such an engine (and register() takes one) as it did before the
    in-memory refusal; where it would need an engine of its own (a pool sharing one
    connection) it cannot make one from that URL, and says what to do instead."""
    import sqlite3

    path = str(tmp_path / "made.db")
    alk.Store(f"sqlite:///{path}").install()

    def creator() -> sqlite3.Connection:
        return sqlite3.connect(path, check_same_thread=False)

    engine = sa.create_engine("sqlite://", creator=creator, poolclass=sa.pool.QueuePool)
    other = sa.create_engine("sqlite://", creator=creator, poolclass=sa.pool.QueuePool)
    shared = sa.create_engine("sqlite://", creator=creator, poolclass=sa.pool.StaticPool)
    try:
        with alk.Store(engine) as store:
            job = store.queue("q").enqueue({"n": 1})
            store.register(other)
            assert store.get_job(job) is not None
        with pytest.raises(alk.InvalidOptions, match="creator=.*register"):
            alk.Store(shared)
    finally:
        for e in (engine, other, shared):
            e.dispose()


def test_refusals_never_show_the_password() -> None:
    for url in ("postgresql://u:s3cr3t@h/db?no_such_option=1", "postgresql://u:s3cr3t@h/db?prepare_threshold=x",
                "postgresql://u:s3cr3t@h:port/db", "mysql://u:s3cr3t@h/db"):
        with pytest.raises(alk.InvalidOptions) as info:
            engine_from_url(url)
        assert "s3cr3t" not in str(info.value), str(info.value)


def test_missing_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg 3 were not installed
    with pytest.raises(alk.InvalidOptions, match=r"psycopg.*not installed.*pip install"):
        engine_from_url("postgresql://u@h/db")


def test_uninstalled_sqlite_driver_is_a_clear_error() -> None:
    with pytest.raises(alk.InvalidOptions, match="not installed"):
        engine_from_url("sqlite+pysqlcipher://:key@/x.db")


def test_non_url_types_are_refused() -> None:
    with pytest.raises(alk.InvalidOptions):
        engine_from_url(42)  # type: ignore[arg-type]


def test_an_engine_the_store_cannot_run_on_with_its_own_creator_is_refused(db: Target, tmp_path: Path) -> None:
    """A psycopg2 (or async, or StaticPool) engine whose creator= decides where it connects:
    the store would make its own engine from the URL — which says nothing, or something
    else — and run on whatever database that reaches, while the application's jobs go to
    the creator's and are claimed by nobody. Refused, naming the cure, which works."""
    import sqlite3

    if db.kind == "postgresql":
        import psycopg2

        def creator() -> Any:
            return psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="test")

        app = sa.create_engine("postgresql+psycopg2://", creator=creator)
    else:
        path = db.url.removeprefix("sqlite:///")

        def creator() -> Any:
            return sqlite3.connect(path, check_same_thread=False)

        # the URL names another file: the creator's is the one the application writes to
        app = sa.create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}", creator=creator, poolclass=sa.pool.StaticPool)
    try:
        with pytest.raises(alk.InvalidOptions, match="creator=.*register"):
            alk.Store(app, schema=db.schema)
        with alk.Store(db.engine, schema=db.schema) as store:  # the cure
            store.register(app)
            with Session(app) as session:
                job_id = alk.enqueue(session, "creator-q", "x")
                session.commit()
            handle = store.queue("creator-q").claim_one("w")
            assert handle is not None and handle.id == job_id and handle.ack()
    finally:
        app.dispose()


def test_an_engine_the_store_cannot_run_on_with_a_do_connect_hook_is_refused(db: Target, tmp_path: Path) -> None:
    """A ``do_connect`` listener (a cloud IAM token, a password from a vault, a database
    chosen at connect time) decides how the application's engine connects, as creator=
    does: an engine the store made from the URL would connect without it — failing to
    authenticate, or reaching another database, where the application's jobs would never
    be claimed. Refused with the cure (the store's own engine, with the hook attached to
    it, and the application's registered), which works."""
    if db.kind == "postgresql":
        app = sa.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/no_such_database")
        target = {"dbname": "test"}
    else:
        # the URL names another file: the hook's is the one the application writes to
        app = sa.create_engine(f"sqlite:///{tmp_path / 'elsewhere.db'}", poolclass=sa.pool.StaticPool)
        target = {"database": db.url.removeprefix("sqlite:///")}

    def redirect(dialect: Any, conn_rec: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        if db.kind == "sqlite":
            cargs.clear()
        cparams.update(target)

    sa.event.listen(app, "do_connect", redirect)
    try:
        with pytest.raises(alk.InvalidOptions, match="do_connect.*register"):
            alk.Store(app, schema=db.schema)
        with alk.Store(db.engine, schema=db.schema) as store:  # the cure
            store.register(app)
            with Session(app) as session:
                job_id = alk.enqueue(session, "hook-q", "x")
                session.commit()
            handle = store.queue("hook-q").claim_one("w")
            assert handle is not None and handle.id == job_id and handle.ack()
    finally:
        app.dispose()
