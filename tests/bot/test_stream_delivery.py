"""Each run as one streamed plan message, through the real Delivery and the fake Slack's
stream methods, on SQLite and PostgreSQL: started with the plan, appended to only once
its receipt is in the log, stopped with the answer and the feedback row; refused
channels get lines; restarts and closed streams never make a second plan message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot import stream
from bot.delivery import Delivery
from bot.outbox import METADATA_TYPE, pending_deliveries, shown_event, shown_run
from bot.plan_outbox import plan_runs
from bot.render.approval import APPROVE_ACTION
from bot.render.plan import answer_text, plan_chunks, runs
from engine import events as ev
from engine.inputs import Decider, cancel, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import reduce
from engine.store import Store, ThreadKey
from localslack.web_api import Call
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

CHANNEL = "C0PLAN0001"
REQUESTER = "U0REQUEST"
REVIEWER = "U0REVIEW"
TWO = [call("lookup", name="db"), call("lookup", name="cache"), say("db and cache found")]
LONG = " ".join(f"step {i} is fine." for i in range(200))  # streamed in several pieces
LONG_ANSWER = [call("lookup", name="db"), say(LONG)]
STREAM_METHODS = ("chat.startStream", "chat.appendStream", "chat.stopStream")


class CheckingSlack(FakeSlack):
    """The fake Slack, noting for each ``chat.appendStream`` / ``chat.stopStream``
    whether the log had the stream's receipt when it came (the rule: recorded first)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: Store | None = None
        self.unrecorded: list[Call] = []

    async def serve(self, call: Call) -> Any:
        if call.method in ("chat.appendStream", "chat.stopStream") and self.store is not None:
            ts = call.params.get("ts")
            recorded = False
            for info in await self.store.list_threads(limit=100):
                events = await self.store.select_events(info.id)
                recorded |= any(
                    isinstance(e, ev.MessagePosted) and e.kind == "stream" and e.ts == ts
                    for e in events
                )
            if not recorded:
                self.unrecorded.append(call)
        return await super().serve(call)


@pytest.fixture
async def slack(store: Store) -> AsyncIterator[CheckingSlack]:
    server = CheckingSlack()
    async with server:
        server.store = store
        yield server
    assert server.unrecorded == [], "appended to a stream before its receipt was in the log"


def client_for(slack: FakeSlack, **kw: Any) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url, **kw)


def delivery_for(store: Store, slack: FakeSlack, owner: str = "proc-a", **kw: Any) -> Delivery:
    return Delivery(store, client_for(slack), owner=owner, retry_base=None, **kw)


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = delivery_for(store, slack)
    yield d
    await d.close()


async def open_thread(store: Store, slack: FakeSlack, channel: str = CHANNEL) -> str:
    root = slack.add_message(channel, "check db and cache", user=REQUESTER)
    key = ThreadKey(TEAM_ID, channel, root["ts"])
    posted = await post_user_message(store, key, text="check db and cache", user=REQUESTER)
    return posted.thread_id


def runner(store: Store, script: list[Step], front_door: Delivery | None = None) -> Runner:
    return Runner(
        store, ScriptedModel(script), make_tools(Counter()), owner="runner", front_door=front_door
    )


def params(c: Call) -> dict[str, Any]:
    """A call's parameters with its JSON fields decoded (the fake's Call has them so)."""
    return {
        k: json.loads(v) if k == "chunks" and isinstance(v, str) else v for k, v in c.params.items()
    }


def plan_messages(slack: FakeSlack, channel: str = CHANNEL) -> list[dict[str, Any]]:
    """The bot's messages that are streams."""
    return [m for m in slack.posted(channel) if slack.workspace.stream(channel, m["ts"])]


def lines(slack: FakeSlack, tid: str, channel: str = CHANNEL) -> list[dict[str, Any]]:
    """The bot's posts in the thread but the status message (the first)."""
    posts = [m for m in slack.posted(channel) if shown_event(m, tid) is not None]
    return posts[1:]


async def log_of(store: Store, tid: str) -> list[ev.AnyEvent]:
    return await store.select_events(tid)


def stream_receipts(events: list[ev.AnyEvent]) -> list[ev.MessagePosted]:
    return [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]


