"""The approval card: asks a reviewer to approve one call, bound to it by its arguments
hash; updated in place while it is open (a message written since, a vote short of the
quorum, a reviewer's edit of the arguments, shown as a diff) and once decided (who
decided what, when and why; no buttons).

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

from bot import mrkdwn as md
from bot.limits import MAX_ID, MAX_TEXT, Block
from bot.mrkdwn import date, escape, for_people, mention, truncate
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
    people_text,
    section,
    short,
    tool,
)
from bot.render.readable import tool_title
from engine import events as ev
from engine.edits import Change, value_text
from engine.grants import ANY, grant_seconds, grant_terms
from engine.rules import rule_name
from engine.state import SaidSince

# "refused": an edit gave the call arguments the policy refuses.
Outcome = Literal["approved", "rejected", "expired", "withdrawn", "cancelled", "refused"]

APPROVE_ACTION = "opsloop_approve"
GRANT_ACTION = "opsloop_approve_for"  # "Approve for 1 h": the vote and a standing grant
EDIT_ACTION = "opsloop_edit"
REJECT_ACTION = "opsloop_reject"
EDITS_SHOWN = 3  # the latest edits a card lists (the count goes on)
CHANGES_SHOWN = 10  # of one edit
APPROVAL_BLOCK_PREFIX = "opsloop_approval:"
NOTE_EXCERPT = 150  # a card quotes this much of a message written since it was posted
DIALOG_NAMED = 5  # approvers a confirm dialog names (its text holds 300 characters)


@dataclass(frozen=True)
class Notes:
    """Messages people wrote while a card was open: the latest few, and how many."""

    latest: Sequence[SaidSince] = ()
    count: int = 0


NO_NOTES = Notes()


class Votes(NamedTuple):
    """The approvals a call has (distinct reviewers, in order) and how many it needs."""

    by: tuple[str, ...] = ()
    needed: int = 1


NO_VOTES = Votes()


class Edited(NamedTuple):
    """A reviewer's edit of the card's call: who, when, and what changed."""

    by: str
    at: datetime
    changes: tuple[Change, ...]


def approval_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    reason: str,
    expires_at: datetime,
    arguments_hash: str | None = None,
    notes: Notes = NO_NOTES,
    people: People = frozenset(),
    votes: Votes | None = None,
    edits: Sequence[Edited] = (),
    reminded_at: datetime | None = None,
) -> list[Block]:
    """The card asking a reviewer to approve ``call``, bound to it by its arguments hash.

    ``arguments_hash`` defaults to ``call.arguments_hash`` (a ``PendingCall`` has it; a
    ``tool_call_requested`` event does not, so pass the ``approval_requested`` one).
    ``notes``: what people wrote since the card was posted, shown before the buttons.
    ``people``: user ids named as mentions in the model's reason. ``votes``: the
    approvals so far (default: none, of the call's quorum); the card stays open, showing
    them, until enough distinct reviewers approved. ``edits``: reviewers' edits of the
    arguments (``call`` has the latest), shown as a diff under them. ``reminded_at``:
    when its approvers were reminded in the thread.
    """
    args_hash = arguments_hash or getattr(call, "arguments_hash", "")
    if not args_hash:
        raise ValueError("an approval card needs the call's arguments hash")
    votes = votes or Votes(needed=_quorum(call))
    value = binding_value(thread_id, call.tool_call_id, args_hash)
    # Slack shows the same dialog to every clicker, before the engine is asked: it says
    # what an approval does and who may give one, never "your approval counts".
    sure = confirm(
        f"Approve {tool_title(call.intent)}?",
        approve_text(call, votes),
        "Approve",
        "Not yet",
        "primary",
    )
    approve = button("Approve", APPROVE_ACTION, value, "primary", confirm=sure)
    actions = {
        "type": "actions",
        "block_id": (APPROVAL_BLOCK_PREFIX + call.tool_call_id)[:MAX_ID],
        "elements": [
            approve,
            *_grant_button(call, votes, value),
            button("Edit", EDIT_ACTION, value, None),
            button("Reject", REJECT_ACTION, value, "danger"),
        ],
    }
    reminded = f" · 🔔 Reminded {date(reminded_at)}" if reminded_at is not None else ""
    # The call's id and the policy's hash are the trace's, not people's.
    expiry = context(f"⏳ Expires {date(expires_at)}{reminded}")
    body = _card_body(
        f"Approval needed: {tool_title(call.intent)}",
        thread_id,
        requester,
        call,
        reason,
        notes,
        people,
        edits,
    )
    progress = [section(progress_text(votes))] if votes.needed > 1 or votes.by else []
    return [*body, *rule_blocks(call), *progress, expiry, actions]


def approve_text(call: CallLike, votes: Votes) -> str:
    """The Approve dialog: what an approval does, true whoever clicks (the card is
    updated after each vote, so "so far" is current)."""
    name = tool(tool_title(call.intent), 60)
    if votes.needed <= 1:
        what = f"{name} runs with the arguments shown once it is approved."
    else:
        what = (
            f"{name} runs with the arguments shown once {votes.needed} different people "
            f"have approved it ({len(votes.by)} so far); each person counts once."
        )
    return f"{what} {deciders_text(call, 'approve')}"


def deciders_text(call: CallLike, verb: str) -> str:
    """ "Only @bob and @carol may approve, not the requester.": who may decide ``call``
    by its rule, for a dialog Slack shows alike to every clicker (the reconcile card's
    too: a reconcile is held to the approval's rule)."""
    r = call.reviewers
    if r is None:  # a call from before rules were recorded: the process's approvers
        return f"Only opsloop's approvers may {verb}."
    if not r.approvers:
        return f"Anyone may {verb}." if r.allow_self else f"Anyone but the requester may {verb}."
    named = people_text(sorted(r.approvers), limit=DIALOG_NAMED)
    return f"Only {named} may {verb}" + ("." if r.allow_self else ", not the requester.")


def _grant_button(call: CallLike, votes: Votes, value: str) -> list[Block]:
    """ "Approve for 1 h" (or the rule's shorter max_grant) when the call's rule allows
    standing grants and one vote decides it. It opens a modal (the grant's span, scope
    and which arguments may vary), which is its confirmation too."""
    max_grant_s = getattr(call, "max_grant_s", None)
    if max_grant_s is None or votes.needed != 1:
        return []
    span = duration_text(grant_seconds(max_grant_s))
    return [button(f"Approve for {span}", GRANT_ACTION, value, None)]


def grant_note(grant: ev.GrantCreated) -> str:
    """What a grant made with an approval lets through: "🎟️ … until 3:40 PM"."""
    terms = grant_terms(grant.arguments_schema)
    varies = sorted(k for k, v in (terms or {}).items() if v is ANY)
    like = (
        "with these exact arguments"
        if terms is not None and not varies
        else f"with any {', '.join(md.inline_code(k) for k in varies)} and the rest as now"
        if varies
        else "with matching arguments"
    )
    where = "in any thread of this channel" if grant.scope == "channel" else "in this thread"
    return (
        f"🎟️ {mention(grant.reviewer)} also granted calls of {tool(grant.tool, 60)} {like}"
        f" {where} until {date(grant.until)} (/opsloop grants to revoke)"
    )


def duration_text(seconds: float) -> str:
    """``1 h``, ``30 min``, ``45 s``, ``1 h 30 min``: a grant's span on its button."""
    whole = max(int(seconds), 1)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] * bool(hours) + [f"{minutes} min"] * bool(minutes)
    return " ".join(parts + [f"{secs} s"] * bool(secs and not hours)) or "0 s"


_OUTCOME_TITLES: dict[str, str] = {
    "approved": "Approved",
    "rejected": "Rejected",
    "expired": "Approval expired",
    "withdrawn": "Withdrawn",
    "cancelled": "Cancelled",
    "refused": "Refused by the policy",
}


def decided_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    reason: str,
    expires_at: datetime,
    outcome: Outcome,
    by: str | None,
    at: datetime,
    decision_reason: str = "",
    arguments_hash: str | None = None,
    notes: Notes = NO_NOTES,
    people: People = frozenset(),
    votes: Votes = NO_VOTES,
    edits: Sequence[Edited] = (),
    grant: ev.GrantCreated | None = None,
) -> list[Block]:
    """The card after the decision: no buttons, and who decided what, when and why.

    Takes the inputs of :func:`approval_card` (``reason`` stays the model's stated
    reason, ``notes`` what people wrote while it was open) plus the outcome;
    ``decision_reason`` is the reviewer's reject reason (or the policy's, when an edit
    was refused). ``votes``: the approvals it had; an approved card names every
    approver (``by`` alone when there are none). ``edits`` stay shown. ``grant``: the
    standing grant the deciding vote made too, which the card says how far it reaches.
    """
    del expires_at, arguments_hash  # same inputs as the card; the outcome replaces them
    # Slack renders the date as "today at 6:25 PM" or "Dec 1st at 6:25 PM": no "at".
    when = date(at)
    if outcome == "approved":
        line = f"✅ Approved by {people_text(votes.by or (by,))} {when}"
        if grant is not None:
            line += "\n" + grant_note(grant)
    elif outcome == "rejected":
        line = f"❌ Rejected by {mention(by)} {when}"
        if votes.by:
            line += f" (after approvals by {people_text(votes.by)})"
        if decision_reason.strip():
            line += f" — {escape(decision_reason.strip())}"
    elif outcome == "expired":
        line = f"⌛ Expired {when}: nobody decided in time"
        if votes.by:
            line = f"⌛ Expired {when} with {progress_text(votes, icon='')}"
    elif outcome == "withdrawn":
        # The requester wrote again: the model decides anew; nothing of this card runs.
        line = f"↩️ Withdrawn {when}: {mention(by)} wrote since"
        if votes.by:
            line += f" (it had {progress_text(votes, icon='')})"
    elif outcome == "refused":
        # An edit gave it arguments the policy refuses: it is closed, nothing runs.
        line = f"⛔ Refused by the policy {when}, after {mention(by)}'s edit"
        if decision_reason.strip():
            line += f" — {escape(decision_reason.strip())}"
    else:
        line = f"🚫 Cancelled by {mention(by)} {when}" if by else f"🚫 Cancelled {when}"
    title = f"{_OUTCOME_TITLES[outcome]}: {tool_title(call.intent)}"
    return [
        *_card_body(title, thread_id, requester, call, reason, notes, people, edits),
        *rule_blocks(call),
        section(truncate(line, MAX_TEXT, md.trace_pointer(thread_id))),
    ]


