"""The final answer streamed into its run's plan message while the model writes it,
through a real Runner, the real Delivery and the fake Slack (the Anthropic adapter over
the fake Messages API's server-sent events, or a scripted model that waits on what
Slack shows), on SQLite and PostgreSQL: pieces reach Slack before the answer is in the
log, the stopped message says the answer once, words before a tool call end up
replaced, and a crash before the plan message's receipt is adopted, not doubled."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.outbox import shown_event
from bot.render.plan import answer_text, runs
from engine import events as ev
from engine.context import Prompt
from engine.inputs import post_user_message
from engine.models.anthropic import AnthropicModel
from engine.models.base import Decision, TextSink
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.runner import Runner
from engine.store import Store, ThreadKey
from localslack.web_api import Call
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic, Reply
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.demo_tools import make_tools

CHANNEL = "C0ANSWER01"
REQUESTER = "U0REQUEST"
# Long enough to take the fake a second or more at 3 characters a delta (several sends),
# with what markdown escapes.
ANSWER = " ".join(f"Check {i} of the db & cache is <fine>." for i in range(12))


def markdown_of(c: Call) -> str:
    """The markdown text a stream call carries (its argument, and its chunks')."""
    text = c.params.get("markdown_text") or ""
    chunks = c.params.get("chunks") or []
    if isinstance(chunks, str):
        chunks = json.loads(chunks)
    return text + "".join(ch["text"] for ch in chunks if ch.get("type") == "markdown_text")


class Watching(FakeSlack):
    """The fake Slack, noting the markdown each stream call brought while the log had
    no final answer yet (streamed while the model wrote it)."""

    def __init__(self) -> None:
        super().__init__()
        self.store: Store | None = None
        self.early: list[str] = []

    async def serve(self, call: Call) -> Any:
        text = markdown_of(call) if call.method.startswith("chat.") else ""
        if text and self.store is not None:
            answered = False
            for info in await self.store.list_threads(limit=100):
                events = await self.store.select_events(info.id)
                answered |= any(isinstance(e, ev.FinalAnswer) for e in events)
            if not answered:
                self.early.append(text)
        return await super().serve(call)

    def markdown(self) -> str:
        return "".join(markdown_of(c) for c in self.calls if c.method.startswith("chat."))


@pytest.fixture
async def slack(store: Store) -> AsyncIterator[Watching]:
    server = Watching()
    async with server:
        server.store = store
        yield server


@pytest.fixture
async def claude() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic(streaming=True) as fake:
        yield fake
    fake.assert_clean()


@pytest.fixture
async def model(claude: FakeAnthropic) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel(
        AsyncAnthropic(api_key=FAKE_API_KEY, base_url=claude.url, max_retries=0, timeout=10)
    )
    yield m
    await m.close()


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = delivery_for(store, slack)
    yield d
    await d.close()


def delivery_for(store: Store, slack: FakeSlack, owner: str = "proc-a", **kw: Any) -> Delivery:
    client = AsyncWebClient(token=TOKEN, base_url=slack.url)
    return Delivery(store, client, owner=owner, retry_base=None, **kw)


async def open_thread(store: Store, slack: FakeSlack) -> str:
    root = slack.add_message(CHANNEL, "is the db fine?", user=REQUESTER)
    key = ThreadKey(TEAM_ID, CHANNEL, root["ts"])
    return (await post_user_message(store, key, text="is the db fine?", user=REQUESTER)).thread_id


def slow(text: str) -> Reply:
    """A reply whose text comes over a second or more (3 characters a delta)."""
    return Reply(content=[{"type": "text", "text": text}], gap=0.01)


def plan_messages(slack: FakeSlack) -> list[dict[str, Any]]:
    return [m for m in slack.posted(CHANNEL) if slack.workspace.stream(CHANNEL, m["ts"])]


def markdown_blocks(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message.get("blocks") or [] if b.get("type") == "markdown"]


def updates_of(slack: FakeSlack, ts: str) -> list[Call]:
    return [c for c in slack.calls_to("chat.update") if c.params["ts"] == ts]


def stream_receipts(events: list[ev.AnyEvent]) -> list[ev.MessagePosted]:
    return [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]


def stops(events: list[ev.AnyEvent]) -> list[str]:
    return [e.ts for e in events if isinstance(e, ev.StreamStopped)]


async def until(slack: FakeSlack, ready: Callable[[], bool], timeout: float = 10) -> None:  # noqa: ASYNC109
    """Wait (bounded) until ``ready()`` holds after some call to the fake."""
    assert slack._cond is not None
    async with asyncio.timeout(timeout), slack._cond:
        await slack._cond.wait_for(ready)


# --- the Anthropic adapter's stream --------------------------------------------------------


async def test_an_answer_is_streamed_into_a_new_plan_message_while_the_model_writes_it(
    store, slack, claude, model, delivery
):
    claude.reply(slow(ANSWER))
    tid = await open_thread(store, slack)
    runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=delivery)
    assert (await runner.run(tid)).status == "idle"
    await delivery.deliver(tid)  # at rest: the rest of it, and the stop
    events = await store.select_events(tid)
    [run] = runs(events)
    answer = answer_text(run)
    assert "&amp;" in answer and "&lt;fine&gt;" in answer  # escaped as the end shows it
    # Pieces reached Slack while the model wrote it; all of them join to the answer.
    assert len(slack.early) >= 2 and answer.startswith("".join(slack.early))
    assert slack.markdown() == answer
    # One plan message, started with its title and the first words, below the status
    # message; stopped with the feedback row; never replaced.
    [start] = slack.calls_to("chat.startStream")
    chunks = start.params["chunks"]
    chunks = json.loads(chunks) if isinstance(chunks, str) else chunks
    assert [c["type"] for c in chunks] == ["plan_update", "markdown_text"]
    [plan] = plan_messages(slack)
    status, *_ = slack.posted(CHANNEL)
    assert shown_event(status, tid) == events[0].event_id
    assert float(status["ts"]) < float(plan["ts"])
    stream = slack.workspace.stream(CHANNEL, plan["ts"])
    assert stream["state"] == "stopped" and stream["text"] == answer
    assert any(b.get("type") == "context_actions" for b in stream["closing"])
    assert updates_of(slack, plan["ts"]) == []
    # Recorded: the plan message's receipt (handed over after the run) and its stop.
    assert [r.ts for r in stream_receipts(events)] == [plan["ts"]]
    assert stops(events) == [plan["ts"]]


