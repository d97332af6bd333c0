"""``/opsloop grants``: the live standing grants of a channel, each with a Revoke button.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

from bot.limits import MAX_MESSAGE_BLOCKS, Block
from bot.mrkdwn import date, inline_code, mention
from bot.render.common import button, confirm, context, excerpt, section, tool

REVOKE_ACTION = "opsloop_revoke_grant"
_LINK = re.compile(r"^https://[^\s<>|]+$")  # a thread's permalink, linked as is
GRANTS_SHOWN = 20  # each is two blocks; Slack allows 50 in a message


class GrantRow(NamedTuple):
    thread_id: str
    grant_id: str
    tool: str
    arguments: dict[str, object] | None  # the exact arguments it matches (None: a schema)
    reviewer: str
    until: datetime
    link: str | None = None


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
        args = excerpt(row.arguments) if row.arguments is not None else "(a schema)"
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
                    f" until {date(row.until)}{where}"
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
