"""A database as opsloop 0.1.0 (before migrations) left it, for the migration tests."""

from __future__ import annotations

import json

import sqlalchemy as sa

from engine.db import create_engine, parse_database_url

# What `create_tables` of release 0.1.0 (before migrations) ran: compiled from its
# SQLModel tables. TIME is DATETIME on SQLite, TIMESTAMP WITH TIME ZONE on PostgreSQL.
LEGACY_DDL = """
CREATE TABLE threads (
    id VARCHAR(64) NOT NULL, team VARCHAR(64) NOT NULL, channel VARCHAR(64) NOT NULL,
    root_ts VARCHAR(64) NOT NULL, requester VARCHAR(64), status VARCHAR(32) NOT NULL,
    last_seq INTEGER NOT NULL, wake_at {TIME}, lease_owner VARCHAR(128),
    lease_expires_at {TIME}, created_at {TIME} NOT NULL, updated_at {TIME} NOT NULL,
    PRIMARY KEY (id), CONSTRAINT uq_threads_slack_key UNIQUE (team, channel, root_ts)
);
CREATE INDEX ix_threads_status_wake ON threads (status, wake_at);
CREATE TABLE events (
    thread_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, event_id VARCHAR(64) NOT NULL,
    type VARCHAR(64) NOT NULL, actor VARCHAR(64) NOT NULL, created_at {TIME} NOT NULL,
    dedupe_key VARCHAR(255), payload TEXT NOT NULL, PRIMARY KEY (thread_id, seq),
    CONSTRAINT uq_events_dedupe UNIQUE (thread_id, dedupe_key),
    FOREIGN KEY(thread_id) REFERENCES threads (id), UNIQUE (event_id)
);
CREATE TABLE snapshots (
    thread_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL, state TEXT NOT NULL,
    PRIMARY KEY (thread_id), FOREIGN KEY(thread_id) REFERENCES threads (id)
);
"""
LEGACY_ROWS = [
    "INSERT INTO threads (id, team, channel, root_ts, requester, status, last_seq, created_at,"
    " updated_at) VALUES ('thr_old', 'T1', 'C1', '1.0', 'U1', 'running', 1,"
    " '2025-01-01 00:00:00', '2025-01-01 00:00:00')",
    "INSERT INTO events (thread_id, seq, event_id, type, actor, created_at, payload) VALUES"
    " ('thr_old', 1, 'evt_old', 'user_message', 'U1', '2025-01-01 00:00:00', :payload)",
]


async def run_sql(url: str, *statements: str, **params: object) -> None:
    engine = create_engine(parse_database_url(url))
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(sa.text(statement), params if ":" in statement else {})
    finally:
        await engine.dispose()


async def make_legacy_database(url: str) -> None:
    """A database as release 0.1.0 left it: its tables, one thread, no version table."""
    time = "DATETIME" if url.startswith("sqlite") else "TIMESTAMP WITH TIME ZONE"
    ddl = [s.strip() for s in LEGACY_DDL.format(TIME=time).split(";") if s.strip()]
    payload = json.dumps({"text": "deploy api", "source": {}})
    await run_sql(url, *ddl, *LEGACY_ROWS, payload=payload)
