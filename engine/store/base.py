"""The store port and its dialect-free core: stamping, snapshots, duplicates, errors.

``Store`` is the port every caller names; ``engine.store.sqlite.SqliteStore`` and
``engine.store.postgres.PostgresStore`` are whole backends behind it, each holding
all its SQL in one section at the top of its module, each statement written once
(``?`` for ``sqlite3``; ``:name`` for asyncpg, numbered once at import).
``engine.store.open_store(url)`` picks the backend by the URL's dialect. What does not
depend on the dialect lives here, once:

* stamping: drafts get their envelope and are applied to the caller's state before
  anything is written (``IllegalTransition``: nothing is written);
* the snapshot cadence: an append that crosses a multiple of ``SNAPSHOT_EVERY`` carries
  the new state, and the backend upserts it in the append's own transaction;
* the duplicate-input rule: an input whose ``dedupe_key`` is stored already is a no-op
  returning the stored event; a backend's append answers ``"written"``, ``"moved"``
  (the thread was not at ``expected_seq``) or ``Duplicate(row)``, and a "moved" thread
  that holds the input is a duplicate too, not a conflict;
* error mapping: a backend lists the driver errors that mean "the database cannot be
  reached" (``DOWN``) and runs every statement, read or write, inside ``_mapped()``,
  which turns them into ``StoreUnavailable``.

Appending is optimistic: the backend moves the thread row from ``expected_seq`` with a
guarded UPDATE in the same transaction as the INSERT, so a concurrent writer gets
``ConcurrencyConflict``, never a gap or a duplicate seq.
"""

from __future__ import annotations

import abc
import contextlib
import secrets
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from engine import faults, mapper, metrics
from engine.db import DatabaseConfig
from engine.errors import ConcurrencyConflict, StoreUnavailable, ThreadNotFound
from engine.events import AnyEvent, Event, GrantCreated, GrantRevoked, utcnow
from engine.frozen import replaced
from engine.grants import GRANT_LONGEST_S
from engine.state import ThreadState, reduce
from engine.types import Appended, Decided, ThreadInfo, ThreadKey
from tools.mcp.oauth_record import McpOAuthRecord, TakenCode

SNAPSHOT_EVERY = 200
# Statuses whose wake_at means "look again at this time".
TIMED_STATUSES = ("sleeping", "awaiting_approval", "awaiting_job")
# Statuses of a thread that ended: what `opsloop archive` may take out of the hot tables.
ENDED_STATUSES = ("idle", "failed", "cancelled")
# The rows the core reads, whatever the backend: a thread row in ThreadInfo's order, an
# event row as the mapper takes it (each backend's statements select these columns).
THREAD_COLUMNS = (
    "id, team, channel, root_ts, requester, status, last_seq, wake_at, lease_owner, "
    "lease_expires_at, created_at, updated_at"
)
EVENT_COLUMNS = (
    "thread_id, seq, event_id, type, actor, created_at, dedupe_key, payload, schema_version"
)

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Duplicate:
    """The append carried an input whose dedupe key is stored already: that row."""

    row: Row


# What a backend's append did: wrote the events; found the thread elsewhere than
# ``expected_seq`` (or, for a new thread, a thread at its key already); or met a
# stored input.
Outcome = Literal["written", "moved"] | Duplicate


@dataclass(frozen=True)
class Log:
    """What a load read: the snapshot it started from, the rows after it, and whether
    the thread exists at all (a thread without events has neither)."""

    base: ThreadState | None
    rows: list[Row]
    exists: bool


@dataclass(frozen=True)
class WorkerInfo:
    """A registered worker (engine.workers); ``alive``: not provably dead (its proof of
    life is held, or cannot be checked from here)."""

    id: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    alive: bool


MCP_OAUTH_COLUMNS = (
    "server, binding, tokens, expires_at, client_info, pending_state, pending_verifier, "
    "pending_url, pending_since, code, iss, updated_at"
)


