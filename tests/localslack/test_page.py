"""The local page's side of the agent surfaces: its API shows the thread's loading status,
agent session and streamed messages, its stop button and feedback buttons reach the app
as Slack would send them, and its scripts render a plan (in Node, over a small DOM)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from localslack import streams as st
from localslack.app_link import AppLink
from localslack.identity import LOCAL, PEOPLE
from localslack.server import local_workspace
from localslack.ui import LocalUi, ModelInfo
from localslack.web_api import WebApi
from localslack.workspace import Workspace
from tests.support.servers import serve

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "localslack" / "static"
RENDER = Path(__file__).with_name("render_blocks.mjs")
ALICE, BOB = "U0ALICE", "U0BOB"
OPS = "C0OPS"
TOKEN = "xoxb-local-test"
FEEDBACK = {
    "type": "context_actions",
    "block_id": "feedback",
    "elements": [
        {
            "type": "feedback_buttons",
            "action_id": "opsloop_feedback",
            "positive_button": {"text": {"type": "plain_text", "text": "👍"}, "value": "up"},
            "negative_button": {"text": {"type": "plain_text", "text": "👎"}, "value": "down"},
        }
    ],
}


@dataclass
class Local:
    workspace: Workspace
    client: AsyncWebClient  # the bot's
    http: aiohttp.ClientSession  # the page's
    url: str
    link: AppLink
    received: list[tuple[str, dict[str, Any]]]  # what the app was sent: (kind, payload)

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path, params=params) as resp:
            return resp.status, await resp.json()

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def local() -> AsyncIterator[Local]:
    """The local workspace's Web API and page, sending what people do to a recorder."""
    received: list[tuple[str, dict[str, Any]]] = []

    async def app_endpoint(request: web.Request) -> web.Response:
        body = await request.text()
        if request.content_type == "application/json":
            received.append(("event", json.loads(body)))
        else:
            received.append(("interaction", json.loads(parse_qs(body)["payload"][0])))
        return web.Response(status=200)

    bot_app = web.Application()
    bot_app.router.add_post("/slack/events", app_endpoint)
    bot_runner, bot_port = await serve(bot_app)
    ws = local_workspace()
    link = AppLink(ws, signing_secret="secret", retry_delays=())

    async def save() -> None:
        return None

    ui = LocalUi(ws, link, PEOPLE, ModelInfo("offline", "scripted"), save=save)
    page_app = web.Application()
    ui.add_routes(page_app)
    WebApi(ws, token=TOKEN).add_routes(page_app)
    page_runner, port = await serve(page_app)
    link.start(f"http://127.0.0.1:{bot_port}/slack/events")
    url = f"http://127.0.0.1:{port}/"
    try:
        async with aiohttp.ClientSession() as http:
            client = AsyncWebClient(token=TOKEN, base_url=url + "api/")
            yield Local(ws, client, http, url, link, received)
    finally:
        await ui.close()
        await link.close()
        await page_runner.cleanup()
        await bot_runner.cleanup()


async def mention(local: Local) -> str:
    status, sent = await local.post(
        "ui/messages", {"user": ALICE, "channel": OPS, "text": "@opsloop check api"}
    )
    assert status == 201
    return str(sent["message"]["ts"])


async def streamed_answer(local: Local, root: str) -> str:
    started = await local.client.chat_startStream(
        channel=OPS,
        thread_ts=root,
        recipient_user_id=ALICE,
        recipient_team_id=LOCAL.team_id,
        task_display_mode="plan",
        chunks=[
            {"type": "plan_update", "title": "Check api"},
            {
                "type": "task_update",
                "id": "c1",
                "title": "check_health on api",
                "status": "pending",
            },
        ],
    )
    return str(started["ts"])


# --- the page's API ------------------------------------------------------------------------