def stops(events: list[ev.AnyEvent]) -> list[ev.StreamStopped]:
    return [e for e in events if isinstance(e, ev.StreamStopped)]


def tasks_of(slack: FakeSlack, ts: str, channel: str = CHANNEL) -> dict[str, dict[str, Any]]:
    found = slack.workspace.stream(channel, ts)
    assert found is not None
    return found["tasks"]


def expected_tasks(events: list[ev.AnyEvent]) -> dict[str, tuple[str, str]]:
    """What the log says each task card of the first run shows: title and status."""
    [run, *_] = runs(events)
    chunks = plan_chunks(run, done=run.ended)
    return {c["id"]: (c["title"], c["status"]) for c in chunks if c["type"] == "task_update"}


def events_first(events: list[ev.AnyEvent]) -> str:
    return events[0].event_id


def message_text(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks", [])) + message.get("text", "")


# --- one run, one plan message --------------------------------------------------------------


async def test_a_run_is_one_plan_message_started_with_the_plan_and_stopped_with_feedback(
    store, slack, delivery
):
    tid = await open_thread(store, slack)
    await runner(store, TWO).run(tid)
    await delivery.deliver(tid)
    events = await log_of(store, tid)
    first = events[0]
    [start] = slack.calls_to("chat.startStream")
    args = params(start)
    # Slack's arguments: the thread, and in a channel the person it is for and their team.
    assert args["channel"] == CHANNEL and args["thread_ts"] == (await store.get_thread(tid)).root_ts
    assert args["recipient_user_id"] == REQUESTER and args["recipient_team_id"] == TEAM_ID
    assert args["task_display_mode"] == "plan"
    chunks = args["chunks"]
    assert chunks[0]["type"] == "plan_update" and chunks[0]["title"]
    tasks = [c for c in chunks if c["type"] == "task_update"]
    assert len(tasks) == 2 and all({"id", "title", "status"} <= c.keys() for c in tasks)
    # The answer went in as markdown, then the stream stopped with the feedback row and
    # metadata naming the run's input.
    appended = [params(c) for c in slack.calls_to("chat.appendStream")]
    assert "".join(a.get("markdown_text", "") for a in appended) == "db and cache found"
    [stop] = slack.calls_to("chat.stopStream")
    assert any(b.get("type") == "context_actions" for b in stop.params["blocks"])
    [plan] = plan_messages(slack)
    assert shown_run(plan, tid) == first.event_id and shown_event(plan, tid) is None
    assert plan["metadata"]["event_type"] == METADATA_TYPE
    assert slack.workspace.stream(CHANNEL, plan["ts"])["state"] == "stopped"
    # Recorded: the segment (showing the run's input) and its stop.
    [receipt] = stream_receipts(events)
    assert (receipt.shows_event_id, receipt.ts, receipt.channel) == (
        first.event_id,
        plan["ts"],
        CHANNEL,
    )
    assert [s.ts for s in stops(events)] == [plan["ts"]]
    # No line per call or for the answer: the plan shows them. The status message stays.
    assert lines(slack, tid) == []
    assert len(slack.calls_to("chat.postMessage")) == 1
    assert {t: (v["title"], v["status"]) for t, v in tasks_of(slack, plan["ts"]).items()} == (
        expected_tasks(events)
    )
    assert [c.method for c in slack.calls if c.method in STREAM_METHODS] == [
        "chat.startStream",
        "chat.appendStream",
        "chat.stopStream",
    ]
    made = len(slack.calls)
    assert await delivery.deliver(tid) == 0  # nothing left
    assert len(slack.calls) == made


async def test_the_runner_starts_the_plan_before_its_first_tool_and_appends_what_changed(
    store, slack, delivery
):
    tid = await open_thread(store, slack)
    await runner(store, TWO, front_door=delivery).run(tid)
    # Shown before each tool ran: started at the first, appended to at the second.
    [start] = slack.calls_to("chat.startStream")
    started = [c for c in params(start)["chunks"] if c["type"] == "task_update"]
    assert [c["status"] for c in started] == ["in_progress"]
    # The plan's appends (the answer's words may also be streaming by now, in the
    # background: appends of text, not of tasks).
    [changed] = [c for c in slack.calls_to("chat.appendStream") if params(c).get("chunks")]
    statuses = sorted(c["status"] for c in params(changed)["chunks"] if c["type"] == "task_update")
    assert statuses == ["complete", "in_progress"]  # the first done, the second running
    events = await log_of(store, tid)
    assert len(stream_receipts(events)) == 1  # the runner appended the handed receipt
    await delivery.deliver(tid)  # at rest: the answer, the stop
    events = await log_of(store, tid)
    [plan] = plan_messages(slack)
    assert {t: (v["title"], v["status"]) for t, v in tasks_of(slack, plan["ts"]).items()} == (
        expected_tasks(events)
    )
    assert slack.workspace.stream(CHANNEL, plan["ts"])["text"] == "db and cache found"
    assert lines(slack, tid) == []


async def test_a_long_answer_is_streamed_in_pieces_that_join_to_it(store, slack, delivery):
    tid = await open_thread(store, slack)
    await runner(store, LONG_ANSWER).run(tid)
    await delivery.deliver(tid)
    texts = [params(c).get("markdown_text") for c in slack.calls_to("chat.appendStream")]
    texts = [t for t in texts if t]
    assert len(texts) >= 2 and all(len(t) <= stream.ANSWER_PIECE for t in texts)
    [run] = runs(await log_of(store, tid))
    assert "".join(texts) == answer_text(run)


async def test_an_approval_card_comes_below_the_plan_that_stops_there_without_feedback(
    store, slack, delivery
):
    tid = await open_thread(store, slack)
    script = [call("deploy", name="api"), say("Deployed api.")]
    await runner(store, script).run(tid)
    await delivery.deliver(tid)
    [plan] = plan_messages(slack)
    [stop] = slack.calls_to("chat.stopStream")
    assert "blocks" not in stop.params  # no feedback row: the run stopped at a card
    posts = slack.posted(CHANNEL)
    card = next(m for m in posts if shown_event(m, tid) and APPROVE_ACTION in json.dumps(m))
    assert shown_event(card, tid) != events_first(await log_of(store, tid))
    assert float(plan["ts"]) < float(card["ts"])  # the card below the plan
    # Approved: the work goes on in a new run, a new plan message below the card.
    events = await log_of(store, tid)
    cid = next(e.tool_call_id for e in events if isinstance(e, ev.ApprovalRequested))
    await decide_approval(
        store,
        tid,
        tool_call_id=cid,
        decider=Decider(REVIEWER),
        decision="approve",
        reviewers=ReviewerRule(),
    )
    await runner(store, script).run(tid)
    await delivery.deliver(tid)
    plans = plan_messages(slack)
    assert len(plans) == 2 and float(plans[1]["ts"]) > float(card["ts"])
    assert slack.workspace.stream(CHANNEL, plans[1]["ts"])["text"] == "Deployed api."
    assert len(stream_receipts(await log_of(store, tid))) == 2


async def test_timeline_mode_is_asked_of_slack(store, slack):
    d = delivery_for(store, slack, task_display_mode="timeline")
    tid = await open_thread(store, slack)
    await runner(store, TWO).run(tid)
    await d.deliver(tid)
    assert params(slack.calls_to("chat.startStream")[0])["task_display_mode"] == "timeline"


async def test_in_a_dm_no_recipient_is_named(store, slack, delivery):
    tid = await open_thread(store, slack, channel="D0PLANDM01")
    await runner(store, TWO).run(tid)
    await delivery.deliver(tid)
    [start] = slack.calls_to("chat.startStream")
    assert "recipient_user_id" not in start.params and "recipient_team_id" not in start.params
    assert len(plan_messages(slack, "D0PLANDM01")) == 1


# --- refused: lines -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error", ["method_not_supported_for_channel_type", "not_allowed", "team_access_not_granted"]
)
async def test_a_channel_refusing_streams_gets_lines_decided_once_and_logged_once(
    store, slack, delivery, caplog, error
):
    slack.workspace.streams_refused[CHANNEL] = error
    caplog.set_level(logging.WARNING, logger="opsloop.delivery")
    first = await open_thread(store, slack)
    await runner(store, TWO).run(first)
    await delivery.deliver(first)
    second = await open_thread(store, slack)
    await runner(store, TWO).run(second)
    await delivery.deliver(second)
    assert len(slack.calls_to("chat.startStream")) == 1  # once per channel per process
    refusals = [r for r in caplog.records if "streams refused" in r.getMessage()]
    assert len(refusals) == 1 and CHANNEL in refusals[0].getMessage()
    for tid in (first, second):
        shown = [(await by_id(store, tid))[shown_event(m, tid)].type for m in lines(slack, tid)]
        assert shown == ["tool_call_requested", "tool_result"] * 2 + ["final_answer"]
        assert stream_receipts(await log_of(store, tid)) == []
    # Another channel still gets plans.
    other = await open_thread(store, slack, channel="C0PLAN0002")
    await runner(store, TWO).run(other)
    await delivery.deliver(other)
    assert len(plan_messages(slack, "C0PLAN0002")) == 1


