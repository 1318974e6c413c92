"""alkstore schema step 2 (additive): unique job keys, schedule time zones, queue settings
and the rate-limit claim log.

Revision ID: alkstore_0002
Revises: alkstore_0001
"""

from __future__ import annotations

from alkstore_sa.migrations import configured_schema, steps

revision = "alkstore_0002"
down_revision = "alkstore_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    steps.upgrade(to=2, from_=1, schema=configured_schema())


def downgrade() -> None:
    steps.downgrade(to=1, from_=2, schema=configured_schema())
