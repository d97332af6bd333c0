"""The App Home tab and the ``/opsloop`` answers: pure text and Block Kit, no I/O.

A line says where a thread is (``<#C…>``), what it waits for (a call awaiting approval
with its key arguments), who asked and when, and links to the thread when the
workspace URL is known, else names it as ``opsloop trace CHANNEL/TS`` accepts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.limits import MAX_TEXT
from bot.mrkdwn import date, escape, inline_code, mention, one_line, slack_len, truncate

MAX_LINES = 20  # per list; the rest is counted, not shown
_SECTION_TEXT = MAX_TEXT
_CHANNEL = re.compile(r"^[CG][A-Z0-9]+$")  # a channel Slack links as <#C…>
_DM = re.compile(r"^D[A-Z0-9]+$")
_LINK = re.compile(r"^https://[^\s<>|]+$")
ARGUMENTS_SHOWN = 4  # key=value pairs of a pending call on its line
ARGUMENT_CHARS = 40  # of one value
ARGUMENTS_CHARS = 120  # of the whole summary

STATUS_LABELS = {
    "new": "new",
    "running": "working",
    "awaiting_approval": "waiting for approval",
    "awaiting_reply": "waiting for a reply",
    "awaiting_job": "waiting for a job",
    "sleeping": "retrying soon",
    "idle": "done",
    "failed": "failed: needs a human",
    "cancelled": "cancelled",
}


@dataclass(frozen=True)
class ThreadRow:
    """One thread in a list: where it is, what it waits for, who asked."""

    thread_id: str
    channel: str
    root_ts: str
    status: str
    requester: str | None
    updated_at: datetime
    link: str | None = None
    tool: str | None = None  # the call awaiting approval, if any
    arguments: dict[str, Any] | None = None  # that call's arguments
    requested_at: datetime | None = None  # when its approval was asked for


# What a person decided, as "Decided by me" says it: an approval vote, a rejection, or
# what they said of a call whose outcome was unknown.
DECISION_LABELS = {
    "approved": "✅ approved",
    "rejected": "❌ rejected",
    "happened": "🧾 said it happened:",
    "retry": "🧾 had it run again:",
    "abandon": "🧾 said it did not happen:",
}


@dataclass(frozen=True)
class DecisionRow:
    """One decision of the Home tab's "Decided by me": what, on which call, where, when."""

    decision: str  # a key of DECISION_LABELS
    tool: str | None
    thread_id: str
    channel: str
    root_ts: str
    at: datetime
    link: str | None = None


def channel_name(channel: str) -> str:
    """``<#C…>`` (Slack shows the channel's name), "a direct message", or the id escaped."""
    if _CHANNEL.match(channel):
        return f"<#{channel}>"
    return "a direct message" if _DM.match(channel) else escape(channel)


def where(row: ThreadRow | DecisionRow) -> str:
    """A link to the thread, or how ``opsloop trace`` names it."""
    if row.link and _LINK.match(row.link):
        return f"<{row.link}|open thread>"
    return inline_code(f"opsloop trace {row.channel}/{row.root_ts}")


def arguments_summary(arguments: dict[str, Any] | None) -> str:
    """``service=api environment=production``: the first few pairs, cut, escaped."""
    if not arguments:
        return ""
    pairs = [f"{k}={_value(v)}" for k, v in list(arguments.items())[:ARGUMENTS_SHOWN]]
    if len(arguments) > ARGUMENTS_SHOWN:
        pairs.append("…")
    return inline_code(_cut(one_line(" ".join(pairs)), ARGUMENTS_CHARS))


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return _cut(one_line(text), ARGUMENT_CHARS)


def _cut(text: str, limit: int) -> str:
    return text if slack_len(text) <= limit else truncate(text, limit)


def row_line(row: ThreadRow) -> str:
    """``• #ops · waiting for approval: *deploy* `service=api` · asked by @ann today at
    2:19 AM · open thread``; a thread without a call: its status and when it last changed."""
    status = STATUS_LABELS.get(row.status, escape(row.status))
    asked = f"asked by {mention(row.requester)} · {date(row.updated_at)}"
    if row.tool:
        status += f": *{escape(one_line(row.tool)).replace('*', '∗')[:100]}*"
        if summary := arguments_summary(row.arguments):
            status += f" {summary}"
        # As cards say a time ("today at 2:19 AM"): one date format everywhere.
        asked = f"asked by {mention(row.requester)} {date(row.requested_at or row.updated_at)}"
    return f"• {channel_name(row.channel)} · {status} · {asked} · {where(row)}"


