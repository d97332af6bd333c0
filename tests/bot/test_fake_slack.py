"""The fake Slack, exercised through the real slack_sdk client, Bolt and the verifier."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from bot.render.approval import APPROVE_ACTION
from bot.render.modals import REJECT_CALLBACK, reject_modal
from tests.fakes import slack as fake
from tests.fakes.slack import BOT_ID, BOT_USER_ID, TEAM_ID, TOKEN, FakeSlack

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = "C0OPS00001"
HUMAN = "U0HUMAN001"
METADATA = {"event_type": "opsloop_event", "event_payload": {"thread_id": "t1", "event_id": "e"}}


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def client(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url)


async def api_error(call: Any) -> SlackApiError:
    with pytest.raises(SlackApiError) as info:
        await call
    return info.value


def ts_key(ts: str) -> tuple[int, int]:
    seconds, micros = ts.split(".")
    return int(seconds), int(micros)


# --- the Web API ----------------------------------------------------------------------


async def test_url_is_an_api_base_on_loopback(slack: FakeSlack) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/api/", slack.url)


async def test_auth_test_answers_like_a_bot_token(client: AsyncWebClient) -> None:
    resp = await client.auth_test()
    assert resp["ok"] is True
    assert (resp["user_id"], resp["bot_id"], resp["team_id"]) == (BOT_USER_ID, BOT_ID, TEAM_ID)
    assert resp["url"].startswith("https://")
    assert "chat:write" in resp.headers["x-oauth-scopes"]


async def test_post_message_stores_it_with_an_increasing_ts(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    root = slack.add_message(CHANNEL, "@opsloop deploy", user=HUMAN)
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]
    first = await client.chat_postMessage(
        channel=CHANNEL, text="hi", blocks=blocks, thread_ts=root["ts"], metadata=METADATA
    )
    second = await client.chat_postMessage(channel=CHANNEL, text="again", thread_ts=root["ts"])
    assert first["channel"] == CHANNEL
    assert ts_key(root["ts"]) < ts_key(first["ts"]) < ts_key(second["ts"])
    message = first["message"]
    assert (message["text"], message["bot_id"], message["user"]) == ("hi", BOT_ID, BOT_USER_ID)
    assert message["blocks"] == blocks and message["metadata"] == METADATA
    assert message["thread_ts"] == root["ts"]
    stored = slack.posted(CHANNEL)
    assert [m["ts"] for m in stored] == [first["ts"], second["ts"]]
    method, params, headers = slack.calls[0]
    assert method == "chat.postMessage" and params["blocks"] == blocks
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Type"].startswith("application/json")


async def test_post_message_errors(slack: FakeSlack, client: AsyncWebClient) -> None:
    assert (await api_error(client.chat_postMessage(channel="", text="x"))).response[
        "error"
    ] == "channel_not_found"
    too_many = [{"type": "divider"}] * 51
    err = await api_error(client.chat_postMessage(channel=CHANNEL, text="x", blocks=too_many))
    assert err.response["error"] == "invalid_blocks"
    long_text = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]
    err = await api_error(client.chat_postMessage(channel=CHANNEL, text="x", blocks=long_text))
    assert err.response["error"] == "invalid_blocks"
    assert slack.posted() == []


async def test_form_encoded_bodies_and_a_token_in_the_form(slack: FakeSlack) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "form"}}]
    form = {"token": TOKEN, "channel": CHANNEL, "text": "form", "blocks": json.dumps(blocks)}
    async with (
        aiohttp.ClientSession() as http,
        http.post(slack.url + "chat.postMessage", data=form) as resp,
    ):
        body = await resp.json()
    assert body["ok"] is True and body["message"]["blocks"] == blocks
    client = AsyncWebClient(token=TOKEN, base_url=slack.url)
    await client.api_call("chat.postMessage", data={"channel": CHANNEL, "text": "via data"})
    assert slack.calls[-1].headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert [m["text"] for m in slack.posted()] == ["form", "via data"]


async def test_update_replaces_text_and_blocks(slack: FakeSlack, client: AsyncWebClient) -> None:
    posted = await client.chat_postMessage(channel=CHANNEL, text="card", metadata=METADATA)
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "decided"}}]
    resp = await client.chat_update(channel=CHANNEL, ts=posted["ts"], text="done", blocks=blocks)
    assert (resp["channel"], resp["ts"], resp["text"]) == (CHANNEL, posted["ts"], "done")
    [message] = slack.posted(CHANNEL)
    assert (message["text"], message["blocks"], message["metadata"]) == ("done", blocks, METADATA)
    assert message["edited"]["user"] == BOT_USER_ID


async def test_update_needs_an_existing_message_of_the_bot(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    err = await api_error(client.chat_update(channel=CHANNEL, ts="1.000001", text="x"))
    assert err.response["error"] == "message_not_found"
    human = slack.add_message(CHANNEL, "mine", user=HUMAN)
    err = await api_error(client.chat_update(channel=CHANNEL, ts=human["ts"], text="x"))
    assert err.response["error"] == "cant_update_message"
    posted = await client.chat_postMessage(channel=CHANNEL, text="card")
    err = await api_error(client.chat_update(channel="C0OTHER001", ts=posted["ts"], text="x"))
    assert err.response["error"] == "message_not_found"


async def test_post_ephemeral(slack: FakeSlack, client: AsyncWebClient) -> None:
    resp = await client.chat_postEphemeral(channel=CHANNEL, user=HUMAN, text="already approved")
    assert re.fullmatch(r"\d+\.\d{6}", resp["message_ts"])
    assert slack.ephemerals[0]["user"] == HUMAN
    assert slack.ephemerals[0]["text"] == "already approved"
    assert slack.posted() == []  # nobody else sees it


async def test_views_open_needs_a_fresh_trigger(slack: FakeSlack, client: AsyncWebClient) -> None:
    view = reject_modal(
        thread_id="thr_1", tool_call_id="toolu_1", arguments_hash="h", tool_name="refund"
    )
    resp = await client.views_open(trigger_id="123.456.abc", view=view)
    assert resp["view"]["id"].startswith("V")
    assert resp["view"]["callback_id"] == "opsloop_reject_reason"
    assert resp["view"]["private_metadata"] == view["private_metadata"]
    again = await api_error(client.views_open(trigger_id="123.456.abc", view=view))
    assert again.response["error"] == "exchanged_trigger_id"
    missing = await api_error(client.views_open(trigger_id="", view=view))
    assert missing.response["error"] == "invalid_arguments"
    assert len(slack.views) == 1


async def test_replies_include_metadata_only_when_asked(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    root = slack.add_message(CHANNEL, "@opsloop deploy", user=HUMAN)
    for i in range(3):
        await client.chat_postMessage(
            channel=CHANNEL, text=f"reply {i}", thread_ts=root["ts"], metadata=METADATA
        )
    await client.chat_postMessage(channel=CHANNEL, text="elsewhere", metadata=METADATA)
    plain = await client.conversations_replies(channel=CHANNEL, ts=root["ts"])
    assert [m["text"] for m in plain["messages"]] == [
        "@opsloop deploy",
        "reply 0",
        "reply 1",
        "reply 2",
    ]
    assert not any("metadata" in m for m in plain["messages"])
    assert plain["messages"][0]["reply_count"] == 3
    assert plain["messages"][1]["parent_user_id"] == HUMAN
    full = await client.conversations_replies(
        channel=CHANNEL, ts=root["ts"], include_all_metadata=True
    )
    assert [m.get("metadata") for m in full["messages"]] == [None, METADATA, METADATA, METADATA]
    assert slack.calls[-1].params["include_all_metadata"] == "1"  # how slack_sdk sends it


async def test_replies_page_with_limit_and_cursor(slack: FakeSlack, client: AsyncWebClient) -> None:
    root = slack.add_message(CHANNEL, "root", user=HUMAN)
    for i in range(4):
        slack.add_message(CHANNEL, f"r{i}", thread_ts=root["ts"])
    first = await client.conversations_replies(channel=CHANNEL, ts=root["ts"], limit=2)
    assert [m["text"] for m in first["messages"]] == ["root", "r0"]
    assert first["has_more"] is True
    cursor = first["response_metadata"]["next_cursor"]
    rest = await client.conversations_replies(channel=CHANNEL, ts=root["ts"], cursor=cursor)
    assert [m["text"] for m in rest["messages"]] == ["r1", "r2", "r3"]
    assert rest["has_more"] is False


async def test_replies_of_a_reply_read_the_whole_thread(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    root = slack.add_message(CHANNEL, "root", user=HUMAN)
    reply = slack.add_message(CHANNEL, "reply", thread_ts=root["ts"])
    resp = await client.conversations_replies(channel=CHANNEL, ts=reply["ts"])
    assert [m["text"] for m in resp["messages"]] == ["root", "reply"]
    err = await api_error(client.conversations_replies(channel=CHANNEL, ts="1.000009"))
    assert err.response["error"] == "thread_not_found"
    err = await api_error(client.conversations_replies(channel="C0NOWHERE1", ts=root["ts"]))
    assert err.response["error"] == "channel_not_found"


async def test_history_is_the_channels_top_level_newest_first_after_oldest(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    first = slack.add_message(CHANNEL, "first", user=HUMAN)
    slack.add_message(CHANNEL, "a reply", thread_ts=first["ts"])
    await client.chat_postMessage(channel=CHANNEL, text="second", metadata=METADATA)
    slack.add_message(CHANNEL, "third", user=HUMAN)
    plain = await client.conversations_history(channel=CHANNEL)
    assert [m["text"] for m in plain["messages"]] == ["third", "second", "first"]
    assert not any("metadata" in m for m in plain["messages"])
    after = await client.conversations_history(
        channel=CHANNEL, oldest=first["ts"], include_all_metadata=True, limit=1
    )
    assert [(m["text"], m.get("metadata")) for m in after["messages"]] == [("third", None)]
    cursor = after["response_metadata"]["next_cursor"]
    more = await client.conversations_history(
        channel=CHANNEL, oldest=first["ts"], include_all_metadata=True, cursor=cursor
    )
    assert [(m["text"], m.get("metadata")) for m in more["messages"]] == [("second", METADATA)]
    assert more["has_more"] is False


async def test_a_permalink_of_a_reply_opens_its_thread(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    root = slack.add_message(CHANNEL, "root", user=HUMAN)
    reply = slack.add_message(CHANNEL, "reply", thread_ts=root["ts"])
    base = f"https://opsloop-test.slack.com/archives/{CHANNEL}/p"
    answer = await client.chat_getPermalink(channel=CHANNEL, message_ts=root["ts"])
    assert answer["permalink"] == base + root["ts"].replace(".", "")
    answer = await client.chat_getPermalink(channel=CHANNEL, message_ts=reply["ts"])
    assert answer["permalink"] == (
        f"{base}{reply['ts'].replace('.', '')}?thread_ts={root['ts']}&cid={CHANNEL}"
    )
    err = await api_error(client.chat_getPermalink(channel=CHANNEL, message_ts="1.000009"))
    assert err.response["error"] == "message_not_found"


async def test_a_429_carries_retry_after_to_the_client(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    slack.rate_limit("chat.postMessage", times=1, retry_after=7)
    err = await api_error(client.chat_postMessage(channel=CHANNEL, text="hi"))
    assert err.response.status_code == 429
    assert err.response.headers["Retry-After"] == "7"
    assert err.response["error"] == "ratelimited"
    assert slack.posted() == []
    await client.chat_postMessage(channel=CHANNEL, text="hi")  # the next call goes through
    assert len(slack.posted()) == 1
    assert len(slack.calls_to("chat.postMessage")) == 2  # both attempts are recorded
    await client.auth_test()  # other methods were never limited


async def test_injected_failures(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.fail("chat.update", "internal_error", status=500)
    posted = await client.chat_postMessage(channel=CHANNEL, text="x")
    err = await api_error(client.chat_update(channel=CHANNEL, ts=posted["ts"], text="y"))
    assert (err.response.status_code, err.response["error"]) == (500, "internal_error")
    await client.chat_update(channel=CHANNEL, ts=posted["ts"], text="y")


async def test_usergroups_users_list(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.usergroups = {"S0GROUP01": ["U0REVIEW01", "U0REVIEW02"]}
    resp = await client.usergroups_users_list(usergroup="S0GROUP01")
    assert resp["users"] == ["U0REVIEW01", "U0REVIEW02"]
    err = await api_error(client.usergroups_users_list(usergroup="S0NOPE0001"))
    assert err.response["error"] == "no_such_subteam"


async def test_users_info(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.add_user("U0BOB00001", "bob", tz="America/New_York")
    bob = (await client.users_info(user="U0BOB00001"))["user"]
    assert (bob["name"], bob["tz"], bob["is_bot"]) == ("bob", "America/New_York", False)
    anyone = (await client.users_info(user="U0ANYONE01"))["user"]
    assert anyone["id"] == "U0ANYONE01" and anyone["profile"]["display_name"]
    bot = (await client.users_info(user=BOT_USER_ID))["user"]
    assert bot["is_bot"] is True
    err = await api_error(client.users_info(user="not-an-id"))
    assert err.response["error"] == "user_not_found"


async def test_unknown_method(client: AsyncWebClient) -> None:
    err = await api_error(client.api_call("chat.teleport"))
    assert err.response["error"] == "unknown_method"


async def test_missing_and_wrong_tokens(slack: FakeSlack) -> None:
    err = await api_error(AsyncWebClient(base_url=slack.url).auth_test())
    assert err.response["error"] == "not_authed"
    err = await api_error(AsyncWebClient(token="xoxb-wrong", base_url=slack.url).auth_test())
    assert err.response["error"] == "invalid_auth"


async def test_wait_for_wakes_on_the_call(slack: FakeSlack, client: AsyncWebClient) -> None:
    waiter = asyncio.create_task(slack.wait_for("chat.postMessage", count=2))
    await client.chat_postMessage(channel=CHANNEL, text="1")
    assert not waiter.done()
    await client.chat_postMessage(channel=CHANNEL, text="2")
    calls = await waiter
    assert [c.params["text"] for c in calls] == ["1", "2"]


async def test_wait_for_times_out_naming_what_it_saw(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    await client.auth_test()
    with pytest.raises(TimeoutError, match=r"called 0 times, not 1; calls so far: \['auth.test'\]"):
        await slack.wait_for("chat.update", timeout=0.05)


async def test_a_held_answer_leaves_the_post_done_but_unacknowledged(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    gate = slack.hold("chat.postMessage")
    post = asyncio.create_task(client.chat_postMessage(channel=CHANNEL, text="x"))
    await slack.wait_for("chat.postMessage")
    assert len(slack.posted()) == 1  # Slack did it...
    assert not post.done()  # ...and the client has not heard back
    gate.set()
    assert (await post)["ts"] == slack.posted()[0]["ts"]


# --- signing and payloads ---------------------------------------------------------------


class FixedClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def test_sign_matches_slack_sdks_verifier() -> None:
    body = b'{"type":"event_callback"}'
    headers = fake.sign("s3cret", body, 1_700_000_000)
    verifier = SignatureVerifier("s3cret", clock=FixedClock(1_700_000_000))
    assert verifier.is_valid_request(body, headers)
    assert headers["X-Slack-Signature"] == verifier.generate_signature(
        timestamp="1700000000", body=body
    )
    assert not verifier.is_valid_request(body + b" ", headers)
    assert not SignatureVerifier("other", clock=FixedClock(1_700_000_000)).is_valid_request(
        body, headers
    )
    assert not SignatureVerifier("s3cret", clock=FixedClock(1_700_000_400)).is_valid_request(
        body, headers
    )  # more than five minutes old


@pytest.mark.parametrize(
    ("payload", "content_type"),
    [
        (fake.url_verification(), "application/json"),
        (
            fake.app_mention_event(user=HUMAN, text="<@U0FAKEBOT1> hi", channel=CHANNEL, ts="1.2"),
            "application/json",
        ),
        (
            fake.block_actions_payload(
                user=HUMAN,
                action_id="opsloop_approve",
                value="v",
                channel=CHANNEL,
                message_ts="1.2",
            ),
            "application/x-www-form-urlencoded",
        ),
        (
            fake.slash_command_payload(user=HUMAN, text="pending"),
            "application/x-www-form-urlencoded",
        ),
    ],
    ids=["url_verification", "event", "interaction", "command"],
)
def test_signed_encodes_each_payload_as_slack_does(payload: dict, content_type: str) -> None:
    body, headers = fake.signed(payload, "s3cret", 1_700_000_000)
    assert headers["Content-Type"] == content_type
    assert SignatureVerifier("s3cret", clock=FixedClock(1_700_000_000)).is_valid_request(
        body, headers
    )
    if content_type == "application/json":
        assert json.loads(body) == payload
    elif "command" in payload:
        assert {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()} == {
            k: str(v) for k, v in payload.items()
        }
    else:
        assert json.loads(parse_qs(body.decode())["payload"][0]) == payload


def test_event_envelope_shape() -> None:
    envelope = fake.message_event(
        user=HUMAN, text="yes", channel="D0DM000001", ts="2.3", thread_ts="1.2", channel_type="im"
    )
    assert {"token", "team_id", "api_app_id", "event", "event_id", "event_time"} <= set(envelope)
    assert envelope["type"] == "event_callback"
    assert re.fullmatch(r"Ev[0-9A-Z]+", envelope["event_id"])
    assert isinstance(envelope["event_time"], int)
    event = envelope["event"]
    assert (event["type"], event["channel_type"], event["thread_ts"]) == ("message", "im", "1.2")
    assert "subtype" not in event and event["parent_user_id"] == HUMAN
    edit = fake.message_event(
        user=None, text="", channel=CHANNEL, ts="3.4", subtype="message_changed"
    )["event"]
    assert edit["subtype"] == "message_changed" and "user" not in edit
    ours = fake.message_event(user=BOT_USER_ID, text="x", channel=CHANNEL, ts="4.5", bot_id=BOT_ID)
    assert ours["event"]["bot_id"] == BOT_ID


def test_view_submission_shape() -> None:
    values = fake.text_input_values("reason", "reason", "too risky")
    payload = fake.view_submission_payload(
        user=HUMAN, callback_id="opsloop_reject_reason", private_metadata="{}", values=values
    )
    view = payload["view"]
    assert payload["type"] == "view_submission" and payload["user"]["id"] == HUMAN
    assert view["callback_id"] == "opsloop_reject_reason" and view["private_metadata"] == "{}"
    assert view["state"]["values"]["reason"]["reason"] == {
        "type": "plain_text_input",
        "value": "too risky",
    }


async def test_bolt_accepts_the_signed_payloads_and_reads_them(slack: FakeSlack) -> None:
    """Bolt itself (signature check, auth.test on the fake, payload parsing) as the judge."""
    app = AsyncApp(
        client=AsyncWebClient(token=TOKEN, base_url=slack.url),
        signing_secret=fake.SIGNING_SECRET,
        process_before_response=True,
    )
    seen: dict[str, Any] = {}

    @app.event("app_mention")
    async def mention(ack: Any, event: dict, context: Any) -> None:
        seen["mention"] = (event["user"], context.channel_id, context.team_id)
        await ack()

    @app.action(APPROVE_ACTION)
    async def approve(ack: Any, body: dict, action: dict, context: Any) -> None:
        seen["action"] = (body["user"]["id"], action["value"], context.channel_id)
        await ack()

    @app.view(REJECT_CALLBACK)
    async def reject(ack: Any, view: dict) -> None:
        seen["view"] = view["state"]["values"]["reason"]["reason"]["value"]
        await ack()

    @app.command("/opsloop")
    async def command(ack: Any, command: dict) -> None:
        seen["command"] = command["text"]
        await ack()

    async def dispatch(payload: dict[str, Any], secret: str = fake.SIGNING_SECRET) -> Any:
        body, headers = fake.signed(payload, secret)
        return await app.async_dispatch(AsyncBoltRequest(body=body.decode(), headers=headers))

    challenge = await dispatch(fake.url_verification("abc"))
    assert (challenge.status, json.loads(challenge.body)) == (200, {"challenge": "abc"})
    mention_ = fake.app_mention_event(
        user=HUMAN, text="<@U0FAKEBOT1> go", channel=CHANNEL, ts="1.2"
    )
    assert (await dispatch(mention_)).status == 200
    click = fake.block_actions_payload(
        user=HUMAN, action_id=APPROVE_ACTION, value='{"t":"x"}', channel=CHANNEL, message_ts="1.3"
    )
    assert (await dispatch(click)).status == 200
    values = fake.text_input_values("reason", "reason", "no")
    submit = fake.view_submission_payload(
        user=HUMAN, callback_id=REJECT_CALLBACK, private_metadata="{}", values=values
    )
    assert (await dispatch(submit)).status == 200
    assert (await dispatch(fake.slash_command_payload(user=HUMAN, text="pending"))).status == 200
    assert (await dispatch(mention_, secret="wrong")).status == 401
    assert seen == {
        "mention": (HUMAN, CHANNEL, TEAM_ID),
        "action": (HUMAN, '{"t":"x"}', CHANNEL),
        "view": "no",
        "command": "pending",
    }
    assert slack.calls_to("auth.test")  # Bolt authorised against the fake


# --- the manifest -------------------------------------------------------------------------

MANIFEST = (ROOT / "manifest.yml").read_text()
# What each thing the bot uses needs (https://docs.slack.dev/reference/scopes).
NEEDED_SCOPES = {
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.postEphemeral": "chat:write",
    "conversations.replies": {"channels:history", "groups:history", "im:history"},
    "conversations.history": {"channels:history", "groups:history"},  # an escalation channel
    "users.info": "users:read",
    "usergroups.users.list": "usergroups:read",
    "app_mention": "app_mentions:read",
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.im": "im:history",
    "/opsloop": "commands",
}


def manifest_list(key: str) -> list[str]:
    """The items of the YAML list under ``key:`` (comments dropped)."""
    match = re.search(
        rf"^(\s*){re.escape(key)}:\s*(?:#.*)?\n((?:\1\s+(?:-.*|#.*)\n)+)", MANIFEST, re.M
    )
    assert match, key
    return re.findall(r"^\s+- ([^\s#]+)", match.group(2), re.M)


def test_manifest_scopes_are_exactly_what_the_bot_uses() -> None:
    needed: set[str] = set()
    for scopes in NEEDED_SCOPES.values():
        needed |= {scopes} if isinstance(scopes, str) else scopes
    assert set(manifest_list("bot")) == needed
    for scope in needed:  # each is justified by a comment on the line before it
        assert re.search(rf"#.*\n\s+- {re.escape(scope)}\n", MANIFEST), scope


def test_manifest_events_settings_and_command() -> None:
    assert manifest_list("bot_events") == [
        "app_mention",
        "message.channels",
        "message.groups",
        "message.im",
        "app_home_opened",
        "agent_session_stopped",
    ]
    for line in (
        "socket_mode_enabled: true",
        "org_deploy_enabled: false",
        "token_rotation_enabled: false",
        "home_tab_enabled: true",
        "messages_tab_enabled: true",
        "- command: /opsloop",
        "usage_hint: help | pending | status",
    ):
        assert re.search(rf"^\s*{re.escape(line)}(\s*#.*)?$", MANIFEST, re.M), line
    assert re.search(r"interactivity:\n\s+is_enabled: true.*\n\s+request_url: https://", MANIFEST)
    assert MANIFEST.count("request_url: https://example.com/slack/events") == 2
    assert "url: https://example.com/slack/events" in MANIFEST
    assert "\t" not in MANIFEST
