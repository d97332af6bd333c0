"""The store port (``engine.store.base``) and its opening (``engine.store``): one
conformance suite, run on SQLite and on PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from engine import events as ev
from engine import mapper
from engine.errors import (
    ConcurrencyConflict,
    ConfigError,
    IllegalTransition,
    InvalidEvent,
    StoreUnavailable,
    ThreadNotFound,
)
from engine.inputs import post_user_message
from engine.metrics import REGISTRY
from engine.state import ThreadState, reduce
from engine.store import SNAPSHOT_EVERY, Store, ThreadKey, open_store, store_for
from engine.store.postgres import PostgresStore
from engine.store.sqlite import SqliteStore
from engine.tables import SNAPSHOTS
from tests.support.logs import (
    REQUESTER,
    REVIEWER,
    answered,
    approval_pending,
    at,
    clarification_asked,
    random_log,
    retry,
    user,
    waiting_on_job,
)

NOW = at(0)


def key(ts: str = "1700000000.000100", channel: str = "C1", team: str = "T1") -> ThreadKey:
    return ThreadKey(team, channel, ts)


async def thread_with(
    store: Store, drafts: Sequence[ev.Event], ts: str = "1.0", *, now: datetime | None = None
) -> str:
    """A new thread at key ``ts`` holding ``drafts`` (appended in one batch), both made
    at ``now`` (None: the clock's)."""
    tid = await store.create_thread(key(ts), now=now)
    if drafts:
        await store.append(tid, 0, drafts, now=now)
    return tid


@contextlib.asynccontextmanager
async def more_stores(url: str, n: int) -> AsyncIterator[list[Store]]:
    """``n`` more stores on the same database: separate engines, separate connections."""
    stores = [await open_store(url, create=False, pool_size=1) for _ in range(n)]
    try:
        yield stores
    finally:
        for s in stores:
            await s.close()


async def set_payload(store: Store, thread_id: str, seq: int, payload: str) -> None:
    update = sa.text("UPDATE events SET payload = :p WHERE thread_id = :t AND seq = :s")
    async with store.engine.begin() as conn:
        result = await conn.execute(update, {"p": payload, "t": thread_id, "s": seq})
    assert result.rowcount == 1


# --- opening --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "backend"),
    [
        ("sqlite:///{tmp}/a.db", SqliteStore),
        ("sqlite+aiosqlite:///{tmp}/b.db", SqliteStore),
        ("postgresql://postgres@127.0.0.1:1/x", PostgresStore),
        ("postgres://postgres@127.0.0.1:1/x", PostgresStore),
        ("postgresql+asyncpg://postgres@127.0.0.1:1/x?schema=s", PostgresStore),
    ],
)
async def test_the_url_dialect_picks_the_backend(url: str, backend: type, tmp_path) -> None:
    store = store_for(url.format(tmp=tmp_path))  # built without connecting
    try:
        assert type(store) is backend
    finally:
        await store.close()
    with pytest.raises(ConfigError, match="not supported"):
        store_for("mysql://root@127.0.0.1/x")


async def test_has_schema_says_whether_the_tables_are_there(db_url: str) -> None:
    """What a read-only command asks before it reads: never creates anything."""
    bare = await open_store(db_url, create=False)
    try:
        assert not await bare.has_schema()
        assert not await bare.has_schema(), "asking created nothing"
        await bare.create_tables()
        assert await bare.has_schema()
    finally:
        await bare.close()


# --- threads --------------------------------------------------------------------------


async def test_create_thread_is_idempotent_by_key(store: Store) -> None:
    first = await store.create_thread(key("1.0"))
    assert await store.create_thread(key("1.0")) == first
    assert await store.find_thread(key("1.0")) == first
    others = {
        await store.create_thread(key("2.0")),
        await store.create_thread(key("1.0", channel="C2")),
        await store.create_thread(key("1.0", team="T2")),
    }
    assert first not in others and len(others) == 3
    info = await store.get_thread(first)
    assert (info.team, info.channel, info.root_ts) == ("T1", "C1", "1.0")
    assert (info.status, info.last_seq, info.requester, info.wake_at) == ("new", 0, None, None)
    assert await store.find_thread(key("9.9")) is None


async def test_concurrent_create_thread_gives_one_thread(store: Store, db_url: str) -> None:
    async with more_stores(db_url, 8) as stores:
        ids = await asyncio.gather(*(s.create_thread(key("5.0")) for s in stores))
    assert len(set(ids)) == 1
    assert [t.id for t in await store.list_threads()] == [ids[0]]


# --- appending ------------------------------------------------------------------------


async def test_append_assigns_seq_and_stamps_the_envelope(store: Store) -> None:
    tid = await store.create_thread(key())
    drafts = [user(), *approval_pending("toolu_2", expires_at=at(60))]
    done = await store.append(tid, 0, drafts, now=NOW)
    assert not done.deduplicated
    assert [e.seq for e in done.events] == [1, 2, 3, 4]
    assert all(e.thread_id == tid and e.created_at == NOW for e in done.events)
    assert [e.event_id for e in done.events] == [d.event_id for d in drafts]
    assert [e.type for e in done.events] == [d.type for d in drafts]
    assert all(d.seq == 0 and d.thread_id == "" for d in drafts), "drafts are not mutated"

    assert await store.select_events(tid) == done.events
    assert await store.select_events(tid, after=2) == done.events[2:]
    state = await store.load(tid)
    assert state == done.state == reduce(done.events)
    info = await store.get_thread(tid)
    # The derived columns move in the same transaction as the events.
    assert (info.status, info.last_seq, info.requester) == ("awaiting_approval", 4, REQUESTER)
    assert info.wake_at == at(60) and info.updated_at == NOW

    more = await store.append(tid, 4, [ev.ApprovalGranted(actor="U2", tool_call_id="toolu_2")])
    assert [e.seq for e in more.events] == [5]
    assert (await store.get_thread(tid)).wake_at is None


