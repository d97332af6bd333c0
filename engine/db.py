"""Database URLs, and the SQLAlchemy engine the store creates its tables with.

The store's verbs run on each backend's own driver connections (``engine.store.sqlite``,
``engine.store.postgres``); this engine serves table creation and people (tests, a
repair) who want to run SQL by hand. ``DATABASE_URL`` may be written the way people write it (``sqlite:///opsloop.db``,
``postgresql://user@host/db``); we pick the async driver. A PostgreSQL URL may carry
``?schema=NAME`` to keep opsloop's tables in that schema (shared databases, tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from engine.errors import ConfigError

DEFAULT_DATABASE_URL = "sqlite:///opsloop.db"

_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
}


@dataclass(frozen=True)
class DatabaseConfig:
    url: sa.URL
    schema: str | None

    @property
    def dialect(self) -> str:
        return self.url.get_backend_name()

    def display(self) -> str:
        """The URL with any password hidden, for logs and errors."""
        return self.url.render_as_string(hide_password=True)


def parse_database_url(raw: str) -> DatabaseConfig:
    """Validate ``raw`` and map it onto an async driver; ``ConfigError`` in one line."""
    try:
        url = make_url(raw.strip())
    except ArgumentError as exc:
        raise ConfigError(f"DATABASE_URL is not a database URL: {raw!r}") from exc
    driver = _DRIVERS.get(url.drivername)
    if driver is None:
        raise ConfigError(
            f"DATABASE_URL scheme {url.drivername!r} is not supported "
            "(use sqlite:///path.db or postgresql://user@host/db)"
        )
    url = url.set(drivername=driver)
    schema = url.query.get("schema")
    if isinstance(schema, tuple):
        schema = schema[-1]
    url = url.difference_update_query(["schema"])
    if driver.startswith("sqlite") and not url.database:
        raise ConfigError("DATABASE_URL for SQLite needs a file: sqlite:///path.db")
    return DatabaseConfig(url=url, schema=schema or None)


def create_engine(config: DatabaseConfig, *, pool_size: int = 10) -> AsyncEngine:
    if config.dialect == "sqlite":
        return _sqlite_engine(config)
    connect_args: dict[str, Any] = {"timeout": 10}
    if config.schema:
        connect_args["server_settings"] = {"search_path": config.schema}
    # The store's verbs have their own asyncpg pool of ``pool_size``
    # (engine/store/postgres.py); this one creates tables, so it can be small.
    return create_async_engine(
        config.url,
        pool_size=1,
        max_overflow=2,
        # No pre-ping: it costs three round trips per checkout on asyncpg. A dropped
        # connection fails one transaction (nothing half-written); it is retried.
        pool_pre_ping=False,
        pool_recycle=1800,
        connect_args=connect_args,
    )


def _sqlite_engine(config: DatabaseConfig) -> AsyncEngine:
    engine = create_async_engine(config.url, connect_args={"timeout": 30})

    @sa.event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # We issue BEGIN ourselves (below); the driver's implicit one would be DEFERRED.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @sa.event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # IMMEDIATE takes the write lock up front, so two processes never deadlock
        # upgrading read locks (SQLITE_BUSY that no busy_timeout can wait out). A
        # connection marked read-only never writes, so it reads a WAL snapshot with no
        # lock and never waits for a writer.
        if conn.get_execution_options().get("opsloop_read_only"):
            conn.exec_driver_sql("BEGIN DEFERRED")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, on both backends (SQLite stores naive text)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
