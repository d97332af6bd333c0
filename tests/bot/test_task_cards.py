"""Task cards said once: a card's details and output are sent once, whatever happens to
its call later (retries, an approval, a restart); what changes goes in its title.

The fake Slack appends a ``task_update``'s details and output to what the card shows
(the stricter of the two readings of what Slack does), so anything sent twice shows
twice here. Through a real Runner and the real Delivery, SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.render.plan import plan_chunks, runs
from engine import events as ev
from engine.config import RunnerConfig
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import reduce
from engine.store import Store, ThreadKey
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

CHANNEL = "C0CARDS001"
REQUESTER = "U0REQUEST"
REVIEWER = "U0REVIEW"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def delivery_for(store: Store, slack: FakeSlack, clock: FakeClock, owner: str) -> Delivery:
    client = AsyncWebClient(token=TOKEN, base_url=slack.url)
    return Delivery(store, client, owner=owner, retry_base=None, clock=clock)


async def status_of(runner: Runner, tid: str) -> str:
    state = await runner.run(tid)
    assert state is not None
    return state.status


def chunks_sent(slack: FakeSlack, ts: str) -> list[dict[str, Any]]:
    """Every task_update sent to the plan message at ``ts``, in order."""
    streams = sorted(
        (m["ts"] for m in slack.posted(CHANNEL) if slack.workspace.stream(CHANNEL, m["ts"])),
        key=float,
    )
    started = dict(zip(streams, slack.calls_to("chat.startStream"), strict=True))
    out: list[dict[str, Any]] = []
    for c in slack.calls:
        if c is not started.get(ts) and not (
            c.method in ("chat.appendStream", "chat.stopStream") and c.params.get("ts") == ts
        ):
            continue
        chunks = c.params.get("chunks") or []
        chunks = json.loads(chunks) if isinstance(chunks, str) else chunks
        out += [ch for ch in chunks if ch.get("type") == "task_update"]
    return out


def assert_cards_as_the_log_says(slack: FakeSlack, events: list[ev.AnyEvent]) -> int:
    """Each plan message's cards show exactly what the log says of its run: details
    and output once (the fake appends what is sent again). How many were checked."""
    by_start = {r.start.event_id: r for r in runs(events)}
    checked = 0
    for receipt in (e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"):
        run = by_start[receipt.shows_event_id]
        shown = slack.workspace.stream(CHANNEL, receipt.ts)
        assert shown is not None
        wanted = {
            c["id"]: c for c in plan_chunks(run, done=run.ended) if c["type"] == "task_update"
        }
        assert set(shown["tasks"]) == set(wanted)
        for tid, task in shown["tasks"].items():
            for key in ("title", "status", "details", "output"):
                assert task.get(key) == wanted[tid].get(key), (key, task.get(key))
            checked += 1
    return checked


async def test_a_long_run_with_retries_and_an_approval_says_each_detail_once(
    store: Store, slack: FakeSlack
) -> None:
    clock = FakeClock(ev.utcnow())
    d = delivery_for(store, slack, clock, "proc-a")
    script = [
        call("flaky", name="upstream"),  # fails twice: two retries, the same card
        call("lookup", name="db"),
        call("deploy", name="api"),  # waits for approval: a card of its own
        say("Deployed after checking upstream and the db."),
    ]
    config = RunnerConfig(retry_base_s=1.0)
    tools = make_tools(Counter())
    root = slack.add_message(CHANNEL, "deploy api once upstream is fine", user=REQUESTER)
    key = ThreadKey(TEAM_ID, CHANNEL, root["ts"])
    tid = (await post_user_message(store, key, text="deploy it", user=REQUESTER)).thread_id

    def runner() -> Runner:
        return Runner(store, ScriptedModel(script), tools, config, clock=clock, front_door=d)

    try:
        assert await status_of(runner(), tid) == "sleeping"  # attempt 1 failed
        await d.deliver(tid)
        clock.advance(5)
        assert await status_of(runner(), tid) == "sleeping"  # attempt 2 failed
        await d.deliver(tid)
        clock.advance(5)
        # attempt 3 works, the db, then the card
        assert await status_of(runner(), tid) == "awaiting_approval"
        await d.deliver(tid)
        events = await store.select_events(tid)
        cid = next(e.tool_call_id for e in events if isinstance(e, ev.ApprovalRequested))
        await decide_approval(
            store,
            tid,
            tool_call_id=cid,
            decider=Decider(REVIEWER),
            decision="approve",
            reviewers=ReviewerRule(),
        )
        assert await status_of(runner(), tid) == "idle"
        await d.deliver(tid)
    finally:
        await d.close()
    events = await store.select_events(tid)
    receipts = [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]
    assert len(receipts) == 2  # the run up to the card, and the one it let through
    # The retries went in the card's title as they happened; its details were sent once.
    first = chunks_sent(slack, receipts[0].ts)
    flaky = [c for c in first if "Flaky" in c["title"]]
    assert any("attempt 1 failed" in c["title"] for c in flaky)
    assert any("attempt 3" in c["title"] for c in flaky)
    assert sum(1 for c in flaky if "details" in c) == 1
    assert sum(1 for c in flaky if "output" in c) == 1
    for ts in (r.ts for r in receipts):
        sent = chunks_sent(slack, ts)
        for field in ("details", "output"):
            ids = [c["id"] for c in sent if field in c]
            assert len(ids) == len(set(ids)), (field, ids)
    assert assert_cards_as_the_log_says(slack, events) == 4  # flaky, db, deploy, deploy


async def test_after_a_restart_cards_are_named_again_without_their_details(
    store: Store, slack: FakeSlack
) -> None:
    """A process that takes over an open plan message does not know what it shows: it
    sends each card's title and status again, never its details or output (Slack may
    append them), and replaces the message whole when the run ends."""
    clock = FakeClock(ev.utcnow())
    tools = make_tools(Counter())
    root = slack.add_message(CHANNEL, "look things up", user=REQUESTER)
    key = ThreadKey(TEAM_ID, CHANNEL, root["ts"])
    tid = (await post_user_message(store, key, text="look it up", user=REQUESTER)).thread_id
    script = [call("flaky", name="upstream"), call("lookup", name="db"), say("Both fine.")]
    config = RunnerConfig(retry_base_s=1.0)
    first = delivery_for(store, slack, clock, "proc-a")
    try:
        runner = Runner(store, ScriptedModel(script), tools, config, clock=clock, front_door=first)
        assert await status_of(runner, tid) == "sleeping"
    finally:
        await first.close()
    again = delivery_for(store, slack, clock, "proc-b")  # a new process
    try:
        events = await store.select_events(tid)
        await again.show(tid, events, reduce(events))  # taken over: nothing new to show
        runner = Runner(store, ScriptedModel(script), tools, config, clock=clock, front_door=again)
        status = await status_of(runner, tid)
        while status == "sleeping":  # the retries, each after its wait
            clock.advance(30)
            status = await status_of(runner, tid)
        assert status == "idle"
        await again.deliver(tid)
    finally:
        await again.close()
    events = await store.select_events(tid)
    [receipt] = [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]
    sent = chunks_sent(slack, receipt.ts)
    for field in ("details", "output"):
        ids = [c["id"] for c in sent if field in c]
        assert len(ids) == len(set(ids)), (field, ids)
    # What the stream took says each thing once; the message, replaced in place when the
    # run ended, shows the cards as the log says.
    [run] = runs(events)
    wanted = {c["id"]: c for c in plan_chunks(run, done=True) if c["type"] == "task_update"}
    stream = slack.workspace.stream(CHANNEL, receipt.ts)
    assert stream is not None and set(stream["tasks"]) == set(wanted)
    for task_id, task in stream["tasks"].items():
        assert task["details"] == wanted[task_id]["details"]
        assert task.get("output") in (None, wanted[task_id]["output"])
    [message] = [m for m in slack.posted(CHANNEL) if m["ts"] == receipt.ts]
    [plan] = [b for b in message["blocks"] if b.get("type") == "plan"]
    cards = [(c["id"], c["title"], c["status"]) for c in wanted.values()]
    assert [(t["task_id"], t["title"], t["status"]) for t in plan["tasks"]] == cards
