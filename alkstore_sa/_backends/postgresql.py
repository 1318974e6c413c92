"""PostgreSQL: SKIP LOCKED claims, and every live/dead move as ONE statement (data-modifying
CTEs), so each is atomic and one round trip on an autocommit connection. The store's own
connections are psycopg 3; a caller's connection may also be psycopg2 or asyncpg, whose SQL
is compiled with their own dialect (``driver_of``)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from ..errors import AlkstoreError, InvalidOptions
from ..schema import JOB_FIELDS, dead_jobs, jobs, queue_settings, stream_events
from .base import Backend
from .inspect_ops import seconds_until
from .pg_dialect import CATALOG_DIALECTS, driver_of_dialect
from .pg_wire import (
    PEER_SQL,
    WAKE_BARRIER_CLASS,
    WAKE_PRESENCE_CLASS,
    idle_alive_check,
    reaches_server_directly,
)
from .queue_ops import Turn, split_turns
from .sql import EXHAUSTED_SQL, EXPIRED_SQL, ONE, UNREADABLE_HISTORY_SQL, Executor, arg, bp

# The error history is text (the column's type on both engines): one edited by hand may be
# anything, and its jsonb cast raises on malformed text. PostgreSQL before 16 has no
# IS JSON or pg_input_is_valid() to ask first, so the history is cast only when it matches
# this pattern, which accepts only text the jsonb input takes: an array of scalars and of
# objects of scalars (every history alkstore writes). Strings escape only what jsonb's
# output escapes (no \u escape beyond ASCII, none of \u0000: an encoding or NUL error);
# numbers have at most 21 digits either side of the point and a 3-digit exponent (numeric
# overflows past 131072 and 16383 digits; any time a clock gives fits). Anything else
# (deeper nesting too) is kept as an "unreadable" entry. Wider bounded repeats
# ({0,200}) made the match ~15 times slower: each is a chain of states.
_WS = r"[ \t\n\r]*"
_STRING = r'"(?:[^"\\\u0001-\u001f]|\\["\\/bfnrt]|\\u00(?:0[1-9a-fA-F]|[1-7][0-9a-fA-F]))*"'
_NUMBER = r"-?(?:0|[1-9][0-9]{0,20})(?:\.[0-9]{1,21})?(?:[eE][-+]?[0-9]{1,3})?"
_SCALAR = rf"(?:{_STRING}|{_NUMBER}|true|false|null)"
# a member or item is followed by a comma and another, or by the closing bracket
_OBJECT = rf"\{{{_WS}(?:{_STRING}{_WS}:{_WS}{_SCALAR}{_WS}(?:,{_WS}(?!\}})|(?=\}})))*\}}"
JSON_ARRAY_PATTERN = rf"\A{_WS}\[{_WS}(?:(?:{_SCALAR}|{_OBJECT}){_WS}(?:,{_WS}(?!\])|(?=\])))*\]{_WS}\Z"
# an E'' literal: its backslashes mean the same whatever standard_conforming_strings says
_JSON_ARRAY_SQL: sa.ColumnClause[Any] = sa.literal_column("E'" + JSON_ARRAY_PATTERN.replace("\\", "\\\\") + "'")

# sqlstates: undefined_table, invalid_schema_name
_MISSING = {"42P01", "3F000"}
# sqlstate: undefined_column
_MISSING_COLUMN = "42703"
# sqlstates: admin_shutdown, crash_shutdown, cannot_connect_now
_GOING_AWAY = {"57P01", "57P02", "57P03"}


@functools.lru_cache(maxsize=4096)
def _hashed(prefix: str, schema: str, name: str) -> str:
    """A PostgreSQL channel identifier for any name: PostgreSQL truncates identifiers at 63
    bytes (two long names would collide) and names may hold any character. The schema is
    part of it so stores on different schemas of one database never wake each other."""
    digest = hashlib.sha256(f"{schema}\x00{name}".encode()).hexdigest()[:40]
    return prefix + digest


def _ordinal_unnest(param: str) -> Any:
    """``unnest(:param) WITH ORDINALITY AS anon(value, ord)`` over a text array parameter."""
    return (
        sa.func.unnest(bp(param, postgresql.ARRAY(sa.Text)))
        .table_valued("value", with_ordinality="ord")
        .render_derived()
    )


def _queue_names() -> sa.BindParameter[Any]:
    """``:queues``, the queue names of a call that reads several queues at once."""
    return bp("queues", postgresql.ARRAY(sa.Text))


def _each_queue() -> tuple[Any, sa.ColumnClause[Any]]:
    """``unnest(:queues) AS q(value)``, and its name column *named*, not referenced:
    SQLAlchemy correlates a subquery with the FROM list one level up only, so a reference
    from deeper would add the unnest to that subquery's own FROM (a cross join)."""
    q = sa.func.unnest(_queue_names()).table_valued("value").render_derived().alias("q")
    return q, sa.literal_column("q.value", sa.Text)


