"""A fake Slack: the Web API as an aiohttp server, and requests signed as Slack signs them.

The Slack semantics are ``opsloop local``'s (:mod:`localslack.web_api` over a
:class:`~localslack.workspace.Workspace`, and the builders of
:mod:`localslack.slack_requests`); this module adds what tests need on top: an ephemeral
127.0.0.1 port, a record of every call (``calls``, ``wait_for``), and injected rate
limits, failures and held answers, and Slack's clock moved on (``advance``) to expire
loading statuses and streams without sleeping.

``FakeSlack`` answers the Web API methods opsloop uses the way Slack does
(https://docs.slack.dev/reference/methods): bodies as slack_sdk sends them (query
parameters, form fields or JSON; the token in an ``Authorization: Bearer`` header),
``{"ok": false, "error": ...}`` with HTTP 200 for API errors, HTTP 429 with
``Retry-After`` when rate limited. Use it as ``AsyncWebClient(token=TOKEN,
base_url=fake.url)`` or as ``SLACK_API_URL``::

    async with FakeSlack() as slack:
        ...  # run the bot against slack.url
        [call] = await slack.wait_for("chat.postMessage")

The payload builders give the documented shapes of what Slack sends to the app: Events
API envelopes (https://docs.slack.dev/apis/events-api), interaction payloads
(https://docs.slack.dev/reference/interaction-payloads) and slash commands; ``signed``
encodes one as Slack would and signs it (v0, HMAC-SHA256 over ``v0:timestamp:body``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

from aiohttp import web

from localslack import slack_requests as sr
from localslack.identity import Identity, user_record
from localslack.web_api import ApiError, Call, WebApi, json_answer
from localslack.workspace import Workspace
from tests.support.servers import serve

__all__ = ["ApiError", "Call", "FakeSlack"]

TOKEN = "xoxb-0000-fake-bot-token"
SIGNING_SECRET = "fake-signing-secret"
VERIFICATION_TOKEN = "fake-verification-token"
TEAM_ID = "T0FAKE0001"
TEAM_DOMAIN = "opsloop-test"
APP_ID = "A0FAKE0001"
BOT_ID = "B0FAKE0001"
BOT_USER_ID = "U0FAKEBOT1"
IDENTITY = Identity(
    team_id=TEAM_ID,
    team_domain=TEAM_DOMAIN,
    team_name="opsloop test",
    app_id=APP_ID,
    bot_id=BOT_ID,
    bot_user_id=BOT_USER_ID,
    bot_name="opsloop",
    verification_token=VERIFICATION_TOKEN,
)


class FakeSlack(WebApi):
    """The Web API of one workspace with one bot, in memory, for tests."""

    def __init__(self, *, token: str = TOKEN) -> None:
        self._clock_offset = 0.0  # Slack's clock, ahead of ours by what tests advanced
        workspace = Workspace(IDENTITY, open_world=True, clock=self._now)
        super().__init__(workspace, token=token)
        self.calls: list[Call] = []
        self._rate_limits: dict[str, list[int]] = {}
        self._failures: dict[str, list[tuple[str, int]]] = {}
        self._holds: dict[str, asyncio.Event] = {}
        self._cond: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        # Socket Mode: the app token, and the WebSocket URL apps.connections.open hands out
        # (tests/fakes/socket_mode.py serves one).
        self.app_token = "xapp-1-test"
        self.socket_url = ""
        self.handlers["apps.connections.open"] = self._connections_open

    # --- the workspace, as tests read and set it ----------------------------------------

    @property
    def messages(self) -> dict[str, list[dict[str, Any]]]:
        return self.workspace.messages

    @property
    def ephemerals(self) -> list[dict[str, Any]]:
        return self.workspace.ephemerals

    @property
    def views(self) -> list[dict[str, Any]]:
        return self.workspace.views

    @property
    def home_views(self) -> dict[str, dict[str, Any]]:
        return self.workspace.home_views

    @property
    def users(self) -> dict[str, dict[str, Any]]:
        return self.workspace.users

    @property
    def usergroups(self) -> dict[str, list[str]]:
        return self.workspace.usergroups

    @usergroups.setter
    def usergroups(self, groups: dict[str, list[str]]) -> None:
        self.workspace.usergroups = groups

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> FakeSlack:
        self._cond = asyncio.Condition()
        app = web.Application()
        self.add_routes(app)
        self._runner, port = await serve(app)
        self.url = f"http://127.0.0.1:{port}/api/"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for gate in self._holds.values():
            gate.set()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- controls for tests -----------------------------------------------------------

    def rate_limit(self, method: str, times: int = 1, retry_after: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with HTTP 429 and Retry-After."""
        self._rate_limits.setdefault(method, []).extend([retry_after] * times)

    def fail(self, method: str, error: str, *, times: int = 1, status: int = 200) -> None:
        """Answer the next ``times`` calls of ``method`` with ``error`` (and ``status``)."""
        self._failures.setdefault(method, []).extend([(error, status)] * times)

    def hold(self, method: str) -> asyncio.Event:
        """Do what ``method`` calls ask but keep their answers until the event is set:
        a client killed meanwhile never learns that its call succeeded."""
        return self._holds.setdefault(method, asyncio.Event())

    def advance(self, seconds: float) -> None:
        """Move Slack's clock on: streams and loading statuses expire by it."""
        self._clock_offset += seconds

    def _now(self) -> float:
        return time.time() + self._clock_offset

    def refuse_streams(
        self, channel: str, error: str = "method_not_supported_for_channel_type"
    ) -> None:
        """Answer every chat.startStream in ``channel`` with ``error`` (a channel type or a
        policy that does not allow streaming)."""
        self.workspace.streams_refused[channel] = error

    @property
    def agent_view(self) -> bool:
        """Whether the app is declared an agent (off: agents.sessions.setStatus answers
        ``not_authorized``)."""
        return self.workspace.agent_view

    @agent_view.setter
    def agent_view(self, on: bool) -> None:
        self.workspace.agent_view = on

    def stream(self, channel: str, ts: str) -> dict[str, Any] | None:
        """The stream of message ``ts`` (see localslack.streams), or None."""
        return self.workspace.stream(channel, ts)

    def thread_status(self, channel: str, thread_ts: str) -> dict[str, Any] | None:
        """The loading status shown under the thread now, or None."""
        return self.workspace.status_of(channel, thread_ts)

    def session(self, channel: str, thread_ts: str | None) -> dict[str, Any] | None:
        """The thread's agent session (status, title), or None."""
        return self.workspace.session_of(channel, thread_ts)

    def press_stop(self, channel: str, thread_ts: str, *, user: str) -> dict[str, Any]:
        """``user`` presses the agent session's stop button: Slack stops the app's open
        streams in the thread; the ``agent_session_stopped`` event it sends the app."""
        stopped = self.workspace.stop_by_user(channel, thread_ts)
        return agent_session_stopped_event(
            user=user, channel=channel, thread_ts=thread_ts, streaming_message_ts=stopped
        )

    def feedback_click(
        self, channel: str, ts: str, *, user: str, positive: bool = True
    ) -> dict[str, Any]:
        """A click by ``user`` on 👍 (``positive``) or 👎 of the feedback buttons of the
        message ``ts``: the ``block_actions`` payload, with the button's own value."""
        message = self.workspace.find(channel, ts)
        assert message is not None, f"no message {ts} in {channel}"
        block, element = next(
            (b, e)
            for b in message.get("blocks") or []
            if b.get("type") == "context_actions"
            for e in b.get("elements") or []
            if e.get("type") == "feedback_buttons"
        )
        button = element["positive_button" if positive else "negative_button"]
        return feedback_buttons_payload(
            user=user,
            action_id=element["action_id"],
            value=button["value"],
            channel=channel,
            message_ts=ts,
            block_id=block.get("block_id") or "feedback",
            thread_ts=message.get("thread_ts"),
            text=(button.get("text") or {}).get("text", ""),
        )

    def add_user(self, user_id: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
        self.users[user_id] = user_record(IDENTITY, user_id, name or user_id.lower(), **fields)
        return self.users[user_id]

    def add_message(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U0HUMAN001",
        ts: str | None = None,
        thread_ts: str | None = None,
    ) -> dict[str, Any]:
        """A message a person wrote (the root of a thread, or a reply in it)."""
        message = {"type": "message", "user": user, "text": text, "ts": ts or self.next_ts()}
        message["team"] = TEAM_ID
        if thread_ts:
            message["thread_ts"] = thread_ts
        return self.workspace.add_message(channel, message)

    def next_ts(self) -> str:
        """A message ts, later than every one given before."""
        return self.workspace.next_ts()

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def thread(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The root message ``ts`` and its replies, in order."""
        return self.workspace.thread(channel, ts)

    def click_on(
        self, post: Call, action_id: str, *, user: str, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """A click by ``user`` on the ``action_id`` button of the message ``post`` made
        (found in the channel as Slack shows it): the ``block_actions`` payload."""
        channel = str(post.params["channel"])
        blocks = post.params["blocks"]
        blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
        value = next(
            e["value"]
            for b in blocks
            if b["type"] == "actions"
            for e in b["elements"]
            if e["action_id"] == action_id
        )
        shown = self.thread(channel, thread_ts) if thread_ts else self.messages.get(channel, [])
        ts = next(m["ts"] for m in shown if m.get("blocks") == blocks)
        return block_actions_payload(
            user=user,
            action_id=action_id,
            value=value,
            channel=channel,
            message_ts=ts,
            thread_ts=thread_ts,
        )

    def posted(self, channel: str | None = None) -> list[dict[str, Any]]:
        """The messages the bot posted (and still shows), in ts order."""
        channels = [channel] if channel else list(self.messages)
        return [m for c in channels for m in self.messages.get(c, []) if m.get("bot_id") == BOT_ID]

    def showing(self, text: str, channel: str | None = None) -> list[dict[str, Any]]:
        """The bot's messages that show ``text`` now: in their text or blocks, a streamed
        plan message's text as appended so far included (an answer streamed in pieces
        is in no single call)."""
        return [
            m
            for m in self.posted(channel)
            if text in json.dumps({k: m.get(k) for k in ("text", "blocks")}, ensure_ascii=False)
        ]

    async def wait_for(
        self,
        method: str,
        count: int = 1,
        timeout: float = 5,  # noqa: ASYNC109 - a test helper's deadline, as asyncio.wait_for
    ) -> list[Call]:
        """Wait until ``method`` was called at least ``count`` times; return those calls.

        A call counts once the fake has done what it asks (stored the message...), which
        may be before the client has read the answer (see :meth:`hold`).
        """
        assert self._cond is not None, "use FakeSlack as an async context manager"
        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: len(self.calls_to(method)) >= count)
        except TimeoutError:
            seen = [c.method for c in self.calls]
            raise TimeoutError(
                f"{method} called {len(self.calls_to(method))} times, not {count}; "
                f"calls so far: {seen}"
            ) from None
        return self.calls_to(method)

    # --- hooks into the Web API ---------------------------------------------------------

    async def serve(self, call: Call) -> web.Response:
        self.calls.append(call)
        response = await super().serve(call)
        assert self._cond is not None
        async with self._cond:
            self._cond.notify_all()
        if call.method in self._holds:
            await self._holds[call.method].wait()
        return response

    def expected_token(self, method: str) -> str:
        # Socket Mode's one method takes the app-level token, not the bot token.
        return self.app_token if method == "apps.connections.open" else self.token

    def intercept(self, method: str) -> web.Response | None:
        if self._rate_limits.get(method):
            retry_after = self._rate_limits[method].pop(0)
            return json_answer(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(retry_after)},
            )
        if self._failures.get(method):
            error, status = self._failures[method].pop(0)
            return json_answer({"ok": False, "error": error}, status=status)
        return None

    def _connections_open(self, _params: dict[str, Any]) -> dict[str, Any]:
        if not self.socket_url:
            raise ApiError("socket_mode_not_enabled")
        return {"url": self.socket_url}


# --- what Slack sends to the app (this workspace's identity bound) ---------------------------

sign = sr.sign
form_body = sr.form_body
text_input_values = sr.text_input_values
event_callback = functools.partial(sr.event_callback, IDENTITY)
app_mention_event = functools.partial(sr.app_mention_event, IDENTITY)
message_event = functools.partial(sr.message_event, IDENTITY)
url_verification = functools.partial(sr.url_verification, IDENTITY)
block_actions_payload = functools.partial(sr.block_actions_payload, IDENTITY)
feedback_buttons_payload = functools.partial(sr.feedback_buttons_payload, IDENTITY)
agent_session_stopped_event = functools.partial(sr.agent_session_stopped_event, IDENTITY)
view_submission_payload = functools.partial(sr.view_submission_payload, IDENTITY)
slash_command_payload = functools.partial(sr.slash_command_payload, IDENTITY)


def app_home_opened_event(
    *, user: str, channel: str = "D0FAKEHOME", tab: str = "home"
) -> dict[str, Any]:
    return sr.app_home_opened_event(IDENTITY, user=user, channel=channel, tab=tab)


def signed(
    payload: dict[str, Any], secret: str = SIGNING_SECRET, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """``payload`` encoded as Slack posts it, with signed headers and its content type."""
    return sr.signed(payload, secret, timestamp)
