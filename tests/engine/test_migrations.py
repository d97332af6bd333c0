"""Alembic migrations: the head is what the store creates, a database made before
migrations is the baseline, and a schema this release does not run against is refused."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

from engine.db import create_engine, parse_database_url
from engine.events import UserMessage
from engine.migrations import inspect_schema, known_revisions, migrate, prepare, script_head
from engine.schema import BASELINE, HEAD, SchemaMismatch
from engine.store import ThreadKey, open_store
from tests.support.legacy import make_legacy_database, run_sql


async def _schema_diff(url: str) -> list[object]:
    """What differs between the database and the SQLModel tables (autogenerate's view)."""
    engine = create_engine(parse_database_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), SQLModel.metadata)
            )
    finally:
        await engine.dispose()


def test_head_is_the_last_migration() -> None:
    assert script_head() == HEAD
    assert {BASELINE, HEAD} <= known_revisions()


async def test_migrations_build_exactly_the_tables_the_store_declares(db_url: str) -> None:
    before, after = await migrate(db_url)
    assert before.revision is None
    assert after.revision == HEAD and after.stamped
    assert await _schema_diff(db_url) == []  # a table change without a migration fails here


async def test_a_new_database_is_created_at_the_head_by_the_store(db_url: str) -> None:
    store = await open_store(db_url)
    await store.close()
    state = await inspect_schema(db_url)
    assert (state.revision, state.stamped) == (HEAD, True)
    assert await _schema_diff(db_url) == []
    await prepare(db_url, auto_migrate=False)  # serve accepts it


async def test_a_database_from_before_migrations_is_the_baseline_and_upgrades(
    db_url: str,
) -> None:
    await make_legacy_database(db_url)
    state = await inspect_schema(db_url)
    assert (state.revision, state.stamped) == (BASELINE, False)

    with pytest.raises(SchemaMismatch) as refused:
        await prepare(db_url, auto_migrate=False)
    assert "older" in str(refused.value) and "opsloop migrate" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert (await inspect_schema(db_url)).stamped is False  # refusing changes nothing

    before, after = await migrate(db_url)
    assert before.revision == BASELINE and after.revision == HEAD
    assert await _schema_diff(db_url) == []

    store = await open_store(db_url)
    try:
        [old] = await store.select_events("thr_old")
        assert isinstance(old, UserMessage) and old.text == "deploy api"
        assert (await store.load("thr_old")).last_seq == 1
        _, done = await store.append_input(
            ThreadKey("T1", "C2", "2.0"),
            lambda _s: [UserMessage(actor="U1", text="hi")],
        )
        assert done.events[0].seq == 1
    finally:
        await store.close()


async def test_auto_migrate_upgrades_an_older_schema_at_start(db_url: str) -> None:
    await make_legacy_database(db_url)
    before, after = await prepare(db_url, auto_migrate=True)
    assert before.revision == BASELINE
    assert (after.revision, after.stamped) == (HEAD, True)


async def test_a_schema_newer_than_this_release_is_refused_even_with_auto_migrate(
    db_url: str,
) -> None:
    await migrate(db_url)
    await run_sql(db_url, "UPDATE alembic_version SET version_num = '9999_future'")
    for auto in (False, True):
        with pytest.raises(SchemaMismatch, match=r"9999_future.*does not know"):
            await prepare(db_url, auto_migrate=auto)
    with pytest.raises(SchemaMismatch):
        await migrate(db_url)
    assert (await inspect_schema(db_url)).revision == "9999_future"


async def test_two_processes_migrating_at_once_both_end_at_the_head(db_url: str) -> None:
    await make_legacy_database(db_url)
    results = await asyncio.gather(migrate(db_url), migrate(db_url))
    assert {after.revision for _, after in results} == {HEAD}
    assert await _schema_diff(db_url) == []


async def test_the_workers_revision_upgrades_a_database_a_newer_store_already_opened(
    db_url: str,
) -> None:
    """0002 -> 0003 adds ``workers``; a command of this release that opened the 0002
    database first (creating the table) does not make the migration fail."""
    await migrate(db_url, "0002")
    store = await open_store(db_url)  # not serve: no schema check, creates what is missing
    await store.close()
    assert (await inspect_schema(db_url)).revision == "0002"
    with pytest.raises(SchemaMismatch, match="older"):
        await prepare(db_url, auto_migrate=False)
    before, after = await migrate(db_url)
    assert (before.revision, after.revision) == ("0002", HEAD)
    assert await _schema_diff(db_url) == []


async def _decisions_index(url: str) -> str | None:
    """The decisions index's definition as the database holds it, or None."""
    engine = create_engine(parse_database_url(url))
    sql = (
        # This test's schema only: other tests' schemas (xdist workers) hold the index too.
        "SELECT indexdef FROM pg_indexes"
        " WHERE indexname = 'ix_events_decisions' AND schemaname = current_schema()"
        if engine.dialect.name == "postgresql"
        else "SELECT sql FROM sqlite_master WHERE name = 'ix_events_decisions'"
    )
    try:
        async with engine.connect() as conn:
            return (await conn.execute(sa.text(sql))).scalar()
    finally:
        await engine.dispose()


async def test_the_decisions_revision_builds_the_partial_index_even_if_a_store_made_it(
    db_url: str,
) -> None:
    """0003 -> 0004 adds ``ix_events_decisions`` (only decision rows, by actor); a store of
    this release opened on the 0003 database first (SQLite creates missing indexes) does
    not make the migration fail."""
    await migrate(db_url, "0003")
    assert await _decisions_index(db_url) is None
    store = await open_store(db_url)
    await store.close()
    before, after = await migrate(db_url)
    assert (before.revision, after.revision) == ("0003", HEAD)
    index = await _decisions_index(db_url)
    assert index is not None and "(actor, created_at)" in index
    assert "approval_granted" in index and "reconcile_decided" in index  # partial
    assert await _schema_diff(db_url) == []


async def test_the_mcp_oauth_revision_adds_its_table_even_if_a_store_made_it(db_url: str) -> None:
    """0006 -> 0007 adds ``mcp_oauth``; a command of this release that opened the 0006
    database first (creating the table) does not make the migration fail."""
    await migrate(db_url, "0006")
    assert "mcp_oauth" not in await _tables(db_url)
    store = await open_store(db_url)  # not serve: creates what is missing
    await store.close()
    before, after = await migrate(db_url)
    assert (before.revision, after.revision) == ("0006", HEAD)
    assert await _schema_diff(db_url) == []
    assert "mcp_oauth" in await _tables(db_url)


async def _tables(url: str) -> set[str]:
    engine = create_engine(parse_database_url(url))
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: sa.inspect(c).get_table_names()))
    finally:
        await engine.dispose()