async def test_after_tools_the_answer_streams_into_the_runs_plan_message(
    store, slack, claude, model, delivery
):
    claude.tool_use("lookup", {"name": "db"}, text="Looking.").reply(slow(ANSWER))
    tid = await open_thread(store, slack)
    runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=delivery)
    assert (await runner.run(tid)).status == "idle"
    await delivery.deliver(tid)
    events = await store.select_events(tid)
    [run] = runs(events)
    answer = answer_text(run)
    assert slack.early and any(piece in answer for piece in slack.early)
    [plan] = plan_messages(slack)
    assert len(slack.calls_to("chat.startStream")) == 1
    shown = slack.workspace.stream(CHANNEL, plan["ts"])
    assert shown["state"] == "stopped" and len(shown["tasks"]) == 1
    # The message ends with the plan and the answer, once ("Looking." came with the
    # tool call, within the hold, so it never showed: if it had, it would be replaced).
    assert "".join(markdown_blocks(plan)) == answer
    assert len(stream_receipts(events)) == 1 and stops(events) == [plan["ts"]]


# --- words that were no answer --------------------------------------------------------------


class Talking(ScriptedModel):
    """Plays ``script``, writing its words through ``on_text`` as Claude would, and
    waiting (bounded) until Slack shows each piece before going on: ``words[i]`` is
    what reply ``i`` writes before its decision (words before a tool call are reset; a
    reply past the script's end writes, then thinks forever: the process dies)."""

    def __init__(self, slack: FakeSlack, script: list[Step], words: dict[int, list[str]]) -> None:
        super().__init__(script)
        self.slack = slack
        self.words = words
        self.stuck = asyncio.Event()

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        turn = prompt.turn
        pieces = self.words.get(turn, [])
        if on_text is not None and pieces:
            for piece in pieces:
                await on_text(piece)
                if piece.endswith(" "):  # a last word waits for what follows it
                    await until(self.slack, self.shows(piece.strip()))
            if turn >= len(self.script):  # the process dies while the model writes
                self.stuck.set()
                await asyncio.Event().wait()
            decision = await super().next_step(prompt)
            if decision.tool_use is not None:
                await on_text("", reset=True)
            return decision
        return await super().next_step(prompt, on_text=on_text)

    def shows(self, words: str) -> Callable[[], bool]:
        return lambda: words in slack_text(self.slack)


