"""A hostile ``search_path`` runs none of an attacker's objects (PostgreSQL only).

An attacker who can create objects in a schema that precedes ``pg_catalog`` in a session's
``search_path`` (``attacker,pg_catalog,public``) can shadow every built-in the library's SQL
names without a schema: functions (``date_part``, ``pg_notify``, ``unnest``, the
aggregates, ...), operators (``=``, ``<=``, ``+``, ``||`` on the exact argument types: an
operator earlier in the path wins a tie) and types (a domain ``text`` whose CHECK calls the
attacker's function). Each shadow here does the real work — so every operation still
succeeds — and records that it ran, in a table and in a sequence (which a rollback does
not undo). After every operation of the store has run on connections with that
``search_path``, neither may show a single call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import migrations
from tests.conftest import require_pg
from tests.every_op import engine_with_search_path, run_every_operation
from tests.support import PG_URL, new_pg_schema

T, I4, I8, F8, JB, TS, B = (
    "pg_catalog.text", "pg_catalog.int4", "pg_catalog.int8", "pg_catalog.float8",
    "pg_catalog.jsonb", "pg_catalog.timestamptz", "pg_catalog.bool",
)

# (operator, left, right, result): every operator/type pair the library's statements use
OPERATORS = [
    *(("=", t, t, B) for t in (T, I4, I8, F8)),
    *((op, t, t, B) for op in ("<", "<=", ">", ">=") for t in (I4, I8, F8)),
    ("+", F8, F8, F8), ("+", I4, I4, I4), ("+", I8, I4, I8), ("+", I8, I8, I8),
    ("-", F8, F8, F8), ("||", JB, JB, JB),
]

# (name, arguments, result, body computing the real result with qualified names)
FUNCTIONS = [
    ("date_part", f"f {T}, t {TS}", F8, "RETURN pg_catalog.date_part(f, t);"),
    ("statement_timestamp", "", TS, "RETURN pg_catalog.statement_timestamp();"),
    ("now", "", TS, "RETURN pg_catalog.now();"),
    ("pg_notify", f"c {T}, p {T}", "void", "PERFORM pg_catalog.pg_notify(c, p);"),
    ("unnest", "a anyarray", "SETOF anyelement", "RETURN QUERY SELECT * FROM pg_catalog.unnest(a);"),
    ("jsonb_build_array", f"e {JB}", JB, "RETURN pg_catalog.jsonb_build_array(e);"),
    (
        "jsonb_build_object",
        f"k1 {T}, v1 {I4}, k2 {T}, v2 {T}, k3 {T}, v3 {F8}",
        JB,
        "RETURN pg_catalog.jsonb_build_object(k1, v1, k2, v2, k3, v3);",
    ),
    ("pg_advisory_xact_lock", f"k {I8}", "void", "PERFORM pg_catalog.pg_advisory_xact_lock(k);"),
]

# (aggregate signature, state type, step function, initial state): the final function records
AGGREGATES = [
    ("count(*)", I8, "pg_catalog.int8inc", "'0'"),
    (f"min({F8})", F8, "pg_catalog.float8smaller", None),
    (f"max({F8})", F8, "pg_catalog.float8larger", None),
    (f"max({I4})", I4, "pg_catalog.int4larger", None),
    (f"sum({I4})", I8, "pg_catalog.int84pl", "'0'"),
]


def shadow_ddl(att: str) -> list[str]:
    """The attacker's schema: the recorder, then a shadow for every built-in above."""
    ddl = [
        f'CREATE SCHEMA "{att}"',
        f'CREATE TABLE "{att}".hits (what {T})',
        f'CREATE SEQUENCE "{att}".hit_count',
        f"""CREATE FUNCTION "{att}".hit(what {T}) RETURNS {B} LANGUAGE plpgsql AS $$
            BEGIN
              PERFORM pg_catalog.nextval('"{att}".hit_count');
              INSERT INTO "{att}".hits VALUES (what);
              RETURN true;
            END $$""",
    ]
    for name, args, result, body in FUNCTIONS:
        ddl.append(
            f"""CREATE FUNCTION "{att}".{name}({args}) RETURNS {result} LANGUAGE plpgsql AS $$
                BEGIN PERFORM "{att}".hit('{name}()'); {body} END $$"""
        )
    for i, (op, left, right, result) in enumerate(OPERATORS):
        fn = f'"{att}".op_{i}'
        ddl.append(
            f"""CREATE FUNCTION {fn}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS $$
                BEGIN PERFORM "{att}".hit('{left} {op} {right}');
                RETURN a OPERATOR(pg_catalog.{op}) b; END $$"""
        )
        ddl.append(f'CREATE OPERATOR "{att}".{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn})')
    for i, (signature, state, step, init) in enumerate(AGGREGATES):
        final = f'"{att}".agg_{i}'
        ddl.append(
            f"""CREATE FUNCTION {final}(s {state}) RETURNS {state} LANGUAGE plpgsql AS $$
                BEGIN PERFORM "{att}".hit('{signature}'); RETURN s; END $$"""
        )
        initcond = "" if init is None else f", INITCOND = {init}"
        ddl.append(
            f'CREATE AGGREGATE "{att}".{signature} (SFUNC = {step}, STYPE = {state}, FINALFUNC = {final}{initcond})'
        )
    for name, base in (("text", T), ("jsonb", JB)):
        ddl.append(f"""CREATE DOMAIN "{att}".{name} AS {base} CHECK ("{att}".hit('domain {name}'))""")
    return ddl


