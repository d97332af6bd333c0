"""The loading status and the agent session follow the log (bot.agent_surface), through
a real runner and delivery against the fake Slack, on SQLite and PostgreSQL: "is
thinking…" while the model is asked, "is running …" while a tool runs, cleared when the
run stops (an answer, an approval card), set again before Slack's two-minute timeout
(an injected timer), and the session processing → suspended → active; where the app
is not an agent, that is noted once and the statuses still work."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from slack_sdk.web.async_client import AsyncWebClient

from bot.agent_surface import REFRESH_S, AgentSurface, FollowingDoor
from bot.delivery import Delivery
from engine.agent_inputs import request_stop
from engine.inputs import Accepted, Decider, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import ThreadState
from engine.store import Store, ThreadKey
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.demo_tools import make_tools
from tests.support.fakes import RecordingModel
from tools import ToolContext, ToolRegistry, tool

CHANNEL = "C0OPS00001"
ANN = "U0ANN00001"
BOUND = 10.0  # seconds: a generous bound on a condition, never a pace
STATUS, SESSION = "assistant.threads.setStatus", "agents.sessions.setStatus"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


@dataclass
class _Timer:
    delay: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Timers:
    """``call_later`` that fires only when the test says: no timing in tests."""

    made: list[_Timer] = field(default_factory=list)

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(delay, callback)
        self.made.append(timer)
        return timer

    @property
    def live(self) -> list[_Timer]:
        return [t for t in self.made if not t.cancelled]

    def fire(self) -> None:
        due, self.made = self.live, []
        for timer in due:
            timer.callback()


class Args(BaseModel):
    name: str


class Harness:
    """A thread run by a runner whose front door is delivery with the surface wrapped
    around it, as ``bot.runtime`` builds it."""

    def __init__(
        self, store: Store, slack: FakeSlack, model: Any, tools: ToolRegistry | None = None
    ) -> None:
        self.store, self.slack = store, slack
        self.timers = Timers()
        client = AsyncWebClient(token=TOKEN, base_url=slack.url)
        delivery = Delivery(store, client, owner="proc", retry_base=None)
        self.surface = AgentSurface(client, call_later=self.timers.call_later)
        self.door = FollowingDoor(delivery, self.surface, store)
        self.runner = Runner(store, model, tools or make_tools(Counter()), front_door=self.door)
        self.root = ""
        self.tid = ""

    async def mention(self, text: str = "check the api please") -> None:
        self.root = self.slack.add_message(CHANNEL, text, user=ANN)["ts"]
        key = ThreadKey(TEAM_ID, CHANNEL, self.root)
        self.tid = (await post_user_message(self.store, key, text=text, user=ANN)).thread_id

    async def run(self) -> ThreadState:
        """One run, then the worker's after-run hook."""
        state = await self.runner.run(self.tid)
        assert state is not None
        await self.door.deliver(self.tid)
        return state

    def status(self) -> str | None:
        shown = self.slack.thread_status(CHANNEL, self.root)
        return None if shown is None else shown["status"]

    def sent(self, method: str, key: str = "status") -> list[Any]:
        return [c.params.get(key) for c in self.slack.calls_to(method)]


def gated(script: list[Step]) -> tuple[RecordingModel, asyncio.Event]:
    gate = asyncio.Event()
    return RecordingModel(script, gate=gate), gate


async def test_thinking_while_the_model_is_asked_then_cleared_on_the_answer(
    store: Store, slack: FakeSlack
) -> None:
    model, gate = gated([say("api is healthy")])
    h = Harness(store, slack, model)
    await h.mention()
    run = asyncio.create_task(h.run())
    await asyncio.wait_for(model.entered.wait(), BOUND)
    assert h.status() == "is thinking…"
    [shown] = slack.calls_to(STATUS)
    assert shown.params["loading_messages"]  # Slack turns through them meanwhile
    session = slack.session(CHANNEL, h.root)
    assert session is not None and session["status"] == "processing"
    assert session["title"] == "check the api please"
    assert session["initiator_user_id"] == ANN
    gate.set()
    assert (await asyncio.wait_for(run, BOUND)).status == "idle"
    assert h.sent(STATUS)[-1] == "" and h.status() is None
    assert h.sent(SESSION) == ["processing", "active"]
    assert h.timers.live == []  # no refresh once the status is gone