@pytest.mark.parametrize("expected_seq", [0, 1, 5])
async def test_stale_expected_seq_conflicts_and_writes_nothing(
    store: Store, expected_seq: int
) -> None:
    tid = await thread_with(store, [user(), *answered()])  # last_seq 3
    before = await store.get_thread(tid)
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append(tid, expected_seq, [user("late")])
    assert info.value.thread_id == tid and info.value.expected_seq == expected_seq
    assert len(await store.select_events(tid)) == 3
    assert await store.get_thread(tid) == before


async def test_stale_caller_state_conflicts(store: Store) -> None:
    tid = await thread_with(store, [user()])
    stale = await store.load(tid)
    await store.append(tid, 1, [ev.MessagePosted(shows_event_id="e", channel="C1", ts="2.0")])
    with pytest.raises(ConcurrencyConflict):
        await store.append(tid, stale.last_seq, answered(), state=stale)
    assert [e.type for e in await store.select_events(tid)] == ["user_message", "message_posted"]


@pytest.mark.parametrize(
    "batch",
    [
        [ev.ApprovalGranted(actor="U2", tool_call_id="toolu_nope")],
        # The first event is legal, the second is not: neither is written.
        [ev.ModelDecision(text="x"), ev.ApprovalGranted(actor="U2", tool_call_id="toolu_nope")],
    ],
    ids=["single", "batch"],
)
async def test_illegal_event_is_refused_and_log_unchanged(
    store: Store, batch: list[ev.Event]
) -> None:
    tid = await thread_with(store, [user()])
    before_events = await store.select_events(tid)
    before_thread = await store.get_thread(tid)
    with pytest.raises(IllegalTransition) as info:
        await store.append(tid, 1, batch)
    assert info.value.event_type == "approval_granted" and info.value.status == "running"
    assert await store.select_events(tid) == before_events
    assert await store.get_thread(tid) == before_thread
    assert (await store.load(tid)).last_seq == 1


async def test_first_event_must_be_a_user_message(store: Store) -> None:
    tid = await store.create_thread(key())
    with pytest.raises(IllegalTransition):
        await store.append(tid, 0, answered())
    assert await store.select_events(tid) == []
    assert (await store.get_thread(tid)).status == "new"


async def test_same_input_three_times_with_one_dedupe_key_is_one_event(store: Store) -> None:
    tid = await store.create_thread(key())
    results = []
    for _ in range(3):
        # Each redelivery is a fresh draft (new event_id) with the same delivery key, and
        # the sender still believes the thread is at seq 0.
        results.append(await store.append(tid, 0, [user("hi", dedupe_key="Ev01")]))
    first, *again = results
    assert not first.deduplicated and [e.seq for e in first.events] == [1]
    for r in again:
        assert r.deduplicated
        assert r.events == first.events  # the stored event, not the redelivered draft
    stored = await store.select_events(tid)
    assert len(stored) == 1 and stored[0].dedupe_key == "Ev01"
    assert await store.find_by_dedupe_key(tid, "Ev01") == stored[0]
    assert await store.find_by_dedupe_key(tid, "Ev02") is None
    assert (await store.get_thread(tid)).last_seq == 1


async def test_a_redelivered_input_with_fresh_state_is_found_by_the_append_itself(
    store: Store,
) -> None:
    """The caller read the thread after the input went in and never looked the key up:
    the append's own statement finds the stored input, writes nothing and says so."""
    tid = await thread_with(store, [user("hi", dedupe_key="Ev01")])
    posted = ev.MessagePosted(shows_event_id="e", channel="C1", ts="2.0")
    await store.append(tid, 1, [posted])
    state = await store.load(tid)
    again = await store.append(tid, 2, [user("hi", dedupe_key="Ev01")], state=state)
    assert again.deduplicated and again.state is None
    assert [(e.seq, e.dedupe_key) for e in again.events] == [(1, "Ev01")]
    assert [e.seq for e in await store.select_events(tid)] == [1, 2]
    assert (await store.get_thread(tid)).last_seq == 2


async def test_racing_deliveries_of_one_input_to_a_new_thread_store_it_once(
    store: Store, db_url: str
) -> None:
    where = key("7.0")
    async with more_stores(db_url, 6) as stores:
        accepted = await asyncio.gather(
            *(post_user_message(s, where, text="hi", user="U1", dedupe_key="Ev07") for s in stores)
        )
    assert len({a.thread_id for a in accepted}) == 1
    assert sum(not a.deduplicated for a in accepted) == 1
    (stored,) = await store.select_events(accepted[0].thread_id)
    assert stored.dedupe_key == "Ev07" and all(a.event == stored for a in accepted)


async def test_dedupe_keys_are_per_thread(store: Store) -> None:
    a = await thread_with(store, [user("a", dedupe_key="Ev01")], ts="1.0")
    b = await store.create_thread(key("2.0"))
    done = await store.append(b, 0, [user("b", dedupe_key="Ev01")])
    assert not done.deduplicated and done.events[0].thread_id == b
    assert len(await store.select_events(a)) == len(await store.select_events(b)) == 1


