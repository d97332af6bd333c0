"""A streamed plan's task cards in the fake Slack, as the stricter reading of Slack has
them: a ``task_update`` naming a known card replaces its title, status and sources, and
adds its details and output to what the card shows (so a client that sends them twice
shows them twice)."""

from __future__ import annotations

from slack_sdk.models.messages.chunk import PlanUpdateChunk
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack import FakeSlack
from tests.localslack.test_agent_api import CHANNEL, client, root, slack, start, task

__all__ = ["client", "root", "slack"]  # the fixtures, shared


async def test_details_and_output_named_again_are_appended_titles_replaced(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(
        client,
        root,
        task_display_mode="plan",
        chunks=[PlanUpdateChunk(title="Check api"), task("c1", "pending", details="service: api")],
    )
    await client.chat_appendStream(
        channel=CHANNEL,
        ts=ts,
        chunks=[task("c1", "in_progress", title="run c1 — attempt 2", details="service: api")],
    )
    await client.chat_appendStream(
        channel=CHANNEL, ts=ts, chunks=[task("c1", "complete", output="ok")]
    )
    await client.chat_appendStream(
        channel=CHANNEL, ts=ts, chunks=[task("c1", "complete", output=" again")]
    )
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None
    card = stream["tasks"]["c1"]
    assert card["title"] == "run c1"  # replaced: the last update named its own
    assert card["status"] == "complete"
    assert card["details"] == "service: apiservice: api"  # appended: said twice
    assert card["output"] == "ok again"
    [message] = [m for m in slack.thread(CHANNEL, root) if m["ts"] == ts]
    [plan] = [b for b in message["blocks"] if b["type"] == "plan"]
    details = plan["tasks"][0]["details"]["elements"][0]["elements"][0]["text"]
    assert details == "service: apiservice: api"
