"""A thread opened by an alert records which alert it is open for (``threads.alert_key``,
``"<source>:<fingerprint>"``, NULL once the alert resolves), under a partial unique
index: a resent alert finds its thread through it, and two deliveries of a new alert
racing to open a thread cannot both succeed.

Existing rows get NULL (no thread was opened by an alert before this revision), so
the column is added without a rewrite and the index is built from no rows.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Written out (not imported from engine.tables), so this revision stays what it was.
ALERTING = sa.text("alert_key IS NOT NULL")


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("threads")}
    if "alert_key" not in columns:
        op.add_column("threads", sa.Column("alert_key", sa.String(255), nullable=True))
    op.create_index(
        "uq_threads_alert",
        "threads",
        ["alert_key"],
        unique=True,
        postgresql_where=ALERTING,
        sqlite_where=ALERTING,
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("uq_threads_alert", table_name="threads")
    op.drop_column("threads", "alert_key")
