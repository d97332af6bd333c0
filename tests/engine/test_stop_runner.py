"""The stop button honoured by a real runner, with Claude through the fake Messages API,
on SQLite and PostgreSQL: at the next step boundary, a model's decision in flight is
discarded quietly, a running tool ends by its normal path, nothing new starts."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from pydantic import BaseModel

from engine import events as ev
from engine.agent_inputs import request_stop
from engine.inputs import Accepted, Decider, Refused, decide_approval, post_user_message
from engine.models.anthropic import AnthropicModel
from engine.models.base import Decision
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.support.demo_tools import make_tools
from tools import RetryableToolError, ToolContext, ToolRegistry, tool

KEY = ThreadKey("T1", "C1", "1700000000.000100")
ALICE = "U_ALICE"
BOUND = 10.0  # seconds: a generous bound on a condition, never a pace


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as f:
        yield f
    f.assert_clean()


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicModel]:
    model = AnthropicModel(AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url))
    yield model
    await model.close()


class Held:
    """Claude, its decision held back until the test lets it through: a model call in
    flight when someone presses stop."""

    def __init__(self, inner: AnthropicModel) -> None:
        self.inner = inner
        self.name = inner.name
        self.answered = asyncio.Event()
        self.go = asyncio.Event()

    async def next_step(self, prompt: Any, **kw: Any) -> Decision:
        decision = await self.inner.next_step(prompt, **kw)
        self.answered.set()
        await self.go.wait()
        return decision


class Args(BaseModel):
    name: str


class Gate:
    """A tool that blocks until released: a call running when stop is pressed."""

    def __init__(self, *, fail: bool = False) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0
        self.fail = fail

    def tools(self) -> ToolRegistry:
        reg = make_tools(Counter())

        @tool(registry=reg)
        async def check_health(args: Args, ctx: ToolContext) -> dict:
            """Check a service's health (slowly)."""
            self.runs += 1
            self.entered.set()
            await self.release.wait()
            if self.fail:
                raise RetryableToolError("upstream 503")
            return {"service": args.name, "healthy": True}

        return reg


async def start(store: Store, text: str = "check api") -> str:
    done = await post_user_message(store, KEY, text=text, user=ALICE, dedupe_key="m1")
    return done.thread_id


async def stop(store: Store, thread_id: str, key: str = "Ev0STOP") -> Accepted | Refused:
    return await request_stop(
        store, thread_id, decider=Decider(ALICE), reviewers=ReviewerRule(), dedupe_key=key
    )


async def types_of(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in await store.select_events(thread_id)]


