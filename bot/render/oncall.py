"""Who is on call, as a card shows its ``oncall:<id>`` approvers, and who a reminder or
an escalation reaches through them.

Delivery looks the entries up (``bot.oncall``) just before it posts or updates the
message, and passes the answer in: ``OnCallNow`` maps each entry to the Slack users on
call then, or to None where PagerDuty or Slack could not say; a missing answer (None
for the whole map) means no PagerDuty is connected. The card's line is what was true
when it was shown: a click asks again.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.limits import MAX_TEXT, Block
from bot.mrkdwn import escape, truncate
from bot.render.common import context, people_text

PREFIX = "oncall:"
OnCallNow = Mapping[str, tuple[str, ...] | None]  # entry -> Slack ids (None: not known)


def on_call_entries(ids: Sequence[str]) -> list[str]:
    """The ``oncall:`` entries among approvers or ``escalate_to``, sorted."""
    return sorted(i for i in set(ids) if i.startswith(PREFIX))


def on_call_users(entries: Sequence[str], now: OnCallNow | None) -> list[str]:
    """Everyone on call for ``entries`` who could be looked up, each once, sorted."""
    if now is None:
        return []
    return sorted({u for e in entries for u in now.get(e) or ()})


def unreached(entries: Sequence[str], now: OnCallNow | None) -> list[str]:
    """The entries that reach nobody: not looked up, or nobody on call found in Slack."""
    return [e for e in entries if now is None or not now.get(e)]


def on_call_blocks(entries: Sequence[str], now: OnCallNow | None) -> list[Block]:
    """A card's line naming who is on call for each entry (nothing without entries)."""
    if not entries:
        return []
    parts = [f"{_id(e)}: {_who(e, now)}" for e in entries[:10]]
    more = f"; and {len(entries) - 10} more" if len(entries) > 10 else ""
    text = f"📟 On call now: {'; '.join(parts)}{more} (asked again at each click)"
    return [context(truncate(text, MAX_TEXT))]


def why_unreached(entries: Sequence[str], now: OnCallNow | None) -> str:
    """Why a reminder or an escalation reached nobody through the on-call ``entries``."""
    if now is None:
        return "PagerDuty is not connected here, so it reaches nobody"
    if any(now.get(e) is None for e in entries):
        return "PagerDuty could not say who is on call, so it reaches nobody"
    return "nobody on call has a Slack account with their PagerDuty email, so it reaches nobody"


def _who(entry: str, now: OnCallNow | None) -> str:
    if now is None:
        return "not known (PagerDuty is not connected here)"
    users = now.get(entry)
    if users is None:
        return "not known (PagerDuty did not answer)"
    if not users:
        return "nobody with a Slack account"
    return people_text(list(users))


def _id(entry: str) -> str:
    return escape(entry.removeprefix(PREFIX))
