"""A fake Slack: the Web API as an aiohttp server, and requests signed as Slack signs them.

``FakeSlack`` listens on an ephemeral 127.0.0.1 port and answers the Web API methods
opsloop uses the way Slack does (https://docs.slack.dev/reference/methods): bodies as
slack_sdk sends them (query parameters, form fields or JSON; the token in an
``Authorization: Bearer`` header), ``{"ok": false, "error": ...}`` with HTTP 200 for API
errors, HTTP 429 with ``Retry-After`` when rate limited. Use it as
``AsyncWebClient(token=TOKEN, base_url=fake.url)`` or as ``SLACK_API_URL``::

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
import base64
import hashlib
import hmac
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlencode

from aiohttp import web

TOKEN = "xoxb-0000-fake-bot-token"
SIGNING_SECRET = "fake-signing-secret"
VERIFICATION_TOKEN = "fake-verification-token"
TEAM_ID = "T0FAKE0001"
TEAM_DOMAIN = "opsloop-test"
APP_ID = "A0FAKE0001"
BOT_ID = "B0FAKE0001"
BOT_USER_ID = "U0FAKEBOT1"
BOT_SCOPES = (
    "app_mentions:read,channels:history,chat:write,commands,groups:history,"
    "im:history,usergroups:read,users:read"
)
_ID = re.compile(r"^[UW][A-Z0-9]+$")
_TRUE = (True, 1, "1", "true", "True")
_MAX_BLOCKS = 50


class Call(NamedTuple):
    """One request to the fake: the API method, its parameters (query, form or JSON
    body merged; JSON-encoded form fields such as ``blocks`` decoded) and its headers."""

    method: str
    params: dict[str, Any]
    headers: dict[str, str]


class ApiError(Exception):
    def __init__(self, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.error = error
        self.extra = extra


Handler = Callable[[dict[str, Any]], dict[str, Any]]


class FakeSlack:
    """The Web API of one workspace with one bot, in memory."""

    def __init__(self, *, token: str = TOKEN) -> None:
        self.token = token
        self.calls: list[Call] = []
        # channel -> messages in ts order (what conversations.replies reads)
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []
        self.home_views: dict[str, dict[str, Any]] = {}  # user -> their published Home tab
        self.users: dict[str, dict[str, Any]] = {}
        self.usergroups: dict[str, list[str]] = {}
        self._ts = itertools.count(1)
        self._epoch = int(time.time())
        self._views = itertools.count(1)
        self._triggers_used: set[str] = set()
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
        self._handlers: dict[str, Handler] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "views.open": self._views_open,
            "views.publish": self._views_publish,
            "conversations.replies": self._replies,
            "users.info": self._users_info,
            "usergroups.users.list": self._usergroup_users,
            "apps.connections.open": self._connections_open,
        }

    # --- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> FakeSlack:
        self._cond = asyncio.Condition()
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
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

    def add_user(self, user_id: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
        self.users[user_id] = self._user(user_id, name, **fields)
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
        self._store(channel, message)
        return message

    def next_ts(self) -> str:
        """A message ts, later than every one given before."""
        return f"{self._epoch}.{next(self._ts):06d}"

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def thread(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The root message ``ts`` and its replies, in order."""
        return [
            m for m in self.messages.get(channel, []) if m["ts"] == ts or m.get("thread_ts") == ts
        ]

    def posted(self, channel: str | None = None) -> list[dict[str, Any]]:
        """The messages the bot posted (and still shows), in ts order."""
        channels = [channel] if channel else list(self.messages)
        return [m for c in channels for m in self.messages.get(c, []) if m.get("bot_id") == BOT_ID]

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

    # --- the HTTP side ----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await _params(request)
        call = Call(method, params, dict(request.headers))
        self.calls.append(call)
        response = self._answer(method, params, request.headers.get("Authorization"))
        assert self._cond is not None
        async with self._cond:
            self._cond.notify_all()
        if method in self._holds:
            await self._holds[method].wait()
        return response

    def _answer(self, method: str, params: dict[str, Any], auth: str | None) -> web.Response:
        handler = self._handlers.get(method)
        if handler is None:
            return _json({"ok": False, "error": "unknown_method", "req_method": method})
        token = auth.removeprefix("Bearer ").strip() if auth else params.get("token")
        if not token:
            return _json({"ok": False, "error": "not_authed"})
        # Socket Mode's one method takes the app-level token, not the bot token.
        expected = self.app_token if method == "apps.connections.open" else self.token
        if token != expected:
            return _json({"ok": False, "error": "invalid_auth"})
        if self._rate_limits.get(method):
            retry_after = self._rate_limits[method].pop(0)
            return _json(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(retry_after)},
            )
        if self._failures.get(method):
            error, status = self._failures[method].pop(0)
            return _json({"ok": False, "error": error}, status=status)
        try:
            body = handler(params)
        except ApiError as exc:
            return _json({"ok": False, "error": exc.error, **exc.extra})
        headers = {"x-oauth-scopes": BOT_SCOPES} if method == "auth.test" else None
        return _json({"ok": True, **body}, headers=headers)

    # --- the methods ------------------------------------------------------------------

    def _auth_test(self, _params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": "opsloop test",
            "user": "opsloop",
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _post_message(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = _required(p, "channel", "channel_not_found")
        if not (p.get("text") or p.get("blocks") or p.get("attachments")):
            raise ApiError("no_text")
        _check_blocks(p.get("blocks"))
        message: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER_ID,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "team": TEAM_ID,
            "text": p.get("text", ""),
            "ts": self.next_ts(),
        }
        for key in ("blocks", "metadata", "thread_ts"):
            if p.get(key):
                message[key] = p[key]
        self._store(channel, message)
        return {"channel": channel, "ts": message["ts"], "message": dict(message)}

    def _update(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = _required(p, "channel", "channel_not_found")
        message = self._find(channel, p.get("ts"))
        if message is None:
            raise ApiError("message_not_found")
        if message.get("bot_id") != BOT_ID:
            raise ApiError("cant_update_message")
        if not (p.get("text") or p.get("blocks") or message.get("text")):
            raise ApiError("no_text")
        _check_blocks(p.get("blocks"))
        for key in ("text", "blocks", "metadata"):
            if key in p:
                message[key] = p[key]
        message["edited"] = {"user": BOT_USER_ID, "ts": self.next_ts()}
        return {
            "channel": channel,
            "ts": message["ts"],
            "text": message["text"],
            "message": message,
        }

    def _post_ephemeral(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = _required(p, "channel", "channel_not_found")
        user = _required(p, "user", "user_not_found")
        if not (p.get("text") or p.get("blocks")):
            raise ApiError("no_text")
        ts = self.next_ts()
        self.ephemerals.append({**p, "channel": channel, "user": user, "message_ts": ts})
        return {"message_ts": ts}

    def _views_open(self, p: dict[str, Any]) -> dict[str, Any]:
        trigger = _required(p, "trigger_id", "invalid_arguments")
        view = p.get("view")
        if not isinstance(view, dict) or view.get("type") not in ("modal", "home"):
            raise ApiError("invalid_arguments")
        if trigger in self._triggers_used:
            raise ApiError("exchanged_trigger_id")
        self._triggers_used.add(trigger)
        title = (view.get("title") or {}).get("text", "")
        if not 0 < len(title) <= 24 or not 0 < len(view.get("blocks") or []) <= 100:
            raise ApiError("invalid_arguments")
        view_id = f"V0FAKE{next(self._views):04d}"
        opened = {
            "id": view_id,
            "team_id": TEAM_ID,
            "app_id": APP_ID,
            "bot_id": BOT_ID,
            "root_view_id": view_id,
            "previous_view_id": None,
            "hash": uuid.uuid4().hex[:20],
            "state": {"values": {}},
            "private_metadata": "",
            "callback_id": "",
            "external_id": "",
            "clear_on_close": False,
            "notify_on_close": False,
            **view,
        }
        self.views.append({"trigger_id": trigger, "view": opened})
        return {"view": opened}

    def _views_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        user = _required(p, "user_id", "invalid_arguments")
        view = p.get("view")
        if not isinstance(view, dict) or view.get("type") != "home":
            raise ApiError("invalid_arguments")
        if not 0 < len(view.get("blocks") or []) <= 100:
            raise ApiError("invalid_arguments")
        _check_blocks(view.get("blocks"))
        view_id = f"V0FAKE{next(self._views):04d}"
        published = {"id": view_id, "team_id": TEAM_ID, "app_id": APP_ID, **view}
        self.home_views[user] = published
        return {"view": published}

    def _replies(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = _required(p, "channel", "channel_not_found")
        if channel not in self.messages:
            raise ApiError("channel_not_found")
        found = self._find(channel, p.get("ts"))
        if found is None:
            raise ApiError("thread_not_found")
        root = found.get("thread_ts", found["ts"])  # a reply's ts reads its whole thread
        thread = self.thread(channel, root)
        start = _decode_cursor(p.get("cursor"))
        limit = int(p.get("limit") or 1000)
        page = thread[start : start + limit]
        with_metadata = p.get("include_all_metadata") in _TRUE
        messages = []
        for m in page:
            shown = {k: v for k, v in m.items() if k != "metadata" or with_metadata}
            replies = [r for r in thread if r["ts"] != root]
            if m["ts"] == root and replies:
                shown.update(
                    thread_ts=root,
                    reply_count=len(replies),
                    reply_users=sorted({r.get("user", "") for r in replies}),
                    latest_reply=replies[-1]["ts"],
                )
            elif m["ts"] != root:
                shown["parent_user_id"] = thread[0].get("user", "")
            messages.append(shown)
        more = start + limit < len(thread)
        cursor = _encode_cursor(start + limit) if more else ""
        return {
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": cursor},
        }

    def _users_info(self, p: dict[str, Any]) -> dict[str, Any]:
        user_id = _required(p, "user", "user_not_found")
        if user_id in self.users:
            return {"user": self.users[user_id]}
        if user_id == BOT_USER_ID:
            return {"user": self._user(BOT_USER_ID, "opsloop", is_bot=True, bot_id=BOT_ID)}
        if not _ID.match(user_id):
            raise ApiError("user_not_found")
        return {"user": self._user(user_id, None)}  # any well-formed id is a person

    def _connections_open(self, _params: dict[str, Any]) -> dict[str, Any]:
        if not self.socket_url:
            raise ApiError("socket_mode_not_enabled")
        return {"url": self.socket_url}

    def _usergroup_users(self, p: dict[str, Any]) -> dict[str, Any]:
        group = _required(p, "usergroup", "invalid_arguments")
        if group not in self.usergroups:
            raise ApiError("no_such_subteam")
        return {"users": list(self.usergroups[group])}

    # --- storage ----------------------------------------------------------------------

    def _store(self, channel: str, message: dict[str, Any]) -> None:
        messages = self.messages.setdefault(channel, [])
        messages.append(message)
        messages.sort(key=lambda m: tuple(int(part) for part in m["ts"].split(".")))

    def _find(self, channel: str, ts: Any) -> dict[str, Any] | None:
        return next((m for m in self.messages.get(channel, []) if m["ts"] == ts), None)

    @staticmethod
    def _user(user_id: str, name: str | None, **fields: Any) -> dict[str, Any]:
        name = name or user_id.lower()
        return {
            "id": user_id,
            "team_id": TEAM_ID,
            "name": name,
            "deleted": False,
            "real_name": name.title(),
            "tz": "Europe/Paris",
            "tz_label": "Central European Time",
            "tz_offset": 3600,
            "profile": {"real_name": name.title(), "display_name": name, "team": TEAM_ID},
            "is_admin": False,
            "is_owner": False,
            "is_bot": False,
            "is_app_user": False,
            "updated": 1700000000,
            **fields,
        }


# --- request parsing and checks -----------------------------------------------------------


async def _params(request: web.Request) -> dict[str, Any]:
    """Query, form and JSON parameters merged, the way Slack reads them."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        body = await request.json()
        if isinstance(body, dict):
            params.update(body)
    elif request.can_read_body:
        form = await request.post()
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    for key in ("blocks", "metadata", "view", "attachments"):
        if isinstance(params.get(key), str) and params[key]:
            try:
                params[key] = json.loads(params[key])
            except ValueError:
                pass  # left as sent: the method rejects it
    return params


def _required(params: dict[str, Any], key: str, error: str) -> str:
    value = params.get(key)
    if not value or not isinstance(value, str):
        raise ApiError(error)
    return value


def _check_blocks(blocks: Any) -> None:
    """The checks Slack makes that a renderer most easily breaks (``invalid_blocks``).

    Deliberately independent of ``bot.blocks.check_limits``: a second opinion.
    """
    if blocks is None:
        return
    errors = []
    if not isinstance(blocks, list):
        errors.append("blocks must be a list")
    elif len(blocks) > _MAX_BLOCKS:
        errors.append(f"no more than {_MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    for i, block in enumerate(blocks if isinstance(blocks, list) else []):
        if not isinstance(block, dict):
            errors.append(f"must be an object [json-pointer:/blocks/{i}]")
            continue
        text = (block.get("text") or {}).get("text")
        if block.get("type") == "section" and text is not None and not 0 < len(text) <= 3000:
            errors.append(f"must be 1 to 3000 characters [json-pointer:/blocks/{i}/text/text]")
        for element in block.get("elements") or []:
            if len(str(element.get("value", ""))) > 2000:
                errors.append(f"value over 2000 characters [json-pointer:/blocks/{i}]")
            if len(str(element.get("action_id", ""))) > 255:
                errors.append(f"action_id over 255 characters [json-pointer:/blocks/{i}]")
    if errors:
        raise ApiError("invalid_blocks", errors=errors)


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def _encode_cursor(offset: int) -> str:
    return base64.b64encode(f"offset:{offset}".encode()).decode()


def _decode_cursor(cursor: Any) -> int:
    if not cursor:
        return 0
    try:
        return int(base64.b64decode(cursor).decode().removeprefix("offset:"))
    except ValueError as exc:
        raise ApiError("invalid_cursor") from exc


# --- what Slack sends to the app ----------------------------------------------------------


def sign(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers Slack signs a request with (v0: HMAC-SHA256 of ``v0:ts:body``)."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


def signed(
    payload: dict[str, Any], secret: str = SIGNING_SECRET, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """``payload`` encoded as Slack posts it, with signed headers and its content type.

    Events and url_verification are JSON; interactions are a form with one ``payload``
    field; a slash command is a flat form.
    """
    if payload.get("type") in ("event_callback", "url_verification"):
        body, content_type = json.dumps(payload).encode(), "application/json"
    elif "command" in payload:
        body, content_type = form_body(payload), "application/x-www-form-urlencoded"
    else:
        body = form_body({"payload": json.dumps(payload)})
        content_type = "application/x-www-form-urlencoded"
    headers = sign(secret, body, int(time.time()) if timestamp is None else timestamp)
    return body, {**headers, "Content-Type": content_type}


def form_body(fields: dict[str, Any]) -> bytes:
    return urlencode({k: "" if v is None else str(v) for k, v in fields.items()}).encode()


def _event_id() -> str:
    return "Ev" + uuid.uuid4().hex[:10].upper()


def _trigger_id() -> str:
    return f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}"


def event_callback(
    event: dict[str, Any],
    *,
    event_id: str | None = None,
    event_time: int | None = None,
    team_id: str = TEAM_ID,
) -> dict[str, Any]:
    """``event`` in the Events API envelope."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "context_team_id": team_id,
        "context_enterprise_id": None,
        "api_app_id": APP_ID,
        "event": event,
        "type": "event_callback",
        "event_id": event_id or _event_id(),
        "event_time": int(time.time()) if event_time is None else event_time,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": BOT_USER_ID,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": "4-" + uuid.uuid4().hex,
    }


def _rich_text(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "rich_text",
            "block_id": uuid.uuid4().hex[:5],
            "elements": [
                {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}
            ],
        }
    ]


def app_mention_event(
    *,
    user: str,
    text: str,
    channel: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """An ``app_mention`` (the text holds ``<@BOT_USER_ID>`` as Slack writes it)."""
    event: dict[str, Any] = {
        "type": "app_mention",
        "client_msg_id": str(uuid.uuid4()),
        "user": user,
        "text": text,
        "ts": ts,
        "team": TEAM_ID,
        "blocks": _rich_text(text),
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event_callback(event, event_id=event_id)


def message_event(
    *,
    user: str | None,
    text: str,
    channel: str,
    ts: str,
    thread_ts: str | None = None,
    channel_type: str = "channel",
    subtype: str | None = None,
    bot_id: str | None = None,
    event_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ``message`` event (``channel_type``: channel, group or im); a reply in a thread
    has ``thread_ts``; edits, joins and bots' messages have a ``subtype`` or ``bot_id``."""
    event: dict[str, Any] = {"type": "message", "channel": channel}
    if subtype:
        event["subtype"] = subtype
    if user:
        event["user"] = user
    if bot_id:
        event["bot_id"] = bot_id
        event["app_id"] = APP_ID if bot_id == BOT_ID else "A0OTHER001"
    event.update(text=text, ts=ts, team=TEAM_ID, event_ts=ts, channel_type=channel_type)
    if subtype is None and bot_id is None:
        event["client_msg_id"] = str(uuid.uuid4())
        event["blocks"] = _rich_text(text)
    if thread_ts:
        event["thread_ts"] = thread_ts
        event["parent_user_id"] = extra.pop("parent_user_id", user)
    event.update(extra)
    return event_callback(event, event_id=event_id)


def app_home_opened_event(
    *, user: str, channel: str = "D0FAKEHOME", tab: str = "home"
) -> dict[str, Any]:
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": channel,
        "tab": tab,
        "event_ts": f"{time.time():.6f}",
    }
    return event_callback(event)


def url_verification(
    challenge: str = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
) -> dict[str, str]:
    """The handshake Slack sends when the request URL is set."""
    return {"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"}


def _user_ref(user: str) -> dict[str, str]:
    return {"id": user, "username": user.lower(), "name": user.lower(), "team_id": TEAM_ID}


def block_actions_payload(
    *,
    user: str,
    action_id: str,
    value: str,
    channel: str,
    message_ts: str,
    trigger_id: str | None = None,
    block_id: str = "actions",
    thread_ts: str | None = None,
    action_ts: str | None = None,
    message: dict[str, Any] | None = None,
    text: str = "Approve",
    style: str | None = None,
) -> dict[str, Any]:
    """A click on a button of the message ``message_ts`` (``message``: its contents)."""
    shown = dict(message or {"type": "message", "text": "", "ts": message_ts})
    shown.setdefault("ts", message_ts)
    if thread_ts:
        shown.setdefault("thread_ts", thread_ts)
    container: dict[str, Any] = {
        "type": "message",
        "message_ts": message_ts,
        "channel_id": channel,
        "is_ephemeral": False,
    }
    if thread_ts:
        container["thread_ts"] = thread_ts
    action: dict[str, Any] = {
        "action_id": action_id,
        "block_id": block_id,
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "value": value,
        "type": "button",
        "action_ts": action_ts or f"{time.time():.6f}",
    }
    if style:
        action["style"] = style
    return {
        "type": "block_actions",
        "user": _user_ref(user),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "container": container,
        "trigger_id": trigger_id or _trigger_id(),
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": "ops"},
        "message": shown,
        "state": {"values": {}},
        "response_url": f"https://hooks.slack.com/actions/{TEAM_ID}/1/{uuid.uuid4().hex}",
        "actions": [action],
    }


def text_input_values(block_id: str, action_id: str, value: str | None) -> dict[str, Any]:
    """``view.state.values`` holding one plain_text_input (None: left empty)."""
    return {block_id: {action_id: {"type": "plain_text_input", "value": value}}}


def view_submission_payload(
    *,
    user: str,
    callback_id: str,
    private_metadata: str,
    values: dict[str, Any],
    view_id: str = "V0FAKE0001",
    trigger_id: str | None = None,
    blocks: list[dict[str, Any]] | None = None,
    title: str = "Reject tool call",
) -> dict[str, Any]:
    """The submission of a modal; ``values`` as in ``view.state.values``."""
    return {
        "type": "view_submission",
        "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
        "user": _user_ref(user),
        "api_app_id": APP_ID,
        "token": VERIFICATION_TOKEN,
        "trigger_id": trigger_id or _trigger_id(),
        "view": {
            "id": view_id,
            "team_id": TEAM_ID,
            "type": "modal",
            "blocks": blocks or [],
            "private_metadata": private_metadata,
            "callback_id": callback_id,
            "state": {"values": values},
            "hash": uuid.uuid4().hex[:20],
            "title": {"type": "plain_text", "text": title, "emoji": True},
            "clear_on_close": False,
            "notify_on_close": False,
            "close": {"type": "plain_text", "text": "Cancel", "emoji": True},
            "submit": {"type": "plain_text", "text": "Submit", "emoji": True},
            "previous_view_id": None,
            "root_view_id": view_id,
            "app_id": APP_ID,
            "external_id": "",
            "app_installed_team_id": TEAM_ID,
            "bot_id": BOT_ID,
        },
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def slash_command_payload(
    *, user: str, text: str = "", channel: str = "C0FAKE0001", command: str = "/opsloop"
) -> dict[str, str]:
    """The form fields of a slash command invocation."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": TEAM_ID,
        "team_domain": TEAM_DOMAIN,
        "channel_id": channel,
        "channel_name": "ops",
        "user_id": user,
        "user_name": user.lower(),
        "command": command,
        "text": text,
        "api_app_id": APP_ID,
        "is_enterprise_install": "false",
        "response_url": f"https://hooks.slack.com/commands/{TEAM_ID}/1/{uuid.uuid4().hex}",
        "trigger_id": _trigger_id(),
    }
