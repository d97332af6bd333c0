"""The Bolt listeners, driven over HTTP with requests signed as Slack signs them.

A real ``AsyncApp`` (from ``bot.app.build_app``) sits behind an aiohttp server on
``POST /slack/events``; its Web API client talks to the fake Slack. Each test sends
Slack's payload shapes and reads what the listener stored, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel, Field
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot import limits
from bot import payloads as p
from bot.app import INVALID_BUTTON, build_app, drain, handle_slack_request
from bot.delivery import Delivery
from bot.render.approval import APPROVE_ACTION, EDIT_ACTION, REJECT_ACTION
from bot.render.common import binding_value, parse_binding
from bot.render.edit import APPROVE_BLOCK, EDIT_CALLBACK
from bot.render.modals import REASON_ACTION, REASON_BLOCK, REJECT_CALLBACK
from bot.render.status import CANCEL_ACTION
from bot.reviewers import Reviewers
from engine import events as ev
from engine.config_file import PolicyRule
from engine.events import utcnow
from engine.policy import arguments_hash
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.store import Store, ThreadKey, store_for
from tests.fakes import slack as fake
from tests.fakes.slack import (
    BOT_ID,
    BOT_USER_ID,
    SIGNING_SECRET,
    TEAM_DOMAIN,
    TEAM_ID,
    TOKEN,
    FakeSlack,
)
from tools import ToolContext, ToolRegistry, tool

CHANNEL = "C0OPS00001"
ANN = "U0ANN00001"  # the requester
BOB = "U0BOB00001"  # an approver
EVE = "U0EVE00001"  # not an approver
ROOT = "1700000000.000100"
CARD_TS = "1700000000.000200"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


@dataclass
class Served:
    store: Store
    slack: FakeSlack
    http: TestClient
    bolt: Any
    kicks: list[str] = field(default_factory=list)

    async def send(
        self,
        payload: dict[str, Any],
        *,
        secret: str = SIGNING_SECRET,
        timestamp: int | None = None,
        retry: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        body, signed_headers = fake.signed(payload, secret, timestamp)
        if retry is not None:
            signed_headers["X-Slack-Retry-Num"] = str(retry)
            signed_headers["X-Slack-Retry-Reason"] = "http_error"
        signed_headers.update(headers or {})
        resp = await self.http.post("/slack/events", data=body, headers=signed_headers)
        return resp.status, await resp.text()

    async def settle(self) -> None:
        """Let background Slack calls (ephemerals, modals, Home) finish."""
        await drain(self.bolt)


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


@asynccontextmanager
async def served(
    store: Store,
    slack: FakeSlack,
    *,
    reviewers: ReviewerRule | None = None,
    groups: Reviewers | None = None,
    tools: ToolRegistry | None = None,
    policy: PolicySet | None = None,
) -> AsyncIterator[Served]:
    kicks: list[str] = []
    bolt = build_app(
        store=store,
        token=TOKEN,
        signing_secret=SIGNING_SECRET,
        client=AsyncWebClient(token=TOKEN, base_url=slack.url),
        reviewers=reviewers or ReviewerRule(),
        kick=kicks.append,
        groups=groups,
        tools=tools,
        policy=policy,
    )
    app = web.Application()

    async def slack_events(request: web.Request) -> web.Response:
        return await handle_slack_request(bolt, request)

    app.router.add_post("/slack/events", slack_events)
    async with TestClient(TestServer(app)) as http:
        s = Served(store, slack, http, bolt, kicks)
        try:
            yield s
        finally:
            await s.settle()


async def events_of(store: Store, thread_id: str) -> list[ev.AnyEvent]:
    return await store.select_events(thread_id)


async def types_of(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in await events_of(store, thread_id)]


async def thread_at(store: Store, root: str = ROOT, channel: str = CHANNEL) -> str | None:
    return await store.find_thread(ThreadKey(TEAM_ID, channel, root))


async def awaiting_approval(
    store: Store,
    *,
    requester: str = ANN,
    root: str = ROOT,
    tool: str = "deploy",
    arguments: dict[str, Any] | None = None,
    approvers: tuple[str, ...] | None = None,
) -> tuple[str, str]:
    """A thread at (CHANNEL, root) awaiting approval of ``tool``; its card's button value.
    ``approvers``: the reviewer rule recorded on the call (None: the process's)."""
    args = arguments or {"service": "api", "env": "staging"}
    thread_id = await store.create_thread(ThreadKey(TEAM_ID, CHANNEL, root))
    call_id = "toolu_01"
    digest = arguments_hash(tool, args)
    await store.append(
        thread_id,
        0,
        [
            ev.UserMessage(actor=requester, text=f"{tool} {args}"),
            ev.ModelDecision(
                actor="model",
                tool_name=tool,
                tool_call_id=call_id,
                arguments=args,
                stop_reason="tool_use",
                model="scripted",
            ),
            ev.ToolCallRequested(
                tool_call_id=call_id,
                intent=tool,
                arguments=args,
                policy="approve_before_run",
                idempotency_key=f"{thread_id}:{call_id}",
                approvers=approvers,
            ),
            ev.ApprovalRequested(
                tool_call_id=call_id,
                arguments_hash=digest,
                expires_at=utcnow() + timedelta(hours=1),
                reason="the user asked for it",
            ),
        ],
    )
    assert (await store.load(thread_id)).status == "awaiting_approval"
    return thread_id, binding_value(thread_id, call_id, digest)


def button(
    user: str, action_id: str, value: str, *, action_ts: str | None = None
) -> dict[str, Any]:
    return fake.block_actions_payload(
        user=user,
        action_id=action_id,
        value=value,
        channel=CHANNEL,
        message_ts=CARD_TS,
        thread_ts=ROOT,
        action_ts=action_ts,
    )


def mention(
    text: str = "<@U0FAKEBOT1> deploy api to staging",
    *,
    ts: str = ROOT,
    thread_ts: str | None = None,
    user: str = ANN,
    event_id: str | None = None,
) -> dict[str, Any]:
    return fake.app_mention_event(
        user=user, text=text, channel=CHANNEL, ts=ts, thread_ts=thread_ts, event_id=event_id
    )


def ephemeral_texts(slack: FakeSlack, user: str | None = None) -> list[str]:
    return [e["text"] for e in slack.ephemerals if user is None or e["user"] == user]


# --- pure helpers ------------------------------------------------------------------------


def test_mention_text_drops_only_the_bot_mention() -> None:
    assert p.mention_text("<@U0FAKEBOT1> deploy api", BOT_USER_ID) == "deploy api"
    assert p.mention_text("hey <@U0FAKEBOT1|opsloop>  ping <@U0ANN00001>", BOT_USER_ID) == (
        "hey ping <@U0ANN00001>"
    )
    assert p.mention_text("a &lt;b&gt;", BOT_USER_ID) == "a &lt;b&gt;"
    assert p.mention_text(None, BOT_USER_ID) == ""


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        ({"thread_ts": ROOT}, "reply"),
        ({}, "ignore"),  # top-level chatter in a channel
        ({"channel_type": "im"}, "dm"),
        ({"channel_type": "im", "thread_ts": ROOT}, "dm"),
        ({"thread_ts": ROOT, "subtype": "message_changed"}, "ignore"),
        ({"thread_ts": ROOT, "subtype": "message_deleted"}, "ignore"),
        ({"thread_ts": ROOT, "subtype": "channel_join"}, "ignore"),
        ({"thread_ts": ROOT, "subtype": "thread_broadcast"}, "reply"),
        ({"thread_ts": ROOT, "bot_id": "B0OTHER001"}, "ignore"),
        ({"thread_ts": ROOT, "user": BOT_USER_ID}, "ignore"),
        ({"thread_ts": "1700000000.000500"}, "ignore"),  # a thread's root, thread_ts == ts
    ],
)
def test_message_kind(extra: dict[str, Any], kind: str) -> None:
    event = {"type": "message", "user": ANN, "text": "x", "ts": "1700000000.000500"}
    event.update(channel_type="channel")
    event.update(extra)
    assert p.message_kind(event, BOT_USER_ID) == kind


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({"X-Slack-Request-Timestamp": "1700000000", "X-Slack-Signature": "v0=ab"}, True),
        ({}, True),  # missing: Bolt's own 401
        ({"X-Slack-Request-Timestamp": "abc"}, False),
        ({"X-Slack-Request-Timestamp": ""}, False),
        ({"X-Slack-Request-Timestamp": "1.5"}, False),
        ({"X-Slack-Request-Timestamp": "9" * 5000}, False),
        ({"x-slack-request-timestamp": "-1"}, False),
        ({"X-Slack-Signature": "v0=é"}, False),
    ],
)
def test_verify_headers(headers: dict[str, str], ok: bool) -> None:
    assert (p.verify_headers(headers) is None) is ok


