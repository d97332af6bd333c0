"""Pure helpers over what Slack sends: the body's shape, thread keys, messages, clicks.

The listeners in :mod:`bot.listeners` translate; these functions read. Like bolt's
``payload_utils``, they take the request body (or one part of it) and do no I/O.

Two layers of checks, both pydantic models at the edge:

- :func:`parse_request` (HTTP only, before Bolt): the body is a JSON object (or a form)
  whose fields that Bolt itself reads have the types Bolt assumes, so that nothing a
  sender writes makes Bolt raise (and answer 500). Loose: unknown fields pass.
- :class:`Message`, :class:`Click`, :class:`Submission` (in the listeners): what a
  thread needs, with ids and timestamps bounded to the columns that store them
  (``engine/tables.py``: 64 characters), and text without lone surrogates (which JSON
  can carry and neither UTF-8 nor PostgreSQL can). What fails them is ignored.

Shapes: Events API envelopes (https://docs.slack.dev/apis/events-api), interaction
payloads (https://docs.slack.dev/reference/interaction-payloads) and slash commands.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    StringConstraints,
    ValidationError,
    model_validator,
)

from engine.inputs import Org
from engine.types import ThreadKey
from tools.output import clean_text  # the tools' answers are cleaned the same way

TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
SIGNATURE_HEADER = "X-Slack-Signature"
_DIGITS = re.compile(r"[0-9]{1,15}")
_PRINTABLE_ASCII = re.compile(r"[\x21-\x7e]*")
_DOMAIN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_URL = re.compile(r"https://[A-Za-z0-9.-]+/?")
# Message subtypes that a person writes (a reply also sent to the channel, a file with a
# comment, a /me message); every other subtype (edits, deletions, joins, bots…) is not a
# new message.
HUMAN_SUBTYPES = frozenset({"thread_broadcast", "file_share", "me_message"})

MessageKind = Literal["dm", "reply", "ignore"]


class MalformedRequest(ValueError):
    """A signed body that Bolt could not read: answered 400, one log line."""


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def verify_headers(headers: Mapping[str, str]) -> str | None:
    """Why the signature headers are malformed (a 4xx, before any HMAC), or None.

    Bolt's own check calls ``int()`` on ``X-Slack-Request-Timestamp`` and
    ``hmac.compare_digest`` on ``X-Slack-Signature``: a non-numeric timestamp raises
    ``ValueError`` and a non-ASCII signature ``TypeError``, which Bolt answers with a
    500. Missing headers pass here (the signature check refuses them).
    """
    timestamp = _header(headers, TIMESTAMP_HEADER)
    if timestamp is not None and not _DIGITS.fullmatch(timestamp):
        return f"malformed {TIMESTAMP_HEADER} header"
    signature = _header(headers, SIGNATURE_HEADER)
    if signature is not None and not _PRINTABLE_ASCII.fullmatch(signature):
        return f"malformed {SIGNATURE_HEADER} header"
    return None


# --- the body, as Bolt reads it ---------------------------------------------------------


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


_Str = str | None


class _Ref(_Loose):
    """``{"id": …}``: a team, user, channel or enterprise in an interaction payload."""

    id: _Str = None
    team_id: _Str = None
    enterprise_id: _Str = None


_RefOrId = str | _Ref | None


class _Node(_Loose):
    """Parts Bolt reads ids from: ``event``, ``event.message``, ``event.item``…"""

    type: _Str = None
    user: _RefOrId = None
    channel: _RefOrId = None
    team: _Str = None
    user_team: _Str = None
    bot_id: _Str = None
    subtype: _Str = None
    message: _Node | None = None
    previous_message: _Node | None = None
    item: _Node | None = None
    assistant_thread: _Node | None = None


class _Authorization(_Loose):
    enterprise_id: _Str = None
    team_id: _Str = None
    user_id: _Str = None
    is_enterprise_install: bool | str | None = None


class _Action(_Loose):
    action_id: str
    block_id: _Str = None
    value: _Str = None
    action_ts: _Str = None


class _State(_Loose):
    values: dict[str, dict[str, dict[str, Any]]] = {}


class _View(_Loose):
    type: Any = None  # Bolt only compares it with "workflow_step"
    id: _Str = None
    callback_id: _Str = None
    private_metadata: _Str = None
    team_id: _Str = None
    app_installed_team_id: _Str = None
    state: _State | None = None


class _ResponseUrl(_Loose):
    response_url: _Str = None


class _Envelope(_Loose):
    """The fields Bolt's context, middleware and matchers read, with their types."""

    type: _Str = None
    team_id: _Str = None
    enterprise_id: _Str = None
    event: _Node | None = None
    authorizations: list[_Authorization] | None = None
    team: _RefOrId = None
    enterprise: _RefOrId = None
    user: _RefOrId = None
    channel: _RefOrId = None
    container: _Loose | None = None
    message: _Node | None = None
    actions: list[_Action] | None = None
    view: _View | None = None
    response_urls: list[_ResponseUrl] | None = None
    callback_id: _Str = None
    action_id: _Str = None
    command: _Str = None

    @model_validator(mode="after")
    def _what_the_matchers_index(self) -> _Envelope:
        # Bolt's matchers index these without looking: body["event"]["type"],
        # body["actions"][0], body["view"]["callback_id"], body["callback_id"].
        if self.type == "event_callback" and (self.event is None or self.event.type is None):
            raise ValueError("an event_callback needs an event with a type")
        if self.type == "block_actions" and not self.actions:
            raise ValueError("block_actions needs actions")
        if self.type in ("view_submission", "view_closed") and (
            self.view is None or self.view.callback_id is None
        ):
            raise ValueError(f"{self.type} needs a view with a callback_id")
        # Bolt builds a ``step`` argument for every middleware and listener: it indexes
        # body["view"]["type"] of a submission, then body["workflow_step"] of a legacy
        # Steps from Apps edit or save (payload_utils.to_step), present or not.
        submitted = self.view if self.type == "view_submission" else None
        if submitted is not None and "type" not in submitted.model_fields_set:
            raise ValueError("view_submission needs a view with a type")
        step_save = submitted is not None and submitted.type == "workflow_step"
        step = self.type == "workflow_step_edit" or step_save
        if step and "workflow_step" not in self.model_fields_set:
            raise ValueError("a workflow step's edit or save needs a workflow_step")
        if self.type in _NEEDS_CALLBACK_ID and self.callback_id is None:
            raise ValueError(f"{self.type} needs a callback_id")
        if self.type == "block_suggestion" and self.action_id is None:
            raise ValueError("block_suggestion needs an action_id")
        return self


