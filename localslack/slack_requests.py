"""What Slack sends to an app, shaped, encoded and signed as Slack does it.

Events API envelopes (https://docs.slack.dev/apis/events-api), interaction payloads
(https://docs.slack.dev/reference/interaction-payloads) and slash commands
(https://docs.slack.dev/interactivity/implementing-slash-commands). :func:`signed`
encodes a payload the way Slack posts it and signs it (v0: HMAC-SHA256 of
``v0:timestamp:body``, https://docs.slack.dev/authentication/verifying-requests-from-slack).

Every builder takes the workspace's :class:`~localslack.identity.Identity`: ``opsloop
local`` sends these to the Bolt app, and the tests' fake Slack builds them with its own.

Pure (but for ids and clocks): no I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from typing import Any
from urllib.parse import urlencode

from localslack.identity import Identity, bot_profile

DEFAULT_CHALLENGE = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"


# --- encoding and signing ----------------------------------------------------------------


def sign(secret: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers Slack signs a request with (v0: HMAC-SHA256 of ``v0:ts:body``)."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    digest = hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


def encode(payload: dict[str, Any]) -> tuple[bytes, str]:
    """``payload`` as Slack posts it, and its content type.

    Events and url_verification are JSON; interactions are a form with one ``payload``
    field; a slash command is a flat form.
    """
    if payload.get("type") in ("event_callback", "url_verification"):
        return json.dumps(payload).encode(), "application/json"
    if "command" in payload:
        return form_body(payload), "application/x-www-form-urlencoded"
    return form_body({"payload": json.dumps(payload)}), "application/x-www-form-urlencoded"


def signed(
    payload: dict[str, Any], secret: str, timestamp: int | None = None
) -> tuple[bytes, dict[str, str]]:
    """``payload`` encoded as Slack posts it, with signed headers and its content type."""
    body, content_type = encode(payload)
    headers = sign(secret, body, int(time.time()) if timestamp is None else timestamp)
    return body, {**headers, "Content-Type": content_type}


def form_body(fields: dict[str, Any]) -> bytes:
    return urlencode({k: "" if v is None else str(v) for k, v in fields.items()}).encode()


def new_event_id() -> str:
    return "Ev" + uuid.uuid4().hex[:10].upper()


def new_trigger_id() -> str:
    return f"{int(time.time())}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex}"


def new_action_ts() -> str:
    return f"{time.time():.6f}"


# --- events --------------------------------------------------------------------------------


def event_callback(
    identity: Identity,
    event: dict[str, Any],
    *,
    event_id: str | None = None,
    event_time: int | None = None,
    team_id: str | None = None,
) -> dict[str, Any]:
    """``event`` in the Events API envelope."""
    team = team_id or identity.team_id
    return {
        "token": identity.verification_token,
        "team_id": team,
        "context_team_id": team,
        "context_enterprise_id": None,
        "api_app_id": identity.app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id or new_event_id(),
        "event_time": int(time.time()) if event_time is None else event_time,
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team,
                "user_id": identity.bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": "4-" + uuid.uuid4().hex,
    }


def rich_text(text: str) -> list[dict[str, Any]]:
    """The ``rich_text`` block Slack's clients attach to what a person writes."""
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
    identity: Identity,
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
        "team": identity.team_id,
        "blocks": rich_text(text),
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event_callback(identity, event, event_id=event_id)


def message_event(
    identity: Identity,
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
        event["app_id"] = identity.app_id if bot_id == identity.bot_id else "A0OTHER001"
    event.update(text=text, ts=ts, team=identity.team_id, event_ts=ts, channel_type=channel_type)
    if subtype is None and bot_id is None:
        event["client_msg_id"] = str(uuid.uuid4())
        event["blocks"] = rich_text(text)
    if thread_ts:
        event["thread_ts"] = thread_ts
        event["parent_user_id"] = extra.pop("parent_user_id", user)
    event.update(extra)
    return event_callback(identity, event, event_id=event_id)


def bot_message_event(
    identity: Identity, message: dict[str, Any], *, channel: str, channel_type: str = "channel"
) -> dict[str, Any]:
    """The ``message`` event of a message the bot posted (Slack sends the app its own
    messages too; Bolt acknowledges and ignores them)."""
    event = {
        "type": "message",
        "channel": channel,
        "channel_type": channel_type,
        "event_ts": message["ts"],
        **{k: v for k, v in message.items() if k not in ("metadata", "type")},
    }
    event.setdefault("bot_profile", bot_profile(identity))
    return event_callback(identity, event)


def message_changed_event(
    identity: Identity,
    *,
    channel: str,
    message: dict[str, Any],
    previous: dict[str, Any],
    channel_type: str = "channel",
) -> dict[str, Any]:
    """The ``message_changed`` event of an edited message."""
    ts = message.get("edited", {}).get("ts") or new_action_ts()
    event = {
        "type": "message",
        "subtype": "message_changed",
        "message": {k: v for k, v in message.items() if k != "metadata"},
        "previous_message": {k: v for k, v in previous.items() if k != "metadata"},
        "channel": channel,
        "hidden": True,
        "ts": ts,
        "event_ts": ts,
        "channel_type": channel_type,
    }
    return event_callback(identity, event)


def app_home_opened_event(
    identity: Identity, *, user: str, channel: str, tab: str = "home"
) -> dict[str, Any]:
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": channel,
        "tab": tab,
        "event_ts": f"{time.time():.6f}",
    }
    return event_callback(identity, event)


