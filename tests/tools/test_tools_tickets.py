"""create_ticket: idempotent inserts into a SQLite tickets table."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from engine.config import load_settings
from tools import RetryableToolError, ToolContext, builtin
from tools.builtin import tickets
from tools.builtin._dburl import to_async_url
from tools.builtin.tickets import (
    CreateTicketArgs,
    create_ticket,
    dispose_ticket_engines,
    tickets_url,
)


def ctx(key: str, requester: str | None = "U123") -> ToolContext:
    return ToolContext(
        thread_id="thread-1",
        tool_call_id="call-1",
        idempotency_key=key,
        attempt=1,
        requester=requester,
    )


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tickets.db"
    monkeypatch.setattr(tickets, "_url", tickets.DEFAULT_URL)  # restored afterwards
    tickets.configure(load_settings({"OPSLOOP_TICKETS_URL": f"sqlite:///{path}"}).tool)
    return path


def rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT id, idempotency_key, thread_id, title, body, priority, requester"
            " FROM tickets ORDER BY id"
        ).fetchall()


@pytest.mark.asyncio
async def test_same_key_creates_one_ticket(db: Path) -> None:
    args = CreateTicketArgs(title="Printer on fire", body="3rd floor", priority="urgent")
    try:
        first = await create_ticket(args, ctx("key-1"))
        again = await create_ticket(CreateTicketArgs(title="changed"), ctx("key-1"))
    finally:
        await dispose_ticket_engines()
    assert first == {
        "ticket": "TCK-1",
        "title": "Printer on fire",
        "priority": "urgent",
        "created": True,
    }
    assert again == {**first, "created": False}  # the stored ticket, not the new args
    assert rows(db) == [(1, "key-1", "thread-1", "Printer on fire", "3rd floor", "urgent", "U123")]


@pytest.mark.asyncio
async def test_different_keys_create_two_tickets(db: Path) -> None:
    try:
        a = await create_ticket(CreateTicketArgs(title="A"), ctx("a", requester=None))
        b = await create_ticket(CreateTicketArgs(title="B", priority="low"), ctx("b"))
    finally:
        await dispose_ticket_engines()
    assert (a["ticket"], a["created"]) == ("TCK-1", True)
    assert (b["ticket"], b["priority"], b["created"]) == ("TCK-2", "low", True)
    assert [(r[1], r[3], r[6]) for r in rows(db)] == [("a", "A", None), ("b", "B", "U123")]


@pytest.mark.asyncio
async def test_concurrent_same_key_inserts_once(db: Path) -> None:
    args = CreateTicketArgs(title="Race")
    try:
        results = await asyncio.gather(*(create_ticket(args, ctx("race")) for _ in range(5)))
    finally:
        await dispose_ticket_engines()
    assert sorted(r["created"] for r in results) == [False] * 4 + [True]
    assert {r["ticket"] for r in results} == {"TCK-1"}
    assert len(rows(db)) == 1


@pytest.mark.asyncio
async def test_unique_violation_falls_back_to_existing(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        await create_ticket(CreateTicketArgs(title="Original"), ctx("dup"))
        real_find = tickets._find
        calls = 0

        async def stale_find(engine, key):  # first lookup misses, as in a lost race
            nonlocal calls
            calls += 1
            return None if calls == 1 else await real_find(engine, key)

        monkeypatch.setattr(tickets, "_find", stale_find)
        out = await create_ticket(CreateTicketArgs(title="Retry"), ctx("dup"))
    finally:
        await dispose_ticket_engines()
    assert calls == 2
    assert out == {"ticket": "TCK-1", "title": "Original", "priority": "normal", "created": False}
    assert len(rows(db)) == 1


@pytest.mark.asyncio
async def test_unreachable_database_is_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tickets, "_url", f"sqlite:///{tmp_path}/missing/dir/t.db")
    before = set(threading.enumerate())
    try:
        with pytest.raises(RetryableToolError, match="ticket database unavailable"):
            await create_ticket(CreateTicketArgs(title="x"), ctx("k"))
    finally:
        await dispose_ticket_engines()
    # aiosqlite stops a connection that failed to open without awaiting it: its worker
    # thread must post its last callback while this test's loop is open, or it raises
    # "Event loop is closed" later (the CI failure of session 1).
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=5)
    await asyncio.sleep(0)


def test_url_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPSLOOP_TICKETS_URL, else DATABASE_URL, else a local file: chosen by the settings
    and handed over by ``configure``; the module reads no environment."""
    monkeypatch.setattr(tickets, "_url", tickets.DEFAULT_URL)
    monkeypatch.setenv("OPSLOOP_TICKETS_URL", "sqlite:///not-read.db")
    assert tickets_url() == "sqlite:///opsloop.db"
    for env, url in [
        ({}, "sqlite:///opsloop.db"),
        ({"DATABASE_URL": "postgres://u@h/db"}, "postgres://u@h/db"),
        (
            {"DATABASE_URL": "postgres://u@h/db", "OPSLOOP_TICKETS_URL": "sqlite:///t.db"},
            "sqlite:///t.db",
        ),
    ]:
        builtin.configure(load_settings(env).tool)  # as the loader does
        assert tickets_url() == url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///a.db", "sqlite+aiosqlite:///a.db"),
        ("sqlite+aiosqlite:////abs/a.db", "sqlite+aiosqlite:////abs/a.db"),
        ("postgresql://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgres://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_to_async_url(given: str, expected: str) -> None:
    assert to_async_url(given) == expected


def test_args_validation() -> None:
    with pytest.raises(ValueError):
        CreateTicketArgs(title="")
    with pytest.raises(ValueError):
        CreateTicketArgs(title="x" * 201)
    with pytest.raises(ValueError):
        CreateTicketArgs(title="x", priority="critical")
    assert create_ticket.policy == "approve_before_run"
