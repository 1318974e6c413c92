"""alkstore schema steps 2 -> 3 (written by `alkstore alembic-revision`, alkstore_sa 0.1.0).

Installs alkstore's tables inside this application's migration chain: it calls alkstore's
versioned steps (frozen once released), then records the schema version alkstore checks
before its first operation (alkstore_0003). Steps that version already records (run by
`alkstore migrate`, say) are skipped. Do not edit. After upgrading alkstore_sa, run
`alkstore alembic-revision` again: it continues from ALKSTORE_STEPS below.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 05:38:27 UTC
"""

from __future__ import annotations

from alkstore_sa.alembic_support import downgrade_steps, upgrade_steps

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Read by `alkstore alembic-revision` to continue from here: (from step, to step).
ALKSTORE_STEPS = (2, 3)
# alkstore's PostgreSQL schema (on SQLite its tables carry the reserved `alkstore_` prefix).
ALKSTORE_SCHEMA = "alkstore"


def upgrade() -> None:
    upgrade_steps(*ALKSTORE_STEPS, schema=ALKSTORE_SCHEMA)


def downgrade() -> None:
    downgrade_steps(*ALKSTORE_STEPS, schema=ALKSTORE_SCHEMA)
