"""The database schema's version: which Alembic revision this release writes, and what
a database found at another one means.

The migrations live in ``engine.migrations`` (Alembic); this module is what the store
and the command line need without loading Alembic: the head revision, the baseline
that a database made before migrations existed is recognised as, and the one-line
refusal for a schema this release does not run against.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from engine.errors import EngineError

# The revision this release's tables are (tests check it is the migrations' head).
HEAD = "0007"
# What a database with opsloop's tables and no version table is: the schema that
# ``create_tables`` made before there were migrations.
BASELINE = "0001"

# Alembic's own version table, declared once so a new database can be stamped in the
# transaction that creates its tables (Alembic's "build from scratch, then stamp").
VERSION_TABLE = sa.Table(
    "alembic_version",
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)

Verdict = Literal["empty", "current", "older", "newer"]


class SchemaMismatch(EngineError):
    """The database's schema is not the one this release runs against (one line)."""


@dataclass(frozen=True)
class SchemaState:
    """What a database holds: its revision (``None``: no opsloop tables at all), and
    whether that revision was inferred from tables without a version table."""

    revision: str | None
    stamped: bool

    def verdict(self, known: Collection[str]) -> Verdict:
        if self.revision is None:
            return "empty"
        if self.revision == HEAD:
            return "current"
        return "older" if self.revision in known else "newer"

    def refusal(self, known: Collection[str], where: str) -> SchemaMismatch | None:
        """The one-line reason not to serve against this schema, or None."""
        verdict = self.verdict(known)
        if verdict == "older":
            return SchemaMismatch(
                f"the database {where} has schema revision {self.revision}, older than this "
                f"release's {HEAD}: run `opsloop migrate` (or set OPSLOOP_AUTO_MIGRATE=true)"
            )
        if verdict == "newer":
            return SchemaMismatch(
                f"the database {where} has schema revision {self.revision}, which this "
                f"release (head {HEAD}) does not know: it was migrated by a newer opsloop; "
                "run that release"
            )
        return None
