"""The Slack Web API methods the bot uses, answered as Slack answers them, over a workspace.

Requests come as slack_sdk sends them (query parameters, form fields or JSON; the token
in an ``Authorization: Bearer`` header or a ``token`` field); answers are
``{"ok": true, ...}`` or ``{"ok": false, "error": ...}`` with HTTP 200, as Slack gives
them (https://docs.slack.dev/reference/methods); the agent surfaces' methods (loading
status, streams, agent sessions) are :mod:`localslack.agent_api`'s. Mount it with
:meth:`WebApi.add_routes` and point the bot's ``SLACK_API_URL``
(``AsyncWebClient(base_url=…)``) at ``/api/``.

Subclasses hook in at :meth:`WebApi.serve` (each call, parsed) and
:meth:`WebApi.intercept` (an answer before the method runs): the tests' fake Slack
records calls and injects rate limits and failures there. :meth:`WebApi.settle` runs
after a method changed the workspace and before the client hears back: ``opsloop
local`` saves the workspace there, so what Slack said it did is never lost.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from aiohttp import web

from localslack.agent_api import AgentApi
from localslack.api_checks import ApiError, check_blocks, required
from localslack.identity import bot_message
from localslack.workspace import TriggerError, Workspace

BOT_SCOPES = (
    "app_mentions:read,channels:history,chat:write,commands,groups:history,"
    "im:history,usergroups:read,users:read,users:read.email"
)
API_PREFIX = "/api/"
_TRUE = (True, 1, "1", "true", "True")
_JSON_FIELDS = ("blocks", "metadata", "view", "attachments", "chunks", "loading_messages")


class Call(NamedTuple):
    """One request: the API method, its parameters (query, form or JSON body merged;
    JSON-encoded form fields such as ``blocks`` decoded) and its headers."""

    method: str
    params: dict[str, Any]
    headers: dict[str, str]


Handler = Callable[[dict[str, Any]], dict[str, Any]]


class WebApi:
    """The Web API of ``workspace`` for the bot token ``token``."""

    def __init__(self, workspace: Workspace, *, token: str) -> None:
        self.workspace = workspace
        self.token = token
        self.handlers: dict[str, Handler] = {
            "auth.test": self.auth_test,
            "chat.postMessage": self.post_message,
            "chat.update": self.update,
            "chat.postEphemeral": self.post_ephemeral,
            "chat.getPermalink": self.permalink,
            "views.open": self.views_open,
            "views.update": self.views_update,
            "views.publish": self.views_publish,
            "conversations.replies": self.replies,
            "conversations.history": self.history,
            "users.info": self.users_info,
            "users.lookupByEmail": self.lookup_by_email,
            "usergroups.users.list": self.usergroup_users,
        }
        self.handlers.update(AgentApi(workspace).handlers)

    @property
    def identity(self) -> Any:
        return self.workspace.identity

    def add_routes(self, app: web.Application, prefix: str = API_PREFIX) -> None:
        app.router.add_route("*", prefix + "{method}", self.handle)

    # --- the HTTP side ------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        try:
            params = await read_params(request)
        except ApiError as exc:
            return json_answer({"ok": False, "error": exc.error})
        return await self.serve(Call(method, params, dict(request.headers)))

    async def serve(self, call: Call) -> web.Response:
        """Answer ``call``; the workspace is settled (saved) before the answer leaves."""
        version = self.workspace.version
        response = self.answer(call.method, call.params, _bearer(call.headers))
        if self.workspace.version != version:
            await self.settle()
        return response

    async def settle(self) -> None:
        """Called when a method changed the workspace, before its answer is sent."""

    def intercept(self, method: str) -> web.Response | None:
        """An answer to give instead of running ``method`` (after the token check)."""
        return None

    def expected_token(self, method: str) -> str:
        return self.token

    def answer(self, method: str, params: dict[str, Any], auth: str | None) -> web.Response:
        handler = self.handlers.get(method)
        if handler is None:
            return json_answer({"ok": False, "error": "unknown_method", "req_method": method})
        token = auth or params.get("token")
        if not token:
            return json_answer({"ok": False, "error": "not_authed"})
        if token != self.expected_token(method):
            return json_answer({"ok": False, "error": "invalid_auth"})
        early = self.intercept(method)
        if early is not None:
            return early
        try:
            body = handler(params)
        except ApiError as exc:
            return json_answer({"ok": False, "error": exc.error, **exc.extra})
        headers = {"x-oauth-scopes": BOT_SCOPES} if method == "auth.test" else None
        return json_answer({"ok": True, **body}, headers=headers)

    # --- the methods --------------------------------------------------------------------

    def auth_test(self, _params: dict[str, Any]) -> dict[str, Any]:
        i = self.identity
        return {
            "url": i.url,
            "team": i.team_name,
            "user": i.bot_name,
            "team_id": i.team_id,
            "user_id": i.bot_user_id,
            "bot_id": i.bot_id,
            "is_enterprise_install": False,
        }

    def _channel(self, p: dict[str, Any]) -> str:
        channel = required(p, "channel", "channel_not_found")
        if self.workspace.channel(channel) is None:
            raise ApiError("channel_not_found")
        return channel

    def post_message(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(p)
        if not (p.get("text") or p.get("blocks") or p.get("attachments")):
            raise ApiError("no_text")
        check_blocks(p.get("blocks"))
        message = bot_message(self.identity, self.workspace.next_ts(), p.get("text", ""))
        for key in ("blocks", "metadata", "thread_ts"):
            if p.get(key):
                message[key] = p[key]
        self.workspace.add_message(channel, message)
        return {"channel": channel, "ts": message["ts"], "message": dict(message)}

    def update(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = required(p, "channel", "channel_not_found")
        message = self.workspace.find(channel, p.get("ts"))
        if message is None:
            raise ApiError("message_not_found")
        if message.get("bot_id") != self.identity.bot_id:
            raise ApiError("cant_update_message")
        stream = self.workspace.stream(channel, message["ts"])
        if stream is not None and stream["state"] == "streaming":
            raise ApiError("streaming_state_conflict")  # a stream is appended to, not edited
        if not (p.get("text") or p.get("blocks") or message.get("text")):
            raise ApiError("no_text")
        check_blocks(p.get("blocks"))
        previous = copy.deepcopy(message)
        for key in ("text", "blocks", "metadata"):
            if key in p:
                message[key] = p[key]
        message["edited"] = {"user": self.identity.bot_user_id, "ts": self.workspace.next_ts()}
        self.workspace.changed(channel, message, previous)
        return {
            "channel": channel,
            "ts": message["ts"],
            "text": message["text"],
            "message": message,
        }

    def post_ephemeral(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(p)
        user = required(p, "user", "user_not_found")
        if not self.workspace.open_world:
            if self.workspace.user(user) is None:
                raise ApiError("user_not_found")
            if not self.workspace.can_see(user, channel):
                raise ApiError("user_not_in_channel")
        if not (p.get("text") or p.get("blocks")):
            raise ApiError("no_text")
        check_blocks(p.get("blocks"))
        ts = self.workspace.next_ts()
        record = {k: v for k, v in p.items() if k != "token"}
        self.workspace.add_ephemeral({**record, "channel": channel, "user": user, "message_ts": ts})
        return {"message_ts": ts}

    def views_open(self, p: dict[str, Any]) -> dict[str, Any]:
        trigger = required(p, "trigger_id", "invalid_arguments")
        view = p.get("view")
        if not isinstance(view, dict) or view.get("type") not in ("modal", "home"):
            raise ApiError("invalid_arguments")
        check_view(view)
        try:
            user = self.workspace.exchange_trigger(trigger)
        except TriggerError as exc:
            raise ApiError(exc.error) from None
        view_id = self.workspace.next_view_id()
        i = self.identity
        opened = {
            "id": view_id,
            "team_id": i.team_id,
            "app_id": i.app_id,
            "bot_id": i.bot_id,
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
        self.workspace.open_view(trigger, opened, user)
        return {"view": opened}

    def views_update(self, p: dict[str, Any]) -> dict[str, Any]:
        view_id = required(p, "view_id", "not_found")
        record = self.workspace.open_view_record(view_id)
        if record is None:
            raise ApiError("not_found")
        view = p.get("view")
        if not isinstance(view, dict) or view.get("type") != "modal":
            raise ApiError("invalid_arguments")
        check_view(view)
        if p.get("hash") and p["hash"] != record["view"].get("hash"):
            raise ApiError("hash_conflict")
        updated = {**record["view"], **view, "hash": uuid.uuid4().hex[:20]}
        self.workspace.update_view(view_id, updated)
        return {"view": updated}

    def views_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        user = required(p, "user_id", "invalid_arguments")
        view = p.get("view")
        if not isinstance(view, dict) or view.get("type") != "home":
            raise ApiError("invalid_arguments")
        if not 0 < len(view.get("blocks") or []) <= 100:
            raise ApiError("invalid_arguments")
        check_blocks(view.get("blocks"))
        if self.workspace.user(user) is None:
            raise ApiError("user_not_found")
        i = self.identity
        published = {"id": self.workspace.next_view_id(), "team_id": i.team_id, "app_id": i.app_id}
        published.update(view)
        self.workspace.publish_home(user, published)
        return {"view": published}

    def replies(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = required(p, "channel", "channel_not_found")
        ws = self.workspace
        if channel not in ws.messages and (ws.open_world or ws.channel(channel) is None):
            raise ApiError("channel_not_found")
        found = ws.find(channel, p.get("ts"))
        if found is None:
            raise ApiError("thread_not_found")
        root = found.get("thread_ts", found["ts"])  # a reply's ts reads its whole thread
        thread = ws.thread(channel, root)
        start = decode_cursor(p.get("cursor"))
        try:
            limit = max(1, int(p.get("limit") or 1000))
        except (TypeError, ValueError):
            raise ApiError("invalid_limit") from None
        page = thread[start : start + limit]
        with_metadata = p.get("include_all_metadata") in _TRUE
        messages = []
        for m in page:
            shown = {k: v for k, v in m.items() if k != "metadata" or with_metadata}
            if m["ts"] == root:
                shown.update(ws.replies_summary(channel, m))
            else:
                shown["parent_user_id"] = thread[0].get("user", "")
            messages.append(shown)
        more = start + limit < len(thread)
        cursor = encode_cursor(start + limit) if more else ""
        return {
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": cursor},
        }

    def history(self, p: dict[str, Any]) -> dict[str, Any]:
        """A channel's top-level messages, newest first, from ``oldest`` (exclusive)."""
        channel = self._channel(p)
        ws = self.workspace
        try:
            oldest = float(p.get("oldest") or 0)
            limit = max(1, min(1000, int(p.get("limit") or 100)))
        except (TypeError, ValueError):
            raise ApiError("invalid_arguments") from None
        top = [
            m
            for m in ws.messages.get(channel, [])
            if m.get("thread_ts", m["ts"]) == m["ts"] and float(m["ts"]) > oldest
        ]
        top.reverse()
        start = decode_cursor(p.get("cursor"))
        page = top[start : start + limit]
        with_metadata = p.get("include_all_metadata") in _TRUE
        messages = [{k: v for k, v in m.items() if k != "metadata" or with_metadata} for m in page]
        more = start + limit < len(top)
        return {
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": encode_cursor(start + limit) if more else ""},
        }

    def permalink(self, p: dict[str, Any]) -> dict[str, Any]:
        """The web link to a message; a reply's opens its thread (as Slack's does)."""
        channel = self._channel(p)
        message = self.workspace.find(channel, p.get("message_ts"))
        if message is None:
            raise ApiError("message_not_found")
        link = f"{self.identity.url}archives/{channel}/p{message['ts'].replace('.', '')}"
        root = message.get("thread_ts")
        if root and root != message["ts"]:
            link += f"?thread_ts={root}&cid={channel}"
        return {"channel": channel, "permalink": link}

    def users_info(self, p: dict[str, Any]) -> dict[str, Any]:
        user_id = required(p, "user", "user_not_found")
        user = self.workspace.user(user_id)
        if user is None:
            raise ApiError("user_not_found")
        return {"user": user}

    def lookup_by_email(self, p: dict[str, Any]) -> dict[str, Any]:
        """The user whose ``profile.email`` it is (``oncall:`` approvers are found so)."""
        email = required(p, "email", "invalid_arguments").lower()
        for user in self.workspace.users.values():
            if str(user.get("profile", {}).get("email") or "").lower() == email:
                return {"user": user}
        raise ApiError("users_not_found")

    def usergroup_users(self, p: dict[str, Any]) -> dict[str, Any]:
        group = required(p, "usergroup", "invalid_arguments")
        if group not in self.workspace.usergroups:
            raise ApiError("no_such_subteam")
        return {"users": list(self.workspace.usergroups[group])}