@dataclass
class Hostile:
    schema: str  # where alkstore's tables are
    attacker: str  # the schema that precedes pg_catalog
    admin: sa.Engine  # a normal engine (reads the recorder)
    engine: sa.Engine  # every connection has search_path = attacker, pg_catalog, public

    def hits(self) -> tuple[list[str], bool]:
        """What the shadows recorded: committed rows, and whether any call happened at all
        (the sequence also counts calls whose transaction rolled back)."""
        with self.admin.connect() as c:
            rows = sorted({r[0] for r in c.exec_driver_sql(f'SELECT what FROM "{self.attacker}".hits')})
            called = c.exec_driver_sql(f'SELECT is_called FROM "{self.attacker}".hit_count').scalar()
        return rows, bool(called)

    def reset(self) -> None:
        with self.admin.begin() as c:
            c.exec_driver_sql(f'TRUNCATE "{self.attacker}".hits')
            c.exec_driver_sql(f"""SELECT pg_catalog.setval('"{self.attacker}".hit_count', 1, false)""")


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    require_pg()
    schema, att = new_pg_schema("sp"), new_pg_schema("attacker")
    admin = sa.create_engine(PG_URL)
    engine = engine_with_search_path(PG_URL, f'"{att}",pg_catalog,public')
    try:
        migrations.upgrade(admin, schema=schema)
        # the dialect's first-connect queries (psycopg's type lookups) are not alkstore's
        # SQL: let them run before the shadows exist
        with engine.connect():
            pass
        with admin.begin() as c:
            for stmt in shadow_ddl(att):
                c.exec_driver_sql(stmt)
        yield Hostile(schema, att, admin, engine)
    finally:
        engine.dispose()
        with admin.begin() as c:
            c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{att}" CASCADE')
            c.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


def test_the_shadows_catch_unqualified_sql(hostile: Hostile) -> None:
    """The trap works: unqualified built-ins, operators and type names on these
    connections reach the attacker's objects (so the next test cannot pass vacuously)."""
    hostile.reset()
    with hostile.engine.begin() as c:
        c.exec_driver_sql(
            "SELECT date_part('epoch', statement_timestamp()), 1::int4 = 1::int4, "
            "2.0::float8 <= 3.0::float8, 'x'::text, (SELECT count(*) FROM (VALUES (1)) v(x))"
        )
    rows, called = hostile.hits()
    assert called
    for expected in ("date_part()", "statement_timestamp()", "pg_catalog.int4 = pg_catalog.int4",
                     "pg_catalog.float8 <= pg_catalog.float8", "domain text", "count(*)"):
        assert expected in rows, rows


def test_no_shadow_runs_during_any_operation(hostile: Hostile) -> None:
    hostile.reset()
    with alk.Store(hostile.engine, schema=hostile.schema) as store:
        with hostile.engine.connect() as c:
            path = c.exec_driver_sql("SHOW search_path").scalar()
        assert path is not None and path.startswith(f'"{hostile.attacker}"'), path
        run_every_operation(store)
    rows, called = hostile.hits()
    assert rows == [] and not called, f"the attacker's objects ran: {rows}"


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg"])
def test_no_shadow_runs_in_the_callers_transaction_on_other_drivers(hostile: Hostile, driver: str) -> None:
    """The caller's-transaction forms on psycopg2 and asyncpg (each compiled with its own
    dialect, the pg_catalog qualification mixed in): no shadow runs either."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    path = f'"{hostile.attacker}",pg_catalog,public'
    url = sa.make_url(PG_URL).set(drivername=f"postgresql+{driver}")
    name = new_pg_schema("tx")

    def calls(conn: sa.Connection) -> list[str]:
        job = alk.enqueue(conn, name, {"tx": 1}, delay=1, expires=60)
        alk.enqueue_many(conn, name, [{"tx": 2}])
        assert alk.get_job(conn, name, job) is not None
        alk.outbox_enqueue(conn, name, {"out": 1})
        alk.publish(conn, name, {"event": 1})
        alk.notify(conn, name, "tx")
        conn.commit()
        return [conn.exec_driver_sql("SHOW search_path").scalar()]

    with alk.Store(hostile.admin, schema=hostile.schema) as store:
        if driver == "psycopg2":
            engine = engine_with_search_path(url, path)
            store.register(engine)
            with engine.connect():
                pass  # the dialect's first-connect queries are not alkstore's SQL
            hostile.reset()
            with engine.connect() as conn:
                shown = calls(conn)
            engine.dispose()
        else:

            async def on_asyncpg() -> list[str]:
                engine = create_async_engine(url, connect_args={"server_settings": {"search_path": path}})
                store.register(engine)
                async with engine.connect():
                    pass
                hostile.reset()
                async with engine.connect() as conn:
                    result = await conn.run_sync(calls)
                await engine.dispose()
                return result

            shown = asyncio.run(on_asyncpg())
        assert shown[0].startswith(f'"{hostile.attacker}"'), shown
        assert store.queue(name).stats().pending == 2
    rows, called = hostile.hits()
    assert rows == [] and not called, f"the attacker's objects ran ({driver}): {rows}"