def loud(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Log records that would alarm an operator: errors and tracebacks."""
    return [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_decision_in_flight_when_stop_comes_is_discarded_quietly(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel, caplog: pytest.LogCaptureFixture
) -> None:
    fake.tool_use("lookup", {"name": "db"})
    effects: Counter = Counter()
    held = Held(claude)
    runner = Runner(store, held, make_tools(effects))
    tid = await start(store)
    run = asyncio.create_task(runner.run(tid))
    await asyncio.wait_for(held.answered.wait(), BOUND)
    assert isinstance(await stop(store, tid), Accepted)
    held.go.set()
    state = await asyncio.wait_for(run, BOUND)
    assert state is not None and state.status == "idle"
    # The decision met the stop (a conflict), was re-read and refused: nothing of it,
    # no tool, no error event, no traceback.
    assert await types_of(store, tid) == ["user_message", "stop_requested"]
    assert effects["lookup"] == 0
    assert len(fake.requests) == 1
    assert loud(caplog) == []


async def test_a_running_tool_ends_by_its_result_and_the_model_is_not_asked_again(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel, caplog: pytest.LogCaptureFixture
) -> None:
    fake.tool_use("check_health", {"name": "api"})
    gate = Gate()
    runner = Runner(store, claude, gate.tools())
    tid = await start(store)
    run = asyncio.create_task(runner.run(tid))
    await asyncio.wait_for(gate.entered.wait(), BOUND)
    assert isinstance(await stop(store, tid), Accepted)
    assert (await store.load(tid)).stop_by == ALICE  # the call still runs
    gate.release.set()
    state = await asyncio.wait_for(run, BOUND)
    assert state is not None and state.status == "idle" and state.stop_by is None
    events = await store.select_events(tid)
    assert [e.type for e in events][-3:] == ["tool_started", "stop_requested", "tool_result"]
    outcome = events[-1]
    assert isinstance(outcome, ev.ToolResult) and outcome.ok
    assert outcome.output == {"service": "api", "healthy": True}
    assert gate.runs == 1 and len(fake.requests) == 1  # nothing after the result
    assert loud(caplog) == []


async def test_a_stopped_tool_that_fails_transiently_is_not_retried(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel
) -> None:
    fake.tool_use("check_health", {"name": "api"})
    gate = Gate(fail=True)
    runner = Runner(store, claude, gate.tools())
    tid = await start(store)
    run = asyncio.create_task(runner.run(tid))
    await asyncio.wait_for(gate.entered.wait(), BOUND)
    await stop(store, tid)
    gate.release.set()
    state = await asyncio.wait_for(run, BOUND)
    assert state is not None and state.status == "idle"
    outcome = (await store.select_events(tid))[-1]
    assert isinstance(outcome, ev.ToolResult) and not outcome.ok
    assert outcome.error == f"upstream 503 (not retried: <@{ALICE}> stopped the run)"
    assert "retry_scheduled" not in await types_of(store, tid)
    assert gate.runs == 1


async def test_an_approved_call_not_yet_started_is_not_run_after_a_stop(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel
) -> None:
    fake.tool_use("deploy", {"name": "api"})
    effects: Counter = Counter()
    runner = Runner(store, claude, make_tools(effects))
    tid = await start(store, "deploy api")
    state = await runner.run(tid)
    assert state is not None and state.status == "awaiting_approval"
    refused = await stop(store, tid, "Ev0EARLY")
    assert isinstance(refused, Refused)  # a card waits: there is nothing running to stop
    assert state.pending is not None
    await decide_approval(
        store,
        tid,
        tool_call_id=state.pending.tool_call_id,
        decider=Decider("U_BOB"),
        decision="approve",
        reviewers=ReviewerRule(),
    )
    assert isinstance(await stop(store, tid), Accepted)  # approved, not started yet
    state = await runner.run(tid)
    assert state is not None and state.status == "idle" and state.pending is None
    assert effects["deploy"] == 0 and len(fake.requests) == 1
    assert (await types_of(store, tid))[-2:] == ["approval_granted", "stop_requested"]


async def test_a_run_now_call_requested_but_not_started_is_not_run(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel
) -> None:
    effects: Counter = Counter()
    tid = await start(store)
    state = await store.load(tid)
    # As a log from before the intent committed with the decision holds it.
    call = [
        ev.ModelDecision(actor="model", tool_name="lookup", tool_call_id="toolu_1",
                         arguments={"name": "db"}, stop_reason="tool_use"),
        ev.ToolCallRequested(tool_call_id="toolu_1", intent="lookup", arguments={"name": "db"},
                             policy="run_now", idempotency_key=f"{tid}:toolu_1"),
    ]  # fmt: skip
    await store.append(tid, state.last_seq, call, state=state)
    assert isinstance(await stop(store, tid), Accepted)
    state = await Runner(store, claude, make_tools(effects)).run(tid)
    assert state is not None and state.status == "idle"
    assert effects["lookup"] == 0 and fake.requests == []


async def test_a_redelivered_stop_is_stored_once(store: Store) -> None:
    tid = await start(store)
    first = await stop(store, tid)
    again = await stop(store, tid)
    assert isinstance(first, Accepted) and isinstance(again, Accepted)
    assert again.deduplicated and again.event.event_id == first.event.event_id
    assert await types_of(store, tid) == ["user_message", "stop_requested"]


async def test_an_answer_streamed_before_the_stop_is_voided(
    store: Store, fake: FakeAnthropic, claude: AnthropicModel
) -> None:
    """The front door streamed the reply's text while it was written; the stop then
    discarded the decision, so the text is void (the plan shows no answer)."""

    class Streams:
        def __init__(self) -> None:
            self.text: list[tuple[str, bool]] = []

        async def show(self, thread_id: str, events: Any, state: Any) -> list[ev.MessagePosted]:
            return []

        async def answer_text(self, thread_id: str, delta: str, *, reset: bool = False) -> None:
            self.text.append((delta, reset))

    fake.text("api is healthy.")
    door, held = Streams(), Held(claude)
    runner = Runner(store, held, make_tools(Counter()), front_door=door)
    tid = await start(store)
    run = asyncio.create_task(runner.run(tid))
    await asyncio.wait_for(held.answered.wait(), BOUND)
    assert "".join(d for d, _ in door.text) == "api is healthy."
    await stop(store, tid)
    held.go.set()
    state = await asyncio.wait_for(run, BOUND)
    assert state is not None and state.status == "idle"
    assert door.text[-1] == ("", True)
    assert await types_of(store, tid) == ["user_message", "stop_requested"]
