"""A person's decisions are found by actor (``Store.decisions_by``: the App Home's
"Decided by me") through a partial index on ``events (actor, created_at)`` holding only
``approval_granted``, ``approval_rejected`` and ``reconcile_decided`` rows; without it
that query reads the whole events table.

Building it reads the events table once and holds appends back meanwhile (a plain
CREATE INDEX: migrations run in a transaction, which CONCURRENTLY cannot).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Written out (not imported from engine.tables), so this revision stays what it was.
DECIDED = sa.text("type IN ('approval_granted', 'approval_rejected', 'reconcile_decided')")


def upgrade() -> None:
    # A SQLite store of this release opened on the older schema creates the index
    # itself (IF NOT EXISTS): then there is nothing left to build.
    op.create_index(
        "ix_events_decisions",
        "events",
        ["actor", "created_at"],
        postgresql_where=DECIDED,
        sqlite_where=DECIDED,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_events_decisions", table_name="events")
