"""The agent surfaces of the fake Slack (loading status, streams, agent sessions), driven
through the real slack_sdk client: Slack's arguments, its error codes, its clocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.models.blocks import (
    ContextActionsBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
)
from slack_sdk.models.messages.chunk import MarkdownTextChunk, PlanUpdateChunk, TaskUpdateChunk
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes import slack as fake
from tests.fakes.slack import BOT_ID, TEAM_ID, TOKEN, FakeSlack

CHANNEL = "C0OPS00001"
DM = "D0DM000001"
HUMAN = "U0HUMAN001"
METADATA = {"event_type": "opsloop_event", "event_payload": {"thread_id": "t1", "event_id": "e"}}
FEEDBACK_ACTION = "opsloop_feedback"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def client(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url)


@pytest.fixture
def root(slack: FakeSlack) -> str:
    return slack.add_message(CHANNEL, "<@U0FAKEBOT1> check api", user=HUMAN)["ts"]


async def error_of(call: Any) -> str:
    with pytest.raises(SlackApiError) as info:
        await call
    return str(info.value.response["error"])


async def start(client: AsyncWebClient, root: str, **kwargs: Any) -> str:
    kwargs.setdefault("recipient_user_id", HUMAN)
    kwargs.setdefault("recipient_team_id", TEAM_ID)
    answer = await client.chat_startStream(channel=CHANNEL, thread_ts=root, **kwargs)
    return str(answer["ts"])


def task(id: str, status: str, **fields: Any) -> Any:
    return TaskUpdateChunk(id=id, title=fields.pop("title", f"run {id}"), status=status, **fields)


def feedback_row() -> list[Any]:
    return [
        ContextActionsBlock(
            block_id="feedback",
            elements=[
                FeedbackButtonsElement(
                    action_id=FEEDBACK_ACTION,
                    positive_button=FeedbackButtonObject(text="👍", value="up"),
                    negative_button=FeedbackButtonObject(text="👎", value="down"),
                )
            ],
        )
    ]


# --- assistant.threads.setStatus ------------------------------------------------------------


async def test_the_loading_status_shows_until_cleared(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    await client.assistant_threads_setStatus(
        channel_id=CHANNEL,
        thread_ts=root,
        status="is running check_health on api…",
        loading_messages=["Checking api…", "Reading its health…"],
    )
    shown = slack.thread_status(CHANNEL, root)
    assert shown is not None and shown["status"] == "is running check_health on api…"
    assert shown["loading_messages"] == ["Checking api…", "Reading its health…"]
    await client.assistant_threads_setStatus(channel_id=CHANNEL, thread_ts=root, status="")
    assert slack.thread_status(CHANNEL, root) is None


async def test_the_loading_status_goes_after_two_minutes_unless_refreshed(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    await client.assistant_threads_setStatus(
        channel_id=CHANNEL, thread_ts=root, status="is thinking…"
    )
    slack.advance(100)
    assert slack.thread_status(CHANNEL, root) is not None
    await client.assistant_threads_setStatus(
        channel_id=CHANNEL, thread_ts=root, status="is thinking…"
    )
    slack.advance(100)  # 200 s after the first, 100 s after the refresh
    assert slack.thread_status(CHANNEL, root) is not None
    slack.advance(21)
    assert slack.thread_status(CHANNEL, root) is None


async def test_the_apps_reply_in_the_thread_ends_the_loading_status(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    await client.assistant_threads_setStatus(
        channel_id=CHANNEL, thread_ts=root, status="is thinking…"
    )
    slack.add_message(CHANNEL, "a person replies", thread_ts=root)
    assert slack.thread_status(CHANNEL, root) is not None
    await client.chat_postMessage(channel=CHANNEL, thread_ts=root, text="elsewhere? no: here")
    assert slack.thread_status(CHANNEL, root) is None


async def test_set_status_arguments(client: AsyncWebClient, root: str) -> None:
    eleven = [f"step {i}" for i in range(11)]
    call = client.assistant_threads_setStatus
    assert (
        await error_of(
            call(channel_id=CHANNEL, thread_ts=root, status="x", loading_messages=eleven)
        )
        == "invalid_arguments"
    )
    assert await error_of(call(channel_id=CHANNEL, thread_ts="soon", status="x")) == (
        "invalid_thread_ts"
    )
    assert await error_of(call(channel_id="", thread_ts=root, status="x")) == "channel_not_found"


# --- chat.startStream -----------------------------------------------------------------------


async def test_a_channel_stream_needs_its_recipient_and_a_dm_stream_does_not(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    start_ = client.chat_startStream
    assert await error_of(start_(channel=CHANNEL, thread_ts=root)) == "missing_recipient_user_id"
    assert (
        await error_of(start_(channel=CHANNEL, thread_ts=root, recipient_user_id=HUMAN))
        == "missing_recipient_team_id"
    )
    dm_root = slack.add_message(DM, "check api", user=HUMAN)["ts"]
    answer = await start_(channel=DM, thread_ts=dm_root, markdown_text="Looking…")
    assert answer["channel"] == DM and slack.stream(DM, answer["ts"]) is not None
    assert not slack.calls_to("chat.startStream")[0].params.get("recipient_user_id")


async def test_start_stream_arguments(client: AsyncWebClient, root: str) -> None:
    recipient: dict[str, Any] = {"recipient_user_id": HUMAN, "recipient_team_id": TEAM_ID}
    start_ = client.chat_startStream
    assert (
        await error_of(
            start_(channel=CHANNEL, thread_ts=root, task_display_mode="list", **recipient)
        )
        == "invalid_arguments"
    )
    assert await error_of(start_(channel=CHANNEL, thread_ts="", **recipient)) == (
        "invalid_thread_ts"
    )
    assert (
        await error_of(
            start_(channel=CHANNEL, thread_ts=root, markdown_text="x" * 12_001, **recipient)
        )
        == "msg_too_long"
    )


async def test_a_stream_is_a_reply_of_the_bot_without_metadata_until_stopped(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root, markdown_text="Checking ", task_display_mode="plan")
    replies = await client.conversations_replies(
        channel=CHANNEL, ts=root, include_all_metadata=True
    )
    [_, shown] = replies["messages"]
    assert (shown["ts"], shown["thread_ts"], shown["bot_id"]) == (ts, root, BOT_ID)
    assert shown["text"] == "Checking " and "metadata" not in shown  # look-back finds it
    await client.chat_stopStream(channel=CHANNEL, ts=ts, markdown_text="done.", metadata=METADATA)
    replies = await client.conversations_replies(
        channel=CHANNEL, ts=root, include_all_metadata=True
    )
    assert replies["messages"][1]["metadata"] == METADATA
    assert replies["messages"][1]["text"] == "Checking done."


async def test_a_channel_that_refuses_streams_says_so(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    slack.refuse_streams(CHANNEL)
    assert await error_of(start(client, root)) == "method_not_supported_for_channel_type"
    slack.refuse_streams(CHANNEL, "not_allowed")
    assert await error_of(start(client, root)) == "not_allowed"
    other = slack.add_message("C0OTHER001", "hi", user=HUMAN)["ts"]
    await client.chat_startStream(
        channel="C0OTHER001", thread_ts=other, recipient_user_id=HUMAN, recipient_team_id=TEAM_ID
    )
    assert not [m for m in slack.thread(CHANNEL, root) if m.get("bot_id")]


async def test_stream_failures_are_injected_like_any_methods(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root)
    slack.fail("chat.appendStream", "internal_error")
    assert await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="a")) == (
        "internal_error"
    )
    await client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="b")
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None and stream["text"] == "b"


# --- the plan: task updates by id -------------------------------------------------------------


async def test_a_task_update_with_a_known_id_updates_that_task(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(
        client,
        root,
        task_display_mode="plan",
        chunks=[PlanUpdateChunk(title="Check api's health"), task("call-1", "pending")],
    )
    await client.chat_appendStream(
        channel=CHANNEL, ts=ts, chunks=[task("call-1", "in_progress", details="service: api")]
    )
    await client.chat_appendStream(
        channel=CHANNEL,
        ts=ts,
        chunks=[
            task(
                "call-1",
                "complete",
                output="api is healthy",
                sources=[{"type": "url", "url": "https://status.example/api", "text": "status"}],
            ),
            task("call-2", "pending", title="read the logs"),
            MarkdownTextChunk(text="api is **healthy**."),
        ],
    )
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None
    assert stream["title"] == "Check api's health"
    assert list(stream["tasks"]) == ["call-1", "call-2"]
    assert stream["tasks"]["call-1"] == {
        "id": "call-1",
        "title": "run call-1",
        "status": "complete",
        "details": "service: api",  # left as it was: the last update did not name it
        "output": "api is healthy",
        "sources": [{"type": "url", "url": "https://status.example/api", "text": "status"}],
    }
    [message] = [m for m in slack.thread(CHANNEL, root) if m["ts"] == ts]
    plan, text = message["blocks"]
    assert plan["type"] == "plan" and plan["title"] == "Check api's health"
    assert [(t["task_id"], t["status"]) for t in plan["tasks"]] == [
        ("call-1", "complete"),
        ("call-2", "pending"),
    ]
    assert plan["tasks"][0]["output"]["elements"][0]["elements"][0]["text"] == "api is healthy"
    assert text == {"type": "markdown", "block_id": "stream-text-2", "text": "api is **healthy**."}


async def test_a_timeline_keeps_tasks_and_text_in_the_order_they_came(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root, chunks=[MarkdownTextChunk(text="First "), task("a", "pending")])
    await client.chat_appendStream(
        channel=CHANNEL, ts=ts, chunks=[task("a", "complete"), MarkdownTextChunk(text="then.")]
    )
    [message] = [m for m in slack.thread(CHANNEL, root) if m["ts"] == ts]
    assert [(b["type"], b.get("text") or b.get("status")) for b in message["blocks"]] == [
        ("markdown", "First "),
        ("task_card", "complete"),
        ("markdown", "then."),
    ]


@pytest.mark.parametrize(
    ("chunk", "error"),
    [
        ({"type": "thinking", "text": "hm"}, "invalid_chunks"),
        ({"type": "task_update", "id": "x", "title": "t", "status": "done"}, "invalid_chunks"),
        ({"type": "task_update", "title": "t", "status": "pending"}, "invalid_chunks"),
        (
            {
                "type": "task_update",
                "id": "x",
                "title": "t",
                "status": "pending",
                "sources": [{"type": "url", "url": "https://x.example"}],
            },
            "invalid_chunks",
        ),
        ({"type": "plan_update"}, "invalid_chunks"),
        ({"type": "markdown_text", "text": "x" * 12_001}, "msg_too_long"),
        (
            {
                "type": "blocks",
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": ""}}],
            },
            "invalid_blocks",
        ),
    ],
)
async def test_a_bad_chunk_is_refused_and_nothing_of_the_call_is_applied(
    slack: FakeSlack, client: AsyncWebClient, root: str, chunk: dict[str, Any], error: str
) -> None:
    ts = await start(client, root)
    good = {"type": "markdown_text", "text": "kept out"}
    answer = await error_of(
        client.api_call(
            "chat.appendStream", json={"channel": CHANNEL, "ts": ts, "chunks": [good, chunk]}
        )
    )
    assert answer == error
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None and stream["text"] == "" and stream["state"] == "streaming"


async def test_append_needs_something_to_append_within_slacks_limit(
    client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root)
    assert await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts)) == "invalid_arguments"
    assert (
        await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="x" * 12_001))
        == "msg_too_long"
    )
    await client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="x" * 12_000)


# --- which streams take appends -----------------------------------------------------------------


async def test_only_an_open_stream_takes_appends(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    append = client.chat_appendStream
    assert await error_of(append(channel=CHANNEL, ts="1.000001", markdown_text="a")) == (
        "message_not_found"
    )
    post = await client.chat_postMessage(channel=CHANNEL, thread_ts=root, text="a post")
    assert await error_of(append(channel=CHANNEL, ts=post["ts"], markdown_text="a")) == (
        "message_not_in_streaming_state"
    )
    assert await error_of(append(channel=CHANNEL, ts=root, markdown_text="a")) == (
        "message_not_owned_by_app"
    )
    ts = await start(client, root)
    await client.chat_stopStream(channel=CHANNEL, ts=ts)
    assert await error_of(append(channel=CHANNEL, ts=ts, markdown_text="a")) == (
        "message_not_in_streaming_state"
    )
    assert await error_of(client.chat_stopStream(channel=CHANNEL, ts=ts)) == (
        "message_not_in_streaming_state"
    )


async def test_slack_ends_a_stream_after_its_time_whatever_was_appended(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root)
    slack.advance(200)
    await client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="still here")
    slack.advance(100)  # 300 s after it started: appends did not extend it
    assert await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="x")) == (
        "message_not_in_streaming_state"
    )
    assert await error_of(client.chat_stopStream(channel=CHANNEL, ts=ts)) == (
        "message_not_in_streaming_state"
    )
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None and stream["state"] == "expired" and stream["text"] == "still here"
    # ended, it can be rewritten in place
    await client.chat_update(channel=CHANNEL, ts=ts, text="the whole plan", blocks=[])


async def test_the_stream_lifetime_is_a_workspace_setting(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    slack.workspace.stream_ttl_s = 10
    ts = await start(client, root)
    slack.advance(9)
    await client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="a")
    slack.advance(1)
    assert await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="b")) == (
        "message_not_in_streaming_state"
    )


async def test_a_streaming_message_is_appended_to_not_edited(
    client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root)
    assert await error_of(client.chat_update(channel=CHANNEL, ts=ts, text="edit")) == (
        "streaming_state_conflict"
    )
    await client.chat_stopStream(channel=CHANNEL, ts=ts)
    edited = await client.chat_update(channel=CHANNEL, ts=ts, text="edit")
    assert edited["text"] == "edit"


# --- chat.stopStream ----------------------------------------------------------------------------


async def test_stop_puts_the_feedback_row_at_the_bottom_and_sets_the_session(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root, task_display_mode="plan", chunks=[task("a", "complete")])
    await client.chat_stopStream(
        channel=CHANNEL,
        ts=ts,
        markdown_text="api is healthy.",
        blocks=feedback_row(),
        metadata=METADATA,
        session_status="active",
    )
    [message] = [m for m in slack.thread(CHANNEL, root) if m["ts"] == ts]
    assert [b["type"] for b in message["blocks"]] == ["plan", "markdown", "context_actions"]
    buttons = message["blocks"][-1]["elements"][0]
    assert (buttons["type"], buttons["action_id"]) == ("feedback_buttons", FEEDBACK_ACTION)
    assert message["metadata"] == METADATA
    stream = slack.stream(CHANNEL, ts)
    assert stream is not None and stream["state"] == "stopped"
    session = slack.session(CHANNEL, root)
    assert session is not None and session["status"] == "active"


async def test_stop_arguments(client: AsyncWebClient, root: str) -> None:
    ts = await start(client, root)
    stop = client.chat_stopStream
    assert await error_of(stop(channel=CHANNEL, ts=ts, metadata={"event_type": "x"})) == (
        "invalid_metadata_format"
    )
    assert await error_of(stop(channel=CHANNEL, ts=ts, session_status="done")) == (
        "invalid_arguments"
    )
    assert await error_of(stop(channel=CHANNEL, ts=ts, chunks=[{"type": "nope"}])) == (
        "invalid_chunks"
    )
    await stop(channel=CHANNEL, ts=ts)  # none of those stopped it


# --- agents.sessions.setStatus and the stop button -------------------------------------------


async def test_the_agent_session_follows_its_status_and_title(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    await client.agents_sessions_setStatus(
        channel_id=CHANNEL, thread_ts=root, status="processing", title="Check api's health"
    )
    await client.agents_sessions_setStatus(channel_id=CHANNEL, thread_ts=root, status="suspended")
    session = slack.session(CHANNEL, root)
    assert session is not None
    assert (session["status"], session["title"]) == ("suspended", "Check api's health")
    assert (
        await error_of(
            client.agents_sessions_setStatus(channel_id=CHANNEL, thread_ts=root, status="running")
        )
        == "invalid_arguments"
    )


async def test_an_app_not_declared_an_agent_is_not_authorized(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    slack.agent_view = False
    assert (
        await error_of(
            client.agents_sessions_setStatus(
                channel_id=CHANNEL, thread_ts=root, status="processing"
            )
        )
        == "not_authorized"
    )
    assert slack.session(CHANNEL, root) is None
    await client.assistant_threads_setStatus(channel_id=CHANNEL, thread_ts=root, status="is …")


async def test_the_stop_button_stops_the_threads_streams_and_names_them(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    await client.agents_sessions_setStatus(channel_id=CHANNEL, thread_ts=root, status="processing")
    done = await start(client, root)
    await client.chat_stopStream(channel=CHANNEL, ts=done)
    ts = await start(client, root)
    envelope = slack.press_stop(CHANNEL, root, user=HUMAN)
    assert envelope["type"] == "event_callback" and envelope["team_id"] == TEAM_ID
    event = envelope["event"]
    assert {k: v for k, v in event.items() if k != "event_ts"} == {
        "type": "agent_session_stopped",
        "user": HUMAN,
        "channel": CHANNEL,
        "thread_ts": root,
        "streaming_message_ts": [ts],
    }
    assert await error_of(client.chat_appendStream(channel=CHANNEL, ts=ts, markdown_text="x")) == (
        "stopped_by_user"
    )
    session = slack.session(CHANNEL, root)
    assert session is not None and session["status"] == "processing"  # the app moves it on


# --- what Slack sends the app ---------------------------------------------------------------


async def test_bolt_routes_the_stop_and_the_feedback_click(
    slack: FakeSlack, client: AsyncWebClient, root: str
) -> None:
    ts = await start(client, root)
    await client.chat_stopStream(channel=CHANNEL, ts=ts, blocks=feedback_row())
    click = slack.feedback_click(CHANNEL, ts, user=HUMAN, positive=False)
    assert click["type"] == "block_actions" and click["container"]["message_ts"] == ts
    assert click["container"]["thread_ts"] == root
    [action] = click["actions"]
    assert (action["type"], action["action_id"], action["value"], action["block_id"]) == (
        "feedback_buttons",
        FEEDBACK_ACTION,
        "down",
        "feedback",
    )
    app = AsyncApp(
        client=AsyncWebClient(token=TOKEN, base_url=slack.url),
        signing_secret=fake.SIGNING_SECRET,
        process_before_response=True,
    )
    seen: dict[str, Any] = {}

    @app.event("agent_session_stopped")
    async def stopped(ack: Any, event: dict[str, Any], context: Any) -> None:
        seen["stop"] = (event["user"], event["thread_ts"], context.channel_id)
        await ack()

    @app.action(FEEDBACK_ACTION)
    async def feedback(ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        seen["feedback"] = (body["user"]["id"], action["value"], body["container"]["message_ts"])
        await ack()

    for payload in (slack.press_stop(CHANNEL, root, user=HUMAN), click):
        body, headers = fake.signed(payload)
        request = AsyncBoltRequest(body=body.decode(), headers=dict(headers.items()))
        answer = await app.async_dispatch(request)
        assert answer.status == 200, answer.body
    assert seen == {"stop": (HUMAN, root, CHANNEL), "feedback": (HUMAN, "down", ts)}


def test_a_stream_survives_a_workspace_snapshot() -> None:
    from localslack import streams as st
    from localslack.server import local_workspace

    ws = local_workspace()
    stream = st.new_stream(
        channel="C0OPS", ts="1.000002", thread_ts="1.000001", mode="plan", started_at=1.0
    )
    ws.add_stream("C0OPS", {"type": "message", "ts": "1.000002", "thread_ts": "1.000001"}, stream)
    ws.set_session("C0OPS", "1.000001", status="processing", title="t")
    again = local_workspace()
    again.restore(json.loads(json.dumps(ws.snapshot())))
    assert again.streams == ws.streams and again.sessions == ws.sessions
    bad = {**json.loads(json.dumps(ws.snapshot())), "streams": {"C/1": {"state": "streaming"}}}
    with pytest.raises(ValueError, match="streams"):
        local_workspace().restore(bad)
