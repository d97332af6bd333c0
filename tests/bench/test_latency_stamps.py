"""bench/latency.py's fake Slack stamps what shows in a thread, streamed messages and the
loading status included; its fake Anthropic stamps a streamed answer's first token."""

from __future__ import annotations

import asyncio
from typing import Any

from anthropic import AsyncAnthropic
from slack_sdk.web.async_client import AsyncWebClient

from bench._latency_fakes import (
    ANSWER,
    STREAM_GAP_S,
    FirstTokens,
    Stamp,
    StampedAnthropic,
    StampedSlack,
    responder,
    shown_in,
)
from tests.fakes.anthropic import FAKE_API_KEY
from tests.fakes.slack import TOKEN

CHANNEL = "C0LATTEST"
ROOT = "1700000000.000100"
PARAMS: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 100}
TASK = {"type": "task_update", "id": "call-1", "title": "Bench deploy", "status": "pending"}


class Records:
    """What the fakes put on their queue, kept in order."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def put(self, item: dict[str, Any]) -> None:
        self.items.append(item)

    def stamps(self) -> list[Stamp]:
        return [Stamp(**item) for item in self.items]


async def test_posts_streams_and_the_loading_status_are_stamped_with_their_thread() -> None:
    records = Records()
    async with StampedSlack(records) as slack:
        client = AsyncWebClient(token=TOKEN, base_url=slack.url)
        slack.add_message(CHANNEL, "deploy tag=sq0", ts=ROOT)
        await client.assistant_threads_setStatus(
            channel_id=CHANNEL, thread_ts=ROOT, status="is thinking…"
        )
        await client.chat_postMessage(channel=CHANNEL, thread_ts=ROOT, text="status")
        recipient = {"recipient_user_id": "U0BENCHREQ", "recipient_team_id": "T0FAKE0001"}
        started = await client.chat_startStream(
            channel=CHANNEL, thread_ts=ROOT, chunks=[TASK], **recipient
        )
        ts = started["ts"]
        await client.chat_appendStream(
            channel=CHANNEL, ts=ts, chunks=[{"type": "markdown_text", "text": ANSWER[:2]}]
        )
        await client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text=ANSWER[2:])
        await client.chat_stopStream(channel=CHANNEL, ts=ts)
        await client.chat_update(channel=CHANNEL, ts=ts, text="the whole plan")
        # Refused (a stream already stopped takes nothing): not stamped.
        await asyncio.gather(
            client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="late"),
            return_exceptions=True,
        )
    stamps = records.stamps()
    assert [s.kind for s in stamps] == [
        "status", "post", "start", "append", "append", "stop", "replace",
    ]  # fmt: skip
    assert all(s.thread_ts == ROOT and s.channel == CHANNEL for s in stamps)
    assert stamps[0].text == "is thinking…"
    assert [s.answer for s in stamps[2:5]] == [
        "",
        ANSWER[:2],
        ANSWER[2:],
    ]  # task cards are no answer
    assert stamps[5].text == ANSWER  # a stream's text so far
    assert [s.ts for s in stamps[2:]] == [ts] * 5
    assert shown_in(stamps[5], ROOT, ANSWER) and not shown_in(stamps[1], ROOT, ANSWER)
    assert stamps == sorted(stamps, key=lambda s: s.t)


def conversation(tag: str, tools: list[str]) -> list[dict[str, Any]]:
    """A thread's messages after the model used ``tools``, one a turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"deploy tag={tag}"}]
    for n, name in enumerate(tools):
        use = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "ok"}
        messages += [
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ]
    return messages


async def test_the_streamed_final_answer_stamps_its_first_token_with_the_thread_tag() -> None:
    records = Records()
    async with StampedAnthropic() as claude:
        claude.responder = responder(records)
        claude.text_started = FirstTokens(records)
        client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=claude.url, max_retries=0)
        used = ["bench_deploy", "request_clarification", "bench_wait"]
        answer: dict[str, Any] = {"messages": conversation("sq0", used), **PARAMS}
        async with client.messages.stream(**answer) as stream:
            text = await stream.get_final_text()
        # A reply that is not streamed has no first token to stamp.
        await client.messages.create(**{"messages": conversation("sq1", used[:1]), **PARAMS})
        await client.close()
    assert text == ANSWER
    model, token, other = records.stamps()
    assert (model.kind, model.tag, model.stage, model.nth) == ("model", "sq0", 3, 1)
    assert (token.kind, token.tag, token.stage) == ("token", "sq0", 3)
    assert (other.kind, other.tag, other.stage) == ("model", "sq1", 1)
    # The first token left a gap after the request, and one before the next delta.
    assert token.t - model.t >= STREAM_GAP_S
    assert claude.text_started == [token.t]
