"""The PostgreSQL backend: every verb is one statement in autocommit on asyncpg.

One statement is one round trip and (for a write) one commit: the append moves the
thread row, inserts the events and upserts the snapshot in data-modifying CTEs, so a
writer that moved the thread first makes the guarded UPDATE match no row and nothing
is inserted. Every statement is written once, in the SQL section below, with named
parameters (an append's events by position, the text for their number made at its first
use). SQLAlchemy is used only to create the tables from the SQLModel metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel

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
from engine.tables import DECIDED, EVENTS, GRANTING, MCP_OAUTH, SNAPSHOTS, THREADS, WORKERS
from engine.types import ThreadKey

T = TypeVar("T")

# --- SQL: every statement this backend runs ------------------------------------------
#
# Written with ``:name`` parameters and numbered once, at import, into asyncpg's ``$n``
# (``Statement``): a caller passes values by name, so no one counts to ``$17``.

_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")  # ``:name``, not a ``::type`` cast


class Statement:
    """A statement with ``:name`` parameters, as asyncpg's ``$n`` text (``text``) and
    the names in their numbers' order; ``args(values)`` lines a mapping's values up.
    ``leading``: names numbered first, wherever they stand, whose values a caller passes
    by position (an append's events: many, and the same few columns over again)."""

    __slots__ = ("named", "names", "text")

    def __init__(self, source: str, leading: Sequence[str] = ()) -> None:
        names: list[str] = list(leading)

        def number(match: re.Match[str]) -> str:
            if match[1] not in names:
                names.append(match[1])
            return f"${names.index(match[1]) + 1}"

        self.text = _NAMED.sub(number, source)
        self.names = tuple(names)
        self.named = self.names[len(leading) :]  # the names ``args`` looks up

    def args(self, values: Mapping[str, Any], leading: Sequence[Any] = ()) -> list[Any]:
        """The values in ``$n`` order: ``leading``'s, then the rest by name (names the
        statement does not use are ignored)."""
        named = [values[name] for name in self.named]
        return [*leading, *named] if leading else named


# NOTIFY on the schema's channel, in the append's own statement (so at its commit,
# never for an append that did not happen), when it makes the thread runnable (``wakes``:
# running now, and not before; the core knows both states, and the guarded UPDATE makes
# the stored one the core's). The payload is ``<thread id> <origin>``, the origin being
# the appending store's (``Store.origin``): a worker ignores what its own process
# appended, since the front door kicked it already (hearing it too was a second run per
# input). A new thread notifies nobody: its creator kicks its own worker, and no other
# process can hold it. A commit that notified takes PostgreSQL's one notification-queue
# lock, so notifying every mention serialised a burst's commits (bench/slack_ack.py).
RUNNABLE_CHANNEL = "opsloop_runnable:"
# A batch's event columns (a row's keys, ``mapper.to_row``) and their types. A batch
# of up to SCALAR_EVENTS events binds each value as a parameter of its own, a larger
# one an array per column: asyncpg encodes an array element by element, through abc
# isinstance checks, which cost a step a tenth of its CPU, and nearly every batch
# holds one to three events.
_EVENT_TYPES = {
    "seq": "int",
    "event_id": "text",
    "type": "text",
    "actor": "text",
    "payload": "text",
    "dedupe_key": "text",
    "schema_version": "int",
}
EVENT_FIELDS = tuple(_EVENT_TYPES)
SCALAR_EVENTS = 4


def _events_from(events: int) -> tuple[str, tuple[str, ...]]:
    """The batch's events as the row source ``e`` (its columns ``EVENT_FIELDS``), and
    its parameters, in the order ``event_values`` gives their values: ``events`` rows
    of scalars (``:seq_0``, …), or, for 0, one array per column (``:seqs``, …)."""
    if events:
        rows = (
            ", ".join(f":{column}_{i}::{kind}" for column, kind in _EVENT_TYPES.items())
            for i in range(events)
        )
        source = "(VALUES (" + "),\n    (".join(rows) + "))"
        names = tuple(f"{column}_{i}" for i in range(events) for column in EVENT_FIELDS)
    else:
        arrays = (f":{column}s::{kind}[]" for column, kind in _EVENT_TYPES.items())
        source = "unnest(" + ", ".join(arrays) + ")"
        names = tuple(f"{column}s" for column in EVENT_FIELDS)
    return f"{source}\n    AS e({', '.join(EVENT_FIELDS)})", names


def event_values(rows: list[dict[str, Any]]) -> tuple[int, list[Any]]:
    """The batch form for ``rows`` (``events`` of ``append_sql`` and ``create_sql``)
    and the values of its event parameters, in their order."""
    if 0 < len(rows) <= SCALAR_EVENTS:
        return len(rows), [row[column] for row in rows for column in EVENT_FIELDS]
    return 0, [[row[column] for row in rows] for column in EVENT_FIELDS]


_INSERT_EVENTS = """
    INSERT INTO events
        (thread_id, seq, event_id, type, actor, created_at, payload, dedupe_key, schema_version)
"""


@functools.cache  # a text per form, built at its first use
def append_sql(keys: bool, snapshot: bool, events: int) -> Statement:
    """The append of a batch, with the parts it needs only: each part costs its set-up
    in the executor even when it matches nothing, and most appends (the runner's) carry
    no dedupe key and are not due a snapshot.

    The events first, by position (``events``: their number, or 0: as arrays; see
    ``event_values``); then by name the thread's new ``last_seq``, ``status``,
    ``wake_at``, ``requester``, ``alert_key``, ``now``; its ``thread_id`` and ``expected_seq``; the
    appending store's ``origin`` and whether the append ``wakes`` the thread; with
    ``keys``, the inputs' dedupe ``keys``; with ``snapshot``, the ``snapshot``."""
    source, leading = _events_from(events)
    ctes = []
    if keys:
        # The keys are looked up by their own index: OFFSET 0 keeps the planner from
        # walking the thread's every event in seq order to find the first match.
        ctes.append(f"""stored AS (
    SELECT {EVENT_COLUMNS} FROM (
        SELECT * FROM events WHERE thread_id = :thread_id AND dedupe_key = ANY(:keys::text[])
        OFFSET 0
    ) AS keyed
    ORDER BY seq LIMIT 1
)""")
    unstored = " AND NOT EXISTS (SELECT FROM stored)" if keys else ""
    ctes.append(f"""moved AS (
    UPDATE threads
    SET last_seq = :last_seq, status = :status, wake_at = :wake_at, requester = :requester,
        alert_key = :alert_key, updated_at = :now
    WHERE id = :thread_id AND last_seq = :expected_seq{unstored}
    RETURNING id
)""")
    ctes.append(f"""inserted AS (
    {_INSERT_EVENTS}
    SELECT moved.id, e.seq, e.event_id, e.type, e.actor, :now, e.payload, e.dedupe_key,
        e.schema_version
    FROM moved, {source}
)""")
    if snapshot:
        ctes.append("""snapshot AS (
    INSERT INTO snapshots (thread_id, seq, state)
    SELECT moved.id, :last_seq, :snapshot::text FROM moved
    ON CONFLICT (thread_id) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state
)""")
    woke = f"""CASE WHEN :wakes::bool AND EXISTS (SELECT FROM moved)
    THEN pg_notify('{RUNNABLE_CHANNEL}' || coalesce(current_schema(), 'public'),
        :thread_id::text || ' ' || :origin::text)
    END AS woke"""
    if keys:
        select = f"""SELECT (SELECT count(*) FROM moved) AS moved, stored.*, {woke}
FROM (SELECT) AS one LEFT JOIN stored ON true"""
    else:
        select = f"SELECT (SELECT count(*) FROM moved) AS moved, NULL AS seq, {woke}"
    return Statement("\nWITH " + ",\n".join(ctes) + "\n" + select + "\n", leading)


@functools.cache
def create_sql(events: int) -> Statement:
    """A new thread already at its state (as the append's ``moved``), at its ``team``,
    ``channel`` and ``root_ts``, with its first events (as ``append_sql``'s) and any
    ``snapshot``; nothing when a thread is at that key, or open for its alert, already
    (any conflict)."""
    source, leading = _events_from(events)
    return Statement(
        f"""
WITH created AS (
    INSERT INTO threads
        (id, team, channel, root_ts, status, last_seq, wake_at, requester, alert_key,
        created_at, updated_at)
    VALUES (:thread_id, :team, :channel, :root_ts, :status, :last_seq, :wake_at, :requester,
        :alert_key, :now, :now)
    ON CONFLICT DO NOTHING
    RETURNING id
), inserted AS (
    {_INSERT_EVENTS}
    SELECT created.id, e.seq, e.event_id, e.type, e.actor, :now, e.payload, e.dedupe_key,
        e.schema_version
    FROM created, {source}
), snapshot AS (
    INSERT INTO snapshots (thread_id, seq, state)
    SELECT created.id, :last_seq, :snapshot::text FROM created WHERE :snapshot::text IS NOT NULL
)
SELECT count(*) FROM created
""",
        leading,
    )


CREATE_THREAD_SQL = Statement("""
WITH created AS (
    INSERT INTO threads (id, team, channel, root_ts, status, last_seq, created_at, updated_at)
    VALUES (:id, :team, :channel, :root_ts, 'new', 0, :now, :now)
    ON CONFLICT (team, channel, root_ts) DO NOTHING
    RETURNING id
)
SELECT id FROM created
UNION ALL SELECT id FROM threads WHERE team = :team AND channel = :channel AND root_ts = :root_ts
""")
FIND_THREAD_SQL = Statement(
    "SELECT id FROM threads WHERE team = :team AND channel = :channel AND root_ts = :root_ts"
)
# Through the partial unique index ``uq_threads_alert``.
FIND_ALERT_SQL = Statement("SELECT id FROM threads WHERE alert_key = :alert_key")
# A thread whose root was a placeholder moves to the message the bot posted for it.
SET_ROOT_SQL = Statement(
    "UPDATE threads SET root_ts = :root_ts WHERE id = :thread_id AND root_ts = :pending"
)
THREAD_SQL = Statement(f"SELECT {THREAD_COLUMNS} FROM threads WHERE id = :id")
THREADS_AT_SQL = Statement(
    f"SELECT {THREAD_COLUMNS} FROM threads WHERE channel = :channel AND root_ts = :root_ts"
)
LIST_SQL = Statement(f"""
SELECT {THREAD_COLUMNS} FROM threads
WHERE (:statuses::text[] IS NULL OR status = ANY(:statuses))
  AND (:channel::text IS NULL OR channel = :channel)
  AND (:requester::text IS NULL OR requester = :requester)
ORDER BY updated_at DESC LIMIT :limit
""")
EVENTS_SQL = Statement(
    f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = :thread_id AND seq > :after ORDER BY seq"
)
SNAPSHOT_SQL = Statement("SELECT state FROM snapshots WHERE thread_id = :thread_id")
EXISTS_SQL = Statement("SELECT 1 FROM threads WHERE id = :thread_id")
DEDUPE_SQL = Statement(
    f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = :thread_id AND dedupe_key = :key"
)
# ``:actor``'s decisions (of ``:team``, NULL: any), newest first, through the partial
# index ``ix_events_decisions`` (its predicate, ``DECIDED``, repeated so the planner
# uses it); each with the tool of the call it decided, found walking its thread's log
# back from it by primary key.
DECISIONS_SQL = Statement(f"""
SELECT {", ".join("e." + c.strip() for c in EVENT_COLUMNS.split(","))},
    t.team, t.channel, t.root_ts, (
        SELECT r.payload::jsonb ->> 'intent' FROM events r
        WHERE r.thread_id = e.thread_id AND r.seq < e.seq AND r.type = 'tool_call_requested'
          AND r.payload::jsonb ->> 'tool_call_id' = e.payload::jsonb ->> 'tool_call_id'
        ORDER BY r.seq DESC LIMIT 1
    ) AS tool
FROM events e JOIN threads t ON t.id = e.thread_id
WHERE e.actor = :actor AND e.{DECIDED.text} AND (:team::text IS NULL OR t.team = :team)
ORDER BY e.created_at DESC, e.thread_id DESC, e.seq DESC LIMIT :limit
""")
# The grant events of ``:channel``'s threads (of ``:team``, NULL: any) since ``:since``,
# in log order, through the partial index ``ix_events_grants`` (its predicate repeated).
GRANT_EVENTS_SQL = Statement(f"""
SELECT {", ".join("e." + c.strip() for c in EVENT_COLUMNS.split(","))}
FROM events e JOIN threads t ON t.id = e.thread_id
WHERE e.{GRANTING.text} AND e.created_at >= :since AND t.channel = :channel
  AND (:team::text IS NULL OR t.team = :team)
ORDER BY e.thread_id, e.seq
""")
WAKE_SQL = Statement(
    "UPDATE threads SET wake_at = :wake_at WHERE id = :thread_id AND last_seq = :expected_seq"
)
# Workers' proof of life: a session advisory lock (WORKER_LOCK_CLASS, hashtext(id)),
# which the server drops with the session, however the process died. Two-key locks
# show in pg_locks with objsubid 2 (the migrations' one-key lock has 1). A collision
# of hashtext makes a dead worker look alive: its leases then wait for expiry.
WORKER_LOCK_CLASS = 727002
_DEAD_WORKERS = f"""
SELECT dw.id FROM workers dw WHERE NOT EXISTS (
    SELECT FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = {WORKER_LOCK_CLASS} AND l.objid = hashtext(dw.id)::oid)
"""
# The lease is free, expired at ``:now``, or its owner (up to a "/") is a dead worker's.
_TAKEABLE = f"""(lease_owner IS NULL OR lease_expires_at < :now
    OR split_part(lease_owner, '/', 1) IN ({_DEAD_WORKERS}))"""
# A thread with work (running, or its timer, one of ``:timed`` statuses, due at ``:now``)
# whose lease anyone may take.
_DUE_WHERE = f"""{_TAKEABLE}
    AND (status = 'running' OR (status = ANY(:timed::text[]) AND wake_at <= :now))"""
# Returns the lease it replaced (read under the row lock the UPDATE takes anyway).
ACQUIRE_SQL = Statement(f"""
WITH was AS (
    SELECT lease_owner AS was_owner, lease_expires_at AS was_until
    FROM threads WHERE id = :thread_id FOR UPDATE
)
UPDATE threads SET lease_owner = :owner, lease_expires_at = :until FROM was
WHERE id = :thread_id AND (lease_owner = :owner OR {_TAKEABLE})
RETURNING was.was_owner, was.was_until
""")
RENEW_SQL = Statement(
    "UPDATE threads SET lease_expires_at = :until WHERE id = :thread_id AND lease_owner = :owner"
)
RELEASE_SQL = Statement("""
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = :thread_id AND lease_owner = :owner
""")
DUE_SQL = Statement(f"SELECT id FROM threads WHERE {_DUE_WHERE} ORDER BY updated_at LIMIT :limit")
# Claimed in the statement that finds them: rows another replica is claiming at this
# moment are skipped (SKIP LOCKED), and one it claimed since our snapshot fails the
# re-check of FOR UPDATE, so replicas sweeping together never take the same thread.
# ``:skip``: ids to leave alone.
CLAIM_SQL = Statement(f"""
WITH due AS (
    SELECT id, lease_owner AS was_owner, lease_expires_at AS was_until
    FROM threads WHERE {_DUE_WHERE} AND NOT (id = ANY(:skip::text[]))
    ORDER BY updated_at LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE threads SET lease_owner = :owner, lease_expires_at = :until FROM due
WHERE threads.id = due.id
RETURNING threads.id, due.was_owner, due.was_until
""")
WORKER_LOCK_SQL = Statement(
    f"SELECT pg_try_advisory_lock({WORKER_LOCK_CLASS}, hashtext(:worker_id))"
)
WORKER_UNLOCK_SQL = Statement(
    f"SELECT pg_advisory_unlock({WORKER_LOCK_CLASS}, hashtext(:worker_id))"
)
WORKER_UPSERT_SQL = Statement("""
INSERT INTO workers (id, host, pid, started_at, heartbeat_at)
VALUES (:worker_id, :host, :pid, :now, :now)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, heartbeat_at = EXCLUDED.heartbeat_at
""")
WORKER_BEAT_SQL = Statement("UPDATE workers SET heartbeat_at = :now WHERE id = :worker_id")
# A worker leaving forgets its row unless it still holds a lease (a run cut short): that
# row, its lock given up, then proves the lease's owner dead to whoever looks next.
WORKER_LEAVE_SQL = Statement("""
DELETE FROM workers WHERE id = :worker_id
  AND NOT EXISTS (SELECT FROM threads WHERE split_part(lease_owner, '/', 1) = :worker_id)
""")
# Rows of other dead workers that hold no lease: nothing needs them any more.
WORKER_PRUNE_SQL = Statement(f"""
DELETE FROM workers w WHERE w.id <> :worker_id AND w.id IN ({_DEAD_WORKERS})
  AND NOT EXISTS (SELECT FROM threads t WHERE split_part(t.lease_owner, '/', 1) = w.id)
""")
WORKERS_SQL = Statement(f"""
SELECT id, host, pid, started_at, heartbeat_at, id NOT IN ({_DEAD_WORKERS}) AS alive
FROM workers ORDER BY started_at
""")
CURRENT_SCHEMA_SQL = Statement("SELECT coalesce(current_schema(), 'public')")
# Threads that ended (``:statuses``), unchanged since ``:before``, under no live lease.
_ENDED_WHERE = """
status = ANY(:statuses::text[]) AND updated_at < :before
  AND (lease_owner IS NULL OR lease_expires_at < :now)
"""
ENDED_SQL = Statement(f"""
SELECT {THREAD_COLUMNS} FROM threads WHERE {_ENDED_WHERE} AND id > :after ORDER BY id LIMIT :limit
""")
# One statement, so one transaction: the row goes only if it still matches (an append
# that moved it first makes the guarded DELETE match nothing, so nothing else goes;
# one that comes after finds no row). Its children go in the same statement, which
# the foreign keys (NO ACTION: checked at the statement's end) allow.
DELETE_THREAD_SQL = Statement(f"""
WITH gone AS (
    DELETE FROM threads WHERE {_ENDED_WHERE} AND id = :thread_id AND last_seq = :last_seq
    RETURNING id
), events_gone AS (
    DELETE FROM events WHERE thread_id IN (SELECT id FROM gone)
), snapshot_gone AS (
    DELETE FROM snapshots WHERE thread_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone
""")
# ``:thread_ids`` NULL: every thread. Bytes: the payload's octets.
SIZES_SQL = Statement("""
SELECT thread_id, count(*) AS events, coalesce(sum(octet_length(payload)), 0) AS bytes
FROM events WHERE :thread_ids::text[] IS NULL OR thread_id = ANY(:thread_ids::text[])
GROUP BY thread_id
""")
STATUS_COUNTS_SQL = Statement("SELECT status, count(*) AS n FROM threads GROUP BY status")
# When each awaiting thread's latest card was asked, the oldest of those.
OLDEST_APPROVAL_SQL = Statement("""
SELECT min(asked) FROM (
    SELECT max(e.created_at) AS asked FROM threads t
    JOIN events e ON e.thread_id = t.id AND e.type = 'approval_requested'
    WHERE t.status = 'awaiting_approval' GROUP BY t.id
) AS pending
""")
# MCP OAuth (tools/mcp/auth.py).
MCP_OAUTH_SQL = Statement(f"SELECT {MCP_OAUTH_COLUMNS} FROM mcp_oauth WHERE server = :server")
MCP_TOKENS_SQL = Statement("""
INSERT INTO mcp_oauth (server, binding, tokens, expires_at, updated_at)
VALUES (:server, :binding, :tokens, :expires_at, :now)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding, tokens = excluded.tokens,
    expires_at = excluded.expires_at, updated_at = excluded.updated_at
""")
MCP_CLIENT_SQL = Statement("""
INSERT INTO mcp_oauth (server, binding, client_info, updated_at)
VALUES (:server, :binding, :client_info, :now)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding,
    client_info = excluded.client_info, updated_at = excluded.updated_at
""")
MCP_PENDING_SQL = Statement("""
INSERT INTO mcp_oauth (server, binding, pending_state, pending_verifier, pending_url,
    pending_since, updated_at) VALUES (:server, :binding, :state, :verifier, :url, :now, :now)
ON CONFLICT (server) DO UPDATE SET binding = excluded.binding,
    pending_state = excluded.pending_state, pending_verifier = excluded.pending_verifier,
    pending_url = excluded.pending_url, pending_since = excluded.pending_since,
    code = NULL, iss = NULL, updated_at = excluded.updated_at
""")
# Only an authorization still waiting takes a code.
MCP_ANSWER_SQL = Statement("""
UPDATE mcp_oauth SET code = :code, iss = :iss, updated_at = :now
WHERE pending_state = :state AND code IS NULL RETURNING server
""")
# The code as it was, and the row cleared, in one statement: of two replicas taking it,
# the second's locked read sees the cleared row and takes nothing.
MCP_TAKE_SQL = Statement("""
UPDATE mcp_oauth m SET code = NULL, iss = NULL, pending_state = NULL,
    pending_verifier = NULL, pending_url = NULL, pending_since = NULL, updated_at = :now
FROM (
    SELECT server, code, iss, pending_verifier FROM mcp_oauth
    WHERE server = :server AND pending_state = :state AND code IS NOT NULL FOR UPDATE
) AS old
WHERE m.server = old.server
RETURNING old.code, old.iss, old.pending_verifier
""")
MCP_DELETE_SQL = Statement("DELETE FROM mcp_oauth WHERE server = :server")
PING_SQL = Statement("SELECT 1")
# Whether the search path finds opsloop's tables (as SQLAlchemy's ``has_table`` asks).
HAS_SCHEMA_SQL = Statement("""
SELECT EXISTS (
    SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relname = 'threads' AND c.relkind IN ('r', 'p', 'f', 'v', 'm')
      AND pg_table_is_visible(c.oid) AND n.nspname <> 'pg_catalog'
)
""")
# Table creation runs on SQLAlchemy (from the SQLModel metadata), under this lock:
# CREATE … IF NOT EXISTS races between processes starting together.
CREATE_TABLES_LOCK_SQL = "SELECT pg_advisory_xact_lock(7270010001)"
CREATE_SCHEMA_SQL = 'CREATE SCHEMA IF NOT EXISTS "{name}"'  # the name with its quotes doubled

# Errors after which a connection cannot be trusted (a server-side error such as a
# unique violation leaves it usable).
BROKEN = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)
# Server answers that mean it is going away or cannot take us now.
_SERVER_DOWN = (
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)