async def test_concurrent_appenders_get_gapless_seqs(store: Store, db_url: str) -> None:
    tid = await store.create_thread(key())
    writers, each = 20, 2

    async def writer(s: Store, name: str) -> None:
        for i in range(each):
            for _ in range(500):
                state = await s.load(tid)
                hint = state if i % 2 else None  # both the cached and the re-read path
                try:
                    await s.append(
                        tid, state.last_seq, [user(f"{name}/{i}", actor=name)], state=hint
                    )
                    break
                except ConcurrencyConflict:
                    await asyncio.sleep(0)
            else:
                pytest.fail(f"{name} never got its append in")

    async with more_stores(db_url, writers) as stores:
        await asyncio.gather(*(writer(s, f"U{n:03d}") for n, s in enumerate(stores)))

    stored = await store.select_events(tid)
    total = writers * each
    assert [e.seq for e in stored] == list(range(1, total + 1))
    texts = [e.text for e in stored]
    assert sorted(texts) == sorted(f"U{n:03d}/{i}" for n in range(writers) for i in range(each))
    assert len({e.event_id for e in stored}) == total
    assert (await store.get_thread(tid)).last_seq == total
    assert (await store.load(tid)).last_seq == total


# --- snapshots ------------------------------------------------------------------------


async def test_snapshot_plus_tail_equals_full_reduce(store: Store) -> None:
    drafts = random_log(seed=7, steps=460)
    tid = await store.create_thread(key())
    seq, sizes = 0, [1, 7, 3, 9, 2, 5]
    i = 0
    while seq < len(drafts):
        batch = drafts[seq : seq + sizes[i % len(sizes)]]
        done = await store.append(tid, seq, batch)
        seq, i = seq + len(batch), i + 1
        assert done.state is not None and done.state.last_seq == seq

    stored = await store.select_events(tid)
    assert len(stored) == 460 and [e.type for e in stored] == [d.type for d in drafts]
    full = reduce(stored)
    assert await store.load(tid) == full

    async with store.engine.connect() as conn:
        snap = (await conn.execute(sa.select(SNAPSHOTS.c.seq, SNAPSHOTS.c.state))).one()
    assert 2 * SNAPSHOT_EVERY <= snap.seq < 2 * SNAPSHOT_EVERY + max(sizes)
    assert ThreadState.model_validate_json(snap.state) == reduce(stored[: snap.seq])

    # Loading reads only the tail: an event behind the snapshot is not even parsed.
    await set_payload(store, tid, 3, "{}")
    assert await store.load(tid) == full
    with pytest.raises(InvalidEvent):
        await store.select_events(tid)


async def test_short_thread_has_no_snapshot(store: Store) -> None:
    await thread_with(store, [user(), *answered()])
    async with store.engine.connect() as conn:
        assert (await conn.execute(sa.select(SNAPSHOTS.c.seq))).first() is None


# --- leases and timers ----------------------------------------------------------------


async def test_leases(store: Store) -> None:
    tid = await thread_with(store, [user()])
    assert await store.acquire_lease(tid, "w1", 30, now=NOW)
    info = await store.get_thread(tid)
    assert (info.lease_owner, info.lease_expires_at) == ("w1", NOW + timedelta(seconds=30))
    assert not await store.acquire_lease(tid, "w2", 30, now=NOW + timedelta(seconds=29))
    assert await store.acquire_lease(tid, "w1", 30, now=NOW + timedelta(seconds=10))  # re-entrant
    assert not await store.renew_lease(tid, "w2", 30, now=NOW)
    assert await store.renew_lease(tid, "w1", 60, now=NOW + timedelta(seconds=20))
    assert not await store.acquire_lease(tid, "w2", 30, now=NOW + timedelta(seconds=79))
    # Expired: another owner takes it, and the old owner can no longer renew or release it.
    expired = takeovers("expired")
    assert await store.acquire_lease(tid, "w2", 30, now=NOW + timedelta(seconds=81))
    assert takeovers("expired") == expired + 1
    assert not await store.renew_lease(tid, "w1", 30, now=NOW + timedelta(seconds=82))
    await store.release_lease(tid, "w1")
    assert (await store.get_thread(tid)).lease_owner == "w2"
    await store.release_lease(tid, "w2")
    info = await store.get_thread(tid)
    assert (info.lease_owner, info.lease_expires_at) == (None, None)
    assert await store.acquire_lease(tid, "w1", 30, now=NOW + timedelta(seconds=83))
    assert not await store.acquire_lease("thr_missing", "w1", 30, now=NOW)