async def test_a_5xx_from_start_stream_is_retried_later_not_a_fallback(store, slack, delivery):
    slack.fail("chat.startStream", "internal_error", status=500)
    tid = await open_thread(store, slack)
    await runner(store, TWO).run(tid)
    await delivery.deliver(tid)  # stopped for now; nothing posted as lines
    assert lines(slack, tid) == []
    await delivery.deliver(tid)
    assert len(plan_messages(slack)) == 1 and lines(slack, tid) == []


async def by_id(store: Store, tid: str) -> dict[str, ev.AnyEvent]:
    return {e.event_id: e for e in await store.select_events(tid)}


# --- rotation -------------------------------------------------------------------------------


async def test_a_stream_about_to_outlive_slacks_limit_continues_in_a_new_segment(store, slack):
    clock = FakeClock(ev.utcnow())
    d = delivery_for(store, slack, clock=clock, rotate_after=240)
    script = [call("lookup", name="db"), call("lookup", name="cache"), call("lookup", name="x")]
    script.append(say("all found"))

    class Later(ScriptedModel):
        async def next_step(self, prompt, **kw):  # type: ignore[no-untyped-def]
            clock.advance(150)  # each model call takes 2.5 minutes
            return await super().next_step(prompt, **kw)

    tid = await open_thread(store, slack)
    r = Runner(
        store, Later(script), make_tools(Counter()), owner="runner", front_door=d, clock=clock
    )
    await r.run(tid)
    await d.deliver(tid)
    events = await log_of(store, tid)
    segments = stream_receipts(events)
    run_start = events[0].event_id
    assert len(segments) == 2 and {s.shows_event_id for s in segments} == {run_start}
    assert [s.ts for s in stops(events)] == [s.ts for s in segments]
    old, new = (slack.workspace.stream(CHANNEL, s.ts) for s in segments)
    assert old["closing"] == [] and old["text"] == ""  # stopped early, no feedback, no answer
    assert new["text"] == "all found" and new["closing"]  # the answer and the feedback row
    assert set(new["tasks"]) == set(expected_tasks(events))  # the same plan, continued
    assert (clock() - segments[0].created_at).total_seconds() >= 240


