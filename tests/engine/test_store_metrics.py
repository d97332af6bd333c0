"""``Store.status_counts``, the read behind GET /metrics, on SQLite and PostgreSQL."""

from __future__ import annotations

from engine import events as ev
from engine.store import Store, ThreadKey
from tests.support.logs import REVIEWER, answered, approval_pending, at, user

ASKED_FIRST, ASKED_LATER = at(0), at(30)


async def _thread(store: Store, ts: str, drafts: list[ev.Event], now=ASKED_LATER) -> str:
    tid = await store.create_thread(ThreadKey("T1", "C1", ts))
    if drafts:
        await store.append(tid, 0, drafts, now=now)
    return tid


async def test_an_empty_database_has_no_counts_and_no_pending_approval(store: Store) -> None:
    assert await store.status_counts() == ({}, None)


async def test_counts_threads_by_status_and_finds_the_oldest_pending_approval(
    store: Store,
) -> None:
    await _thread(store, "1.0", [user(), *approval_pending("toolu_a")], now=ASKED_FIRST)
    await _thread(store, "2.0", [user(), *approval_pending("toolu_b")], now=ASKED_LATER)
    await _thread(store, "3.0", [user(), *answered()])
    await _thread(store, "4.0", [user()])
    await _thread(store, "5.0", [])  # created, nothing stored yet
    # A decided approval no longer counts, however old its request.
    decided = await _thread(store, "6.0", [user(), *approval_pending("toolu_c")], now=at(-60))
    await store.append(
        decided, 4, [ev.ApprovalRejected(tool_call_id="toolu_c", actor=REVIEWER)], now=at(-59)
    )

    counts, oldest = await store.status_counts()

    assert counts == {"awaiting_approval": 2, "idle": 1, "running": 2, "new": 1}
    assert oldest == ASKED_FIRST


async def test_a_reasked_approval_counts_from_its_latest_request(store: Store) -> None:
    """A thread whose first card was decided and a second one asked: the age is the
    second card's, not the thread's first request."""
    tid = await _thread(store, "1.0", [user(), *approval_pending("toolu_a")], now=at(0))
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
