"""``/opsloop grants`` and its Revoke button.

The list reads the threads of the channel the command is run in (a slash command names
no thread) and shows every live grant in them, whoever created it; Revoke is the
engine's to allow (the reviewer who created the grant, or an approver of its rule).
"""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners.approvals import accepted, click_of
from bot.listeners.deps import Deps
from bot.refusals import INVALID_BUTTON, Refusal
from bot.render.grants import GrantRow, grants_message, parse_revoke_value
from engine.events import utcnow
from engine.grants import exact_arguments
from engine.inputs import revoke_grant

LIST_LIMIT = 500  # threads of the channel read for /opsloop grants


async def grants_answer(
    d: Deps, command: dict[str, Any], url: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The live grants of the command's channel (of its team), soonest ending first."""
    channel, team = str(command.get("channel_id") or ""), command.get("team_id")
    now = utcnow()
    rows = []
    for info in await d.store.list_threads(limit=LIST_LIMIT, channel=channel):
        if team and info.team and info.team != team:
            continue
        state = await d.store.load(info.id)
        for g in state.grants.values():
            if g.live(now):
                link = p.permalink(url, info.channel, info.root_ts)
                args = exact_arguments(g.arguments_schema)
                rows.append(GrantRow(info.id, g.grant_id, g.tool, args, g.reviewer, g.until, link))
    rows.sort(key=lambda r: r.until)
    return grants_message(rows)


async def on_revoke(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    d, clicked = Deps.of(context), click_of(body)
    try:
        thread_id, grant_id = parse_revoke_value(clicked.value)
    except ValueError:
        raise Refusal(INVALID_BUTTON) from None
    decider = await d.decider(clicked.user, clicked.org)
    result = await revoke_grant(
        d.store,
        thread_id,
        grant_id=grant_id,
        decider=decider,
        reviewers=d.reviewers,
        dedupe_key=f"click:{clicked.action_ts}",
    )
    await ack()
    accepted(d, result)
    d.notify(client, context, body, "Revoked: that grant approves nothing from now on.")
