"""The assembled process (what `opsloop serve` runs), driven as Slack and Claude would:
signed HTTP requests in, the fake Slack Web API and the fake Messages API out."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.outbox import pending_deliveries
from bot.render.approval import APPROVE_ACTION
from bot.runtime import Runtime, bind, start_runtime, web_app
from engine.config import load_settings
from engine.config_file import parse_config
from tests.engine.test_one_writer import count_conflicts
from tests.fakes.anthropic import FAKE_API_KEY
from tests.fakes.slack import (
    BOT_USER_ID,
    SIGNING_SECRET,
    TOKEN,
    FakeSlack,
    app_mention_event,
    signed,
    url_verification,
)
from tools import ToolContext
from tools.builtin import tickets

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = str(ROOT / "tests" / "support" / "mcp_servers.py")

CHANNEL, ROOT_TS = "C0DEPLOYS", "1700000000.000100"


def settings_for(db_url: str, fakes, tmp_path: Path, **extra: str):
    """Everything the runtime needs is in the settings: nothing is read from os.environ."""
    slack, claude = fakes
    return load_settings(
        {
            "DATABASE_URL": db_url,
            "OPSLOOP_SWEEP_SECONDS": "0.2",
            "ANTHROPIC_API_KEY": FAKE_API_KEY,
            "ANTHROPIC_BASE_URL": claude.url,
            "SLACK_API_URL": slack.url,
            "OPSLOOP_TICKETS_URL": f"sqlite:///{tmp_path / 'tickets.db'}",
            **extra,
        }
    )


@pytest.fixture
async def runtime(db_url, fakes, monkeypatch, tmp_path) -> AsyncIterator[Runtime]:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "SLACK_API_URL"):
        monkeypatch.delenv(name, raising=False)  # proof that the settings carry them
    settings = settings_for(db_url, fakes, tmp_path)
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET)
    rt.start()
    try:
        yield rt
    finally:
        await rt.close(5)


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

        # The card is updated in place naming the reviewer; the answer is posted. Other
        # messages are updated too (the status message; the plan message, whose words
        # before the tool call are replaced): wait for the card's update among them.
        card_ts = click["container"]["message_ts"]
        for n in range(1, 100):
            updates = await slack.wait_for("chat.update", count=n, timeout=15)
            if any(u.params.get("ts") == card_ts and "U_BOB" in str(u.params) for u in updates):
                break
        else:
            raise AssertionError("the card was not updated naming the reviewer")
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


def _shown(slack: FakeSlack, text: str) -> bool:
    """Whether a message of the bot shows ``text`` now (posted, or streamed into a plan
    message in as many pieces as it came)."""
    return bool(slack.showing(text))


async def _wait_posted(slack: FakeSlack, text: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while not _shown(slack, text):
        assert asyncio.get_running_loop().time() < deadline, f"{text!r} was never shown"
        await asyncio.sleep(0.05)


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
        assert not _shown(slack, "Filed.")  # not yet
        await _wait_posted(slack, "Filed.")


async def test_one_approved_call_end_to_end_meets_no_conflict(runtime, fakes, monkeypatch):
    """Mention, card, Approve, the tool, the answer, every post and its receipt: while
    the runner holds the thread it alone appends (delivery hands it the receipts), so
    not one ``ConcurrencyConflict`` is designed in."""
    met = count_conflicts(monkeypatch)
    slack, claude = fakes
    claude.tool_use("create_ticket", {"title": "Disk full on db-2"}, text="Filing it.")
    claude.text("Filed.")
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
        tid = (await runtime.store.list_threads())[0].id
        await _at_rest(runtime, tid)  # the reviewer reads the card, then clicks
        click = slack.click_on(card, APPROVE_ACTION, user="U_BOB", thread_ts=ROOT_TS)
        assert await post(client, click) == 200
        await _wait_posted(slack, "Filed.")
        await _at_rest(runtime, tid)
    events = await runtime.store.select_events(tid)
    assert [e.type for e in events].count("tool_result") == 1
    granted = next(e for e in events if e.type == "approval_granted")
    result = next(e for e in events if e.type == "tool_result")
    shown_early = [e for e in events if getattr(e, "shows_event_id", None) == granted.event_id]
    assert shown_early and all(r.created_at == result.created_at for r in shown_early)
    assert met == []


async def _at_rest(runtime: Runtime, thread_id: str) -> None:
    """Wait until nobody holds the thread and it has nothing left to show."""
    for _ in range(300):
        info = await runtime.store.get_thread(thread_id)
        events = await runtime.store.select_events(thread_id)
        if info.lease_owner is None and not pending_deliveries(events):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the thread never came to rest")


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


def mcp_config(tmp_path: Path, command: str = sys.executable) -> str:
    return f"""
