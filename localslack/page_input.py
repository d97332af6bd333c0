"""What people do in the page, read and checked: request bodies, typed text, clicks, forms.

Each helper does what Slack's client does before anything reaches the app: a message
is escaped and its mentions become tokens, a click is matched to a button of the
message, a modal's inputs are checked (required, length) and shaped as
``view.state.values``. Bad input is a :class:`BadRequest`: one line, a 4xx.

Pure (but for reading a request body): no other I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localslack.identity import Person
from localslack.workspace import Workspace

_NAME = re.compile(r"(?<![\w@<&])@([A-Za-z][A-Za-z0-9._-]*)")
_CHANNEL = re.compile(r"(?<![\w#<&])#([a-z0-9][a-z0-9_-]*)")


class BadRequest(Exception):
    """Refused input: ``str(exc)`` is the one-line reason, ``status`` the HTTP 4xx."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# --- request bodies --------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)
    user: str = Field(min_length=1, max_length=64)


class PostMessage(_Body):
    channel: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1)
    thread_ts: str | None = Field(default=None, max_length=32)


class Click(_Body):
    channel: str = Field(min_length=1, max_length=64)
    message_ts: str = Field(min_length=1, max_length=32)
    action_id: str = Field(min_length=1, max_length=255)
    block_id: str | None = Field(default=None, max_length=255)
    # Which of a feedback_buttons element's two: "positive" or "negative".
    value: str | None = Field(default=None, max_length=16)


class StopAgent(_Body):
    channel: str = Field(min_length=1, max_length=64)
    thread_ts: str = Field(min_length=1, max_length=32)


class Submit(_Body):
    # A text input's text or a select's chosen value; the ticked values of checkboxes.
    values: dict[str, dict[str, str | list[str] | None]] = Field(default_factory=dict)


class UserOnly(_Body):
    pass


_B = TypeVar("_B", bound=_Body)


async def parse(request: web.Request, model: type[_B]) -> _B:
    """The JSON body as ``model``; ``BadRequest`` naming the first problem."""
    try:
        raw = await request.read()
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadRequest(f"{where}: {first.get('msg', 'invalid')}") from None


# --- what Slack's client does ----------------------------------------------------------


def person_text(text: str, workspace: Workspace, people: Iterable[Person]) -> str:
    """What a person typed, as Slack's client sends it: ``&``, ``<`` and ``>`` escaped,
    ``@name`` of a person or the bot as ``<@U…>``, ``@handle`` of a user group as
    ``<!subteam^S…>``, ``@here`` / ``@channel`` and ``#channel`` as their tokens."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    identity = workspace.identity
    names = {p.name.lower(): f"<@{p.id}>" for p in people}
    names[identity.bot_name.lower()] = f"<@{identity.bot_user_id}>"
    names.update({group_handle(g).lower(): f"<!subteam^{g}>" for g in workspace.usergroups})
    names.update({"here": "<!here>", "channel": "<!channel>", "everyone": "<!everyone>"})

    def to_mention(match: re.Match[str]) -> str:
        name = match.group(1).rstrip(".-")
        token = names.get(name.lower())
        return token + match.group(1)[len(name) :] if token else match.group(0)

    channels = {c.name: c.id for c in workspace.channels.values() if not c.is_im}

    def to_channel(match: re.Match[str]) -> str:
        cid = channels.get(match.group(1))
        return f"<#{cid}|{match.group(1)}>" if cid else match.group(0)

    return _CHANNEL.sub(to_channel, _NAME.sub(to_mention, escaped))


def group_handle(group_id: str) -> str:
    return group_id.removeprefix("S0").lower() or group_id.lower()


def find_element(
    blocks: list[Any], action_id: str, block_id: str | None = None
) -> tuple[str, dict[str, Any]] | None:
    """The button ``action_id`` (in block ``block_id`` if given) and its block's id: a
    button of an ``actions`` block or an accessory, or the ``feedback_buttons`` of a
    ``context_actions`` block."""
    for i, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        bid = str(block.get("block_id") or f"b{i}")
        if block_id is not None and bid != block_id:
            continue
        kind = block.get("type")
        elements = list(block.get("elements") or []) if kind in _BUTTON_ROWS else []
        if isinstance(block.get("accessory"), dict):
            elements.append(block["accessory"])
        for element in elements:
            if (
                isinstance(element, dict)
                and element.get("type") in _BUTTONS
                and element.get("action_id") == action_id
            ):
                return bid, element
    return None


_BUTTON_ROWS = ("actions", "context_actions")
_BUTTONS = ("button", "feedback_buttons")


def feedback_button(element: dict[str, Any], which: str | None) -> dict[str, Any]:
    """The clicked one of a ``feedback_buttons`` element's two buttons."""
    if which not in ("positive", "negative"):
        raise BadRequest("say which feedback button: value positive or negative")
    button = element.get(f"{which}_button")
    if not isinstance(button, dict):
        raise BadRequest(f"no {which} button on that message", 404)
    return button


_INPUTS = ("plain_text_input", "static_select", "checkboxes")


def view_state(
    view: dict[str, Any], given: dict[str, dict[str, str | list[str] | None]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``view.state.values`` from what the person typed, chose or ticked, and the errors
    Slack's client would show before sending (a required field empty, a text too long or
    short). A choice the input does not offer is a :class:`BadRequest`."""
    values: dict[str, Any] = {}
    errors: dict[str, str] = {}
    known = set()
    for block in view.get("blocks") or []:
        if not isinstance(block, dict) or block.get("type") != "input":
            continue
        element = block.get("element") or {}
        block_id, action_id = block.get("block_id"), element.get("action_id")
        if not block_id or not action_id or element.get("type") not in _INPUTS:
            continue
        known.add(block_id)
        value = (given.get(block_id) or {}).get(action_id)
        value = value if value else None
        if value is None and not block.get("optional"):
            errors[block_id] = "Please complete this required field."
        if element["type"] != "plain_text_input":
            values[block_id] = {action_id: _chosen(element, block_id, value)}
            continue
        if isinstance(value, list):
            raise BadRequest(f"{block_id}: a text input takes a text")
        if value is not None and len(value) > int(element.get("max_length") or 3000):
            errors[block_id] = f"Please use at most {element.get('max_length') or 3000} characters."
        elif value is not None and len(value) < int(element.get("min_length") or 0):
            errors[block_id] = f"Please use at least {element['min_length']} characters."
        values[block_id] = {action_id: {"type": "plain_text_input", "value": value}}
    unknown = sorted(set(given) - known)
    if unknown:
        raise BadRequest(f"the modal has no input {unknown[0]!r}")
    return values, errors


def _chosen(
    element: dict[str, Any], block_id: str, value: str | list[str] | None
) -> dict[str, Any]:
    """A select's or checkboxes' state: the options chosen, as Slack sends them back."""
    options = {o.get("value"): o for o in element.get("options") or [] if isinstance(o, dict)}
    picked = [] if value is None else [value] if isinstance(value, str) else value
    unknown = [v for v in picked if v not in options]
    if unknown:
        raise BadRequest(f"{block_id}: no option {unknown[0]!r}")
    if element["type"] == "static_select":
        if len(picked) > 1:
            raise BadRequest(f"{block_id}: a select takes one option")
        return {"type": "static_select", "selected_option": options[picked[0]] if picked else None}
    return {"type": "checkboxes", "selected_options": [options[v] for v in picked]}
