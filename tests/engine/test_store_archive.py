"""The store's housekeeping verbs on SQLite and PostgreSQL (the ``store`` fixture): which
threads ended, removing one in one guarded transaction, and events/bytes per thread."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
import sqlalchemy as sa

from engine import events as ev
from engine.errors import ThreadNotFound
from engine.store import Store, ThreadKey
from tests.support.logs import answered, approval_pending, at, user, waiting_on_job

OLD = at(0)
CUTOFF = at(60)
LATER = at(120)


async def thread_with(store: Store, ts: str, drafts: Sequence[ev.Event], when=OLD) -> str:
    tid = await store.create_thread(ThreadKey("T1", "C1", ts), now=when)
    await store.append(tid, 0, drafts, now=when)
    return tid


async def count(store: Store, table: str, thread_id: str) -> int:
    column = "id" if table == "threads" else "thread_id"
    query = sa.text(f"SELECT count(*) FROM {table} WHERE {column} = :t")
    async with store.engine.connect() as conn:
        return int((await conn.execute(query, {"t": thread_id})).scalar_one())


async def test_only_threads_that_ended_before_the_cutoff_are_selected(store: Store) -> None:
    idle = await thread_with(store, "1.0", [user(), *answered()])
    failed = await thread_with(store, "2.0", [user(), ev.ErrorRaised(message="boom")])
    cancelled = await thread_with(store, "3.0", [user(), ev.ThreadCancelled(actor="U1")])
    # Never archived: waiting for a person, a job, or running; or ended after the cutoff.
    await thread_with(store, "4.0", [user(), *approval_pending(expires_at=at(9999))])
    await thread_with(store, "5.0", [user(), *waiting_on_job()])
    await thread_with(store, "6.0", [user()])
    await thread_with(store, "7.0", [user(), *answered()], when=LATER)

    found = await store.select_ended_threads(CUTOFF, now=LATER)
    assert sorted(t.id for t in found) == sorted([idle, failed, cancelled])
    assert {t.status for t in found} == {"idle", "failed", "cancelled"}
    assert [t.id for t in found] == sorted(t.id for t in found)  # by id: a page cursor
    first, *rest = found
    page = await store.select_ended_threads(CUTOFF, after=first.id, limit=1, now=LATER)
    assert [t.id for t in page] == [rest[0].id]


async def test_a_thread_under_a_live_lease_is_not_selected_nor_deleted(store: Store) -> None:
    tid = await thread_with(store, "1.0", [user(), *answered()])
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
    tid = await thread_with(store, "1.0", drafts)
    keep = await thread_with(store, "2.0", [user(), *answered()])
    assert await count(store, "snapshots", tid) == 1
    assert await store.delete_thread(tid, 210, before=CUTOFF, now=LATER)
    for table in ("events", "snapshots", "threads"):
        assert await count(store, table, tid) == 0, table
    assert len(await store.select_events(keep)) == 3  # another thread is untouched
    assert not await store.delete_thread(tid, 210, before=CUTOFF, now=LATER)  # gone already


async def test_a_thread_that_moved_since_it_was_read_is_not_deleted(store: Store) -> None:
    tid = await thread_with(store, "1.0", [user(), *answered()])
    [info] = await store.select_ended_threads(CUTOFF, now=LATER)
    # A new message reopens it after the archive read it (last_seq 3 -> 4).
    await store.append(tid, info.last_seq, [user("one more thing")], now=OLD)
    assert not await store.delete_thread(tid, info.last_seq, before=CUTOFF, now=LATER)
    assert len(await store.select_events(tid)) == 4
    assert (await store.get_thread(tid)).status == "running"


async def test_an_append_after_the_delete_finds_no_thread(store: Store) -> None:
    tid = await thread_with(store, "1.0", [user(), *answered()])
    assert await store.delete_thread(tid, 3, before=CUTOFF, now=LATER)
    with pytest.raises(ThreadNotFound):
        await store.append(tid, 3, [user("late")], now=LATER)
    assert await count(store, "events", tid) == 0


async def test_thread_sizes_count_events_and_payload_bytes(store: Store) -> None:
    one = await thread_with(store, "1.0", [user("héllo"), *answered("ok")])
    two = await thread_with(store, "2.0", [user("x")])
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