class Connections:
    """A small LIFO pool of asyncpg connections for one-statement work.

    asyncpg's own pool resets each connection on release and shields the release in a
    task: together more than a tenth of a commit. Our statements leave no session
    state, so a connection goes back as it is; one that broke is dropped.
    """

    def __init__(self, dsn: str, size: int, settings: dict[str, str] | None) -> None:
        self._dsn = dsn
        self._settings = settings
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(size)
        self._closed = False

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``work(conn)``; a stale idle connection is dropped and the work retried once
        (every statement here is safe to run again: a write that had committed finds
        the row moved)."""
        for attempt in (1, 2):
            async with self._slots:
                conn = self._idle.pop() if self._idle else await self._connect()
                try:
                    result = await work(conn)
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


def _rows_of(status: str) -> int:
    """Rows a statement touched, from asyncpg's command tag ("UPDATE 1")."""
    return int(status.rsplit(" ", 1)[-1])


def _create_and_stamp(conn: sa.Connection) -> None:
    """Create missing tables; stamp a new database at this release's schema revision
    (one with tables already is left to ``opsloop migrate``, engine.migrations)."""
    found = sa.inspect(conn).has_table("threads")
    SQLModel.metadata.create_all(conn, tables=[THREADS, EVENTS, SNAPSHOTS, WORKERS, MCP_OAUTH])
    if not found:
        VERSION_TABLE.create(conn, checkfirst=True)
        conn.execute(VERSION_TABLE.insert().values(version_num=HEAD))


