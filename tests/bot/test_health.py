"""GET /healthz (and the placeholder Slack endpoint) through aiohttp's test client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot import health
from engine.store import open_store, store_for

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


@asynccontextmanager
async def client_for(app: web.Application) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(app)) as client:
        yield client


async def test_healthz_ok_when_the_database_answers(sqlite_url: str) -> None:
    store = await open_store(sqlite_url)
    try:
        async with client_for(health.make_health_app(store)) as client:
            resp = await client.get("/healthz")
            assert resp.status == 200
            assert await resp.json() == {"status": "ok"}
    finally:
        await store.close()


async def test_healthz_503_when_the_database_is_unreachable() -> None:
    store = store_for(UNREACHABLE)  # built without connecting
    try:
        async with client_for(health.make_health_app(store)) as client:
            resp = await client.get("/healthz")
            assert resp.status == 503
            assert await resp.json() == {"status": "unavailable"}
    finally:
        await store.close()


class _HangingStore:
    """A database that never answers: the check must not hang with it."""

    async def ping(self) -> None:
        await asyncio.sleep(30)


async def test_healthz_503_when_the_database_hangs(monkeypatch) -> None:
    monkeypatch.setattr(health, "PING_TIMEOUT_S", 0.05)
    app = health.make_health_app(_HangingStore())  # type: ignore[arg-type]
    async with client_for(app) as client:
        resp = await asyncio.wait_for(client.get("/healthz"), timeout=5)
        assert resp.status == 503
        assert await resp.json() == {"status": "unavailable"}
