"""Standing grants in Slack: the "Approve for 1 h" modal that makes one (its span, its
scope, which arguments must stay as they are), and ``/opsloop grants``, the live grants
of a channel, each with a Revoke button.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from bot.limits import (
    MAX_CHECKBOX_OPTIONS,
    MAX_MESSAGE_BLOCKS,
    MAX_OPTION_TEXT,
    MAX_OPTION_VALUE,
    Block,
)
from bot.mrkdwn import date, escape, inline_code, mention, one_line, truncate
from bot.render.approval import duration_text
from bot.render.common import (
    binding_value,
    button,
    confirm,
    context,
    excerpt,
    plain,
    section,
    tool,
)
from engine.grants import ANY, GrantAsk, Scope, grant_seconds, grant_terms, spans

GRANT_CALLBACK = "opsloop_grant"  # the modal "Approve for 1 h" opens
SPAN_BLOCK, SCOPE_BLOCK, EXACT_BLOCK = "grant_span", "grant_scope", "grant_exact"
CHOICE_ACTION = "choice"  # every input's action id
SCOPES = {"thread": "This thread only", "channel": "Any thread in this channel"}
REVOKE_ACTION = "opsloop_revoke_grant"
_LINK = re.compile(r"^https://[^\s<>|]+$")  # a thread's permalink, linked as is
GRANTS_SHOWN = 20  # each is two blocks; Slack allows 50 in a message


def grant_modal(
    *,
    thread_id: str,
    tool_call_id: str,
    arguments_hash: str,
    tool_name: str,
    arguments: Mapping[str, Any],
    max_grant_s: float,
) -> dict[str, Any]:
    """The modal of "Approve for 1 h": submitting it is the vote and the grant. It
    starts at the one-click grant (an hour or the rule's shorter ``max_grant``, this
    thread, every argument as now); the reviewer may choose another span up to
    ``max_grant``, the whole channel, and which arguments may differ."""
    initial = grant_seconds(max_grant_s)
    span_options = [_option(f"{duration_text(s)}", _span_value(s)) for s in spans(max_grant_s)]
    blocks: list[Block] = [
        section(
            f"Approve this call of {tool(tool_name, 60)}, and let later calls like it run"
            " without asking until the grant ends or someone revokes it (/opsloop grants)."
            " Only calls whose rule needs a single approval, and which you could approve"
            " yourself, are covered."
        ),
        _select(SPAN_BLOCK, "For", span_options, _span_value(initial)),
        _select(
            SCOPE_BLOCK,
            "Where",
            [_option(text, value) for value, text in SCOPES.items()],
            "thread",
        ),
    ]
    offered = _offered(arguments)
    if offered:
        options = [_option(_term_text(k, arguments[k]), k, mrkdwn=True) for k in offered]
        blocks.append(
            {
                "type": "input",
                "block_id": EXACT_BLOCK,
                "optional": True,
                "label": plain("Must stay as they are"),
                "hint": plain("Untick an argument to let the grant cover any value of it."),
                "element": {
                    "type": "checkboxes",
                    "action_id": CHOICE_ACTION,
                    "options": options,
                    "initial_options": options,
                },
            }
        )
    if len(offered) < len(arguments):
        blocks.append(context("Other arguments must stay exactly as they are."))
    return {
        "type": "modal",
        "callback_id": GRANT_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": plain("Approve for a while"),
        "submit": plain("Approve"),
        "close": plain("Cancel"),
        "blocks": blocks,
    }


def read_grant(
    values: Mapping[str, Any], arguments: Mapping[str, Any], max_grant_s: float
) -> GrantAsk | dict[str, str]:
    """The grant a submitted modal asks for, or the errors to show per input."""
    errors: dict[str, str] = {}
    span = _picked(values, SPAN_BLOCK)
    seconds = next((s for s in spans(max_grant_s) if _span_value(s) == span), None)
    if seconds is None:
        errors[SPAN_BLOCK] = "Choose one of the spans offered."
    picked = _picked(values, SCOPE_BLOCK)
    scope: Scope | None = "thread" if picked == "thread" else "channel" if picked else None
    if picked not in SCOPES:
        errors[SCOPE_BLOCK] = "Choose where the grant applies."
    if errors or seconds is None or scope is None:
        return errors
    ticked = {
        o.get("value")
        for o in _state(values, EXACT_BLOCK).get("selected_options") or []
        if isinstance(o, dict)
    }
    offered = _offered(arguments)
    exact = frozenset(k for k in arguments if k not in offered or k in ticked)
    return GrantAsk(seconds=seconds, scope=scope, exact=exact)


def _offered(arguments: Mapping[str, Any]) -> list[str]:
    """The arguments a reviewer may let vary (a checkbox each, as many as Slack shows;
    a name too long for an option's value always stays exact)."""
    names = [k for k in arguments if 0 < len(k) <= MAX_OPTION_VALUE]
    return names[:MAX_CHECKBOX_OPTIONS]


def _term_text(name: str, value: Any) -> str:
    # An option's text is at most 75 characters: 30 for the name, 40 for the value.
    return f"{truncate(escape(one_line(name)), 30)} = {excerpt(value, 40)}"


def _span_value(seconds: float) -> str:
    return str(int(seconds))


def _option(text: str, value: str, *, mrkdwn: bool = False) -> dict[str, Any]:
    kind = "mrkdwn" if mrkdwn else "plain_text"
    return {"text": {"type": kind, "text": text[:MAX_OPTION_TEXT]}, "value": value}


def _select(block_id: str, label: str, options: list[dict[str, Any]], initial: str) -> Block:
    return {
        "type": "input",
        "block_id": block_id,
        "label": plain(label),
        "element": {
            "type": "static_select",
            "action_id": CHOICE_ACTION,
            "options": options,
            "initial_option": next(o for o in options if o["value"] == initial),
        },
    }


def _state(values: Mapping[str, Any], block_id: str) -> dict[str, Any]:
    block = values.get(block_id)
    state = block.get(CHOICE_ACTION) if isinstance(block, dict) else None
    return state if isinstance(state, dict) else {}


def _picked(values: Mapping[str, Any], block_id: str) -> str | None:
    option = _state(values, block_id).get("selected_option")
    value = option.get("value") if isinstance(option, dict) else None
    return value if isinstance(value, str) else None


class GrantRow(NamedTuple):
    thread_id: str
    grant_id: str
    tool: str
    schema: dict[str, Any]  # the arguments it matches
    reviewer: str
    until: datetime
    scope: str = "thread"
    link: str | None = None


def terms_text(schema: Mapping[str, Any]) -> str:
    """``environment: staging · service: any``: what a grant's arguments must be."""
    terms = grant_terms(schema)
    if terms is None:
        return "(arguments matching a schema)"
    if not terms:
        return "(no arguments)"
    return " · ".join(
        f"{escape(k)}: {'_any_' if v is ANY else excerpt(v)}" for k, v in terms.items()
    )


def revoke_value(thread_id: str, grant_id: str) -> str:
    return f"{thread_id} {grant_id}"


def parse_revoke_value(value: str) -> tuple[str, str]:
    """``(thread_id, grant_id)`` of a Revoke button; ValueError if it is not one."""
    thread_id, _, grant_id = value.strip().partition(" ")
    if not thread_id or not grant_id or " " in grant_id:
        raise ValueError("not a grant")
    return thread_id, grant_id


def grants_message(rows: Sequence[GrantRow]) -> tuple[str, list[Block]]:
    """The text and blocks of the list (newest-ending last), within Slack's limits."""
    if not rows:
        text = "No standing grants are live in this channel."
        return text, [section(text)]
    text = f"*Standing grants live in this channel* ({len(rows)})"
    blocks: list[Block] = [section(text)]
    for row in rows[:GRANTS_SHOWN]:
        args = terms_text(row.schema)
        scope = " · whole channel" if row.scope == "channel" else ""
        where = (
            f" · <{row.link}|open thread>"
            if row.link and _LINK.match(row.link)
            else f" · thread {inline_code(row.thread_id)}"
        )
        sure = confirm(
            "Revoke this grant?",
            f"Calls of {tool(row.tool, 60)} will need an approval again.",
            "Revoke",
            "Keep it",
            "danger",
        )
        blocks.append(
            {
                **section(
                    f"{tool(row.tool)} {args}\nby {mention(row.reviewer)}"
                    f" until {date(row.until)}{scope}{where}"
                ),
                "accessory": button(
                    "Revoke",
                    REVOKE_ACTION,
                    revoke_value(row.thread_id, row.grant_id),
                    "danger",
                    confirm=sure,
                ),
            }
        )
    if len(rows) > GRANTS_SHOWN:
        blocks.append(context(f"and {len(rows) - GRANTS_SHOWN} more"))
    assert len(blocks) <= MAX_MESSAGE_BLOCKS
    return text, blocks