# --- the rule that decided, and the quorum ----------------------------------------------


def _quorum(call: CallLike) -> int:
    return call.reviewers.quorum if call.reviewers is not None else 1


def rule_text(call: CallLike) -> str | None:
    """ "rule 3: needs 2 of @sre": who may approve ``call`` under the rule that decided.

    None for a call that records no rule and no reviewer rule (the process's approvers
    decide, as before policy files)."""
    r = call.reviewers
    if r is None:
        return None
    where = rule_name(r.rule) if r.rule is not None else "default approvers"
    if r.approvers:
        who = f"{r.quorum} of {people_text(sorted(r.approvers))}"
    else:
        who = f"{r.quorum} approval{'s' if r.quorum > 1 else ''}, from anyone but the requester"
    text = f"📜 {where}: needs {who}"
    if r.allow_self:
        text += " (the requester may approve too)"
    if r.on_call:
        text += " · who is on call is asked of PagerDuty at each click"
    return truncate(text, MAX_TEXT)


def rule_blocks(call: CallLike) -> list[Block]:
    """The rule line of a card (the reconcile card shows it too), if the call has one."""
    text = rule_text(call)
    return [context(text)] if text else []


def progress_text(votes: Votes, icon: str = "🗳️ ") -> str:
    """ "1 of 2: @bob": the approvals so far."""
    if not votes.by:
        return f"{icon}0 of {votes.needed} approvals so far"
    return f"{icon}{len(votes.by)} of {votes.needed}: {people_text(votes.by)}"


