"""OAuth of MCP servers (``tools.mcp.<server>.auth``) keeps its tokens, the client a
dynamic registration made and the authorization an admin was asked for in
``mcp_oauth``, one row per server, shared by every replica.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # A store of this release opened on the older schema (a command other than serve)
    # creates the table itself: the migration then only records the revision.
    if sa.inspect(op.get_bind()).has_table("mcp_oauth"):
        return
    op.create_table(
        "mcp_oauth",
        sa.Column("server", sa.String(64), primary_key=True),
        sa.Column("binding", sa.String(64), nullable=False),
        sa.Column("tokens", sa.Text, nullable=True),
        sa.Column("expires_at", TIME, nullable=True),
        sa.Column("client_info", sa.Text, nullable=True),
        sa.Column("pending_state", sa.String(255), nullable=True),
        sa.Column("pending_verifier", sa.String(255), nullable=True),
        sa.Column("pending_url", sa.Text, nullable=True),
        sa.Column("pending_since", TIME, nullable=True),
        sa.Column("code", sa.Text, nullable=True),
        sa.Column("iss", sa.Text, nullable=True),
        sa.Column("updated_at", TIME, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("mcp_oauth")
