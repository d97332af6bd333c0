"""The assembled process (what `opsloop serve` runs), driven as Slack and Claude would:
signed HTTP requests in, the fake Slack Web API and the fake Messages API out."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.blocks import APPROVE_ACTION
from bot.runtime import bind, web_app
from tests.fakes.slack import (
    BOT_USER_ID,
    FakeSlack,
    app_mention_event,
    signed,
    url_verification,
)

CHANNEL, ROOT_TS = "C0DEPLOYS", "1700000000.000100"


async def post(client: TestClient, payload: dict) -> int:
    body, headers = signed(payload)
    resp = await client.post("/slack/events", data=body, headers=headers)
    await resp.read()
    return resp.status


async def test_the_app_answers_slack_and_health(runtime):
    async with TestClient(TestServer(web_app(runtime))) as client:
        assert (await client.get("/healthz")).status == 200
        challenge = url_verification()
        body, headers = signed(challenge)
        resp = await client.post("/slack/events", data=body, headers=headers)
        assert resp.status == 200
        assert challenge["challenge"] in await resp.text()
        unsigned = await client.post("/slack/events", data=body)
        assert unsigned.status == 401
        assert (await client.post("/hooks/thr_x.y", data=b"{}")).status == 401


async def test_mention_to_approval_to_answer_through_slack(runtime, fakes):
    slack, claude = fakes
    claude.tool_use(
        "create_ticket", {"title": "Flaky deploys"}, text="Filing a ticket for the flakes."
    )
    claude.text("Filed the ticket.")
    slack.add_message(CHANNEL, f"<@{BOT_USER_ID}> file a ticket", user="U_ALICE", ts=ROOT_TS)
    async with TestClient(TestServer(web_app(runtime))) as client:
        mention = app_mention_event(
            user="U_ALICE", text=f"<@{BOT_USER_ID}> file a ticket", channel=CHANNEL, ts=ROOT_TS
        )
        assert await post(client, mention) == 200
        assert await post(client, mention) == 200  # Slack redelivers: stored once

        # The approval card appears in the thread with Approve and Reject.
        (card,) = [
            c for c in await slack.wait_for("chat.postMessage", count=2, timeout=15)
            if APPROVE_ACTION in str(c.params.get("blocks"))
        ]  # fmt: skip
        click = slack.click_on(card, APPROVE_ACTION, user="U_BOB", thread_ts=ROOT_TS)
        assert await post(client, click) == 200

        # The card is updated in place naming the reviewer; the answer is posted.
        updates = await slack.wait_for("chat.update", timeout=15)
        assert any("U_BOB" in str(u.params.get("blocks")) for u in updates)
        await _wait_posted(slack, "Filed the ticket.")

    info = (await runtime.store.list_threads())[0]
    events = await runtime.store.select_events(info.id)
    types = [e.type for e in events]
    assert types.count("user_message") == 1
    assert types.count("approval_granted") == 1
    assert next(e for e in events if e.type == "approval_granted").actor == "U_BOB"
    after = types[types.index("approval_granted") :]
    assert after.index("tool_started") < after.index("tool_result")
    assert next(e for e in events if e.type == "tool_result").ok
    assert "message_posted" in types


async def _wait_posted(slack: FakeSlack, text: str) -> None:
    for _ in range(150):
        if any(text in str(c.params) for c in slack.calls_to("chat.postMessage")):
            return
        await slack.wait_for(
            "chat.postMessage", count=len(slack.calls_to("chat.postMessage")) + 1, timeout=10
        )
    raise AssertionError(f"{text!r} was never posted")


async def test_the_card_shows_the_approval_before_the_tool_and_the_answer(runtime, fakes):
    """After Approve, the card is updated as soon as the call starts, not when the thread
    next rests: here the model takes 3 s to answer after the tool, and the card says
    who approved well before the answer arrives."""
    slack, claude = fakes
    claude.tool_use("create_ticket", {"title": "Disk full on db-2"}, text="Filing it.")
    claude.text("Filed.", delay=3.0)
    slack.add_message(CHANNEL, f"<@{BOT_USER_ID}> file it", user="U_ALICE", ts=ROOT_TS)
    async with TestClient(TestServer(web_app(runtime))) as client:
        mention = app_mention_event(
            user="U_ALICE", text=f"<@{BOT_USER_ID}> file it", channel=CHANNEL, ts=ROOT_TS
        )
        assert await post(client, mention) == 200
        (card,) = [
            c for c in await slack.wait_for("chat.postMessage", count=2, timeout=15)
            if APPROVE_ACTION in str(c.params.get("blocks"))
        ]  # fmt: skip
        click = slack.click_on(card, APPROVE_ACTION, user="U_BOB", thread_ts=ROOT_TS)
        card_ts = click["container"]["message_ts"]
        assert await post(client, click) == 200
        for _ in range(50):
            updates = slack.calls_to("chat.update")
            if any(u.params.get("ts") == card_ts and "U_BOB" in str(u.params) for u in updates):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the card was not updated before the answer")
        posts = slack.calls_to("chat.postMessage")
        assert not any("Filed." in str(c.params.get("text")) for c in posts)  # not yet
        await _wait_posted(slack, "Filed.")


def test_bind_listens_before_anything_starts_and_refuses_a_taken_port() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert port > 0 and not sock.getblocking()
        with pytest.raises(OSError):
            bind("127.0.0.1", port).close()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # it is listening
    finally:
        sock.close()
