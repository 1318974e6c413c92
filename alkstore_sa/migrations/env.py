"""Alembic environment of the packaged migrations (used by Store.install, `alkstore migrate`
and the checkout's `alembic upgrade head`)."""

from alembic import context
from alkstore_sa.migrations import run_environment

run_environment(context)
