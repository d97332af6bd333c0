"""The App Home tab and the ``/opsloop`` answers: pure text and Block Kit, no I/O.

Lines name threads by a link to their root message when the workspace URL is known,
else by channel and ts, which ``opsloop trace CHANNEL/TS`` accepts too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.mrkdwn import date, escape, inline_code, mention, one_line, truncate

MAX_LINES = 20  # per list; the rest is counted, not shown
_SECTION_TEXT = 3000
_CHANNEL = re.compile(r"^[CDG][A-Z0-9]+$")

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


def where(row: ThreadRow) -> str:
    if row.link:
        return f"<{row.link}|thread {escape(row.root_ts)}>"
    channel = f"<#{row.channel}>" if _CHANNEL.match(row.channel) else escape(row.channel)
    return f"{channel} {inline_code(row.channel + '/' + row.root_ts)}"


def row_line(row: ThreadRow) -> str:
    """``• <link|thread> · waiting for approval: *deploy* · asked by @ann · date``."""
    status = STATUS_LABELS.get(row.status, escape(row.status))
    if row.tool:
        status += f": *{escape(one_line(row.tool)).replace('*', '∗')[:100]}*"
    return f"• {where(row)} · {status} · asked by {mention(row.requester)} · {date(row.updated_at)}"


def lines(rows: Sequence[ThreadRow], empty: str) -> str:
    """Up to ``MAX_LINES`` rows, one a line, within one section's text."""
    if not rows:
        return empty
    shown = [row_line(r) for r in rows[:MAX_LINES]]
    more = len(rows) - len(shown)
    if more > 0:
        shown.append(f"…and {more} more (`opsloop threads` lists them all)")
    return truncate("\n".join(shown), _SECTION_TEXT)


def help_text(command: str = "/opsloop") -> str:
    c = escape(command)
    return "\n".join(
        [
            "*opsloop* works in Slack threads: mention it in a channel or write to it "
            "directly; reply in its thread to follow up, no mention needed.",
            f"`{c} pending`: approvals waiting for you",
            f"`{c} status`: what opsloop is working on in this channel",
            f"`{c} help`: this help",
        ]
    )


def pending_text(rows: Sequence[ThreadRow]) -> str:
    return "*Approvals waiting for you*\n" + lines(rows, "Nothing is waiting for you. 🎉")


def status_text(rows: Sequence[ThreadRow]) -> str:
    return "*Active threads in this channel*\n" + lines(
        rows, "opsloop is not working on anything in this channel."
    )


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate(text, _SECTION_TEXT)}}


def home_view(
    user: str, pending: Sequence[ThreadRow], recent: Sequence[ThreadRow]
) -> dict[str, Any]:
    """The Home tab of ``user``: approvals waiting for them and the threads they asked."""
    return {
        "type": "home",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": "opsloop", "emoji": True}},
            _section(f"Hi {mention(user)}! Mention opsloop in a channel, or write to it here."),
            {"type": "divider"},
            _section("*Approvals waiting for you*\n" + lines(pending, "Nothing to decide. 🎉")),
            {"type": "divider"},
            _section("*Your recent threads*\n" + lines(recent, "You have not asked anything yet.")),
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": "Every thread's full log: `opsloop trace THREAD`"}
                ],
            },
        ],
    }
