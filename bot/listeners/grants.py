"""``/opsloop grants`` and its Revoke button.

The list reads the grant events of the channel the command is run in (a slash command
names no thread) and shows every live grant made in its threads, whoever created it; Revoke is the
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
from engine import events as ev
from engine.events import utcnow
from engine.inputs import revoke_grant


async def grants_answer(
    d: Deps, command: dict[str, Any], url: str | None
) -> tuple[str, list[dict[str, Any]]]:
    """The live grants of the command's channel (of its team), soonest ending first:
    read from the channel's grant events (one indexed query), not from its threads."""
    channel, team = str(command.get("channel_id") or ""), command.get("team_id")
    now = utcnow()
    made: dict[str, tuple[str, ev.GrantCreated]] = {}
    for thread_id, e in await d.store.grant_events(channel, team=team or None, now=now):
        if isinstance(e, ev.GrantCreated):
            made[e.grant_id] = (thread_id, e)
        else:
            made.pop(e.grant_id, None)
    roots = {}
    rows = []
    for thread_id, g in made.values():
        if now >= g.until:
            continue
        if thread_id not in roots:
            roots[thread_id] = (await d.store.get_thread(thread_id)).root_ts
        link = p.permalink(url, channel, roots[thread_id])
        rows.append(
            GrantRow(
                thread_id,
                g.grant_id,
                g.tool,
                g.arguments_schema,
                g.reviewer,
                g.until,
                g.scope,
                link,
            )
        )
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