def decision_line(row: DecisionRow) -> str:
    """``• ✅ approved *deploy* · #ops · today at 12:01 · open thread``."""
    label = DECISION_LABELS.get(row.decision, escape(row.decision))
    what = f"*{escape(one_line(row.tool)).replace('*', '∗')[:100]}*" if row.tool else "a call"
    return f"• {label} {what} · {channel_name(row.channel)} · {date(row.at)} · {where(row)}"


def lines(rows: Sequence[ThreadRow], empty: str, budget: int = _SECTION_TEXT) -> str:
    """Up to ``MAX_LINES`` whole rows, one a line, within ``budget``; the rest counted."""
    texts = [row_line(r) for r in rows[:MAX_LINES]]
    return _fit(texts, len(rows), empty, budget, "`opsloop threads` lists them all")


def decision_lines(rows: Sequence[DecisionRow], empty: str, budget: int = _SECTION_TEXT) -> str:
    """As :func:`lines`, for "Decided by me"."""
    texts = [decision_line(r) for r in rows[:MAX_LINES]]
    return _fit(texts, len(rows), empty, budget, "`/opsloop audit THREAD` tells a thread's")


def _fit(texts: list[str], total: int, empty: str, budget: int, rest: str) -> str:
    """Whole lines of ``texts`` (of ``total`` rows) within ``budget``; the rest counted."""
    if not total:
        return empty
    room = budget - 80  # the "…and N more" line
    shown: list[str] = []
    for text in texts:
        line = truncate(text, room)  # only a monster row is cut
        if slack_len("\n".join([*shown, line])) > room:
            break
        shown.append(line)
    more = total - len(shown)
    if more > 0:
        shown.append(f"…and {more} more ({rest})")
    return "\n".join(shown)


def help_text(command: str = "/opsloop") -> str:
    c = escape(command)
    return "\n".join(
        [
            "*opsloop* works in Slack threads: mention it in a channel or write to it "
            "directly; reply in its thread to follow up, no mention needed.",
            f"`{c} pending`: approvals waiting for you",
            f"`{c} status`: what opsloop is working on in this channel",
            f"`{c} audit THREAD`: who asked, who decided and what ran in a thread "
            "(its link or id; alone, in a thread: that one)",
            f"`{c} grants`: standing grants live in this channel, to revoke them",
            f"`{c} help`: this help",
        ]
    )


def pending_text(rows: Sequence[ThreadRow]) -> str:
    head = "*Approvals waiting for you*\n"
    return head + lines(rows, "Nothing is waiting for you. 🎉", _SECTION_TEXT - len(head))


def status_text(rows: Sequence[ThreadRow]) -> str:
    head = "*Active threads in this channel*\n"
    empty = "opsloop is not working on anything in this channel."
    return head + lines(rows, empty, _SECTION_TEXT - len(head))


def _titled(head: str, rows: Sequence[ThreadRow], empty: str) -> str:
    return head + lines(rows, empty, _SECTION_TEXT - len(head))


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, _SECTION_TEXT)}}


def home_view(
    user: str,
    pending: Sequence[ThreadRow],
    recent: Sequence[ThreadRow],
    decided: Sequence[DecisionRow] = (),
) -> dict[str, Any]:
    """The Home tab of ``user``: approvals waiting for them, what they decided lately
    (newest first) and the threads they asked."""
    head = "*Decided by me*\n"
    empty = "You have not decided anything yet."
    mine = decision_lines(decided, empty, _SECTION_TEXT - len(head))
    return {
        "type": "home",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": "opsloop", "emoji": True}},
            _section(f"Hi {mention(user)}! Mention opsloop in a channel, or write to it here."),
            {"type": "divider"},
            _section(_titled("*Approvals waiting for you*\n", pending, "Nothing to decide. 🎉")),
            {"type": "divider"},
            _section(head + mine),
            {"type": "divider"},
            _section(
                _titled("*Your recent threads*\n", recent, "You have not asked anything yet.")
            ),
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": "Every thread's full log: `opsloop trace THREAD`"}
                ],
            },
        ],
    }