def slack_text(slack: FakeSlack) -> str:
    return "".join(markdown_of(c) for c in list(slack.calls) if c.method.startswith("chat."))


async def test_words_before_a_tool_call_are_replaced_by_the_plan_and_the_answer_at_the_end(
    store, slack, delivery
):
    before = "Let me look at the db first, then the cache. "
    answer = "The db and the cache are fine. All green."
    model = Talking(
        slack,
        [call("lookup", name="db"), say(answer)],
        {0: [before], 1: ["The db and the cache are fine. ", "All green."]},
    )
    tid = await open_thread(store, slack)
    runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=delivery)
    assert (await runner.run(tid)).status == "idle"
    await delivery.deliver(tid)
    events = await store.select_events(tid)
    [plan] = plan_messages(slack)
    # Both were streamed into the one plan message while the model wrote them...
    assert len(slack.calls_to("chat.startStream")) == 1
    assert before.strip() in slack.workspace.stream(CHANNEL, plan["ts"])["text"]
    assert any("The db and the cache" in piece for piece in slack.early)
    # ...and the message ends with the plan and the answer only, replaced in place.
    assert updates_of(slack, plan["ts"])
    [run] = runs(events)
    assert markdown_blocks(plan) == [answer_text(run)] == [answer]
    [block] = [b for b in plan["blocks"] if b.get("type") == "plan"]
    assert [(t["title"], t["status"]) for t in block["tasks"]] == [
        ("Lookup (name: db)", "complete")
    ]
    assert any(b.get("type") == "context_actions" for b in plan["blocks"])
    assert [r.ts for r in stream_receipts(events)] == [plan["ts"]]
    assert stops(events) == [plan["ts"]]


async def test_words_a_tool_call_follows_within_the_hold_are_never_shown(store, slack):
    d = delivery_for(store, slack, answer_hold=60)  # a tool call always comes first

    class Quick(Talking):
        async def next_step(self, prompt, *, on_text=None):  # type: ignore[no-untyped-def]
            if prompt.turn == 0 and on_text is not None:
                await on_text("Checking the db. ")
                await on_text("", reset=True)
                return await ScriptedModel.next_step(self, prompt)
            return await ScriptedModel.next_step(self, prompt, on_text=on_text)

    model = Quick(slack, [call("lookup", name="db"), say("All fine.")], {})
    tid = await open_thread(store, slack)
    try:
        runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=d)
        assert (await runner.run(tid)).status == "idle"
        await d.deliver(tid)
    finally:
        await d.close()
    assert "Checking" not in slack.markdown()
    [plan] = plan_messages(slack)
    assert slack.workspace.stream(CHANNEL, plan["ts"])["text"] == "All fine."
    assert updates_of(slack, plan["ts"]) == []


# --- a crash before the receipt --------------------------------------------------------------


async def test_a_plan_message_the_answer_started_is_adopted_after_a_crash_and_replaced(
    store, slack
):
    tid = await open_thread(store, slack)
    first = delivery_for(store, slack)
    interrupted = "The answer is coming, slowly and surely. "
    model = Talking(slack, [], {0: [interrupted]})  # writes, then the process dies
    runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=first)
    task = asyncio.create_task(runner.run(tid))
    await asyncio.wait_for(model.stuck.wait(), 10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await first.close()  # what it held (the plan message's receipt) dies with it
    [plan] = plan_messages(slack)
    assert stream_receipts(await store.select_events(tid)) == []

    again = delivery_for(store, slack, owner="proc-b")  # a new process
    try:
        answer = "Here it is: all fine."
        rerun = Runner(store, ScriptedModel([say(answer)]), make_tools(Counter()), front_door=again)
        assert (await rerun.run(tid)).status == "idle"
        await again.deliver(tid)
    finally:
        await again.close()
    events = await store.select_events(tid)
    assert len(slack.calls_to("chat.startStream")) == 1  # never a second plan message
    [plan] = plan_messages(slack)
    assert [r.ts for r in stream_receipts(events)] == [plan["ts"]]  # adopted
    # What it held is not known: replaced whole, the answer once, the interrupted words gone.
    assert updates_of(slack, plan["ts"])
    assert markdown_blocks(plan) == [answer]
    assert interrupted.strip() not in json.dumps(plan["blocks"])
    assert stops(events) == [plan["ts"]]