_NEEDS_CALLBACK_ID = frozenset(
    {"shortcut", "message_action", "dialog_submission", "dialog_cancellation", "dialog_suggestion"}
)


def parse_request(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """The body of a signed request as Bolt will parse it, checked to be one that Bolt
    can read without raising; ``MalformedRequest`` (with a short reason) if not.

    The parse mirrors ``slack_bolt.request.internals.parse_body``: JSON when the type
    says so or the body starts with ``{``, else a form whose ``payload`` field is JSON.
    """
    try:
        text = raw.decode("utf-8")
        if content_type == "application/json" or text.startswith("{"):
            body: Any = json.loads(text) if text else {}
        elif "payload" in text:
            body = json.loads(dict(parse_qsl(text, keep_blank_values=True)).get("payload", "{}"))
        else:
            body = dict(parse_qsl(text, keep_blank_values=True))
    except UnicodeDecodeError:
        raise MalformedRequest("the body is not UTF-8") from None
    except (ValueError, RecursionError):  # JSONDecodeError, or nested too deep
        raise MalformedRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise MalformedRequest(f"the body is a JSON {type(body).__name__}, not an object")
    try:
        _Envelope.model_validate(body)
    except ValidationError as exc:
        raise MalformedRequest(first_error(exc)) from None
    except RecursionError:
        raise MalformedRequest("the body is nested too deep") from None
    return body


def first_error(exc: ValidationError) -> str:
    """``event.channel: Field required`` (the first problem, one line, no input echoed)."""
    err = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in err["loc"]) or "(body)"
    return f"{where}: {err['msg']}"


