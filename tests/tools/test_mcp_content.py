"""What an MCP result holds reaches Claude (issue 16 §7): an embedded text resource
inline in the tool_result's text, an image as an image block of the tool_result; Slack
keeps the summaries. A real SDK server (tests/support/mcp_servers.py ``picture``), the
runner, and the fake Messages API, which refuses what the real API would."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import pytest

from bot.render.readable import result_text
from engine.context import IMAGE_CHARS, project
from engine.inputs import Decider, decide_approval
from engine.models.anthropic import AnthropicModel
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from tests.engine.test_claude_end_to_end import (
    answer_to,
    assert_replays_what_was_sent,
    start,
    tool_use_id,
)
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.support.mcp_servers import PNG
from tests.tools.test_mcp import stdio
from tools import ToolRegistry
from tools.mcp import McpSource
from tools.mcp.results import tool_output
from tools.output import MAX_IMAGE_BYTES, MAX_RESULT_BYTES

pytestmark = pytest.mark.slow


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as f:
        yield f
    f.assert_clean()


@pytest.fixture
async def model(fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPSLOOP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    m = AnthropicModel.from_env()
    yield m
    await m.close()


@pytest.fixture
async def tools() -> AsyncIterator[ToolRegistry]:
    src = McpSource("demo", stdio(tools=["picture"]))
    reg = ToolRegistry()
    for tool in await src.open():
        reg.register(tool)
    yield reg
    await src.close()


async def test_an_image_and_a_text_resource_reach_claude_in_the_tool_result(
    store, fake, model, tools
):
    fake.tool_use("mcp__demo__picture", {}, text="Let me draw it.")
    runner = Runner(store, model, tools)
    tid = await start(store, "draw the chart")
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"  # an MCP tool, without a rule: approve first
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="approve", reviewers=ReviewerRule(),
    )  # fmt: skip
    fake.text("A green dot.")
    state = await runner.run(tid)
    assert state.status == "idle"

    result = answer_to(fake.requests[1], tool_use_id(fake, 0))
    text, image = result["content"][:2]
    assert len(result["content"]) == 2  # the TIFF is not sent as an image
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    shown = json.loads(text["text"])
    assert shown["attachments"][2]["text"] == "report"  # the resource, inline
    assert "data" not in shown["attachments"][0]  # the image's base64 once, in its block
    # The stored event holds what was sent: replaying the log gives the same bodies.
    await assert_replays_what_was_sent(store, tid, fake, tools.all())

    # Slack shows the summaries, never the base64 or the resource's text.
    events = await store.select_events(tid)
    output = next(e for e in events if e.type == "tool_result").output
    shown_in_slack = result_text(output)
    assert shown_in_slack == (
        "a chart\n3 attachments: image (image/png, 69 B), image (image/tiff, 3 B), "
        "resource (text/plain, file:///report.txt, 6 B)"
    )

    # An image costs the size estimate what an image costs, not its base64's length.
    prompt = project(events, tools.all())
    without = project(
        [e.model_copy(update={"output": {"text": "a chart"}}) if e.type == "tool_result" else e
         for e in events],
        tools.all(),
    )  # fmt: skip
    grown = (prompt.estimated_tokens - without.estimated_tokens) * 4
    assert IMAGE_CHARS <= grown < IMAGE_CHARS + 1000


def image(size: int, mime_type: str = "image/png") -> types.ImageContent:
    data = base64.b64encode(b"\0" * size).decode()
    return types.ImageContent(type="image", data=data, mime_type=mime_type)


def test_images_are_kept_while_they_fit_the_bound_together():
    half = MAX_IMAGE_BYTES // 2
    out = tool_output(types.CallToolResult(content=[image(half), image(half), image(1)]))
    first, second, third = out["attachments"]
    assert "data" in first and "data" in second
    assert "data" not in third
    assert third["not_shown"] == f"larger than the {MAX_IMAGE_BYTES // 1024} KiB images may take"
    assert len(json.dumps(out)) < MAX_RESULT_BYTES  # stored whole, never cut


def test_an_image_that_is_not_base64_is_summarised_only():
    bad = types.ImageContent(type="image", data="not base64!", mime_type="image/png")
    [summary] = tool_output(types.CallToolResult(content=[bad]))["attachments"]
    assert summary["not_shown"] == "its data is not base64" and "data" not in summary


def test_secrets_are_redacted_in_a_resources_text_and_an_images_data_is_untouched():
    resource = types.EmbeddedResource(
        type="resource",
        resource=types.TextResourceContents(uri="file:///env", text="TOKEN=hunter2-secret"),
    )
    result = types.CallToolResult(content=[resource, image(3)])
    out = tool_output(result, lambda text: text.replace("hunter2-secret", "***"))
    assert out["attachments"][0]["text"] == "TOKEN=***"
    assert out["attachments"][1]["data"] == image(3).data
