"""SQLite hot paths in one hop each: appends, new threads and lease updates.

Through the async driver every statement is a hand-over to the connection's thread
and back to the event loop, and under load each hand-over waits behind the loop's
other work. SQLite has one writer at a time, so a transaction of five statements held
the write lock for five of those waits, and every writer queued behind it. Here one
thread owns one plain ``sqlite3`` connection and runs a whole transaction per call:
BEGIN IMMEDIATE, the guarded UPDATE, the INSERT and COMMIT in one hand-over. Appends
that arrive while one is being written go together in the next transaction (a group
commit: one lock, one fsync); each keeps its own outcome. Semantics are those of
``Store.insert_events``.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal, TypeVar

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
DEDUPE_SQL = "SELECT 1 FROM events WHERE thread_id = ? AND dedupe_key = ?"

# What became of one append: written; the thread had moved on (or, for a new thread,
# someone created it first); or an input with its dedupe key was stored already.
Outcome = Literal["done", "moved", "duplicate"]


@dataclass
class _Append:
    thread_id: str
    moved: tuple[Any, ...]
    events: list[tuple[Any, ...]]
    keys: list[str]
    create: tuple[str, str, str, str | None] | None  # team, channel, root_ts, now
    future: asyncio.Future[Outcome]


def sql_time(value: datetime | None) -> str | None:
    """A datetime as SQLAlchemy stores it in SQLite: naive UTC text."""
    if value is None:
        return None
    naive = value.astimezone(UTC).replace(tzinfo=None)
    return naive.isoformat(sep=" ", timespec="microseconds")


class Writer:
    """One connection on one thread; ``close`` finishes what was queued. Safe to use
    from several event loops (each call's answer goes back to its own loop)."""

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._timeout = timeout
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="opsloop-sqlite-writer")
        self._conn: sqlite3.Connection | None = None
        # Lookups on a connection of their own (WAL: they never wait for the writer), so
        # they do not queue behind a burst of writes.
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="opsloop-sqlite-reader")
        self._read_conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._pending: list[_Append] = []
        self._draining = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        # The same settings as the engine's connections (engine/db.py).
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    async def find_thread(self, team: str, channel: str, root_ts: str) -> str | None:
        """The id of the thread at (team, channel, root_ts), if there is one."""

        def find() -> str | None:
            if self._read_conn is None:
                self._read_conn = self._open()
            row = self._read_conn.execute(FIND_THREAD_SQL, (team, channel, root_ts)).fetchone()
            return None if row is None else str(row[0])

        return await asyncio.get_running_loop().run_in_executor(self._reader, find)

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
        *,
        create: tuple[str, str, str] | None = None,
    ) -> Outcome:
        """Append ``rows`` after ``expected_seq``. ``create`` (team, channel, root_ts):
        the thread is new and is inserted with ``thread_id`` in the same transaction
        ("moved" if a thread already lives there)."""
        item = _Append(
            thread_id=thread_id,
            moved=(
                state.last_seq,
                state.status,
                sql_time(state.wake_at),
                state.requester,
                sql_time(now),
                thread_id,
                expected_seq,
            ),
            events=[
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
            ],
            keys=[r["dedupe_key"] for r in rows if r["dedupe_key"]],
            create=(*create, sql_time(now)) if create else None,
            future=asyncio.get_running_loop().create_future(),
        )
        with self._lock:
            self._pending.append(item)
            start = not self._draining
            self._draining = True
        if start:
            self._thread.submit(self._drain)
        return await item.future

    # --- on the writer thread ----------------------------------------------------------

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._draining = False
                    return
            outcomes: list[Outcome | BaseException]
            try:
                outcomes = list(self._transaction(partial(_apply_all, batch=batch)))
            except BaseException as exc:
                # One bad append must not fail the others: each alone, in its own.
                if len(batch) == 1:
                    outcomes = [exc]
                else:
                    outcomes = [self._alone(a) for a in batch]
            for item, outcome in zip(batch, outcomes, strict=True):
                item.future.get_loop().call_soon_threadsafe(_settle, item.future, outcome)

    def _alone(self, item: _Append) -> Outcome | BaseException:
        try:
            return self._transaction(lambda c: _apply(c, item))
        except BaseException as exc:
            return exc

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

        def shut_reader() -> None:
            if self._read_conn is not None:
                self._read_conn.close()
                self._read_conn = None

        loop = asyncio.get_running_loop()
        try:
            await self._call(shut)
            await loop.run_in_executor(self._reader, shut_reader)
        finally:
            self._thread.shutdown(wait=True)
            self._reader.shutdown(wait=True)


# One writer per database file in a process: the serving loop's store and the worker's
# would otherwise meet in SQLite's busy handler, which sleeps up to 100 ms per try.
_SHARED: dict[str, tuple[Writer, int]] = {}
_SHARED_LOCK = threading.Lock()


def shared_writer(path: str) -> Writer:
    """This process's writer for the file at ``path`` (``release`` it when done)."""
    key = os.path.abspath(path)
    with _SHARED_LOCK:
        writer, users = _SHARED.get(key, (None, 0))
        if writer is None:
            writer = Writer(key)
        _SHARED[key] = (writer, users + 1)
        return writer


async def release(writer: Writer) -> None:
    """One user fewer; the last one closes it."""
    with _SHARED_LOCK:
        writer_, users = _SHARED.get(writer.path, (None, 0))
        last = writer_ is writer and users <= 1
        if last:
            del _SHARED[writer.path]
        elif writer_ is writer:
            _SHARED[writer.path] = (writer, users - 1)
    if last or writer_ is not writer:
        await writer.close()


def _apply(conn: sqlite3.Connection, item: _Append) -> Outcome:
    """One append inside the batch's transaction. Checked before anything is written, so
    an append that cannot go in leaves nothing behind (no statement fails half-way:
    this connection is the only writer while the transaction lasts)."""
    if item.create is not None:
        team, channel, root_ts, when = item.create
        conn.execute(CREATE_THREAD_SQL, (item.thread_id, team, channel, root_ts, when, when))
        found = conn.execute(FIND_THREAD_SQL, (team, channel, root_ts)).fetchone()
        if found[0] != item.thread_id:
            return "moved"
    for key in item.keys:
        if conn.execute(DEDUPE_SQL, (item.thread_id, key)).fetchone() is not None:
            return "duplicate"
    if conn.execute(APPEND_SQL, item.moved).rowcount != 1:
        return "moved"
    conn.executemany(INSERT_SQL, item.events)
    return "done"


def _apply_all(conn: sqlite3.Connection, batch: list[_Append]) -> list[Outcome]:
    return [_apply(conn, item) for item in batch]


def _settle(future: asyncio.Future[Outcome], outcome: Outcome | BaseException) -> None:
    if future.done():  # the caller was cancelled; the outcome stands in the database
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


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
WAKE_SQL = "UPDATE threads SET wake_at = ?3 WHERE id = ?1 AND last_seq = ?2"