def _notify_wake() -> sa.ColumnElement[Any]:
    """``pg_notify`` of the ``:wake`` channel, as a boolean (one value per row)."""
    return sa.func.pg_notify(bp("wake", sa.Text), sa.literal_column("''")).is_(None)


def _wake_if_waiting() -> sa.ColumnElement[Any]:
    """The enqueue's wake, sent only while some consumer of the queue waits for one.

    A waiting consumer's listener session holds the SHARED presence lock of the queue's
    channel (``PgHub.advertise``). The enqueue tries the same lock EXCLUSIVE and gives it
    back at once: when it cannot take it, someone waits, and the wake goes out at commit.
    An enqueue that finds nobody waiting sends nothing, and its commit then does not take
    the database-wide lock a notifying commit holds through its flush — enqueues scale
    with concurrent commits. (Two enqueues trying in the same instant make one of them
    notify needlessly; harmless.)

    First, it takes the queue's barrier lock SHARED until it commits: a consumer that has
    just advertised claims once more only after it could take the barrier EXCLUSIVE, i.e.
    after every enqueue that looked before the presence was taken has committed. When the
    barrier is taken exclusive at this instant (a consumer is going idle right now), the
    enqueue notifies."""
    key = sa.func.hashtext(bp("wake", sa.Text))
    barrier: sa.ColumnClause[Any] = sa.literal_column(str(WAKE_BARRIER_CLASS))
    presence: sa.ColumnClause[Any] = sa.literal_column(str(WAKE_PRESENCE_CLASS))
    waiting = sa.case(
        (
            sa.func.pg_try_advisory_xact_lock_shared(barrier, key),
            sa.case(
                (sa.func.pg_try_advisory_lock(presence, key), ~sa.func.pg_advisory_unlock(presence, key)),
                else_=sa.true(),
            ),
        ),
        else_=sa.true(),
    )
    return sa.case((waiting, _notify_wake()))


def _turns_params(turns: Sequence[Mapping[str, Any]], budget: int) -> dict[str, Any]:
    """The parameters of the claim of turns: the turns' queues in order, and what every
    turn shares (one worker, one ``n``, one clock reading: ``queue._turn_params``)."""
    first = turns[0]
    return {
        "queues": [t["queue"] for t in turns], "n": first["n"], "budget": budget,
        "worker_id": first["worker_id"], "now": first["now"],
    }


def _materialized(select: sa.Select[Any] | sa.CompoundSelect, name: str) -> sa.CTE:
    # MATERIALIZED is the fence: without it PostgreSQL may inline the CTE and re-run a
    # LIMIT ... SKIP LOCKED subquery per outer row, handing out more than n rows.
    return select.cte(name).prefix_with("MATERIALIZED")


# What the store learns once per physical connection (one round trip): whether it reaches
# the server directly, the isolation level its autocommit statements would run at, and the
# digits its double results are sent with.
_facts: weakref.WeakKeyDictionary[Any, tuple[bool, str, str]] = weakref.WeakKeyDictionary()
_FACTS_SQL = (
    PEER_SQL + ", pg_catalog.current_setting('default_transaction_isolation'),"
    " pg_catalog.current_setting('extra_float_digits')"
)
# The level every statement of the store is written for: SKIP LOCKED claims, claim-fenced
# handle operations and ON CONFLICT upserts that re-check a row a concurrent transaction
# changed. Under REPEATABLE READ or SERIALIZABLE such a statement fails instead
# ("could not serialize access"): claims and acks of a busy queue would fail by the dozen.
_STORE_ISOLATION = "read committed"
_SET_ISOLATION = "SELECT pg_catalog.set_config('default_transaction_isolation', %(level)s, false)"
# Timestamps are epoch seconds in double columns, read as text: below 1, extra_float_digits
# rounds each to 15 + N significant digits (0, PostgreSQL 11's default, loses a reading's
# microseconds; -15 sends 1.8e9 as 2e+09). 1 sends the shortest exact text.
_STORE_FLOAT_DIGITS = 1
_SET_FLOAT_DIGITS = "SELECT pg_catalog.set_config('extra_float_digits', %(digits)s, false)"


def _connection_facts(dbapi_conn: Any) -> tuple[bool, str, str]:
    """(reaches the server directly, default_transaction_isolation, extra_float_digits) of
    this physical connection: one round trip, remembered. Directness is False whenever it
    cannot be shown; the settings are the session's (a role's or database's ``SET``, or the
    URL's ``options=-c ...``)."""
    known = _facts.get(dbapi_conn)
    if known is None:
        row = dbapi_conn.execute(_FACTS_SQL).fetchone()
        try:
            direct = reaches_server_directly(dbapi_conn.pgconn.socket, row[:5])
        except Exception:  # noqa: BLE001 - unproven means "not direct": the safe side
            direct = False
        known = _facts[dbapi_conn] = (direct, str(row[5]), str(row[6]))
    return known


