"""The OAuth that ``opsloop serve`` keeps for MCP servers, as other commands see it.

``opsloop doctor`` and ``opsloop tools`` connect to the servers themselves: with the
tokens serve keeps in the database (read, never written: what they get stays in
memory), and never asking for an authorization (that would replace the link an admin
holds). ``authorization_link`` is what ``doctor`` shows an admin.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable

from engine.db import parse_database_url
from engine.errors import StoreUnavailable
from engine.store import Store, open_store
from tools.mcp.auth import MemoryRecords, ReadingRecords, pending_link
from tools.mcp.config import McpServerConfig
from tools.mcp.source import McpSource


def _no_file(database_url: str) -> bool:
    """A SQLite file that is not there (opening it would make it)."""
    config = parse_database_url(database_url)
    path = config.url.database or ""
    return config.dialect == "sqlite" and path != ":memory:" and not os.path.exists(path)


async def _open(database_url: str) -> Store | None:
    """The database, if it is there to read."""
    if _no_file(database_url):
        return None
    try:
        return await open_store(database_url, create=False)
    except StoreUnavailable:
        return None


@contextlib.asynccontextmanager
async def stored_oauth(
    database_url: str | None, servers: Iterable[McpSource]
) -> AsyncIterator[Store | None]:
    """For the duration: each of ``servers`` with ``auth:`` uses the tokens the database
    holds (read only). Yields the store (None: no database to read, or no server needs it)."""
    wanted = [s for s in servers if s.server.auth is not None]
    store = await _open(database_url) if wanted and database_url else None
    records = ReadingRecords(store if store is not None else MemoryRecords())
    for server in wanted:
        server.keep_oauth_in(records)
    try:
        yield store
    finally:
        if store is not None:
            await store.close()


async def authorization_link(store: Store | None, name: str, server: McpServerConfig) -> str | None:
    """The link an admin opens to authorize opsloop for ``server``, while serve asks."""
    if store is None or server.auth is None:
        return None
    try:
        return await pending_link(store, name, server)
    except Exception:  # an older schema without mcp_oauth: `doctor`'s database line says so
        return None
