"""SQLite: the library's write transactions begin IMMEDIATE (taking the single writer lock
up front, so a read-then-write can never fail on a lock upgrade); a claim is one
writer-serialized ``UPDATE ... RETURNING``; moves are INSERT + DELETE in that transaction."""

from __future__ import annotations

import json
import operator
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles

from .. import _sqlite
from .._validate import MAX_DURATION, MIN_LEASE, claim_lease
from ..schema import (
    JOB_FIELDS,
    dead_jobs,
    jobs,
    notifications,
    queue_settings,
    stream_events,
    stream_offsets,
    streams,
)
from .base import Backend
from .queue_ops import Turn, claim_in_turn
from .sql import (
    ARRAY_SQL,
    EXHAUSTED_SQL,
    EXPIRED_SQL,
    NOTIFY_READERS_SQL,
    ONE,
    PROCESSING,
    UNREADABLE_HISTORY_SQL,
    ZERO,
    Executor,
    bp,
)

T = TypeVar("T")

# printf() format of a REAL written into JSON as the same double (json_object writes 15
# significant digits; 17 always read back exactly)
EXACT_REAL = "%!.17g"


class _NoIndex(sa.sql.expression.ColumnElement[Any]):
    """``+column``: SQLite's documented way to keep the planner from using an index on a
    column (unary plus is a no-op on any value)."""

    inherit_cache = True

    def __init__(self, column: sa.ColumnElement[Any]) -> None:
        self.column = column
        self.type = column.type


@compiles(_NoIndex, "sqlite")
def _render_no_index(element: _NoIndex, compiler: Any, **kw: Any) -> str:
    return "+" + compiler.process(element.column, **kw)


# A claim reads back only the columns whose values the call does not already hold: the
# queue, the worker, the clock reading and the deadline it sets (``now`` +
# visibility_timeout, the same double addition in Python), and the state are filled in
# (claim rows cost SQLite and the driver per column: about a tenth of a batch claim).
_CLAIM_SET = ("queue", "claimed_at", "claim_expires_at", "worker_id")
_CLAIM_READ = [f for f in JOB_FIELDS if f not in _CLAIM_SET]
if (JOB_FIELDS[1], *JOB_FIELDS[11:14]) != _CLAIM_SET or _CLAIM_READ[5] != "visibility_timeout":
    raise ImportError("alkstore_sa: the SQLite claim's row layout no longer matches JOB_FIELDS")
_PROCESSING_STATE = "processing"

# The notification channel of queue wakes that come without a new job (a resume, a raised
# limit): its payload is the queue's name. Reserved: user channel names cannot start so.
QUEUE_WAKE_CHANNEL = "__alkstore_queue_wake"
NOTIFY_KEEP = 1024  # the newest rows, kept whoever has read them
NOTIFY_PRUNE_EVERY = 64
# Each process's watcher, while it has subscriptions, records how far it has read as a
# consumer of this reserved stream name (alkstore_stream_offsets): notify's prune keeps
# every row past the slowest live reader, so a listener that fell behind (a stopped or
# busy process) loses nothing. A reader not heard from for NOTIFY_READER_TTL seconds is
# gone (killed): its row holds nothing back and the prune removes it.
NOTIFY_READER_TTL = 60.0


# A TEXT value as the store reads it. SQLite keeps whatever bytes a hand-written UPDATE
# puts in a TEXT column; sqlite3's own decoding fails the whole statement on one value that
# is not UTF-8 (a claim would lose its batch, and fail again at every try). Such bytes read
# as ``\\xNN`` instead: a payload holding them is never valid JSON (JSON has no ``\\x``
# escape), so it is failed and shown as any stored payload that is not JSON. (A
# methodcaller, not a function: it runs for every text value read, with no Python frame.)
_lenient_text: Callable[[bytes], str] = operator.methodcaller("decode", "utf-8", "backslashreplace")


_PLAIN = (int, float)  # a stamp's types read back as they are (not bool, not text)