def _float_digits(setting: str) -> int:
    """A session's extra_float_digits as a number (what the store wants when unreadable)."""
    try:
        return int(setting)
    except ValueError:
        return _STORE_FLOAT_DIGITS


def _reaches_server_directly(dbapi_conn: Any) -> bool:
    """Whether this connection reaches the server directly, no pooler or proxy in between
    (``pg_wire.reaches_server_directly``). One round trip per physical connection
    (remembered); False whenever it cannot be shown."""
    try:
        return _connection_facts(dbapi_conn)[0]
    except Exception:  # noqa: BLE001 - unproven means "not direct": the safe side
        return False


def _text_codecs(dbapi_conn: Any) -> list[str]:
    """The Python codecs of the client and the server encodings of a psycopg connection,
    those that cannot encode every character (UTF8 can)."""
    info = dbapi_conn.info
    codecs = [info.encoding, _server_codec(info.parameter_status("server_encoding") or "UTF8")]
    return [c for c in dict.fromkeys(codecs) if c is not None and c not in ("utf-8", "utf8")]


@functools.cache
def _server_codec(pg_name: str) -> str | None:
    """The Python codec of a PostgreSQL encoding; None for SQL_ASCII (it stores any byte)
    and for the two Python has no codec for (MULE_INTERNAL, EUC_TW: text goes as given)."""
    if pg_name == "SQL_ASCII":
        return None
    try:
        # the driver's own name map (PostgreSQL's WIN1252 is Python's cp1252)
        from psycopg._encodings import pg2pyenc

        return pg2pyenc(pg_name.encode())
    except Exception:  # noqa: BLE001 - no codec (or an older psycopg without the map)
        return None