def _card_body(
    title: str,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    reason: str,
    notes: Notes = NO_NOTES,
    people: People = frozenset(),
    edits: Sequence[Edited] = (),
) -> list[Block]:
    named = people | {requester} if requester else people
    why = for_people(escape(reason.strip()), named) if reason.strip() else ""
    why = truncate(
        f"*Why*\n{why or '_The model gave no reason._'}", MAX_TEXT, md.trace_pointer(thread_id)
    )
    note = [section(_notes_text(notes, named))] if notes.latest else []
    edited = [section(edits_text(edits, thread_id))] if edits else []
    return [
        header(title),
        *note,
        call_fields(requester, call),
        arguments_section(call, thread_id),
        *edited,
        section(why),
    ]


def edits_text(edits: Sequence[Edited], thread_id: str) -> str:
    """ "✏️ Edited by @bob today at 10:02: environment: staging → production"."""
    lines = [] if len(edits) <= EDITS_SHOWN else [f"✏️ {len(edits)} edits; the latest:"]
    for edit in edits[-EDITS_SHOWN:]:
        shown = [_change_text(c) for c in edit.changes[:CHANGES_SHOWN]]
        if len(edit.changes) > CHANGES_SHOWN:
            shown.append(f"and {len(edit.changes) - CHANGES_SHOWN} more")
        what = "; ".join(shown) or "nothing"
        lines.append(f"✏️ Edited by {mention(edit.by)} {date(edit.at)}: {what}")
    return truncate("\n".join(lines), MAX_TEXT, md.trace_pointer(thread_id))


def _change_text(change: Change) -> str:
    """ "environment: staging → production", escaped, each part on one line and cut."""
    before, after = value_text(change.before), value_text(change.after)
    return f"{short(change.name, 60)}: {short(before, 80)} → {short(after, 80)}"


def _notes_text(notes: Notes, people: People) -> str:
    """``⚠️ @alice wrote since this was posted: “actually, deploy 2.0.0…”``."""
    latest = notes.latest[-1]
    slack = latest.source_kind == "slack"
    quoted = md.person_text(md.one_line(latest.text), slack=slack, people=people)
    quoted = truncate(md.fence_safe(quoted), NOTE_EXCERPT)
    who = mention(latest.actor)
    count = max(notes.count, len(notes.latest))
    if count == 1:
        return f"⚠️ {who} wrote since this was posted: “{quoted}”"
    return f"⚠️ {count} messages since this was posted; the latest, from {who}: “{quoted}”"
