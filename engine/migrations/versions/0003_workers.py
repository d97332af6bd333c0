"""The processes that run threads register in ``workers`` (engine.workers), so a lease
whose owner is provably dead is taken at once instead of at its expiry.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # A store of this release opened on the older schema (a command other than serve)
    # creates the table itself: the migration then only records the revision.
    if sa.inspect(op.get_bind()).has_table("workers"):
        return
    op.create_table(
        "workers",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("heartbeat_at", TIME, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
