"""The event store: threads, their append-only logs, snapshots and leases.

One adapter for SQLite and PostgreSQL; only engine creation, upserts and the
unique-violation mapping differ. Public methods open their transaction; ``_…_txn``
helpers compose inside one.

Appending is optimistic: ``insert_events(thread_id, events, expected_seq)`` moves the
thread row from ``expected_seq`` to its new ``last_seq`` with a guarded UPDATE in the
same transaction as the INSERT, so a concurrent writer gets ``ConcurrencyConflict``,
never a gap or a duplicate seq.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlmodel import SQLModel

from engine import faults, mapper, pg_fast, sqlite_fast
from engine.db import DatabaseConfig, create_engine, parse_database_url
from engine.errors import ConcurrencyConflict, StoreUnavailable, ThreadNotFound
from engine.events import AnyEvent, Event, utcnow
from engine.state import ThreadState, reduce
from engine.tables import EVENTS, SNAPSHOTS, THREADS

SNAPSHOT_EVERY = 200
# What the drivers raise when the database cannot be reached (not a refused statement).
_DRIVER_DOWN = (
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    sqlite3.OperationalError,
    OSError,
)
# Statuses whose wake_at means "look again at this time".
TIMED_STATUSES = ("sleeping", "awaiting_approval", "awaiting_job")


@dataclass(frozen=True)
class ThreadKey:
    """Where a thread lives in Slack (or another front door): unique per thread."""

    team: str
    channel: str
    root_ts: str


@dataclass(frozen=True)
class ThreadInfo:
    id: str
    team: str
    channel: str
    root_ts: str
    requester: str | None
    status: str
    last_seq: int
    wake_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Appended:
    """What an append stored. ``deduplicated``: the input was there already."""

    events: list[AnyEvent]
    state: ThreadState | None
    deduplicated: bool = False


def _stamp(
    thread_id: str, events: Sequence[Event], expected_seq: int, state: ThreadState, now: datetime
) -> tuple[list[AnyEvent], ThreadState]:
    """Give drafts their envelope and apply them (IllegalTransition: nothing is written)."""
    stamped: list[Any] = [
        e.model_copy(update={"thread_id": thread_id, "seq": expected_seq + i, "created_at": now})
        for i, e in enumerate(events, start=1)
    ]
    return stamped, reduce(stamped, state)


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


class Store:
    def __init__(self, engine: AsyncEngine, config: DatabaseConfig) -> None:
        self.engine = engine
        self.config = config
        # PostgreSQL only: plain asyncpg connections for the one-round-trip append; the
        # ORM pool's checkout and return alone cost more than the commit.
        self._fast: pg_fast.Connections | None = None
        # SQLite only: one thread and connection that runs each hot write in one hop.
        self._writer: sqlite_fast.Writer | None = None
        # SQLite's writes that do not go through ``_writer`` (a snapshot every 200
        # events, an append without the caller's state) queue here, in order, rather
        # than in SQLite's busy handler, which sleeps up to 100 ms between tries.
        # Reads take no lock (WAL snapshots).
        self._writes = asyncio.Lock() if config.dialect == "sqlite" else None
        self._reader = engine.execution_options(opsloop_read_only=True)

    @classmethod
    async def open(cls, url: str, *, create: bool = True, pool_size: int = 10) -> Store:
        """Connect (and create missing tables); unreachable: ``StoreUnavailable``."""
        config = parse_database_url(url)
        engine = create_engine(config, pool_size=pool_size)
        store = cls(engine, config)
        try:
            if create:
                await store.create_tables()
            else:
                await store.ping()
            if config.dialect == "postgresql":
                store._fast = pg_fast.connections(config, pool_size)
            elif config.url.database and config.url.database != ":memory:":
                store._writer = sqlite_fast.shared_writer(config.url.database)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
            self._fast = None
        if self._writer is not None:
            await sqlite_fast.release(self._writer)
            self._writer = None
        await self.engine.dispose()

    async def create_tables(self) -> None:
        try:
            async with self.engine.begin() as conn:
                if self.config.dialect == "postgresql":
                    # CREATE … IF NOT EXISTS races between processes starting together.
                    await conn.execute(sa.text("SELECT pg_advisory_xact_lock(7270010001)"))
                if self.config.schema:
                    name = self.config.schema.replace('"', '""')
                    await conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{name}"'))
                await conn.run_sync(SQLModel.metadata.create_all, tables=_TABLES)
        except (OperationalError, DBAPIError, OSError) as exc:
            raise self._unavailable(exc) from exc

    @contextlib.asynccontextmanager
    async def _begin(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction (on SQLite, after this process's earlier writers)."""
        if self._writes is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._writes, self.engine.begin() as conn:
            yield conn

    async def ping(self) -> None:
        try:
            async with self._reader.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except (OperationalError, DBAPIError, OSError) as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        why = cause[0] if cause else type(exc).__name__
        return StoreUnavailable(f"cannot reach the database {self.config.display()}: {why}")

    # --- threads --------------------------------------------------------------------

    async def create_thread(self, key: ThreadKey, *, now: datetime | None = None) -> str:
        """The id of the thread at ``key``, creating it if new (idempotent, race-safe)."""
        now = now or utcnow()
        if self._writer is not None:
            try:
                return await self._writer.create_thread(
                    new_thread_id(), key.team, key.channel, key.root_ts, now
                )
            except _DRIVER_DOWN as exc:
                raise self._unavailable(exc) from exc
        async with self._begin() as conn:
            return await self._create_thread_txn(conn, key, now)

    async def _create_thread_txn(self, conn: AsyncConnection, key: ThreadKey, now: datetime) -> str:
        existing = await self._find_thread_txn(conn, key)
        if existing is not None:
            return existing
        values = {
            "id": new_thread_id(),
            "team": key.team,
            "channel": key.channel,
            "root_ts": key.root_ts,
            "status": "new",
            "last_seq": 0,
            "created_at": now,
            "updated_at": now,
        }
        insert = self._insert(THREADS).values(**values).on_conflict_do_nothing()
        await conn.execute(insert)
        found = await self._find_thread_txn(conn, key)
        assert found is not None
        return found

    async def find_thread(self, key: ThreadKey) -> str | None:
        where = (key.team, key.channel, key.root_ts)
        try:
            if self._writer is not None:
                return await self._writer.find_thread(*where)
            if self._fast is not None:
                found = await self._fast.fetchval(pg_fast.FIND_THREAD_SQL, *where)
                return None if found is None else str(found)
        except _DRIVER_DOWN as exc:
            raise self._unavailable(exc) from exc
        async with self._reader.connect() as conn:
            return await self._find_thread_txn(conn, key)

    async def _find_thread_txn(self, conn: AsyncConnection, key: ThreadKey) -> str | None:
        query = sa.select(THREADS.c.id).where(
            THREADS.c.team == key.team,
            THREADS.c.channel == key.channel,
            THREADS.c.root_ts == key.root_ts,
        )
        return (await conn.execute(query)).scalar_one_or_none()

    async def get_thread(self, thread_id: str) -> ThreadInfo:
        async with self._reader.connect() as conn:
            row = (await conn.execute(THREADS.select().where(THREADS.c.id == thread_id))).first()
        if row is None:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        return ThreadInfo(**row._asdict())

    async def resolve_thread(self, ref: str) -> ThreadInfo:
        """A thread by id, or by ``CHANNEL/THREAD_TS`` as people copy it from Slack."""
        if "/" not in ref:
            return await self.get_thread(ref)
        channel, _, ts = ref.partition("/")
        query = THREADS.select().where(THREADS.c.channel == channel, THREADS.c.root_ts == ts)
        async with self._reader.connect() as conn:
            rows = (await conn.execute(query)).all()
        if not rows:
            raise ThreadNotFound(f"no thread {ref!r}")
        if len(rows) > 1:  # the same channel id and ts in two workspaces
            ids = ", ".join(sorted(r.id for r in rows))
            raise ThreadNotFound(f"{ref!r} is ambiguous (threads {ids}): use the thread id")
        return ThreadInfo(**rows[0]._asdict())

    async def list_threads(self, status: str | None = None, limit: int = 1000) -> list[ThreadInfo]:
        query = THREADS.select().order_by(THREADS.c.updated_at.desc()).limit(limit)
        if status:
            query = query.where(THREADS.c.status == status)
        async with self._reader.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [ThreadInfo(**row._asdict()) for row in rows]

    # --- events ---------------------------------------------------------------------

    async def select_events(self, thread_id: str, *, after: int = 0) -> list[AnyEvent]:
        query = (
            EVENTS.select()
            .where(EVENTS.c.thread_id == thread_id, EVENTS.c.seq > after)
            .order_by(EVENTS.c.seq)
        )
        async with self._reader.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [mapper.from_row(row) for row in rows]

    async def load(self, thread_id: str) -> ThreadState:
        """The thread's state: its latest snapshot plus the events after it."""
        async with self._reader.connect() as conn:
            return await self._load_txn(conn, thread_id)

    async def _load_txn(self, conn: AsyncConnection, thread_id: str) -> ThreadState:
        snap = (
            await conn.execute(
                sa.select(SNAPSHOTS.c.seq, SNAPSHOTS.c.state).where(
                    SNAPSHOTS.c.thread_id == thread_id
                )
            )
        ).first()
        base = ThreadState.model_validate_json(snap.state) if snap else None
        after = snap.seq if snap else 0
        rows = (
            await conn.execute(
                EVENTS.select()
                .where(EVENTS.c.thread_id == thread_id, EVENTS.c.seq > after)
                .order_by(EVENTS.c.seq)
            )
        ).all()
        if base is None and not rows:
            exists = await conn.execute(sa.select(THREADS.c.id).where(THREADS.c.id == thread_id))
            if exists.first() is None:
                raise ThreadNotFound(f"no thread {thread_id!r}")
            return ThreadState(thread_id=thread_id)
        return reduce((mapper.from_row(r) for r in rows), base)

    async def load_for_projection(self, thread_id: str) -> tuple[ThreadState, list[AnyEvent]]:
        """The state, and the events a prompt needs: those after the latest compaction's
        ``upto_seq`` (its summary stands for the rest). One read: from the snapshot's
        compaction on, folding onto the snapshot what lies past it."""
        async with self._reader.connect() as conn:
            snap = (
                await conn.execute(
                    sa.select(SNAPSHOTS.c.seq, SNAPSHOTS.c.state).where(
                        SNAPSHOTS.c.thread_id == thread_id
                    )
                )
            ).first()
            base = ThreadState.model_validate_json(snap.state) if snap else None
            start = base.compaction[1] if base is not None and base.compaction else 0
            rows = (
                await conn.execute(
                    EVENTS.select()
                    .where(EVENTS.c.thread_id == thread_id, EVENTS.c.seq > start)
                    .order_by(EVENTS.c.seq)
                )
            ).all()
            if base is None and not rows:
                await self._load_txn(conn, thread_id)  # ThreadNotFound, or an empty thread
        events = [mapper.from_row(r) for r in rows]
        done = base.last_seq if base is not None else 0
        state = reduce((e for e in events if e.seq > done), base)
        upto = state.compaction[1] if state.compaction else 0
        return state, [e for e in events if e.seq > upto]

    async def find_by_dedupe_key(self, thread_id: str, key: str) -> AnyEvent | None:
        async with self._reader.connect() as conn:
            return await self._dedupe_txn(conn, thread_id, key)

    async def _dedupe_txn(self, conn: AsyncConnection, thread_id: str, key: str) -> AnyEvent | None:
        row = (
            await conn.execute(
                EVENTS.select().where(EVENTS.c.thread_id == thread_id, EVENTS.c.dedupe_key == key)
            )
        ).first()
        return mapper.from_row(row) if row else None

    async def insert_events(
        self,
        thread_id: str,
        events: Sequence[Event],
        expected_seq: int,
        *,
        state: ThreadState | None = None,
        now: datetime | None = None,
    ) -> Appended:
        """Append ``events`` after ``expected_seq`` in one transaction.

        ``state`` is the caller's state at ``expected_seq`` (saves a read); the events
        are applied to it first, so an illegal one raises and nothing is written. An
        input whose ``dedupe_key`` is stored already is a no-op returning the stored
        event. A stale ``expected_seq`` raises ``ConcurrencyConflict``.
        """
        now = now or utcnow()
        keys = [e.dedupe_key for e in events if e.dedupe_key]
        if state is not None and state.last_seq == expected_seq:
            stamped, new_state = _stamp(thread_id, events, expected_seq, state, now)
            crosses = new_state.last_seq // SNAPSHOT_EVERY > expected_seq // SNAPSHOT_EVERY
            if (self._fast is not None or self._writer is not None) and not crosses:
                try:
                    await self._append_fast(thread_id, expected_seq, stamped, new_state, now)
                except ConcurrencyConflict:
                    for key in keys:  # the unique index met an input stored already
                        if (stored := await self.find_by_dedupe_key(thread_id, key)) is not None:
                            return Appended(events=[stored], state=None, deduplicated=True)
                    raise
                faults.hit("append")  # crash tests: die right after a commit
                return Appended(events=stamped, state=new_state)
        try:
            async with self._begin() as conn:
                for key in keys:
                    stored = await self._dedupe_txn(conn, thread_id, key)
                    if stored is not None:
                        return Appended(events=[stored], state=None, deduplicated=True)
                if state is None or state.last_seq != expected_seq:
                    state = await self._load_txn(conn, thread_id)
                    if state.last_seq != expected_seq:
                        raise ConcurrencyConflict(thread_id, expected_seq)
                done = await self._write_txn(conn, thread_id, events, state, now)
        except IntegrityError as exc:
            # A unique index caught a writer our guarded UPDATE could not (first events
            # of a thread racing on SQLite, a dedupe key racing): the caller re-reads.
            raise ConcurrencyConflict(thread_id, expected_seq) from exc
        faults.hit("append")  # crash tests: die right after a commit
        return done

    async def append_input(
        self,
        key: ThreadKey,
        build: Callable[[ThreadState], Event],
        *,
        dedupe_key: str | None = None,
        now: datetime | None = None,
        start: bool = True,
    ) -> tuple[str, Appended]:
        """Store the input ``build(state)`` in the thread at ``key`` (created if new, or
        ``ThreadNotFound`` when ``start`` is false): what a front door does before it
        answers. An input whose ``dedupe_key`` is stored already returns the stored
        event and writes nothing.

        The reads come first, outside any write lock; the write is the guarded append,
        so a writer that moved the thread meanwhile makes it ``ConcurrencyConflict``
        (the caller reads again) and a racing duplicate meets the unique index.
        """
        now = now or utcnow()
        thread_id = await self.find_thread(key)
        if thread_id is None and not start:
            raise ThreadNotFound(f"no thread at {key.channel}/{key.root_ts}")
        if thread_id is None and (self._writer is not None or self._fast is not None):
            return await self._append_new_thread(key, build, now)
        if thread_id is not None:
            async with self._reader.connect() as conn:
                if dedupe_key and (stored := await self._dedupe_txn(conn, thread_id, dedupe_key)):
                    return thread_id, Appended(events=[stored], state=None, deduplicated=True)
                state = await self._load_txn(conn, thread_id)
        else:
            thread_id = await self.create_thread(key, now=now)
            state = await self.load(thread_id)
        event = build(state)
        done = await self.insert_events(thread_id, [event], state.last_seq, state=state, now=now)
        return thread_id, done

    async def _append_new_thread(
        self, key: ThreadKey, build: Callable[[ThreadState], Event], now: datetime
    ) -> tuple[str, Appended]:
        """A new thread and its first input in one transaction: one hop on SQLite, one
        statement on PostgreSQL."""
        thread_id = new_thread_id()
        state = ThreadState(thread_id=thread_id)
        stamped, new_state = _stamp(thread_id, [build(state)], 0, state, now)
        rows = [mapper.to_row(e) for e in stamped]
        where = (key.team, key.channel, key.root_ts)
        try:
            if self._writer is not None:
                written = self._writer.append(thread_id, 0, rows, new_state, now, create=where)
                created = await written == "done"
            else:
                assert self._fast is not None
                created = await pg_fast.create_and_append(self._fast, where, rows, new_state, now)
        except _DRIVER_DOWN as exc:
            raise self._unavailable(exc) from exc
        except asyncpg.UniqueViolationError as exc:
            raise ConcurrencyConflict(thread_id, 0) from exc
        if not created:  # someone created the thread first: the caller reads again
            raise ConcurrencyConflict(thread_id, 0)
        faults.hit("append")
        return thread_id, Appended(events=stamped, state=new_state)

    async def _write_txn(
        self,
        conn: AsyncConnection,
        thread_id: str,
        events: Sequence[Event],
        state: ThreadState,
        now: datetime,
    ) -> Appended:
        expected_seq = state.last_seq
        stamped, new_state = _stamp(thread_id, events, expected_seq, state, now)
        await self._move_thread_txn(conn, thread_id, expected_seq, new_state, now)
        await conn.execute(EVENTS.insert(), [mapper.to_row(e) for e in stamped])
        if new_state.last_seq // SNAPSHOT_EVERY > expected_seq // SNAPSHOT_EVERY:
            await self._snapshot_txn(conn, new_state)
        return Appended(events=stamped, state=new_state)

    async def _append_fast(
        self,
        thread_id: str,
        expected_seq: int,
        stamped: list[AnyEvent],
        state: ThreadState,
        now: datetime,
    ) -> None:
        rows = [mapper.to_row(e) for e in stamped]
        try:
            if self._writer is not None:
                outcome = await self._writer.append(thread_id, expected_seq, rows, state, now)
                moved = outcome == "done"  # a duplicate: found by the caller's lookup
            else:
                assert self._fast is not None
                moved = await pg_fast.append(self._fast, thread_id, expected_seq, rows, state, now)
        except (asyncpg.UniqueViolationError, sqlite3.IntegrityError) as exc:
            raise ConcurrencyConflict(thread_id, expected_seq) from exc
        except _DRIVER_DOWN as exc:
            raise self._unavailable(exc) from exc
        if not moved:
            await self.get_thread(thread_id)  # ThreadNotFound if it is not there at all
            raise ConcurrencyConflict(thread_id, expected_seq)

    async def append(
        self,
        thread_id: str,
        expected_seq: int,
        events: Sequence[Event],
        *,
        state: ThreadState | None = None,
        now: datetime | None = None,
    ) -> Appended:
        """DESIGN's ``append(thread_id, expected_seq, events)``: ``insert_events``."""
        return await self.insert_events(thread_id, events, expected_seq, state=state, now=now)

    async def _move_thread_txn(
        self,
        conn: AsyncConnection,
        thread_id: str,
        expected_seq: int,
        state: ThreadState,
        now: datetime,
    ) -> None:
        update = (
            THREADS.update()
            .where(THREADS.c.id == thread_id, THREADS.c.last_seq == expected_seq)
            .values(
                last_seq=state.last_seq,
                status=state.status,
                wake_at=state.wake_at,
                requester=state.requester,
                updated_at=now,
            )
        )
        result = await conn.execute(update)
        if result.rowcount == 1:
            return
        exists = await conn.execute(sa.select(THREADS.c.id).where(THREADS.c.id == thread_id))
        if exists.first() is None:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        raise ConcurrencyConflict(thread_id, expected_seq)

    async def _snapshot_txn(self, conn: AsyncConnection, state: ThreadState) -> None:
        values = {"thread_id": state.thread_id, "seq": state.last_seq}
        body = state.model_dump_json()
        stmt = self._insert(SNAPSHOTS).values(**values, state=body)
        stmt = stmt.on_conflict_do_update(
            index_elements=[SNAPSHOTS.c.thread_id], set_={"seq": state.last_seq, "state": body}
        )
        await conn.execute(stmt)

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self.config.dialect == "postgresql" else sqlite
        return dialect.insert(table)

    # --- timers and leases ----------------------------------------------------------

    async def set_wake_at(self, thread_id: str, expected_seq: int, wake_at: datetime) -> bool:
        """Move a waiting thread's next look (a poll that found the job still running)."""
        update = (
            THREADS.update()
            .where(THREADS.c.id == thread_id, THREADS.c.last_seq == expected_seq)
            .values(wake_at=wake_at)
        )
        args = (thread_id, expected_seq, wake_at)
        return await self._update(update, pg_fast.WAKE_SQL, sqlite_fast.WAKE_SQL, *args) == 1

    async def acquire_lease(
        self, thread_id: str, owner: str, ttl: float, *, now: datetime | None = None
    ) -> bool:
        """Take the thread for ``ttl`` seconds unless another owner holds a live lease."""
        now = now or utcnow()
        until = now + timedelta(seconds=ttl)
        free = sa.or_(
            THREADS.c.lease_owner.is_(None),
            THREADS.c.lease_owner == owner,
            THREADS.c.lease_expires_at < now,
        )
        update = (
            THREADS.update()
            .where(THREADS.c.id == thread_id, free)
            .values(lease_owner=owner, lease_expires_at=until)
        )
        args = (thread_id, owner, until, now)
        return await self._update(update, pg_fast.ACQUIRE_SQL, sqlite_fast.ACQUIRE_SQL, *args) == 1

    async def renew_lease(
        self, thread_id: str, owner: str, ttl: float, *, now: datetime | None = None
    ) -> bool:
        until = (now or utcnow()) + timedelta(seconds=ttl)
        update = (
            THREADS.update()
            .where(THREADS.c.id == thread_id, THREADS.c.lease_owner == owner)
            .values(lease_expires_at=until)
        )
        return (
            await self._update(
                update, pg_fast.RENEW_SQL, sqlite_fast.RENEW_SQL, thread_id, owner, until
            )
            == 1
        )

    async def release_lease(self, thread_id: str, owner: str) -> None:
        update = (
            THREADS.update()
            .where(THREADS.c.id == thread_id, THREADS.c.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
        )
        await self._update(update, pg_fast.RELEASE_SQL, sqlite_fast.RELEASE_SQL, thread_id, owner)

    async def _update(self, update: sa.Update, pg_sql: str, sqlite_sql: str, *args: Any) -> int:
        """Run a one-statement write in one round trip (one hop on SQLite)."""
        try:
            if self._writer is not None:
                return await self._writer.execute(sqlite_sql, *args)
            if self._fast is not None:
                return pg_fast.rows_of(await self._fast.execute(pg_sql, *args))
        except _DRIVER_DOWN as exc:
            raise self._unavailable(exc) from exc
        async with self._begin() as conn:
            return (await conn.execute(update)).rowcount

    async def due_threads(self, now: datetime | None = None, limit: int = 100) -> list[str]:
        """Threads with work and no live lease: timers due, or runnable and unowned."""
        now = now or utcnow()
        unleased = sa.or_(THREADS.c.lease_owner.is_(None), THREADS.c.lease_expires_at < now)
        timed = sa.and_(THREADS.c.status.in_(TIMED_STATUSES), THREADS.c.wake_at <= now)
        query = (
            sa.select(THREADS.c.id)
            .where(unleased, sa.or_(THREADS.c.status == "running", timed))
            .order_by(THREADS.c.updated_at)
            .limit(limit)
        )
        async with self._reader.connect() as conn:
            return list((await conn.execute(query)).scalars())


_TABLES = [THREADS, EVENTS, SNAPSHOTS]