async def test_running_a_tool_says_which_then_the_answer_clears_it(
    store: Store, slack: FakeSlack
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    tools = make_tools(Counter())

    @tool(registry=tools)
    async def check_health(args: Args, ctx: ToolContext) -> dict:
        """Check a service's health."""
        entered.set()
        await release.wait()
        return {"healthy": True}

    model = ScriptedModel([call("check_health", name="api"), say("api is healthy")])
    h = Harness(store, slack, model, tools)
    await h.mention()
    run = asyncio.create_task(h.run())
    await asyncio.wait_for(entered.wait(), BOUND)
    status = h.status()
    assert status is not None and status.startswith("is running check health")
    assert "api" in status
    release.set()
    await asyncio.wait_for(run, BOUND)
    said = h.sent(STATUS)
    assert said[0] == "is thinking…" and said[-1] == ""
    assert any(s.startswith("is running check health") for s in said)
    assert h.status() is None


async def test_an_approval_card_ends_the_status_and_suspends_the_session(
    store: Store, slack: FakeSlack
) -> None:
    h = Harness(store, slack, ScriptedModel([call("deploy", name="api"), say("deployed api")]))
    await h.mention("deploy api")
    assert (await h.run()).status == "awaiting_approval"
    assert h.sent(STATUS) == ["is thinking…", ""] and h.status() is None
    assert slack.session(CHANNEL, h.root)["status"] == "suspended"  # type: ignore[index]
    state = await store.load(h.tid)
    assert state.pending is not None
    await decide_approval(
        store,
        h.tid,
        tool_call_id=state.pending.tool_call_id,
        decider=Decider("U0BOB00001"),
        decision="approve",
        reviewers=ReviewerRule(),
    )
    assert (await h.run()).status == "idle"
    assert h.sent(SESSION) == ["processing", "suspended", "processing", "active"]
    assert h.status() is None


async def test_the_status_is_set_again_before_slack_drops_it(
    store: Store, slack: FakeSlack
) -> None:
    model, gate = gated([say("done")])
    h = Harness(store, slack, model)
    await h.mention()
    run = asyncio.create_task(h.run())
    await asyncio.wait_for(model.entered.wait(), BOUND)
    [timer] = h.timers.live
    assert timer.delay == REFRESH_S < 120  # Slack's timeout
    slack.advance(REFRESH_S)
    h.timers.fire()  # the same step still runs
    await asyncio.wait_for(h.surface.settle(), BOUND)
    assert h.sent(STATUS) == ["is thinking…", "is thinking…"]
    slack.advance(REFRESH_S)  # past two minutes since the first: shown by the refresh
    assert h.status() == "is thinking…"
    assert len(h.timers.live) == 1  # and the next refresh is set
    gate.set()
    await asyncio.wait_for(run, BOUND)
    assert h.timers.live == [] and h.status() is None


async def test_a_workspace_not_declared_an_agent_is_noted_once(
    store: Store, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    slack.agent_view = False
    h = Harness(store, slack, ScriptedModel([say("one"), say("two")]))
    caplog.set_level(logging.INFO, logger="opsloop.surface")
    await h.mention("first")
    await h.run()
    await h.mention("second")
    await h.run()
    assert len(slack.calls_to(SESSION)) == 1  # then never again in that workspace
    noted = [r for r in caplog.records if "not_authorized" in r.getMessage()]
    assert len(noted) == 1 and noted[0].levelno == logging.INFO
    assert h.sent(STATUS) == ["is thinking…", "", "is thinking…", ""]  # statuses still work


async def test_slack_errors_never_break_the_run_and_are_logged_once(
    store: Store, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    slack.fail(STATUS, "internal_error", times=10)
    effects: Counter = Counter()
    model = ScriptedModel([call("lookup", name="db"), call("lookup", name="api"), say("ok")])
    h = Harness(store, slack, model, make_tools(effects))
    await h.mention()
    assert (await h.run()).status == "idle"
    assert effects["lookup"] == 2
    failed = [r for r in caplog.records if STATUS in r.getMessage()]
    assert len(failed) == 1 and "internal_error" in failed[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]


async def test_a_stop_pressed_while_thinking_clears_the_status(
    store: Store, slack: FakeSlack
) -> None:
    model, gate = gated([say("never said")])
    h = Harness(store, slack, model)
    await h.mention()
    run = asyncio.create_task(h.run())
    await asyncio.wait_for(model.entered.wait(), BOUND)
    assert h.status() == "is thinking…"
    stopped = await request_stop(store, h.tid, decider=Decider(ANN), reviewers=ReviewerRule())
    assert isinstance(stopped, Accepted)
    gate.set()
    assert (await asyncio.wait_for(run, BOUND)).status == "idle"
    assert h.sent(STATUS)[-1] == "" and h.status() is None
    assert h.sent(SESSION) == ["processing", "active"]
    assert h.timers.live == []
