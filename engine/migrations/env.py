"""Alembic's environment: run on the connection ``engine.migrations`` hands over.

There is no URL here and no ``alembic.ini`` of its own use: opsloop opens the
connection (its own driver choice, PostgreSQL ``?schema=``) and begins the
transaction; Alembic runs inside it.
"""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import engine.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `opsloop migrate` (it provides the connection)")

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    # SQLite alters a table by copying it; batch mode is Alembic's way to say so.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