# --- what a thread needs ----------------------------------------------------------------

# Ids and ts are stored in 64-character columns; Slack's are far shorter.
SlackId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Ts = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,20}\.[0-9]{1,12}$")]
Text = Annotated[str, AfterValidator(clean_text)]


class _Edge(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class MessageEvent(_Edge):
    type: str
    user: SlackId
    channel: SlackId
    ts: Ts
    thread_ts: Ts | None = None
    text: Text = ""
    team: SlackId | None = None
    channel_type: str | None = None
    subtype: str | None = None


class Message(_Edge):
    """A message event with all a thread needs: team, channel, ts and its author."""

    team_id: SlackId | None = None
    enterprise_id: SlackId | None = None
    event_id: Annotated[str, StringConstraints(max_length=64)] | None = None
    event: MessageEvent

    @model_validator(mode="after")
    def _has_a_team(self) -> Message:
        if self.team is None:
            raise ValueError("no team")
        return self

    @property
    def team(self) -> str | None:
        return self.team_id or self.event.team

    @property
    def key(self) -> ThreadKey:
        """The agent thread: (team, channel, thread root ts). The team is the workspace
        the app is installed in (the envelope's ``team_id``), not the author's team,
        which differs in shared channels."""
        return ThreadKey(str(self.team), self.event.channel, root_ts(self.event.model_dump()))

    @property
    def dedupe_key(self) -> str:
        return message_dedupe_key(self.event.model_dump())

    def source(self, names: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Where the message came from, kept on the ``user_message`` (opaque to the
        engine, but for ``enterprise``, which the team check of a click reads, and
        ``names``, the display names of the people it mentions)."""
        event = self.event
        source: dict[str, Any] = {
            "kind": "slack",
            "team": self.team,
            "enterprise": self.enterprise_id,
            "channel": event.channel,
            "ts": event.ts,
            "event_id": self.event_id,
            "event_type": event.type,
            "thread_ts": event.thread_ts,
        }
        if names:
            source["names"] = dict(names)
        return {k: v for k, v in source.items() if v is not None}


def parse_message(body: Mapping[str, Any]) -> Message | str:
    """``body`` as a :class:`Message`, or why it is not one (one line)."""
    try:
        return Message.model_validate(body)
    except ValidationError as exc:
        return first_error(exc)


_MENTION = re.compile(r"<@([UW][A-Z0-9]{1,63})(?:\|[^>]*)?>")


def mentioned_users(text: str, bot_user_id: str | None) -> list[str]:
    """The user ids ``<@U…>`` in ``text``, but the bot's, in order, once each."""
    seen = dict.fromkeys(m.group(1) for m in _MENTION.finditer(text))
    seen.pop(bot_user_id or "", None)
    return list(seen)


# --- events ------------------------------------------------------------------------------


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


# --- interactions ------------------------------------------------------------------------


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _id(value: Any) -> Any:
    """``value`` as an id: itself when a string (Bolt allows both), else its ``id``."""
    return value if isinstance(value, str) else _obj(value).get("id")


def org_of(body: Mapping[str, Any]) -> Org:
    """The organisation an interaction comes from: every team id it names (the payload's
    ``team`` and the user's ``team_id``) and its Enterprise Grid id, if any."""
    team, user = body.get("team"), _obj(body.get("user"))
    teams = tuple(str(t) for t in (_id(team), user.get("team_id")) if t)
    enterprise = _id(body.get("enterprise")) or _obj(team).get("enterprise_id")
    return Org(teams, str(enterprise) if enterprise else None)


Bounded = Annotated[str, StringConstraints(max_length=255)]


class Click(_Edge):
    """A button click (``block_actions``) reduced to what the listeners need."""

    user: SlackId
    value: Annotated[str, StringConstraints(max_length=2000)] = ""
    action_ts: Bounded
    trigger_id: Bounded = ""
    channel: SlackId | None = None
    thread_ts: Ts | None = None
    message_ts: Ts | None = None
    org: Org


def parse_click(body: Mapping[str, Any]) -> Click | str:
    """The first action of a ``block_actions`` body as a :class:`Click`, or why not."""
    actions = body.get("actions")
    action = _obj(actions[0]) if isinstance(actions, list) and actions else {}
    container, message = _obj(body.get("container")), _obj(body.get("message"))
    message_ts = container.get("message_ts") or message.get("ts")
    fields = {
        "user": _id(body.get("user")),
        "value": action.get("value") or "",
        "action_ts": action.get("action_ts"),
        "trigger_id": body.get("trigger_id") or "",
        "channel": _id(body.get("channel")) or container.get("channel_id"),
        "thread_ts": container.get("thread_ts") or message.get("thread_ts") or message_ts,
        "message_ts": message_ts,
        "org": org_of(body),
    }
    try:
        return Click.model_validate(fields)
    except ValidationError as exc:
        return first_error(exc)


class Submission(_Edge):
    """A modal submitted (``view_submission``): who, which view, what it binds to."""

    user: SlackId
    view_id: Bounded
    private_metadata: Annotated[str, StringConstraints(max_length=3000)] = ""
    org: Org


def parse_submission(body: Mapping[str, Any]) -> Submission | str:
    view = _obj(body.get("view"))
    fields = {
        "user": _id(body.get("user")),
        "view_id": view.get("id") or "",
        "private_metadata": view.get("private_metadata") or "",
        "org": org_of(body),
    }
    try:
        return Submission.model_validate(fields)
    except ValidationError as exc:
        return first_error(exc)


def view_value(view: Mapping[str, Any], block_id: str, action_id: str) -> str:
    """A text input's value in a submitted view, ``""`` when left empty."""
    values = _obj(_obj(view.get("state")).get("values"))
    value = _obj(_obj(values.get(block_id)).get(action_id)).get("value")
    return clean_text(value.strip()) if isinstance(value, str) else ""


def view_values(view: Mapping[str, Any]) -> dict[str, Any]:
    """A submitted view's ``state.values``: each input block's actions' states."""
    values = _obj(_obj(view.get("state")).get("values"))
    return {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, dict)}


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


# A thread as people name it in a command: its Slack link (to its root, or to a reply,
# which carries ``thread_ts``), or its opsloop id.
_PERMALINK = re.compile(
    r"https://[A-Za-z0-9.-]+/archives/(?P<channel>[A-Z0-9]{1,64})/p(?P<digits>[0-9]{7,20})"
    r"(?:\?(?P<query>[^\s<>|]*))?"
)
_THREAD_ID = re.compile(r"thr_[A-Za-z0-9_-]{1,60}")
_TS = re.compile(r"[0-9]{1,15}\.[0-9]{1,9}")


def thread_ref(text: str) -> str | tuple[str, str] | None:
    """The thread ``text`` names: its id (``thr_…``), or ``(channel, root ts)`` from a
    permalink (``https://team.slack.com/archives/C…/p1700000000000100``, with
    ``?thread_ts=`` when it links to a reply; Slack may send it as ``<url>`` or
    ``<url|label>``); None if it names none."""
    word = text.strip().removeprefix("<").removesuffix(">").partition("|")[0]
    if _THREAD_ID.fullmatch(word):
        return word
    link = _PERMALINK.fullmatch(word)
    if link is None:
        return None
    thread_ts = dict(parse_qsl(link["query"] or "")).get("thread_ts", "")
    if _TS.fullmatch(thread_ts):
        return link["channel"], thread_ts
    digits = link["digits"]
    return link["channel"], f"{digits[:-6]}.{digits[-6:]}"


def command_org(command: Mapping[str, Any]) -> Org:
    """The organisation a slash command comes from: its team, and its Grid, if any."""
    team, enterprise = command.get("team_id"), command.get("enterprise_id")
    teams = (str(team),) if team else ()
    return Org(teams, str(enterprise) if enterprise else None)