class _ShortAck(Exception):
    """Internal: a batch ack's count came back short (some claim did not hold); its
    transaction is rolled back and the batch deleted again, returning what landed."""


class SQLiteBackend(Backend):
    name = "sqlite"
    default_driver = "sqlite3"
    materialize_unswept = True  # see GaugeOps: else a row read per pending job
    # SQLite's integers go to 2**63 (and a REAL past them): a priority written by hand above
    # int32 was counted ready and never claimed, the walk starting below it. 9e999 is
    # infinity, above every number (text, which sorts above numbers, stays unclaimed).
    top_priority = sa.literal_column("9e999")
    # a worker's acks ride in its next claim's transaction: one writer-lock hold and one
    # WAL commit per batch instead of two (docs/worker.md, "Acks are written in batches")
    acks_ride_claims = True

    def compile_dialect(self) -> Dialect:
        return sqlite.pysqlite.dialect(paramstyle="named")

    def driver_of(self, dialect: Dialect) -> str:
        # pysqlite and aiosqlite both reach sqlite3, which takes named parameters with a
        # dict whatever paramstyle SQLAlchemy's dialect compiles its own statements with
        return "sqlite3"

    def target_schema(self) -> str:
        return "main"  # the caller's own database file: jobs commit with the caller's rows

    def limit(self, stmt: sa.Select[Any], key: str) -> sa.Select[Any]:
        # SQLAlchemy pairs a bound SQLite LIMIT with an anonymous OFFSET parameter; an
        # inline OFFSET 0 keeps every parameter named (the executor passes only those).
        return stmt.limit(bp(key, sa.Integer)).offset(ZERO)

    def now(self) -> sa.ColumnElement[float]:
        # SQLite runs in this process, so the database clock is this host's clock: the store
        # always passes one reading (time.time() or the injected clock) per operation.
        return bp("now", sa.Double)

    def is_missing_table(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)

    def is_missing_column(self, exc: BaseException) -> bool:
        # a read names it "no such column: t.c", an INSERT "table t has no column named c"
        return isinstance(exc, sqlite3.OperationalError) and (
            "no such column" in str(exc) or "has no column named" in str(exc)
        )

    def translate_error_on(self, exc: BaseException, dbapi_conn: Any) -> BaseException:
        _sqlite.note_busy_timeout(getattr(exc, "orig", None) or exc, dbapi_conn)
        return self.translate_error(exc)

    def translate_error(self, exc: BaseException) -> BaseException:
        """As the base does; a ``database is locked`` that waited out the busy timeout
        (SQLITE_BUSY, not the immediate failure of a stale snapshot's lock upgrade) also
        says who may hold SQLite's one write lock — most often, in an application, a
        transaction of its own on the same thread, which cannot commit before this call
        returns."""
        err = super().translate_error(exc)
        orig = getattr(err, "orig", None)
        if isinstance(orig, sqlite3.OperationalError) and getattr(orig, "sqlite_errorcode", None) == _sqlite.SQLITE_BUSY:
            err.args = (
                f"{err.args[0]} (another connection held the database's one write lock past the "
                f"busy timeout, {_sqlite.waited_ms(orig) / 1000:g} s: a long transaction in another "
                "process — or one of your own still open on this thread, which cannot commit "
                "before this call returns: inside your transaction, write with "
                "alk.enqueue(session, ...) and the other forms that take it)",
            )
        return err

    def append_error(self, errors: Any, attempts: Any) -> sa.ColumnElement[str]:
        entry = sa.func.json_object(
            sa.literal_column("'attempt'"), attempts,
            sa.literal_column("'error'"), bp("error", sa.Text),
            # the reading itself: json_object writes a REAL with 15 significant digits (10 µs
            # at today's epoch), so the entry's "at" missed the operation's other timestamps
            # (died_at, run_at) and PostgreSQL's; 17 digits read back as the same double
            sa.literal_column("'at'"), sa.func.json(sa.func.printf(sa.literal_column(f"'{EXACT_REAL}'"), self.now())),
        )
        # json_type is asked only of valid JSON (it raises on malformed text; a CASE is
        # evaluated in order); json_insert at '$[#]' leaves an object or scalar unchanged
        is_array = sa.func.json_type(sa.case((sa.func.json_valid(errors) == ONE, errors))) == ARRAY_SQL
        kept = sa.func.json_array(
            sa.func.json_object(
                sa.literal_column("'attempt'"), sa.null(),
                sa.literal_column("'error'"), UNREADABLE_HISTORY_SQL.op("||")(errors),
                sa.literal_column("'at'"), sa.null(),
            )
        )
        history = sa.case((is_array, errors), else_=kept)
        return sa.func.json_insert(history, sa.literal_column("'$[#]'"), entry)

    def prepare_connection(self, dbapi_conn: Any) -> Any:
        # the write lock is waited for by the store (_sqlite.wait_for_lock), not by
        # SQLite's busy handler, which lets a process that writes in a loop starve the others
        pep249 = _sqlite.leave_pep249_mode(dbapi_conn)  # Python 3.12's autocommit=False ignores isolation_level
        saved = dbapi_conn.isolation_level, dbapi_conn.text_factory, _sqlite.wait_here(dbapi_conn), pep249
        dbapi_conn.isolation_level = None  # autocommit: the store issues BEGIN IMMEDIATE itself
        dbapi_conn.text_factory = _lenient_text
        return saved

    def restore_connection(self, dbapi_conn: Any, saved: Any) -> None:
        dbapi_conn.isolation_level, dbapi_conn.text_factory, timeout, pep249 = saved
        if timeout is not None:
            _sqlite.wait_there(dbapi_conn, timeout)
        _sqlite.enter_pep249_mode(dbapi_conn, pep249)

    def begin(self, dbapi_conn: Any, saved: Any = None) -> None:
        try:
            dbapi_conn.execute(self.BEGIN)
        except sqlite3.OperationalError as exc:
            if not self.waits_for_lock(exc, saved):
                raise
            self.wait_for_lock(dbapi_conn, lambda: dbapi_conn.execute(self.BEGIN), exc, saved)

    def waits_for_lock(self, exc: BaseException, saved: Any) -> bool:
        return saved is not None and _sqlite.waits_here(exc, saved[2])

    def wait_for_lock(self, dbapi_conn: Any, attempt: Callable[[], T], busy: BaseException, saved: Any) -> T:
        return _sqlite.wait_for_lock(dbapi_conn, attempt, busy, saved[2])

    def is_disconnect(self, exc: BaseException, dbapi_conn: Any) -> bool:
        # a file database cannot be cut off; only a closed connection is gone
        orig = getattr(exc, "orig", None) or exc
        return isinstance(orig, sqlite3.ProgrammingError) and "closed" in str(orig)

    # IMMEDIATE takes the writer lock up front (waiting under the busy timeout), so a
    # transaction that reads before it writes can never fail on a lock upgrade.
    BEGIN = "BEGIN IMMEDIATE"

    def rollback(self, dbapi_conn: Any) -> None:
        # a trigger's RAISE(ROLLBACK) or a failed COMMIT may already have ended it; a second
        # error here must not mask the first
        if dbapi_conn.in_transaction:
            dbapi_conn.execute("ROLLBACK")

    def upsert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def channel_key(self, channel: str) -> str:
        return channel  # a row value in the notifications table

    def wake_key(self, queue: str) -> str:
        return queue  # the watcher sees committed jobs by queue name

    def stream_wake_key(self, stream: str) -> str:
        return stream  # the watcher sees each stream's counter move

    def stream_publish(self, ex: Executor, params: Mapping[str, Any]) -> int:
        counter = self.sql("stream_publish:offset", self._next_offset)
        insert = self.sql(
            "stream_publish",
            lambda: sa.insert(stream_events).values(
                stream=bp("stream", sa.Text),
                offset=bp("offset", sa.BigInteger),
                payload=bp("payload", sa.Text),
                created_at=self.now(),
            ),
        )
        with ex.transaction():
            offset = int(ex.rows(counter, params)[0][0])
            ex.rowcount(insert, {**params, "offset": offset})
        return offset

    def database_identity(self, ex: Executor) -> tuple[Any, ...]:
        """Which database ``ex`` reaches: the file of its ``main`` database, resolved."""
        sql = self.sql(
            "database_identity",
            lambda: sa.select(sa.column("file"))
            .select_from(sa.table("pragma_database_list"))
            .where(sa.column("name") == sa.literal_column("'main'")),
        )
        rows = ex.rows(sql, {})
        path = rows[0][0] if rows else ""
        return (os.path.realpath(path) if path else "",)

    def create_hub(self, engine: Any, listen_engine: Any = None, clock: Any = None) -> Any:
        from .sqlite_watcher import SqliteHub

        return SqliteHub(engine, self, clock)

    def notify(self, ex: Executor, params: Mapping[str, Any]) -> None:
        insert = self.sql(
            "notify",
            lambda: sa.insert(notifications)
            .values(
                channel=bp("channel", sa.Text),
                payload=bp("payload", sa.Text),
                created_at=self.now(),
            )
            .returning(notifications.c.id),
        )
        note_id = ex.rows(insert, params)[0][0]
        if note_id % NOTIFY_PRUNE_EVERY == 0:
            # the engine caps the table itself: the newest NOTIFY_KEEP rows and whatever a
            # live reader has not read yet are kept; gone readers' places go with them
            prune = self.sql("notify:prune", self._notify_prune)
            forget = self.sql("notify:forget_readers", self._notify_forget_readers)
            ex.rowcount(forget, {"now": params["now"]})
            ex.rowcount(prune, {"id": note_id})

    def _notify_prune(self) -> sa.Executable:
        readers = stream_offsets.c
        slowest = (
            sa.select(sa.func.min(readers.offset))
            .where(readers.stream == NOTIFY_READERS_SQL)
            .scalar_subquery()
        )
        note_id = bp("id", sa.Integer)
        return sa.delete(notifications).where(
            notifications.c.id <= note_id - sa.literal_column(str(NOTIFY_KEEP)),
            notifications.c.id <= sa.func.coalesce(slowest, note_id),
        )

    def _notify_forget_readers(self) -> sa.Executable:
        readers = stream_offsets.c
        return sa.delete(stream_offsets).where(
            readers.stream == NOTIFY_READERS_SQL,
            readers.updated_at < self.now() - sa.literal_column(repr(NOTIFY_READER_TTL)),
        )

    def stream_offsets_of(self, ex: Executor, params: Mapping[str, Any]) -> dict[str, Any]:
        """Last offset of each stream named in ``:names`` (a JSON array): the watcher's change
        detection, for the streams it has subscribers of (an application may have a stream
        per tenant: reading every counter at each look would cost a look that much). Each
        counter as stored: the watcher only compares it with the last one it read, and
        ``int()`` of one written by hand as text raised at every look."""

        def build() -> sa.Executable:
            names = sa.func.json_each(bp("names", sa.Text)).table_valued("value")
            return sa.select(streams.c.name, streams.c.last_offset).where(
                streams.c.name.in_(sa.select(names.c.value))
            )

        return dict(ex.rows(self.sql("stream_offsets_of", build), params))

    def notify_reader_drop(self, ex: Executor, params: Mapping[str, Any]) -> None:
        """The watcher ``:consumer`` has no subscriptions left: it holds nothing back."""
        readers = stream_offsets.c
        sql = self.sql(
            "notify:reader_drop",
            lambda: sa.delete(stream_offsets).where(
                readers.stream == NOTIFY_READERS_SQL,
                readers.consumer == bp("consumer", sa.Text),
            ),
        )
        ex.rowcount(sql, params)

    def insert_many(
        self,
        ex: Executor,
        params: Mapping[str, Any],
        payloads: list[str],
        contexts: list[str | None] | None = None,
    ) -> list[int]:
        def build() -> sa.Executable:
            src = sa.func.json_each(bp("payloads", sa.Text)).table_valued("value", "key")
            return self._enqueue_many_from(src.c.value, src.c.key)

        def build_traced() -> sa.Executable:
            # one JSON array of [payload, trace context] pairs
            src = sa.func.json_each(bp("payloads", sa.Text)).table_valued("value", "key")
            payload = sa.func.json_extract(src.c.value, sa.literal_column("'$[0]'"))
            context = sa.func.json_extract(src.c.value, sa.literal_column("'$[1]'"))
            return self._enqueue_many_from(payload, src.c.key, context)

        if contexts is None:
            rows = ex.rows(self.sql("enqueue_many", build), {**params, "payloads": json.dumps(payloads)})
        else:
            pairs = json.dumps([list(p) for p in zip(payloads, contexts, strict=True)])
            rows = ex.rows(self.sql("enqueue_many:traced", build_traced), {**params, "payloads": pairs})
        return sorted(r[0] for r in rows)

    def _bury_where(self, where: sa.ColumnElement[bool], last_error: Any, with_error: bool = False) -> sa.Executable:
        src = sa.select(*[jobs.c[f] for f in JOB_FIELDS]).where(where).subquery("src")
        errors = self.errors_after(src) if with_error else None
        return sa.insert(dead_jobs).from_select(
            self.DEAD_INSERT_COLUMNS, sa.select(*self.dead_values(src, last_error, errors))
        )

    # -- the time of a write that waited for the lock -----------------------------------------
    #
    # BEGIN IMMEDIATE (and a lone write statement) may wait up to the busy timeout while
    # another connection writes — an application's long import, say. A claim or lease whose
    # deadline counted from the clock reading taken before that wait could be past when it
    # lands: a claim dead on arrival is handed out again at once, and the job runs twice at
    # the same time. So whatever sets a deadline reads the store's clock again once the
    # write lock is held (``ex.now()``; the rate-limited claim does the same for its own
    # reasons). A fence keeps the time the call was made at: a claim or lease live then and
    # not taken over since (a new claim changes ``attempts``; a new owner changes ``owner``)
    # is still the caller's, and refusing it would only cost a needless run.

    @staticmethod
    def _at_lock(ex: Executor, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """(The write lock held.) ``params`` with ``now`` read again."""
        now = ex.now()
        return params if now is None or now <= params["now"] else {**params, "now": now}

    @staticmethod
    def _turns_at_lock(ex: Executor, turns: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """(The write lock held.) Every turn's ``now`` read again, one reading for them all."""
        now = ex.now()
        if now is None:
            return turns
        return [t if now <= t["now"] else {**t, "now": now} for t in turns]

    @staticmethod
    def _extended(ex: Executor, params: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        """(The write lock held.) ``params`` with the ``key`` duration lengthened by the wait
        for the lock: the fence keeps ``now``, the new deadline counts from the lock."""
        now = ex.now()
        if now is None or now <= params["now"]:
            return params
        return {**params, key: params[key] + (now - params["now"])}

    # A job's expiry is a deadline too: ``expires`` counts from when the write lock is held,
    # or a job whose enqueue waited longer than it would be written already expired, never
    # claimable. (Its created_at and a delay's run_at keep the call's reading: an earlier
    # ready time loses nothing.) Only an enqueue with an expiry takes the lock up front.

    def enqueue(self, ex: Executor, params: Mapping[str, Any]) -> int:
        if params.get("expires") is None:
            return super().enqueue(ex, params)
        with ex.transaction():
            return super().enqueue(ex, self._extended(ex, params, "expires"))

    def enqueue_many(self, ex: Executor, params: Mapping[str, Any], payloads: list[str]) -> list[int]:
        if params.get("expires") is None:
            return super().enqueue_many(ex, params, payloads)
        with ex.transaction():
            return super().enqueue_many(ex, self._extended(ex, params, "expires"), payloads)

    def worker_refresh(self, ex: Executor, params: Mapping[str, Any]) -> None:
        # the row's lapse counts from when the lock is held: a refresh that waited longer
        # than three intervals wrote a running worker's row already lapsed (not listed)
        with ex.transaction():
            super().worker_refresh(ex, self._at_lock(ex, params))

    def heartbeat(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        with ex.transaction():
            at = ex.now()
            if at is None or at <= params["now"]:
                return super().heartbeat(ex, params)
            # It waited for the lock. Its refusal test keeps the call's time, but a claim
            # that lapsed meanwhile was no live claim to the claims that ran in between: one
            # of them may have given its place under the queue's concurrency limit (SPEC
            # §14) to another job. Such a claim is extended only while the limit has room
            # for it beside the claims live now.
            waited = {**params, "extend": params["extend"] + (at - params["now"]), "at": at}
            return ex.rowcount(self.sql("heartbeat:waited", self._heartbeat_waited), waited) == 1

    def _heartbeat_waited(self) -> sa.Update:
        """The heartbeat of a claim whose write waited for the lock until ``:at``: as the
        heartbeat, and a claim lapsed by ``:at`` only while its queue's concurrency limit
        (if any) is not full of the claims live at ``:at``."""
        at = bp("at", sa.Double)
        live = jobs.alias("l")
        s = queue_settings.alias("s")
        held = (
            sa.select(sa.func.count())
            .select_from(live)
            .where(live.c.queue == s.c.queue, live.c.state == PROCESSING, live.c.claim_expires_at > at)
            .scalar_subquery()
        )
        full = sa.select(ONE).where(s.c.queue == jobs.c.queue, s.c.concurrency <= held).exists()
        return (
            sa.update(jobs)
            .where(self.this_claim(), sa.or_(jobs.c.claim_expires_at > at, ~full))
            .values(claim_expires_at=self.now() + sa.cast(bp("extend", sa.Double), sa.Double))
        )

    def lock_acquire(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        with ex.transaction():
            return super().lock_acquire(ex, self._at_lock(ex, params))

    def lock_renew(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        with ex.transaction():
            return super().lock_renew(ex, self._extended(ex, params, "ttl"))

    def claim(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with ex.transaction():
            return self._claim_steps(ex, self._at_lock(ex, params), guarded=True)

    def claim_unguarded(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self._claim_steps(ex, params, guarded=False)

    def claim_turns(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        # one BEGIN IMMEDIATE for every queue's claim: the writer lock is taken once
        with ex.transaction():
            return self._turns_in(ex, self._turns_at_lock(ex, turns), budget)

    def _turns_in(self, ex: Executor, turns: Sequence[Mapping[str, Any]], budget: int) -> list[Turn]:
        # in the caller's transaction: the claim's own steps, without the BEGIN of claim()
        return claim_in_turn(
            turns, budget, lambda p: self._claim_steps(ex, p, guarded=True),
            lambda p: self.queue_settings_get(ex, p) is not None,
        )

    def _claim_steps(self, ex: Executor, params: Mapping[str, Any], *, guarded: bool) -> list[tuple[Any, ...]]:
        """Bury the exhausted reclaimables, then claim (inside the caller's transaction).
        ``guarded``: the claim takes nothing when the queue has a settings row — such a
        queue is claimed by ``claim_limited``."""
        bury = self.sql("claim:bury", lambda: self._bury_where(self._exhausted(), EXHAUSTED_SQL))
        drop = self.sql("claim:drop", lambda: sa.delete(jobs).where(self._exhausted()))

        def build() -> sa.Executable:
            pending, lapsed = self._claimable()
            both = sa.union_all(
                sa.select(pending.subquery("pend")), sa.select(lapsed.subquery("recl"))
            ).subquery("cand")
            picked = sa.select(both.c.id).order_by(both.c.priority.desc(), both.c.run_at, both.c.id)
            if guarded:
                # a constant condition: SQLite tests it once, before any scan (one
                # primary-key probe of a table holding only the queues with settings)
                picked = picked.where(
                    ~sa.select(ONE).where(queue_settings.c.queue == bp("queue", sa.Text)).exists()
                )
            return (
                sa.update(jobs)
                .where(jobs.c.id.in_(self.limit(picked, "n")))
                .values(self._claim_values())
                .returning(*[jobs.c[f] for f in _CLAIM_READ])
            )

        claim = self.sql("claim" if guarded else "claim:limited", build)
        if ex.rowcount(bury, params):
            ex.rowcount(drop, params)
        queue, now, worker = params["queue"], params["now"], params["worker_id"]
        # the row laid out as LIVE_COLUMNS, the columns the claim set filled in from the call;
        # the lease as claim_lease takes it, that function called only for a stamp out of
        # its usual range (this runs for every row claimed)
        return [
            (
                r[0], queue, *r[1:10], now,
                now + (vt if type(vt := r[5]) in _PLAIN and MIN_LEASE <= vt <= MAX_DURATION else claim_lease(vt)),
                worker, *r[10:], _PROCESSING_STATE,
            )
            for r in ex.rows(claim, params)
        ]

    def lock_settings(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        # BEGIN IMMEDIATE took the database's one writer lock: claims are serialized already
        # (and SQLAlchemy would render FOR UPDATE as nothing here); limit_view finds the row
        return True

    def queue_wake(self, ex: Executor, params: Mapping[str, Any]) -> None:
        # The watcher wakes a queue's consumers when it sees a new job of the queue; a
        # change that lets them claim without a new job says so in a notification row on
        # a reserved channel, which the watcher turns into the same wake.
        self.notify(ex, {"channel": QUEUE_WAKE_CHANNEL, "payload": params["queue"], "now": params["now"]})

    def bury(self, ex: Executor, params: Mapping[str, Any]) -> bool:
        bury = self.sql(
            "bury",
            lambda: self._bury_where(self.this_claim(), bp("last_error", sa.Text), with_error=True),
        )
        drop = self.sql("bury:drop", lambda: sa.delete(jobs).where(jobs.c.id == bp("id", sa.BigInteger)))
        with ex.transaction():
            if not ex.rowcount(bury, params):
                return False
            ex.rowcount(drop, params)
        return True

    def ack_batch(self, ex: Executor, params: Mapping[str, Any]) -> int:
        def build() -> sa.Executable:
            # Only the primary key may drive this DELETE: left to itself the planner picks
            # the processing index and walks every in-flight row of the queue.
            ids = sa.func.json_each(bp("ids", sa.Text)).table_valued("value")
            return sa.delete(jobs).where(
                jobs.c.id.in_(sa.select(ids.c.value)),
                _NoIndex(jobs.c.queue) == bp("queue", sa.Text),
                _NoIndex(jobs.c.state) == PROCESSING,
                _NoIndex(jobs.c.claim_expires_at) > self.now(),
            )

        return ex.rowcount(self.sql("ack_batch", build), {**params, "ids": json.dumps(params["ids"])})

    def ack_claims(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[int, int]]:
        # Counted, not returned: a batch whose every claim held (nearly always) is known from
        # the DELETE's row count, and RETURNING costs SQLite as much again per row. A short
        # count is rolled back and the batch deleted once more, returning what landed.
        try:
            with ex.transaction():
                return self._ack_all(ex, params)
        except _ShortAck:
            pass
        return self._ack_each(ex, params)

    def ack_and_claim_turns(
        self, ex: Executor, acks: Mapping[str, Any], turns: Sequence[Mapping[str, Any]], budget: int
    ) -> tuple[list[tuple[int, int]], list[Turn]]:
        # one BEGIN IMMEDIATE for the acks and the claims that follow them: the writer lock
        # is taken once, and the pages both touch are written to the WAL once
        try:
            with ex.transaction():
                landed = self._ack_all(ex, acks)
                return landed, self._turns_in(ex, self._turns_at_lock(ex, turns), budget)
        except _ShortAck:
            pass
        with ex.transaction():  # both or neither, as above
            return self._ack_each(ex, acks), self._turns_in(ex, self._turns_at_lock(ex, turns), budget)

    def _ack_all(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[int, int]]:
        """(In the caller's transaction.) Delete each claimed job; every claim, if each one
        held; else raise ``_ShortAck`` (the caller rolls back)."""
        ids, attempts = params["ids"], params["attempts"]
        if ex.rowcount(*self._ack_claims_statement(params, returning=False)) != len(ids):
            raise _ShortAck()
        return list(zip(ids, attempts, strict=True))

    def _ack_each(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[int, int]]:
        """Delete each claimed job, returning the (id, attempts) claims that held."""
        return [(r[0], r[1]) for r in ex.rows(*self._ack_claims_statement(params, returning=True))]

    def _ack_claims_statement(self, params: Mapping[str, Any], *, returning: bool) -> tuple[str, dict[str, Any]]:
        """The batch ack and its parameters: each job of ``:ids`` under its claim — of
        attempt ``:attempt`` when the batch's claims share one (the usual case: first
        attempts), else the matching ``'id:attempt'`` of ``:claims`` — processing, unexpired
        (and in ``:queue``, if given)."""
        ids, attempts = params["ids"], params["attempts"]
        by_queue = params["queue"] is not None
        one_attempt = len(set(attempts)) == 1
        bound = {**params, "ids": json.dumps(ids)}
        if one_attempt:
            bound["attempt"] = attempts[0]
        else:
            bound["claims"] = json.dumps([f"{i}:{a}" for i, a in zip(ids, attempts, strict=True)])

        def build() -> sa.Executable:
            ids = sa.func.json_each(bp("ids", sa.Text)).table_valued("value")
            where: list[sa.ColumnElement[bool]] = [jobs.c.id.in_(sa.select(ids.c.value))]  # the primary key drives it (see ack_batch)
            if one_attempt:
                where.append(_NoIndex(jobs.c.attempts) == bp("attempt", sa.Integer))
            else:
                # each claim as one text value, 'id:attempt': a plain IN over one json_each,
                # cheaper than pairs of json_extract() matched as row values
                claims = sa.func.json_each(bp("claims", sa.Text)).table_valued("value")
                claim = _NoIndex(jobs.c.id).concat(sa.literal_column("':'")).concat(_NoIndex(jobs.c.attempts))
                where.append(claim.in_(sa.select(claims.c.value)))
            where += [_NoIndex(jobs.c.state) == PROCESSING, _NoIndex(jobs.c.claim_expires_at) > self.now()]
            if by_queue:
                where.append(_NoIndex(jobs.c.queue) == bp("queue", sa.Text))
            stmt = sa.delete(jobs).where(*where)
            return stmt.returning(jobs.c.id, jobs.c.attempts) if returning else stmt

        key = "ack_claims" + (":queue" if by_queue else "") + (":one" if one_attempt else "") + (":ret" if returning else "")
        return self.sql(key, build), bound

    def sweep(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, int]:
        bury = self.sql("sweep:bury", lambda: self._bury_where(self._expired(), EXPIRED_SQL))
        drop = self.sql("sweep:drop", lambda: sa.delete(jobs).where(self._expired()))
        purge = self.sql("sweep:purge", lambda: sa.delete(dead_jobs).where(self._purgeable()))
        with ex.transaction():
            # purge first: rows this sweep kills are not yet past any retention
            purged = ex.rowcount(purge, params)
            expired = ex.rowcount(bury, params)
            if expired:
                ex.rowcount(drop, params)
        return expired, purged