def agent_session_stopped_event(
    identity: Identity,
    *,
    user: str,
    channel: str,
    thread_ts: str,
    streaming_message_ts: list[str] | tuple[str, ...] = (),
    event_ts: str | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """Someone pressed the stop button of the agent session of ``thread_ts`` (shown while
    it is ``processing``); ``streaming_message_ts``: the app's streams Slack stopped for it
    (https://docs.slack.dev/reference/events/agent_session_stopped)."""
    event = {
        "type": "agent_session_stopped",
        "user": user,
        "channel": channel,
        "thread_ts": thread_ts,
        "streaming_message_ts": list(streaming_message_ts),
        "event_ts": event_ts or new_action_ts(),
    }
    return event_callback(identity, event, event_id=event_id)


def url_verification(identity: Identity, challenge: str = DEFAULT_CHALLENGE) -> dict[str, str]:
    """The handshake Slack sends when the request URL is set."""
    return {
        "token": identity.verification_token,
        "challenge": challenge,
        "type": "url_verification",
    }


# --- interactions --------------------------------------------------------------------------


def user_ref(identity: Identity, user: str, name: str | None = None) -> dict[str, str]:
    """The ``user`` of an interaction payload."""
    name = name or user.lower()
    return {"id": user, "username": name, "name": name, "team_id": identity.team_id}


def block_actions_payload(
    identity: Identity,
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
    user_name: str | None = None,
    channel_name: str = "ops",
    response_url: str | None = None,
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
        "action_ts": action_ts or new_action_ts(),
    }
    if style:
        action["style"] = style
    hook = f"https://hooks.slack.com/actions/{identity.team_id}/1/{uuid.uuid4().hex}"
    return {
        "type": "block_actions",
        "user": user_ref(identity, user, user_name),
        "api_app_id": identity.app_id,
        "token": identity.verification_token,
        "container": container,
        "trigger_id": trigger_id or new_trigger_id(),
        "team": {"id": identity.team_id, "domain": identity.team_domain},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": channel_name},
        "message": shown,
        "state": {"values": {}},
        "response_url": response_url or hook,
        "actions": [action],
    }


def feedback_buttons_payload(
    identity: Identity,
    *,
    user: str,
    action_id: str,
    value: str,
    channel: str,
    message_ts: str,
    block_id: str = "feedback",
    text: str = "",
    **shared: Any,
) -> dict[str, Any]:
    """A click on one of the two buttons of a ``feedback_buttons`` element (in a
    ``context_actions`` block): ``value`` is that button's; otherwise a ``block_actions``
    as for any button (``shared``: :func:`block_actions_payload`'s other arguments)."""
    payload = block_actions_payload(
        identity,
        user=user,
        action_id=action_id,
        value=value,
        channel=channel,
        message_ts=message_ts,
        block_id=block_id,
        **shared,
    )
    action = payload["actions"][0]
    payload["actions"] = [
        {
            "type": "feedback_buttons",
            "action_id": action_id,
            "block_id": block_id,
            "value": value,
            "text": {"type": "plain_text", "text": text, "emoji": True},
            "action_ts": action["action_ts"],
        }
    ]
    return payload


def text_input_values(block_id: str, action_id: str, value: str | None) -> dict[str, Any]:
    """``view.state.values`` holding one plain_text_input (None: left empty)."""
    return {block_id: {action_id: {"type": "plain_text_input", "value": value}}}


def view_submission(
    identity: Identity,
    *,
    user: str,
    view: dict[str, Any],
    trigger_id: str | None = None,
    user_name: str | None = None,
) -> dict[str, Any]:
    """The submission of the modal ``view`` (as ``views.open`` answered it, its
    ``state.values`` filled in)."""
    return {
        "type": "view_submission",
        "team": {"id": identity.team_id, "domain": identity.team_domain},
        "user": user_ref(identity, user, user_name),
        "api_app_id": identity.app_id,
        "token": identity.verification_token,
        "trigger_id": trigger_id or new_trigger_id(),
        "view": view,
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }


def view_submission_payload(
    identity: Identity,
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
    """The submission of a modal built from its parts; ``values`` as in
    ``view.state.values``."""
    view = {
        "id": view_id,
        "team_id": identity.team_id,
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
        "app_id": identity.app_id,
        "external_id": "",
        "app_installed_team_id": identity.team_id,
        "bot_id": identity.bot_id,
    }
    return view_submission(identity, user=user, view=view, trigger_id=trigger_id)


def view_closed(
    identity: Identity, *, user: str, view: dict[str, Any], user_name: str | None = None
) -> dict[str, Any]:
    """A modal closed with its close button (sent only when ``notify_on_close``)."""
    return {
        "type": "view_closed",
        "team": {"id": identity.team_id, "domain": identity.team_domain},
        "user": user_ref(identity, user, user_name),
        "api_app_id": identity.app_id,
        "token": identity.verification_token,
        "view": view,
        "is_cleared": False,
        "is_enterprise_install": False,
        "enterprise": None,
    }


def slash_command_payload(
    identity: Identity,
    *,
    user: str,
    text: str = "",
    channel: str = "C0FAKE0001",
    command: str = "/opsloop",
    user_name: str | None = None,
    channel_name: str = "ops",
    trigger_id: str | None = None,
    response_url: str | None = None,
) -> dict[str, str]:
    """The form fields of a slash command invocation."""
    hook = f"https://hooks.slack.com/commands/{identity.team_id}/1/{uuid.uuid4().hex}"
    return {
        "token": identity.verification_token,
        "team_id": identity.team_id,
        "team_domain": identity.team_domain,
        "channel_id": channel,
        "channel_name": channel_name,
        "user_id": user,
        "user_name": user_name or user.lower(),
        "command": command,
        "text": text,
        "api_app_id": identity.app_id,
        "is_enterprise_install": "false",
        "response_url": response_url or hook,
        "trigger_id": trigger_id or new_trigger_id(),
    }
