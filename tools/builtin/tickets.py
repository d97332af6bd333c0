"""create_ticket: an idempotent ticket insert into a SQL ``tickets`` table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from tools.builtin._engines import EngineCache
from tools.context import ToolContext
from tools.errors import RetryableToolError
from tools.registry import tool

if TYPE_CHECKING:  # imported lazily: sqlalchemy.ext.asyncio needs greenlet
    from sqlalchemy.ext.asyncio import AsyncEngine

DEFAULT_URL = "sqlite:///opsloop.db"

metadata = sa.MetaData()
tickets = sa.Table(
    "tickets",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("idempotency_key", sa.String(255), nullable=False, unique=True),
    sa.Column("thread_id", sa.String(255), nullable=False),
    sa.Column("title", sa.String(200), nullable=False),
    sa.Column("body", sa.Text, nullable=False, default=""),
    sa.Column("priority", sa.String(16), nullable=False),
    sa.Column("requester", sa.String(255), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


class CreateTicketArgs(BaseModel):
    """Arguments for create_ticket."""

    model_config = ConfigDict(str_strip_whitespace=True)

    title: str = Field(min_length=1, max_length=200, description="One-line summary.")
    body: str = Field(default="", description="Details, steps, links.")
    priority: Literal["low", "normal", "high", "urgent"] = "normal"


_url = DEFAULT_URL


def configure(settings: Any) -> None:
    """Take the tickets database from the tool settings (``OPSLOOP_TICKETS_URL``, which
    the settings default to ``DATABASE_URL``)."""
    global _url
    _url = settings.tickets_url or DEFAULT_URL


def tickets_url() -> str:
    """The configured tickets database, else a local SQLite file."""
    return _url


_ENGINES = EngineCache(metadata, "create_ticket")
_engine_for = _ENGINES.get


async def dispose_ticket_engines() -> None:
    """Close every cached engine (for tests and shutdown)."""
    await _ENGINES.dispose()


close = dispose_ticket_engines  # the loader's shutdown hook


async def _find(engine: AsyncEngine, key: str) -> sa.Row | None:
    async with engine.connect() as conn:
        result = await conn.execute(sa.select(tickets).where(tickets.c.idempotency_key == key))
        return result.first()


def _result(row: sa.Row, created: bool) -> dict:
    return {
        "ticket": f"TCK-{row.id}",
        "title": row.title,
        "priority": row.priority,
        "created": created,
    }


async def insert_ticket(url: str, args: CreateTicketArgs, ctx: ToolContext) -> dict:
    """Insert once per idempotency key; return the existing row on repeats."""
    engine = await _engine_for(url)
    key = ctx.idempotency_key
    row = await _find(engine, key)
    if row is not None:
        return _result(row, created=False)
    values = {
        "idempotency_key": key,
        "thread_id": ctx.thread_id,
        "title": args.title,
        "body": args.body,
        "priority": args.priority,
        "requester": ctx.requester,
        "created_at": datetime.now(UTC),
    }
    try:
        async with engine.begin() as conn:
            result = await conn.execute(sa.insert(tickets).values(**values))
            inserted = result.inserted_primary_key
            new_id = inserted[0] if inserted is not None else None
    except IntegrityError:
        row = await _find(engine, key)  # lost a race with a concurrent retry
        if row is None:
            raise
        return _result(row, created=False)
    return {
        "ticket": f"TCK-{new_id}",
        "title": args.title,
        "priority": args.priority,
        "created": True,
    }


@tool(policy="approve_before_run")
async def create_ticket(args: CreateTicketArgs, ctx: ToolContext) -> dict:
    """Open a ticket in the team's ticket queue.

    Give a short title, an optional body with details, and a priority
    (low, normal, high or urgent). Returns the ticket id, e.g. TCK-42.
    """
    try:
        return await insert_ticket(tickets_url(), args, ctx)
    except (OperationalError, InterfaceError, OSError) as exc:
        raise RetryableToolError(
            f"ticket database unavailable: {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc
