"""alkstore schema v1: live and dead job storage.

Revision ID: alkstore_0001
Revises:
"""

from __future__ import annotations

from alkstore_sa.migrations import configured_schema, steps

revision = "alkstore_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    steps.upgrade(to=1, from_=0, schema=configured_schema())


def downgrade() -> None:
    steps.downgrade(to=0, from_=1, schema=configured_schema())
