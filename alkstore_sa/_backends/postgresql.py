"""PostgreSQL (psycopg 3): SKIP LOCKED claims, and every live/dead move as ONE statement
(data-modifying CTEs), so each is atomic and one round trip on an autocommit connection."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from ..schema import JOB_FIELDS, dead_jobs, jobs, stream_events
from .base import Backend
from .sql import EXHAUSTED_SQL, EXPIRED_SQL, Executor, bp

# sqlstates: undefined_table, invalid_schema_name
_MISSING = {"42P01", "3F000"}


@functools.lru_cache(maxsize=4096)
def _hashed(prefix: str, schema: str, name: str) -> str:
    """A PostgreSQL channel identifier for any name: PostgreSQL truncates identifiers at 63
    bytes (two long names would collide) and names may hold any character. The schema is
    part of it so stores on different schemas of one database never wake each other."""
    digest = hashlib.sha256(f"{schema}\x00{name}".encode()).hexdigest()[:40]
    return prefix + digest


def _materialized(select: sa.Select[Any], name: str) -> sa.CTE:
    # MATERIALIZED is the fence: without it PostgreSQL may inline the CTE and re-run a
    # LIMIT ... SKIP LOCKED subquery per outer row, handing out more than n rows.
    return select.cte(name).prefix_with("MATERIALIZED")


class PostgresBackend(Backend):
    name = "postgresql"

    def compile_dialect(self) -> Dialect:
        return postgresql.psycopg.dialect()

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
        return getattr(exc, "sqlstate", None) in _MISSING

    def append_error(self, errors: Any, attempts: Any) -> sa.ColumnElement[str]:
        entry = sa.func.jsonb_build_object(
            sa.literal_column("'attempt'"), attempts,
            sa.literal_column("'error'"), sa.cast(bp("error", sa.Text), sa.Text),
            sa.literal_column("'at'"), self.now(),
        )
        appended = sa.cast(errors, postgresql.JSONB).op("||")(sa.func.jsonb_build_array(entry))
        return sa.cast(appended, sa.Text)

    def prepare_connection(self, dbapi_conn: Any) -> Any:
        saved = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        return saved

    def restore_connection(self, dbapi_conn: Any, saved: Any) -> None:
        dbapi_conn.autocommit = saved

    def is_disconnect(self, exc: BaseException, dbapi_conn: Any) -> bool:
        return bool(getattr(dbapi_conn, "closed", False) or getattr(dbapi_conn, "broken", False))

    def upsert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def channel_key(self, channel: str) -> str:
        return _hashed("alkc_", self.schema, channel)

    def wake_key(self, queue: str) -> str:
        return _hashed("alkq_", self.schema, queue)

    def stream_wake_key(self, stream: str) -> str:
        return _hashed("alks_", self.schema, stream)

    def stream_publish(self, ex: Executor, params: Mapping[str, Any]) -> int:
        def build() -> sa.Executable:
            ctr = self._next_offset().cte("ctr")
            ins = sa.insert(stream_events).from_select(
                ["stream", "offset", "payload", "created_at"],
                sa.select(bp("stream", sa.Text), ctr.c.last_offset, bp("payload", sa.Text), self.now()),
            ).returning(stream_events.c.offset)
            return self._with_wake(ins)

        rows = ex.rows(self.sql("stream_publish", build), {**params, "wake": self.stream_wake_key(params["stream"])})
        return int(rows[0][0])

    def create_hub(self, engine: Any) -> Any:
        from .pg_listener import PgHub

        return PgHub(engine)

    def notify(self, ex: Executor, params: Mapping[str, Any]) -> None:
        sql = self.sql(
            "notify",
            lambda: sa.select(sa.func.pg_notify(bp("channel", sa.Text), bp("payload", sa.Text))),
        )
        ex.rows(sql, {"channel": self.channel_key(params["channel"]), "payload": params["payload"]})

    def _with_wake(self, insert: Any) -> sa.Executable:
        # pg_notify in the enqueue's own statement: one round trip, delivered exactly when
        # the enqueue commits (PostgreSQL folds duplicate wakes within a transaction).
        ins = insert.cte("ins")
        wake = _materialized(
            sa.select(
                sa.func.pg_notify(bp("wake", sa.Text), sa.literal_column("''")).is_(None).label("w")
            ),
            "wake",
        )
        return sa.select(*ins.c).select_from(ins.join(wake, sa.true()))

    def enqueue_many(self, ex: Executor, params: Mapping[str, Any], payloads: list[str]) -> list[int]:
        def build() -> sa.Executable:
            src = (
                sa.func.unnest(bp("payloads", postgresql.ARRAY(sa.Text)))
                .table_valued("value", with_ordinality="ord")
                .render_derived()
            )
            return self._enqueue_many_from(src.c.value, src.c.ord)

        rows = ex.rows(self.sql("enqueue_many", build), {**params, "payloads": payloads})
        # one INSERT ... SELECT in ordinality order: sequence values follow the input order
        return sorted(r[0] for r in rows)

    def claim(self, ex: Executor, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        def build() -> sa.Executable:
            # The scans read an alias: psycopg caches its parse of a query only up to 4 KiB,
            # and schema-qualified column names everywhere would push the claim past that.
            j = jobs.alias("j")
            # 1. exhausted reclaimables move to dead in the same statement as the claim
            exhausted = _materialized(
                sa.select(j.c.id).where(self._exhausted(j)).with_for_update(skip_locked=True),
                "exhausted",
            )
            g: Any = jobs.alias("g")  # an Alias at run time; typed as a NamedFromClause
            gone = (
                sa.delete(g)
                .where(g.c.id.in_(sa.select(exhausted.c.id)))
                .returning(*[g.c[f] for f in JOB_FIELDS])
                .cte("gone")
            )
            buried = sa.insert(dead_jobs).from_select(
                self.DEAD_INSERT_COLUMNS, sa.select(*self.dead_values(gone, EXHAUSTED_SQL))
            ).cte("buried")
            # 2. each candidate scan locks what it takes and skips what others hold
            pending, lapsed = self._claimable(j)
            pend = _materialized(pending.with_for_update(skip_locked=True), "pend")
            recl = _materialized(lapsed.with_for_update(skip_locked=True), "recl")
            both = sa.union_all(sa.select(pend), sa.select(recl)).subquery("cand")
            picked = _materialized(
                sa.select(both.c.id)
                .order_by(both.c.priority.desc(), both.c.run_at, both.c.id)
                .limit(bp("n", sa.Integer)),
                "picked",
            )
            u: Any = jobs.alias("u")
            return (
                sa.update(u)
                .where(u.c.id == picked.c.id)
                .values(self._claim_values(u))
                .returning(*[u.c[f] for f in JOB_FIELDS], u.c.state)
                .add_cte(buried)
            )

        return ex.rows(self.sql("claim", build), params)

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

    def ack_claims(self, ex: Executor, params: Mapping[str, Any]) -> int:
        def build() -> sa.Executable:
            pairs = sa.func.unnest(
                bp("ids", postgresql.ARRAY(sa.BigInteger)), bp("attempts", postgresql.ARRAY(sa.Integer))
            ).table_valued("id", "attempts").render_derived()
            claim = sa.tuple_(jobs.c.id, jobs.c.attempts).in_(sa.select(pairs.c.id, pairs.c.attempts))
            return self._ack_batch(claim)

        return ex.rowcount(self.sql("ack_claims", build), params)

    def sweep(self, ex: Executor, params: Mapping[str, Any]) -> tuple[int, int]:
        def build() -> sa.Executable:
            gone = (
                sa.delete(jobs)
                .where(self._expired())
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