async def test_due_threads(store: Store) -> None:
    soon, later = NOW - timedelta(seconds=1), NOW + timedelta(hours=1)
    t = {
        "running": await thread_with(store, [user()], "1"),
        "leased": await thread_with(store, [user()], "2"),
        "lease_expired": await thread_with(store, [user()], "3"),
        "sleep_due": await thread_with(store, [user(), retry(None, 1, soon)], "4"),
        "sleep_at_now": await thread_with(store, [user(), retry(None, 1, NOW)], "5"),
        "sleep_later": await thread_with(store, [user(), retry(None, 1, later)], "6"),
        "approval_due": await thread_with(store, [user(), *approval_pending(expires_at=soon)], "7"),
        "approval_later": await thread_with(
            store, [user(), *approval_pending(expires_at=later)], "8"
        ),
        "job_due": await thread_with(store, [user(), *waiting_on_job(wake_at=soon)], "9"),
        "job_later": await thread_with(
            store, [user(), *waiting_on_job(wake_at=later, timeout_at=later)], "10"
        ),
        "timed_leased": await thread_with(store, [user(), retry(None, 1, soon)], "11"),
        "idle": await thread_with(store, [user(), *answered()], "12"),
        "awaiting_reply": await thread_with(store, [user(), *clarification_asked()], "13"),
        "new": await store.create_thread(key("14")),
    }
    assert await store.acquire_lease(t["leased"], "w1", 60, now=NOW)
    assert await store.acquire_lease(t["timed_leased"], "w1", 60, now=NOW)
    assert await store.acquire_lease(t["lease_expired"], "w1", 60, now=NOW - timedelta(minutes=2))

    due = await store.due_threads(now=NOW)
    expected = {"running", "lease_expired", "sleep_due", "sleep_at_now", "approval_due", "job_due"}
    assert sorted(due) == sorted(t[name] for name in expected)
    assert len(await store.due_threads(now=NOW, limit=2)) == 2
    # An hour earlier no timer had fired and both leases were live: only the free runner.
    assert await store.due_threads(now=NOW - timedelta(hours=1)) == [t["running"]]


def takeovers(reason: str) -> float:
    return REGISTRY.get_sample_value("opsloop_lease_takeovers_total", {"reason": reason}) or 0.0


async def register(store: Store, worker_id: str, **kw: object) -> None:
    await store.register_worker(worker_id, host="h", pid=1, now=NOW, **kw)  # type: ignore[arg-type]


async def test_a_lease_whose_owner_is_provably_dead_is_taken_at_once(db_url: str) -> None:
    """A worker whose lock was given up (as the OS or the server does when its process
    dies) loses its leases at once; a live one, or an owner that never registered,
    keeps them until they expire."""
    dying = await open_store(db_url)
    async with more_stores(db_url, 1) as (live,):
        try:
            await register(dying, "host:1:aa")
            await register(live, "host:2:bb")
            mine = await thread_with(live, [user()], "1")
            runner_held = await thread_with(live, [user()], "2")
            delivery_held = await thread_with(live, [user()], "3")
            ghost_held = await thread_with(live, [user()], "4")
            assert await dying.acquire_lease(runner_held, "host:1:aa", 60, now=NOW)
            assert await dying.acquire_lease(delivery_held, "host:1:aa/delivery", 60, now=NOW)
            assert await live.acquire_lease(ghost_held, "ghost", 60, now=NOW)
            assert await live.acquire_lease(mine, "host:2:bb", 60, now=NOW)

            # Alive: nothing is taken before expiry, nothing is due.
            assert not await live.acquire_lease(runner_held, "host:2:bb", 60, now=NOW)
            assert await live.due_threads(now=NOW) == []
            assert {w.id: w.alive for w in await live.list_workers()} == {
                "host:1:aa": True,
                "host:2:bb": True,
            }
        finally:
            await dying.close()  # its proof of life goes; its row stays

        assert {w.id: w.alive for w in await live.list_workers()} == {
            "host:1:aa": False,
            "host:2:bb": True,
        }
        due = await live.due_threads(now=NOW)
        assert sorted(due) == sorted([runner_held, delivery_held])
        before = takeovers("dead_owner")
        assert await live.acquire_lease(runner_held, "host:2:bb", 60, now=NOW)
        assert await live.claim_due("host:2:bb", 60, now=NOW) == [delivery_held]
        assert takeovers("dead_owner") == before + 2
        assert not await live.acquire_lease(ghost_held, "host:2:bb", 60, now=NOW)
        assert not await live.acquire_lease(mine, "other", 60, now=NOW)  # ours, and alive

        # A worker that registers later forgets dead workers that hold no lease.
        await live.release_lease(runner_held, "host:2:bb")
        await register(live, "host:3:cc")
        assert {w.id for w in await live.list_workers()} == {"host:2:bb", "host:3:cc"}
        with pytest.raises(Exception, match="in use by a live process"):
            async with more_stores(db_url, 1) as (third,):
                await register(third, "host:2:bb")


async def test_a_worker_leaving_gives_up_its_leases_at_once(store: Store, db_url: str) -> None:
    async with more_stores(db_url, 2) as (leaving, other):
        await register(leaving, "host:1:aa")
        await register(other, "host:2:bb")
        tid = await thread_with(other, [user()], "1")
        assert await other.beat_worker("host:2:bb", NOW + timedelta(seconds=5))
        beats = {w.id: (w.started_at, w.heartbeat_at) for w in await other.list_workers()}
        assert beats["host:2:bb"] == (NOW, NOW + timedelta(seconds=5))
        assert await leaving.acquire_lease(tid, "host:1:aa", 60, now=NOW)
        await leaving.unregister_worker("host:1:aa")
        # A lease still held (a run cut short) keeps the row, so its owner reads dead.
        assert {w.id: w.alive for w in await other.list_workers()}["host:1:aa"] is False
        assert await other.acquire_lease(tid, "host:2:bb", 60, now=NOW)
        await other.release_lease(tid, "host:2:bb")
        await other.unregister_worker("host:2:bb")
        assert [w.id for w in await other.list_workers()] == ["host:1:aa"]