# Called with a thread id when another session made that thread runnable (PostgreSQL
# NOTIFY); called with None after the channel was lost and found again (look at all).
OnRunnable = Callable[[str | None], None]


# A lease as it was before a take: (owner, expiry), both None when it was free.
Previous = tuple[str | None, datetime | None]


def _count_takeover(owner: str, previous: Previous, now: datetime) -> None:
    """Count a lease taken from another owner: it had expired, or its owner was dead."""
    was_owner, was_until = previous
    if was_owner is None or was_owner == owner:
        return
    reason = "expired" if was_until is None or was_until < now else "dead_owner"
    metrics.LEASE_TAKEOVERS.labels(reason=reason).inc()


def new_thread_id() -> str:
    return f"thr_{uuid.uuid4().hex[:20]}"


def stamp(
    thread_id: str, events: Sequence[Event], expected_seq: int, state: ThreadState, now: datetime
) -> tuple[list[AnyEvent], ThreadState]:
    """Give drafts their envelope and apply them (IllegalTransition: nothing is written)."""
    stamped: list[Any] = [
        replaced(e, {"thread_id": thread_id, "seq": expected_seq + i, "created_at": now})
        for i, e in enumerate(events, start=1)
    ]
    return stamped, reduce(stamped, state)


def snapshot_due(expected_seq: int, state: ThreadState) -> str | None:
    """The state to store with an append that crosses a multiple of SNAPSHOT_EVERY."""
    if state.last_seq // SNAPSHOT_EVERY > expected_seq // SNAPSHOT_EVERY:
        return state.model_dump_json()
    return None


def statuses_of(status: str | Collection[str] | None) -> list[str] | None:
    """One status, several, or None for any."""
    if status is None or status == "":
        return None
    return [status] if isinstance(status, str) else list(status)