def test_permalinks_only_from_safe_parts() -> None:
    url = p.workspace_url(TEAM_DOMAIN)
    assert p.permalink(url, CHANNEL, ROOT) == (
        f"https://{TEAM_DOMAIN}.slack.com/archives/{CHANNEL}/p1700000000000100"
    )
    assert p.workspace_url("evil.com/x?") is None
    assert p.permalink(url, "C1|x", ROOT) is None


# --- requests Slack did not sign --------------------------------------------------------


async def test_url_verification_answers_the_challenge(store: Store, slack: FakeSlack) -> None:
    async with served(store, slack) as s:
        status, text = await s.send(fake.url_verification("chal-123"))
    assert status == 200
    assert json.loads(text) == {"challenge": "chal-123"}


@pytest.mark.parametrize("case", ["bad_signature", "stale", "missing_headers"])
async def test_unsigned_requests_are_401_and_store_nothing(
    store: Store, slack: FakeSlack, case: str
) -> None:
    async with served(store, slack) as s:
        payload = mention()
        if case == "bad_signature":
            status, _ = await s.send(payload, secret="not-the-secret")
        elif case == "stale":
            status, _ = await s.send(payload, timestamp=int(time.time()) - 10 * 60)
        else:
            resp = await s.http.post(
                "/slack/events",
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )
            status = resp.status
    assert status == 401
    assert await store.list_threads() == []
    assert s.kicks == []


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Slack-Request-Timestamp": "yesterday"},
        {"X-Slack-Request-Timestamp": ""},
        {"X-Slack-Signature": "v0=\u00e9\u00e9"},
    ],
)
async def test_malformed_signature_headers_are_4xx_not_500(
    store: Store, slack: FakeSlack, headers: dict[str, str]
) -> None:
    async with served(store, slack) as s:
        status, _ = await s.send(mention(), headers=headers)
    assert 400 <= status < 500
    assert await store.list_threads() == []


async def test_bolt_alone_answers_a_malformed_timestamp_with_500(
    store: Store, slack: FakeSlack
) -> None:
    """Why ``verify_headers`` exists: Bolt's own check raises on ``int("yesterday")``."""
    async with served(store, slack) as s:
        body, headers = fake.signed(mention())
        headers["X-Slack-Request-Timestamp"] = "yesterday"
        response = await s.bolt.async_dispatch(
            AsyncBoltRequest(body=body.decode(), headers=headers)
        )
    assert response.status == 500


