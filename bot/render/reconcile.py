"""The reconcile card: a call whose outcome is unknown (it was interrupted while it ran)
asks a person whether it took effect; updated in place once they said (or the thread
was cancelled).

Pure: no I/O here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from bot import mrkdwn as md
from bot.limits import MAX_ID, MAX_TEXT, Block
from bot.mrkdwn import date, escape, mention, truncate
from bot.render.approval import deciders_text, rule_blocks
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
    section,
    tool,
)
from bot.render.readable import tool_title
from engine import events as ev

# What became of a call whose outcome was unknown, as its reconcile card says.
ReconcileOutcome = Literal["happened", "retry", "abandon", "cancelled"]

HAPPENED_ACTION = "opsloop_reconcile_happened"  # opens the note modal
RETRY_ACTION = "opsloop_reconcile_retry"
ABANDON_ACTION = "opsloop_reconcile_abandon"
RECONCILE_BLOCK_PREFIX = "opsloop_reconcile:"
_EXAMPLE_KEY = re.compile(r"^[a-z][a-z0-9_]{0,30}$")  # an argument a check may name


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
    name = tool(tool_title(call.intent), 60)
    # Slack shows the same dialog to every clicker: each says who may decide.
    who = deciders_text(call, "decide")
    retry = button(
        "Run it again",
        RETRY_ACTION,
        value,
        None,
        confirm=confirm(
            f"Run {tool_title(call.intent)} again?",
            f"If the first run did happen, {name} may take effect twice "
            f"(it gets the same idempotency key). {who}",
            "Run it again",
            "Not yet",
            "danger",
        ),
    )
    abandon = button(
        "It did not happen",
        ABANDON_ACTION,
        value,
        None,
        confirm=confirm(
            "It did not happen?",
            f"opsloop does not run {name} again; the model reads that it did not happen. {who}",
            "It did not happen",
            "Not sure",
            "danger",
        ),
    )
    actions = {
        "type": "actions",
        "block_id": (RECONCILE_BLOCK_PREFIX + call.tool_call_id)[:MAX_ID],
        # None styled: no answer is the default, and "Run it again" (the one that can
        # double the effect) least of all. The hint above says to check first.
        "elements": [
            button("It happened", HAPPENED_ACTION, value, None),
            retry,
            abandon,
        ],
    }
    what = (
        "opsloop cannot tell whether it took effect, and does not run it again unless a "
        "person says so."
    )
    return [
        *_body(
            f"Did it happen? {tool_title(call.intent)}", thread_id, requester, call, unknown, what
        ),
        context(check_hint(call)),
        *rule_blocks(call),
        context(f"Attempt {unknown.attempt}"),  # the call's id is the trace's
        actions,
    ]


def check_hint(call: CallLike) -> str:
    """ "🔎 Before you answer, check …": how to find out first. This thread waits for
    the answer, so a question goes in a new message; the example asks about the call's
    first short text argument (in the local demo: "show service api")."""
    example = next(
        (
            f" (e.g. “show {k.replace('_', ' ')} {md.one_line(v)}”)"
            for k, v in call.arguments.items()
            if isinstance(v, str) and _EXAMPLE_KEY.match(k) and 0 < len(v) <= 40
        ),
        "",
    )
    return (
        "🔎 Before you answer, check whether it took effect: look at the system it acts on, "
        f"or ask opsloop in a new message{md.fence_safe(escape(example))} (this thread "
        "waits for your answer). *Run it again* does it a second time if the first run "
        "went through."
    )


_RECONCILED: dict[str, tuple[str, str, str]] = {  # outcome -> (title, who said, what follows)
    "happened": (
        "It happened",
        "✅ {who} said it happened",
        "opsloop did not run it again; the model reads that it happened.",
    ),
    "retry": (
        "Run again",
        "🔁 {who} asked to run it again",
        "opsloop runs it once more, with the same idempotency key.",
    ),
    "abandon": (
        "It did not happen",
        "🚫 {who} said it did not happen",
        "opsloop did not run it again; the model reads that it did not happen.",
    ),
    "cancelled": ("Cancelled", "🚫 Cancelled by {who}", "opsloop did not run it again."),
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
    """The reconcile card after a person decided: no buttons, who said what and when,
    and what opsloop does about it. ``note``: what they wrote for "it happened" (the
    result the model reads)."""
    title, verb, then = _RECONCILED[outcome]
    line = f"{verb.format(who=mention(by))} {date(at)}"
    if outcome == "cancelled" and not by:
        line = f"🚫 Cancelled {date(at)}"
    if note.strip():
        line += f" — “{md.fence_safe(escape(note.strip()))}”"
        then = then.replace("that it happened", "the note as its result")
    return [
        *_body(f"{title}: {tool_title(call.intent)}", thread_id, requester, call, unknown),
        context(f"Attempt {unknown.attempt}"),
        section(truncate(f"{line}\n{then}", MAX_TEXT, md.trace_pointer(thread_id))),
    ]


def _body(
    title: str,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
    open_question: str = "",
) -> list[Block]:
    """What was interrupted; ``open_question``: what the open card adds (once decided,
    the card says what was decided instead)."""
    since = f" since {date(unknown.started_at)}" if unknown.started_at else ""
    what = f"⚠️ {tool(call.intent)} was running{since} when it was interrupted."
    if open_question:
        what = f"{what[:-1]}: {open_question}"
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
