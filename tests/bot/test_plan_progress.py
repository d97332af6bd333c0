"""A running MCP call's progress (``notifications/progress``) in its task card's title,
through a real SDK server over stdio, the real Runner and Delivery and the fake Slack:
appended to the plan message while the call runs, never recorded, and gone from the
title once the call is done. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from engine import events as ev
from engine.config_file import PolicyRule
from engine.context import Prompt
from engine.inputs import post_user_message
from engine.models.base import Decision, TextSink
from engine.models.scripted import ScriptedModel, call, say
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.tools.test_mcp import stdio
from tools import ToolRegistry
from tools.mcp import McpSource
from tools.mcp.progress import ProgressHub

pytestmark = pytest.mark.slow

CHANNEL = "C0PROGRESS"
REQUESTER = "U0REQUEST"
RUN_NOW = PolicySet((PolicyRule.model_validate({"tool": "mcp__*", "policy": "run_now"}),))


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def task_updates(slack: FakeSlack) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for c in slack.calls_to("chat.appendStream"):
        chunks = c.params.get("chunks") or []
        chunks = json.loads(chunks) if isinstance(chunks, str) else chunks
        out += [ch for ch in chunks if ch.get("type") == "task_update"]
    return out


def progress_shown(slack: FakeSlack) -> list[dict[str, Any]]:
    return [c for c in task_updates(slack) if " % — step" in c["title"]]


class AfterProgress(ScriptedModel):
    """Answers only once Slack showed the call's progress (bounded): the run does not
    end before the progress had its chance to show."""

    def __init__(self, slack: FakeSlack) -> None:
        super().__init__([call("mcp__demo__progress"), say("Done.")])
        self.slack = slack

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        if prompt.turn == 1:
            assert self.slack._cond is not None
            async with asyncio.timeout(10), self.slack._cond:
                await self.slack._cond.wait_for(lambda: len(progress_shown(self.slack)) >= 3)
        return await super().next_step(prompt, on_text=on_text)


async def test_an_mcp_calls_progress_shows_in_its_task_cards_title(
    store: Store, slack: FakeSlack
) -> None:
    hub = ProgressHub(every_s=0)  # each notification passed on at once
    source = McpSource("demo", stdio("--ask"), progress=hub)
    await source.open()
    d = Delivery(
        store,
        AsyncWebClient(token=TOKEN, base_url=slack.url),
        owner="proc",
        retry_base=None,
        progress=hub,
    )
    try:
        registry = ToolRegistry()
        for tool in source.offered:
            registry.register(tool)
        root = slack.add_message(CHANNEL, "run the long job", user=REQUESTER)["ts"]
        key = ThreadKey(TEAM_ID, CHANNEL, root)
        tid = (await post_user_message(store, key, text="run it", user=REQUESTER)).thread_id
        runner = Runner(store, AfterProgress(slack), registry, policy=RUN_NOW, front_door=d)
        state = await runner.run(tid)
        assert state is not None and state.status == "idle"
        await d.deliver(tid)
    finally:
        await d.close()
        await source.close()
    shown = progress_shown(slack)
    assert [c["title"].split(" — ", 1)[1] for c in shown] == [
        "33 % — step 1 of 3",
        "67 % — step 2 of 3",
        "100 % — step 3 of 3",
    ]
    assert {c["status"] for c in shown} == {"in_progress"}
    assert all(set(c) == {"type", "id", "title", "status"} for c in shown)  # titles only
    # Done: the card's title is the call's again, and nothing of it was recorded.
    [plan] = [m for m in slack.posted(CHANNEL) if slack.stream(CHANNEL, m["ts"])]
    stream = slack.stream(CHANNEL, plan["ts"])
    assert stream is not None
    [card] = stream["tasks"].values()
    assert card["status"] == "complete" and "%" not in card["title"]
    assert card["title"] == shown[0]["title"].split(" — ", 1)[0]
    events = await store.select_events(tid)
    assert not any("progress" in e.type for e in events)
    assert [e.type for e in events if isinstance(e, ev.ToolResult)] == ["tool_result"]
