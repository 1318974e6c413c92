"""The one declaration of alkstore's tables (SQLAlchemy Core), on ``alkstore_sa.metadata``.

Tables are declared in the PostgreSQL schema ``alkstore``; a Store with another schema
translates it at execution time, and on SQLite (no schemas) the ``alkstore_`` table prefix
keeps the family apart in the caller's own database file. The shipped migrations must
produce exactly this (a test compares them).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

DEFAULT_SCHEMA = "alkstore"
VERSION_TABLE = "alkstore_alembic_version"

metadata = sa.MetaData(schema=DEFAULT_SCHEMA)

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: rowid alias for AUTOINCREMENT


def _stamp_columns() -> list[sa.Column]:
    """The job fields shared by live and dead storage, in the order rows are read."""
    return [
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("visibility_timeout", sa.Double, nullable=False),
        sa.Column("backoff_base", sa.Double, nullable=False),
        sa.Column("dead_letter_retention", sa.Double, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("run_at", sa.Double, nullable=False),
        sa.Column("claimed_at", sa.Double, nullable=True),
        sa.Column("claim_expires_at", sa.Double, nullable=True),
        sa.Column("worker_id", sa.Text, nullable=True),
        sa.Column("expires_at", sa.Double, nullable=True),
        sa.Column("errors", sa.Text, nullable=False),
    ]


# The error history (``errors``) is a JSON array of ``{"attempt", "error", "at"}`` entries,
# as text. One edited by hand into anything else reads as one entry whose error is this
# phrase and what is stored; the next retry or fail keeps it as such an entry and appends.
UNREADABLE_HISTORY = "the stored error history is unreadable: "


# Live jobs: only ``pending`` and ``processing`` rows; ack and cancel delete.
# Times are epoch seconds as double precision (microsecond resolution), so deadlines are
# plain arithmetic on the job's own stamps (claim_expires_at = now + visibility_timeout).
jobs = sa.Table(
    "alkstore_jobs",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("state", sa.Text, nullable=False),
    *_stamp_columns(),
    # Step 2: a live job's unique key (SPEC §14): at most one live job per (queue, key).
    sa.Column("unique_key", sa.Text, nullable=True),
    # Step 3: the W3C trace context of the enqueue (tracing enabled), linked from each
    # execution's span; None when the producer was not traced.
    sa.Column("trace_context", sa.Text, nullable=True),
    sa.CheckConstraint("state IN ('pending', 'processing')", name="alkstore_jobs_state_ck"),
    sqlite_autoincrement=True,  # ids are never reused: get_job is id-global
)

# The claim path: ready pending rows of one queue in claim order, as an index range scan.
sa.Index(
    "alkstore_jobs_pending_ix",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    postgresql_where=sa.text("state = 'pending'"),
    sqlite_where=sa.text("state = 'pending'"),
)
# Reclaims: processing rows of one queue whose claim deadline lapsed.
sa.Index(
    "alkstore_jobs_processing_ix",
    jobs.c.queue,
    jobs.c.claim_expires_at,
    postgresql_where=sa.text("state = 'processing'"),
    sqlite_where=sa.text("state = 'processing'"),
)
# Unique jobs: only live rows hold a key (dead storage keeps it as history, unindexed), so
# an ack, cancel or move to dead frees it; an enqueue of a held key conflicts here.
sa.Index(
    "alkstore_jobs_unique_ix",
    jobs.c.queue,
    jobs.c.unique_key,
    unique=True,
    postgresql_where=sa.text("unique_key IS NOT NULL"),
    sqlite_where=sa.text("unique_key IS NOT NULL"),
)
# sweep_expired: rows of one queue with an expiry, in expiry order.
sa.Index(
    "alkstore_jobs_expires_ix",
    jobs.c.queue,
    jobs.c.expires_at,
    postgresql_where=sa.text("expires_at IS NOT NULL"),
    sqlite_where=sa.text("expires_at IS NOT NULL"),
)

# Dead jobs: moved here (never flagged in place) so the claim path never scans them.
dead_jobs = sa.Table(
    "alkstore_dead_jobs",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=False),
    *_stamp_columns(),
    sa.Column("last_error", sa.Text, nullable=False),
    sa.Column("died_at", sa.Double, nullable=False),
    sa.Column("unique_key", sa.Text, nullable=True),  # step 2: history only, holds nothing
    sa.Column("trace_context", sa.Text, nullable=True),  # step 3: a requeue keeps the link
)
sa.Index("alkstore_dead_jobs_queue_ix", dead_jobs.c.queue, dead_jobs.c.id)
sa.Index(
    "alkstore_dead_jobs_retention_ix",
    dead_jobs.c.queue,
    dead_jobs.c.died_at,
    postgresql_where=sa.text("dead_letter_retention IS NOT NULL"),
    sqlite_where=sa.text("dead_letter_retention IS NOT NULL"),
)

# Step 3, PostgreSQL storage parameters of the two tables that churn (docs/performance.md,
# "Sustained load"): what the migrations set, also applied by ``metadata.create_all`` (the
# ALTER runs after the table's CREATE, PostgreSQL only). A test compares them with a
# migrated schema's ``pg_class.reloptions``.
STORAGE_PARAMS: dict[str, dict[str, str]] = {
    "alkstore_jobs": {
        "autovacuum_vacuum_scale_factor": "0.01",
        "autovacuum_vacuum_threshold": "500",
        "autovacuum_analyze_scale_factor": "0.02",
        "autovacuum_analyze_threshold": "500",
        "autovacuum_vacuum_cost_delay": "1",
    },
    "alkstore_dead_jobs": {
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.05",
    },
}


def _with_storage_params(table: sa.Table) -> sa.Table:
    """Attach the table's STORAGE_PARAMS to its CREATE (PostgreSQL only; a copy made with
    ``to_metadata`` does not inherit event listeners, so ``metadata_for`` calls this too)."""
    params = STORAGE_PARAMS.get(table.name)
    if params:
        settings = ", ".join(f"{k} = {v}" for k, v in params.items())

        def apply(target: sa.Table, connection: sa.Connection, **_: Any) -> None:
            if connection.dialect.name == "postgresql":
                # quoted by hand: the preparer doubles a "%" for the paramstyle and
                # sa.text() doubles it again (a schema may be named "a%b")
                name = '"' + target.name.replace('"', '""') + '"'
                if target.schema is not None:
                    name = '"' + target.schema.replace('"', '""') + '".' + name
                connection.execute(sa.text(f"ALTER TABLE {name} SET ({settings})"))

        sa.event.listen(table, "after_create", apply)
    return table


_with_storage_params(jobs)
_with_storage_params(dead_jobs)

# SQLite's notify/listen transport (unused on PostgreSQL, which has LISTEN/NOTIFY): a
# watcher reads rows past the last id it saw; notify prunes old rows as it inserts, so the
# table's size stays bounded with no consumer chore.
notifications = sa.Table(
    "alkstore_notifications",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("channel", sa.Text, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sqlite_autoincrement=True,
)

# Leases (locks and the scheduler's leadership): one row per held-or-lapsed lock; a lease
# past expires_at is free, with no reaper needed (expiry is silent).
locks = sa.Table(
    "alkstore_locks",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("acquired_at", sa.Double, nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),
)

# Schedules: `@every` specs firing into queues; next_fire_at is the next unfired boundary
# (boundaries are multiples of the interval since the Unix epoch).
schedules = sa.Table(
    "alkstore_schedules",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("interval", sa.Double, nullable=False),
    sa.Column("queue", sa.Text, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=True),
    sa.Column("expires", sa.Double, nullable=True),
    sa.Column("next_fire_at", sa.Double, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    # Step 2: the IANA zone cron specs are evaluated in; a server default, so v1 code that
    # inserts schedules without it keeps working.
    sa.Column("tz", sa.Text, nullable=False, server_default="UTC"),
)
sa.Index("alkstore_schedules_due_ix", schedules.c.next_fire_at)

# Step 2, queue settings (SPEC §14): explicit operator state per queue; a queue without a
# row has no settings.
queue_settings = sa.Table(
    "alkstore_queue_settings",
    metadata,
    sa.Column("queue", sa.Text, primary_key=True),
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("concurrency", sa.Integer, nullable=True),
    sa.Column("rate_limit", sa.Integer, nullable=True),
    sa.Column("rate_per", sa.Double, nullable=True),
    sa.Column("updated_at", sa.Double, nullable=False),
)
# The claim log of rate-limited queues only: one row per claim that handed out jobs (how
# many, and the queue's running total including them), pruned by the claims themselves
# once older than the queue's window. The jobs in a window are the newest total minus the
# total before the window's first claim: two index probes, whatever the window holds.
queue_claims = sa.Table(
    "alkstore_queue_claims",
    metadata,
    sa.Column("id", _Id, primary_key=True, autoincrement=True),
    sa.Column("queue", sa.Text, nullable=False),
    sa.Column("claimed_at", sa.Double, nullable=False),
    sa.Column("jobs", sa.Integer, nullable=False),
    sa.Column("total", sa.BigInteger, nullable=False),
)
sa.Index("alkstore_queue_claims_ix", queue_claims.c.queue, queue_claims.c.claimed_at, queue_claims.c.total)

# Step 3, the worker registry (SPEC §15): one row per running Worker, refreshed on its
# heartbeat; a row is live until expires_at (last_seen plus three refresh intervals) and
# each refresh deletes lapsed rows, so the table holds about the live workers.
workers = sa.Table(
    "alkstore_workers",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("hostname", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("queues", sa.Text, nullable=False),  # JSON list of queue names
    sa.Column("concurrency", sa.Integer, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("last_seen", sa.Double, nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),
)
sa.Index("alkstore_workers_expires_ix", workers.c.expires_at)

# Streams: an append-only log per stream name. Offsets come from the stream's counter row,
# which each publish increments and keeps row-locked until its transaction ends, so
# publishers of one stream commit in offset order and a reader can never pass a gap that a
# slower publisher fills later.
streams = sa.Table(
    "alkstore_streams",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("last_offset", sa.BigInteger, nullable=False),
)
stream_events = sa.Table(
    "alkstore_stream_events",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("offset", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
)
stream_offsets = sa.Table(
    "alkstore_stream_offsets",
    metadata,
    sa.Column("stream", sa.Text, primary_key=True),
    sa.Column("consumer", sa.Text, primary_key=True),
    sa.Column("offset", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
)

JOB_FIELDS: tuple[str, ...] = (
    ("id",) + tuple(c.name for c in _stamp_columns()) + ("unique_key", "trace_context")
)
"""Column order of every job row read by the backends (state and dead-only fields follow);
the columns live and dead storage share, so a move to dead copies exactly these (a dead
job keeps its trace context, and a requeue of it links to the original enqueue)."""


def metadata_for(schema: str | None) -> sa.MetaData:
    """A copy of ``metadata`` with its tables in ``schema`` (None: no schema, as on SQLite)."""
    md = sa.MetaData()
    for table in metadata.tables.values():
        _with_storage_params(table.to_metadata(md, schema=schema))  # type: ignore[arg-type]  # None: no schema
    return md