async def test_sweeping_replicas_claim_each_due_thread_once(store: Store, db_url: str) -> None:
    async with more_stores(db_url, 3) as stores:
        tids = [await thread_with(stores[0], [user()], str(i)) for i in range(30)]
        cooling = tids[0]
        claims = await asyncio.gather(
            *(
                s.claim_due(f"w{i}", 60, now=NOW, limit=10, skip=[cooling])
                for i, s in enumerate(stores)
                for _ in range(2)
            )
        )
        claimed = [tid for batch in claims for tid in batch]
        assert sorted(claimed) == sorted(tids[1:])  # each once, the skipped one never
        for tid in tids[1:4]:
            owner = (await stores[0].get_thread(tid)).lease_owner
            assert owner is not None
            assert not await stores[0].acquire_lease(tid, "intruder", 60, now=NOW)
            assert await stores[0].acquire_lease(tid, owner, 60, now=NOW)  # re-entrant
        assert await stores[0].claim_due("w9", 60, now=NOW) == [cooling]
        assert await stores[0].claim_due("w9", 60, now=NOW) == []  # its own, live


async def test_set_wake_at_is_guarded_by_last_seq(store: Store) -> None:
    tid = await thread_with(store, [user(), *waiting_on_job(wake_at=at(5), timeout_at=at(60))])
    seq = (await store.get_thread(tid)).last_seq
    assert (await store.get_thread(tid)).wake_at == at(5)
    assert not await store.set_wake_at(tid, seq - 1, at(10))
    assert (await store.get_thread(tid)).wake_at == at(5)
    assert await store.set_wake_at(tid, seq, at(10))
    assert (await store.get_thread(tid)).wake_at == at(10)
    assert tid not in await store.due_threads(now=at(9))
    assert tid in await store.due_threads(now=at(10))
    await store.append(tid, seq, [ev.MessagePosted(shows_event_id="e", channel="C1", ts="2.0")])
    assert not await store.set_wake_at(tid, seq, at(20)), "the thread moved on"
    assert not await store.set_wake_at("thr_missing", 0, at(20))


# --- finding threads ------------------------------------------------------------------


async def test_list_threads_filters_by_status(store: Store) -> None:
    idle = await thread_with(store, [user(), *answered()], "1")
    running = await thread_with(store, [user()], "2")
    asking = await thread_with(store, [user(), *clarification_asked()], "3")
    assert [t.id for t in await store.list_threads("idle")] == [idle]
    assert [t.id for t in await store.list_threads(status="awaiting_reply")] == [asking]
    assert await store.list_threads("failed") == []
    listed = await store.list_threads()
    assert {t.id for t in listed} == {idle, running, asking}
    by_id = {t.id: t for t in listed}
    assert (by_id[idle].status, by_id[idle].last_seq, by_id[idle].requester) == (
        "idle",
        3,
        REQUESTER,
    )
    assert len(await store.list_threads(limit=2)) == 2


async def test_list_threads_filters_in_the_query(store: Store) -> None:
    """Several statuses, a channel, a requester: App Home and ``/opsloop pending``."""
    idle = await thread_with(store, [user(), *answered()], "1")
    asking = await thread_with(store, [user(), *clarification_asked()], "2")
    other = await store.create_thread(key("3", channel="C2"))
    await store.append(other, 0, [user(actor="U9"), *approval_pending(expires_at=at(60))])
    statuses = ("awaiting_reply", "awaiting_approval")
    assert {t.id for t in await store.list_threads(statuses)} == {asking, other}
    assert [t.id for t in await store.list_threads(channel="C2")] == [other]
    assert {t.id for t in await store.list_threads(requester=REQUESTER)} == {idle, asking}
    assert [t.id for t in await store.list_threads(statuses, channel="C1")] == [asking]
    assert await store.list_threads(["idle"], requester="U9") == []
    assert await store.list_threads([]) == []
    newest_first = [t.id for t in await store.list_threads()]
    assert newest_first == [other, asking, idle]
    assert len(await store.list_threads(limit=1, channel="C1")) == 1


async def test_resolve_thread_by_id_and_by_channel_slash_ts(store: Store) -> None:
    tid = await thread_with(store, [user()], "1700000000.000100")
    assert (await store.resolve_thread(tid)).id == tid
    info = await store.resolve_thread("C1/1700000000.000100")
    assert (info.id, info.channel, info.root_ts) == (tid, "C1", "1700000000.000100")
    for ref in ("C1/1700000000.999999", "C9/1700000000.000100", "thr_missing"):
        with pytest.raises(ThreadNotFound) as info:
            await store.resolve_thread(ref)
        assert ref in str(info.value)


@pytest.mark.parametrize(
    ("seq", "payload"),
    [(1, "{not json"), (1, '["a list"]'), (1, '{"source": {}}'), (2, '{"text": 5}')],
    ids=["not-json", "not-object", "missing-field", "wrong-type"],
)
async def test_corrupted_stored_event_names_thread_and_seq(
    store: Store, seq: int, payload: str
) -> None:
    tid = await thread_with(store, [user(), *answered()])
    await set_payload(store, tid, seq, payload)
    for read in (store.load, store.select_events):
        with pytest.raises(InvalidEvent) as info:
            await read(tid)
        message = str(info.value)
        assert tid in message and f"seq {seq}" in message


# --- event schema versions ------------------------------------------------------------


def _old_user_message(payload: mapper.Payload) -> mapper.Payload:
    """An upcaster as a release that renamed a field would register: ``body`` -> ``text``."""
    upcast = dict(payload)
    upcast["text"] = upcast.pop("body")
    return upcast


