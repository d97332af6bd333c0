"""The event store: threads, their append-only logs, snapshots and leases.

``Store`` is the port (``engine.store.base``); ``open_store(url)`` gives the whole
backend for the URL's dialect, connected: ``engine.store.sqlite`` or
``engine.store.postgres``. The value types live in ``engine.types`` and are re-exported
here for callers that already name them from this package.
"""

from __future__ import annotations

from engine.db import create_engine, parse_database_url
from engine.store.base import (
    SNAPSHOT_EVERY,
    TIMED_STATUSES,
    McpOAuthRecord,
    OnRunnable,
    Store,
    WorkerInfo,
    new_thread_id,
)
from engine.store.postgres import PostgresStore
from engine.store.sqlite import SqliteStore
from engine.types import Appended, ThreadInfo, ThreadKey


def store_for(url: str, *, pool_size: int = 10, origin: str | None = None) -> Store:
    """The backend for ``url``'s dialect, built without connecting (``ConfigError`` for a
    URL that is not one of ours)."""
    config = parse_database_url(url)
    backend = PostgresStore if config.dialect == "postgresql" else SqliteStore
    return backend(create_engine(config), config, pool_size=pool_size, origin=origin)


async def open_store(
    url: str, *, create: bool = True, pool_size: int = 10, origin: str | None = None
) -> Store:
    """The backend for ``url``, connected (as DBOS's ``SystemDatabase.create``): missing
    tables created, or with ``create=False`` only reached. Unreachable:
    ``StoreUnavailable``."""
    store = store_for(url, pool_size=pool_size, origin=origin)
    try:
        if create:
            await store.create_tables()
        else:
            await store.ping()
    except BaseException:
        await store.close()
        raise
    return store


__all__ = [
    "SNAPSHOT_EVERY",
    "TIMED_STATUSES",
    "Appended",
    "McpOAuthRecord",
    "OnRunnable",
    "Store",
    "ThreadInfo",
    "ThreadKey",
    "WorkerInfo",
    "new_thread_id",
    "open_store",
    "store_for",
]