async def test_the_thread_shows_the_loading_status_the_session_and_the_stream(
    local: Local,
) -> None:
    root = await mention(local)
    await local.client.assistant_threads_setStatus(
        channel_id=OPS, thread_ts=root, status="is thinking…", loading_messages=["Reading…"]
    )
    await local.client.agents_sessions_setStatus(
        channel_id=OPS, thread_ts=root, status="processing", title="Check api"
    )
    _, thread = await local.get(f"ui/channels/{OPS}/threads/{root}", user=ALICE)
    left = thread["agent"]["status"].pop("expires_in")
    assert 100 < left <= 120  # the page looks again then: Slack's two minutes
    assert thread["agent"] == {
        "status": {"status": "is thinking…", "loading_messages": ["Reading…"]},
        "session": {"status": "processing", "title": "Check api"},
    }
    ts = await streamed_answer(local, root)
    _, thread = await local.get(f"ui/channels/{OPS}/threads/{root}", user=ALICE)
    [reply] = thread["replies"]
    assert 280 < reply["stream"].pop("expires_in") <= 300
    assert reply["ts"] == ts and reply["stream"] == {"state": "streaming", "mode": "plan"}
    assert reply["blocks"][0]["type"] == "plan"
    assert thread["agent"]["status"] is None  # the app's message in the thread ended it
    await local.client.chat_appendStream(channel=OPS, ts=ts, markdown_text="api is up.")
    _, thread = await local.get(f"ui/channels/{OPS}/threads/{root}", user=ALICE)
    assert thread["replies"][0]["text"] == "api is up."


async def test_the_stop_button_stops_the_streams_and_tells_the_app_who_pressed_it(
    local: Local,
) -> None:
    root = await mention(local)
    status, refused = await local.post(
        "ui/agent/stop", {"user": BOB, "channel": OPS, "thread_ts": root}
    )
    assert status == 409 and "not working" in refused["error"]
    await local.client.agents_sessions_setStatus(
        channel_id=OPS, thread_ts=root, status="processing"
    )
    ts = await streamed_answer(local, root)
    status, answer = await local.post(
        "ui/agent/stop", {"user": BOB, "channel": OPS, "thread_ts": root}
    )
    assert (status, answer) == (202, {"ok": True, "stopped": [ts]})
    stream = local.workspace.stream(OPS, ts)
    assert stream is not None and stream["state"] == "stopped_by_user"
    await local.link.idle()
    [event] = [
        p["event"]
        for kind, p in local.received
        if kind == "event" and p["event"]["type"] == "agent_session_stopped"
    ]
    assert {k: v for k, v in event.items() if k != "event_ts"} == {
        "type": "agent_session_stopped",
        "user": BOB,
        "channel": OPS,
        "thread_ts": root,
        "streaming_message_ts": [ts],
    }


async def test_a_feedback_click_is_a_feedback_buttons_action(local: Local) -> None:
    root = await mention(local)
    ts = await streamed_answer(local, root)
    await local.client.chat_stopStream(channel=OPS, ts=ts, blocks=[FEEDBACK])
    click = {"user": BOB, "channel": OPS, "message_ts": ts, "action_id": "opsloop_feedback"}
    status, refused = await local.post("ui/actions", click)
    assert status == 400 and "which feedback button" in refused["error"]
    status, answer = await local.post("ui/actions", {**click, "value": "negative"})
    assert (status, answer["ok"]) == (200, True)
    [payload] = [p for k, p in local.received if k == "interaction"]
    [action] = payload["actions"]
    assert (action["type"], action["action_id"], action["value"]) == (
        "feedback_buttons",
        "opsloop_feedback",
        "down",
    )
    assert payload["container"]["message_ts"] == ts and payload["user"]["id"] == BOB
    assert "stream" not in payload["message"] and "metadata" not in payload["message"]


# --- the page's scripts ------------------------------------------------------------------------


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no node to render the page's blocks with")
        pytest.skip("no node to render the page's blocks with")
    return node