async def stored_row(store: Store, thread_id: str, seq: int) -> tuple[str, int]:
    select = sa.text("SELECT payload, schema_version FROM events WHERE thread_id = :t AND seq = :s")
    async with store.engine.connect() as conn:
        payload, version = (await conn.execute(select, {"t": thread_id, "s": seq})).one()
    return payload, version


async def test_an_event_of_an_older_schema_version_is_upcast_on_read_and_never_rewritten(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid = await thread_with(store, [user(), *answered()])
    assert (await stored_row(store, tid, 1))[1] == 1  # every type is at version 1 today
    # A later release: user_message v2 calls v1's ``body`` ``text``.
    monkeypatch.setitem(mapper.UPCASTERS, ("user_message", 1), _old_user_message)
    old_payload = '{"body": "deploy api to staging", "source": {}}'
    await set_payload(store, tid, 1, old_payload)

    for read in (store.select_events, store.load_for_projection):
        events = await read(tid)
        events = events[1] if isinstance(events, tuple) else events
        assert isinstance(events[0], ev.UserMessage)
        assert events[0].text == "deploy api to staging"
    assert (await store.load(tid)).last_seq == 1 + len(answered())
    assert await stored_row(store, tid, 1) == (old_payload, 1)  # the log is as written

    state = await store.load(tid)
    done = await store.append(tid, state.last_seq, [user("and web too")], state=state)
    seq = done.events[0].seq
    assert (await stored_row(store, tid, seq))[1] == 2  # new rows carry the new version
    assert (await store.select_events(tid, after=seq - 1))[0].text == "and web too"


async def test_an_event_of_a_newer_schema_version_is_reported_not_guessed(store: Store) -> None:
    tid = await thread_with(store, [user()])
    async with store.engine.begin() as conn:
        await conn.execute(
            sa.text("UPDATE events SET schema_version = 7 WHERE thread_id = :t"), {"t": tid}
        )
    with pytest.raises(InvalidEvent, match=r"seq 1 .*schema version 7 is newer"):
        await store.select_events(tid)


async def test_unknown_thread_is_not_found(store: Store) -> None:
    with pytest.raises(ThreadNotFound, match="thr_missing"):
        await store.load("thr_missing")
    with pytest.raises(ThreadNotFound, match="thr_missing"):
        await store.get_thread("thr_missing")
    with pytest.raises(ThreadNotFound):
        await store.append("thr_missing", 0, [user()])
    assert await store.select_events("thr_missing") == []


async def test_a_thread_without_events_loads_as_new(store: Store) -> None:
    tid = await store.create_thread(key())
    assert await store.load(tid) == ThreadState(thread_id=tid)


# --- an unreachable database ----------------------------------------------------------


async def test_every_verb_on_an_unreachable_database_raises_store_unavailable(
    db_url: str, tmp_path
) -> None:
    """Reads as well as writes: no driver error leaks past the store."""
    if db_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'no-such-dir' / 'opsloop.db'}"
    else:
        url = "postgresql://postgres@127.0.0.1:1/x"
    down = store_for(url)  # built without connecting
    reads = [
        down.ping(),
        down.get_thread("thr_x"),
        down.find_thread(key()),
        down.resolve_thread("C1/1.0"),
        down.list_threads(("idle", "running"), channel="C1"),
        down.select_events("thr_x"),
        down.load("thr_x"),
        down.load_for_projection("thr_x"),
        down.find_by_dedupe_key("thr_x", "Ev01"),
        down.due_threads(),
    ]
    writes = [
        down.create_thread(key()),
        down.append_input(key(), lambda _state: [user()]),
        down.append("thr_x", 0, [user()], state=ThreadState(thread_id="thr_x")),
        down.acquire_lease("thr_x", "w1", 30),
        down.renew_lease("thr_x", "w1", 30),
        down.release_lease("thr_x", "w1"),
        down.set_wake_at("thr_x", 0, NOW),
        down.create_tables(),
    ]
    try:
        for verb in reads + writes:
            with pytest.raises(StoreUnavailable, match="cannot reach the database"):
                await verb
    finally:
        await down.close()
    with pytest.raises(StoreUnavailable):
        await open_store(url)


# --- housekeeping: archive and sizes (which threads ended, removing one in one guarded
# transaction, events and bytes per thread) -----------------------------------------------

OLD = at(0)
CUTOFF = at(60)
LATER = at(120)


async def count_rows(store: Store, table: str, thread_id: str) -> int:
    column = "id" if table == "threads" else "thread_id"
    query = sa.text(f"SELECT count(*) FROM {table} WHERE {column} = :t")
    async with store.engine.connect() as conn:
        return int((await conn.execute(query, {"t": thread_id})).scalar_one())


async def test_only_threads_that_ended_before_the_cutoff_are_selected(store: Store) -> None:
    idle = await thread_with(store, [user(), *answered()], "1.0", now=OLD)
    failed = await thread_with(store, [user(), ev.ErrorRaised(message="boom")], "2.0", now=OLD)
    cancelled = await thread_with(store, [user(), ev.ThreadCancelled(actor="U1")], "3.0", now=OLD)
    # Never archived: waiting for a person, a job, or running; or ended after the cutoff.
    await thread_with(store, [user(), *approval_pending(expires_at=at(9999))], "4.0", now=OLD)
    await thread_with(store, [user(), *waiting_on_job()], "5.0", now=OLD)
    await thread_with(store, [user()], "6.0", now=OLD)
    await thread_with(store, [user(), *answered()], "7.0", now=LATER)

    found = await store.select_ended_threads(CUTOFF, now=LATER)
    assert sorted(t.id for t in found) == sorted([idle, failed, cancelled])
    assert {t.status for t in found} == {"idle", "failed", "cancelled"}
    assert [t.id for t in found] == sorted(t.id for t in found)  # by id: a page cursor
    first, *rest = found
    page = await store.select_ended_threads(CUTOFF, after=first.id, limit=1, now=LATER)
    assert [t.id for t in page] == [rest[0].id]


