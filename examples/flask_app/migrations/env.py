"""The example app's Alembic environment: a standard env.py plus alkstore's helpers —
``include_name`` (autogenerate leaves alkstore's tables alone), ``enable_wal`` (SQLite), and
``sync_engine``/``sync_url``, which read the database URL as ``alkstore migrate`` does, so
``postgres://``, ``postgresql://`` (psycopg 3) and the app's async URL all work here."""

from __future__ import annotations

from flask_shop import database_url, db

from alembic import context
from alkstore_sa.alembic_support import enable_wal, include_name, sync_engine, sync_url

target_metadata = db.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=sync_url(database_url()), target_metadata=target_metadata, literal_binds=True, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sync_engine(database_url())  # sync, whatever the URL's driver
    with engine.connect() as connection:
        enable_wal(connection)  # SQLite: WAL mode, outside the migration's transaction
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_name=include_name,  # autogenerate leaves alkstore's tables alone
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