async def test_a_body_that_is_not_json_is_4xx(store: Store, slack: FakeSlack) -> None:
    async with served(store, slack) as s:
        resp = await s.http.post(
            "/slack/events",
            data=b"{not json",
            headers={**fake.sign(SIGNING_SECRET, b"{not json", int(time.time()))},
        )
    assert resp.status == 400


# --- messages ---------------------------------------------------------------------------


async def test_a_mention_starts_a_thread_and_kicks_the_worker(
    store: Store, slack: FakeSlack
) -> None:
    async with served(store, slack) as s:
        status, _ = await s.send(mention(event_id="Ev0MENTION1"))
    assert status == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    [message] = await events_of(store, thread_id)
    assert isinstance(message, ev.UserMessage)
    assert (message.text, message.actor) == ("deploy api to staging", ANN)
    assert message.dedupe_key == f"msg:{CHANNEL}:{ROOT}"
    assert message.source["event_id"] == "Ev0MENTION1"
    assert s.kicks == [thread_id]


async def test_a_redelivered_mention_is_stored_once(store: Store, slack: FakeSlack) -> None:
    payload = mention(event_id="Ev0MENTION2")
    async with served(store, slack) as s:
        assert (await s.send(payload))[0] == 200
        assert (await s.send(payload, retry=1))[0] == 200
        assert (await s.send(payload, retry=2))[0] == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    assert await types_of(store, thread_id) == ["user_message"]
    assert set(s.kicks) == {thread_id}  # kicking again is harmless: nothing new to run


async def test_a_mention_in_a_thread_continues_it(store: Store, slack: FakeSlack) -> None:
    async with served(store, slack) as s:
        await s.send(mention())
        await s.send(mention("<@U0FAKEBOT1> and web too", ts="1700000000.000300", thread_ts=ROOT))
    thread_id = await thread_at(store)
    assert thread_id is not None
    texts = [e.text for e in await events_of(store, thread_id)]  # type: ignore[union-attr]
    assert texts == ["deploy api to staging", "and web too"]


async def test_a_mention_in_a_thread_arrives_twice_and_is_stored_once(
    store: Store, slack: FakeSlack
) -> None:
    """Slack sends a mention in a thread as ``app_mention`` and as ``message``."""
    reply_ts = "1700000000.000300"
    text = "<@U0FAKEBOT1> and web too"
    as_message = fake.message_event(
        user=ANN, text=text, channel=CHANNEL, ts=reply_ts, thread_ts=ROOT
    )
    async with served(store, slack) as s:
        await s.send(mention())
        assert (await s.send(as_message))[0] == 200
        assert (await s.send(mention(text, ts=reply_ts, thread_ts=ROOT)))[0] == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    events = await events_of(store, thread_id)
    assert [e.text for e in events] == ["deploy api to staging", "and web too"]  # type: ignore[union-attr]


async def test_a_reply_in_our_thread_needs_no_mention(store: Store, slack: FakeSlack) -> None:
    reply = fake.message_event(
        user=BOB, text="also restart the worker", channel=CHANNEL, ts="1700000000.000400",
        thread_ts=ROOT,
    )  # fmt: skip
    async with served(store, slack) as s:
        await s.send(mention())
        status, _ = await s.send(reply)
    assert status == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    last = (await events_of(store, thread_id))[-1]
    assert isinstance(last, ev.UserMessage)
    assert (last.text, last.actor) == ("also restart the worker", BOB)
    assert s.kicks == [thread_id, thread_id]


async def test_the_requesters_reply_withdraws_the_card_once(store: Store, slack: FakeSlack) -> None:
    """Issue 17 §1: the requester writes while their call waits: the card is withdrawn
    (once, whatever Slack redelivers), the worker is woken, a click is refused."""
    thread_id, value = await awaiting_approval(store, requester=ANN)
    reply = fake.message_event(
        user=ANN, text="no, production", channel=CHANNEL, ts="1700000000.000500",
        thread_ts=ROOT, event_id="Ev0WITHDRAW1",
    )  # fmt: skip
    async with served(store, slack) as s:
        assert (await s.send(reply))[0] == 200
        assert (await s.send(reply))[0] == 200  # Slack's retry
        assert (await s.send(button(BOB, APPROVE_ACTION, value)))[0] == 200
    kinds = await types_of(store, thread_id)
    assert kinds.count("approval_withdrawn") == 1
    assert kinds[-3:] == ["approval_withdrawn", "user_message", "approval_refused"]
    assert (await store.load(thread_id)).status == "running"
    assert thread_id in s.kicks


async def test_a_reply_answers_an_open_question(store: Store, slack: FakeSlack) -> None:
    async with served(store, slack) as s:
        await s.send(mention())
        thread_id = await thread_at(store)
        assert thread_id is not None
        await store.append(
            thread_id,
            1,
            [
                ev.ModelDecision(actor="model", tool_name="request_clarification",
                                 tool_call_id="toolu_q", arguments={"question": "which region?"},
                                 stop_reason="tool_use"),
                ev.ClarificationRequested(actor="model", tool_call_id="toolu_q",
                                          question="which region?"),
            ],
        )  # fmt: skip
        reply = fake.message_event(
            user=ANN, text="eu-west-1", channel=CHANNEL, ts="1700000000.000500", thread_ts=ROOT
        )
        assert (await s.send(reply))[0] == 200
    answer = (await events_of(store, thread_id))[-1]
    assert isinstance(answer, ev.ClarificationAnswered)
    assert answer.text == "eu-west-1"
    assert (await store.load(thread_id)).status == "running"