async def test_a_thread_under_a_live_lease_is_not_selected_nor_deleted(store: Store) -> None:
    tid = await thread_with(store, [user(), *answered()], "1.0", now=OLD)
    assert await store.acquire_lease(tid, "w1", 30, now=LATER)
    assert await store.select_ended_threads(CUTOFF, now=LATER) == []
    assert not await store.delete_thread(tid, 3, before=CUTOFF, now=LATER)
    later = LATER + timedelta(seconds=31)  # the lease expired: fair game
    assert [t.id for t in await store.select_ended_threads(CUTOFF, now=later)] == [tid]
    assert await store.delete_thread(tid, 3, before=CUTOFF, now=later)


async def test_delete_thread_removes_events_snapshot_and_row_together(store: Store) -> None:
    # Enough events for a snapshot (the store writes one every SNAPSHOT_EVERY).
    drafts: list[ev.Event] = []
    for i in range(70):
        drafts += [user(f"q{i}"), *answered(f"a{i}")]
    tid = await thread_with(store, drafts, "1.0", now=OLD)
    keep = await thread_with(store, [user(), *answered()], "2.0", now=OLD)
    assert await count_rows(store, "snapshots", tid) == 1
    assert await store.delete_thread(tid, 210, before=CUTOFF, now=LATER)
    for table in ("events", "snapshots", "threads"):
        assert await count_rows(store, table, tid) == 0, table
    assert len(await store.select_events(keep)) == 3  # another thread is untouched
    assert not await store.delete_thread(tid, 210, before=CUTOFF, now=LATER)  # gone already


async def test_a_thread_that_moved_since_it_was_read_is_not_deleted(store: Store) -> None:
    tid = await thread_with(store, [user(), *answered()], "1.0", now=OLD)
    [info] = await store.select_ended_threads(CUTOFF, now=LATER)
    # A new message reopens it after the archive read it (last_seq 3 -> 4).
    await store.append(tid, info.last_seq, [user("one more thing")], now=OLD)
    assert not await store.delete_thread(tid, info.last_seq, before=CUTOFF, now=LATER)
    assert len(await store.select_events(tid)) == 4
    assert (await store.get_thread(tid)).status == "running"


async def test_an_append_after_the_delete_finds_no_thread(store: Store) -> None:
    tid = await thread_with(store, [user(), *answered()], "1.0", now=OLD)
    assert await store.delete_thread(tid, 3, before=CUTOFF, now=LATER)
    with pytest.raises(ThreadNotFound):
        await store.append(tid, 3, [user("late")], now=LATER)
    assert await count_rows(store, "events", tid) == 0


async def test_thread_sizes_count_events_and_payload_bytes(store: Store) -> None:
    one = await thread_with(store, [user("héllo"), *answered("ok")], "1.0", now=OLD)
    two = await thread_with(store, [user("x")], "2.0", now=OLD)
    empty = await store.create_thread(ThreadKey("T1", "C1", "3.0"))
    sizes = await store.select_thread_sizes()
    assert set(sizes) == {one, two}  # a thread without events has no row
    for tid in (one, two):
        events = await store.select_events(tid)
        octets = 0
        async with store.engine.connect() as conn:
            rows = await conn.execute(
                sa.text("SELECT payload FROM events WHERE thread_id = :t"), {"t": tid}
            )
            octets = sum(len(p.encode()) for (p,) in rows)
        assert sizes[tid] == (len(events), octets)
    assert octets > 0
    assert await store.select_thread_sizes([two, empty]) == {two: sizes[two]}
    assert await store.select_thread_sizes([]) == {}


# --- metrics: status_counts, the read behind GET /metrics ---------------------------------

ASKED_FIRST, ASKED_LATER = at(0), at(30)


async def test_an_empty_database_has_no_counts_and_no_pending_approval(store: Store) -> None:
    assert await store.status_counts() == ({}, None)


async def test_counts_threads_by_status_and_finds_the_oldest_pending_approval(
    store: Store,
) -> None:
    await thread_with(store, [user(), *approval_pending("toolu_a")], "1.0", now=ASKED_FIRST)
    await thread_with(store, [user(), *approval_pending("toolu_b")], "2.0", now=ASKED_LATER)
    await thread_with(store, [user(), *answered()], "3.0", now=ASKED_LATER)
    await thread_with(store, [user()], "4.0", now=ASKED_LATER)
    await thread_with(store, [], "5.0", now=ASKED_LATER)  # created, nothing stored yet
    # A decided approval no longer counts, however old its request.
    decided = await thread_with(store, [user(), *approval_pending("toolu_c")], "6.0", now=at(-60))
    await store.append(
        decided, 4, [ev.ApprovalRejected(tool_call_id="toolu_c", actor=REVIEWER)], now=at(-59)
    )

    counts, oldest = await store.status_counts()

    assert counts == {"awaiting_approval": 2, "idle": 1, "running": 2, "new": 1}
    assert oldest == ASKED_FIRST


