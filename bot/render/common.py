"""What the renderers share: block builders, the binding of a button or modal to one
pending call, and the escaped names of tools and people.

Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from bot import mrkdwn as md
from bot.limits import (
    MAX_BUTTON_TEXT,
    MAX_BUTTON_VALUE,
    MAX_CONFIRM,
    MAX_CONTEXT_ELEMENTS,
    MAX_FIELD_TEXT,
    MAX_HEADER_TEXT,
    MAX_TEXT,
    Block,
)
from bot.mrkdwn import escape, inline_code, mention, truncate
from bot.render.readable import same_words, tool_title
from engine.reviewers import ReviewerRule

LINE_EXCERPT = 300  # a compact line shows this much of arguments, outputs, errors
CARD_ARGUMENTS = 2800
MAX_NAMED = 20  # approvers (or voters) named on a card; the rest are counted

People = frozenset[str]  # the Slack user ids of a thread's people: named as mentions


class CallLike(Protocol):
    """A ``tool_call_requested`` event or a ``PendingCall``."""

    @property
    def tool_call_id(self) -> str: ...
    @property
    def intent(self) -> str: ...
    @property
    def arguments(self) -> dict[str, Any]: ...
    @property
    def reviewers(self) -> ReviewerRule | None: ...


class Binding(NamedTuple):
    """What a button or modal is about: exactly one pending call of one thread."""

    thread_id: str
    tool_call_id: str
    arguments_hash: str


def binding_value(thread_id: str, tool_call_id: str, arguments_hash: str) -> str:
    """Compact JSON ``{"t", "c", "h"}`` for a button value or a modal's metadata."""
    value = json.dumps(
        {"t": thread_id, "c": tool_call_id, "h": arguments_hash}, separators=(",", ":")
    )
    if len(value) > MAX_BUTTON_VALUE:
        raise ValueError(f"ids too long for a button value ({len(value)} characters)")
    return value


def parse_binding(value: str | None) -> Binding:
    """The binding in a click's ``value``; ``ValueError`` if malformed or forged."""
    try:
        data = json.loads(value or "")
    except ValueError as exc:
        raise ValueError("not a binding: not JSON") from exc
    if not isinstance(data, dict) or set(data) != {"t", "c", "h"}:
        raise ValueError("not a binding: wrong keys")
    if not all(isinstance(data[k], str) and data[k] for k in ("t", "c", "h")):
        raise ValueError("not a binding: empty or non-string ids")
    return Binding(data["t"], data["c"], data["h"])


# --- block builders ---------------------------------------------------------------------


def plain(text: str, limit: int = MAX_TEXT) -> dict[str, Any]:
    """plain_text, escaped too: Slack decodes the three entities everywhere."""
    return {"type": "plain_text", "text": truncate(escape(text), limit) or " ", "emoji": True}


def mrkdwn(text: str, limit: int = MAX_TEXT) -> dict[str, Any]:
    """mrkdwn from text that is already escaped (or ours)."""
    return {"type": "mrkdwn", "text": truncate(text, limit) or " "}


def section(text: str, **extra: Any) -> Block:
    return {"type": "section", "text": mrkdwn(text), **extra}


def context(*texts: str) -> Block:
    return {"type": "context", "elements": [mrkdwn(t) for t in texts[:MAX_CONTEXT_ELEMENTS]]}


def header(text: str) -> Block:
    return {"type": "header", "text": plain(text, MAX_HEADER_TEXT)}


def confirm(title: str, text: str, yes: str, no: str, style: str) -> dict[str, Any]:
    return {
        "title": plain(title, MAX_CONFIRM["title"]),
        "text": mrkdwn(text, MAX_CONFIRM["text"]),
        "confirm": plain(yes, MAX_CONFIRM["confirm"]),
        "deny": plain(no, MAX_CONFIRM["deny"]),
        "style": style,
    }


def button(
    text: str, action_id: str, value: str, style: str | None, **extra: Any
) -> dict[str, Any]:
    """A button; ``style`` None is Slack's default (neither primary nor danger)."""
    return {
        "type": "button",
        "text": plain(text, MAX_BUTTON_TEXT),
        "action_id": action_id,
        "value": value,
        **({"style": style} if style else {}),
        **extra,
    }


# --- texts ------------------------------------------------------------------------------


def excerpt(value: Any, limit: int = LINE_EXCERPT) -> str:
    """``value`` as escaped one-line inline code, at most ``limit`` characters of it."""
    text = value if isinstance(value, str) else md.compact_json(value)
    return inline_code(truncate(md.one_line(text), limit))


def short(text: str, limit: int = LINE_EXCERPT) -> str:
    """Escaped one-line excerpt of a free text (an error, a reason)."""
    return truncate(md.fence_safe(escape(md.one_line(text))), limit)


def tool(name: str, limit: int = 100) -> str:
    """A tool name in bold: escaped, on one line, ``*`` and backticks neutralised."""
    flat = escape(md.one_line(name)).replace("*", "∗").replace("`", "ˋ")
    return f"*{truncate(flat, limit)}*"


def titled(name: str, limit: int = 100) -> str:
    """A tool as people call it, in bold: its title, or its name as words
    (``mcp__catalog__scale_service`` → *Scale service*)."""
    return tool(tool_title(name), limit)


def trace(thread_id: str) -> str:
    """The command that prints the thread's whole log."""
    return inline_code(f"opsloop trace {thread_id}")


def approver_text(approver: str) -> str:
    """One approver list entry as mrkdwn: a mention, a group mention, or the on-call."""
    if approver.startswith("oncall:"):
        return f"whoever is on call ({escape(approver.removeprefix('oncall:'))})"
    if md.GROUP_ID.match(approver):
        return md.group_mention(approver)
    return mention(approver)


def people_text(ids: Sequence[str | None], limit: int = MAX_NAMED) -> str:
    """ "@alice, @bob and 3 more": approvers or voters, at most ``limit`` named."""
    named = [approver_text(i) if i else mention(i) for i in ids[:limit]]
    more = len(ids) - len(named)
    if more:
        named.append(f"{more} more")
    if len(named) <= 2:
        return " and ".join(named)
    return f"{', '.join(named[:-1])} and {named[-1]}"


# --- what both cards show of a call -----------------------------------------------------


def call_fields(requester: str | None, call: CallLike) -> Block:
    """Who asked for the call, and its tool, side by side: the tool's title, and the
    name the policy's rules match when the title is more than that name as words."""
    title = tool_title(call.intent)
    name = "" if same_words(call.intent, title) else f"\n{inline_code(call.intent)}"
    return {
        "type": "section",
        "fields": [
            mrkdwn(f"*Requested by*\n{mention(requester)}", MAX_FIELD_TEXT),
            mrkdwn(f"*Tool*\n{tool(title)}{name}", MAX_FIELD_TEXT),
        ],
    }


def arguments_section(call: CallLike, thread_id: str) -> Block:
    """The call's arguments as pretty JSON, cut with a pointer to the trace."""
    label = "*Arguments*\n"
    arguments = md.code_block(
        md.pretty_json(call.arguments), CARD_ARGUMENTS - len(label), md.trace_pointer(thread_id)
    )
    return section(label + arguments)
