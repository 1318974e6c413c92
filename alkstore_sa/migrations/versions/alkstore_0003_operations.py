"""alkstore schema step 3 (additive): the worker registry and jobs' trace context.

Revision ID: alkstore_0003
Revises: alkstore_0002
"""

from __future__ import annotations

from alkstore_sa.migrations import configured_schema, steps

revision = "alkstore_0003"
down_revision = "alkstore_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    steps.upgrade(to=3, from_=2, schema=configured_schema())


def downgrade() -> None:
    steps.downgrade(to=2, from_=3, schema=configured_schema())
