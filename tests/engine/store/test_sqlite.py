"""The SQLite backend (``engine.store.sqlite``): its one-hop writer. A burst of appends
shares transactions, each keeps its own outcome, and one writer serves every store of
the process on that file."""

from __future__ import annotations

import asyncio

from engine import events as ev
from engine.errors import ConcurrencyConflict
from engine.inputs import post_user_message
from engine.store import ThreadKey, open_store
from engine.store import sqlite as sqlite_backend


def key(i: int) -> ThreadKey:
    return ThreadKey("T1", "C1", f"1700000000.{i:06d}")


async def test_a_burst_of_inputs_each_lands_once_with_its_own_outcome(sqlite_url: str) -> None:
    store = await open_store(sqlite_url)
    try:
        first = await asyncio.gather(
            *(post_user_message(store, key(i), text=f"m{i}", user="U1", dedupe_key=f"e{i}")
              for i in range(40))
        )  # fmt: skip
        again = await asyncio.gather(
            *(post_user_message(store, key(i), text=f"m{i}", user="U1", dedupe_key=f"e{i}")
              for i in range(40))
        )  # fmt: skip
        more = await asyncio.gather(
            *(post_user_message(store, key(i % 4), text=f"r{i}", user="U2") for i in range(20))
        )
        assert len({a.thread_id for a in first}) == 40
        assert all(a.deduplicated for a in again)
        assert [a.thread_id for a in again] == [a.thread_id for a in first]
        for i in range(4):
            events = await store.select_events(first[i].thread_id)
            assert [e.seq for e in events] == list(range(1, 7))  # gapless, one per input
            assert sorted(e.text for e in events) == sorted(  # type: ignore[union-attr]
                [f"m{i}"] + [f"r{j}" for j in range(20) if j % 4 == i]
            )
        assert {a.event.type for a in more} == {"user_message"}
    finally:
        await store.close()


async def test_a_stale_append_in_a_batch_fails_alone(sqlite_url: str) -> None:
    store = await open_store(sqlite_url)
    try:
        a = (await post_user_message(store, key(1), text="a", user="U1")).thread_id
        b = (await post_user_message(store, key(2), text="b", user="U1")).thread_id
        state_a, state_b = await store.load(a), await store.load(b)
        ok = store.append(b, state_b.last_seq, [ev.UserMessage(actor="U1", text="b2")])
        stale = store.append(a, 0, [ev.UserMessage(actor="U1", text="late")])
        results = await asyncio.gather(ok, stale, return_exceptions=True)
        assert not isinstance(results[0], BaseException)
        assert isinstance(results[1], ConcurrencyConflict)
        assert [e.seq for e in await store.select_events(b)] == [1, 2]
        assert [e.seq for e in await store.select_events(a)] == [1]
        assert (await store.get_thread(a)).last_seq == state_a.last_seq
    finally:
        await store.close()


async def test_stores_on_one_file_share_one_writer(sqlite_url: str) -> None:
    one, two = await open_store(sqlite_url), await open_store(sqlite_url)
    try:
        assert one._db is not None and one._db is two._db  # type: ignore[attr-defined]
        await one.close()  # the other store keeps writing
        done = await post_user_message(two, key(9), text="still here", user="U1")
        assert (await two.select_events(done.thread_id))[0].text == "still here"  # type: ignore[union-attr]
    finally:
        await two.close()
    assert not sqlite_backend._SHARED  # the last store closed it
