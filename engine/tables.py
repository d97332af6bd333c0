"""SQLModel tables. A row is not an event: ``engine.mapper`` converts between them."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from engine.db import UTCDateTime

# The events that are a person's decision on a call (``Store.decisions_by``, the App
# Home's "Decided by me"), and the predicate of the partial index that finds them by
# actor: a handful of rows per decision, so appends of every other event never touch it.
DECISION_TYPES = ("approval_granted", "approval_rejected", "reconcile_decided")
DECIDED = sa.text("type IN ({})".format(", ".join(f"'{t}'" for t in DECISION_TYPES)))
# The events that make and end standing grants (``Store.grant_events``: a channel's
# grants), found by time through their own partial index: a few rows a day.
GRANT_TYPES = ("grant_created", "grant_revoked")
GRANTING = sa.text("type IN ({})".format(", ".join(f"'{t}'" for t in GRANT_TYPES)))
# Threads open for an alert (``alert_key`` set): a handful among all threads.
ALERTING = sa.text("alert_key IS NOT NULL")


class ThreadRow(SQLModel, table=True):
    __tablename__ = "threads"
    __table_args__ = (
        sa.UniqueConstraint("team", "channel", "root_ts", name="uq_threads_slack_key"),
        sa.Index("ix_threads_status_wake", "status", "wake_at"),
        # One open thread per alert (engine.inputs.receive_alert finds it here): two
        # deliveries of a new alert racing to open a thread meet this index, not a scan.
        sa.Index(
            "uq_threads_alert",
            "alert_key",
            unique=True,
            postgresql_where=ALERTING,
            sqlite_where=ALERTING,
        ),
    )

    id: str = Field(primary_key=True, max_length=64)
    team: str = Field(max_length=64)
    channel: str = Field(max_length=64)
    root_ts: str = Field(max_length=64)
    requester: str | None = Field(default=None, max_length=64)
    status: str = Field(default="new", max_length=32)
    last_seq: int = 0
    wake_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    lease_owner: str | None = Field(default=None, max_length=128)
    lease_expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    # The alert the thread is open for (``ThreadState.alert``), NULL once it resolves;
    # derived from the log like ``status``, in the same transaction (revision 0006).
    alert_key: str | None = Field(default=None, max_length=255)


class EventRow(SQLModel, table=True):
    __tablename__ = "events"
    __table_args__ = (
        sa.UniqueConstraint("thread_id", "dedupe_key", name="uq_events_dedupe"),
        sa.Index(
            "ix_events_decisions",
            "actor",
            "created_at",
            postgresql_where=DECIDED,
            sqlite_where=DECIDED,
        ),
        sa.Index(
            "ix_events_grants",
            "created_at",
            postgresql_where=GRANTING,
            sqlite_where=GRANTING,
        ),
    )

    thread_id: str = Field(primary_key=True, foreign_key="threads.id", max_length=64)
    seq: int = Field(primary_key=True)
    event_id: str = Field(unique=True, max_length=64)
    type: str = Field(max_length=64)
    actor: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UTCDateTime)
    dedupe_key: str | None = Field(default=None, max_length=255)
    payload: str = Field(sa_type=sa.Text)
    # The version of the type's payload schema it was written with (engine.mapper);
    # rows from before revision 0002 are 1.
    schema_version: int = Field(default=1, sa_column_kwargs={"server_default": "1"})


class SnapshotRow(SQLModel, table=True):
    """The reduced state at ``seq``, so loading a long thread reads only the tail."""

    __tablename__ = "snapshots"

    thread_id: str = Field(primary_key=True, foreign_key="threads.id", max_length=64)
    seq: int
    state: str = Field(sa_type=sa.Text)


class WorkerRow(SQLModel, table=True):
    """A process that runs threads (engine.workers): its lease owner id, where it runs,
    and its last heartbeat. Whether it lives is a lock the database or the OS releases
    when it dies (PostgreSQL advisory lock, SQLite flock), never this row's age."""

    __tablename__ = "workers"

    id: str = Field(primary_key=True, max_length=128)
    host: str = Field(max_length=255)
    pid: int
    started_at: datetime = Field(sa_type=UTCDateTime)
    heartbeat_at: datetime = Field(sa_type=UTCDateTime)


class McpOAuthRow(SQLModel, table=True):
    """OAuth of one MCP server (``auth:`` in opsloop.yaml; tools/mcp/auth.py): its tokens
    and their expiry, the client a dynamic registration made, and the authorization an
    admin was asked for (its ``state``, PKCE verifier and link) until the callback brings
    its ``code``. ``binding`` says which configuration they belong to (a changed
    ``client_id`` or URL makes them void). Every replica reads and writes the same row,
    so a token one refreshed is the others' too (revision 0007)."""

    __tablename__ = "mcp_oauth"

    server: str = Field(primary_key=True, max_length=64)
    binding: str = Field(max_length=64)
    tokens: str | None = Field(default=None, sa_type=sa.Text)  # OAuthToken as JSON
    expires_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    client_info: str | None = Field(default=None, sa_type=sa.Text)  # a registration, JSON
    pending_state: str | None = Field(default=None, max_length=255)
    pending_verifier: str | None = Field(default=None, max_length=255)
    pending_url: str | None = Field(default=None, sa_type=sa.Text)
    pending_since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    code: str | None = Field(default=None, sa_type=sa.Text)  # what the callback brought
    iss: str | None = Field(default=None, sa_type=sa.Text)
    updated_at: datetime = Field(sa_type=UTCDateTime)


THREADS: sa.Table = ThreadRow.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = EventRow.__table__  # type: ignore[attr-defined]
SNAPSHOTS: sa.Table = SnapshotRow.__table__  # type: ignore[attr-defined]
WORKERS: sa.Table = WorkerRow.__table__  # type: ignore[attr-defined]
MCP_OAUTH: sa.Table = McpOAuthRow.__table__  # type: ignore[attr-defined]
