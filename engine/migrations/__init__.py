"""Alembic migrations of opsloop's tables, run from the ``opsloop`` command.

``inspect_schema(url)`` says which revision a database is at; ``migrate(url)`` takes
it to the head; ``prepare(url, auto_migrate=...)`` is what ``serve``, ``socket`` and
``local`` do at start: create an empty database, accept the head, migrate an older
one when told to, and otherwise refuse with one line (``SchemaMismatch``).

Alembic is synchronous: it runs on the store's async SQLAlchemy engine through
``run_sync`` (Alembic's cookbook, "Using Asyncio with Alembic"), once at start, never
on the hot path. A database made before migrations existed (tables, no
``alembic_version``) is the baseline revision: it is stamped, then upgraded. The
whole upgrade is one transaction under a lock (PostgreSQL: an advisory lock; SQLite:
``BEGIN IMMEDIATE``), so two replicas migrating at once run it once.

To write a revision: ``alembic -c engine/migrations/alembic.ini revision -m "what"``,
then set ``engine.schema.HEAD`` to it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from engine.db import DatabaseConfig, create_engine, parse_database_url
from engine.errors import StoreUnavailable
from engine.schema import BASELINE, HEAD, SchemaState

HERE = os.path.dirname(os.path.abspath(__file__))
# The same key as the store's table creation: migrating and creating never interleave.
_PG_LOCK = 7270010001


def alembic_config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", HERE)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this release's migrations know."""
    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(s.revision for s in script.walk_revisions())


def script_head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _state(conn: sa.Connection) -> SchemaState:
    heads = MigrationContext.configure(conn).get_current_heads()
    if heads:
        return SchemaState(revision=sorted(heads)[0], stamped=True)
    if sa.inspect(conn).has_table("threads"):
        return SchemaState(revision=BASELINE, stamped=False)
    return SchemaState(revision=None, stamped=False)


def _upgrade(conn: sa.Connection, config: DatabaseConfig, target: str) -> SchemaState:
    """Lock, stamp a baseline database, upgrade: one transaction."""
    with conn.begin():
        if config.dialect == "postgresql":
            conn.execute(sa.text(f"SELECT pg_advisory_xact_lock({_PG_LOCK})"))
            if config.schema:
                name = config.schema.replace('"', '""')
                conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{name}"'))
        before = _state(conn)
        alembic = alembic_config(conn)
        if before.revision is not None and not before.stamped:
            command.stamp(alembic, before.revision)
        command.upgrade(alembic, target)
    return before


async def _on_engine(url: str, work: Any) -> Any:
    config = parse_database_url(url)
    engine = create_engine(config)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(work, config)
    except (OSError, sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        why = cause[0] if cause else type(exc).__name__
        raise StoreUnavailable(f"cannot reach the database {config.display()}: {why}") from exc
    finally:
        await engine.dispose()


async def inspect_schema(url: str) -> SchemaState:
    """The revision the database at ``url`` is at (reads only)."""

    def read(conn: sa.Connection, _config: DatabaseConfig) -> SchemaState:
        try:
            return _state(conn)
        finally:
            conn.rollback()

    state: SchemaState = await _on_engine(url, read)
    return state


async def migrate(url: str, target: str = "head") -> tuple[SchemaState, SchemaState]:
    """Take the database to ``target``; the states before and after.
    A database at a revision this release does not know is refused, not touched."""
    before = await inspect_schema(url)
    refusal = before.refusal(known_revisions(), parse_database_url(url).display())
    if refusal is not None and before.verdict(known_revisions()) == "newer":
        raise refusal
    await _on_engine(url, lambda conn, config: _upgrade(conn, config, target))
    return before, await inspect_schema(url)


async def prepare(url: str, *, auto_migrate: bool) -> tuple[SchemaState, SchemaState]:
    """Before serving: an empty database is created at the head; the head is accepted;
    an older schema is migrated when ``auto_migrate``, else refused; a newer one is
    always refused (``SchemaMismatch``, one line). The states before and after."""
    state = await inspect_schema(url)
    verdict = state.verdict(known_revisions())
    if verdict == "current":
        return state, state
    if verdict == "empty" or (verdict == "older" and auto_migrate):
        return await migrate(url)
    refusal = state.refusal(known_revisions(), parse_database_url(url).display())
    assert refusal is not None  # older without auto_migrate, or newer
    raise refusal


__all__ = ["HEAD", "inspect_schema", "known_revisions", "migrate", "prepare", "script_head"]