# --- restarts and closed streams ---------------------------------------------------------------


async def test_a_started_stream_whose_receipt_was_lost_is_adopted_not_started_again(store, slack):
    tid = await open_thread(store, slack)
    await runner(store, TWO).run(tid)
    gate = slack.hold("chat.startStream")  # Slack starts it; its answer never arrives
    first = Delivery(store, client_for(slack, timeout=1), owner="proc-a", retry_base=None)
    await first.deliver(tid)
    assert len(plan_messages(slack)) == 1 and stream_receipts(await log_of(store, tid)) == []
    gate.set()
    again = delivery_for(store, slack, owner="proc-b")  # a new process
    await again.deliver(tid)
    assert len(slack.calls_to("chat.startStream")) == 1
    [plan] = plan_messages(slack)
    events = await log_of(store, tid)
    assert [r.ts for r in stream_receipts(events)] == [plan["ts"]]
    # What it holds is not known: stopped and replaced whole, the answer once.
    assert message_text(plan).count("db and cache found") == 1
    assert shown_run(plan, tid) == events[0].event_id
    assert [s.ts for s in stops(events)] == [plan["ts"]]


class Stuck(ScriptedModel):
    """Plays the script, then thinks forever (the process is killed meanwhile)."""

    def __init__(self, script: list[Step]) -> None:
        super().__init__(script)
        self.stuck = asyncio.Event()

    async def next_step(self, prompt, **kw):  # type: ignore[no-untyped-def]
        if prompt.turn >= len(self.script):
            self.stuck.set()
            await asyncio.Event().wait()
        return await super().next_step(prompt, **kw)


