"""Shared fixtures: a database per test on SQLite and PostgreSQL, and no network."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

# Every copy the reducer and the store make is validated in tests (engine.frozen), in
# this process and in the processes tests start; set before engine is imported.
os.environ["OPSLOOP_STRICT_COPIES"] = "1"

from engine.store import Store, open_store

PG_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection that leaves this machine (no Slack, no Anthropic in tests)."""
    real = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and host not in _LOOPBACK:
            raise RuntimeError(f"tests must not reach the network ({host})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


async def _pg_admin() -> asyncpg.Connection:
    dsn = PG_URL.replace("postgresql+asyncpg://", "postgresql://")
    try:
        return await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL unreachable at {PG_URL} in CI: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_URL}: {exc}")


@contextlib.asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A fresh schema in the test database, dropped afterwards; yields its URL."""
    admin = await _pg_admin()
    schema = f"opsloop_t_{uuid.uuid4().hex[:12]}"
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}schema={schema}"
    finally:
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with pg_schema() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'opsloop.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def db_url(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[str]:
    """Each test using it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'opsloop.db'}"
        return
    async with pg_schema() as url:
        yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = await open_store(db_url)
    try:
        yield s
    finally:
        await s.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collect what the run left for the garbage collector while an open loop is current.

    An aiosqlite connection finalised after the last test's loop closed posts its
    close to that dead loop from its worker thread, which then raises (seen once in CI,
    not reproduced: every test's own connections were found closed). Here such a
    finaliser posts to a live loop, and its thread is waited for.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        gc.collect()
        loop.run_until_complete(asyncio.sleep(0))
        for thread in threading.enumerate():
            if "_connection_worker_thread" in thread.name:
                thread.join(timeout=2)
                loop.run_until_complete(asyncio.sleep(0))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