class _Presence:
    """The session that proves a worker lives, and hears NOTIFY for this schema.

    It holds the worker's advisory lock for as long as it is open; the server drops
    the lock with the session, so a dead process is seen as dead at once, and a
    stopped one (SIGSTOP: the socket stays open) as alive. A lost session is opened
    again at the next beat, which says so: notifications sent meanwhile never came
    (they reach only sessions listening at commit time), so the caller looks at all.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        worker_id: str,
        where: tuple[str, int],
        on_runnable: OnRunnable | None,
        origin: str,
    ) -> None:
        self._connect = connect
        self.worker_id = worker_id
        self._where = where
        self._on_runnable = on_runnable
        self._origin = origin  # notifications of this origin are our own
        self._conn: asyncpg.Connection | None = None

    async def open(self, now: datetime) -> None:
        conn = await self._connect()
        me = self._row(now)
        try:
            # The lock first, then the row: a row without its lock held reads as dead.
            if not await conn.fetchval(WORKER_LOCK_SQL.text, *WORKER_LOCK_SQL.args(me)):
                raise ConfigError(f"worker id {self.worker_id!r} is in use by a live process")
            await conn.execute(WORKER_UPSERT_SQL.text, *WORKER_UPSERT_SQL.args(me))
            if self._on_runnable is not None:
                schema = await conn.fetchval(CURRENT_SCHEMA_SQL.text)
                await conn.add_listener(RUNNABLE_CHANNEL + schema, self._heard)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn

    def _row(self, now: datetime) -> dict[str, Any]:
        """The worker's statement values."""
        host, pid = self._where
        return {"worker_id": self.worker_id, "host": host, "pid": pid, "now": now}

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        thread_id, _, origin = payload.partition(" ")
        if self._on_runnable is not None and origin != self._origin:
            self._on_runnable(thread_id)

    async def beat(self, now: datetime) -> bool:
        conn = self._conn
        if conn is not None and not conn.is_closed():
            me = self._row(now)
            try:
                beat = await conn.execute(WORKER_BEAT_SQL.text, *WORKER_BEAT_SQL.args(me))
                if _rows_of(beat) == 0:
                    await conn.execute(WORKER_UPSERT_SQL.text, *WORKER_UPSERT_SQL.args(me))
                return True
            except (*BROKEN, *_SERVER_DOWN):  # the session is gone: so is the lock
                conn.terminate()
        self._conn = None
        await self.open(now)
        if self._on_runnable is not None:
            self._on_runnable(None)
        return False

    async def close(self, *, forget: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        try:
            if forget:  # the row first, then the lock
                me = {"worker_id": self.worker_id}
                await conn.execute(WORKER_LEAVE_SQL.text, *WORKER_LEAVE_SQL.args(me))
                await conn.fetchval(WORKER_UNLOCK_SQL.text, *WORKER_UNLOCK_SQL.args(me))
            await conn.close(timeout=5)
        except BaseException:
            conn.terminate()
            raise


class PostgresStore(Store):
    DOWN = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, *_SERVER_DOWN, OSError)

    def _setup(self, pool_size: int) -> None:
        config = self.config
        dsn = config.url.set(drivername="postgresql").render_as_string(hide_password=False)
        settings = {"search_path": config.schema} if config.schema else None
        # Reads share this pool with the writes (they had a pool of their own): room
        # for both, so an ack's reads do not queue behind the runners' appends.
        self._pool = Connections(dsn, pool_size + max(5, pool_size // 4), settings)
        self._dsn, self._settings = dsn, settings
        self._presences: dict[str, _Presence] = {}  # worker id -> its proof of life

    async def _run(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        with self._mapped():
            return await self._pool.run(work)

    async def _fetch(self, statement: Statement, **values: Any) -> list[Row]:
        args = statement.args(values)
        return await self._run(lambda conn: conn.fetch(statement.text, *args))

    async def _fetchrow(
        self, statement: Statement, leading: Sequence[Any] = (), /, **values: Any
    ) -> Row | None:
        args = statement.args(values, leading)
        return await self._run(lambda conn: conn.fetchrow(statement.text, *args))

    async def _fetchval(
        self, statement: Statement, leading: Sequence[Any] = (), /, **values: Any
    ) -> Any:
        args = statement.args(values, leading)
        return await self._run(lambda conn: conn.fetchval(statement.text, *args))

    async def _execute(self, statement: Statement, **values: Any) -> int:
        args = statement.args(values)
        return _rows_of(await self._run(lambda conn: conn.execute(statement.text, *args)))

    async def create_tables(self) -> None:
        with self._mapped(DBAPIError):
            async with self.engine.begin() as conn:
                await conn.execute(sa.text(CREATE_TABLES_LOCK_SQL))
                if self.config.schema:
                    name = self.config.schema.replace('"', '""')
                    await conn.execute(sa.text(CREATE_SCHEMA_SQL.format(name=name)))
                await conn.run_sync(_create_and_stamp)

    async def ping(self) -> None:
        await self._fetchval(PING_SQL)

    async def has_schema(self) -> bool:
        return bool(await self._fetchval(HAS_SCHEMA_SQL))

    async def close(self) -> None:
        presences, self._presences = list(self._presences.values()), {}
        for presence in presences:  # the session goes, and with it the lock
            with contextlib.suppress(Exception):
                await presence.close(forget=False)
        await self._pool.close()
        await self.engine.dispose()

    # --- threads -----------------------------------------------------------------------

    async def _create_thread(self, new_id: str, key: ThreadKey, now: datetime) -> str:
        where = {"team": key.team, "channel": key.channel, "root_ts": key.root_ts}
        found = await self._fetchval(CREATE_THREAD_SQL, id=new_id, now=now, **where)
        if found is None:  # created by a statement that committed after ours began
            found = await self.find_thread(key)
        assert found is not None
        return str(found)

    async def find_thread(self, key: ThreadKey) -> str | None:
        where = {"team": key.team, "channel": key.channel, "root_ts": key.root_ts}
        found = await self._fetchval(FIND_THREAD_SQL, **where)
        return None if found is None else str(found)

    async def find_alert_thread(self, alert_key: str) -> str | None:
        found = await self._fetchval(FIND_ALERT_SQL, alert_key=alert_key)
        return None if found is None else str(found)

    async def set_root(self, thread_id: str, pending: str, root_ts: str) -> bool:
        moved = await self._execute(
            SET_ROOT_SQL, thread_id=thread_id, pending=pending, root_ts=root_ts
        )
        return moved == 1

    async def _threads(self, *, thread_id: str | None, at: tuple[str, str] | None) -> list[Row]:
        if at is not None:
            return await self._fetch(THREADS_AT_SQL, channel=at[0], root_ts=at[1])
        return await self._fetch(THREAD_SQL, id=thread_id)

    async def _list_threads(
        self, statuses: list[str] | None, limit: int, channel: str | None, requester: str | None
    ) -> list[Row]:
        wanted = {"statuses": statuses, "channel": channel, "requester": requester}
        return await self._fetch(LIST_SQL, limit=limit, **wanted)

    # --- events ------------------------------------------------------------------------

    async def _events(self, thread_id: str, after: int) -> list[Row]:
        return await self._fetch(EVENTS_SQL, thread_id=thread_id, after=after)

    async def _log(self, thread_id: str, start: Callable[[ThreadState | None], int]) -> Log:
        where = {"thread_id": thread_id}

        async def read(conn: asyncpg.Connection) -> Log:
            snap = await conn.fetchval(SNAPSHOT_SQL.text, *SNAPSHOT_SQL.args(where))
            base = ThreadState.model_validate_json(snap) if snap is not None else None
            tail = EVENTS_SQL.args({**where, "after": start(base)})
            rows = await conn.fetch(EVENTS_SQL.text, *tail)
            exists = bool(base or rows) or (
                await conn.fetchval(EXISTS_SQL.text, *EXISTS_SQL.args(where)) is not None
            )
            return Log(base, rows, exists)

        return await self._run(read)

    async def _dedupe(self, thread_id: str, key: str) -> Row | None:
        return await self._fetchrow(DEDUPE_SQL, thread_id=thread_id, key=key)

    async def _decisions(self, actor: str, team: str | None, limit: int) -> list[Row]:
        return await self._fetch(DECISIONS_SQL, actor=actor, team=team, limit=limit)

    async def _grant_rows(self, channel: str, team: str | None, since: datetime) -> list[Row]:
        return await self._fetch(GRANT_EVENTS_SQL, channel=channel, team=team, since=since)

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
        wakes: bool = False,
    ) -> Outcome:
        events, leading = event_values(rows)
        values: dict[str, Any] = {
            "thread_id": thread_id,
            "last_seq": state.last_seq,
            "status": state.status,
            "wake_at": state.wake_at,
            "requester": state.requester,
            "alert_key": state.alert,
            "now": now,
            "snapshot": snapshot,
        }
        try:
            if create is not None:
                where = {"team": create.team, "channel": create.channel, "root_ts": create.root_ts}
                created = await self._fetchval(create_sql(events), leading, **values, **where)
                return "written" if created == 1 else "moved"
            keys = [row["dedupe_key"] for row in rows if row["dedupe_key"]]
            values.update(expected_seq=expected_seq, origin=self.origin, wakes=wakes, keys=keys)
            statement = append_sql(bool(keys), snapshot is not None, events)
            found = await self._fetchrow(statement, leading, **values)
        except asyncpg.UniqueViolationError:
            # A racing writer stored the same input (or the first events of a new
            # thread) after our statement began: the core looks again.
            return "moved"
        assert found is not None
        if found["seq"] is not None:
            return Duplicate({k: found[k] for k in found.keys() if k not in ("moved", "woke")})
        return "written" if found["moved"] == 1 else "moved"

    # --- timers and leases -------------------------------------------------------------

    async def set_wake_at(self, thread_id: str, expected_seq: int, wake_at: datetime) -> bool:
        moved = await self._execute(
            WAKE_SQL, thread_id=thread_id, expected_seq=expected_seq, wake_at=wake_at
        )
        return moved == 1

    async def _acquire(
        self, thread_id: str, owner: str, until: datetime, now: datetime
    ) -> Previous | None:
        found = await self._fetchrow(
            ACQUIRE_SQL, thread_id=thread_id, owner=owner, until=until, now=now
        )
        return None if found is None else (found["was_owner"], found["was_until"])

    async def _renew(self, thread_id: str, owner: str, until: datetime) -> bool:
        return await self._execute(RENEW_SQL, thread_id=thread_id, owner=owner, until=until) == 1

    async def release_lease(self, thread_id: str, owner: str) -> None:
        await self._execute(RELEASE_SQL, thread_id=thread_id, owner=owner)

    async def _due(self, now: datetime, limit: int) -> list[str]:
        rows = await self._fetch(DUE_SQL, now=now, timed=list(TIMED_STATUSES), limit=limit)
        return [r["id"] for r in rows]

    async def _claim(
        self, owner: str, until: datetime, now: datetime, limit: int, skip: list[str]
    ) -> list[tuple[str, Previous]]:
        due = {"now": now, "timed": list(TIMED_STATUSES), "limit": limit, "skip": skip}
        rows = await self._fetch(CLAIM_SQL, owner=owner, until=until, **due)
        return [(r["id"], (r["was_owner"], r["was_until"])) for r in rows]

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
        presence = _Presence(self._connect, worker_id, (host, pid), on_runnable, self.origin)
        with self._mapped():
            await presence.open(now)
        self._presences[worker_id] = presence
        await self._execute(WORKER_PRUNE_SQL, worker_id=worker_id)

    async def beat_worker(self, worker_id: str, now: datetime) -> bool:
        presence = self._presences.get(worker_id)
        if presence is None:
            raise ValueError(f"worker {worker_id!r} is not registered here")  # a bug
        with self._mapped():
            return await presence.beat(now)

    async def unregister_worker(self, worker_id: str) -> None:
        presence = self._presences.pop(worker_id, None)
        if presence is not None:
            with self._mapped():
                await presence.close(forget=True)

    async def list_workers(self) -> list[WorkerInfo]:
        return [WorkerInfo(**dict(row)) for row in await self._fetch(WORKERS_SQL)]

    async def _connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self._dsn, server_settings=self._settings, timeout=10)

    # --- MCP OAuth ----------------------------------------------------------------------

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None:
        row = await self._fetchrow(MCP_OAUTH_SQL, server=server)
        return McpOAuthRecord(**dict(row)) if row is not None else None

    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None:
        await self._execute(
            MCP_TOKENS_SQL,
            server=server,
            binding=binding,
            tokens=tokens,
            expires_at=expires_at,
            now=now,
        )

    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None:
        await self._execute(
            MCP_CLIENT_SQL, server=server, binding=binding, client_info=client_info, now=now
        )

    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None:
        await self._execute(
            MCP_PENDING_SQL,
            server=server,
            binding=binding,
            state=state,
            verifier=verifier,
            url=url,
            now=now,
        )

    async def answer_mcp_pending(
        self, state: str, code: str, iss: str | None, now: datetime
    ) -> str | None:
        server = await self._fetchval(MCP_ANSWER_SQL, state=state, code=code, iss=iss, now=now)
        return str(server) if server is not None else None

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        row = await self._fetchrow(MCP_TAKE_SQL, server=server, state=state, now=now)
        return (row["code"], row["iss"], row["pending_verifier"]) if row is not None else None

    async def delete_mcp_oauth(self, server: str) -> None:
        await self._execute(MCP_DELETE_SQL, server=server)

    # --- housekeeping: archive and sizes -----------------------------------------------

    async def _ended(
        self, statuses: list[str], before: datetime, now: datetime, after: str, limit: int
    ) -> list[Row]:
        ended = {"statuses": statuses, "before": before, "now": now}
        return await self._fetch(ENDED_SQL, after=after, limit=limit, **ended)

    async def _delete_thread(
        self, thread_id: str, last_seq: int, statuses: list[str], before: datetime, now: datetime
    ) -> bool:
        ended = {"statuses": statuses, "before": before, "now": now}
        gone = await self._fetchval(
            DELETE_THREAD_SQL, thread_id=thread_id, last_seq=last_seq, **ended
        )
        return bool(gone)

    async def _sizes(self, thread_ids: list[str] | None) -> list[Row]:
        return await self._fetch(SIZES_SQL, thread_ids=thread_ids)

    # --- metrics -------------------------------------------------------------------------

    async def status_counts(self) -> tuple[dict[str, int], datetime | None]:
        async def read(conn: asyncpg.Connection) -> tuple[dict[str, int], datetime | None]:
            rows = await conn.fetch(STATUS_COUNTS_SQL.text)
            oldest = await conn.fetchval(OLDEST_APPROVAL_SQL.text)
            return {r["status"]: int(r["n"]) for r in rows}, oldest

        return await self._run(read)
