"""The SQLite backend: plain ``sqlite3`` connections on threads of our own.

Through an async driver every statement is a hand-over to the connection's thread and
back to the event loop, and under load each hand-over waits behind the loop's other
work; SQLite has one writer at a time, so a transaction of five statements held the
write lock for five of those waits. Here one thread owns the one write connection and
runs a whole transaction per hand-over (BEGIN IMMEDIATE, the checks, the guarded
UPDATE, the INSERT, the snapshot, COMMIT). Appends that arrive while one is being
written go together in the next transaction (a group commit: one lock, one fsync); each
keeps its own outcome. Reads run on two reader threads with connections of their own
(WAL: they never wait for the writer). Every store of a process on one file shares
that file's writer and readers, so two components never meet in SQLite's busy
handler, which sleeps up to 100 ms per try. Statements are written once, here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar, cast

from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateIndex, CreateTable

from engine.db import DatabaseConfig
from engine.schema import HEAD, VERSION_TABLE
from engine.state import ThreadState
from engine.store.base import (
    EVENT_COLUMNS,
    THREAD_COLUMNS,
    TIMED_STATUSES,
    Duplicate,
    Log,
    Outcome,
    Row,
    Store,
)
from engine.tables import EVENTS, SNAPSHOTS, THREADS
from engine.types import ThreadKey

T = TypeVar("T")

MOVE_SQL = """
UPDATE threads SET last_seq = ?, status = ?, wake_at = ?, requester = ?, updated_at = ?
WHERE id = ? AND last_seq = ?
"""
INSERT_SQL = """
INSERT INTO events
    (thread_id, seq, event_id, type, actor, created_at, dedupe_key, payload, schema_version)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
SNAPSHOT_UPSERT_SQL = """
INSERT INTO snapshots (thread_id, seq, state) VALUES (?, ?, ?)
ON CONFLICT (thread_id) DO UPDATE SET seq = excluded.seq, state = excluded.state
"""
CREATE_THREAD_SQL = """
INSERT INTO threads (id, team, channel, root_ts, status, last_seq, created_at, updated_at)
VALUES (?, ?, ?, ?, 'new', 0, ?, ?)
ON CONFLICT (team, channel, root_ts) DO NOTHING
"""
FIND_THREAD_SQL = "SELECT id FROM threads WHERE team = ? AND channel = ? AND root_ts = ?"
THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM threads WHERE id = ?"
THREADS_AT_SQL = f"SELECT {THREAD_COLUMNS} FROM threads WHERE channel = ? AND root_ts = ?"
# ?1 a JSON list of statuses (NULL: any), ?2 channel, ?3 requester, ?4 limit.
LIST_SQL = f"""
SELECT {THREAD_COLUMNS} FROM threads
WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR channel = ?2)
  AND (?3 IS NULL OR requester = ?3)
ORDER BY updated_at DESC LIMIT ?4
"""
EVENTS_SQL = f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = ? AND seq > ? ORDER BY seq"
SNAPSHOT_SQL = "SELECT state FROM snapshots WHERE thread_id = ?"
EXISTS_SQL = "SELECT 1 FROM threads WHERE id = ?"
DEDUPE_SQL = f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = ? AND dedupe_key = ?"
# Arguments in one order for all four: (id, owner or expected_seq, until, now).
WAKE_SQL = "UPDATE threads SET wake_at = ?3 WHERE id = ?1 AND last_seq = ?2"
ACQUIRE_SQL = """
UPDATE threads SET lease_owner = ?2, lease_expires_at = ?3
WHERE id = ?1 AND (lease_owner IS NULL OR lease_owner = ?2 OR lease_expires_at < ?4)
"""
RENEW_SQL = "UPDATE threads SET lease_expires_at = ?3 WHERE id = ?1 AND lease_owner = ?2"
RELEASE_SQL = """
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ?1 AND lease_owner = ?2
"""
DUE_SQL = f"""
SELECT id FROM threads
WHERE (lease_owner IS NULL OR lease_expires_at < ?1)
  AND (status = 'running'
       OR (status IN ({", ".join(f"'{s}'" for s in TIMED_STATUSES)}) AND wake_at <= ?1))
ORDER BY updated_at LIMIT ?2
"""
READERS = 2


