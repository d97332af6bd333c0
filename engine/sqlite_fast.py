"""SQLite hot paths in one hop each: appends, new threads and lease updates.

Through the async driver every statement is a hand-over to the connection's thread
and back to the event loop, and under load each hand-over waits behind the loop's
other work. SQLite has one writer at a time, so a transaction of five statements held
the write lock for five of those waits, and every writer queued behind it. Here one
thread owns one plain ``sqlite3`` connection and runs a whole transaction per call:
BEGIN IMMEDIATE, the guarded UPDATE, the INSERT and COMMIT in one hand-over. Calls
queue on that thread in order. Semantics are those of ``Store.insert_events``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from engine.state import ThreadState

T = TypeVar("T")

APPEND_SQL = """
UPDATE threads SET last_seq = ?, status = ?, wake_at = ?, requester = ?, updated_at = ?
WHERE id = ? AND last_seq = ?
"""
INSERT_SQL = """
INSERT INTO events (thread_id, seq, event_id, type, actor, created_at, dedupe_key, payload)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""
CREATE_THREAD_SQL = """
INSERT OR IGNORE INTO threads
    (id, team, channel, root_ts, status, last_seq, created_at, updated_at)
VALUES (?, ?, ?, ?, 'new', 0, ?, ?)
"""
FIND_THREAD_SQL = "SELECT id FROM threads WHERE team = ? AND channel = ? AND root_ts = ?"


def sql_time(value: datetime | None) -> str | None:
    """A datetime as SQLAlchemy stores it in SQLite: naive UTC text."""
    if value is None:
        return None
    naive = value.astimezone(UTC).replace(tzinfo=None)
    return naive.isoformat(sep=" ", timespec="microseconds")


class Writer:
    """One connection on one thread; ``close`` finishes what was queued."""

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self._path = path
        self._timeout = timeout
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="opsloop-sqlite-writer")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self._path, timeout=self._timeout, isolation_level=None, check_same_thread=False
            )
            # The same settings as the engine's connections (engine/db.py).
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            conn.execute("PRAGMA foreign_keys=ON")
            self._conn = conn
        return self._conn

    def _transaction(self, body: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def append(
        self,
        thread_id: str,
        expected_seq: int,
        rows: Sequence[dict[str, Any]],
        state: ThreadState,
        now: datetime,
    ) -> bool:
        """Append in one transaction; False if the thread had moved on (nothing written).
        A stored dedupe key raises ``sqlite3.IntegrityError`` (nothing written)."""
        moved = (
            state.last_seq,
            state.status,
            sql_time(state.wake_at),
            state.requester,
            sql_time(now),
            thread_id,
            expected_seq,
        )
        events = [
            (
                r["thread_id"],
                r["seq"],
                r["event_id"],
                r["type"],
                r["actor"],
                sql_time(r["created_at"]),
                r["dedupe_key"],
                r["payload"],
            )
            for r in rows
        ]

        def body(conn: sqlite3.Connection) -> bool:
            if conn.execute(APPEND_SQL, moved).rowcount != 1:
                return False
            conn.executemany(INSERT_SQL, events)
            return True

        return await self._call(self._transaction, body)

    async def create_thread(
        self, new_id: str, team: str, channel: str, root_ts: str, now: datetime
    ) -> str:
        """The id of the thread at (team, channel, root_ts), inserting ``new_id`` if new."""
        when = sql_time(now)

        def body(conn: sqlite3.Connection) -> str:
            conn.execute(CREATE_THREAD_SQL, (new_id, team, channel, root_ts, when, when))
            row = conn.execute(FIND_THREAD_SQL, (team, channel, root_ts)).fetchone()
            return str(row[0])

        return await self._call(self._transaction, body)

    async def execute(self, sql: str, *args: Any) -> int:
        """One statement in its own transaction; the rows it changed."""
        params = tuple(sql_time(a) if isinstance(a, datetime) else a for a in args)
        return await self._call(self._transaction, lambda conn: conn.execute(sql, params).rowcount)

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await self._call(shut)
        finally:
            self._thread.shutdown(wait=True)


# Leases: the same predicates as the portable statements in engine/store.py, with the
# arguments in pg_fast's order (id, owner, until, now).
ACQUIRE_SQL = """
UPDATE threads SET lease_owner = ?2, lease_expires_at = ?3
WHERE id = ?1 AND (lease_owner IS NULL OR lease_owner = ?2 OR lease_expires_at < ?4)
"""
RENEW_SQL = "UPDATE threads SET lease_expires_at = ?3 WHERE id = ?1 AND lease_owner = ?2"
RELEASE_SQL = """
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ?1 AND lease_owner = ?2
"""
