"""The checkout's Alembic environment: the packaged one, run over the packaged revisions.

Database URL from ``-x url=...`` or ALKSTORE_DATABASE_URL; PostgreSQL schema from
``-x schema=...`` or ALKSTORE_SCHEMA (default ``alkstore``).
"""

from alembic import context

from alkstore_sa.migrations import run_environment

run_environment(context)
