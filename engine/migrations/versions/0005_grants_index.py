"""A channel's standing grants are found by time (``Store.grant_events``: a call in one
thread approved by a channel-wide grant made in another) through a partial index on
``events (created_at)`` holding only ``grant_created`` and ``grant_revoked`` rows.

Grant events are a few a day, so building it reads the events table once and is quick;
it is a plain CREATE INDEX, as migrations run in a transaction.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Written out (not imported from engine.tables), so this revision stays what it was.
GRANTING = sa.text("type IN ('grant_created', 'grant_revoked')")


def upgrade() -> None:
    # A SQLite store of this release opened on the older schema creates the index
    # itself (IF NOT EXISTS): then there is nothing left to build.
    op.create_index(
        "ix_events_grants",
        "events",
        ["created_at"],
        postgresql_where=GRANTING,
        sqlite_where=GRANTING,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_events_grants", table_name="events")
