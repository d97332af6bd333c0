"""The reconcile card: a call whose outcome is unknown (it was interrupted while it ran)
asks a person whether it took effect; updated in place once they said (or the thread
was cancelled).

Pure: no I/O here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from bot import mrkdwn as md
from bot.limits import MAX_BUTTON_TEXT, MAX_ID, MAX_TEXT, Block
from bot.mrkdwn import date, escape, inline_code, mention, truncate
from bot.render.approval import rule_blocks
from bot.render.common import (
    CallLike,
    People,
    arguments_section,
    binding_value,
    button,
    call_fields,
    confirm,
    context,
    header,
    plain,
    section,
    tool,
)
from engine import events as ev

# What became of a call whose outcome was unknown, as its reconcile card says.
ReconcileOutcome = Literal["happened", "retry", "abandon", "cancelled"]

HAPPENED_ACTION = "opsloop_reconcile_happened"  # opens the note modal
RETRY_ACTION = "opsloop_reconcile_retry"
ABANDON_ACTION = "opsloop_reconcile_abandon"
RECONCILE_BLOCK_PREFIX = "opsloop_reconcile:"


def reconcile_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
    arguments_hash: str,
    people: People = frozenset(),
) -> list[Block]:
    """The card asking a person whether an interrupted call took effect.

    Says what was running (the tool, its arguments), since when, what was observed, who
    may decide, and offers **It happened** (a note modal), **Run it again** and **It
    did not happen**, each bound to exactly this call by its arguments hash.
    """
    value = binding_value(thread_id, call.tool_call_id, arguments_hash)
    name = tool(call.intent, 60)
    retry = button(
        "Run it again",
        RETRY_ACTION,
        value,
        "primary",
        confirm=confirm(
            f"Run {md.one_line(call.intent)} again?",
            f"If the first run did happen, {name} may take effect twice "
            "(it gets the same idempotency key).",
            "Run it again",
            "Not yet",
            "primary",
        ),
    )
    abandon = button(
        "It did not happen",
        ABANDON_ACTION,
        value,
        "danger",
        confirm=confirm(
            "It did not happen?",
            f"opsloop does not run {name} again; the model reads that it did not happen.",
            "It did not happen",
            "Not sure",
            "danger",
        ),
    )
    actions = {
        "type": "actions",
        "block_id": (RECONCILE_BLOCK_PREFIX + call.tool_call_id)[:MAX_ID],
        # Not styled: "It happened" is no more the default than the others.
        "elements": [
            {
                "type": "button",
                "text": plain("It happened", MAX_BUTTON_TEXT),
                "action_id": HAPPENED_ACTION,
                "value": value,
            },
            retry,
            abandon,
        ],
    }
    return [
        *_body(f"Did it happen? {call.intent}", thread_id, requester, call, unknown),
        *rule_blocks(call),
        context(f"Attempt {unknown.attempt} · call {inline_code(call.tool_call_id)}"),
        actions,
    ]


_RECONCILED: dict[str, tuple[str, str]] = {  # outcome -> (title, the line's verb)
    "happened": ("It happened", "✅ {who} said it happened"),
    "retry": ("Run again", "🔁 {who} asked to run it again"),
    "abandon": ("It did not happen", "🚫 {who} said it did not happen"),
    "cancelled": ("Cancelled", "🚫 Cancelled by {who}"),
}


def reconciled_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
    outcome: ReconcileOutcome,
    by: str | None,
    at: datetime,
    note: str = "",
) -> list[Block]:
    """The reconcile card after a person decided: no buttons, who said what and when.
    ``note``: what they wrote for "it happened" (the result the model reads)."""
    title, verb = _RECONCILED[outcome]
    line = f"{verb.format(who=mention(by))} {date(at)}"
    if outcome == "cancelled" and not by:
        line = f"🚫 Cancelled {date(at)}"
    if note.strip():
        line += f" — “{md.fence_safe(escape(note.strip()))}”"
    return [
        *_body(f"{title}: {call.intent}", thread_id, requester, call, unknown),
        context(f"Attempt {unknown.attempt} · call {inline_code(call.tool_call_id)}"),
        section(truncate(line, MAX_TEXT, md.trace_pointer(thread_id))),
    ]


def _body(
    title: str,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
) -> list[Block]:
    since = f" since {date(unknown.started_at)}" if unknown.started_at else ""
    what = (
        f"⚠️ {tool(call.intent)} was running{since} when it was interrupted: opsloop "
        "cannot tell whether it took effect, and does not run it again unless a person says so."
    )
    seen = []
    if unknown.error.strip():
        error = truncate(md.fence_safe(escape(unknown.error.strip())), 1000)
        seen = [section(f"*What was observed*\n{error}")]
    return [
        header(title),
        section(what),
        call_fields(requester, call),
        arguments_section(call, thread_id),
        *seen,
    ]