tools:
  mcp:
    demo:
      command: {command}
      args: [{MCP_SERVER}, stdio]
      tools: [echo, pid]
approvals:
  approvers: [U0BOB]
policy:
  - tool: "mcp__demo__echo"
    policy: run_now
"""


async def test_the_file_s_sources_and_policy_are_opened_and_closed_on_the_worker_loop(
    db_url, fakes, tmp_path
) -> None:
    config = parse_config(mcp_config(tmp_path), {})
    settings = settings_for(db_url, fakes, tmp_path, **config.env_values())
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config)
    try:
        assert {"mcp__demo__echo", "mcp__demo__pid", "create_ticket"} <= set(rt.tools.names())
        pid_tool = rt.tools.get("mcp__demo__pid")
        assert pid_tool is not None and pid_tool.source == "mcp:demo"
        ctx = ToolContext("thr_1", "call_1", "key_1", 1)
        args = pid_tool.parse_arguments({})
        pid = int((await rt.thread.run(pid_tool.run(args, ctx)))["text"])  # on the worker loop
        assert pid > 0
        policy = rt.background.worker.runner.policy
        assert policy is not None and policy.policy_hash == config.policy_hash
        assert policy.defaults.reviewers.approvers == frozenset({"U0BOB"})
        assert [r.tool for r in policy.rules] == ["mcp__demo__echo"]
    finally:
        await rt.close(5)
    # The server's process is gone with the runtime, and the tools' engines closed.
    await asyncio.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert tickets._ENGINES._engines == {}


async def test_an_mcp_server_that_cannot_start_is_served_without(
    db_url, fakes, tmp_path, caplog
) -> None:
    """Issue 16 §9: it stopped startup; now one warning line, and it is kept trying
    (tests/bot/test_serve_mcp.py runs the real process)."""
    config = parse_config(mcp_config(tmp_path, command=str(tmp_path / "no-such-server")), {})
    settings = settings_for(db_url, fakes, tmp_path)
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config)
    try:
        assert "create_ticket" in rt.tools and "mcp__demo__echo" not in rt.tools
        [down] = [s for s in rt.mcp_servers if not s.up]
        assert down.server_name == "demo" and "no-such-server" in down.down_reason
    finally:
        await rt.close(5)
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith("tools.mcp")]
    assert line.startswith("mcp server down server=demo reason=") and "\n" not in line


async def test_tools_get_their_settings_without_the_environment(
    db_url, fakes, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("OPSLOOP_TICKETS_URL", "sqlite:///ignored.db")  # not read
    settings = settings_for(db_url, fakes, tmp_path)
    rt = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET)
    try:
        assert tickets.tickets_url() == f"sqlite:///{tmp_path / 'tickets.db'}"
    finally:
        await rt.close(5)


async def test_a_trickled_slack_body_does_not_hold_the_worker_back(runtime):
    """The worker waits while answers are in flight; a sender still sending its body is
    not an answer in flight yet (else it could stall every thread for the body timeout)."""
    async with TestClient(TestServer(web_app(runtime))) as client:
        reader, writer = await asyncio.open_connection(client.host, client.port)
        head = (
            "POST /slack/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            'Content-Length: 20\r\n\r\n{"type":'
        )
        writer.write(head.encode())
        await writer.drain()
        # A whole request on another connection: by its answer the first one's head has
        # long been read and its handler is waiting for the rest of the body.
        assert (await client.get("/healthz")).status == 200
        assert runtime.priority.in_flight == 0
        writer.write(b'"x"}        ')
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        assert b" 401 " in status_line  # unsigned: refused, after the body came
        writer.close()
