"""``/opsloop audit [thread link or id]``: a thread's approvals, told privately, and the
App Home's "Decided by me". Both read the log (engine.audit, Store.decisions_by);
nothing is stored for them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot import payloads as p
from bot.limits import Block
from bot.listeners.deps import Deps
from bot.mrkdwn import escape
from bot.render import home
from bot.render.audit import audit_blocks, audit_text
from engine import events as ev
from engine.audit import audit
from engine.errors import ThreadNotFound
from engine.inputs import why_not_same_org
from engine.types import Decided, ThreadInfo, ThreadKey

# The same answer for a thread that does not exist and for one of another team: an
# audit never tells anyone that a thread they may not see exists.
NO_SUCH_THREAD = "No such thread in this workspace."
DECIDED_SHOWN = 20  # decisions on the Home tab


def usage(command: str) -> str:
    c = escape(command)
    return (
        f"Usage: `{c} audit THREAD`, THREAD being a link to the thread (or to a message "
        f"in it) or its id (`thr_…`); run in a thread, `{c} audit` alone audits that one."
    )


async def audit_answer(
    d: Deps, command: Mapping[str, Any], words: list[str], url: str | None
) -> tuple[str, list[Block] | None]:
    """The private answer to ``/opsloop audit``: (text, blocks), blocks None for a
    one-line answer (usage, no such thread)."""
    name = str(command.get("command") or "/opsloop")
    channel, in_thread = str(command.get("channel_id") or ""), command.get("thread_ts")
    if words:
        ref = p.thread_ref(" ".join(words)) if len(words) == 1 else None
    elif isinstance(in_thread, str) and in_thread and channel:
        ref = (channel, in_thread)  # run inside a thread (when Slack says which)
    else:
        ref = None
    if ref is None:
        return usage(name), None
    info = await _visible_thread(d, ref, command)
    if info is None:
        return NO_SUCH_THREAD, None
    calls = audit(await d.store.select_events(info.id))
    link = p.permalink(url, info.channel, info.root_ts)
    people = frozenset({info.requester}) if info.requester else frozenset()
    blocks = audit_blocks(thread_id=info.id, link=link, calls=calls, people=people)
    return audit_text(calls), blocks


async def _visible_thread(
    d: Deps, ref: str | tuple[str, str], command: Mapping[str, Any]
) -> ThreadInfo | None:
    """The thread ``ref`` names, if whoever runs the command may see it: anyone of the
    thread's team (and Grid)."""
    org = p.command_org(command)
    try:
        if isinstance(ref, str):
            info = await d.store.get_thread(ref)
        else:
            team = org.teams[0] if org.teams else ""
            found = await d.store.find_thread(ThreadKey(team, *ref))
            if found is None:
                return None
            info = await d.store.get_thread(found)
    except ThreadNotFound:
        return None
    if await why_not_same_org(d.store, info.id, org) is not None:
        return None
    return info


async def decided_rows(
    d: Deps, user: str, team: str | None, url: str | None
) -> list[home.DecisionRow]:
    """The user's latest decisions, newest first, for the Home tab."""
    return [
        _decision_row(x, url) for x in await d.store.decisions_by(user, DECIDED_SHOWN, team=team)
    ]


def _decision_row(x: Decided, url: str | None) -> home.DecisionRow:
    e = x.event
    if isinstance(e, ev.ReconcileDecided):
        decision: str = e.decision
    else:
        decision = "rejected" if isinstance(e, ev.ApprovalRejected) else "approved"
    return home.DecisionRow(
        decision=decision,
        tool=x.tool,
        thread_id=e.thread_id,
        channel=x.thread.channel,
        root_ts=x.thread.root_ts,
        at=e.created_at,
        link=p.permalink(url, x.thread.channel, x.thread.root_ts),
    )