async def test_a_reply_in_a_thread_we_do_not_own_is_ignored(store: Store, slack: FakeSlack) -> None:
    reply = fake.message_event(
        user=ANN, text="lunch?", channel=CHANNEL, ts="1700000000.000400", thread_ts=ROOT
    )
    async with served(store, slack) as s:
        status, _ = await s.send(reply)
    assert status == 200
    assert await store.list_threads() == []
    assert s.kicks == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"subtype": "message_changed", "user": None},
        {"subtype": "message_deleted", "user": None},
        {"subtype": "channel_join", "user": EVE},
        {"subtype": "bot_message", "user": None, "bot_id": "B0OTHER001"},
        {"user": "U0OTHERBOT", "bot_id": "B0OTHER001"},  # another app's bot user
        {"user": BOT_USER_ID, "bot_id": BOT_ID},  # our own reply
    ],
)
async def test_edits_joins_and_bots_are_ignored_with_a_200(
    store: Store, slack: FakeSlack, kwargs: dict[str, Any]
) -> None:
    async with served(store, slack) as s:
        await s.send(mention())
        thread_id = await thread_at(store)
        assert thread_id is not None
        event = fake.message_event(
            text="edited", channel=CHANNEL, ts="1700000000.000600", thread_ts=ROOT, **kwargs
        )
        status, _ = await s.send(event)
    assert status == 200
    assert await types_of(store, thread_id) == ["user_message"]
    assert s.kicks == [thread_id]


async def test_top_level_channel_chatter_and_unknown_events_get_a_200(
    store: Store, slack: FakeSlack
) -> None:
    chatter = fake.message_event(user=ANN, text="hi all", channel=CHANNEL, ts=ROOT)
    reaction = fake.event_callback(
        {"type": "reaction_added", "user": ANN, "reaction": "eyes", "event_ts": ROOT}
    )
    async with served(store, slack) as s:
        assert (await s.send(chatter))[0] == 200
        assert (await s.send(reaction))[0] == 200
        unknown_click = button(ANN, "somebody_elses_button", "x")
        assert (await s.send(unknown_click))[0] == 200
    assert await store.list_threads() == []


async def test_a_direct_message_starts_a_thread_and_its_replies_continue_it(
    store: Store, slack: FakeSlack
) -> None:
    dm = "D0ANN00001"
    first = fake.message_event(
        user=ANN, text="what runs in staging?", channel=dm, ts=ROOT, channel_type="im"
    )
    follow_up = fake.message_event(
        user=ANN, text="and in prod?", channel=dm, ts="1700000000.000300", thread_ts=ROOT,
        channel_type="im",
    )  # fmt: skip
    async with served(store, slack) as s:
        assert (await s.send(first))[0] == 200
        assert (await s.send(follow_up))[0] == 200
    thread_id = await thread_at(store, ROOT, channel=dm)
    assert thread_id is not None
    texts = [e.text for e in await events_of(store, thread_id)]  # type: ignore[union-attr]
    assert texts == ["what runs in staging?", "and in prod?"]
    assert len(await store.list_threads()) == 1


# --- approve ----------------------------------------------------------------------------