async def run_until_stuck(store: Store, model: Stuck, front_door: Delivery, tid: str) -> None:
    """Run the thread until the model thinks forever, then kill the run (its lease is
    let go, as a successor's expiry would)."""
    r = Runner(store, model, make_tools(Counter()), owner="runner", front_door=front_door)
    task = asyncio.create_task(r.run(tid))
    await asyncio.wait_for(model.stuck.wait(), 10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_after_a_restart_an_open_stream_gets_every_card_again_then_is_replaced(store, slack):
    tid = await open_thread(store, slack)
    first = delivery_for(store, slack)
    # The first process shows the run up to its second tool, then dies thinking.
    model = Stuck([call("lookup", name="db"), call("lookup", name="cache")])
    await run_until_stuck(store, model, first, tid)
    assert len(slack.calls_to("chat.startStream")) == 1
    appends = len(slack.calls_to("chat.appendStream"))
    again = delivery_for(store, slack, owner="proc-b")  # a new process
    events = await log_of(store, tid)
    assert await again.show(tid, events, reduce(events)) == []  # appended to, not started
    resync = slack.calls_to("chat.appendStream")[appends:]
    assert len(resync) == 1
    chunks = [c for c in params(resync[0])["chunks"] if c["type"] == "task_update"]
    assert {c["id"] for c in chunks} == set(expected_tasks(events))  # every card, once
    # Its details and output may be there already: never named again.
    assert all(c.keys() == {"type", "id", "title", "status"} for c in chunks)
    # The run goes on. What the message holds besides its cards is not known (the model
    # call in flight may have streamed words): it is replaced in place at the end.
    script = [call("lookup", name="db"), call("lookup", name="cache"), say("ok")]
    await runner(store, script).run(tid)
    await again.deliver(tid)
    [plan] = plan_messages(slack)
    events = await log_of(store, tid)
    assert [c for c in slack.calls_to("chat.update") if c.params["ts"] == plan["ts"]]
    markdown = [b["text"] for b in plan["blocks"] if b.get("type") == "markdown"]
    assert markdown == ["ok"]
    [block] = [b for b in plan["blocks"] if b.get("type") == "plan"]
    assert {t["task_id"]: (t["title"], t["status"]) for t in block["tasks"]} == (
        expected_tasks(events)
    )
    assert any(b.get("type") == "context_actions" for b in plan["blocks"])  # the feedback row
    assert len(stream_receipts(events)) == 1 and [s.ts for s in stops(events)] == [plan["ts"]]
    # No card in Slack's record says anything twice.
    for task in tasks_of(slack, plan["ts"]).values():
        assert_said_once(task)


def assert_said_once(task: dict[str, Any]) -> None:
    """A task's details and output as the fake shows them (it appends what is named
    again): each line once."""
    for key in ("details", "output"):
        text = task.get(key, "")
        lines = [line for line in text.split("\n") if line]
        assert len(lines) == len(set(lines)), (key, text)


async def test_an_answer_cut_by_a_crash_is_replaced_not_appended_after(store, slack, monkeypatch):
    tid = await open_thread(store, slack)
    await runner(store, LONG_ANSWER).run(tid)
    first = delivery_for(store, slack)
    real = slack.serve
    pieces = 0

    async def cut(c: Call) -> Any:
        """Slack takes the answer's first piece; the second never comes back."""
        nonlocal pieces
        if c.method == "chat.appendStream" and c.params.get("markdown_text"):
            pieces += 1
            if pieces == 2:
                raise ConnectionResetError("gone")
        return await real(c)

    monkeypatch.setattr(slack, "serve", cut)
    await first.deliver(tid)
    [plan] = plan_messages(slack)
    assert slack.workspace.stream(CHANNEL, plan["ts"])["state"] == "streaming"
    partial = slack.workspace.stream(CHANNEL, plan["ts"])["text"]
    assert partial and LONG.startswith(partial) and partial != LONG
    monkeypatch.setattr(slack, "serve", real)
    again = delivery_for(store, slack, owner="proc-b")  # a new process
    await again.deliver(tid)
    [plan] = plan_messages(slack)
    [run] = runs(await log_of(store, tid))
    # Replaced in place, the answer once.
    [update] = [c for c in slack.calls_to("chat.update") if c.params["ts"] == plan["ts"]]
    assert update.params["blocks"] == plan["blocks"]
    markdown = "".join(b["text"] for b in plan["blocks"] if b.get("type") == "markdown")
    assert markdown == answer_text(run)
    shown = json.dumps(plan["blocks"])
    assert shown.count("step 0 is fine.") == 1 and shown.count("step 199 is fine.") == 1
    assert len(stops(await log_of(store, tid))) == 1
    assert len(slack.calls_to("chat.startStream")) == 1


async def test_a_stream_slack_closed_is_updated_in_place_with_the_whole_plan(store, slack):
    tid = await open_thread(store, slack)
    d = delivery_for(store, slack)
    model = Stuck([call("lookup", name="db"), call("lookup", name="x")])
    await run_until_stuck(store, model, d, tid)
    [plan] = plan_messages(slack)
    slack.workspace.stream_ttl_s = 0  # Slack ended it
    await runner(store, [*model.script, say("db found")]).run(tid)
    await d.deliver(tid)
    [plan] = plan_messages(slack)
    events = await log_of(store, tid)
    [update] = [c for c in slack.calls_to("chat.update") if c.params["ts"] == plan["ts"]]
    blocks = update.params["blocks"]
    assert "db found" in json.dumps(blocks)
    assert any(b.get("type") == "context_actions" for b in blocks)  # the feedback row
    assert [s.ts for s in stops(events)] == [plan["ts"]]
    assert len(stream_receipts(events)) == 1  # no second plan message


async def test_a_run_cancelled_midway_says_so_in_its_plan_not_in_a_line(store, slack):
    tid = await open_thread(store, slack)
    d = delivery_for(store, slack)
    await run_until_stuck(store, Stuck([call("lookup", name="db")]), d, tid)
    await cancel(store, tid, decider=Decider(REQUESTER), reviewers=ReviewerRule())
    await d.deliver(tid)
    [plan] = plan_messages(slack)
    message = slack.workspace.stream(CHANNEL, plan["ts"])
    assert message["state"] == "stopped" and "Cancelled by" in message["text"]
    assert message["closing"] == []  # no feedback row: no answer
    assert lines(slack, tid) == []  # the cancellation is said once, in the plan


# --- the outbox, pure ------------------------------------------------------------------------


async def test_lines_a_plan_shows_are_not_pending_but_cards_and_the_status_are(store, slack):
    tid = await open_thread(store, slack)
    await runner(store, [call("lookup", name="db"), call("deploy", name="api")]).run(tid)
    events = await log_of(store, tid)
    live = [(i.kind, i.event.type) for i in pending_deliveries(events, live_plan=True)]
    assert live == [("post", "user_message"), ("post", "approval_requested")]
    lined = [i.event.type for i in pending_deliveries(events, live_plan=False)]
    assert lined[:3] == ["user_message", "tool_call_requested", "tool_result"]
    assert [p.run.start.event_id for p in plan_runs(events, live_plan=True)] == [events[0].event_id]


async def test_a_run_already_shown_as_lines_stays_lines(store, slack):
    """A thread from before plans (or from a process that fell back) keeps its lines:
    no plan message is started for what its lines showed."""
    tid = await open_thread(store, slack)
    await runner(store, TWO).run(tid)
    old = delivery_for(store, slack, live_plan=False)
    await old.deliver(tid)
    before = len(lines(slack, tid))
    await delivery_for(store, slack, owner="proc-b").deliver(tid)
    assert slack.calls_to("chat.startStream") == [] and len(lines(slack, tid)) == before