def render(blocks: list[dict[str, Any]], tmp_path: Path) -> str:
    """``blocks`` as the page's blocks.js renders them, as HTML."""
    modules = tmp_path / "static"
    modules.mkdir()
    for script in STATIC.glob("*.js"):
        shutil.copy(script, modules / script.name)
    (modules / "package.json").write_text('{"type": "module"}')
    done = subprocess.run(
        [node_or_skip(), str(RENDER), str(modules)],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_page_renders_a_plan_its_task_cards_the_answer_and_the_feedback_row(
    tmp_path: Path,
) -> None:
    stream = st.new_stream(
        channel=OPS, ts="2.000001", thread_ts="1.000001", mode="plan", started_at=0
    )
    st.apply_chunks(
        stream,
        [
            {"type": "plan_update", "title": "Check <script>alert(1)</script> api"},
            {
                "type": "task_update",
                "id": "c1",
                "title": "check_health on api",
                "status": "complete",
                "details": "service: api",
                "output": "api is healthy",
                "sources": [
                    {"type": "url", "url": "https://status.example/api", "text": "api status"},
                    {"type": "url", "url": "javascript:alert(1)", "text": "not a link"},
                ],
            },
            {
                "type": "task_update",
                "id": "c2",
                "title": "deploy api",
                "status": "error",
                "output": "<b>refused</b>",
            },
            {"type": "task_update", "id": "c3", "title": "read logs", "status": "in_progress"},
            {"type": "task_update", "id": "c4", "title": "notify", "status": "pending"},
            {
                "type": "markdown_text",
                "text": "api is **healthy**; see `check_health` and "
                "[the runbook](https://runbook.example/api).\n\n- one\n- two",
            },
        ],
    )
    stream["closing"] = [FEEDBACK]
    _, blocks = st.show(stream)
    html = render(blocks, tmp_path)

    assert '<div class="bk-plan" data-testid="plan"' in html
    assert "Check &lt;script&gt;alert(1)&lt;/script&gt; api" in html
    assert "<script" not in html and "<b>" not in html  # text, never markup
    assert html.count('data-testid="task-card"') == 4
    statuses = [("c1", "complete"), ("c2", "error"), ("c3", "in_progress"), ("c4", "pending")]
    for task_id, status in statuses:
        assert f'data-task-id="{task_id}" data-status="{status}"' in html
    assert "1 of 4 done" in html
    assert ">✓</span>" in html and ">✕</span>" in html and ">◔</span>" in html
    assert "service: api" in html and "api is healthy" in html and "&lt;b&gt;refused" in html
    assert (
        '<a class="md-link" href="https://status.example/api" target="_blank" '
        'rel="noopener noreferrer" data-testid="task-source">api status</a>'
    ) in html
    assert 'href="javascript' not in html and ">not a link</span>" in html
    assert '<strong class="md-strong">healthy</strong>' in html
    assert '<code class="md-code">check_health</code>' in html
    assert 'href="https://runbook.example/api"' in html
    assert '<ul class="md-list"><li>one</li><li>two</li></ul>' in html
    for value in ("positive", "negative"):
        assert f'data-value="{value}" data-clickable="true"' in html
    assert "👍" in html and "👎" in html


def test_a_timeline_renders_its_task_cards_where_they_came(tmp_path: Path) -> None:
    stream = st.new_stream(
        channel=OPS, ts="2.000001", thread_ts="1.000001", mode="timeline", started_at=0
    )
    st.apply_chunks(
        stream,
        [
            {"type": "markdown_text", "text": "First, "},
            {"type": "task_update", "id": "c1", "title": "look", "status": "complete"},
            {"type": "markdown_text", "text": "then the answer."},
        ],
    )
    _, blocks = st.show(stream)
    html = render(blocks, tmp_path)
    assert html.index("First,") < html.index('data-task-id="c1"') < html.index("then the answer")