async def test_approve_grants_the_pending_call(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        status, _ = await s.send(button(BOB, APPROVE_ACTION, value, action_ts="1700000100.1"))
        await s.settle()
    assert status == 200
    granted = (await events_of(store, thread_id))[-1]
    assert isinstance(granted, ev.ApprovalGranted)
    assert (granted.actor, granted.dedupe_key) == (BOB, "click:1700000100.1")
    assert (await store.load(thread_id)).status == "running"
    assert s.kicks == [thread_id]
    assert slack.ephemerals == []


async def test_a_double_click_approves_once_and_tells_the_second(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        first = button(BOB, APPROVE_ACTION, value, action_ts="1700000100.1")
        assert (await s.send(first))[0] == 200
        assert (await s.send(first, retry=1))[0] == 200  # the same click, redelivered
        second = button(EVE, APPROVE_ACTION, value, action_ts="1700000100.2")
        assert (await s.send(second))[0] == 200
        [call] = await slack.wait_for("chat.postEphemeral")
        await s.settle()
    types = await types_of(store, thread_id)
    assert types.count("approval_granted") == 1
    assert types[-1] == "approval_refused"  # the late click, kept for the audit
    assert call.params["user"] == EVE and call.params["channel"] == CHANNEL
    assert call.params["thread_ts"] == ROOT
    assert call.params["text"].startswith(f"Nothing changed: already approved by <@{BOB}> at ")
    assert call.params["text"].endswith(" UTC.")


async def test_two_reviewers_at_once_one_wins(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        results = await asyncio.gather(
            s.send(button(BOB, APPROVE_ACTION, value)),
            s.send(button(EVE, REJECT_ACTION, value)),
            s.send(button("U0DAN00001", APPROVE_ACTION, value)),
        )
        await s.settle()
    assert [status for status, _ in results] == [200, 200, 200]
    types = await types_of(store, thread_id)
    assert types.count("approval_granted") == 1
    assert types.count("approval_rejected") == 0  # a reject click only opens the modal
    losers = len(slack.ephemerals) + len(slack.calls_to("views.open"))
    assert losers == 2  # the other approver was told; the reject click got a note or a modal


async def test_an_unauthorised_reviewer_is_refused(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        assert (await s.send(button(EVE, APPROVE_ACTION, value)))[0] == 200
        await slack.wait_for("chat.postEphemeral")
    refused = (await events_of(store, thread_id))[-1]
    assert isinstance(refused, ev.ApprovalRefused)
    assert refused.actor == EVE
    assert (await store.load(thread_id)).status == "awaiting_approval"
    assert ephemeral_texts(slack, EVE) == ["Nothing changed: you are not on the approvers list."]
    assert s.kicks == []


@pytest.mark.parametrize("allow_self", [False, True])
async def test_self_approval_only_when_allowed(
    store: Store, slack: FakeSlack, allow_self: bool
) -> None:
    thread_id, value = await awaiting_approval(store, requester=ANN)
    policy = ReviewerRule(frozenset({ANN, BOB}), allow_self=allow_self)
    async with served(store, slack, reviewers=policy) as s:
        assert (await s.send(button(ANN, APPROVE_ACTION, value)))[0] == 200
        await s.settle()
    last = (await events_of(store, thread_id))[-1]
    if allow_self:
        assert last.type == "approval_granted"
        assert slack.ephemerals == []
    else:
        assert last.type == "approval_refused"
        assert "self-approval is turned off" in ephemeral_texts(slack, ANN)[0]


async def test_a_user_group_approver_may_approve(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    slack.usergroups["S0OPS00001"] = [EVE, "U0DAN00001"]
    policy = ReviewerRule(frozenset({BOB, "S0OPS00001"}))
    async with served(store, slack, reviewers=policy) as s:
        outsider = button("U0ZED00001", APPROVE_ACTION, value, action_ts="1700000100.1")
        assert (await s.send(outsider))[0] == 200
        assert (await s.send(button(EVE, APPROVE_ACTION, value)))[0] == 200
        await s.settle()
    types = await types_of(store, thread_id)
    assert types[-2:] == ["approval_refused", "approval_granted"]
    calls = slack.calls_to("usergroups.users.list")
    assert [c.params["usergroup"] for c in calls] == ["S0OPS00001"]  # cached for the 2nd


async def test_a_failed_group_lookup_changes_nothing(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    slack.fail("usergroups.users.list", "missing_scope")
    policy = ReviewerRule(frozenset({"S0OPS00001"}))
    async with served(store, slack, reviewers=policy) as s:
        assert (await s.send(button(EVE, APPROVE_ACTION, value)))[0] == 200
        await slack.wait_for("chat.postEphemeral")
    assert await types_of(store, thread_id) == [
        "user_message",
        "model_decision",
        "tool_call_requested",
        "approval_requested",
    ]
    assert "could not check your user groups" in ephemeral_texts(slack, EVE)[0]


@pytest.mark.parametrize("forged", ["not json", '{"t":"thr_nope","c":"toolu_01","h":"x"}', ""])
async def test_a_forged_button_changes_nothing(store: Store, slack: FakeSlack, forged: str) -> None:
    thread_id, _value = await awaiting_approval(store)
    before = await types_of(store, thread_id)
    async with served(store, slack) as s:
        for action in (APPROVE_ACTION, REJECT_ACTION):
            assert (await s.send(button(BOB, action, forged)))[0] == 200
        await slack.wait_for("chat.postEphemeral", 2)
        await s.settle()
    assert await types_of(store, thread_id) == before
    assert [len(await store.list_threads())] == [1]
    assert all("not valid" in t for t in ephemeral_texts(slack, BOB))
    assert slack.calls_to("views.open") == []
    assert s.kicks == []


async def test_a_card_for_other_arguments_is_refused(store: Store, slack: FakeSlack) -> None:
    thread_id, _value = await awaiting_approval(store)
    stale = binding_value(thread_id, "toolu_01", arguments_hash("deploy", {"service": "db"}))
    async with served(store, slack) as s:
        await s.send(button(BOB, APPROVE_ACTION, stale))
        await slack.wait_for("chat.postEphemeral")
    assert (await store.load(thread_id)).status == "awaiting_approval"
    assert "out of date" in ephemeral_texts(slack, BOB)[0]


# --- reject -----------------------------------------------------------------------------


async def test_reject_opens_the_modal_and_stores_nothing(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    before = await types_of(store, thread_id)
    async with served(store, slack) as s:
        click = button(BOB, REJECT_ACTION, value)
        assert (await s.send(click))[0] == 200
        [call] = await slack.wait_for("views.open")
    assert call.params["trigger_id"] == click["trigger_id"]
    view = call.params["view"]
    assert view["callback_id"] == REJECT_CALLBACK
    assert parse_binding(view["private_metadata"]) == parse_binding(value)
    assert limits.check_limits(view) == []
    assert await types_of(store, thread_id) == before
    assert s.kicks == []


async def test_reject_on_a_decided_card_says_so(store: Store, slack: FakeSlack) -> None:
    _thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        await s.send(button(BOB, APPROVE_ACTION, value))
        await s.send(button(EVE, REJECT_ACTION, value))
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert ephemeral_texts(slack, EVE)[0].startswith(
        f"Nothing changed: already approved by <@{BOB}>"
    )
    assert slack.calls_to("views.open") == []


async def test_reject_by_an_unauthorised_reviewer_is_refused_without_a_modal(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        await s.send(button(EVE, REJECT_ACTION, value))
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert (await types_of(store, thread_id))[-1] == "approval_refused"
    assert slack.calls_to("views.open") == []


def submission(value: str, reason: str | None, *, user: str = BOB, view_id: str = "V0REJECT01"):
    return fake.view_submission_payload(
        user=user,
        callback_id=REJECT_CALLBACK,
        private_metadata=value,
        values=fake.text_input_values(REASON_BLOCK, REASON_ACTION, reason),
        view_id=view_id,
    )


async def test_the_reject_modal_rejects_with_the_reason(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        status, text = await s.send(submission(value, "  use the canary first  "))
        assert (await s.send(submission(value, "use the canary first"), retry=1))[0] == 200
    assert (status, text) == (200, "")  # an empty ack closes the modal
    rejected = (await events_of(store, thread_id))[-1]
    assert isinstance(rejected, ev.ApprovalRejected)
    assert (rejected.actor, rejected.reason) == (BOB, "use the canary first")
    assert rejected.dedupe_key == "view:V0REJECT01"
    assert (await types_of(store, thread_id)).count("approval_rejected") == 1
    assert s.kicks[0] == thread_id


async def test_the_reject_modal_without_a_reason(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        assert (await s.send(submission(value, None)))[0] == 200
    rejected = (await events_of(store, thread_id))[-1]
    assert isinstance(rejected, ev.ApprovalRejected)
    assert rejected.reason == ""


async def test_a_refused_submission_shows_the_reason_in_the_modal(
    store: Store, slack: FakeSlack
) -> None:
    _thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        await s.send(button(BOB, APPROVE_ACTION, value))
        status, text = await s.send(submission(value, "no", user=EVE))
        forged_status, forged = await s.send(submission("{}", "no", view_id="V0REJECT02"))
    assert status == 200
    answer = json.loads(text)
    assert answer["response_action"] == "errors"
    assert answer["errors"][REASON_BLOCK].startswith(f"Nothing changed: already approved by {BOB}")
    assert forged_status == 200
    assert json.loads(forged)["response_action"] == "errors"


# --- edit before approve (issue 17 §2) ---------------------------------------------------

CAROL = "U0CAROL001"
STAGING = {"service": "api", "env": "staging"}


class DeployArgs(BaseModel):
    service: str
    env: Literal["staging", "production"]
    replicas: int = Field(1, ge=1)


def deploy_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tool(policy="approve_before_run", registry=tools)
    async def deploy(args: DeployArgs, ctx: ToolContext) -> dict:
        """Deploy a service."""
        return {}

    return tools


PRODUCTION_RULES = PolicySet(
    rules=(
        PolicyRule(
            tool="deploy",
            when={"properties": {"env": {"const": "production"}}, "required": ["env"]},
            policy="approve_before_run",
            approvers=[BOB, CAROL],
            quorum=2,
        ),
        PolicyRule(tool="deploy", policy="approve_before_run"),
    )
)


@asynccontextmanager
async def editing(store: Store, slack: FakeSlack, **kw: Any) -> AsyncIterator[Served]:
    async with served(store, slack, tools=deploy_tools(), policy=PRODUCTION_RULES, **kw) as s:
        yield s


async def open_edit(s: Served, value: str, user: str = BOB) -> dict[str, Any]:
    """Click Edit on the card; the modal views.open was called with (its trigger id checked)."""
    before = len(s.slack.calls_to("views.open"))
    click = button(user, EDIT_ACTION, value)
    assert (await s.send(click))[0] == 200
    opened = await s.slack.wait_for("views.open", before + 1)
    assert opened[-1].params["trigger_id"] == click["trigger_id"]
    view = opened[-1].params["view"]
    return json.loads(view) if isinstance(view, str) else view


def filled(view: dict[str, Any], changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """``view.state.values`` as Slack sends them for ``view`` left as it opened, but for
    ``changes`` (block id: a text, an option's value, True to tick every checkbox, or
    the list of the values to tick)."""
    changes = changes or {}
    values: dict[str, Any] = {}
    for block in view["blocks"]:
        if block["type"] != "input":
            continue
        element, bid = block["element"], block["block_id"]
        given = changes.get(bid)
        if element["type"] == "plain_text_input":
            text = given if bid in changes else element.get("initial_value")
            state = {"type": "plain_text_input", "value": text}
        elif element["type"] == "static_select":
            chosen = element.get("initial_option")
            if bid in changes:
                chosen = next(o for o in element["options"] if o["value"] == given)
            state = {"type": "static_select", "selected_option": chosen}
        else:
            ticked = element.get("initial_options") or []
            if bid in changes:
                wanted = (
                    given
                    if isinstance(given, list)
                    else [o["value"] for o in element["options"]]
                    if given
                    else []
                )
                ticked = [o for o in element["options"] if o["value"] in wanted]
            state = {"type": "checkboxes", "selected_options": ticked}
        values[bid] = {element["action_id"]: state}
    return values


def cards_in(slack: FakeSlack) -> list[dict[str, Any]]:
    """The bot's messages with buttons in a row: the approval cards, as Slack shows them."""
    return [
        m for m in slack.posted(CHANNEL) if any(b["type"] == "actions" for b in m.get("blocks", []))
    ]


def edit_submission(
    view: dict[str, Any], values: dict[str, Any], *, user: str = BOB, view_id: str = "V0EDIT0001"
) -> dict[str, Any]:
    return fake.view_submission_payload(
        user=user,
        callback_id=view["callback_id"],
        private_metadata=view["private_metadata"],
        values=values,
        view_id=view_id,
        blocks=view["blocks"],
    )


async def test_edit_opens_the_arguments_modal_and_stores_nothing(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store, arguments=STAGING)
    before = await types_of(store, thread_id)
    async with editing(store, slack) as s:
        view = await open_edit(s, value)
    assert view["callback_id"] == EDIT_CALLBACK
    assert parse_binding(view["private_metadata"]) == parse_binding(value)
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert inputs["arg:service"]["initial_value"] == "api"
    assert inputs["arg:env"]["initial_option"]["value"] == '"staging"'
    assert "initial_value" not in inputs["arg:replicas"]  # not set on the call
    assert limits.check_limits(view) == []
    assert await types_of(store, thread_id) == before
    assert s.kicks == []


async def test_an_edit_click_by_a_non_approver_is_refused_and_recorded(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store, arguments=STAGING)
    async with editing(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        assert (await s.send(button(EVE, EDIT_ACTION, value)))[0] == 200
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    refused = (await events_of(store, thread_id))[-1]
    assert isinstance(refused, ev.ApprovalRefused)
    assert (refused.actor, refused.decision, refused.tool_call_id) == (EVE, "edit", "toolu_01")
    assert ephemeral_texts(slack, EVE) == ["Nothing changed: you are not on the approvers list."]
    assert slack.calls_to("views.open") == []
    assert s.kicks == []


async def test_a_bad_edit_keeps_the_modal_open_with_errors_and_stores_nothing(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store, arguments=STAGING)
    before = await types_of(store, thread_id)
    async with editing(store, slack) as s:
        view = await open_edit(s, value)
        unread = edit_submission(view, filled(view, {"arg:replicas": "three"}))
        status, text = await s.send(unread)
        refused = edit_submission(view, filled(view, {"arg:replicas": "0"}), view_id="V0EDIT0002")
        schema_status, schema_text = await s.send(refused)
    assert (status, json.loads(text)) == (
        200,
        {"response_action": "errors", "errors": {"arg:replicas": "Enter a whole number"}},
    )
    assert schema_status == 200
    answer = json.loads(schema_text)
    assert answer["response_action"] == "errors"
    assert list(answer["errors"]) == ["arg:replicas"]
    assert "greater than or equal to 1" in answer["errors"]["arg:replicas"]
    assert await types_of(store, thread_id) == before
    assert s.kicks == []


async def test_an_edit_is_stored_the_rules_apply_again_and_the_card_shows_the_diff(
    store: Store, slack: FakeSlack
) -> None:
    """staging → production: the production rule's two approvers now decide it; the
    card is updated in place with the diff and bound to the new arguments."""
    root = slack.add_message(CHANNEL, "deploy api to staging", user=ANN)["ts"]
    thread_id, value = await awaiting_approval(store, arguments=STAGING, root=root)
    client = AsyncWebClient(token=TOKEN, base_url=slack.url)
    delivery = Delivery(store, client, owner="proc-a", retry_base=None)
    # The status message, the plan that stopped at the card (started, stopped), the card.
    assert await delivery.deliver(thread_id) == 4
    [card] = cards_in(slack)
    async with editing(store, slack) as s:
        view = await open_edit(s, value)
        production = edit_submission(view, filled(view, {"arg:env": '"production"'}))
        assert await s.send(production) == (200, "")  # an empty ack closes the modal
        edited = (await events_of(store, thread_id))[-1]
        assert isinstance(edited, ev.ApprovalEdited)
        assert (edited.reviewer, edited.arguments) == (BOB, {"service": "api", "env": "production"})
        assert edited.previous_hash == parse_binding(value).arguments_hash
        assert (edited.approvers, edited.quorum, edited.rule) == ((BOB, CAROL), 2, 0)
        assert thread_id in s.kicks
        assert await delivery.deliver(thread_id) >= 1
        [updated] = cards_in(slack)
        assert updated["ts"] == card["ts"]  # in place
        blocks = updated["blocks"]
        shown = json.dumps(blocks, ensure_ascii=False)
        assert "env: staging → production" in shown
        assert "rule 1: needs 2 of" in shown
        [actions] = [b for b in blocks if b["type"] == "actions"]
        new_value = actions["elements"][0]["value"]
        assert parse_binding(new_value).arguments_hash == edited.arguments_hash
        # The card as it was is stale: its click is refused and recorded.
        assert (await s.send(button(CAROL, APPROVE_ACTION, value)))[0] == 200
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert "out of date" in ephemeral_texts(slack, CAROL)[0]
    assert (await types_of(store, thread_id))[-1] == "approval_refused"
    state = await store.load(thread_id)
    assert state.pending is not None and state.pending.votes == ()


async def test_save_and_approve_stores_the_edit_and_the_editors_one_vote(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store, arguments=STAGING)
    async with editing(store, slack) as s:
        view = await open_edit(s, value)
        changes = {"arg:env": '"production"', APPROVE_BLOCK: True}
        submission = edit_submission(view, filled(view, changes))
        assert await s.send(submission) == (200, "")
        assert (await s.send(submission, retry=1))[0] == 200  # resent: stored once
    kinds = await types_of(store, thread_id)
    assert kinds[-2:] == ["approval_edited", "approval_granted"]
    assert kinds.count("approval_edited") == 1
    state = await store.load(thread_id)
    assert state.status == "awaiting_approval"  # production needs CAROL too
    assert state.pending is not None and state.pending.votes == (BOB,)


# --- cancel -----------------------------------------------------------------------------


async def test_the_requester_cancels_and_a_stranger_cannot(store: Store, slack: FakeSlack) -> None:
    thread_id, _value = await awaiting_approval(store)
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        stranger = button(EVE, CANCEL_ACTION, thread_id, action_ts="1700000100.1")
        assert (await s.send(stranger))[0] == 200
        await slack.wait_for("chat.postEphemeral")
        assert (await store.load(thread_id)).status == "awaiting_approval"
        mine = button(ANN, CANCEL_ACTION, thread_id, action_ts="1700000100.2")
        assert (await s.send(mine))[0] == 200
        assert (await s.send(mine, retry=1))[0] == 200  # redelivered: no second note
        await s.send(button(ANN, CANCEL_ACTION, "thr_forged"))
        await slack.wait_for("chat.postEphemeral", 2)
        await s.settle()
    assert (await store.load(thread_id)).status == "cancelled"
    assert (await types_of(store, thread_id)).count("thread_cancelled") == 1
    assert "only the requester or an approver" in ephemeral_texts(slack, EVE)[0]
    assert ephemeral_texts(slack, ANN) == [INVALID_BUTTON]
    assert thread_id in s.kicks


async def test_a_cancel_by_someone_the_calls_rule_refuses_is_recorded_not_done(
    store: Store, slack: FakeSlack
) -> None:
    """No process approvers, but the call's rule names BOB: EVE, who may not approve it,
    may not stop it either."""
    thread_id, value = await awaiting_approval(store, approvers=(BOB,))
    async with served(store, slack) as s:
        assert (await s.send(button(EVE, APPROVE_ACTION, value)))[0] == 200
        stranger = button(EVE, CANCEL_ACTION, thread_id, action_ts="1700000100.3")
        assert (await s.send(stranger))[0] == 200
        await slack.wait_for("chat.postEphemeral", 2)
        await s.settle()
    refused = (await events_of(store, thread_id))[-1]
    assert isinstance(refused, ev.ApprovalRefused)
    assert (refused.actor, refused.decision, refused.tool_call_id) == (EVE, "cancel", "toolu_01")
    assert (await store.load(thread_id)).status == "awaiting_approval"
    assert "thread_cancelled" not in await types_of(store, thread_id)
    note = ephemeral_texts(slack, EVE)[1]
    assert note.startswith("Nothing changed:") and "approver of the pending call" in note
    assert thread_id not in s.kicks


# --- /opsloop and App Home ---------------------------------------------------------------


async def command(s: Served, text: str, user: str, channel: str = CHANNEL) -> str:
    status, body = await s.send(fake.slash_command_payload(user=user, text=text, channel=channel))
    assert status == 200
    answer = json.loads(body)
    assert answer["response_type"] == "ephemeral"
    return answer["text"]


async def test_slash_command_help_pending_and_status(store: Store, slack: FakeSlack) -> None:
    thread_id, _value = await awaiting_approval(store)
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        await s.send(mention("<@U0FAKEBOT1> <b>bold</b> & more", ts="1700000000.000900"))
        assert "/opsloop pending" in await command(s, "help", ANN)
        unknown = await command(s, "<!channel>", ANN)
        assert unknown.startswith("I don't know `&lt;!channel&gt;`")
        assert "/opsloop status" in unknown
        pending = await command(s, "pending", BOB)
        link = f"https://{TEAM_DOMAIN}.slack.com/archives/{CHANNEL}/p1700000000000100"
        assert link in pending and "*deploy*" in pending and f"<@{ANN}>" in pending
        # Where, what exactly and since when: not a bare thread ts.
        assert f"<#{CHANNEL}>" in pending and "service=api" in pending and "env=staging" in pending
        assert "<!date^" in pending and "{date_short_pretty} at {time}" in pending
        assert "Nothing is waiting for you" in await command(s, "pending", ANN)  # requester
        assert "Nothing is waiting for you" in await command(s, "pending", EVE)  # not approver
        status = await command(s, "status", EVE)
        assert link in status and "waiting for approval" in status
        assert "working" in status  # the new thread from the mention
        assert "not working on anything" in await command(s, "status", EVE, "C0ELSEWHERE")
    assert thread_id


async def test_pending_lists_each_call_by_its_own_rule(store: Store, slack: FakeSlack) -> None:
    """A rule's own approver sees the call they may decide; a process approver whom the
    call's rule leaves out does not (before, both were filtered by the process's list)."""
    await awaiting_approval(store, approvers=(EVE,))
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        assert "*deploy*" in await command(s, "pending", EVE)
        assert "Nothing is waiting for you" in await command(s, "pending", BOB)
        assert (await s.send(fake.app_home_opened_event(user=EVE)))[0] == 200
        [call] = await slack.wait_for("views.publish")
    assert call.params["user_id"] == EVE and "deploy" in json.dumps(call.params["view"])


async def test_app_home_lists_pending_approvals_and_recent_threads(
    store: Store, slack: FakeSlack
) -> None:
    await awaiting_approval(store)
    async with served(store, slack) as s:
        await s.send(mention(user=BOB, ts="1700000000.000900"))
        assert (await s.send(fake.app_home_opened_event(user=BOB)))[0] == 200
        [call] = await slack.wait_for("views.publish")
    view = call.params["view"]
    assert call.params["user_id"] == BOB and view["type"] == "home"
    assert limits.check_limits(view) == []
    text = json.dumps(view)
    assert "deploy" in text  # ANN's call, which BOB may approve
    assert "p1700000000000900" in text  # BOB's own thread
    assert slack.home_views[BOB]["type"] == "home"


# --- failures ---------------------------------------------------------------------------


async def test_database_down_is_a_500_and_the_retry_counts_once(
    store: Store, slack: FakeSlack
) -> None:
    down = store_for(UNREACHABLE)  # built without connecting
    payload = mention(event_id="Ev0DOWN0001")
    thread_id, value = await awaiting_approval(store, root="1700000000.000800")
    try:
        async with served(down, slack) as s:
            status, _ = await s.send(payload)
            click_status, _ = await s.send(button(BOB, APPROVE_ACTION, value))
    finally:
        await down.close()
    assert status >= 500 and click_status >= 500
    assert s.kicks == []
    async with served(store, slack) as s:
        assert (await s.send(payload, retry=1))[0] == 200
        assert (await s.send(payload, retry=2))[0] == 200
    mentioned = await thread_at(store)
    assert mentioned is not None
    assert await types_of(store, mentioned) == ["user_message"]
    assert (await store.load(thread_id)).status == "awaiting_approval"


async def test_slack_refusing_auth_test_is_a_500_not_a_lost_event(
    store: Store, slack: FakeSlack
) -> None:
    """Bolt answers a failed auth.test with 200: the event would be acknowledged and lost."""
    slack.fail("auth.test", "ratelimited")
    payload = mention(event_id="Ev0AUTH0001")
    async with served(store, slack) as s:
        status, _ = await s.send(payload)
        assert await store.list_threads() == []
        retried, _ = await s.send(payload, retry=1)
    assert status == 500
    assert retried == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    assert await types_of(store, thread_id) == ["user_message"]
