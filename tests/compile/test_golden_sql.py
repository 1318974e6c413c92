"""Golden SQL: the driver SQL each backend compiles (``backend._sql``) is pinned on the
features its correctness depends on, per dialect.

- PostgreSQL claim: ONE statement; every ``FOR UPDATE SKIP LOCKED`` scan sits in an
  ``AS MATERIALIZED`` CTE, and so does the ``LIMIT`` the final UPDATE joins against (the
  fence against handing out more than n rows); the exhausted-reclaim DELETE/INSERT CTEs
  ride in the same statement; ``RETURNING``.
- SQLite claim: ``UPDATE ... RETURNING`` and never ``FOR UPDATE`` (SQLAlchemy renders
  ``with_for_update()`` as nothing on SQLite, silently), run inside ``BEGIN IMMEDIATE``.
- State values are inlined literals (SQLite uses a partial index only when the query's
  WHERE literally implies the index's WHERE).
- Every table reference is schema-qualified (``main.`` on SQLite, the quoted configured
  schema on PostgreSQL, including one that needs quoting), and on PostgreSQL every
  built-in function, operator and non-keyword type name is ``pg_catalog``-qualified, so
  ``search_path`` is moot (tests/conformance/test_search_path.py runs the hostile case).
- No user value ever reaches SQL text: everything the caller passes is a parameter.

The statements are compiled by running real operations against real databases (the same
path production takes), then read from the backend's cache. Assertions are on robust
features, not whole strings, so cosmetic SQLAlchemy changes do not break them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

import alkstore_sa as alk
from alkstore_sa import queue as queue_mod
from alkstore_sa import tracing
from alkstore_sa._backends.postgresql import JSON_ARRAY_PATTERN
from alkstore_sa._backends.sqlite import EXACT_REAL
from alkstore_sa.schema import UNREADABLE_HISTORY
from tests.every_op import run_every_operation
from tests.support import FakeClock, Target, drop_pg_schema, new_pg_schema, pg_target, sqlite_target

TABLES = sorted(t.name for t in alk.metadata.tables.values())

# Values that must never appear in SQL text: each is passed through a public operation.
QUEUE = "Q-sentinel-3f9a'); DROP TABLE x; --"
WORKER = "W-sentinel-77c1'"
ERROR = "E-sentinel-b20e'"
PAYLOAD = {"P-sentinel-5e1d": "V-sentinel-0a4c'"}
PRIORITY = 424242
VISIBILITY = 4321.5
BACKOFF = 17.25
RETENTION = 86420.75
EXPIRES = 97531.5
DELAY = 13579.5
CLOCK_START = 1_811_223_344.0
NUMBERS = ["424242", "4321.5", "17.25", "86420.75", "97531.5", "13579.5", "1811223344"]
UNIQUE = "K-sentinel-c41d'"
SENTINELS = [QUEUE, WORKER, ERROR, UNIQUE, *PAYLOAD, *PAYLOAD.values(), *NUMBERS, "sentinel"]

# Keys the script below must have compiled, per dialect (the hot path first).
HOT = {"claim", "ack", "retry", "bury", "heartbeat", "enqueue", "enqueue_many", "stats"}
PG_MOVES = {"sweep", "requeue_dead:take"}
SQLITE_MOVES = {"claim:bury", "claim:drop", "bury:drop", "sweep:bury", "sweep:drop", "sweep:purge"}
# The enqueues of a traced process (alkstore_sa.tracing), which also store a trace context.
TRACED = {"enqueue:traced", "enqueue_many:traced", "enqueue:unique:traced"}


@dataclass
class Compiled:
    kind: str  # "sqlite" | "postgresql"
    schema: str
    sql: dict[str, str]  # backend._sql, whitespace-normalized
    raw: dict[str, str]  # backend._sql as the driver receives it

    def op(self, symbol: str) -> str:
        """How a comparison/arithmetic operator is rendered (spaces included)."""
        return f" OPERATOR(pg_catalog.{symbol}) " if self.kind == "postgresql" else f" {symbol} "

    @property
    def prefix(self) -> str:
        """How a table's schema must be rendered in front of it."""
        if self.kind == "sqlite":
            return "main."
        if re.fullmatch(r"[a-z_][a-z0-9_]*", self.schema):
            return f"{self.schema}."
        # quoted, and with ``%`` doubled: psycopg's pyformat SQL reads ``%`` as a marker
        return '"' + self.schema.replace('"', '""').replace("%", "%%") + '".'

    def t(self, table: str) -> str:
        return self.prefix + table


