"""The raw floor: the same durable work written with the plain driver (psycopg 3 / sqlite3)
on the minimal floor table, as tight as a hand-written application would make it.

Every floor operation does what the library's does at the database: the same number of
transactions with the same commit mode (autocommit single statements; explicit
transactions where the library has one), JSON-encoding of payloads on enqueue and decoding
on claim. It is never made slower to flatter a ratio.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from benchmarks.env import Env

QUEUE = "bench"
WORKER = "bench-worker"

_INSERT_COLS = (
    "state, queue, payload, priority, attempts, max_attempts, visibility_timeout, "
    "backoff_base, created_at, run_at, errors"
)


class FloorSQL:
    """The floor's statements in the driver's own parameter style."""

    def __init__(self, kind: str, table: str) -> None:
        self.kind = kind
        self.table = table
        p = "%s" if kind == "postgresql" else "?"
        values = f"('pending', {p}, {p}, 0, 0, 3, 300, 5, {p}, {p}, '[]')"
        self.insert = f"INSERT INTO {table} ({_INSERT_COLS}) VALUES {values}"
        self.insert_returning = self.insert + " RETURNING id"
        if kind == "postgresql":
            named = "('pending', %(queue)s, %(payload)s, 0, 0, 3, 300, 5, %(now)s, %(now)s, '[]')"
        else:
            named = "('pending', :queue, :payload, 0, 0, 3, 300, 5, :now, :now, '[]')"
        self.insert_named = f"INSERT INTO {table} ({_INSERT_COLS}) VALUES {named} RETURNING id"
        pick = (
            f"SELECT id FROM {table} WHERE queue = {p} AND state = 'pending' AND run_at <= {p} "
            f"ORDER BY priority DESC, run_at, id LIMIT {p}"
        )
        sets = (
            f"state = 'processing', attempts = attempts + 1, claimed_at = {p}, "
            f"claim_expires_at = {p} + visibility_timeout, worker_id = {p}"
        )
        if kind == "postgresql":
            # the SKIP LOCKED pick, fenced so it runs once, then one UPDATE ... RETURNING
            self.claim = (
                f"WITH c AS MATERIALIZED ({pick} FOR UPDATE SKIP LOCKED) "
                f"UPDATE {table} j SET {sets} FROM c WHERE j.id = c.id "
                "RETURNING j.id, j.attempts, j.payload"
            )
            self.delete_many = f"DELETE FROM {table} WHERE id = ANY(%s)"
        else:
            # one writer-serialized UPDATE ... RETURNING
            self.claim = f"UPDATE {table} SET {sets} WHERE id IN ({pick}) RETURNING id, attempts, payload"
            self.delete_many = ""  # built per batch size: DELETE ... IN (?, ?, ...)
        self.delete_one = f"DELETE FROM {table} WHERE id = {p}"
        self._in: dict[int, str] = {}

    def claim_params(self, queue: str, n: int, worker: str) -> tuple[Any, ...]:
        now = time.time()
        # SET comes before WHERE in both statements' text, but PostgreSQL's CTE comes first
        if self.kind == "postgresql":
            return (queue, now, n, now, now, worker)
        return (now, now, worker, queue, now, n)

    def delete_ids(self, ids: Sequence[int]) -> tuple[str, Any]:
        if self.kind == "postgresql":
            return self.delete_many, (list(ids),)
        sql = self._in.get(len(ids))
        if sql is None:
            sql = self._in[len(ids)] = (
                f"DELETE FROM {self.table} WHERE id IN ({', '.join('?' * len(ids))})"
            )
        return sql, tuple(ids)


@dataclass
class Steps:
    """A prepared workload: ``step(chunk)`` does the timed work for one chunk of the items
    (it may return its own measured seconds); ``close()`` releases what it held."""

    step: Callable[[Sequence[Any]], float | None]
    close: Callable[[], None] = lambda: None


def begin(conn: Any, kind: str) -> Any:
    """One explicit write transaction on an autocommit driver connection."""
    if kind == "postgresql":
        return conn.transaction()
    return _SqliteTx(conn)


class _SqliteTx:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def drain(conn: Any, sql: FloorSQL, queue: str, batch: int, worker: str, limit: int | None = None) -> int:
    """Claim up to ``batch`` rows in one statement, decode their payloads, delete them in one
    statement (two autocommit transactions per claim); until ``limit`` jobs are done, or
    until a claim comes back empty when ``limit`` is None."""
    cur = conn.cursor()
    claim = sql.claim
    claim_params = sql.claim_params
    loads = json.loads
    done = 0
    if batch == 1:
        delete_one = sql.delete_one
        while limit is None or done < limit:
            rows = cur.execute(claim, claim_params(queue, 1, worker)).fetchall()
            if not rows:
                break
            job_id, _attempts, payload = rows[0]
            loads(payload)
            cur.execute(delete_one, (job_id,))
            done += 1
        return done
    while limit is None or done < limit:
        n = batch if limit is None else min(batch, limit - done)
        rows = cur.execute(claim, claim_params(queue, n, worker)).fetchall()
        if not rows:
            break
        for row in rows:
            loads(row[2])
        stmt, params = sql.delete_ids([row[0] for row in rows])
        cur.execute(stmt, params)
        done += len(rows)
    return done


class Floor:
    """The raw side of every workload. Each method prepares its workload (untimed: empty the
    table, prefill what a drain drains) and returns the ``Steps`` the runner times."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.kind = env.kind
        self.conn = env.raw_connect(floor=True)
        self.sql = FloorSQL(env.kind, env.floor)

    def close(self) -> None:
        self.conn.close()

    def reset(self) -> None:
        self.env.truncate(self.env.floor)
        self.env.settle()

    def _rows(self, payloads: Sequence[Any]) -> list[tuple[Any, ...]]:
        now = time.time()
        dumps = json.dumps
        return [(QUEUE, dumps(p), now, now) for p in payloads]

    def prefill(self, payloads: Sequence[Any], per_tx: int = 1000) -> None:
        cur = self.conn.cursor()
        for i in range(0, len(payloads), per_tx):
            with begin(self.conn, self.kind):
                cur.executemany(self.sql.insert, self._rows(payloads[i : i + per_tx]))

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue_one(self, payloads: Sequence[Any]) -> Steps:
        """One INSERT per transaction (autocommit), the new id read back."""
        self.reset()
        cur = self.conn.cursor()
        dumps = json.dumps
        clock = time.time
        if self.kind == "postgresql":
            sql = self.sql.insert_returning

            def step(chunk: Sequence[Any]) -> None:
                for p in chunk:
                    now = clock()
                    cur.execute(sql, (QUEUE, dumps(p), now, now))
                    cur.fetchone()
        else:
            sql = self.sql.insert

            def step(chunk: Sequence[Any]) -> None:
                for p in chunk:
                    now = clock()
                    cur.execute(sql, (QUEUE, dumps(p), now, now))
                    _ = cur.lastrowid

        return Steps(step)

    def enqueue_session(self, payloads: Sequence[Any]) -> Steps:
        """The same INSERT through a caller's Session, one commit per job (on SQLite an engine
        made the same way on the floor's own file, so each side pays its own checkpoints)."""
        self.reset()
        sql = self.sql.insert_named
        dumps = json.dumps
        clock = time.time
        session = Session(self.env.floor_engine or self.env.engine)

        def step(chunk: Sequence[Any]) -> None:
            for p in chunk:
                now = clock()
                session.connection().exec_driver_sql(
                    sql, {"queue": QUEUE, "payload": dumps(p), "now": now}
                ).scalar_one()
                session.commit()

        return Steps(step, session.close)

    def executemany(self, payloads: Sequence[Any], per_tx: int = 1000) -> Steps:
        """``executemany`` of ``per_tx`` rows per explicit transaction."""
        self.reset()
        cur = self.conn.cursor()
        sql = self.sql.insert

        def step(chunk: Sequence[Any]) -> None:
            for i in range(0, len(chunk), per_tx):
                with begin(self.conn, self.kind):
                    cur.executemany(sql, self._rows(chunk[i : i + per_tx]))

        return Steps(step)

    def copy(self, payloads: Sequence[Any], per_tx: int = 1000) -> Steps:
        """PostgreSQL ``COPY ... FROM STDIN`` of ``per_tx`` rows per transaction."""
        self.reset()
        stmt = (
            f"COPY {self.env.floor} (queue, payload, created_at, run_at, state, priority, attempts, "
            "max_attempts, visibility_timeout, backoff_base, errors) FROM STDIN"
        )
        cur = self.conn.cursor()
        dumps = json.dumps

        def step(chunk: Sequence[Any]) -> None:
            for i in range(0, len(chunk), per_tx):
                now = time.time()
                with self.conn.transaction(), cur.copy(stmt) as cp:
                    for p in chunk[i : i + per_tx]:
                        cp.write_row((QUEUE, dumps(p), now, now, "pending", 0, 0, 3, 300.0, 5.0, "[]"))

        return Steps(step)

    # -- drain -----------------------------------------------------------------------------

    def drain_steps(self, payloads: Sequence[Any], batch: int, reset: bool = True) -> Steps:
        """Prefill ``payloads`` (untimed); each step drains exactly its chunk's count.
        ``reset=False`` keeps what the table holds (the scaling run's backlog)."""
        if reset:
            self.reset()
        self.prefill(payloads)
        self.env.settle()

        def step(chunk: Sequence[Any]) -> None:
            done = drain(self.conn, self.sql, QUEUE, batch, WORKER, limit=len(chunk))
            if done != len(chunk):
                raise RuntimeError(f"floor drain got {done} of {len(chunk)} jobs")

        return Steps(step)

    def drain_batch(self, payloads: Sequence[Any]) -> Steps:
        return self.drain_steps(payloads, 100)

    def drain_one(self, payloads: Sequence[Any]) -> Steps:
        return self.drain_steps(payloads, 1)

    def drain_procs(self, payloads: Sequence[Any], run_pool: Callable[[dict[str, Any]], tuple[int, float]],
                    batch: int) -> Steps:
        """All of ``payloads`` drained by the process pool in one step (its own clock)."""
        self.reset()
        self.prefill(payloads)

        def step(chunk: Sequence[Any]) -> float:
            done, elapsed = run_pool({"side": "floor", "batch": batch, "queue": QUEUE})
            if done != len(chunk):
                raise RuntimeError(f"floor drain (processes) got {done} of {len(chunk)} jobs")
            return elapsed

        return Steps(step)
