"""The PostgreSQL backend: every verb is one statement in autocommit on asyncpg.

One statement is one round trip and (for a write) one commit: the append moves the
thread row, inserts the events and upserts the snapshot in data-modifying CTEs, so a
writer that moved the thread first makes the guarded UPDATE match no row and nothing
is inserted. Statements are written once, here, with asyncpg's ``$n`` parameters.
SQLAlchemy is used only to create the tables from the SQLModel metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
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
    OLDEST_APPROVAL_SQL,
    STATUS_COUNTS_SQL,
    THREAD_COLUMNS,
    TIMED_STATUSES,
    Duplicate,
    Log,
    OnRunnable,
    Outcome,
    Previous,
    Row,
    Store,
    WorkerInfo,
)
from engine.tables import EVENTS, SNAPSHOTS, THREADS, WORKERS
from engine.types import ThreadKey

T = TypeVar("T")

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
# ``$V`` is the events' schema versions.
_EVENTS_FROM_ARRAYS = """
unnest($1::int[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $V::int[])
    AS e(seq, event_id, type, actor, payload, dedupe_key, schema_version)
"""
_INSERT_EVENTS = """
    INSERT INTO events
        (thread_id, seq, event_id, type, actor, created_at, payload, dedupe_key, schema_version)
"""


def _append_sql(*, keys: bool, snapshot: bool) -> str:
    """The append of a batch, with the parts it needs only: each part costs its set-up
    in the executor even when it matches nothing, and most appends (the runner's) carry
    no dedupe key and are not due a snapshot.

    $1-$6 the events as arrays; $7-$11 the thread's new last_seq, status, wake_at,
    requester, updated_at; $12 its id; $13 expected_seq; $14 the events' schema
    versions; $15 the origin; $16 ``wakes``; then, when present, the inputs' dedupe keys
    and the snapshot, in that order (``_append_args``)."""
    keys_at, snapshot_at = 17, 18 if keys else 17
    ctes = []
    if keys:
        # The keys are looked up by their own index: OFFSET 0 keeps the planner from
        # walking the thread's every event in seq order to find the first match.
        ctes.append(f"""stored AS (
    SELECT {EVENT_COLUMNS} FROM (
        SELECT * FROM events WHERE thread_id = $12 AND dedupe_key = ANY(${keys_at}::text[])
        OFFSET 0
    ) AS keyed
    ORDER BY seq LIMIT 1
)""")
    unstored = " AND NOT EXISTS (SELECT FROM stored)" if keys else ""
    ctes.append(f"""moved AS (
    UPDATE threads
    SET last_seq = $7, status = $8, wake_at = $9, requester = $10, updated_at = $11
    WHERE id = $12 AND last_seq = $13{unstored}
    RETURNING id
)""")
    ctes.append(f"""inserted AS (
    {_INSERT_EVENTS}
    SELECT moved.id, e.seq, e.event_id, e.type, e.actor, $11, e.payload, e.dedupe_key,
        e.schema_version
    FROM moved, {_EVENTS_FROM_ARRAYS.replace("$V", "$14")}
)""")
    if snapshot:
        ctes.append(f"""snapshot AS (
    INSERT INTO snapshots (thread_id, seq, state)
    SELECT moved.id, $7, ${snapshot_at}::text FROM moved
    ON CONFLICT (thread_id) DO UPDATE SET seq = EXCLUDED.seq, state = EXCLUDED.state
)""")
    woke = f"""CASE WHEN $16::bool AND EXISTS (SELECT FROM moved)
    THEN pg_notify('{RUNNABLE_CHANNEL}' || coalesce(current_schema(), 'public'),
        $12::text || ' ' || $15::text)
    END AS woke"""
    if keys:
        select = f"""SELECT (SELECT count(*) FROM moved) AS moved, stored.*, {woke}
FROM (SELECT) AS one LEFT JOIN stored ON true"""
    else:
        select = f"SELECT (SELECT count(*) FROM moved) AS moved, NULL AS seq, {woke}"
    return "\nWITH " + ",\n".join(ctes) + "\n" + select + "\n"


APPEND_SQL = {
    (keys, snapshot): _append_sql(keys=keys, snapshot=snapshot)
    for keys in (False, True)
    for snapshot in (False, True)
}


def _append_args(
    args: tuple[Any, ...], keys: list[str], snapshot: str | None
) -> tuple[str, tuple[Any, ...]]:
    """The statement for this batch and its arguments (``args``: $1-$16)."""
    sql = APPEND_SQL[bool(keys), snapshot is not None]
    more = ([keys] if keys else []) + ([snapshot] if snapshot is not None else [])
    return sql, (*args, *more)


# A new thread already at its state, with its first events and any snapshot:
# $13-$15 its team, channel and root_ts, $16 the snapshot, $17 the events' versions.
CREATE_SQL = f"""
WITH created AS (
    INSERT INTO threads
        (id, team, channel, root_ts, status, last_seq, wake_at, requester, created_at, updated_at)
    VALUES ($12, $13, $14, $15, $8, $7, $9, $10, $11, $11)
    ON CONFLICT (team, channel, root_ts) DO NOTHING
    RETURNING id
), inserted AS (
    {_INSERT_EVENTS}
    SELECT created.id, e.seq, e.event_id, e.type, e.actor, $11, e.payload, e.dedupe_key,
        e.schema_version
    FROM created, {_EVENTS_FROM_ARRAYS.replace("$V", "$17")}
), snapshot AS (
    INSERT INTO snapshots (thread_id, seq, state)
    SELECT created.id, $7, $16::text FROM created WHERE $16::text IS NOT NULL
)
SELECT count(*) FROM created
"""
CREATE_THREAD_SQL = """
WITH created AS (
    INSERT INTO threads (id, team, channel, root_ts, status, last_seq, created_at, updated_at)
    VALUES ($1, $2, $3, $4, 'new', 0, $5, $5)
    ON CONFLICT (team, channel, root_ts) DO NOTHING
    RETURNING id
)
SELECT id FROM created
UNION ALL SELECT id FROM threads WHERE team = $2 AND channel = $3 AND root_ts = $4
"""
FIND_THREAD_SQL = "SELECT id FROM threads WHERE team = $1 AND channel = $2 AND root_ts = $3"
THREAD_SQL = f"SELECT {THREAD_COLUMNS} FROM threads WHERE id = $1"
THREADS_AT_SQL = f"SELECT {THREAD_COLUMNS} FROM threads WHERE channel = $1 AND root_ts = $2"
LIST_SQL = f"""
SELECT {THREAD_COLUMNS} FROM threads
WHERE ($1::text[] IS NULL OR status = ANY($1))
  AND ($2::text IS NULL OR channel = $2)
  AND ($3::text IS NULL OR requester = $3)
ORDER BY updated_at DESC LIMIT $4
"""
EVENTS_SQL = f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = $1 AND seq > $2 ORDER BY seq"
SNAPSHOT_SQL = "SELECT state FROM snapshots WHERE thread_id = $1"
EXISTS_SQL = "SELECT 1 FROM threads WHERE id = $1"
DEDUPE_SQL = f"SELECT {EVENT_COLUMNS} FROM events WHERE thread_id = $1 AND dedupe_key = $2"
WAKE_SQL = "UPDATE threads SET wake_at = $3 WHERE id = $1 AND last_seq = $2"
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


def _takeable(now: str) -> str:
    """The lease is free, expired at ``now``, or its owner (up to a "/") is a dead
    worker's."""
    return f"""(lease_owner IS NULL OR lease_expires_at < {now}
    OR split_part(lease_owner, '/', 1) IN ({_DEAD_WORKERS}))"""


def _has_work(now: str, statuses: str) -> str:
    """The thread is running, or its timer is due at ``now``."""
    return f"(status = 'running' OR (status = ANY({statuses}::text[]) AND wake_at <= {now}))"


def _due_where(now: str, statuses: str) -> str:
    """A thread with work whose lease anyone may take."""
    return f"{_takeable(now)} AND {_has_work(now, statuses)}"


# Returns the lease it replaced (read under the row lock the UPDATE takes anyway).
ACQUIRE_SQL = f"""
WITH was AS (
    SELECT lease_owner AS was_owner, lease_expires_at AS was_until
    FROM threads WHERE id = $1 FOR UPDATE
)
UPDATE threads SET lease_owner = $2, lease_expires_at = $3 FROM was
WHERE id = $1 AND (lease_owner = $2 OR {_takeable("$4")})
RETURNING was.was_owner, was.was_until
"""
RENEW_SQL = "UPDATE threads SET lease_expires_at = $3 WHERE id = $1 AND lease_owner = $2"
RELEASE_SQL = """
UPDATE threads SET lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2
"""
DUE_SQL = f"SELECT id FROM threads WHERE {_due_where('$1', '$2')} ORDER BY updated_at LIMIT $3"
# Claimed in the statement that finds them: rows another replica is claiming at this
# moment are skipped (SKIP LOCKED), and one it claimed since our snapshot fails the
# re-check of FOR UPDATE, so replicas sweeping together never take the same thread.
# $1 now, $2 the timed statuses, $3 limit, $4 the claiming owner, $5 its lease's end,
# $6 ids to leave alone.
CLAIM_SQL = f"""
WITH due AS (
    SELECT id, lease_owner AS was_owner, lease_expires_at AS was_until
    FROM threads WHERE {_due_where("$1", "$2")} AND NOT (id = ANY($6::text[]))
    ORDER BY updated_at LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE threads SET lease_owner = $4, lease_expires_at = $5 FROM due
WHERE threads.id = due.id
RETURNING threads.id, due.was_owner, due.was_until
"""
WORKER_LOCK_SQL = f"SELECT pg_try_advisory_lock({WORKER_LOCK_CLASS}, hashtext($1))"
WORKER_UNLOCK_SQL = f"SELECT pg_advisory_unlock({WORKER_LOCK_CLASS}, hashtext($1))"
WORKER_UPSERT_SQL = """
INSERT INTO workers (id, host, pid, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, heartbeat_at = EXCLUDED.heartbeat_at
"""
WORKER_BEAT_SQL = "UPDATE workers SET heartbeat_at = $2 WHERE id = $1"
# A worker leaving forgets its row unless it still holds a lease (a run cut short): that
# row, its lock given up, then proves the lease's owner dead to whoever looks next.
WORKER_LEAVE_SQL = """
DELETE FROM workers WHERE id = $1
  AND NOT EXISTS (SELECT FROM threads WHERE split_part(lease_owner, '/', 1) = $1)
"""
# Rows of other dead workers that hold no lease: nothing needs them any more.
WORKER_PRUNE_SQL = f"""
DELETE FROM workers w WHERE w.id <> $1 AND w.id IN ({_DEAD_WORKERS})
  AND NOT EXISTS (SELECT FROM threads t WHERE split_part(t.lease_owner, '/', 1) = w.id)
"""
WORKERS_SQL = f"""
SELECT id, host, pid, started_at, heartbeat_at, id NOT IN ({_DEAD_WORKERS}) AS alive
FROM workers ORDER BY started_at
"""

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


def _arrays(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """The events as the arrays ``unnest`` takes, in the statements' order."""
    names = ("seq", "event_id", "type", "actor", "payload", "dedupe_key")
    return [[r[name] for r in rows] for name in names]


def _create_and_stamp(conn: sa.Connection) -> None:
    """Create missing tables; stamp a new database at this release's schema revision
    (one with tables already is left to ``opsloop migrate``, engine.migrations)."""
    found = sa.inspect(conn).has_table("threads")
    SQLModel.metadata.create_all(conn, tables=[THREADS, EVENTS, SNAPSHOTS, WORKERS])
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
        try:
            # The lock first, then the row: a row without its lock held reads as dead.
            if not await conn.fetchval(WORKER_LOCK_SQL, self.worker_id):
                raise ConfigError(f"worker id {self.worker_id!r} is in use by a live process")
            await conn.execute(WORKER_UPSERT_SQL, self.worker_id, *self._where, now)
            if self._on_runnable is not None:
                schema = await conn.fetchval("SELECT coalesce(current_schema(), 'public')")
                await conn.add_listener(RUNNABLE_CHANNEL + schema, self._heard)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        thread_id, _, origin = payload.partition(" ")
        if self._on_runnable is not None and origin != self._origin:
            self._on_runnable(thread_id)

    async def beat(self, now: datetime) -> bool:
        conn = self._conn
        if conn is not None and not conn.is_closed():
            try:
                if _rows_of(await conn.execute(WORKER_BEAT_SQL, self.worker_id, now)) == 0:
                    await conn.execute(WORKER_UPSERT_SQL, self.worker_id, *self._where, now)
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
                await conn.execute(WORKER_LEAVE_SQL, self.worker_id)
                await conn.fetchval(WORKER_UNLOCK_SQL, self.worker_id)
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

    async def _fetch(self, sql: str, *args: Any) -> list[Row]:
        return await self._run(lambda conn: conn.fetch(sql, *args))

    async def _execute(self, sql: str, *args: Any) -> int:
        return _rows_of(await self._run(lambda conn: conn.execute(sql, *args)))

    async def create_tables(self) -> None:
        with self._mapped(DBAPIError):
            async with self.engine.begin() as conn:
                # CREATE … IF NOT EXISTS races between processes starting together.
                await conn.execute(sa.text("SELECT pg_advisory_xact_lock(7270010001)"))
                if self.config.schema:
                    name = self.config.schema.replace('"', '""')
                    await conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{name}"'))
                await conn.run_sync(_create_and_stamp)

    async def ping(self) -> None:
        await self._run(lambda conn: conn.fetchval("SELECT 1"))

    async def close(self) -> None:
        presences, self._presences = list(self._presences.values()), {}
        for presence in presences:  # the session goes, and with it the lock
            with contextlib.suppress(Exception):
                await presence.close(forget=False)
        await self._pool.close()
        await self.engine.dispose()

    # --- threads -----------------------------------------------------------------------

    async def _create_thread(self, new_id: str, key: ThreadKey, now: datetime) -> str:
        where = (key.team, key.channel, key.root_ts)
        found = await self._run(lambda c: c.fetchval(CREATE_THREAD_SQL, new_id, *where, now))
        if found is None:  # created by a statement that committed after ours began
            found = await self.find_thread(key)
        assert found is not None
        return str(found)

    async def find_thread(self, key: ThreadKey) -> str | None:
        where = (key.team, key.channel, key.root_ts)
        found = await self._run(lambda conn: conn.fetchval(FIND_THREAD_SQL, *where))
        return None if found is None else str(found)

    async def _threads(self, *, thread_id: str | None, at: tuple[str, str] | None) -> list[Row]:
        if at is not None:
            return await self._fetch(THREADS_AT_SQL, *at)
        return await self._fetch(THREAD_SQL, thread_id)

    async def _list_threads(
        self, statuses: list[str] | None, limit: int, channel: str | None, requester: str | None
    ) -> list[Row]:
        return await self._fetch(LIST_SQL, statuses, channel, requester, limit)

    # --- events ------------------------------------------------------------------------

    async def _events(self, thread_id: str, after: int) -> list[Row]:
        return await self._fetch(EVENTS_SQL, thread_id, after)

    async def _log(self, thread_id: str, start: Callable[[ThreadState | None], int]) -> Log:
        async def read(conn: asyncpg.Connection) -> Log:
            snap = await conn.fetchval(SNAPSHOT_SQL, thread_id)
            base = ThreadState.model_validate_json(snap) if snap is not None else None
            rows = await conn.fetch(EVENTS_SQL, thread_id, start(base))
            exists = bool(base or rows) or await conn.fetchval(EXISTS_SQL, thread_id) is not None
            return Log(base, rows, exists)

        return await self._run(read)

    async def _dedupe(self, thread_id: str, key: str) -> Row | None:
        return await self._run(lambda conn: conn.fetchrow(DEDUPE_SQL, thread_id, key))

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
        moved = (state.last_seq, state.status, state.wake_at, state.requester, now)
        args = (*_arrays(rows), *moved, thread_id)
        keys = [r["dedupe_key"] for r in rows if r["dedupe_key"]]
        versions = [r["schema_version"] for r in rows]
        try:
            if create is not None:
                where = (create.team, create.channel, create.root_ts)
                created = await self._run(
                    lambda c: c.fetchval(CREATE_SQL, *args, *where, snapshot, versions)
                )
                return "written" if created == 1 else "moved"
            sql, full = _append_args(
                (*args, expected_seq, versions, self.origin, wakes), keys, snapshot
            )
            found = await self._run(lambda c: c.fetchrow(sql, *full))
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
        return await self._execute(WAKE_SQL, thread_id, expected_seq, wake_at) == 1

    async def _acquire(
        self, thread_id: str, owner: str, until: datetime, now: datetime
    ) -> Previous | None:
        found = await self._run(lambda c: c.fetchrow(ACQUIRE_SQL, thread_id, owner, until, now))
        return None if found is None else (found["was_owner"], found["was_until"])

    async def _renew(self, thread_id: str, owner: str, until: datetime) -> bool:
        return await self._execute(RENEW_SQL, thread_id, owner, until) == 1

    async def release_lease(self, thread_id: str, owner: str) -> None:
        await self._execute(RELEASE_SQL, thread_id, owner)

    async def _due(self, now: datetime, limit: int) -> list[str]:
        rows = await self._fetch(DUE_SQL, now, list(TIMED_STATUSES), limit)
        return [r["id"] for r in rows]

    async def _claim(
        self, owner: str, until: datetime, now: datetime, limit: int, skip: list[str]
    ) -> list[tuple[str, Previous]]:
        args = (now, list(TIMED_STATUSES), limit, owner, until, skip)
        rows = await self._fetch(CLAIM_SQL, *args)
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
        await self._execute(WORKER_PRUNE_SQL, worker_id)

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

    # --- housekeeping: archive and sizes -----------------------------------------------

    # $1 statuses, $2 updated before, $3 now (leases), then the rest.
    _ENDED_WHERE = """
    status = ANY($1::text[]) AND updated_at < $2
      AND (lease_owner IS NULL OR lease_expires_at < $3)
    """
    ENDED_SQL = f"""
    SELECT {THREAD_COLUMNS} FROM threads WHERE {_ENDED_WHERE} AND id > $4 ORDER BY id LIMIT $5
    """
    # One statement, so one transaction: the row goes only if it still matches (an append
    # that moved it first makes the guarded DELETE match nothing, so nothing else goes;
    # one that comes after finds no row). Its children go in the same statement, which
    # the foreign keys (NO ACTION: checked at the statement's end) allow.
    DELETE_THREAD_SQL = f"""
    WITH gone AS (
        DELETE FROM threads WHERE {_ENDED_WHERE} AND id = $4 AND last_seq = $5 RETURNING id
    ), events_gone AS (
        DELETE FROM events WHERE thread_id IN (SELECT id FROM gone)
    ), snapshot_gone AS (
        DELETE FROM snapshots WHERE thread_id IN (SELECT id FROM gone)
    )
    SELECT count(*) FROM gone
    """
    # $1 thread ids (NULL: every thread). Bytes: the payload's octets.
    SIZES_SQL = """
    SELECT thread_id, count(*) AS events, coalesce(sum(octet_length(payload)), 0) AS bytes
    FROM events WHERE $1::text[] IS NULL OR thread_id = ANY($1::text[])
    GROUP BY thread_id
    """

    async def _ended(
        self, statuses: list[str], before: datetime, now: datetime, after: str, limit: int
    ) -> list[Row]:
        return await self._fetch(self.ENDED_SQL, statuses, before, now, after, limit)

    async def _delete_thread(
        self, thread_id: str, last_seq: int, statuses: list[str], before: datetime, now: datetime
    ) -> bool:
        args = (statuses, before, now, thread_id, last_seq)
        gone = await self._run(lambda conn: conn.fetchval(self.DELETE_THREAD_SQL, *args))
        return bool(gone)

    async def _sizes(self, thread_ids: list[str] | None) -> list[Row]:
        return await self._fetch(self.SIZES_SQL, thread_ids)

    # --- metrics -------------------------------------------------------------------------

    async def status_counts(self) -> tuple[dict[str, int], datetime | None]:
        async def read(conn: asyncpg.Connection) -> tuple[dict[str, int], datetime | None]:
            rows = await conn.fetch(STATUS_COUNTS_SQL)
            oldest = await conn.fetchval(OLDEST_APPROVAL_SQL)
            return {r["status"]: int(r["n"]) for r in rows}, oldest

        return await self._run(read)