def norm(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def compile_everything(target: Target) -> Compiled:
    """Run every queue operation once (sentinel values everywhere) and return what the
    backend compiled."""
    store = target.store(clock=FakeClock(CLOCK_START))
    try:
        q = store.queue(
            QUEUE, visibility_timeout=VISIBILITY, max_attempts=2, backoff_base=BACKOFF,
            dead_letter_retention=RETENTION,
        )
        q.enqueue(PAYLOAD, priority=PRIORITY, delay=DELAY, expires=EXPIRES)
        q.enqueue_many([PAYLOAD, PAYLOAD], priority=PRIORITY, expires=EXPIRES)
        h1, h2 = q.claim_batch(WORKER, 2)
        assert h1.heartbeat(VISIBILITY) is True
        assert h1.retry(ERROR, delay=DELAY) is True
        assert h2.fail(ERROR) is True
        assert q.ack_batch([h1.id, h2.id]) == 0
        q.enqueue(PAYLOAD, priority=PRIORITY)
        h = q.claim_one(WORKER)
        assert h is not None and h.ack() is True
        assert q.cancel(h1.id) is True
        assert queue_mod.cancel_pending(q, q.enqueue(PAYLOAD)) is True  # the dashboard's cancel
        assert q.get_job(h2.id) is not None and store.get_job(h2.id) is not None
        with target.engine.connect() as conn:
            assert alk.get_job(conn, q, h2.id) is not None  # the queue-filtered read
            alk.enqueue(conn, q, PAYLOAD, priority=PRIORITY)
            alk.enqueue_many(conn, q, [PAYLOAD], priority=PRIORITY)
            alk.enqueue(conn, q, PAYLOAD, unique_key=UNIQUE)
            conn.rollback()
        assert [j.id for j in q.dead_jobs()] == [h2.id]
        assert q.dead_jobs(before_id=h2.id) == []
        assert q.requeue_dead(h2.id) is not None
        q.sweep_expired()
        q.stats()
        assert q.enqueue(PAYLOAD, unique_key=UNIQUE) == q.enqueue(PAYLOAD, unique_key=UNIQUE)
        tracing.instrument()
        try:
            q.enqueue(PAYLOAD, priority=PRIORITY, delay=DELAY)
            q.enqueue_many([PAYLOAD, PAYLOAD], priority=PRIORITY)
            q.enqueue(PAYLOAD, unique_key=UNIQUE + "traced")
        finally:
            tracing.uninstrument()
        queue_mod.claim_turns(store, WORKER, [q, store.queue(QUEUE + "-turn")], 2, 3)  # queues taking turns
        raw = dict(store.backend._sql)
        sql = {k: norm(v) for k, v in raw.items()}
    finally:
        store.close()
    return Compiled(target.kind, target.schema, sql, raw)


@pytest.fixture(scope="module")
def _quoted_pg_target() -> Iterator[Target]:
    """A PostgreSQL schema whose name needs quoting (space, capital, percent sign)."""
    from tests.conftest import require_pg

    require_pg()
    target = pg_target(f"my schema %s Q{uuid.uuid4().hex[:8]}")
    yield target
    with target.engine.begin() as c:
        quoted = '"' + target.schema.replace('"', '""').replace("%", "%%") + '"'
        c.exec_driver_sql(f"DROP SCHEMA IF EXISTS {quoted} CASCADE")
    target.engine.dispose()


def _compile_on(request: pytest.FixtureRequest, tmp_path, which: str) -> Iterator[Compiled]:
    if which == "sqlite":
        target = sqlite_target(str(tmp_path))
        try:
            yield compile_everything(target)
        finally:
            target.engine.dispose()
    elif which == "postgresql":
        yield compile_everything(request.getfixturevalue("_pg_module_target"))
    else:
        yield compile_everything(request.getfixturevalue("_quoted_pg_target"))


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-quoted-schema"])
def compiled(request: pytest.FixtureRequest, tmp_path) -> Iterator[Compiled]:
    """What each backend compiled, on every engine (and a schema that needs quoting)."""
    yield from _compile_on(request, tmp_path, request.param)


@pytest.fixture(scope="module")
def _long_schema_pg_target() -> Iterator[Target]:
    """A PostgreSQL schema with a name of the longest kind PostgreSQL allows (63 bytes)."""
    from tests.conftest import require_pg

    require_pg()
    target = pg_target(new_pg_schema("long").ljust(63, "x"))
    yield target
    drop_pg_schema(target)


@pytest.fixture(params=["postgresql", "postgresql-quoted-schema", "postgresql-63-byte-schema"])
def pg_compiled(request: pytest.FixtureRequest, tmp_path) -> Iterator[Compiled]:
    if request.param == "postgresql-63-byte-schema":
        yield compile_everything(request.getfixturevalue("_long_schema_pg_target"))
        return
    yield from _compile_on(request, tmp_path, request.param)


@pytest.fixture
def sqlite_compiled(request: pytest.FixtureRequest, tmp_path) -> Iterator[Compiled]:
    yield from _compile_on(request, tmp_path, "sqlite")


# -- CTE parsing (PostgreSQL) --------------------------------------------------------------


@dataclass
class Cte:
    name: str
    materialized: bool
    body: str


def _close_paren(sql: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start`` (quotes respected)."""
    depth, i, quote = 0, start, ""
    while i < len(sql):
        ch = sql[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise AssertionError(f"unbalanced parentheses in {sql!r}")


def split_with(sql: str) -> tuple[list[Cte], str]:
    """A ``WITH [RECURSIVE] a AS [MATERIALIZED] (...), b(x) AS (...) <main>`` statement →
    (CTEs, main)."""
    assert sql.startswith("WITH "), sql[:80]
    ctes: list[Cte] = []
    pos = len("WITH RECURSIVE ") if sql.startswith("WITH RECURSIVE ") else len("WITH ")
    while True:
        m = re.compile(r"(\w+)(?:\([\w, ]+\))? AS (MATERIALIZED )?\(").match(sql, pos)
        assert m, f"expected a CTE at {sql[pos:pos + 80]!r}"
        end = _close_paren(sql, m.end() - 1)
        ctes.append(Cte(m.group(1), bool(m.group(2)), sql[m.end() : end]))
        pos = end + 1
        if sql.startswith(", ", pos):
            pos += 2
            continue
        return ctes, sql[pos:].strip()


def the_cte(ctes: list[Cte], *needles: str) -> Cte:
    found = [c for c in ctes if all(n in c.body for n in needles)]
    assert len(found) == 1, f"expected exactly one CTE containing {needles}, got {[c.name for c in found]}"
    return found[0]


# -- every dialect ------------------------------------------------------------------------


def test_hot_statements_are_compiled(compiled: Compiled) -> None:
    missing = HOT - set(compiled.sql)
    assert not missing, f"operations ran but these statements were never compiled: {missing}"
    moves = SQLITE_MOVES if compiled.kind == "sqlite" else PG_MOVES
    assert not moves - set(compiled.sql), moves - set(compiled.sql)
    assert not TRACED - set(compiled.sql), TRACED - set(compiled.sql)


def test_only_traced_enqueues_write_the_trace_context(compiled: Compiled) -> None:
    # tracing off costs nothing: the enqueues run the statements they ran before tracing
    for key in ("enqueue", "enqueue_many", "enqueue:unique"):
        assert "trace_context" not in compiled.sql[key], key
    for key in TRACED:
        assert "trace_context" in compiled.sql[key], key


def test_every_table_reference_is_schema_qualified(compiled: Compiled) -> None:
    names = "|".join(map(re.escape, TABLES))
    for key, sql in compiled.sql.items():
        refs = list(re.finditer(rf"(?<![\w])({names})(?![\w])", sql))
        assert refs, f"{key}: no alkstore table at all?"
        for m in refs:
            before = sql[: m.start()]
            assert before.endswith(compiled.prefix), (
                f"{key}: table {m.group(1)!r} not qualified with {compiled.prefix!r}: "
                f"...{sql[max(0, m.start() - 60) : m.end() + 20]}..."
            )


def test_no_user_value_in_sql_text(compiled: Compiled) -> None:
    for key, sql in compiled.sql.items():
        for value in SENTINELS:
            assert value not in sql, f"{key}: user value {value!r} was rendered into SQL text"


# The only string literals any statement may carry: the library's own constants.
LITERALS = {
    "pending", "processing", "dead", "[]", "max attempts exceeded", "expired",  # values
    "epoch", "$[#]", "attempt", "error", "at", EXACT_REAL,  # clock and error-history plumbing
    "$[0]", "$[1]",  # SQLite's traced enqueue_many: [payload, trace context] pairs
    "",  # the (empty) payload of a queue wake
    # the guard of the error history's append: a stored history that is not a JSON array
    UNREADABLE_HISTORY, "array", JSON_ARRAY_PATTERN.replace("\\", "\\\\"),
}
# a string literal of the SQL text (no marker can be inside one)
_LITERAL = re.compile(r"'(?:[^']|'')*'")


def test_string_literals_are_library_constants(compiled: Compiled) -> None:
    for key, sql in compiled.sql.items():
        found = {m[1:-1].replace("''", "'") for m in _LITERAL.findall(sql)}
        assert found <= LITERALS, f"{key}: unexpected literals {found - LITERALS}"


def test_only_named_parameters_of_the_driver_paramstyle(compiled: Compiled) -> None:
    # the executor passes a dict: positional markers would be silently unfillable
    for key, sql in compiled.sql.items():
        sql = _LITERAL.sub("''", sql)
        assert "?" not in sql and not re.search(r"\$\d", sql), key
        if compiled.kind == "sqlite":
            assert "%(" not in sql, key
            assert re.search(r":\w+", sql), f"{key}: a statement with no parameters?"
        else:
            assert not re.search(r"(?<![:\w]):[a-z_]+\b", sql), key
            assert re.search(r"%\(\w+\)s", sql), f"{key}: a statement with no parameters?"


def test_state_values_are_inlined_literals(compiled: Compiled) -> None:
    t = compiled.t("alkstore_jobs")
    for key, sql in compiled.sql.items():
        assert not re.search(r"(:|%\()state\b", sql), f"{key}: state is a bound parameter"
        assert not re.search(r"state\s*=\s*(:|%\()", sql), key
    claim = compiled.sql["claim"]
    # the pending scan and the reclaim scan each literally imply their partial index's WHERE
    # (on PostgreSQL the claim's scans read the table through the alias j)
    scan, eq = rf"(?:{re.escape(t)}|\bj)", re.escape(compiled.op("="))
    assert re.search(rf"{scan}\.state{eq}'pending'", claim)
    assert re.search(rf"{scan}\.state{eq}'processing'", claim)
    assert re.search(r"SET state\s*=\s*'processing'", claim)
    for key in ("ack", "heartbeat", "retry", "bury"):
        assert f"{t}.state{compiled.op('=')}'processing'" in compiled.sql[key], key
    assert re.search(r"SET state\s*=\s*'pending'", compiled.sql["retry"])
    assert "VALUES ('pending'," in compiled.sql["enqueue"]
    assert f"{t}.state{compiled.op('=')}'pending'" in compiled.sql["stats"]
    # the dashboard's cancel: the pending test is in the DELETE itself, not a read before it
    assert compiled.sql["cancel_pending"].startswith(f"DELETE FROM {t} ")
    assert f"{t}.state{compiled.op('=')}'pending'" in compiled.sql["cancel_pending"]


def test_validity_predicate_is_the_claim_token(compiled: Compiled) -> None:
    """ack/heartbeat/retry/fail act only on this claim: id, processing, this attempt
    number, deadline not passed — never the worker_id."""
    t = compiled.t("alkstore_jobs")
    eq, gt = re.escape(compiled.op("=")), re.escape(compiled.op(">"))
    for key in ("ack", "heartbeat", "retry", "bury"):
        sql = compiled.sql[key]
        assert re.search(rf"{re.escape(t)}\.attempts{eq}(:attempts|%\(attempts\)s)", sql), key
        assert re.search(rf"{re.escape(t)}\.claim_expires_at{gt}", sql), key
        assert re.search(rf"{re.escape(t)}\.id{eq}(:id|%\(id\)s)", sql), key
        assert "worker_id =" not in sql, f"{key}: the claim token must not be the worker_id"


# -- PostgreSQL -----------------------------------------------------------------------------


def test_pg_claim_is_one_fenced_skip_locked_statement(pg_compiled: Compiled) -> None:
    compiled = pg_compiled
    sql = compiled.sql["claim"]
    jobs, dead = compiled.t("alkstore_jobs"), compiled.t("alkstore_dead_jobs")
    assert ";" not in sql, "the claim must be ONE statement (one round trip, one snapshot)"
    ctes, main = split_with(sql)

    # every row-locking read skips locked rows, and is fenced in a MATERIALIZED CTE
    assert sql.count("FOR UPDATE") == sql.count("FOR UPDATE SKIP LOCKED") == 3, (
        "the exhausted, pending and reclaim scans must each lock with SKIP LOCKED (and only they)"
    )
    # psycopg caches its parse of a query only up to 4 KiB: the claim (aliased scans and
    # targets, one clock reading read through a CTE) must stay under it, even with a quoted
    # or a 63-byte schema name (3.6 KiB with a 14-byte schema, 4.0 KiB with a 63-byte one,
    # the queue-settings guard and the priority walk included)
    assert len(compiled.raw["claim"]) <= 4096, len(compiled.raw["claim"])
    for c in ctes:
        if "FOR UPDATE SKIP LOCKED" in c.body:
            assert c.materialized, f"CTE {c.name} locks rows but is not AS MATERIALIZED"
            assert f"FROM {jobs} AS j " in c.body, c.name

    eq = compiled.op("=")
    # the ready rows, per priority of the walk: a LATERAL range bounded by run_at, locking
    # what it takes; the outer LIMIT stops the walk once n rows are locked
    walk = the_cte(ctes, "pg_catalog.max(j.priority)")
    assert not walk.materialized and sql.startswith("WITH RECURSIVE ")
    assert walk.body.startswith("SELECT 2147483647 AS p, 0 AS d UNION ALL SELECT (SELECT pg_catalog.max(j.priority)")
    # past 32 levels, each probe looks for the next priority with a due row instead
    lt, le = compiled.op("<"), compiled.op("<=")
    assert f"({walk.name}.d{lt}32 OR j.run_at{le}(TABLE c))" in walk.body, walk.body
    assert f"j.state{eq}'pending'" in walk.body and f"j.priority{compiled.op('<')}{walk.name}.p" in walk.body
    assert walk.body.rstrip().endswith(f"WHERE {walk.name}.p IS NOT NULL"), walk.body[-80:]
    pend = the_cte(ctes, f"j.state{eq}'pending'", "FOR UPDATE SKIP LOCKED")
    assert pend.materialized and pend.body.startswith("SELECT x.id AS id"), pend.body[:80]
    assert f" FROM {walk.name}, LATERAL (SELECT j.id AS id, j.priority AS priority, j.run_at AS run_at " in pend.body
    assert re.search(
        rf"j\.priority{re.escape(eq)}{walk.name}\.p ORDER BY j\.run_at, j\.id LIMIT %\(n\)s(::INTEGER)? "
        r"FOR UPDATE SKIP LOCKED\) AS x LIMIT %\(n\)s(::INTEGER)?$",
        pend.body,
    ), pend.body
    assert f"j.run_at{compiled.op('<=')}" in pend.body
    recl = the_cte(ctes, f"j.state{eq}'processing'", f"j.attempts{compiled.op('<')}j.max_attempts")
    assert "FOR UPDATE SKIP LOCKED" in recl.body and recl.materialized and "LIMIT %(n)s" in recl.body
    assert recl.body.rstrip().endswith("FOR UPDATE SKIP LOCKED")
    exhausted = the_cte(ctes, f"j.state{eq}'processing'", f"j.attempts{compiled.op('>=')}j.max_attempts")
    assert "FOR UPDATE SKIP LOCKED" in exhausted.body and exhausted.materialized
    assert exhausted.body.rstrip().endswith("FOR UPDATE SKIP LOCKED")

    # exhausted reclaimables: DELETE ... RETURNING (the dead row, in the INSERT's column
    # order) feeds INSERT INTO dead, same statement
    gone = the_cte(ctes, f"DELETE FROM {jobs} AS g ")
    assert gone.body.startswith(f"DELETE FROM {jobs} AS g WHERE g.id{eq}ANY (SELECT {exhausted.name}.id")
    assert " RETURNING id, queue, " in gone.body and "'max attempts exceeded'" in gone.body
    buried = the_cte(ctes, f"INSERT INTO {dead} ")
    assert buried.body.rstrip().endswith(f"SELECT * FROM {gone.name}"), buried.body[-80:]

    # the fence: the UPDATE joins a MATERIALIZED, LIMITed pick, not an IN (... LIMIT) subquery
    picked = the_cte(ctes, f"FROM {pend.name}", f"FROM {recl.name}")
    assert picked.materialized, picked.name
    assert re.search(r"LIMIT %\(n\)s(::INTEGER)?$", picked.body), picked.body
    # a count written by hand as the column's largest counts no further (integer out of range)
    assert main.startswith(
        f"UPDATE {jobs} AS u SET state='processing', attempts=(least(u.attempts, 2147483646){compiled.op('+')}1)"
    )
    assert f" FROM {picked.name} WHERE u.id{eq}{picked.name}.id RETURNING " in main, main
    assert "LIMIT" not in main and "ANY (SELECT" not in main, "the UPDATE must join the fenced pick"
    # the statement's one clock reading: a CTE read by every use, written before them
    clock = the_cte(ctes, "pg_catalog.statement_timestamp()")
    assert [c.name for c in ctes].index(clock.name) == 0 and sql.count("statement_timestamp") == 1
    assert [c.name for c in ctes].index(buried.name) < [c.name for c in ctes].index(pend.name)


def test_pg_claim_of_turns_is_one_fenced_skip_locked_statement(pg_compiled: Compiled) -> None:
    """Queues taking turns: one statement, each queue's turn a LATERAL of the single claim's
    scans (locking with SKIP LOCKED, bounded by :n), under one MATERIALIZED pick bounded by
    the budget that the UPDATE joins."""
    compiled = pg_compiled
    sql = compiled.sql["claim:turns"]
    jobs = compiled.t("alkstore_jobs")
    assert ";" not in sql
    ctes, main = split_with(sql)
    assert sql.count("FOR UPDATE") == sql.count("FOR UPDATE SKIP LOCKED") == 3, (
        "the exhausted, pending and reclaim scans must each lock with SKIP LOCKED (and only they)"
    )
    assert [c.name for c in ctes] == ["c", "spent", "d", "buried", "pick"], [c.name for c in ctes]
    eq = compiled.op("=")
    spent, pick = ctes[1], ctes[4]
    assert spent.materialized and f"j.queue{eq}ANY (%(queues)s" in spent.body
    assert "alkstore_queue_settings AS s WHERE s.queue" in spent.body  # nothing of a queue with settings
    # the queues in order, each with the clock unless it has settings, then its turn
    assert pick.materialized and pick.body.startswith(
        "SELECT y.id AS id FROM pg_catalog.unnest(%(queues)s::pg_catalog.text[]) AS q(value) "
        "JOIN LATERAL (SELECT c.t AS t FROM c WHERE NOT (EXISTS (SELECT 1 FROM "
    ), pick.body[:200]
    assert re.search(r"\) AS y ON true LIMIT %\(budget\)s(::INTEGER)?$", pick.body), pick.body[-80:]
    assert re.search(r"LIMIT %\(n\)s(::INTEGER)? FOR UPDATE SKIP LOCKED\) AS x LIMIT %\(n\)s", pick.body)
    assert f"j.queue{eq}q.value" in pick.body and "qc.t" in pick.body
    # no scan of a turn reads the queues or the clock row again (each names them, one level up)
    assert pick.body.count("pg_catalog.unnest(") == 1 and pick.body.count("FROM c ") == 1
    assert main.startswith(f"UPDATE {jobs} AS u SET state='processing'")
    assert " FROM pick WHERE u.id" in main and "LIMIT" not in main
    # psycopg's 4 KiB parse cache (see the single claim): kept for schema names up to ~45 bytes
    if len(compiled.schema) <= 45:
        assert len(compiled.raw["claim:turns"]) <= 4096, len(compiled.raw["claim:turns"])


def test_the_error_history_is_appended_to_only_when_it_is_a_json_array(compiled: Compiled) -> None:
    """A stored history edited by hand into something else is kept as one "unreadable"
    entry before the append, in the statement: parsing it made the retry or fail fail
    (tests/conformance/test_tasks_worker.py runs it). PostgreSQL before 16 cannot ask
    whether text is JSON, so it casts only what matches a pattern of text jsonb accepts,
    written as an E'' literal (its meaning independent of standard_conforming_strings)."""
    for key in ("retry", "bury"):
        sql = compiled.raw[key]
        assert f"'{UNREADABLE_HISTORY}'" in sql, key
        if compiled.kind == "postgresql":
            guard = "OPERATOR(pg_catalog.~) E'" + JSON_ARRAY_PATTERN.replace("\\", "\\\\") + "'"
            assert guard in sql, key
            if len(compiled.schema) <= 45:  # psycopg's 4 KiB parse cache (the single claim)
                assert len(sql) <= 4096, (key, len(sql))
        else:
            assert "json_type(CASE WHEN (json_valid(" in norm(sql), key


def test_pg_moves_are_single_statements(pg_compiled: Compiled) -> None:
    """fail / retry-at-budget (bury) and sweep move rows with one DELETE ... RETURNING
    feeding one INSERT: atomic without a transaction, one round trip."""
    compiled = pg_compiled
    jobs, dead = compiled.t("alkstore_jobs"), compiled.t("alkstore_dead_jobs")

    bury = compiled.sql["bury"]
    assert ";" not in bury
    ctes, main = split_with(bury)
    eq = compiled.op("=")
    gone = the_cte(ctes, f"DELETE FROM {jobs} WHERE {jobs}.id{eq}%(id)s")
    assert f"{jobs}.state{eq}'processing'" in gone.body and " RETURNING " in gone.body
    assert main.startswith(f"INSERT INTO {dead} (")
    assert f"FROM {gone.name} RETURNING " in main and "%(last_error)s" in main

    sweep = compiled.sql["sweep"]
    assert ";" not in sweep
    ctes, main = split_with(sweep)
    gone = the_cte(ctes, f"DELETE FROM {jobs} WHERE {jobs}.queue{eq}%(queue)s")
    assert f"{jobs}.expires_at{compiled.op('<=')}" in gone.body and " RETURNING " in gone.body
    buried = the_cte(ctes, f"INSERT INTO {dead} ", f"FROM {gone.name}")
    assert "'expired'" in buried.body
    purged = the_cte(ctes, f"DELETE FROM {dead} ")
    assert f"{dead}.dead_letter_retention IS NOT NULL" in purged.body
    assert main.startswith("SELECT ") and buried.name in main and purged.name in main

    requeue = compiled.sql["requeue_dead:take"]
    assert requeue.startswith(f"DELETE FROM {dead} WHERE ") and " RETURNING " in requeue


def test_pg_time_is_one_statement_clock(pg_compiled: Compiled) -> None:
    """Every time reading is the passed clock or the statement's own timestamp."""
    compiled = pg_compiled
    for key, sql in compiled.sql.items():
        assert "now()" not in sql.lower().replace("statement_timestamp()", ""), key
        assert "clock_timestamp" not in sql and "CURRENT_TIMESTAMP" not in sql.upper(), key


@pytest.fixture(scope="module")
def every_pg_statement(_pg_module_target: Target) -> dict[str, str]:
    """Every statement the PostgreSQL backend compiles (all operations, not only the queue's)."""
    with _pg_module_target.store() as store:
        run_every_operation(store)
        return {k: norm(v) for k, v in store.backend._sql.items()}


# type names PostgreSQL's grammar maps to pg_catalog types itself (no search_path lookup)
# (FLOAT: asyncpg's bind cast of a double; the grammar makes it pg_catalog.float8)
KEYWORD_TYPES = {"INTEGER", "BIGINT", "SMALLINT", "VARCHAR", "DOUBLE PRECISION", "BOOLEAN", "FLOAT"}
SQL_SYNTAX_CALLS = {"coalesce", "greatest", "least", "CAST", "OPERATOR"}  # syntax: pg_catalog.least() does not exist


def _without_literals(sql: str) -> str:
    return re.sub(r"'(?:[^']|'')*'", "''", sql)


def test_pg_every_builtin_is_resolved_in_pg_catalog(every_pg_statement: dict[str, str]) -> None:
    """With ``search_path = attacker, pg_catalog``, an unqualified function, operator or
    non-keyword type name would resolve to the attacker's object: none may appear."""
    assert {"claim", "notify", "stream_publish", "lock_acquire", "schedule_upsert", "next_due"} <= set(every_pg_statement)
    for key, raw in every_pg_statement.items():
        sql = _without_literals(raw)
        for m in re.finditer(r'(?<![\w."])([A-Za-z_]\w*)\(', sql):
            before = sql[: m.start()]
            if m[1] in SQL_SYNTAX_CALLS or before.endswith(("AS ", "RECURSIVE ")):
                continue  # syntax, or a table alias / CTE with its column list
            if before.endswith(", ") and re.match(r"[\w, ]*\) AS (MATERIALIZED )?\(", sql[m.end() :]):
                continue  # a later CTE with its column list
            raise AssertionError(f"{key}: unqualified function {m[1]}(): ...{sql[m.start() - 40 : m.end() + 40]}...")
        for m in re.finditer(r" (<>|!=|<=|>=|=|<|>|\+|-|\*|/|\|\||~~|%%) ", sql):
            if m[1] == "=" and re.search(r'(?:\bSET |, )"?\w+"?$', sql[: m.start()]):
                continue  # ON CONFLICT ... DO UPDATE SET col = ...: an assignment
            if m[1] == "*" and sql[: m.start()].endswith("SELECT"):
                continue  # SELECT *: every column, not a multiplication
            raise AssertionError(f"{key}: bare operator {m[1]!r}: ...{sql[m.start() - 60 : m.end() + 40]}...")
        assert not re.search(r"\b(IN|LIKE|BETWEEN|IS DISTINCT FROM) \(", sql), f"{key}: an unqualifiable operator"
        types = re.findall(r"::([\w.]+(?: PRECISION)?)", sql)
        types += [t for t in re.findall(r" AS ([\w.]+(?: PRECISION)?)(?:\[\])?\)", sql) if t.upper() == t or "." in t]
        for t in types:
            assert t in KEYWORD_TYPES or t.startswith("pg_catalog."), f"{key}: type {t!r} resolves through search_path"


def test_pg_unique_enqueue_is_one_statement(pg_compiled: Compiled) -> None:
    """Either outcome in one round trip: the insert yields to the partial unique index on
    live rows; the wake fires only for a row it inserted; the holder's id otherwise."""
    sql = pg_compiled.sql["enqueue:unique"]
    jobs = pg_compiled.t("alkstore_jobs")
    assert ";" not in sql and sql.startswith(f"WITH ins AS (INSERT INTO {jobs} (")
    assert "ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING RETURNING" in sql
    ctes, main = split_with(sql)
    (wake,) = [c for c in ctes if "pg_notify" in c.body]
    assert wake.materialized and wake.body.rstrip().endswith("FROM ins"), "a duplicate must not wake"
    assert "UNION ALL" in main and "NOT (EXISTS (SELECT ins.id FROM ins))" in main


# -- SQLite ---------------------------------------------------------------------------------


def test_sqlite_unique_enqueue_yields_to_the_index(sqlite_compiled: Compiled) -> None:
    sql = sqlite_compiled.sql["enqueue:unique"]
    assert sql.startswith("INSERT INTO main.alkstore_jobs (")
    assert sql.endswith("ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING RETURNING id, 1 AS inserted")
    assert sqlite_compiled.sql["enqueue:held"].startswith("SELECT main.alkstore_jobs.id, 0 AS inserted FROM main.alkstore_jobs WHERE")



def test_sqlite_claim_is_update_returning_without_for_update(sqlite_compiled: Compiled) -> None:
    compiled = sqlite_compiled
    for key, sql in compiled.sql.items():
        assert "FOR UPDATE" not in sql and "SKIP LOCKED" not in sql, key
    jobs = compiled.t("alkstore_jobs")
    claim = compiled.sql["claim"]
    assert ";" not in claim
    # the walk of the queue's priorities (capped at 32 levels), then the UPDATE
    walk, update = re.fullmatch(r"(WITH RECURSIVE pr\(p, d\) AS \(.*?\)) (UPDATE .*)", claim).groups()
    assert f"SELECT max({jobs}.priority) AS p FROM {jobs} WHERE {jobs}.queue = :queue AND {jobs}.state = 'pending'" in walk
    assert walk.endswith("WHERE pr.p IS NOT NULL AND pr.d < 32)"), walk[-80:]
    assert update.startswith(f"UPDATE {jobs} SET state='processing', attempts=({jobs}.attempts + 1)")
    # only what the call does not already hold (queue, worker, clock, deadline, state are
    # filled in by SQLiteBackend._claim_steps)
    assert re.search(r" RETURNING id, payload, .*\btrace_context$", claim), claim[-200:]
    returned = claim.rsplit(" RETURNING ", 1)[1]
    for known in ("queue", "state", "worker_id", "claimed_at", "claim_expires_at"):
        assert not re.search(rf"\b{known}\b", returned), known
    assert f"WHERE {jobs}.id IN (SELECT " in claim
    assert claim.count("LIMIT :n") == 4  # the walked levels, the scan below them, reclaims, the pick
    assert f"{jobs}.priority IN (SELECT pr.p FROM pr)" in claim
    assert f"{jobs}.priority < (SELECT min(pr.p) AS min_1 FROM pr)" in claim
    assert f"{jobs}.attempts < {jobs}.max_attempts" in claim


def test_sqlite_moves_delete_exactly_what_they_inserted(sqlite_compiled: Compiled) -> None:
    """INSERT INTO dead SELECT ... WHERE P, then DELETE ... WHERE P in the same IMMEDIATE
    transaction: the two predicates must be the same text, or rows vanish or duplicate."""
    compiled = sqlite_compiled
    jobs, dead = compiled.t("alkstore_jobs"), compiled.t("alkstore_dead_jobs")
    for bury_key, drop_key, last_error in (
        ("claim:bury", "claim:drop", "'max attempts exceeded'"),
        ("sweep:bury", "sweep:drop", "'expired'"),
    ):
        bury, drop = compiled.sql[bury_key], compiled.sql[drop_key]
        assert bury.startswith(f"INSERT INTO {dead} (") and last_error in bury
        m = re.fullmatch(rf"DELETE FROM {re.escape(jobs)} WHERE (.+)", drop)
        assert m, drop
        assert f"WHERE {m.group(1)})" in bury, f"{bury_key} and {drop_key} select different rows"
    bury = compiled.sql["bury"]
    assert bury.startswith(f"INSERT INTO {dead} (") and ":last_error" in bury
    assert compiled.sql["bury:drop"] == f"DELETE FROM {jobs} WHERE {jobs}.id = :id"


def test_sqlite_claim_runs_in_begin_immediate(tmp_path, clock: FakeClock) -> None:
    """The write lock is taken up front: the claim's statements run between BEGIN
    IMMEDIATE and COMMIT on one connection (a deferred BEGIN could fail on lock upgrade)."""
    target = sqlite_target(str(tmp_path))
    trace: list[str] = []
    sa.event.listen(
        target.engine, "connect", lambda dbapi, _rec: dbapi.set_trace_callback(trace.append)
    )
    store = target.store(clock=clock)  # disposes the pool: every connection is traced
    try:
        q = store.queue("emails")
        q.enqueue("x")
        trace.clear()
        assert q.claim_one("w1") is not None
        stmts = [norm(s) for s in trace]
        assert stmts[0] == "BEGIN IMMEDIATE" and stmts[-1] == "COMMIT", stmts
        inner = stmts[1:-1]
        assert inner and re.match(r"(WITH RECURSIVE pr\(p, d\) AS \(.*\) )?UPDATE main\.alkstore_jobs SET state='processing'", inner[-1])
        assert not any(s.startswith(("BEGIN", "COMMIT", "ROLLBACK")) for s in inner), inner
    finally:
        store.close()
        target.engine.dispose()


# -- the caller's drivers (PostgreSQL): psycopg2 and asyncpg --------------------------------

CALLER_STATEMENTS = {"enqueue", "enqueue_many", "get_job:True", "notify", "stream_publish"}


def compile_for_callers(target: Target) -> dict[str, dict[str, str]]:
    """Run every transactional function through a psycopg2 and an asyncpg connection and
    return what the store compiled for each driver (the caller's-transaction statements
    are compiled per driver; the store's own stay psycopg 3)."""
    import asyncio
    from typing import Any

    from sqlalchemy.ext.asyncio import create_async_engine

    def calls(conn: sa.Connection, store: alk.Store) -> None:
        job = alk.enqueue(conn, QUEUE, PAYLOAD, priority=PRIORITY, delay=DELAY, expires=EXPIRES)
        alk.enqueue_many(conn, store.queue(QUEUE), [PAYLOAD], priority=PRIORITY)
        assert alk.enqueue(conn, QUEUE, PAYLOAD, unique_key=UNIQUE) == alk.enqueue(conn, QUEUE, {}, unique_key=UNIQUE)
        assert alk.get_job(conn, QUEUE, job) is not None
        alk.outbox_enqueue(conn, "outbox-sentinel", PAYLOAD)
        alk.publish(conn, "stream-sentinel", PAYLOAD)
        alk.notify(conn, "channel-sentinel", "payload-sentinel")
        conn.rollback()

    url = sa.make_url(target.url)
    store = target.store(clock=FakeClock(CLOCK_START))
    try:
        sync = sa.create_engine(url.set(drivername="postgresql+psycopg2"))
        store.register(sync)
        with sync.connect() as conn:
            calls(conn, store)
        psycopg2 = store.backend.for_dialect(sync.dialect)
        sync.dispose()

        async def on_asyncpg() -> object:
            engine = create_async_engine(url.set(drivername="postgresql+asyncpg"))
            store.register(engine)
            async with engine.connect() as conn:
                await conn.run_sync(calls, store)
            await engine.dispose()
            return store.backend.for_dialect(engine.dialect)

        asyncpg: Any = asyncio.run(on_asyncpg())
        assert store.backend.driver == "psycopg" and psycopg2.driver == "psycopg2" and asyncpg.driver == "asyncpg"
        return {"psycopg2": dict(psycopg2._sql), "asyncpg": dict(asyncpg._sql)}
    finally:
        store.close()


@pytest.fixture(params=["postgresql", "postgresql-quoted-schema"])
def caller_compiled(request: pytest.FixtureRequest) -> tuple[Target, dict[str, dict[str, str]]]:
    name = "_pg_module_target" if request.param == "postgresql" else "_quoted_pg_target"
    target = request.getfixturevalue(name)
    return target, compile_for_callers(target)


def test_caller_drivers_get_their_own_placeholders(caller_compiled: tuple[Target, dict[str, dict[str, str]]]) -> None:
    """asyncpg takes ``$n`` (and a ``%`` is plain text to it); psycopg2 ``%(name)s`` (with
    ``%`` doubled). Every table stays schema-qualified and no user value reaches the SQL."""
    target, by_driver = caller_compiled
    quoted = not re.fullmatch(r"[a-z_][a-z0-9_]*", target.schema)
    for driver, statements in by_driver.items():
        assert set(statements) >= CALLER_STATEMENTS, (driver, set(statements))
        percent = "%%" if driver == "psycopg2" else "%"
        prefix = ('"' + target.schema.replace("%", percent) + '".') if quoted else f"{target.schema}."
        for key, raw in statements.items():
            sql = norm(raw)
            # the store's check of a caller's database (database_identity) takes no parameter
            takes_params = key != "database_identity"
            if driver == "asyncpg":
                assert "%(" not in sql and (re.search(r"\$\d+", sql) or not takes_params), (driver, key)
            else:
                assert "$" not in sql and (re.search(r"%\(\w+\)s", sql) or not takes_params), (driver, key)
            for table in re.findall(r"(?<![\w.\"])(alkstore_\w+)", _without_literals(sql)):
                assert f"{prefix}{table}" in sql, (driver, key, table)
            for value in SENTINELS:
                assert value not in sql, (driver, key, value)
        # one INSERT; its conditional wake (docs/performance.md, "Wakes") rides in RETURNING:
        # the barrier held until commit, the presence tried, pg_notify only when someone waits
        enqueue = norm(statements["enqueue"])
        assert enqueue.startswith(f"INSERT INTO {prefix}alkstore_jobs (")
        assert "VALUES ('pending'," in enqueue and " RETURNING " in enqueue
        assert "pg_catalog.pg_notify(" in enqueue and " OPERATOR(pg_catalog.+) " in enqueue
        wake = enqueue[enqueue.index(" RETURNING "):]
        for fn in ("pg_try_advisory_xact_lock_shared(", "pg_try_advisory_lock(", "pg_advisory_unlock("):
            assert f"pg_catalog.{fn}" in wake, (driver, fn)
        assert wake.index("pg_try_advisory_xact_lock_shared(") < wake.index("pg_try_advisory_lock(")
        assert wake.index("pg_try_advisory_lock(") < wake.index("pg_catalog.pg_notify(")


def test_asyncpg_enqueue_passes_each_parameter_once_in_order(_pg_module_target: Target) -> None:
    """The positional form of the enqueue: ``$1..$n``, each number standing for one named
    parameter (``now``, used at every clock reading, is one ``$n``), typed by a cast."""
    statements = compile_for_callers(_pg_module_target)["asyncpg"]
    sql = norm(statements["enqueue"])
    numbers = sorted({int(n) for n in re.findall(r"\$(\d+)", sql)})
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(re.findall(r"\$8::FLOAT", sql)) >= 3  # the one clock reading, used at every time
    assert re.search(r"pg_catalog\.pg_notify\(\$\d+::VARCHAR, ''\)", sql)


def test_caller_drivers_resolve_every_builtin_in_pg_catalog(_pg_module_target: Target) -> None:
    """The pg_catalog qualification is a compiler mixin: psycopg2's and asyncpg's SQL gets it too."""
    for statements in compile_for_callers(_pg_module_target).values():
        test_pg_every_builtin_is_resolved_in_pg_catalog(
            {k: norm(v) for k, v in statements.items()} | {"claim": "", "lock_acquire": "", "schedule_upsert": "", "next_due": ""}
        )
