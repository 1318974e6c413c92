"""Versioned schema steps, written with ``alembic.op`` so they run online and offline (--sql).

Each step is frozen once released: a later schema change is a new step, never an edit.
The package's own revisions call these, and so can an application's own Alembic revision
(``alkstore_sa.migrations.steps.upgrade(to=N)``) so the app keeps a single head.
``schema`` is the PostgreSQL schema, or None on SQLite (prefixed tables in the main file).

A new step N gets the revision id ``alkstore_000N`` when it is additive (older library
releases keep working against it: new tables, new nullable or defaulted columns, new
indexes), and ``alkstore_000N_r000M`` when only releases shipping step M or later may use
the database (see the package docstring and docs/install.md, "Upgrading"); a later step
never lowers the M of an earlier one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from alembic import op

HEAD = 3


def _job_columns() -> list[sa.Column]:
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


_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _partial(where: str) -> dict[str, Any]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def upgrade_v1(schema: str | None) -> None:
    """Live and dead job storage with the claim-path indexes, the SQLite notification
    table, lock leases, schedules and streams."""
    if schema is not None:
        op.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    op.create_table(
        "alkstore_jobs",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("state", sa.Text, nullable=False),
        *_job_columns(),
        sa.CheckConstraint("state IN ('pending', 'processing')", name="alkstore_jobs_state_ck"),
        schema=schema,
        sqlite_autoincrement=True,
    )
    op.create_index(
        "alkstore_jobs_pending_ix",
        "alkstore_jobs",
        ["queue", sa.text("priority DESC"), "run_at", "id"],
        schema=schema,
        **_partial("state = 'pending'"),
    )
    op.create_index(
        "alkstore_jobs_processing_ix",
        "alkstore_jobs",
        ["queue", "claim_expires_at"],
        schema=schema,
        **_partial("state = 'processing'"),
    )
    op.create_index(
        "alkstore_jobs_expires_ix",
        "alkstore_jobs",
        ["queue", "expires_at"],
        schema=schema,
        **_partial("expires_at IS NOT NULL"),
    )
    op.create_table(
        "alkstore_dead_jobs",
        sa.Column("id", _ID, primary_key=True, autoincrement=False),
        *_job_columns(),
        sa.Column("last_error", sa.Text, nullable=False),
        sa.Column("died_at", sa.Double, nullable=False),
        schema=schema,
    )
    op.create_index("alkstore_dead_jobs_queue_ix", "alkstore_dead_jobs", ["queue", "id"], schema=schema)
    op.create_index(
        "alkstore_dead_jobs_retention_ix",
        "alkstore_dead_jobs",
        ["queue", "died_at"],
        schema=schema,
        **_partial("dead_letter_retention IS NOT NULL"),
    )

    op.create_table(
        "alkstore_notifications",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        schema=schema,
        sqlite_autoincrement=True,
    )

    op.create_table(
        "alkstore_locks",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("acquired_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        schema=schema,
    )
    op.create_table(
        "alkstore_schedules",
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
        schema=schema,
    )
    op.create_index("alkstore_schedules_due_ix", "alkstore_schedules", ["next_fire_at"], schema=schema)
    op.create_table(
        "alkstore_streams",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("last_offset", sa.BigInteger, nullable=False),
        schema=schema,
    )
    op.create_table(
        "alkstore_stream_events",
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("offset", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        schema=schema,
    )
    op.create_table(
        "alkstore_stream_offsets",
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        schema=schema,
    )


def downgrade_v1(schema: str | None) -> None:
    op.drop_table("alkstore_stream_offsets", schema=schema)
    op.drop_table("alkstore_stream_events", schema=schema)
    op.drop_table("alkstore_streams", schema=schema)
    op.drop_table("alkstore_schedules", schema=schema)
    op.drop_table("alkstore_locks", schema=schema)
    op.drop_table("alkstore_notifications", schema=schema)
    op.drop_table("alkstore_dead_jobs", schema=schema)
    op.drop_table("alkstore_jobs", schema=schema)


def upgrade_v2(schema: str | None) -> None:
    """Flow control (SPEC §14), additive: unique keys on live jobs (kept on dead rows for
    history, held only by live ones), a schedule's time zone (server default, so v1 code
    inserting schedules still works), per-queue settings, and the claim-time log of
    rate-limited queues."""
    op.add_column("alkstore_jobs", sa.Column("unique_key", sa.Text, nullable=True), schema=schema)
    op.create_index(
        "alkstore_jobs_unique_ix",
        "alkstore_jobs",
        ["queue", "unique_key"],
        unique=True,
        schema=schema,
        **_partial("unique_key IS NOT NULL"),
    )
    op.add_column("alkstore_dead_jobs", sa.Column("unique_key", sa.Text, nullable=True), schema=schema)
    op.add_column(
        "alkstore_schedules",
        sa.Column("tz", sa.Text, nullable=False, server_default="UTC"),
        schema=schema,
    )
    op.create_table(
        "alkstore_queue_settings",
        sa.Column("queue", sa.Text, primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("rate_limit", sa.Integer, nullable=True),
        sa.Column("rate_per", sa.Double, nullable=True),
        sa.Column("updated_at", sa.Double, nullable=False),
        schema=schema,
    )
    op.create_table(
        "alkstore_queue_claims",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("queue", sa.Text, nullable=False),
        sa.Column("claimed_at", sa.Double, nullable=False),
        sa.Column("jobs", sa.Integer, nullable=False),
        sa.Column("total", sa.BigInteger, nullable=False),
        schema=schema,
    )
    op.create_index(
        "alkstore_queue_claims_ix", "alkstore_queue_claims", ["queue", "claimed_at", "total"], schema=schema
    )


def downgrade_v2(schema: str | None) -> None:
    op.drop_table("alkstore_queue_claims", schema=schema)
    op.drop_table("alkstore_queue_settings", schema=schema)
    op.drop_column("alkstore_schedules", "tz", schema=schema)
    op.drop_column("alkstore_dead_jobs", "unique_key", schema=schema)
    op.drop_index("alkstore_jobs_unique_ix", table_name="alkstore_jobs", schema=schema)
    op.drop_column("alkstore_jobs", "unique_key", schema=schema)


def upgrade_v3(schema: str | None) -> None:
    """Operations (SPEC §15), additive: the worker registry, and the trace context a job
    carries from its enqueue to its executions (kept on dead rows so a requeue keeps it);
    on PostgreSQL, the storage parameters that keep the job tables from bloating."""
    op.create_table(
        "alkstore_workers",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("hostname", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queues", sa.Text, nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("last_seen", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        schema=schema,
    )
    op.create_index("alkstore_workers_expires_ix", "alkstore_workers", ["expires_at"], schema=schema)
    op.add_column("alkstore_jobs", sa.Column("trace_context", sa.Text, nullable=True), schema=schema)
    op.add_column("alkstore_dead_jobs", sa.Column("trace_context", sa.Text, nullable=True), schema=schema)
    _set_storage(schema, _V3_STORAGE)


def downgrade_v3(schema: str | None) -> None:
    _reset_storage(schema, _V3_STORAGE)
    op.drop_column("alkstore_dead_jobs", "trace_context", schema=schema)
    op.drop_column("alkstore_jobs", "trace_context", schema=schema)
    op.drop_table("alkstore_workers", schema=schema)


# Step 3's storage parameters (PostgreSQL only; docs/operations.md, "Maintenance"), the
# values frozen here as released. Live jobs churn (insert, claim update, delete): autovacuum
# runs on a small count of dead rows instead of a fifth of the table — with a big delayed
# backlog that fifth is a large number — and unthrottled twice as long per pass, so the
# table and its indexes stay near the live rows. (A fillfactor below 100 made the table
# several times bigger under the soak, so the default is kept.) Dead jobs are appended
# and purged by retention: vacuumed after a purge of a twentieth of them.
_V3_STORAGE: dict[str, dict[str, str]] = {
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


def _storage_target(schema: str | None, table: str) -> str | None:
    """The quoted table name for ALTER TABLE, or None where storage parameters do not exist
    (SQLite)."""
    dialect = op.get_context().dialect
    if dialect.name != "postgresql":
        return None
    # Always quoted, by hand: the preparer's quoting doubles a "%" for the driver's
    # paramstyle, and sa.text() doubles it again.
    def quote(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    return quote(table) if schema is None else f"{quote(schema)}.{quote(table)}"


def _set_storage(schema: str | None, params: dict[str, dict[str, str]]) -> None:
    """ALTER TABLE ... SET (...) per table: a SHARE UPDATE EXCLUSIVE lock, so reads and
    writes go on while it runs."""
    for table, options in params.items():
        target = _storage_target(schema, table)
        if target is not None:
            settings = ", ".join(f"{k} = {v}" for k, v in options.items())
            op.execute(sa.text(f"ALTER TABLE {target} SET ({settings})"))


def _reset_storage(schema: str | None, params: dict[str, dict[str, str]]) -> None:
    for table, options in params.items():
        target = _storage_target(schema, table)
        if target is not None:
            op.execute(sa.text(f"ALTER TABLE {target} RESET ({', '.join(options)})"))


STEPS: dict[int, tuple[Callable[[str | None], None], Callable[[str | None], None]]] = {
    1: (upgrade_v1, downgrade_v1),
    2: (upgrade_v2, downgrade_v2),
    3: (upgrade_v3, downgrade_v3),
}


def schema_for(dialect_name: str, schema: str | None) -> str | None:
    """The schema steps take: the configured one on PostgreSQL, None on SQLite."""
    return None if dialect_name == "sqlite" else schema


@contextmanager
def own_names() -> Iterator[None]:
    """The steps' tables, keys and indexes named as written here, whatever env runs them.

    Alembic builds ``op.create_table``'s tables in a MetaData carrying the naming convention
    of the env's ``target_metadata``: in an application's chain a common convention
    (``"pk": "pk_%(table_name)s"``, ``"ck": "ck_%(table_name)s_%(constraint_name)s"``)
    renamed alkstore's primary keys and check, so the schema depended on the way it was
    installed and was not what ``metadata`` declares, and a later step naming a constraint
    would miss it in databases installed the other way. The env's ``target_metadata`` is
    only read for that (and by autogenerate, which does not run here), so it is set aside
    while the steps run. (Databases such a chain installed before may carry the
    convention's names for the primary keys and ``alkstore_jobs_state_ck``: a later step
    that alters those constraints must look their names up rather than assume these.)"""
    opts = op.get_context().opts
    if "target_metadata" not in opts:
        yield
        return
    app_metadata = opts.pop("target_metadata")
    try:
        yield
    finally:
        opts["target_metadata"] = app_metadata


def upgrade(to: int = HEAD, *, from_: int = 0, schema: str | None = "alkstore") -> None:
    """Apply steps ``from_+1 .. to`` inside the current Alembic migration."""
    schema = schema_for(op.get_context().dialect.name, schema)
    with own_names():
        for version in range(from_ + 1, to + 1):
            STEPS[version][0](schema)


def downgrade(to: int = 0, *, from_: int = HEAD, schema: str | None = "alkstore") -> None:
    """Undo steps ``from_ .. to+1`` inside the current Alembic migration."""
    schema = schema_for(op.get_context().dialect.name, schema)
    with own_names():
        for version in range(from_, to, -1):
            STEPS[version][1](schema)
