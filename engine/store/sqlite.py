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
handler, which sleeps up to 100 ms per try. Every statement is written once, in the SQL
section below.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
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
from sqlalchemy.schema import CreateIndex, CreateTable

from engine.errors import ConfigError
from engine.schema import HEAD, VERSION_TABLE
from engine.state import ThreadState
from engine.store.base import (
    EVENT_COLUMNS,
    MCP_OAUTH_COLUMNS,
    THREAD_COLUMNS,
    TIMED_STATUSES,
    Duplicate,
    Log,
    McpOAuthRecord,
    OnRunnable,
    Outcome,
    Previous,
    Row,
    Store,
    TakenCode,
    WorkerInfo,
)
from engine.store.locks import WorkerLocks, worker_of
from engine.tables import DECIDED, EVENTS, GRANTING, MCP_OAUTH, SNAPSHOTS, THREADS, WORKERS
from engine.types import ThreadKey

T = TypeVar("T")

# --- SQL: every statement this backend runs ------------------------------------------

MOVE_SQL = """
UPDATE threads
SET last_seq = ?, status = ?, wake_at = ?, requester = ?, alert_key = ?, updated_at = ?
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
# A new thread with its first events: the row goes in as they leave it, or not at all
# (a thread at its key, or one open for its alert, is there already: any conflict).
CREATE_MOVED_SQL = """
INSERT INTO threads
    (id, team, channel, root_ts, status, last_seq, wake_at, requester, alert_key, created_at,
    updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING
RETURNING id
"""
FIND_THREAD_SQL = "SELECT id FROM threads WHERE team = ? AND channel = ? AND root_ts = ?"
# Through the partial unique index ``uq_threads_alert``.
FIND_ALERT_SQL = "SELECT id FROM threads WHERE alert_key = ?"
# A thread whose root was a placeholder moves to the message the bot posted for it.
SET_ROOT_SQL = "UPDATE threads SET root_ts = ?3 WHERE id = ?1 AND root_ts = ?2"
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
# ?1's decisions (of team ?2, NULL: any), newest first, at most ?3, through the partial
# index ``ix_events_decisions`` (its predicate, ``DECIDED``, repeated so the planner
# uses it); each with the tool of the call it decided, found walking its thread's log
# back from it by primary key.
DECISIONS_SQL = f"""
SELECT {", ".join("e." + c.strip() for c in EVENT_COLUMNS.split(","))},
    t.team, t.channel, t.root_ts, (
        SELECT json_extract(r.payload, '$.intent') FROM events r
        WHERE r.thread_id = e.thread_id AND r.seq < e.seq AND r.type = 'tool_call_requested'
          AND json_extract(r.payload, '$.tool_call_id') = json_extract(e.payload, '$.tool_call_id')
        ORDER BY r.seq DESC LIMIT 1
    ) AS tool
FROM events e JOIN threads t ON t.id = e.thread_id
WHERE e.actor = ?1 AND e.{DECIDED.text} AND (?2 IS NULL OR t.team = ?2)
ORDER BY e.created_at DESC, e.thread_id DESC, e.seq DESC LIMIT ?3
"""
# The grant events of channel ?1's threads (of team ?2, NULL: any) since ?3, in log
# order, through the partial index ``ix_events_grants`` (its predicate repeated).
GRANT_EVENTS_SQL = f"""
SELECT {", ".join("e." + c.strip() for c in EVENT_COLUMNS.split(","))}
FROM events e JOIN threads t ON t.id = e.thread_id
WHERE e.{GRANTING.text} AND e.created_at >= ?3 AND t.channel = ?1
  AND (?2 IS NULL OR t.team = ?2)
ORDER BY e.thread_id, e.seq
"""
# Arguments in one order for all four: (id, owner or expected_seq, until, now).
WAKE_SQL = "UPDATE threads SET wake_at = ?3 WHERE id = ?1 AND last_seq = ?2"
# ?5: an owner found provably dead (engine.store.locks), whose lease goes at once.
ACQUIRE_SQL = """
UPDATE threads SET lease_owner = ?2, lease_expires_at = ?3
WHERE id = ?1
  AND (lease_owner IS NULL OR lease_owner = ?2 OR lease_expires_at < ?4 OR lease_owner = ?5)
"""
LEASE_SQL = "SELECT lease_owner, lease_expires_at FROM threads WHERE id = ?"
RENEW_SQL = "UPDATE threads SET lease_expires_at = ?3 WHERE id = ?1 AND lease_owner = ?2"
RELEASE_SQL = """
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = ?1 AND lease_owner = ?2
"""
# A thread has work: it is running, or its timer is due at ?1.
_HAS_WORK = f"""(status = 'running'
       OR (status IN ({", ".join(f"'{s}'" for s in TIMED_STATUSES)}) AND wake_at <= ?1))"""
# ?2: a JSON list of lease owners found provably dead (engine.store.locks).
_DUE_WHERE = f"""(lease_owner IS NULL OR lease_expires_at < ?1
       OR lease_owner IN (SELECT value FROM json_each(?2)))
  AND {_HAS_WORK}"""
# Owners of live leases on threads with work: the ones whose life is worth checking.
HELD_SQL = f"""
SELECT DISTINCT lease_owner FROM threads
WHERE lease_owner IS NOT NULL AND lease_expires_at >= ?1 AND {_HAS_WORK}
"""
DUE_SQL = f"SELECT id FROM threads WHERE {_DUE_WHERE} ORDER BY updated_at LIMIT ?3"
# The claim reads, then takes, in one write transaction (the only writer meanwhile):
# ?4 a JSON list of ids to leave alone; then ?1 the claiming owner, ?2 its lease's end,
# ?3 the JSON list of ids read.
CLAIMABLE_SQL = f"""
SELECT id, lease_owner, lease_expires_at FROM threads
WHERE {_DUE_WHERE} AND id NOT IN (SELECT value FROM json_each(?4))
ORDER BY updated_at LIMIT ?3
"""
CLAIM_SQL = """
UPDATE threads SET lease_owner = ?1, lease_expires_at = ?2
WHERE id IN (SELECT value FROM json_each(?3))
"""
WORKER_UPSERT_SQL = """
INSERT INTO workers (id, host, pid, started_at, heartbeat_at) VALUES (?1, ?2, ?3, ?4, ?4)
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, heartbeat_at = excluded.heartbeat_at
"""
WORKER_BEAT_SQL = "UPDATE workers SET heartbeat_at = ?2 WHERE id = ?1"
WORKER_DELETE_SQL = "DELETE FROM workers WHERE id = ?"
# A worker leaving forgets its row unless it still holds a lease (a run cut short): that
# row, its lock given up, then proves the lease's owner dead to whoever looks next.
WORKER_LEAVE_SQL = """
DELETE FROM workers WHERE id = ?1 AND NOT EXISTS (
    SELECT 1 FROM threads
    WHERE lease_owner = ?1 OR substr(lease_owner, 1, length(?1) + 1) = ?1 || '/')
"""
WORKERS_SQL = "SELECT id, host, pid, started_at, heartbeat_at FROM workers ORDER BY started_at"
# Other workers that hold no lease: forgotten once proven dead.
LEASELESS_WORKERS_SQL = """
SELECT id FROM workers WHERE id <> ?1 AND NOT EXISTS (
    SELECT 1 FROM threads
    WHERE lease_owner = workers.id
       OR substr(lease_owner, 1, length(workers.id) + 1) = workers.id || '/')
"""
# ?1 a JSON list of statuses, ?2 updated before, ?3 now (leases), then the rest.
_ENDED_WHERE = """
status IN (SELECT value FROM json_each(?1)) AND updated_at < ?2
  AND (lease_owner IS NULL OR lease_expires_at < ?3)
"""
ENDED_SQL = f"""
SELECT {THREAD_COLUMNS} FROM threads WHERE {_ENDED_WHERE} AND id > ?4 ORDER BY id LIMIT ?5
"""
STILL_ENDED_SQL = f"SELECT 1 FROM threads WHERE {_ENDED_WHERE} AND id = ?4 AND last_seq = ?5"
DELETE_EVENTS_SQL = "DELETE FROM events WHERE thread_id = ?"
DELETE_SNAPSHOT_SQL = "DELETE FROM snapshots WHERE thread_id = ?"
DELETE_THREAD_SQL = "DELETE FROM threads WHERE id = ?"
# ?1 a JSON list of thread ids (NULL: every thread). Bytes: the payload's UTF-8 octets.
SIZES_SQL = """
SELECT thread_id, count(*) AS events, coalesce(sum(length(CAST(payload AS BLOB))), 0) AS bytes
FROM events WHERE ?1 IS NULL OR thread_id IN (SELECT value FROM json_each(?1))
GROUP BY thread_id
"""
STATUS_COUNTS_SQL = "SELECT status, count(*) AS n FROM threads GROUP BY status"
# When each awaiting thread's latest card was asked, the oldest of those.
OLDEST_APPROVAL_SQL = """
SELECT min(asked) FROM (
    SELECT max(e.created_at) AS asked FROM threads t
    JOIN events e ON e.thread_id = t.id AND e.type = 'approval_requested'
    WHERE t.status = 'awaiting_approval' GROUP BY t.id
) AS pending
"""
# MCP OAuth (tools/mcp/auth.py): ?1 server, ?2 binding, then the columns set, ?N now.
MCP_OAUTH_SQL = f"SELECT {MCP_OAUTH_COLUMNS} FROM mcp_oauth WHERE server = ?"
MCP_TOKENS_SQL = """
INSERT INTO mcp_oauth (server, binding, tokens, expires_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding, tokens = excluded.tokens,
    expires_at = excluded.expires_at, updated_at = excluded.updated_at
"""
MCP_CLIENT_SQL = """
INSERT INTO mcp_oauth (server, binding, client_info, updated_at) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding,
    client_info = excluded.client_info, updated_at = excluded.updated_at
"""
MCP_PENDING_SQL = """
INSERT INTO mcp_oauth (server, binding, pending_state, pending_verifier, pending_url,
    pending_since, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding,
    pending_state = excluded.pending_state, pending_verifier = excluded.pending_verifier,
    pending_url = excluded.pending_url, pending_since = excluded.pending_since,
    code = NULL, iss = NULL, updated_at = excluded.updated_at
"""
# ?1 state, ?2 code, ?3 iss, ?4 now: only an authorization still waiting takes it.
MCP_ANSWER_SQL = """
UPDATE mcp_oauth SET code = ?2, iss = ?3, updated_at = ?4
WHERE pending_state = ?1 AND code IS NULL RETURNING server
"""
# Taken in the write transaction: the read, then the clearing update (one writer).
MCP_CODE_SQL = """
SELECT code, iss, pending_verifier FROM mcp_oauth
WHERE server = ?1 AND pending_state = ?2 AND code IS NOT NULL
"""
MCP_DONE_SQL = """
UPDATE mcp_oauth SET code = NULL, iss = NULL, pending_state = NULL, pending_verifier = NULL,
    pending_url = NULL, pending_since = NULL, updated_at = ?2 WHERE server = ?1
"""
MCP_DELETE_SQL = "DELETE FROM mcp_oauth WHERE server = ?"
PING_SQL = "SELECT 1"
# Whether the file holds opsloop's tables. The tables are the SQLModel metadata's DDL,
# compiled in ``create_tables``, which stamps a new database with STAMP_SQL.
HAS_SCHEMA_SQL = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'threads'"
STAMP_SQL = "INSERT INTO alembic_version (version_num) VALUES (?)"

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
            # One wake-up per event loop for the whole batch, not one per append: each
            # is a write to the loop's self-pipe and a hand-over of the interpreter.
            answers: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}
            for item, outcome in zip(batch, outcomes, strict=True):
                answers.setdefault(item.future.get_loop(), []).append((item.future, outcome))
            for loop, settled in answers.items():
                loop.call_soon_threadsafe(_settle_all, settled)

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
        # One statement for the row, not four (insert, find, dedupe, move): each is a
        # hand-over of the interpreter, and a busy process makes every hand-over wait.
        # A new thread has no input to find again; its row holds its state from the start.
        team, channel, root_ts, when = item.create
        last_seq, status, wake_at, requester, alert = item.moved[:5]
        created = (
            *(item.thread_id, team, channel, root_ts),
            *(status, last_seq, wake_at, requester, alert),
        )
        if conn.execute(CREATE_MOVED_SQL, (*created, when, when)).fetchone() is None:
            return "moved"  # the thread is there already: the core reads it
    else:
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


_Answer = tuple[asyncio.Future[Outcome], Outcome | BaseException]


def _settle_all(answers: list[_Answer]) -> None:
    for future, outcome in answers:
        if future.done():  # the caller was cancelled; the outcome stands in the database
            continue
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

    def _setup(self, pool_size: int) -> None:
        # One writer thread per file, shared by the process's stores: no pool to size.
        path = self.config.url.database or ":memory:"
        self._db: Database | None = shared_database(path)
        # Proof of life of the workers on this file; none for an in-memory database
        # (one process: its leases simply expire).
        self._locks = None if path == ":memory:" else WorkerLocks(os.path.abspath(path))

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
            for table in (THREADS, EVENTS, SNAPSHOTS, WORKERS, MCP_OAUTH)
            for ddl in (
                CreateTable(table, if_not_exists=True),
                *(CreateIndex(index, if_not_exists=True) for index in table.indexes),
            )
        ]
        version_table = str(CreateTable(VERSION_TABLE).compile(dialect=dialect)).strip()

        def create(conn: sqlite3.Connection) -> None:
            found = conn.execute(HAS_SCHEMA_SQL).fetchone()
            for statement in statements:
                try:
                    conn.execute(statement)
                except sqlite3.OperationalError as exc:
                    # An older schema lacks a column an index of this release is on
                    # (``threads.alert_key``): `opsloop migrate` adds both.
                    if found is None or "no such column" not in str(exc):
                        raise
            if found is None:
                conn.execute(version_table)
                conn.execute(STAMP_SQL, (HEAD,))

        await self._write(create)

    async def ping(self) -> None:
        await self._read(lambda conn: conn.execute(PING_SQL).fetchone())

    async def has_schema(self) -> bool:
        return bool(await self._fetch(HAS_SCHEMA_SQL))

    async def close(self) -> None:
        if self._locks is not None:
            self._locks.close()  # the kernel would drop them at exit anyway
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

    async def find_alert_thread(self, alert_key: str) -> str | None:
        rows = await self._fetch(FIND_ALERT_SQL, alert_key)
        return str(cast(Any, rows[0])[0]) if rows else None

    async def set_root(self, thread_id: str, pending: str, root_ts: str) -> bool:
        return await self._execute(SET_ROOT_SQL, thread_id, pending, root_ts) == 1

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

    async def _decisions(self, actor: str, team: str | None, limit: int) -> list[Row]:
        return await self._fetch(DECISIONS_SQL, actor, team, limit)

    async def _grant_rows(self, channel: str, team: str | None, since: datetime) -> list[Row]:
        return await self._fetch(GRANT_EVENTS_SQL, channel, team, sql_time(since))

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
        wakes: bool = False,  # no cross-process notification: the sweep finds it
    ) -> Outcome:
        when = sql_time(now)
        item = _Append(
            thread_id=thread_id,
            moved=(
                state.last_seq,
                state.status,
                sql_time(state.wake_at),
                state.requester,
                state.alert,
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

    async def _acquire(
        self, thread_id: str, owner: str, until: datetime, now: datetime
    ) -> Previous | None:
        params = (thread_id, owner, sql_time(until), sql_time(now))
        locks = self._locks

        def body(conn: sqlite3.Connection) -> Previous | None:
            found = conn.execute(LEASE_SQL, (thread_id,)).fetchone()
            if found is None:
                return None
            previous: Previous = (found[0], found[1])
            if conn.execute(ACQUIRE_SQL, (*params, None)).rowcount == 1:
                return previous
            held_by = found[0]
            if held_by is None or locks is None or not locks.dead(worker_of(held_by)):
                return None
            # Its owner's process is gone (the kernel dropped its lock): take it now.
            taken = conn.execute(ACQUIRE_SQL, (*params, held_by)).rowcount == 1
            return previous if taken else None

        return await self._write(body)

    async def _renew(self, thread_id: str, owner: str, until: datetime) -> bool:
        return await self._execute(RENEW_SQL, thread_id, owner, until) == 1

    async def release_lease(self, thread_id: str, owner: str) -> None:
        await self._execute(RELEASE_SQL, thread_id, owner)

    def _dead_owners(self, conn: sqlite3.Connection, when: str | None) -> str:
        """The owners of live leases on threads with work whose process is gone, as
        the JSON list the due statements take."""
        locks = self._locks
        if locks is None:
            return "[]"
        held = [row[0] for row in conn.execute(HELD_SQL, (when,)).fetchall()]
        return json.dumps([owner for owner in held if locks.dead(worker_of(owner))])

    async def _due(self, now: datetime, limit: int) -> list[str]:
        when = sql_time(now)

        def read(conn: sqlite3.Connection) -> list[str]:
            dead = self._dead_owners(conn, when)
            return [row[0] for row in conn.execute(DUE_SQL, (when, dead, limit)).fetchall()]

        return await self._read(read)

    async def _claim(
        self, owner: str, until: datetime, now: datetime, limit: int, skip: list[str]
    ) -> list[tuple[str, Previous]]:
        when, end, left = sql_time(now), sql_time(until), json.dumps(skip)

        def body(conn: sqlite3.Connection) -> list[tuple[str, Previous]]:
            dead = self._dead_owners(conn, when)
            rows = conn.execute(CLAIMABLE_SQL, (when, dead, limit, left)).fetchall()
            ids = json.dumps([row[0] for row in rows])
            conn.execute(CLAIM_SQL, (owner, end, ids))
            return [(row[0], (row[1], row[2])) for row in rows]

        return await self._write(body)

    # --- workers -----------------------------------------------------------------------

    async def register_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        now: datetime,
        on_runnable: OnRunnable | None = None,
    ) -> None:
        # The lock first, then the row: a row without its lock held reads as dead.
        locks = self._locks
        if locks is not None and not locks.hold(worker_id):
            raise ConfigError(f"worker id {worker_id!r} is in use by a live process")
        when = sql_time(now)

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(WORKER_UPSERT_SQL, (worker_id, host, pid, when))
            if locks is None:
                return
            for (other,) in conn.execute(LEASELESS_WORKERS_SQL, (worker_id,)).fetchall():
                if locks.dead(other, remove=True):
                    conn.execute(WORKER_DELETE_SQL, (other,))

        await self._write(body)

    async def beat_worker(self, worker_id: str, now: datetime) -> bool:
        # The lock is a descriptor of this process: it cannot be lost while we live.
        if await self._execute(WORKER_BEAT_SQL, worker_id, now) == 1:
            return True
        await self._execute(WORKER_UPSERT_SQL, worker_id, socket.gethostname(), os.getpid(), now)
        return True

    async def unregister_worker(self, worker_id: str) -> None:
        forgotten = await self._execute(WORKER_LEAVE_SQL, worker_id) == 1
        if self._locks is not None:  # a row that stays keeps its file: it reads dead
            self._locks.drop(worker_id, remove=forgotten)

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetch(WORKERS_SQL)
        locks = self._locks
        return [
            WorkerInfo(
                **dict(row),
                alive=locks is None or not locks.dead(row["id"]),
            )
            for row in rows
        ]

    # --- MCP OAuth ----------------------------------------------------------------------

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None:
        rows = await self._fetch(MCP_OAUTH_SQL, server)
        return McpOAuthRecord(**dict(rows[0])) if rows else None

    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None:
        await self._execute(MCP_TOKENS_SQL, server, binding, tokens, expires_at, now)

    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None:
        await self._execute(MCP_CLIENT_SQL, server, binding, client_info, now)

    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None:
        await self._execute(MCP_PENDING_SQL, server, binding, state, verifier, url, now)

    async def answer_mcp_pending(
        self, state: str, code: str, iss: str | None, now: datetime
    ) -> str | None:
        when = sql_time(now)
        rows = await self._write(
            lambda conn: conn.execute(MCP_ANSWER_SQL, (state, code, iss, when)).fetchall()
        )
        return str(rows[0][0]) if rows else None

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        when = sql_time(now)

        def body(conn: sqlite3.Connection) -> TakenCode | None:
            row = conn.execute(MCP_CODE_SQL, (server, state)).fetchone()
            if row is None:
                return None
            conn.execute(MCP_DONE_SQL, (server, when))
            return row[0], row[1], row[2]

        return await self._write(body)

    async def delete_mcp_oauth(self, server: str) -> None:
        await self._execute(MCP_DELETE_SQL, server)

    # --- housekeeping: archive and sizes -----------------------------------------------

    async def _ended(
        self, statuses: list[str], before: datetime, now: datetime, after: str, limit: int
    ) -> list[Row]:
        args = (json.dumps(statuses), sql_time(before), sql_time(now), after, limit)
        return await self._fetch(ENDED_SQL, *args)

    async def _delete_thread(
        self, thread_id: str, last_seq: int, statuses: list[str], before: datetime, now: datetime
    ) -> bool:
        guard = (json.dumps(statuses), sql_time(before), sql_time(now), thread_id, last_seq)

        def body(conn: sqlite3.Connection) -> bool:
            # The check and the deletes share the write lock: no append slips between.
            if conn.execute(STILL_ENDED_SQL, guard).fetchone() is None:
                return False
            for sql in (DELETE_EVENTS_SQL, DELETE_SNAPSHOT_SQL, DELETE_THREAD_SQL):
                conn.execute(sql, (thread_id,))  # children first: foreign keys are on
            return True

        return await self._write(body)

    async def _sizes(self, thread_ids: list[str] | None) -> list[Row]:
        wanted = None if thread_ids is None else json.dumps(thread_ids)
        return await self._fetch(SIZES_SQL, wanted)

    # --- metrics -------------------------------------------------------------------------

    async def status_counts(self) -> tuple[dict[str, int], datetime | None]:
        def read(conn: sqlite3.Connection) -> tuple[dict[str, int], datetime | None]:
            counts = {r["status"]: int(r["n"]) for r in conn.execute(STATUS_COUNTS_SQL)}
            # Text: an aggregate has no declared type, so the DATETIME converter skips it.
            oldest = conn.execute(OLDEST_APPROVAL_SQL).fetchone()[0]
            return counts, _read_time(oldest.encode()) if oldest else None

        return await self._read(read)
