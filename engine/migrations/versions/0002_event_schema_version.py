"""Events carry the version of their type's payload schema (``engine.mapper``).

Rows written before this revision are version 1: the server default says so, and no
row is rewritten.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(
            sa.Column("schema_version", sa.Integer, nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("schema_version")