@functools.cache
def _pipeline_supported() -> bool:
    """Whether psycopg's libpq has pipeline mode (libpq 14 or later; the binary wheels
    bring their own)."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


class PostgresBackend(Backend):
    name = "postgresql"
    default_driver = "psycopg"
    failure_aborts_transaction = True
    # a worker's acks ride with its next claim: pipelined, one round trip (ack_and_claim_turns)
    acks_ride_claims = True
    # attempts is a 32-bit integer: a count written by hand as its largest value made every
    # claim of the queue fail ("integer out of range" on attempts + 1). Such a job is at its
    # budget (max_attempts is no larger): a claim of it counts no further, and its claim
    # lapsing, or a retry, buries it. (SQLite's integers go to 2**63: no ceiling there.)
    attempts_ceiling = 2**31 - 1

    def compile_dialect(self) -> Dialect:
        # the driver's own, with every function, operator and type name resolved in
        # pg_catalog (a hostile search_path cannot substitute its own): see pg_dialect
        return CATALOG_DIALECTS[self.driver]()

    def driver_of(self, dialect: Dialect) -> str:
        driver = driver_of_dialect(dialect)
        if driver is None:
            raise InvalidOptions(
                f"alkstore_sa runs in your transaction on PostgreSQL through psycopg (3), psycopg2 "
                f"or asyncpg, not {dialect.driver!r}: use one of those in your engine's URL"
            )
        return driver

    def target_schema(self) -> str:
        return self.schema

    def now(self) -> sa.ColumnElement[float]:
        # statement_timestamp() is fixed for the whole statement: one clock reading per op.
        # (no CAST on the parameter: coalesce() types it from the double precision beside
        # it, and the claim's SQL must stay under psycopg's 4 KiB parse-cache limit)
        return sa.func.coalesce(
            bp("now", sa.Double),
            sa.func.date_part(sa.literal_column("'epoch'"), sa.func.statement_timestamp()),
        )

    def is_missing_table(self, exc: BaseException) -> bool:
        # psycopg (and SQLAlchemy's asyncpg adapter) name it sqlstate, psycopg2 pgcode
        return (getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)) in _MISSING

    def is_missing_column(self, exc: BaseException) -> bool:
        return (getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)) == _MISSING_COLUMN

    def append_error(self, errors: Any, attempts: Any) -> sa.ColumnElement[str]:
        entry = sa.func.jsonb_build_object(
            sa.literal_column("'attempt'"), attempts,
            sa.literal_column("'error'"), sa.cast(bp("error", sa.Text), sa.Text),
            sa.literal_column("'at'"), self.now(),
        )
        kept = sa.func.jsonb_build_array(
            sa.func.jsonb_build_object(
                sa.literal_column("'attempt'"), sa.null(),
                sa.literal_column("'error'"), UNREADABLE_HISTORY_SQL.op("||")(errors),
                sa.literal_column("'at'"), sa.null(),
            )
        )
        # the cast is evaluated only for a history matching the pattern (CASE evaluates in
        # order; a column reference is never folded at plan time)
        history = sa.case((errors.op("~")(_JSON_ARRAY_SQL), sa.cast(errors, postgresql.JSONB)), else_=kept)
        return sa.cast(history.op("||")(sa.func.jsonb_build_array(entry)), sa.Text)

    def prepare_connection(self, dbapi_conn: Any) -> Any:
        saved: tuple[Any, Any, str | None, str | None] = (
            dbapi_conn.autocommit, dbapi_conn.prepare_threshold, None, None
        )
        dbapi_conn.autocommit = True
        # The store's statements run at READ COMMITTED, whatever the session's default
        # (_STORE_ISOLATION says why), and read doubles with every digit (_STORE_FLOAT_DIGITS);
        # the application's own settings are put back on return. Only on a direct
        # connection: through a transaction-mode pooler a session setting would stay on a
        # server connection that other clients get next.
        try:
            direct, isolation, digits = _connection_facts(dbapi_conn)
        except Exception:  # noqa: BLE001 - a dead connection: the liveness check drops it
            direct, isolation, digits = False, _STORE_ISOLATION, str(_STORE_FLOAT_DIGITS)
        if isolation != _STORE_ISOLATION and direct:
            dbapi_conn.execute(_SET_ISOLATION, {"level": _STORE_ISOLATION})
            saved = (*saved[:2], isolation, None)
        if direct and _float_digits(digits) < _STORE_FLOAT_DIGITS:
            dbapi_conn.execute(_SET_FLOAT_DIGITS, {"digits": str(_STORE_FLOAT_DIGITS)})
            saved = (*saved[:3], digits)
        # Server-side prepared statements (psycopg prepares a statement after 5 runs) only
        # where the connection provably reaches the server directly. Behind a
        # transaction-mode pooler (PgBouncer) they are named per client and collide across
        # clients: a claim's parameters were seen bound to *another client's* statement.
        # Never preparing costs 2-3x on enqueue and claim (the claim's plan is what the
        # prepared statement saves; docs/connections.md), so a direct connection keeps the
        # engine's setting and anything unproven (a pooler, any proxy) gets the safe one.
        if saved[1] is not None and not _reaches_server_directly(dbapi_conn):
            dbapi_conn.prepare_threshold = None
        return saved

    def statement_runner(self, dbapi_conn: Any) -> Callable[[str, Mapping[str, Any]], Any]:
        # One cursor per connection, kept: a psycopg cursor looks up and caches the dumper
        # of each parameter's type, and a fresh one (``connection.execute``) starts with an
        # empty cache — about 25 µs of client CPU per 13-parameter enqueue. A psycopg
        # cursor receives each result whole, so a kept one holds no statement open.
        return dbapi_conn.cursor().execute  # type: ignore[no-any-return]

    def restore_connection(self, dbapi_conn: Any, saved: Any) -> None:
        autocommit, prepare_threshold, isolation, digits = saved
        if isolation is not None:
            dbapi_conn.execute(_SET_ISOLATION, {"level": isolation})
        if digits is not None:
            dbapi_conn.execute(_SET_FLOAT_DIGITS, {"digits": digits})
        dbapi_conn.autocommit, dbapi_conn.prepare_threshold = autocommit, prepare_threshold

    def is_disconnect(self, exc: BaseException, dbapi_conn: Any) -> bool:
        if getattr(dbapi_conn, "closed", False) or getattr(dbapi_conn, "broken", False):
            return True
        state = getattr(getattr(exc, "orig", None) or exc, "sqlstate", None) or ""
        # class 08: connection exceptions; 57P01-03: the server is shutting down or restarting
        return state.startswith("08") or state in _GOING_AWAY

    def storable_text(self, dbapi_conn: Any, text: str) -> str:
        # A non-UTF8 database (LATIN1) refuses a character its encoding lacks: psycopg, when
        # the client encoding is the database's (the default), or the server, when it is
        # UTF8 (UntranslatableCharacter). Either failed the retry or fail carrying a
        # handler's error, and the outcome was lost. SQL_ASCII stores any byte.
        if text.isascii():
            return text
        for codec in _text_codecs(dbapi_conn):
            text = text.encode(codec, "backslashreplace").decode(codec)
        return text

    def alive_check(self, dbapi_conn: Any) -> Callable[[], bool] | None:
        return idle_alive_check(dbapi_conn)

    def upsert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def channel_key(self, channel: str) -> str:
        return _hashed("alkc_", self.schema, channel)

    def wake_key(self, queue: str) -> str:
        return _hashed("alkq_", self.schema, queue)

    def stream_wake_key(self, stream: str) -> str:
        return _hashed("alks_", self.schema, stream)

    def schedule_fire_lock_wait(self, ex: Executor, params: Mapping[str, Any]) -> None:
        # SET LOCAL lock_timeout, as a function so the milliseconds are a parameter: it ends
        # with the fire's transaction (also under PgBouncer's transaction pooling)
        sql = self.sql(
            "schedule_fire_lock_wait",
            lambda: sa.select(
                sa.func.set_config(sa.literal_column("'lock_timeout'"), bp("ms", sa.Text), sa.true())
            ),
        )
        ex.rows(sql, params)

    def stream_publish(self, ex: Executor, params: Mapping[str, Any]) -> int:
        def build() -> sa.Executable:
            ctr = self._next_offset().cte("ctr")
            ins = sa.insert(stream_events).from_select(
                ["stream", "offset", "payload", "created_at"],
                sa.select(bp("stream", sa.Text), ctr.c.last_offset, bp("payload", sa.Text), self.now()),
            ).returning(stream_events.c.offset)
            return self._with_notify(ins, _notify_wake())

        rows = ex.rows(self.sql("stream_publish", build), {**params, "wake": self.stream_wake_key(params["stream"])})
        return int(rows[0][0])

    def database_identity(self, ex: Executor) -> tuple[Any, ...]:
        """Which database ``ex`` reaches: its name on a server instance, told apart from
        another server's by the instance's start time (the same through a pooler and on a
        direct connection; the privilege-free stand-in for the system identifier)."""
        sql = self.sql(
            "database_identity",
            lambda: sa.select(
                sa.func.current_database(),
                sa.func.date_part(sa.literal_column("'epoch'"), sa.func.pg_postmaster_start_time()),
            ),
        )
        name, started = ex.rows(sql, {})[0]
        return (str(name), float(started))

    def create_hub(self, engine: Any, listen_engine: Any = None, clock: Any = None) -> Any:
        from .pg_listener import PgHub

        return PgHub(engine, listen_engine)

    def notify(self, ex: Executor, params: Mapping[str, Any]) -> None:
        sql = self.sql(
            "notify",
            lambda: sa.select(sa.func.pg_notify(bp("channel", sa.Text), bp("payload", sa.Text))),
        )
        ex.rows(sql, {"channel": self.channel_key(params["channel"]), "payload": params["payload"]})

    def log_claims(self, ex: Executor, params: Mapping[str, Any]) -> None:
        # prune and record in one statement: one round trip less while the limited claim
        # holds its queue's settings lock
        def build() -> sa.Executable:
            return self._claims_log().add_cte(self._claims_prune().cte("pruned"))

        ex.rowcount(self.sql("claims_log", build), params)

    def queue_wake(self, ex: Executor, params: Mapping[str, Any]) -> None:
        # the queue's wake channel, as an enqueue sends it: delivered at commit
        sql = self.sql(
            "queue_wake",
            lambda: sa.select(sa.func.pg_notify(bp("wake", sa.Text), sa.literal_column("''"))),
        )
        ex.rows(sql, {"wake": self.wake_key(params["queue"])})

    def _with_wake(self, insert: Any) -> sa.Executable:
        # the wake in the enqueue's own statement (one round trip), sent only when a
        # consumer waits; delivered exactly when the enqueue commits. A one-row INSERT
        # carries it in RETURNING, evaluated once for its row (measured: ~4 µs of server
        # time, against ~20 µs for the CTE and join); INSERT ... SELECT once, in a CTE.
        if insert.select is None:
            return insert.returning(_wake_if_waiting().label("w"))  # type: ignore[no-any-return]
        return self._with_notify(insert, _wake_if_waiting())

    def _with_notify(self, insert: Any, wake_expr: sa.ColumnElement[Any]) -> sa.Executable:
        # PostgreSQL folds duplicate notifications within a transaction
        ins = insert.cte("ins")
        wake = _materialized(sa.select(wake_expr.label("w")), "wake")
        return sa.select(*ins.c).select_from(ins.join(wake, sa.true()))

    def _unique_insert(self, *, traced: bool = False) -> sa.Executable:
        # One round trip for either outcome: the insert; its wake only when it inserted (a
        # duplicate makes no new work, so nobody is woken); and when the key was held, the
        # holder's id as this statement's snapshot sees it (none when the holder committed
        # after that snapshot: enqueue_unique reads again with a fresh one).
        ins = super()._unique_insert(traced=traced).cte("ins")  # type: ignore[attr-defined]
        wake = _materialized(
            sa.select(_wake_if_waiting().label("w")).select_from(ins),
            "wake",
        )
        inserted = sa.select(ins.c.id, ins.c.inserted).select_from(ins.join(wake, sa.true()))
        holder = sa.select(jobs.c.id, sa.false().label("inserted")).where(
            jobs.c.queue == bp("queue", sa.Text),
            jobs.c.unique_key == bp("unique_key", sa.Text),
            ~sa.exists(sa.select(ins.c.id)),
        )
        return sa.union_all(inserted, holder)

    def insert_many(
        self,
        ex: Executor,
        params: Mapping[str, Any],
        payloads: list[str],
        contexts: list[str | None] | None = None,
    ) -> list[int]:
        def build() -> sa.Executable:
            src = _ordinal_unnest("payloads")
            return self._enqueue_many_from(src.c.value, src.c.ord)

        def build_traced() -> sa.Executable:
            # the contexts array beside the payloads, paired by position (an array subscript
            # is an operator that cannot be qualified; ROWS FROM cannot be either)
            src, ctx = _ordinal_unnest("payloads"), _ordinal_unnest("contexts")
            paired = src.join(ctx, src.c.ord == ctx.c.ord)
            return self._enqueue_many_from(src.c.value, src.c.ord, ctx.c.value, paired)

        if contexts is None:
            rows = ex.rows(self.sql("enqueue_many", build), {**params, "payloads": payloads})
        else:
            rows = ex.rows(
                self.sql("enqueue_many:traced", build_traced),
                {**params, "payloads": payloads, "contexts": contexts},
            )
        # one INSERT ... SELECT in ordinality order: sequence values follow the input order
        return sorted(r[0] for r in rows)

    def claim(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return ex.rows(self.sql("claim", lambda: self._claim_statement(guarded=True)), params)

    def claim_turns(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        # one atomic statement (autocommit) for all the turns
        return self._turns_in(ex, turns, budget)

    def _turns_in(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        if len(turns) == 1:
            return super()._turns_in(ex, turns, budget)
        rows = ex.rows(self.sql("claim:turns", self._claim_turns_statement), _turns_params(turns, budget))
        return split_turns(turns, budget, rows, lambda names: self._with_settings(ex, names))

    def next_due_many(self, ex: Executor, params: Mapping[str, Any]) -> dict[str, float | None]:
        # one statement: each queue's next_due as a LATERAL subquery (its name read from
        # the unnest one level up, as in the claim of turns)
        def build() -> sa.Executable:
            q, name = _each_queue()
            due = self._next_due_select(name, nesting=True).lateral("nd")
            return sa.select(q.c.value, due.c.r, due.c.l, due.c.t).select_from(q.join(due, sa.true()))

        rows = ex.rows(self.sql("next_due:many", build), params)
        return {queue: seconds_until(run, lapse, now) for queue, run, lapse, now in rows}

    def _with_settings_sql(self) -> str:
        return self.sql(
            "settings_of",
            lambda: sa.select(queue_settings.c.queue).where(
                queue_settings.c.queue == sa.any_(_queue_names())
            ),
        )

    def _with_settings(self, ex: Executor, names: list[str]) -> set[str]:
        """Which of the queues ``names`` have a settings row (one statement for them all)."""
        return {r[0] for r in ex.rows(self._with_settings_sql(), {"queues": names})}

    def claim_unguarded(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return ex.rows(self.sql("claim:limited", lambda: self._claim_statement(guarded=False)), params)

    def _claim_statement(self, *, guarded: bool) -> sa.Executable:
        """The claim; ``guarded``: it claims (and buries) nothing when the queue has a
        settings row — such a queue is claimed by ``claim_limited`` under its settings lock."""
        # The scans read an alias, and the statement's one clock reading is written
        # once (a CTE every use reads): psycopg caches its parse of a query only up
        # to 4 KiB, and schema-qualified column names and the pg_catalog-qualified
        # clock expression at every use would push the claim past that.
        j = jobs.alias("j")
        clock_q = sa.select(self.now().label("t"))
        if guarded:
            # A queue with settings gets no clock reading: every comparison with a NULL
            # "now" is false, so each scan returns at once and nothing is claimed. One
            # primary-key probe of a table holding only the queues that have settings.
            s = queue_settings.alias("s")
            clock_q = clock_q.where(~sa.select(ONE).where(s.c.queue == arg("queue")).exists())
        clock = clock_q.cte("c")
        # each use reads it as ``(TABLE c)``: the shortest scalar subquery there is
        now = sa.literal_column(f"(TABLE {clock.name})", sa.Double)
        # 1. exhausted reclaimables move to dead in the same statement as the claim
        buried = self._burial(j, now, self._exhausted(j, now))
        # 2. each candidate scan locks what it takes and skips what others hold: the ready
        # rows (the priority walk) and the lapsed claims, the first n of each in claim order
        _, lapsed = self._claimable(j, now)
        pend = _materialized(self._walk(j, now), "pend")
        recl = _materialized(lapsed.limit(arg("n")).with_for_update(skip_locked=True), "recl")
        both = sa.union_all(sa.select(pend), sa.select(recl))
        cand = both.selected_columns
        picked = _materialized(
            both.order_by(cand.priority.desc(), cand.run_at, cand.id).limit(arg("n")), "pick"
        )
        return self._hand_out(picked, now, clock, buried)

    def _claim_turns_statement(self) -> sa.Executable:
        """Queues taking turns, claimed in one statement: each queue of ``:queues`` in
        order takes up to ``:n`` jobs (the single claim's candidates, in its order) until
        ``:budget`` are taken in all — what a claim per queue, each with ``:n`` at most what
        is left, would take, in one round trip. A queue with settings takes nothing (it is
        claimed by ``claim_limited``), and neither is anything of it buried."""
        j = jobs.alias("j")
        clock = sa.select(self.now().label("t")).cte("c")
        now = sa.literal_column(f"(TABLE {clock.name})", sa.Double)
        s = queue_settings.alias("s")
        # 1. the exhausted reclaimables of every listed queue without settings
        buried = self._burial(
            j, now,
            sa.and_(
                self._exhausted(j, now, j.c.queue == sa.any_(_queue_names())),
                ~sa.select(ONE).where(s.c.queue == j.c.queue).exists(),
            ),
        )
        # 2. the queues in turn order (a function scan, read in order by the nested loop
        # each LATERAL below makes), each with the clock reading — none when it has
        # settings, so it is skipped — and its turn: the single claim's two candidate
        # scans (the priority walk written inside it), the first :n in claim order. The
        # outer LIMIT stops the turns, and their locking, once :budget rows are taken.
        q, qv = _each_queue()
        qc = sa.select(clock.c.t).where(~sa.select(ONE).where(s.c.queue == qv).exists()).lateral("qc")
        qnow = sa.literal_column("qc.t", sa.Double)
        pend = self._walk(j, qnow, qv).subquery("pe")
        _, lapsed = self._claimable(j, qnow, qv)
        recl = lapsed.limit(arg("n")).with_for_update(skip_locked=True).subquery("re")
        both = sa.union_all(sa.select(pend), sa.select(recl))
        cand = both.selected_columns
        turn = both.order_by(cand.priority.desc(), cand.run_at, cand.id).limit(arg("n")).lateral("y")
        picked = _materialized(
            sa.select(turn.c.id)
            .select_from(q.join(qc, sa.true()).join(turn, sa.true()))
            .limit(arg("budget")),
            "pick",
        )
        return self._hand_out(picked, now, clock, buried)

    def _walk(self, j: Any, now: Any, queue: Any = None) -> sa.Select[Any]:
        """The claim's pending candidates: up to ``:n`` ready rows in claim order, locked
        (skipping what others hold). For each priority of the walk (highest first) an index
        range bounded by ``run_at <= now`` (LATERAL), so delayed rows of higher priorities
        are never stepped over; the outer LIMIT stops the walk, and the locking, once ``:n``
        rows are locked. ``queue``: the queue's name as an expression (the walk is then
        written inside the select, where that name is in scope)."""
        pr = self._priorities(j, now=now, queue=queue, nesting=queue is not None)
        ready = (
            sa.select(j.c.id, j.c.priority, j.c.run_at)
            .where(*self._ready(j, now, queue), j.c.priority == pr.c.p)
            .order_by(j.c.run_at, j.c.id)
            .limit(arg("n"))
            .with_for_update(skip_locked=True)
            .lateral("x")
        )
        return sa.select(ready).select_from(pr, ready).limit(arg("n"))

    def _burial(self, j: Any, now: Any, exhausted: sa.ColumnElement[bool]) -> sa.CTE:
        """The claim's first step: the ``exhausted`` rows (locked, skipping what others
        hold) deleted and inserted into dead storage."""
        spent = _materialized(sa.select(j.c.id).where(exhausted).with_for_update(skip_locked=True), "spent")
        g: Any = jobs.alias("g")  # an Alias at run time; typed as a NamedFromClause
        # a one-letter CTE name: the burial reads every job column through it (4 KiB, above)
        gone = (
            sa.delete(g)
            .where(g.c.id.in_(sa.select(spent.c.id)))
            .returning(*[sa.literal_column(c) for c in self.DEAD_INSERT_COLUMNS[:-2]], EXHAUSTED_SQL, now)
            .cte("d")
        )
        # the DELETE returns each dead row in the INSERT's column order (its columns
        # unqualified: the DELETE reads no other table), so the INSERT takes SELECT * (4 KiB)
        return sa.insert(dead_jobs).from_select(
            self.DEAD_INSERT_COLUMNS, sa.select(sa.literal_column("*")).select_from(gone)
        ).cte("buried")

    def _hand_out(self, picked: sa.CTE, now: Any, clock: sa.CTE, buried: sa.CTE) -> sa.Executable:
        """The claim's last step: the picked rows become this worker's, returned whole."""
        u: Any = jobs.alias("u")
        return (
            sa.update(u)
            .where(u.c.id == picked.c.id)
            .values(self._claim_values(u, now))
            .returning(*[u.c[f] for f in JOB_FIELDS], u.c.state)
            .add_cte(clock, buried)
        )

    def bury(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        def build() -> sa.Executable:
            gone = (
                sa.delete(jobs)
                .where(self.this_claim())
                .returning(*[jobs.c[f] for f in JOB_FIELDS])
                .cte("gone")
            )
            return (
                sa.insert(dead_jobs)
                .from_select(
                    self.DEAD_INSERT_COLUMNS,
                    sa.select(
                        *self.dead_values(gone, bp("last_error", sa.Text), self.errors_after(gone))
                    ),
                )
                .returning(dead_jobs.c.id)
            )

        return len(ex.rows(self.sql("bury", build), params)) == 1

    def ack_batch(self, ex: Executor, params: Mapping[str, Any]) -> int:
        sql = self.sql(
            "ack_batch",
            lambda: self._ack_batch(jobs.c.id == sa.any_(bp("ids", postgresql.ARRAY(sa.BigInteger)))),
        )
        return ex.rowcount(sql, params)

    def ack_and_claim_turns(
        self, ex: Executor, acks: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], budget: int
    ) -> tuple[list[tuple[int, int]], list[Turn]]:
        # BEGIN, the acks, the claim and COMMIT sent together in psycopg's pipeline mode,
        # the rows read after it: one round trip and one commit, where separate statements
        # take two of each. Queues taking turns are one statement too.
        driver_connection = getattr(ex, "driver_connection", None)
        if driver_connection is None or not _pipeline_supported():
            return super().ack_and_claim_turns(ex, acks, turns, budget)
        if len(turns) == 1:
            claim_sql = self.sql("claim", lambda: self._claim_statement(guarded=True))
            params = {**turns[0], "n": min(turns[0]["n"], budget)}
        else:
            claim_sql = self.sql("claim:turns", self._claim_turns_statement)
            params = _turns_params(turns, budget)
        conn = driver_connection()
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                acked = conn.execute(self._ack_claims_sql(acks), acks)
                claimed = conn.execute(claim_sql, params)
                # queues taking turns: which of them have settings, for the turns that come
                # back empty (some usually do), read in the same round trip. One queue's
                # claim comes back empty rarely while draining: asked afterwards then.
                limited = None
                if len(turns) > 1:
                    limited = conn.execute(self._with_settings_sql(), {"queues": params["queues"]})
                conn.execute("COMMIT")
            landed = [(r[0], r[1]) for r in acked.fetchall()]
            rows = claimed.fetchall()
            read = None if limited is None else {r[0] for r in limited.fetchall()}
        except AlkstoreError:
            self.rollback_quietly(conn)
            raise
        except Exception as exc:
            self.rollback_quietly(conn)
            raise self.translate_error(exc) from exc
        with_settings = (lambda names: self._with_settings(ex, names)) if read is None else read.intersection
        return landed, split_turns(turns, budget, rows, with_settings)

    def rollback_quietly(self, dbapi_conn: Any) -> None:
        """End the transaction a failed pipeline left open (aborted), if the connection is
        still there; the pipeline's own error is the one worth raising. psycopg's
        ``rollback()``, not a ROLLBACK statement: it also forgets the connection's prepared
        statements (and deallocates them), and a statement psycopg began preparing inside
        the aborted pipeline was never prepared by the server."""
        with contextlib.suppress(Exception):  # a dead connection: the lease drops it
            dbapi_conn.rollback()

    def ack_claims(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[int, int]]:
        return [(r[0], r[1]) for r in ex.rows(self._ack_claims_sql(params), params)]

    def _ack_claims_sql(self, params: Mapping[str, Any]) -> str:
        by_queue = params["queue"] is not None

        def build() -> sa.Executable:
            # two set-returning calls in one select list run in lockstep: the (id, attempts)
            # pairs (the multi-argument unnest() in FROM is syntax that cannot be written
            # schema-qualified)
            pairs = sa.select(
                sa.func.unnest(bp("ids", postgresql.ARRAY(sa.BigInteger))),
                sa.func.unnest(bp("attempts", postgresql.ARRAY(sa.Integer))),
            )
            return (
                self._ack_batch(sa.tuple_(jobs.c.id, jobs.c.attempts).in_(pairs), by_queue=by_queue)
                .returning(jobs.c.id, jobs.c.attempts)
            )

        return self.sql("ack_claims" if by_queue else "ack_claims:any", build)

    def sweep(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, int]:
        def build() -> sa.Executable:
            # the expired rows locked in id order first, as a batched ack locks its rows:
            # deleted in the expiry index's order, a sweep and a worker's ack of the same
            # jobs could each hold a row the other waits for (deadlock detected)
            locked = _materialized(
                sa.select(jobs.c.id).where(self._expired()).order_by(jobs.c.id).with_for_update(), "locked"
            )
            gone = (
                sa.delete(jobs)
                .where(self._expired(), jobs.c.id.in_(sa.select(locked.c.id)))
                .returning(*[jobs.c[f] for f in JOB_FIELDS])
                .cte("gone")
            )
            buried = (
                sa.insert(dead_jobs)
                .from_select(self.DEAD_INSERT_COLUMNS, sa.select(*self.dead_values(gone, EXPIRED_SQL)))
                .returning(dead_jobs.c.id)
                .cte("buried")
            )
            purged = sa.delete(dead_jobs).where(self._purgeable()).returning(dead_jobs.c.id).cte("purged")
            return sa.select(
                sa.select(sa.func.count()).select_from(buried).scalar_subquery(),
                sa.select(sa.func.count()).select_from(purged).scalar_subquery(),
            )

        expired, purged = ex.rows(self.sql("sweep", build), params)[0]
        return expired, purged
