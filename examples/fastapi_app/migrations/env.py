"""The example app's Alembic environment: a standard env.py plus two alkstore lines
(``enable_wal`` and ``include_name``)."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi_shop import Base, database_url

from alembic import context
from alkstore_sa.alembic_support import enable_wal, include_name

target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(), target_metadata=target_metadata, literal_binds=True, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sa.create_engine(database_url())
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
