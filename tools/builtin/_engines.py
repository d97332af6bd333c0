"""Database engines of tools that keep their own tables (tickets, the demo tools).

An async engine belongs to the event loop that first used it, so the cache holds one
per URL and loop, creates the tables once, and closes them on the loop they live on
(``Runtime`` calls each module's dispose function on the worker loop at shutdown).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa

from tools.builtin._dburl import to_async_url
from tools.errors import ToolError

if TYPE_CHECKING:  # imported lazily: sqlalchemy.ext.asyncio needs greenlet
    from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass
class _Cached:
    engine: AsyncEngine
    loop: asyncio.AbstractEventLoop
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    ready: bool = False


class EngineCache:
    def __init__(self, metadata: sa.MetaData, needed_by: str) -> None:
        self._metadata = metadata
        self._needed_by = needed_by
        self._engines: dict[str, _Cached] = {}

    async def get(self, url: str) -> AsyncEngine:
        """The engine for ``url`` on this loop, with the tables created once."""
        async_url = to_async_url(url)
        loop = asyncio.get_running_loop()
        cached = self._engines.get(async_url)
        if cached is not None and cached.loop is not loop:
            # Bound to another (likely closed) loop: drop its pool without awaiting it.
            cached.engine.sync_engine.dispose(close=False)
            cached = None
        if cached is None:
            try:
                from sqlalchemy.ext.asyncio import create_async_engine
            except ImportError as exc:
                raise ToolError(
                    f"{self._needed_by} needs SQLAlchemy's asyncio support: "
                    "pip install 'sqlalchemy[asyncio]'"
                ) from exc
            cached = _Cached(engine=create_async_engine(async_url), loop=loop)
            self._engines[async_url] = cached
        if not cached.ready:
            async with cached.lock:
                if not cached.ready:
                    async with cached.engine.begin() as conn:
                        await conn.run_sync(self._metadata.create_all)
                    cached.ready = True
        return cached.engine

    async def dispose(self) -> None:
        """Close every cached engine (shutdown, tests)."""
        cached = list(self._engines.values())
        self._engines.clear()
        loop = asyncio.get_running_loop()
        for entry in cached:
            if entry.loop is loop:
                await entry.engine.dispose()
            else:
                entry.engine.sync_engine.dispose(close=False)
