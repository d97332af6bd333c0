"""One writer per lease: while the runner holds a thread, it alone appends to its log.

The front door shows and hands back its receipts; the runner appends them with its own
next batch, so no conflict is designed in. One retry helper and one lease helper serve
every writer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import pytest

from engine import events as ev
from engine.errors import ConcurrencyConflict
from engine.inputs import Decider, decide_approval, post_user_message
from engine.leases import Lease
from engine.models.scripted import ScriptedModel, call, say
from engine.retrying import retrying
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import ThreadState, reduce
from engine.store import Store, ThreadKey
from tests.support.demo_tools import make_tools

KEY = ThreadKey("T1", "C1", "1700000000.000100")


def count_conflicts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``ConcurrencyConflict`` any store in this process meets on an append, as
    the types of the batch that met it (a pass-through spy at the store's port)."""
    met: list[str] = []
    append = Store.append

    async def counting(self, thread_id, expected_seq, events, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return await append(self, thread_id, expected_seq, events, **kwargs)
        except ConcurrencyConflict:
            met.append(",".join(e.type for e in events))
            raise

    monkeypatch.setattr(Store, "append", counting)
    return met


class ShowsAndReads:
    """A front door that shows each event of the log the runner hands it once: its
    receipt names it. It appends nothing."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.shown: list[list[str]] = []  # the event types shown per call

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[ev.MessagePosted]:
        done = {e.shows_event_id for e in events if isinstance(e, ev.MessagePosted)}
        new = [e for e in events if e.type != "message_posted" and e.event_id not in done]
        self.shown.append([e.type for e in new])
        return [ev.MessagePosted(shows_event_id=e.event_id, channel="C1", ts="1.1") for e in new]


async def test_an_approved_call_shows_first_and_its_receipts_commit_with_the_outcome(
    store, monkeypatch
):
    met = count_conflicts(monkeypatch)
    door = ShowsAndReads(store)
    effects: Counter = Counter()
    runner = Runner(
        store,
        ScriptedModel([call("deploy", name="api"), say("deployed")]),
        make_tools(effects),
        front_door=door,
    )
    tid = (await post_user_message(store, KEY, text="deploy api", user="U_ALICE")).thread_id
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(),
    )  # fmt: skip
    state = await runner.run(tid)
    assert state.status == "idle" and effects["deploy"] == 1
    assert met == []  # nothing designed in: the runner was the only writer
    # Shown before the tool ran: up to its tool_started, nothing after.
    assert door.shown[-1][-2:] == ["approval_granted", "tool_started"]
    events = await store.select_events(tid)
    result = next(e for e in events if e.type == "tool_result")
    receipts = [e for e in events if isinstance(e, ev.MessagePosted)]
    assert len(receipts) == len(door.shown[-1])
    # One batch: the receipts right before the outcome, in the same transaction.
    assert [r.seq for r in receipts] == list(range(result.seq - len(receipts), result.seq))
    assert {r.created_at for r in receipts} == {result.created_at}


async def test_the_front_door_is_handed_the_log_and_state_the_runner_holds(store):
    """Issue 20 §3: the runner hands the front door what it read and wrote, so showing
    a thread before each tool call reads neither the log nor the thread row again."""

    class Handed(ShowsAndReads):
        def __init__(self, store: Store) -> None:
            super().__init__(store)
            self.handed: list[tuple[list[ev.AnyEvent], ThreadState, list[ev.AnyEvent]]] = []

        async def show(
            self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
        ) -> list[ev.MessagePosted]:
            log = await self.store.select_events(thread_id)  # to compare, not to show
            self.handed.append((list(events), state, log))
            return await super().show(thread_id, events, state)

    door = Handed(store)
    script = [call("lookup", name="db"), call("lookup", name="api"), say("found")]
    runner = Runner(store, ScriptedModel(script), make_tools(Counter()), front_door=door)
    tid = (await post_user_message(store, KEY, text="find db", user="U_ALICE")).thread_id
    assert (await runner.run(tid)).status == "idle"
    assert len(door.handed) == 2  # once before each tool call
    for events, state, log in door.handed:
        assert events == log  # the whole log as it stood, the receipts in it included
        assert state == reduce(log)
    assert door.handed[1][0][-1].type == "tool_started"


async def test_a_front_door_that_fails_never_stops_the_work(store):
    class Broken:
        async def show(
            self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
        ) -> list[ev.MessagePosted]:
            raise RuntimeError("slack is down")

    effects: Counter = Counter()
    runner = Runner(
        store,
        ScriptedModel([call("lookup", name="db"), say("found")]),
        make_tools(effects),
        front_door=Broken(),
    )
    tid = (await post_user_message(store, KEY, text="find db", user="U_ALICE")).thread_id
    assert (await runner.run(tid)).status == "idle"
    assert effects["lookup"] == 1
    assert not [e for e in await store.select_events(tid) if e.type == "message_posted"]


async def test_a_cancel_while_the_tool_runs_is_a_real_conflict_and_keeps_the_receipts(
    store, monkeypatch
):
    """Someone else really acted (a cancel lands while the tool runs): the runner's batch
    meets that one conflict, re-reads, and commits the receipts with the outcome."""
    met = count_conflicts(monkeypatch)
    tid = (await post_user_message(store, KEY, text="find db", user="U_ALICE")).thread_id

    class CancelsMidCall(ShowsAndReads):
        async def show(
            self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
        ) -> list[ev.MessagePosted]:
            receipts = await super().show(thread_id, events, state)
            cancel = ev.ThreadCancelled(actor="U_ALICE")
            await self.store.append(thread_id, state.last_seq, [cancel])
            return receipts

    door = CancelsMidCall(store)
    runner = Runner(
        store, ScriptedModel([call("lookup", name="db")]), make_tools(Counter()), front_door=door
    )
    assert (await runner.run(tid)).status == "cancelled"
    types = [e.type for e in await store.select_events(tid)]
    shown = len(door.shown[0])
    assert shown > 0
    assert types[-shown - 2 :] == ["thread_cancelled", *["message_posted"] * shown, "tool_result"]
    assert met == [",".join(["message_posted"] * shown + ["tool_result"])]


async def test_retrying_rereads_after_each_conflict_and_gives_up_at_the_bound():
    calls: list[str] = []

    async def always() -> None:
        calls.append("op")
        raise ConcurrencyConflict("thr", 1)

    async def reread() -> None:
        calls.append("reread")

    with pytest.raises(ConcurrencyConflict):
        await retrying(always, reread=reread, attempts=3)
    assert calls == ["op", "reread", "op", "reread", "op"]

    left = [ConcurrencyConflict("thr", 1)]

    async def once_then_fine() -> str:
        if left:
            raise left.pop()
        return "done"

    assert await retrying(once_then_fine) == "done"


async def test_a_lease_is_kept_alive_released_and_reports_its_loss(store):
    tid = (await post_user_message(store, KEY, text="hi", user="U_ALICE")).thread_id
    lease = await Lease.take(store, tid, "w1", 0.3)
    assert lease is not None
    assert await Lease.take(store, tid, "w2", 0.3) is None
    async with lease:
        await asyncio.sleep(0.5)  # past the ttl: the heartbeat renewed it
        assert not lease.lost.is_set()
        assert (await store.get_thread(tid)).lease_owner == "w1"
    assert (await store.get_thread(tid)).lease_owner is None  # released

    lease = await Lease.take(store, tid, "w1", 0.3)
    assert lease is not None
    async with lease:
        await store.release_lease(tid, "w1")
        assert await store.acquire_lease(tid, "w2", 30)  # taken meanwhile
        await asyncio.wait_for(lease.lost.wait(), 2)
    assert (await store.get_thread(tid)).lease_owner == "w2"  # not released by w1
