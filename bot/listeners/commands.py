"""``/opsloop`` (help, pending, status, audit, grants) and the App Home tab: read-only views."""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners import audit, grants
from bot.listeners.deps import Deps
from bot.mrkdwn import escape
from bot.render import home
from bot.render.status import ACTIVE
from bot.reviewers import ReviewerLookupError
from engine.inputs import may_approve
from engine.state import PendingCall
from engine.types import ThreadInfo

LIST_LIMIT = 500  # threads read for /opsloop and the Home tab
RECENT = 10  # recent threads on the Home tab


async def on_command(ack: AsyncAck, command: dict[str, Any], context: AsyncBoltContext) -> None:
    d = Deps.of(context)
    name = str(command.get("command") or "/opsloop")
    words = str(command.get("text") or "").split()
    sub = words[0].lower() if words else "help"
    url = p.workspace_url(command.get("team_domain")) or d.identity.url
    if sub == "pending":
        text = home.pending_text(await _pending_rows(d, str(command.get("user_id")), url))
    elif sub == "status":
        text = home.status_text(await _status_rows(d, str(command.get("channel_id")), url))
    elif sub == "audit":
        text, blocks = await audit.audit_answer(d, command, words[1:], url)
        if blocks is not None:
            await ack(text=text, blocks=blocks, response_type="ephemeral")
            return
    elif sub == "grants":
        text, blocks = await grants.grants_answer(d, command, url)
        await ack(text=text, blocks=blocks, response_type="ephemeral")
        return
    elif sub == "help":
        text = home.help_text(name)
    else:
        text = f"I don't know `{escape(sub)}`.\n" + home.help_text(name)
    await ack(text=text, response_type="ephemeral")


async def on_home_opened(
    ack: AsyncAck, event: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    await ack()
    user = event.get("user")
    if event.get("tab", "home") == "home" and isinstance(user, str) and user:
        d = Deps.of(context)
        team = context.team_id  # "Decided by me" lists this workspace's threads
        d.background.spawn("views.publish", _publish_home(d, client, user, team))


def _row(info: ThreadInfo, url: str | None, call: PendingCall | None = None) -> home.ThreadRow:
    return home.ThreadRow(
        thread_id=info.id,
        channel=info.channel,
        root_ts=info.root_ts,
        status=info.status,
        requester=info.requester,
        updated_at=info.updated_at,
        link=p.permalink(url, info.channel, info.root_ts),
        tool=call.intent if call else None,
        arguments=call.arguments if call else None,
        requested_at=call.requested_at if call else None,
    )


async def _pending_rows(d: Deps, user: str, url: str | None) -> list[home.ThreadRow]:
    """Calls awaiting approval that ``user`` may approve by each call's own rule (a
    rule's approvers, or the process's for a call that records none), newest first."""
    decider = await d.decider(user, None)
    rows = []
    for info in await d.store.list_threads(status="awaiting_approval", limit=LIST_LIMIT):
        state = await d.store.load(info.id)
        try:
            mine = await may_approve(state, decider, d.reviewers)
        except ReviewerLookupError:
            mine = False  # a group we cannot look up now admits nobody
        if mine:
            rows.append(_row(info, url, state.pending))
    return rows


async def _status_rows(d: Deps, channel: str, url: str | None) -> list[home.ThreadRow]:
    threads = await d.store.list_threads(ACTIVE, limit=LIST_LIMIT, channel=channel)
    return [_row(t, url) for t in threads]


async def _publish_home(
    d: Deps, client: AsyncWebClient, user: str, team: str | None = None
) -> None:
    url = d.identity.url
    pending = await _pending_rows(d, user, url)
    recent = [_row(t, url) for t in await d.store.list_threads(limit=RECENT, requester=user)]
    decided = await audit.decided_rows(d, user, team, url)
    view = home.home_view(user, pending, recent, decided)
    await client.views_publish(user_id=user, view=view)
