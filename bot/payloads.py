"""Pure helpers over what Slack sends: header checks, thread keys, message kinds, clicks.

The listeners in :mod:`bot.app` translate; these functions read. Like bolt's
``payload_utils``, they take the request body (or one part of it) and do no I/O.

Shapes: Events API envelopes (https://docs.slack.dev/apis/events-api), interaction
payloads (https://docs.slack.dev/reference/interaction-payloads) and slash commands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine.store import ThreadKey

TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
SIGNATURE_HEADER = "X-Slack-Signature"
_DIGITS = re.compile(r"[0-9]{1,15}")
_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]*")
_DOMAIN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_URL = re.compile(r"https://[A-Za-z0-9.-]+/?")
# Message subtypes that a person writes (a reply also sent to the channel, a file with a
# comment); every other subtype (edits, deletions, joins, bots…) is not a new message.
HUMAN_SUBTYPES = frozenset({"thread_broadcast", "file_share"})

MessageKind = Literal["dm", "reply", "ignore"]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def verify_headers(headers: Mapping[str, str]) -> str | None:
    """Why a request must be refused before Bolt sees it, or None.

    Bolt's signature check calls ``int()`` on ``X-Slack-Request-Timestamp`` and
    ``hmac.compare_digest`` on ``X-Slack-Signature``: a non-numeric timestamp raises
    ``ValueError`` and a non-ASCII signature ``TypeError``, which Bolt answers with a
    500 (and Slack would retry a 500). This catches both so the caller answers a 4xx.
    Missing headers pass: Bolt answers those with its own 401.
    """
    timestamp = _header(headers, TIMESTAMP_HEADER)
    if timestamp is not None and not _DIGITS.fullmatch(timestamp):
        return f"malformed {TIMESTAMP_HEADER} header"
    signature = _header(headers, SIGNATURE_HEADER)
    if signature is not None and not _PRINTABLE_ASCII.fullmatch(signature):
        return f"malformed {SIGNATURE_HEADER} header"
    return None


# --- events ------------------------------------------------------------------------------


def thread_key(body: Mapping[str, Any]) -> ThreadKey:
    """The agent thread an event belongs to: (team, channel, thread root ts).

    The team is the workspace the app is installed in (the envelope's ``team_id``), not
    the author's team, which differs in shared channels.
    """
    event = body.get("event") or {}
    team = body.get("team_id") or event.get("team") or ""
    return ThreadKey(str(team), str(event.get("channel", "")), root_ts(event))


def root_ts(event: Mapping[str, Any]) -> str:
    """The ts of the thread's first message: ``thread_ts`` in a thread, else ``ts``."""
    return str(event.get("thread_ts") or event.get("ts") or "")


def is_thread_reply(event: Mapping[str, Any]) -> bool:
    """A message inside a thread (not the thread's root message)."""
    thread_ts = event.get("thread_ts")
    return bool(thread_ts) and thread_ts != event.get("ts")


def is_from_a_person(event: Mapping[str, Any], bot_user_id: str | None = None) -> bool:
    """Written by a human: a user, no ``bot_id``, no subtype but those people write, and
    not by this bot."""
    user = event.get("user")
    if not user or event.get("bot_id") or event.get("bot_profile"):
        return False
    if bot_user_id and user == bot_user_id:
        return False
    subtype = event.get("subtype")
    return subtype is None or subtype in HUMAN_SUBTYPES


def message_kind(event: Mapping[str, Any], bot_user_id: str | None = None) -> MessageKind:
    """What a ``message`` event is to opsloop.

    ``dm``: a person wrote to the bot directly (a new thread, or a reply in one);
    ``reply``: a person replied in a channel thread (ours or not: the caller checks);
    ``ignore``: anything else (edits, deletions, joins, bots, top-level channel chatter).
    """
    if event.get("type") != "message" or not is_from_a_person(event, bot_user_id):
        return "ignore"
    if event.get("channel_type") == "im":
        return "dm"
    if is_thread_reply(event):
        return "reply"
    return "ignore"


def mention_text(text: str | None, bot_user_id: str | None) -> str:
    """``text`` without the bot's mention(s), ``<@U…>`` or ``<@U…|name>``, trimmed.

    Other mentions and Slack's escaping stay as written (the log keeps what was said).
    """
    text = text or ""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    text = re.sub(r"[ \t]{2,}", " ", text)
    return text.strip()


def message_dedupe_key(event: Mapping[str, Any]) -> str:
    """One key for one Slack message, whichever event delivers it: a mention in a thread
    arrives as ``app_mention`` and as ``message`` with different event ids."""
    return f"msg:{event.get('channel', '')}:{event.get('ts', '')}"


def message_source(body: Mapping[str, Any]) -> dict[str, Any]:
    """Where a message came from, kept on the ``user_message`` event (opaque to the
    engine)."""
    event = body.get("event") or {}
    source: dict[str, Any] = {
        "kind": "slack",
        "team": body.get("team_id") or event.get("team"),
        "channel": event.get("channel"),
        "ts": event.get("ts"),
        "event_id": body.get("event_id"),
        "event_type": event.get("type"),
    }
    if event.get("thread_ts"):
        source["thread_ts"] = event["thread_ts"]
    return {k: v for k, v in source.items() if v is not None}


# --- interactions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Click:
    """A button click (``block_actions``) reduced to what the listeners need."""

    user: str
    value: str
    action_ts: str
    trigger_id: str
    channel: str | None
    thread_ts: str | None
    message_ts: str | None


def click(body: Mapping[str, Any], action: Mapping[str, Any]) -> Click:
    container = body.get("container") or {}
    message = body.get("message") or {}
    channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
    message_ts = container.get("message_ts") or message.get("ts")
    thread_ts = container.get("thread_ts") or message.get("thread_ts") or message_ts
    return Click(
        user=str((body.get("user") or {}).get("id", "")),
        value=str(action.get("value") or ""),
        action_ts=str(action.get("action_ts") or ""),
        trigger_id=str(body.get("trigger_id") or ""),
        channel=channel,
        thread_ts=thread_ts,
        message_ts=message_ts,
    )


def view_value(view: Mapping[str, Any], block_id: str, action_id: str) -> str:
    """A text input's value in a submitted view, ``""`` when left empty."""
    values = (view.get("state") or {}).get("values") or {}
    value = ((values.get(block_id) or {}).get(action_id) or {}).get("value")
    return value.strip() if isinstance(value, str) else ""


# --- links -------------------------------------------------------------------------------


def permalink(workspace_url: str | None, channel: str, ts: str) -> str | None:
    """The web link to message ``ts`` (``https://team.slack.com/archives/C…/p…``), when
    the workspace URL is known."""
    if not workspace_url or not _URL.fullmatch(workspace_url) or not channel or not ts:
        return None
    if not re.fullmatch(r"[A-Z0-9]+", channel) or not re.fullmatch(r"[0-9]+\.[0-9]+", ts):
        return None
    return f"{workspace_url.rstrip('/')}/archives/{channel}/p{ts.replace('.', '')}"


def workspace_url(team_domain: str | None) -> str | None:
    """``https://DOMAIN.slack.com/`` for a workspace's domain (as a slash command or a
    click carries it); None if absent or not a domain."""
    if not team_domain or not _DOMAIN.fullmatch(team_domain):
        return None
    return f"https://{team_domain}.slack.com/"
