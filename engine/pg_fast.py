"""PostgreSQL hot paths in one round trip each: the append of every runner step, and
the lease updates of every run.

The guarded UPDATE of the thread row and the INSERT of the events run as one statement
in autocommit: one round trip and one commit, instead of BEGIN, UPDATE, INSERT, COMMIT
through the ORM layer. Semantics are those of ``Store.insert_events``: if another writer
moved the thread first, the UPDATE matches no row, nothing is inserted, and the caller
gets a conflict. Used when the caller holds the state at ``expected_seq``; an input whose
dedupe key is stored already fails on the unique index, and nothing is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from engine.db import DatabaseConfig
from engine.state import ThreadState

APPEND_SQL = """
WITH moved AS (
    UPDATE threads
    SET last_seq = $1, status = $2, wake_at = $3, requester = $4, updated_at = $5
    WHERE id = $6 AND last_seq = $7
    RETURNING id
)
INSERT INTO events (thread_id, seq, event_id, type, actor, created_at, payload, dedupe_key)
SELECT moved.id, e.seq, e.event_id, e.type, e.actor, $5, e.payload, e.dedupe_key
FROM moved,
     unnest($8::int[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
         AS e(seq, event_id, type, actor, payload, dedupe_key)
"""


# Errors after which a connection cannot be trusted (the server side errors leave it
# usable: a unique violation, say).
BROKEN = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)


class Connections:
    """A small LIFO pool of asyncpg connections for one-statement writes.

    asyncpg's own pool resets each connection on release and shields the release in a
    task: together more than a tenth of a commit on this path. Our statements leave no
    session state, so a connection goes back as it is; one that broke is dropped.
    """

    def __init__(self, dsn: str, size: int, settings: dict[str, str] | None) -> None:
        self._dsn = dsn
        self._settings = settings
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(size)
        self._closed = False

    async def execute(self, sql: str, *args: Any) -> str:
        """Run one statement in autocommit; its status ("UPDATE 1")."""
        status: str = await self._run("execute", sql, *args)
        return status

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first value of a one-statement read."""
        return await self._run("fetchval", sql, *args)

    async def _run(self, method: str, sql: str, *args: Any) -> Any:
        """``conn.<method>(sql, *args)``; a stale idle connection is retried once."""
        for attempt in (1, 2):
            async with self._slots:
                conn = self._idle.pop() if self._idle else await self._connect()
                try:
                    result = await getattr(conn, method)(sql, *args)
                except asyncpg.PostgresError as exc:
                    if isinstance(exc, asyncpg.PostgresConnectionError):
                        conn.terminate()
                        if attempt == 1:
                            continue
                    else:
                        self._idle.append(conn)
                    raise
                except BaseException as exc:
                    conn.terminate()  # cancelled mid-statement, or the socket broke
                    if attempt == 1 and isinstance(exc, BROKEN):
                        continue
                    raise
                self._idle.append(conn)
                return result
        raise AssertionError("unreachable")

    async def _connect(self) -> asyncpg.Connection:
        if self._closed:
            raise asyncpg.InterfaceError("the store is closed")
        return await asyncpg.connect(self._dsn, server_settings=self._settings, timeout=10)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close(timeout=5)


def connections(config: DatabaseConfig, size: int) -> Connections:
    dsn = config.url.set(drivername="postgresql").render_as_string(hide_password=False)
    settings = {"search_path": config.schema} if config.schema else None
    return Connections(dsn, size, settings)


async def append(
    pool: Connections,
    thread_id: str,
    expected_seq: int,
    rows: Sequence[dict[str, Any]],
    state: ThreadState,
    now: datetime,
) -> bool:
    """Append in one statement; False if the thread had moved on (nothing written).

    Retrying after a dropped connection is safe: if the first try had committed, the
    second finds ``last_seq`` moved and reports a conflict, never a duplicate.
    """
    status = await pool.execute(
        APPEND_SQL,
        state.last_seq,
        state.status,
        state.wake_at,
        state.requester,
        now,
        thread_id,
        expected_seq,
        *_columns(rows),
    )
    return bool(status == f"INSERT 0 {len(rows)}")


CREATE_SQL = """
WITH created AS (
    INSERT INTO threads
        (id, team, channel, root_ts, status, last_seq, wake_at, requester, created_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
    ON CONFLICT (team, channel, root_ts) DO NOTHING
    RETURNING id
)
INSERT INTO events (thread_id, seq, event_id, type, actor, created_at, payload, dedupe_key)
SELECT created.id, e.seq, e.event_id, e.type, e.actor, $9, e.payload, e.dedupe_key
FROM created,
     unnest($10::int[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[])
         AS e(seq, event_id, type, actor, payload, dedupe_key)
"""


async def create_and_append(
    pool: Connections,
    where: tuple[str, str, str],
    rows: Sequence[dict[str, Any]],
    state: ThreadState,
    now: datetime,
) -> bool:
    """A new thread, already at ``state``, and its first events in one statement; False
    if a thread lives at ``where`` (team, channel, root_ts) already (nothing written)."""
    status = await pool.execute(
        CREATE_SQL,
        state.thread_id,
        *where,
        state.status,
        state.last_seq,
        state.wake_at,
        state.requester,
        now,
        *_columns(rows),
    )
    return bool(status == f"INSERT 0 {len(rows)}")


FIND_THREAD_SQL = "SELECT id FROM threads WHERE team = $1 AND channel = $2 AND root_ts = $3"


def _columns(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """The events as the arrays ``unnest`` takes, in the statements' order."""
    names = ("seq", "event_id", "type", "actor", "payload", "dedupe_key")
    return [[r[name] for r in rows] for name in names]


# Leases: the same predicates as the portable statements in engine/store.py.
ACQUIRE_SQL = """
UPDATE threads SET lease_owner = $2, lease_expires_at = $3
WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at < $4)
"""
RENEW_SQL = "UPDATE threads SET lease_expires_at = $3 WHERE id = $1 AND lease_owner = $2"
RELEASE_SQL = """
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2
"""


WAKE_SQL = "UPDATE threads SET wake_at = $3 WHERE id = $1 AND last_seq = $2"


def rows_of(status: str) -> int:
    """Rows an UPDATE touched, from asyncpg's command tag ("UPDATE 1")."""
    return int(status.rsplit(" ", 1)[-1])
