"""The schema as opsloop created it before migrations: threads, events, snapshots.

A database holding these tables and no ``alembic_version`` is at this revision.
Written out in full (not from ``engine.tables``), so it stays what it was.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "threads",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("root_ts", sa.String(64), nullable=False),
        sa.Column("requester", sa.String(64)),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("wake_at", TIME),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_expires_at", TIME),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.UniqueConstraint("team", "channel", "root_ts", name="uq_threads_slack_key"),
    )
    op.create_index("ix_threads_status_wake", "threads", ["status", "wake_at"])
    op.create_table(
        "events",
        sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("dedupe_key", sa.String(255)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.UniqueConstraint("thread_id", "dedupe_key", name="uq_events_dedupe"),
    )
    op.create_table(
        "snapshots",
        sa.Column("thread_id", sa.String(64), sa.ForeignKey("threads.id"), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("snapshots")
    op.drop_table("events")
    op.drop_index("ix_threads_status_wake", table_name="threads")
    op.drop_table("threads")
