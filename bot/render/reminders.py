"""What an approval's timers post: the reminder in the thread while nobody decides, and
the escalation when it expired (in the rule's channel, or in the thread mentioning its
people). Both name the card's call and link to the card when Slack gave its permalink.

On-call entries (``oncall:<id>``) mention whoever is on call when the post is made
(delivery looks them up and passes ``on_call``); an entry nobody could be found for is
named, and said to reach nobody.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from bot import limits
from bot import mrkdwn as md
from bot.limits import MAX_TEXT, Block
from bot.mrkdwn import date, escape, inline_code, mention, slack_len, truncate
from bot.render.approval import Votes
from bot.render.common import CallLike, approver_text, context, section, tool
from bot.render.home import arguments_summary, channel_name
from bot.render.oncall import OnCallNow, on_call_entries, on_call_users, unreached, why_unreached

MENTIONS_CHARS = 1500  # of a reminder's or escalation's mentions; the rest are counted
_LINK = re.compile(r"^https://[^\s<>|]+$")
_CHANNEL = re.compile(r"^[CG][A-Z0-9]+$")


def escalation_channel(escalate_to: Sequence[str]) -> str:
    """The channel an expiry is posted in ("" when the rule names none: the thread)."""
    return next((t for t in escalate_to if _CHANNEL.match(t)), "")


def reminder_reply(
    *,
    thread_id: str,
    call: CallLike,
    asked_at: datetime,
    expires_at: datetime,
    votes: Votes,
    card_link: str | None = None,
    on_call: OnCallNow | None = None,
) -> list[Block]:
    """The reply that reminds the approvers of ``call``: it mentions them, and nobody
    else (not those who voted already; the card, one link away, names the requester);
    with no approvers (anyone but the requester may approve), it says the card still
    waits, mentioning nobody. ``on_call``: who is on call for its ``oncall:`` entries."""
    r = call.reviewers
    approvers = sorted(r.approvers) if r is not None else []
    entries = on_call_entries(approvers)
    named = [a for a in approvers if a not in entries]
    ping = [a for a in named + on_call_users(entries, on_call) if a not in votes.by]
    ping = list(dict.fromkeys(ping))
    if ping:
        head = f"🔔 {_mentions(ping)}: {tool(call.intent)} is still waiting for your approval."
    elif approvers:
        head = f"🔔 {tool(call.intent)} is still waiting for approval."
    else:
        who = "anyone" if r is not None and r.allow_self else "anyone but the requester"
        head = f"🔔 {tool(call.intent)} is still waiting for an approval: {who} may approve it."
    body = f"Asked {date(asked_at)}; it expires {date(expires_at)} unless someone decides."
    if votes.needed > 1 or votes.by:
        body += f" So far {_count(votes)}."
    blocks = [section(truncate(f"{head}\n{body}", MAX_TEXT, md.trace_pointer(thread_id)))]
    blocks += _oncall_note(unreached(entries, on_call), on_call)
    card = _card(card_link, thread_id, in_thread=True)
    return [*blocks, context(card, f"call {inline_code(call.tool_call_id)}")]


def escalation_post(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    escalate_to: Sequence[str],
    asked_at: datetime,
    expires_at: datetime,
    votes: Votes,
    card_link: str | None = None,
    channel: str = "",
    refusal: str = "",
    on_call: OnCallNow | None = None,
) -> list[Block]:
    """The post saying that the approval of ``call`` expired: what, who asked, when, and
    a link; it mentions the people and groups of ``escalate_to`` (and whoever is on call,
    ``on_call``, for its ``oncall:`` entries). ``channel``: where it is posted, outside
    the thread; with ``refusal`` (why Slack refused it there), it is posted in the
    thread instead and says so."""
    entries = on_call_entries(escalate_to)
    people = [t for t in escalate_to if not _CHANNEL.match(t) and t not in entries]
    people = list(dict.fromkeys(people + on_call_users(entries, on_call)))
    to = f"{_mentions(people)}: " if people else ""
    what = tool(call.intent)
    if summary := arguments_summary(call.arguments):
        what += f" {summary}"
    head = f"⌛ {to}an approval expired: nobody decided on {what}."
    body = f"{mention(requester)} asked for it {date(asked_at)}; it expired {date(expires_at)}"
    if votes.by:
        body += f" with {_count(votes)}"
    body += ". It did not run."
    blocks = [section(truncate(f"{head}\n{body}", MAX_TEXT, md.trace_pointer(thread_id)))]
    blocks += _oncall_note(unreached(entries, on_call), on_call)
    if channel and refusal:
        why = escape(md.one_line(refusal))[:100]
        blocks.append(context(f"⚠️ Slack refused this post in {channel_name(channel)} ({why})"))
    in_thread = not channel or bool(refusal)
    card = _card(card_link, thread_id, in_thread)
    return [*blocks, context(card, f"call {inline_code(call.tool_call_id)}")]


def _count(votes: Votes) -> str:
    """ "1 of 2 approvals", naming nobody (a name here would ping them again)."""
    return f"{len(votes.by)} of {votes.needed} approvals"


def _mentions(ids: Sequence[str]) -> str:
    """Every id as a mention (a user's, or a group's) while they fit; the rest counted."""
    shown: list[str] = []
    for n, i in enumerate(ids):
        text = approver_text(i)
        if slack_len(", ".join([*shown, text])) > MENTIONS_CHARS:
            return f"{', '.join(shown)} and {len(ids) - n} more"
        shown.append(text)
    return ", ".join(shown)


def _oncall_note(entries: Sequence[str], on_call: OnCallNow | None) -> list[Block]:
    if not entries:
        return []
    named = ", ".join(approver_text(e) for e in entries[:10])
    more = f" and {len(entries) - 10} more" if len(entries) > 10 else ""
    why = why_unreached(entries, on_call)
    return [context(truncate(f"Not notified: {named}{more}: {why}.", MAX_TEXT))]


def _card(link: str | None, thread_id: str, in_thread: bool) -> str:
    """A link to the approval card, when Slack gave a safe one; else where it is."""
    if link and len(link) <= limits.MAX_URL and _LINK.match(link):
        return f"<{link}|Open the approval card>"
    if in_thread:
        return "The approval card is in this thread"
    return f"The approval card's thread: {inline_code(f'opsloop trace {thread_id}')}"