async def test_a_reasked_approval_counts_from_its_latest_request(store: Store) -> None:
    """A thread whose first card was decided and a second one asked: the age is the
    second card's, not the thread's first request."""
    tid = await thread_with(store, [user(), *approval_pending("toolu_a")], "1.0", now=at(0))
    await store.append(
        tid,
        4,
        [
            ev.ApprovalRejected(tool_call_id="toolu_a", actor=REVIEWER),
            *approval_pending("toolu_b"),
        ],
        now=at(10),
    )
    counts, oldest = await store.status_counts()
    assert counts == {"awaiting_approval": 1}
    assert oldest == at(10)


# --- a person's decisions across threads (the App Home's "Decided by me") ---------------


async def test_decisions_by_finds_a_persons_votes_rejections_and_reconciles_newest_first(
    store: Store,
) -> None:
    other = "U0OTHER01"
    approved = await thread_with(store, [user(), *approval_pending("toolu_a")], "1.0", now=at(0))
    await store.append(
        approved,
        4,
        [ev.ApprovalGranted(tool_call_id="toolu_a", actor=REVIEWER)],
        now=at(1),
    )
    rejected = await thread_with(store, [user(), *approval_pending("toolu_b")], "2.0", now=at(0))
    await store.append(
        rejected,
        4,
        [ev.ApprovalRejected(tool_call_id="toolu_b", actor=REVIEWER, reason="no")],
        now=at(3),
    )
    asked = approval_pending("toolu_a")
    once = asked[1].model_copy(update={"idempotent": False})  # its outcome can be unknown
    unknown = [
        ev.ApprovalGranted(tool_call_id="toolu_a", actor=other),
        ev.ToolStarted(tool_call_id="toolu_a", attempt=1),
        ev.ToolOutcomeUnknown(tool_call_id="toolu_a", attempt=1),
    ]
    recon = await thread_with(store, [user(), asked[0], once, asked[2], *unknown], "3.0")
    await store.append(
        recon,
        7,
        [
            ev.ReconcileDecided(
                tool_call_id="toolu_a", decision="happened", reviewer=REVIEWER, actor=REVIEWER
            )
        ],
        now=at(2),
    )
    # Someone else's vote, a grant's, and another team's thread: none of them are REVIEWER's.
    # (A standing grant of the thread approves the call at once, in place of a card.)
    grant = ev.GrantCreated(
        grant_id="g1",
        tool="deploy",
        arguments_schema={"type": "object"},
        until=at(60),
        reviewer=REVIEWER,
        actor=REVIEWER,
    )
    granted = await thread_with(
        store, [user(), grant, *approval_pending("toolu_g")[:2]], "4.0", now=at(0)
    )
    await store.append(
        granted, 4, [ev.ApprovalGranted(tool_call_id="toolu_g", actor="grant:g1")], now=at(4)
    )
    elsewhere = await store.create_thread(key("5.0", team="T2"))
    await store.append(elsewhere, 0, [user(), *approval_pending("toolu_x")], now=at(0))
    await store.append(
        elsewhere, 4, [ev.ApprovalGranted(tool_call_id="toolu_x", actor=REVIEWER)], now=at(5)
    )

    mine = await store.decisions_by(REVIEWER)
    assert [(d.event.thread_id, d.event.type) for d in mine] == [
        (elsewhere, "approval_granted"),
        (rejected, "approval_rejected"),
        (recon, "reconcile_decided"),
        (approved, "approval_granted"),
    ]
    assert [d.tool for d in mine] == ["deploy"] * 4  # the decided call's tool
    assert mine[1].thread == key("2.0") and mine[0].thread == key("5.0", team="T2")
    assert isinstance(mine[1].event, ev.ApprovalRejected) and mine[1].event.reason == "no"
    assert mine[1].event.created_at == at(3)
    in_t1 = await store.decisions_by(REVIEWER, 2, team="T1")
    assert [d.event.thread_id for d in in_t1] == [rejected, recon]
    assert [d.event.thread_id for d in await store.decisions_by(other)] == [recon]
    assert await store.decisions_by("U0NOBODY") == []


async def test_decisions_by_reads_the_partial_index_not_the_events_table(
    store: Store, db_url: str
) -> None:
    """The statement repeats the index's predicate, so the planner can use it: checked
    with sequential scans priced out on PostgreSQL (on a table this small it would
    rightly scan), and by SQLite's plan."""
    if isinstance(store, PostgresStore):
        from engine.store.postgres import DECISIONS_SQL

        args = DECISIONS_SQL.args({"actor": REVIEWER, "team": None, "limit": 20})

        async def plan(conn) -> list[str]:  # type: ignore[no-untyped-def]
            await conn.execute("SET enable_seqscan = off")
            try:
                rows = await conn.fetch("EXPLAIN " + DECISIONS_SQL.text, *args)
            finally:
                await conn.execute("RESET enable_seqscan")
            return [r[0] for r in rows]

        lines = await store._run(plan)
    else:
        from engine.store.sqlite import DECISIONS_SQL as SQLITE_DECISIONS

        rows = await store._fetch("EXPLAIN QUERY PLAN " + SQLITE_DECISIONS, REVIEWER, None, 20)  # type: ignore[attr-defined]
        lines = [str(r["detail"]) for r in rows]
    assert any("ix_events_decisions" in line for line in lines), lines