def sql_time(value: datetime | None) -> str | None:
    """A datetime as SQLAlchemy stores it in SQLite (the tables are its): naive UTC text,
    which sorts as time does."""
    if value is None:
        return None
    naive = value.astimezone(UTC).replace(tzinfo=None)
    return naive.isoformat(sep=" ", timespec="microseconds")


def _read_time(raw: bytes) -> datetime:
    return datetime.fromisoformat(raw.decode()).replace(tzinfo=UTC)


# Columns declared DATETIME come back aware (only our connections ask: PARSE_DECLTYPES).
sqlite3.register_converter("DATETIME", _read_time)


@dataclass
class _Append:
    thread_id: str
    moved: tuple[Any, ...]
    events: list[tuple[Any, ...]]
    keys: list[str]
    snapshot: tuple[str, int, str] | None
    create: tuple[str, str, str, str | None] | None  # team, channel, root_ts, now
    future: asyncio.Future[Outcome]


class Database:
    """One file's write thread and reader threads; ``close`` finishes what was queued.
    Safe to use from several event loops (each answer goes back to its own loop)."""

    def __init__(self, path: str, *, timeout: float = 30.0) -> None:
        self.path = path
        self._timeout = timeout
        # An in-memory database is one per name, shared by this process's connections.
        memory = path == ":memory:"
        self._target = (
            f"file:opsloop-{uuid.uuid4().hex}?mode=memory&cache=shared" if memory else path
        )
        self._uri = memory
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="opsloop-sqlite-writer")
        self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="opsloop-sqlite-reader")
        self._conn: sqlite3.Connection | None = None
        self._local = threading.local()
        self._opened: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._pending: list[_Append] = []
        self._draining = False

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._target,
            timeout=self._timeout,
            isolation_level=None,  # we issue BEGIN ourselves
            check_same_thread=False,
            detect_types=sqlite3.PARSE_DECLTYPES,
            uri=self._uri,
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
        with self._lock:
            self._opened.append(conn)
        return conn

    # --- reads, on a reader thread -----------------------------------------------------

    async def read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._readers, self._on_reader, work
        )

    def _on_reader(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connect()
        return work(conn)

    # --- writes, on the writer thread --------------------------------------------------

    async def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body`` in one transaction of its own."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self._transaction, body)

    def _transaction(self, body: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self.connect()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def append(self, item: _Append) -> Outcome:
        """Queue ``item`` for the next group commit."""
        with self._lock:
            self._pending.append(item)
            start = not self._draining
            self._draining = True
        if start:
            self._writer.submit(self._drain)
        return await item.future

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
                outcomes = [exc] if len(batch) == 1 else [self._alone(a) for a in batch]
            for item, outcome in zip(batch, outcomes, strict=True):
                item.future.get_loop().call_soon_threadsafe(_settle, item.future, outcome)

    def _alone(self, item: _Append) -> Outcome | BaseException:
        try:
            return self._transaction(lambda c: _apply(c, item))
        except BaseException as exc:
            return exc

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        try:  # what was queued is written first
            await loop.run_in_executor(None, self._writer.shutdown, True)
        finally:
            self._readers.shutdown(wait=True)
            with self._lock:
                opened, self._opened = self._opened, []
            for conn in opened:
                conn.close()


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
        if (stored := conn.execute(DEDUPE_SQL, (item.thread_id, key)).fetchone()) is not None:
            return Duplicate(stored)
    if conn.execute(MOVE_SQL, item.moved).rowcount != 1:
        return "moved"
    conn.executemany(INSERT_SQL, item.events)
    if item.snapshot is not None:
        conn.execute(SNAPSHOT_UPSERT_SQL, item.snapshot)
    return "written"


def _apply_all(conn: sqlite3.Connection, batch: list[_Append]) -> list[Outcome]:
    return [_apply(conn, item) for item in batch]


def _settle(future: asyncio.Future[Outcome], outcome: Outcome | BaseException) -> None:
    if future.done():  # the caller was cancelled; the outcome stands in the database
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


# One Database per file in a process: the serving loop's store and the worker's would
# otherwise meet in SQLite's busy handler.
_SHARED: dict[str, tuple[Database, int]] = {}
_SHARED_LOCK = threading.Lock()


def shared_database(path: str) -> Database:
    """This process's Database for the file at ``path`` (``release`` it when done)."""
    key = path if path == ":memory:" else os.path.abspath(path)
    with _SHARED_LOCK:
        db, users = _SHARED.get(key, (None, 0))
        if db is None or key == ":memory:":  # each in-memory store is its own database
            db, users = Database(key), 0
        _SHARED[key] = (db, users + 1)
        return db


async def release(db: Database) -> None:
    """One user fewer; the last one closes it."""
    with _SHARED_LOCK:
        shared, users = _SHARED.get(db.path, (None, 0))
        last = shared is not db or users <= 1
        if shared is db and users <= 1:
            del _SHARED[db.path]
        elif shared is db:
            _SHARED[db.path] = (db, users - 1)
    if last:
        await db.close()


class SqliteStore(Store):
    DOWN = (sqlite3.OperationalError, OSError)

    def __init__(self, engine: AsyncEngine, config: DatabaseConfig, *, pool_size: int = 10):
        super().__init__(engine, config)
        self._db: Database | None = shared_database(config.url.database or ":memory:")

    def _database(self) -> Database:
        if self._db is None:
            raise sqlite3.OperationalError("the store is closed")
        return self._db

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._mapped():
            return await self._database().read(work)

    async def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._mapped():
            return await self._database().write(body)

    async def _fetch(self, sql: str, *args: Any) -> list[Row]:
        return await self._read(lambda conn: conn.execute(sql, args).fetchall())

    async def _execute(self, sql: str, *args: Any) -> int:
        params = tuple(sql_time(a) if isinstance(a, datetime) else a for a in args)
        return await self._write(lambda conn: conn.execute(sql, params).rowcount)

    async def create_tables(self) -> None:
        """The tables as SQLModel describes them, compiled to SQLite's DDL and run in
        one transaction (two processes starting together: one creates, one finds). A
        new database is stamped at this release's schema revision; one that has tables
        already is left to ``opsloop migrate`` (engine.migrations)."""
        dialect = sqlite.dialect()
        statements = [
            str(cast(Any, ddl).compile(dialect=dialect)).strip()
            for table in (THREADS, EVENTS, SNAPSHOTS)
            for ddl in (
                CreateTable(table, if_not_exists=True),
                *(CreateIndex(index, if_not_exists=True) for index in table.indexes),
            )
        ]
        version_table = str(CreateTable(VERSION_TABLE).compile(dialect=dialect)).strip()

        def create(conn: sqlite3.Connection) -> None:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'threads'"
            ).fetchone()
            for statement in statements:
                conn.execute(statement)
            if found is None:
                conn.execute(version_table)
                conn.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (HEAD,))

        await self._write(create)

    async def ping(self) -> None:
        await self._read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await release(db)
        await self.engine.dispose()

    # --- threads -----------------------------------------------------------------------

    async def _create_thread(self, new_id: str, key: ThreadKey, now: datetime) -> str:
        where = (key.team, key.channel, key.root_ts)
        when = sql_time(now)

        def body(conn: sqlite3.Connection) -> str:
            conn.execute(CREATE_THREAD_SQL, (new_id, *where, when, when))
            return str(conn.execute(FIND_THREAD_SQL, where).fetchone()[0])

        return await self._write(body)

    async def find_thread(self, key: ThreadKey) -> str | None:
        rows = await self._fetch(FIND_THREAD_SQL, key.team, key.channel, key.root_ts)
        return str(cast(Any, rows[0])[0]) if rows else None  # a sqlite3.Row: by position

    async def _threads(self, *, thread_id: str | None, at: tuple[str, str] | None) -> list[Row]:
        if at is not None:
            return await self._fetch(THREADS_AT_SQL, *at)
        return await self._fetch(THREAD_SQL, thread_id)

    async def _list_threads(
        self, statuses: list[str] | None, limit: int, channel: str | None, requester: str | None
    ) -> list[Row]:
        wanted = None if statuses is None else json.dumps(statuses)
        return await self._fetch(LIST_SQL, wanted, channel, requester, limit)

    # --- events ------------------------------------------------------------------------

    async def _events(self, thread_id: str, after: int) -> list[Row]:
        return await self._fetch(EVENTS_SQL, thread_id, after)

    async def _log(self, thread_id: str, start: Callable[[ThreadState | None], int]) -> Log:
        def read(conn: sqlite3.Connection) -> Log:
            snap = conn.execute(SNAPSHOT_SQL, (thread_id,)).fetchone()
            base = ThreadState.model_validate_json(snap[0]) if snap is not None else None
            rows = conn.execute(EVENTS_SQL, (thread_id, start(base))).fetchall()
            exists = bool(base or rows) or (
                conn.execute(EXISTS_SQL, (thread_id,)).fetchone() is not None
            )
            return Log(base, rows, exists)

        return await self._read(read)

    async def _dedupe(self, thread_id: str, key: str) -> Row | None:
        rows = await self._fetch(DEDUPE_SQL, thread_id, key)
        return rows[0] if rows else None

    async def _append(
        self,
        thread_id: str,
        expected_seq: int,
        rows: list[dict[str, Any]],
        state: ThreadState,
        now: datetime,
        *,
        snapshot: str | None,
        create: ThreadKey | None = None,
    ) -> Outcome:
        when = sql_time(now)
        item = _Append(
            thread_id=thread_id,
            moved=(
                state.last_seq,
                state.status,
                sql_time(state.wake_at),
                state.requester,
                when,
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
                    r["schema_version"],
                )
                for r in rows
            ],
            keys=[r["dedupe_key"] for r in rows if r["dedupe_key"]],
            snapshot=(thread_id, state.last_seq, snapshot) if snapshot is not None else None,
            create=(create.team, create.channel, create.root_ts, when) if create else None,
            future=asyncio.get_running_loop().create_future(),
        )
        try:
            with self._mapped():
                return await self._database().append(item)
        except sqlite3.IntegrityError:
            # A unique index caught what the checks could not (another process's writer
            # stored the same input first): the core looks again.
            return "moved"

    # --- timers and leases -------------------------------------------------------------

    async def set_wake_at(self, thread_id: str, expected_seq: int, wake_at: datetime) -> bool:
        return await self._execute(WAKE_SQL, thread_id, expected_seq, wake_at) == 1

    async def _acquire(self, thread_id: str, owner: str, until: datetime, now: datetime) -> bool:
        return await self._execute(ACQUIRE_SQL, thread_id, owner, until, now) == 1

    async def _renew(self, thread_id: str, owner: str, until: datetime) -> bool:
        return await self._execute(RENEW_SQL, thread_id, owner, until) == 1

    async def release_lease(self, thread_id: str, owner: str) -> None:
        await self._execute(RELEASE_SQL, thread_id, owner)

    async def _due(self, now: datetime, limit: int) -> list[str]:
        rows = await self._fetch(DUE_SQL, sql_time(now), limit)
        return [r["id"] for r in rows]