class Store(abc.ABC):
    """Threads, their append-only logs, snapshots and leases.

    ``engine.store.open_store(url)`` gives the backend of the URL's dialect, connected.
    ``engine`` (SQLAlchemy) creates the tables from the SQLModel metadata (and serves
    people who run SQL by hand); the verbs run on the backend's own driver connections.
    """

    # Driver errors meaning the database cannot be reached (not a refused statement).
    DOWN: ClassVar[tuple[type[BaseException], ...]] = (OSError,)

    def __init__(
        self,
        engine: AsyncEngine,
        config: DatabaseConfig,
        *,
        pool_size: int = 10,
        origin: str | None = None,
    ):
        self.engine = engine
        self.config = config
        # Who appends through this store: a worker registered on a store of the same
        # origin ignores the wake-ups (NOTIFY) of these appends; the front door that
        # made them kicks it. One per process (the serving and the worker loop's
        # stores share it); a store of its own by default.
        self.origin = origin or secrets.token_hex(8)
        self._setup(pool_size)

    @abc.abstractmethod
    def _setup(self, pool_size: int) -> None:
        """The backend's own connections (``pool_size``: for the concurrent ones)."""

    @contextlib.contextmanager
    def _mapped(self, *more: type[BaseException]) -> Iterator[None]:
        """The one place driver errors become ``StoreUnavailable`` (reads and writes)."""
        try:
            yield
        except (*self.DOWN, *more) as exc:
            cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            why = cause[0] if cause else type(exc).__name__
            where = self.config.display()
            raise StoreUnavailable(f"cannot reach the database {where}: {why}") from exc

    # --- the backend's statements ------------------------------------------------------

    @abc.abstractmethod
    async def create_tables(self) -> None: ...

    @abc.abstractmethod
    async def ping(self) -> None: ...

    @abc.abstractmethod
    async def has_schema(self) -> bool:
        """Whether the database holds opsloop's tables (a read-only command refuses one
        that does not, rather than creating them)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def _create_thread(self, new_id: str, key: ThreadKey, now: datetime) -> str:
        """The id of the thread at ``key``, inserting ``new_id`` there if it is new."""

    @abc.abstractmethod
    async def find_thread(self, key: ThreadKey) -> str | None: ...

    @abc.abstractmethod
    async def find_alert_thread(self, alert_key: str) -> str | None:
        """The thread open for the alert ``alert_key`` (``ThreadState.alert``), if any:
        one at most, by the unique index ``uq_threads_alert``."""

    @abc.abstractmethod
    async def set_root(self, thread_id: str, pending: str, root_ts: str) -> bool:
        """Move a thread whose root is the placeholder ``pending`` (an alert's, before
        the bot posted it) to ``root_ts``, the post's ts, so replies there find it.
        False when its root is not ``pending`` (moved already)."""

    @abc.abstractmethod
    async def _threads(self, *, thread_id: str | None, at: tuple[str, str] | None) -> list[Row]:
        """Thread rows by id, or by (channel, root_ts)."""

    @abc.abstractmethod
    async def _list_threads(
        self, statuses: list[str] | None, limit: int, channel: str | None, requester: str | None
    ) -> list[Row]: ...

    @abc.abstractmethod
    async def _events(self, thread_id: str, after: int) -> list[Row]: ...

    @abc.abstractmethod
    async def _log(self, thread_id: str, start: Callable[[ThreadState | None], int]) -> Log:
        """The snapshot, then the rows after ``start(snapshot)``, in one read."""

    @abc.abstractmethod
    async def _dedupe(self, thread_id: str, key: str) -> Row | None: ...

    @abc.abstractmethod
    async def _decisions(self, actor: str, team: str | None, limit: int) -> list[Row]:
        """``actor``'s decision events (``DECISION_TYPES``), newest first, each with its
        thread's ``team``, ``channel``, ``root_ts`` and the ``tool`` (intent) of the
        ``tool_call_requested`` it decided; through the partial index
        ``ix_events_decisions``, never a scan of the events table."""

    @abc.abstractmethod
    async def _grant_rows(self, channel: str, team: str | None, since: datetime) -> list[Row]:
        """The ``grant_created`` / ``grant_revoked`` rows of ``channel``'s threads (of
        ``team`` only, when given) written since ``since``, in log order; through the
        partial index ``ix_events_grants``."""

    @abc.abstractmethod
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
        """One transaction: (``create``: insert the thread row at that key;) skip if an
        input's dedupe key is stored; move the row from ``expected_seq`` to ``state``;
        insert ``rows``; upsert ``snapshot`` when given. ``wakes``: the append makes the
        thread runnable (a backend that can tell other processes at commit does)."""

    @abc.abstractmethod
    async def set_wake_at(self, thread_id: str, expected_seq: int, wake_at: datetime) -> bool:
        """Move a waiting thread's next look (a poll that found the job still running)."""

    @abc.abstractmethod
    async def _acquire(
        self, thread_id: str, owner: str, until: datetime, now: datetime
    ) -> Previous | None:
        """Take the lease unless another owner's is live (and its owner alive); the
        lease it replaced, or None when it was not taken."""

    @abc.abstractmethod
    async def _renew(self, thread_id: str, owner: str, until: datetime) -> bool: ...

    @abc.abstractmethod
    async def release_lease(self, thread_id: str, owner: str) -> None: ...

    @abc.abstractmethod
    async def _due(self, now: datetime, limit: int) -> list[str]: ...

    # --- threads -----------------------------------------------------------------------

    async def create_thread(self, key: ThreadKey, *, now: datetime | None = None) -> str:
        """The id of the thread at ``key``, creating it if new (idempotent, race-safe)."""
        return await self._create_thread(new_thread_id(), key, now or utcnow())

    async def get_thread(self, thread_id: str) -> ThreadInfo:
        rows = await self._threads(thread_id=thread_id, at=None)
        if not rows:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        return ThreadInfo(**rows[0])

    async def resolve_thread(self, ref: str) -> ThreadInfo:
        """A thread by id, or by ``CHANNEL/THREAD_TS`` as people copy it from Slack."""
        if "/" not in ref:
            return await self.get_thread(ref)
        channel, _, ts = ref.partition("/")
        rows = await self._threads(thread_id=None, at=(channel, ts))
        if not rows:
            raise ThreadNotFound(f"no thread {ref!r}")
        if len(rows) > 1:  # the same channel id and ts in two workspaces
            ids = ", ".join(sorted(r["id"] for r in rows))
            raise ThreadNotFound(f"{ref!r} is ambiguous (threads {ids}): use the thread id")
        return ThreadInfo(**rows[0])

    async def list_threads(
        self,
        status: str | Collection[str] | None = None,
        limit: int = 1000,
        *,
        channel: str | None = None,
        requester: str | None = None,
    ) -> list[ThreadInfo]:
        """Threads newest first, filtered in the query: by one status or any of several,
        by channel, by requester."""
        rows = await self._list_threads(statuses_of(status), limit, channel, requester)
        return [ThreadInfo(**row) for row in rows]

    # --- events ------------------------------------------------------------------------

    async def select_events(self, thread_id: str, *, after: int = 0) -> list[AnyEvent]:
        return [mapper.from_row(row) for row in await self._events(thread_id, after)]

    async def load(self, thread_id: str) -> ThreadState:
        """The thread's state: its latest snapshot plus the events after it."""
        log = await self._log(thread_id, lambda base: base.last_seq if base else 0)
        if log.base is None and not log.rows:
            return self._empty(thread_id, log)
        return reduce((mapper.from_row(r) for r in log.rows), log.base)

    async def load_for_projection(self, thread_id: str) -> tuple[ThreadState, list[AnyEvent]]:
        """The state, and the events a prompt needs: those after the latest compaction's
        ``upto_seq`` (its summary stands for the rest). One read: from the snapshot's
        compaction on, folding onto the snapshot what lies past it."""

        def start(base: ThreadState | None) -> int:
            return base.compaction[1] if base is not None and base.compaction else 0

        log = await self._log(thread_id, start)
        if log.base is None and not log.rows:
            return self._empty(thread_id, log), []
        events = [mapper.from_row(r) for r in log.rows]
        done = log.base.last_seq if log.base is not None else 0
        state = reduce((e for e in events if e.seq > done), log.base)
        upto = state.compaction[1] if state.compaction else 0
        return state, [e for e in events if e.seq > upto]

    @staticmethod
    def _empty(thread_id: str, log: Log) -> ThreadState:
        if not log.exists:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        return ThreadState(thread_id=thread_id)

    async def decisions_by(
        self, actor: str, limit: int = 20, *, team: str | None = None
    ) -> list[Decided]:
        """The latest ``limit`` decisions ``actor`` made on calls, across threads (of
        ``team`` only, when given), newest first: approvals (one per vote), rejections
        and reconciles. The App Home's "Decided by me"; nothing is stored for it."""
        rows = await self._decisions(actor, team, limit)
        return [
            Decided(
                event=mapper.from_row(r),
                thread=ThreadKey(r["team"], r["channel"], r["root_ts"]),
                tool=r["tool"],
            )
            for r in rows
        ]

    async def grant_events(
        self, channel: str, *, team: str | None = None, now: datetime | None = None
    ) -> list[tuple[str, GrantCreated | GrantRevoked]]:
        """The grant events of ``channel``'s threads that may still matter at ``now``
        (made within the longest a grant lasts), each with its thread id, in log order:
        what ``engine.grants.channel_grants`` folds, and ``/opsloop grants`` lists."""
        since = (now or utcnow()) - timedelta(seconds=GRANT_LONGEST_S)
        found = []
        for row in await self._grant_rows(channel, team, since):
            event = mapper.from_row(row)
            assert isinstance(event, GrantCreated | GrantRevoked)  # the query's types
            found.append((row["thread_id"], event))
        return found

    async def find_by_dedupe_key(self, thread_id: str, key: str) -> AnyEvent | None:
        row = await self._dedupe(thread_id, key)
        return mapper.from_row(row) if row is not None else None

    async def append(
        self,
        thread_id: str,
        expected_seq: int,
        events: Sequence[Event],
        *,
        state: ThreadState | None = None,
        now: datetime | None = None,
    ) -> Appended:
        """Append ``events`` after ``expected_seq`` in one transaction (DESIGN's
        ``append(thread_id, expected_seq, events)``).

        ``state`` is the caller's state at ``expected_seq`` (saves a read); the events
        are applied to it first, so an illegal one raises and nothing is written. An
        input whose ``dedupe_key`` is stored already is a no-op returning the stored
        event. A stale ``expected_seq`` raises ``ConcurrencyConflict``.
        """
        now = now or utcnow()
        if state is None or state.last_seq != expected_seq:
            state = await self.load(thread_id)
            if state.last_seq != expected_seq:
                return await self._moved(thread_id, expected_seq, events)
        stamped, new_state = stamp(thread_id, events, expected_seq, state, now)
        rows = [mapper.to_row(e) for e in stamped]
        snapshot = snapshot_due(expected_seq, new_state)
        wakes = new_state.status == "running" and state.status != "running"
        outcome = await self._append(
            thread_id, expected_seq, rows, new_state, now, snapshot=snapshot, wakes=wakes
        )
        if isinstance(outcome, Duplicate):
            return Appended(events=[mapper.from_row(outcome.row)], state=None, deduplicated=True)
        if outcome == "moved":
            if not await self._threads(thread_id=thread_id, at=None):
                raise ThreadNotFound(f"no thread {thread_id!r}")
            return await self._moved(thread_id, expected_seq, events)
        faults.hit("append")  # crash tests: die right after a commit
        return Appended(events=stamped, state=new_state)

    async def _moved(self, thread_id: str, expected_seq: int, events: Sequence[Event]) -> Appended:
        """The thread is not at ``expected_seq``: a stored input is a duplicate (however
        the sender counted), anything else a conflict."""
        for key in (e.dedupe_key for e in events if e.dedupe_key):
            if (stored := await self._dedupe(thread_id, key)) is not None:
                return Appended(events=[mapper.from_row(stored)], state=None, deduplicated=True)
        raise ConcurrencyConflict(thread_id, expected_seq)

    async def append_input(
        self,
        key: ThreadKey,
        build: Callable[[ThreadState], list[Event]],
        *,
        dedupe_key: str | None = None,
        now: datetime | None = None,
        start: bool = True,
        fresh: bool = False,
    ) -> tuple[str, Appended]:
        """Store the input batch ``build(state)`` (an input, with what it decides at once)
        in the thread at ``key`` (created if new, or
        ``ThreadNotFound`` when ``start`` is false): what a front door does before it
        answers. An input whose ``dedupe_key`` is stored already returns the stored
        event and writes nothing.

        The reads come first; the write is the guarded append, so a writer that moved
        the thread meanwhile makes it ``ConcurrencyConflict`` (the caller reads again).
        A new thread and its first input are one transaction. ``fresh``: the input is
        the root of its thread (a mention outside any thread), so the thread is almost
        surely new and that transaction is tried first, with no read before it: one
        round trip for the ack. Where the thread exists after all (a redelivery), it
        writes nothing and the usual path follows.
        """
        now = now or utcnow()
        if fresh and start:
            with contextlib.suppress(ConcurrencyConflict):
                return await self._append_new_thread(key, build, now)
        thread_id = await self.find_thread(key)
        if thread_id is None:
            if not start:
                raise ThreadNotFound(f"no thread at {key.channel}/{key.root_ts}")
            return await self._append_new_thread(key, build, now)
        if dedupe_key and (stored := await self.find_by_dedupe_key(thread_id, dedupe_key)):
            return thread_id, Appended(events=[stored], state=None, deduplicated=True)
        state = await self.load(thread_id)
        done = await self.append(thread_id, state.last_seq, build(state), state=state, now=now)
        return thread_id, done

    async def _append_new_thread(
        self, key: ThreadKey, build: Callable[[ThreadState], list[Event]], now: datetime
    ) -> tuple[str, Appended]:
        thread_id = new_thread_id()
        state = ThreadState(thread_id=thread_id)
        stamped, new_state = stamp(thread_id, build(state), 0, state, now)
        rows = [mapper.to_row(e) for e in stamped]
        snapshot = snapshot_due(0, new_state)
        outcome = await self._append(
            thread_id, 0, rows, new_state, now, snapshot=snapshot, create=key
        )
        if outcome != "written":  # someone created the thread first: the caller reads again
            raise ConcurrencyConflict(thread_id, 0)
        faults.hit("append")
        return thread_id, Appended(events=stamped, state=new_state)

    # --- timers and leases -------------------------------------------------------------

    async def acquire_lease(
        self, thread_id: str, owner: str, ttl: float, *, now: datetime | None = None
    ) -> bool:
        """Take the thread for ``ttl`` seconds unless another owner holds a live lease
        (a lease whose owner is provably dead is taken at once)."""
        now = now or utcnow()
        previous = await self._acquire(thread_id, owner, now + timedelta(seconds=ttl), now)
        if previous is None:
            return False
        _count_takeover(owner, previous, now)
        return True

    async def renew_lease(
        self, thread_id: str, owner: str, ttl: float, *, now: datetime | None = None
    ) -> bool:
        return await self._renew(thread_id, owner, (now or utcnow()) + timedelta(seconds=ttl))

    async def due_threads(self, now: datetime | None = None, limit: int = 100) -> list[str]:
        """Threads with work and no live lease: timers due, or runnable and unowned,
        or held by a worker that is provably dead."""
        return await self._due(now or utcnow(), limit)

    async def claim_due(
        self,
        owner: str,
        ttl: float,
        *,
        now: datetime | None = None,
        limit: int = 100,
        skip: Collection[str] = (),
    ) -> list[str]:
        """Take the lease of due threads for ``owner`` (what ``due_threads`` finds, less
        ``skip``) in one statement and return their ids: N sweeping replicas each get
        their own threads instead of all racing for the same ones."""
        now = now or utcnow()
        until = now + timedelta(seconds=ttl)
        claimed = await self._claim(owner, until, now, limit, list(skip))
        for _, previous in claimed:
            _count_takeover(owner, previous, now)
        return [thread_id for thread_id, _ in claimed]

    @abc.abstractmethod
    async def _claim(
        self, owner: str, until: datetime, now: datetime, limit: int, skip: list[str]
    ) -> list[tuple[str, Previous]]:
        """Each claimed thread's id and the lease it replaced."""

    # --- workers: who runs threads, and whether they live (engine.workers) -------------
    #
    # A lease whose owner is *provably dead* (its worker registered here and the lock
    # that proves it lives is free: a PostgreSQL session advisory lock, a SQLite flock)
    # is taken at once by ``acquire_lease`` and found by ``due_threads``; an owner that
    # is merely slow keeps its lease until it expires. The worker of a lease owner is
    # the owner up to its first "/" (engine.store.locks.worker_of).

    @abc.abstractmethod
    async def register_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        now: datetime,
        on_runnable: OnRunnable | None = None,
    ) -> None:
        """Hold ``worker_id``'s proof of life for as long as this store is open, record
        its row, and forget rows of dead workers that hold no lease. ``on_runnable``:
        call it when a store of another origin makes a thread runnable (PostgreSQL;
        SQLite has no cross-process notification and leaves it to the sweep)."""

    @abc.abstractmethod
    async def beat_worker(self, worker_id: str, now: datetime) -> bool:
        """Record a heartbeat; re-establish the proof of life (and the notification
        channel) if it was lost. False when it had been lost: this process may have
        been taken for dead meanwhile."""

    @abc.abstractmethod
    async def unregister_worker(self, worker_id: str) -> None:
        """A clean shutdown: forget the row unless a lease is still held (a run cut
        short), then give up the proof of life, so such a lease is taken at once."""

    @abc.abstractmethod
    async def list_workers(self) -> list[WorkerInfo]: ...

    # --- housekeeping: archive and sizes (opsloop archive, opsloop threads) ------------

    @abc.abstractmethod
    async def _ended(
        self, statuses: list[str], before: datetime, now: datetime, after: str, limit: int
    ) -> list[Row]:
        """Rows in ``statuses``, updated before ``before``, no live lease, id > ``after``."""

    @abc.abstractmethod
    async def _delete_thread(
        self, thread_id: str, last_seq: int, statuses: list[str], before: datetime, now: datetime
    ) -> bool:
        """One transaction: the thread's events, snapshot and row go, only if the row
        still matches what ``_ended`` selected and is at ``last_seq``."""

    @abc.abstractmethod
    async def _sizes(self, thread_ids: list[str] | None) -> list[Row]:
        """``thread_id, events, bytes`` (payload octets) per thread that has events."""

    async def select_ended_threads(
        self,
        before: datetime,
        *,
        after: str = "",
        limit: int = 100,
        now: datetime | None = None,
    ) -> list[ThreadInfo]:
        """Threads that ended (``ENDED_STATUSES``) with no change since ``before`` and no
        live lease, by id after ``after`` (a page cursor): what ``archive`` may take.
        A thread waiting for a person, a job or a timer, or running, is never one."""
        rows = await self._ended(list(ENDED_STATUSES), before, now or utcnow(), after, limit)
        return [ThreadInfo(**row) for row in rows]

    async def delete_thread(
        self, thread_id: str, last_seq: int, *, before: datetime, now: datetime | None = None
    ) -> bool:
        """Remove an ended thread from the hot tables (events, snapshot, row) in one
        transaction. False, and nothing removed, when it moved since it was read (a new
        message reopened it, its lease was taken) or is gone already."""
        statuses = list(ENDED_STATUSES)
        return await self._delete_thread(thread_id, last_seq, statuses, before, now or utcnow())

    async def select_thread_sizes(
        self, thread_ids: Collection[str] | None = None
    ) -> dict[str, tuple[int, int]]:
        """``{thread_id: (events, bytes)}`` in one grouped read; bytes are the stored
        payloads' length. Threads without events are absent; None: every thread."""
        wanted = None if thread_ids is None else list(thread_ids)
        rows = await self._sizes(wanted)
        return {r["thread_id"]: (int(r["events"]), int(r["bytes"])) for r in rows}

    # --- MCP OAuth (tools/mcp/auth.py): one row per server, every replica's ------------
    #
    # A row whose ``binding`` is not the configuration's is deleted by its reader; the
    # upserts set their columns (and the binding) and leave the others as they are.

    @abc.abstractmethod
    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None: ...

    @abc.abstractmethod
    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None: ...

    @abc.abstractmethod
    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None: ...

    @abc.abstractmethod
    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None:
        """Ask for a new authorization (``state``, its PKCE ``verifier``, the ``url`` an
        admin opens); an earlier one, and a code it brought, are void."""

    @abc.abstractmethod
    async def answer_mcp_pending(
        self, state: str, code: str, iss: str | None, now: datetime
    ) -> str | None:
        """Keep the ``code`` the callback brought for the authorization asked with
        ``state``: the server's name, or None when no authorization waits for that
        state (unknown, replaced, answered already)."""

    @abc.abstractmethod
    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        """Take the code brought for ``server``'s authorization ``state``, once (the
        authorization is then done): of replicas racing for it, one gets it."""

    @abc.abstractmethod
    async def delete_mcp_oauth(self, server: str) -> None: ...

    # --- metrics (GET /metrics) ---------------------------------------------------------

    @abc.abstractmethod
    async def status_counts(self) -> tuple[dict[str, int], datetime | None]:
        """``({status: threads}, when the oldest pending approval was asked)`` in one
        read of two grouped queries, cheap enough for every scrape; None: none pending."""