# --- request parsing and checks ----------------------------------------------------------


def _bearer(headers: dict[str, str]) -> str | None:
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    return auth.removeprefix("Bearer ").strip() if auth else None


async def read_params(request: web.Request) -> dict[str, Any]:
    """Query, form and JSON parameters merged, the way Slack reads them."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise ApiError("invalid_json") from None
        if isinstance(body, dict):
            params.update(body)
    elif request.can_read_body:
        try:
            form = await request.post()
        except (ValueError, UnicodeDecodeError):
            raise ApiError("invalid_form_data") from None
        params.update({k: v for k, v in form.items() if isinstance(v, str)})
    for key in _JSON_FIELDS:
        if isinstance(params.get(key), str) and params[key]:
            try:
                params[key] = json.loads(params[key])
            except ValueError:
                pass  # left as sent: the method rejects it
    return params


def check_view(view: dict[str, Any]) -> None:
    """A modal's title and blocks within Slack's limits (``invalid_arguments``)."""
    if view.get("type") != "modal":
        return
    raw_title = view.get("title")
    title: dict[str, Any] = raw_title if isinstance(raw_title, dict) else {}
    if not 0 < len(str(title.get("text", ""))) <= 24:
        raise ApiError("invalid_arguments")
    blocks = view.get("blocks")
    if not isinstance(blocks, list) or not 0 < len(blocks) <= 100:
        raise ApiError("invalid_arguments")


def json_answer(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def encode_cursor(offset: int) -> str:
    return base64.b64encode(f"offset:{offset}".encode()).decode()


def decode_cursor(cursor: Any) -> int:
    if not cursor:
        return 0
    try:
        return max(0, int(base64.b64decode(str(cursor)).decode().removeprefix("offset:")))
    except ValueError as exc:
        raise ApiError("invalid_cursor") from exc
