"""Block Kit rendering: pure functions of events and state to Slack message JSON.

What a Slack thread shows is a projection of the log (DESIGN, "Slack"): the approval
card and its decided form, one compact line per event people need to see, the thread's
status line, the reject-reason modal, and the plain ``text`` sent alongside for
notifications. Every text that the model, a tool or a person wrote goes through
:func:`bot.mrkdwn.escape`; our own mentions and dates are the only ``<…>`` tokens.

Every renderer keeps within Slack's limits (:mod:`bot.limits`: its ``check_limits``
lists violations and the tests run it on every renderer with oversized inputs).

Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol

from bot import mrkdwn as md
from bot.limits import (
    MAX_BUTTON_TEXT,
    MAX_BUTTON_VALUE,
    MAX_CONFIRM,
    MAX_CONTEXT_ELEMENTS,
    MAX_FALLBACK_TEXT,
    MAX_FIELD_TEXT,
    MAX_HEADER_TEXT,
    MAX_ID,
    MAX_INPUT_LABEL,
    MAX_MESSAGE_BLOCKS,
    MAX_PLACEHOLDER,
    MAX_TEXT,
    MAX_VIEW_TITLE,
    Block,
)
from bot.mrkdwn import date, escape, for_people, inline_code, mention, truncate
from engine import events as ev
from engine.state import PendingCall, SaidSince, ThreadState
from engine.trace import summarize

Outcome = Literal["approved", "rejected", "expired", "cancelled"]
# What became of a call whose outcome was unknown, as its reconcile card says.
ReconcileOutcome = Literal["happened", "retry", "abandon", "cancelled"]

APPROVE_ACTION = "opsloop_approve"
REJECT_ACTION = "opsloop_reject"
CANCEL_ACTION = "opsloop_cancel"
REJECT_CALLBACK = "opsloop_reject_reason"
REASON_BLOCK = REASON_ACTION = "reason"
APPROVAL_BLOCK_PREFIX = "opsloop_approval:"
HAPPENED_ACTION = "opsloop_reconcile_happened"  # opens the note modal
RETRY_ACTION = "opsloop_reconcile_retry"
ABANDON_ACTION = "opsloop_reconcile_abandon"
NOTE_CALLBACK = "opsloop_reconcile_note"
NOTE_BLOCK = NOTE_ACTION = "note"
RECONCILE_BLOCK_PREFIX = "opsloop_reconcile:"

REASON_MAX_LENGTH = 2000  # our limit on a reject reason
NOTE_MAX_LENGTH = 2000  # our limit on a reconcile note

LINE_EXCERPT = 300  # a compact line shows this much of arguments, outputs, errors
CARD_ARGUMENTS = 2800
NOTE_EXCERPT = 150  # a card quotes this much of a message written since it was posted

# How people see each type is one of its facts (engine.events.Facts): a line of its own
# (rendered by ``LINES``), or on the approval or reconcile card.
SHOWN_TYPES = frozenset(ev.type_name(c) for c in ev.EVENT_CLASSES if c.facts.people == "line")
CARD_TYPES = frozenset(ev.type_name(c) for c in ev.EVENT_CLASSES if c.facts.people == "card")
# Statuses in which the thread can be cancelled (the reducer refuses it when "new").
ACTIVE = frozenset(
    {
        "running",
        "awaiting_approval",
        "awaiting_reply",
        "awaiting_job",
        "awaiting_reconcile",
        "sleeping",
    }
)


class CallLike(Protocol):
    """A ``tool_call_requested`` event or a ``PendingCall``."""

    @property
    def tool_call_id(self) -> str: ...
    @property
    def intent(self) -> str: ...
    @property
    def arguments(self) -> dict[str, Any]: ...


People = frozenset[str]  # the Slack user ids of a thread's people: named as mentions


@dataclass(frozen=True)
class Notes:
    """Messages people wrote while a card was open: the latest few, and how many."""

    latest: Sequence[SaidSince] = ()
    count: int = 0


NO_NOTES = Notes()


class Binding(NamedTuple):
    """What a button or modal is about: exactly one pending call of one thread."""

    thread_id: str
    tool_call_id: str
    arguments_hash: str


def binding_value(thread_id: str, tool_call_id: str, arguments_hash: str) -> str:
    """Compact JSON ``{"t", "c", "h"}`` for a button value or a modal's metadata."""
    value = json.dumps(
        {"t": thread_id, "c": tool_call_id, "h": arguments_hash}, separators=(",", ":")
    )
    if len(value) > MAX_BUTTON_VALUE:
        raise ValueError(f"ids too long for a button value ({len(value)} characters)")
    return value


def parse_binding(value: str | None) -> Binding:
    """The binding in a click's ``value``; ``ValueError`` if malformed or forged."""
    try:
        data = json.loads(value or "")
    except ValueError as exc:
        raise ValueError("not a binding: not JSON") from exc
    if not isinstance(data, dict) or set(data) != {"t", "c", "h"}:
        raise ValueError("not a binding: wrong keys")
    if not all(isinstance(data[k], str) and data[k] for k in ("t", "c", "h")):
        raise ValueError("not a binding: empty or non-string ids")
    return Binding(data["t"], data["c"], data["h"])


# --- small builders ---------------------------------------------------------------------


def _plain(text: str, limit: int = MAX_TEXT) -> dict[str, Any]:
    """plain_text, escaped too: Slack decodes the three entities everywhere."""
    return {"type": "plain_text", "text": truncate(escape(text), limit) or " ", "emoji": True}


def _mrkdwn(text: str, limit: int = MAX_TEXT) -> dict[str, Any]:
    """mrkdwn from text that is already escaped (or ours)."""
    return {"type": "mrkdwn", "text": truncate(text, limit) or " "}


def _section(text: str, **extra: Any) -> Block:
    return {"type": "section", "text": _mrkdwn(text), **extra}


def _context(*texts: str) -> Block:
    return {"type": "context", "elements": [_mrkdwn(t) for t in texts[:MAX_CONTEXT_ELEMENTS]]}


def _header(text: str) -> Block:
    return {"type": "header", "text": _plain(text, MAX_HEADER_TEXT)}


def _confirm(title: str, text: str, confirm: str, deny: str, style: str) -> dict[str, Any]:
    return {
        "title": _plain(title, MAX_CONFIRM["title"]),
        "text": _mrkdwn(text, MAX_CONFIRM["text"]),
        "confirm": _plain(confirm, MAX_CONFIRM["confirm"]),
        "deny": _plain(deny, MAX_CONFIRM["deny"]),
        "style": style,
    }


def _button(text: str, action_id: str, value: str, style: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "text": _plain(text, MAX_BUTTON_TEXT),
        "action_id": action_id,
        "value": value,
        "style": style,
        **extra,
    }


def _excerpt(value: Any, limit: int = LINE_EXCERPT) -> str:
    """``value`` as escaped one-line inline code, at most ``limit`` characters of it."""
    text = value if isinstance(value, str) else md.compact_json(value)
    return inline_code(truncate(md.one_line(text), limit))


def _short(text: str, limit: int = LINE_EXCERPT) -> str:
    """Escaped one-line excerpt of a free text (an error, a reason)."""
    return truncate(md.fence_safe(escape(md.one_line(text))), limit)


def _tool(name: str, limit: int = 100) -> str:
    """A tool name in bold: escaped, on one line, ``*`` and backticks neutralised."""
    flat = escape(md.one_line(name)).replace("*", "∗").replace("`", "ˋ")
    return f"*{truncate(flat, limit)}*"


# --- the approval card ------------------------------------------------------------------


class Votes(NamedTuple):
    """The approvals a call has (distinct reviewers, in order) and how many it needs."""

    by: tuple[str, ...] = ()
    needed: int = 1


NO_VOTES = Votes()


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
) -> list[Block]:
    """The card asking a reviewer to approve ``call``, bound to it by its arguments hash.

    ``arguments_hash`` defaults to ``call.arguments_hash`` (a ``PendingCall`` has it; a
    ``tool_call_requested`` event does not, so pass the ``approval_requested`` one).
    ``notes``: what people wrote since the card was posted, shown before the buttons.
    ``people``: user ids named as mentions in the model's reason. ``votes``: the
    approvals so far (default: none, of the call's quorum); the card stays open, showing
    them, until enough distinct reviewers approved.
    """
    args_hash = arguments_hash or getattr(call, "arguments_hash", "")
    if not args_hash:
        raise ValueError("an approval card needs the call's arguments hash")
    votes = votes or Votes(needed=_quorum(call))
    value = binding_value(thread_id, call.tool_call_id, args_hash)
    left = votes.needed - len(votes.by)
    runs = (
        f"opsloop runs {_tool(call.intent, 60)} with the arguments shown, "
        f"as {mention(requester)} asked."
        if left <= 1
        else f"Your approval counts as one of the {votes.needed} that "
        f"{_tool(call.intent, 60)} needs before it runs."
    )
    approve = _button(
        "Approve",
        APPROVE_ACTION,
        value,
        "primary",
        confirm=_confirm(f"Run {md.one_line(call.intent)}?", runs, "Approve", "Not yet", "primary"),
    )
    actions = {
        "type": "actions",
        "block_id": (APPROVAL_BLOCK_PREFIX + call.tool_call_id)[:MAX_ID],
        "elements": [approve, _button("Reject", REJECT_ACTION, value, "danger")],
    }
    expiry = _context(
        f"⏳ Expires {date(expires_at)} · call {inline_code(call.tool_call_id)}",
        *_policy_hash(call),
    )
    body = _card_body(
        f"Approval needed: {call.intent}", thread_id, requester, call, reason, notes, people
    )
    progress = [_section(progress_text(votes))] if votes.needed > 1 or votes.by else []
    return [*body, *_rule_blocks(call), *progress, expiry, actions]


_OUTCOME_TITLES: dict[str, str] = {
    "approved": "Approved",
    "rejected": "Rejected",
    "expired": "Approval expired",
    "cancelled": "Cancelled",
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
) -> list[Block]:
    """The card after the decision: no buttons, and who decided what, when and why.

    Takes the inputs of :func:`approval_card` (``reason`` stays the model's stated
    reason, ``notes`` what people wrote while it was open) plus the outcome;
    ``decision_reason`` is the reviewer's reject reason. ``votes``: the approvals it
    had; an approved card names every approver (``by`` alone when there are none).
    """
    del expires_at, arguments_hash  # same inputs as the card; the outcome replaces them
    # Slack renders the date as "today at 6:25 PM" or "Dec 1st at 6:25 PM": no "at".
    when = date(at)
    if outcome == "approved":
        line = f"✅ Approved by {_people(votes.by or (by,))} {when}"
    elif outcome == "rejected":
        line = f"❌ Rejected by {mention(by)} {when}"
        if votes.by:
            line += f" (after approvals by {_people(votes.by)})"
        if decision_reason.strip():
            line += f" — {escape(decision_reason.strip())}"
    elif outcome == "expired":
        line = f"⌛ Expired {when}: nobody decided in time"
        if votes.by:
            line = f"⌛ Expired {when} with {progress_text(votes, icon='')}"
    else:
        line = f"🚫 Cancelled by {mention(by)} {when}" if by else f"🚫 Cancelled {when}"
    title = f"{_OUTCOME_TITLES[outcome]}: {call.intent}"
    return [
        *_card_body(title, thread_id, requester, call, reason, notes, people),
        *_rule_blocks(call),
        _context(f"call {inline_code(call.tool_call_id)}", *_policy_hash(call)),
        _section(truncate(line, MAX_TEXT, md.trace_pointer(thread_id))),
    ]


# --- the rule that decided, and the quorum ----------------------------------------------

MAX_NAMED = 20  # approvers (or voters) named on a card; the rest are counted


def _quorum(call: CallLike) -> int:
    return max(1, int(getattr(call, "quorum", 1) or 1))


def approver_text(approver: str) -> str:
    """One approver list entry as mrkdwn: a mention, a group mention, or the on-call."""
    if approver.startswith("oncall:"):
        return f"whoever is on call ({escape(approver.removeprefix('oncall:'))})"
    if md.GROUP_ID.match(approver):
        return md.group_mention(approver)
    return mention(approver)


def _people(ids: Sequence[str | None]) -> str:
    named = [approver_text(i) if i else mention(i) for i in ids[:MAX_NAMED]]
    more = len(ids) - len(named)
    if more:
        named.append(f"{more} more")
    if len(named) <= 2:
        return " and ".join(named)
    return f"{', '.join(named[:-1])} and {named[-1]}"


def rule_text(call: CallLike) -> str | None:
    """ "rule 3: needs 2 of @sre": who may approve ``call`` under the rule that decided.

    None for a call that records no rule and no reviewer rule (the process's approvers
    decide, as before policy files)."""
    rule: int | None = getattr(call, "rule", None)
    approvers: Sequence[str] | None = getattr(call, "approvers", None)
    quorum = _quorum(call)
    if rule is None and approvers is None and quorum == 1:
        return None
    where = f"rule {rule + 1}" if rule is not None else "default approvers"
    if approvers:
        who = f"{quorum} of {_people(list(approvers))}"
    else:
        who = f"{quorum} approval{'s' if quorum > 1 else ''}, from anyone but the requester"
    text = f"📜 {where}: needs {who}"
    if getattr(call, "allow_self", None):
        text += " (the requester may approve too)"
    if approvers and any(a.startswith("oncall:") for a in approvers):
        text += " · on-call lookups are not connected yet, so an on-call entry matches nobody"
    return truncate(text, MAX_TEXT)


def _rule_blocks(call: CallLike) -> list[Block]:
    text = rule_text(call)
    return [_context(text)] if text else []


def _policy_hash(call: CallLike) -> list[str]:
    digest = getattr(call, "policy_hash", None)
    return [f"policy {inline_code(str(digest)[:12])}"] if digest else []


def progress_text(votes: Votes, icon: str = "🗳️ ") -> str:
    """ "1 of 2: @bob": the approvals so far."""
    if not votes.by:
        return f"{icon}0 of {votes.needed} approvals so far"
    return f"{icon}{len(votes.by)} of {votes.needed}: {_people(votes.by)}"


def _card_body(
    title: str,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    reason: str,
    notes: Notes = NO_NOTES,
    people: People = frozenset(),
) -> list[Block]:
    who = {
        "type": "section",
        "fields": [
            _mrkdwn(f"*Requested by*\n{mention(requester)}", MAX_FIELD_TEXT),
            _mrkdwn(f"*Tool*\n{_tool(call.intent)}", MAX_FIELD_TEXT),
        ],
    }
    label = "*Arguments*\n"
    arguments = md.code_block(
        md.pretty_json(call.arguments),
        CARD_ARGUMENTS - len(label),
        md.trace_pointer(thread_id),
    )
    named = people | {requester} if requester else people
    why = for_people(escape(reason.strip()), named) if reason.strip() else ""
    why = truncate(
        f"*Why*\n{why or '_The model gave no reason._'}", MAX_TEXT, md.trace_pointer(thread_id)
    )
    note = [_section(_notes_text(notes, named))] if notes.latest else []
    return [_header(title), *note, who, _section(label + arguments), _section(why)]


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


# --- the reconcile card: a call whose outcome is unknown --------------------------------


def reconcile_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
    arguments_hash: str,
    people: People = frozenset(),
) -> list[Block]:
    """The card asking a person whether an interrupted call took effect.

    Says what was running (the tool, its arguments), since when, what was observed, who
    may decide, and offers **It happened** (a note modal), **Run it again** and **It
    did not happen**, each bound to exactly this call by its arguments hash.
    """
    value = binding_value(thread_id, call.tool_call_id, arguments_hash)
    tool = _tool(call.intent, 60)
    retry = _button(
        "Run it again",
        RETRY_ACTION,
        value,
        "primary",
        confirm=_confirm(
            f"Run {md.one_line(call.intent)} again?",
            f"If the first run did happen, {tool} may take effect twice "
            "(it gets the same idempotency key).",
            "Run it again",
            "Not yet",
            "primary",
        ),
    )
    abandon = _button(
        "It did not happen",
        ABANDON_ACTION,
        value,
        "danger",
        confirm=_confirm(
            "It did not happen?",
            f"opsloop does not run {tool} again; the model reads that it did not happen.",
            "It did not happen",
            "Not sure",
            "danger",
        ),
    )
    actions = {
        "type": "actions",
        "block_id": (RECONCILE_BLOCK_PREFIX + call.tool_call_id)[:MAX_ID],
        # Not styled: "It happened" is no more the default than the others.
        "elements": [
            {
                "type": "button",
                "text": _plain("It happened", MAX_BUTTON_TEXT),
                "action_id": HAPPENED_ACTION,
                "value": value,
            },
            retry,
            abandon,
        ],
    }
    return [
        *_reconcile_body(f"Did it happen? {call.intent}", thread_id, requester, call, unknown),
        *_rule_blocks(call),
        _context(f"Attempt {unknown.attempt} · call {inline_code(call.tool_call_id)}"),
        actions,
    ]


_RECONCILED: dict[str, tuple[str, str]] = {  # outcome -> (title, the line's verb)
    "happened": ("It happened", "✅ {who} said it happened"),
    "retry": ("Run again", "🔁 {who} asked to run it again"),
    "abandon": ("It did not happen", "🚫 {who} said it did not happen"),
    "cancelled": ("Cancelled", "🚫 Cancelled by {who}"),
}


def reconciled_card(
    *,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
    outcome: ReconcileOutcome,
    by: str | None,
    at: datetime,
    note: str = "",
) -> list[Block]:
    """The reconcile card after a person decided: no buttons, who said what and when.
    ``note``: what they wrote for "it happened" (the result the model reads)."""
    title, verb = _RECONCILED[outcome]
    line = f"{verb.format(who=mention(by))} {date(at)}"
    if outcome == "cancelled" and not by:
        line = f"🚫 Cancelled {date(at)}"
    if note.strip():
        line += f" — “{md.fence_safe(escape(note.strip()))}”"
    return [
        *_reconcile_body(f"{title}: {call.intent}", thread_id, requester, call, unknown),
        _context(f"Attempt {unknown.attempt} · call {inline_code(call.tool_call_id)}"),
        _section(truncate(line, MAX_TEXT, md.trace_pointer(thread_id))),
    ]


def _reconcile_body(
    title: str,
    thread_id: str,
    requester: str | None,
    call: CallLike,
    unknown: ev.ToolOutcomeUnknown,
) -> list[Block]:
    since = f" since {date(unknown.started_at)}" if unknown.started_at else ""
    what = (
        f"⚠️ {_tool(call.intent)} was running{since} when it was interrupted: opsloop "
        "cannot tell whether it took effect, and does not run it again unless a person says so."
    )
    who = {
        "type": "section",
        "fields": [
            _mrkdwn(f"*Requested by*\n{mention(requester)}", MAX_FIELD_TEXT),
            _mrkdwn(f"*Tool*\n{_tool(call.intent)}", MAX_FIELD_TEXT),
        ],
    }
    label = "*Arguments*\n"
    arguments = md.code_block(
        md.pretty_json(call.arguments), CARD_ARGUMENTS - len(label), md.trace_pointer(thread_id)
    )
    seen = []
    if unknown.error.strip():
        error = truncate(md.fence_safe(escape(unknown.error.strip())), 1000)
        seen = [_section(f"*What was observed*\n{error}")]
    return [_header(title), _section(what), who, _section(label + arguments), *seen]


# --- one line per event -----------------------------------------------------------------


class _Seen(NamedTuple):
    """What a line knows besides its event."""

    tool_name: str | None
    requester: str | None
    people: People


def event_line(
    event: ev.Event,
    *,
    tool_name: str | None = None,
    requester: str | None = None,
    people: People = frozenset(),
) -> list[Block] | None:
    """The blocks showing ``event`` in the thread, or None when it is not shown there.

    ``tool_name`` names the call of a result or retry (those events carry only its id);
    ``requester`` is pinged by a clarification question; ``people`` (user ids, the
    requester's included) are named as mentions where the model's text has their id.
    A ``tool_call_requested`` that needs approval is shown by its card, not here.
    """
    render = LINES.get(type(event))
    named = people | {requester} if requester else people
    return render(event, _Seen(tool_name, requester, named)) if render else None


def _call_name(call_id: str | None, tool_name: str | None) -> str:
    if tool_name:
        return _tool(tool_name)
    return inline_code(call_id) if call_id else "the model call"


def _tool_call(e: ev.ToolCallRequested, seen: _Seen) -> list[Block] | None:
    if e.policy == "approve_before_run":
        return None  # the approval card shows this call
    if e.policy == "reject":  # a policy rule refused it; the model reads the reason
        rule = f" by rule {e.rule + 1}" if e.rule is not None else ""
        why = f": {_short(e.reason)}" if e.reason.strip() else ""
        return [_context(f"🛑 {_tool(e.intent)} was refused{rule}{why}")]
    waits = " (waits for an external job)" if e.policy == "wait_for_external_event" else ""
    return [_context(f"🔧 {_tool(e.intent)} {_excerpt(e.arguments)}{waits}")]


def _tool_result(e: ev.ToolResult, seen: _Seen) -> list[Block]:
    who = _call_name(e.tool_call_id, seen.tool_name)
    if e.ok:
        shown = "" if e.output is None else f": {_excerpt(e.output, 200)}"
        return [_context(f"✔️ {who} done{shown}")]
    return [_context(f"⚠️ {who} failed: {_short(e.error or 'no error message')}")]


def _retry(e: ev.RetryScheduled, seen: _Seen) -> list[Block]:
    who = _call_name(e.tool_call_id, seen.tool_name)
    return [
        _context(
            f"🔁 Attempt {e.attempt} of {who} failed: {_short(e.error, 200)}; "
            f"retrying {date(e.wake_at)}"
        )
    ]


def _wait_started(e: ev.WaitStarted, seen: _Seen) -> list[Block]:
    return [
        _context(f"⏳ Waiting for {_short(e.description, 500)} (gives up {date(e.timeout_at)})")
    ]


def _wait_finished(e: ev.WaitFinished, seen: _Seen) -> list[Block]:
    shown = f": {_excerpt(e.result, 200)}" if e.result else ""
    return [_context(f"✔️ The wait is over{shown}")]


def _wait_timed_out(e: ev.WaitTimedOut, seen: _Seen) -> list[Block]:
    return [_context(f"⌛ Gave up waiting ({inline_code(e.wait_id)}): it timed out")]


def _question(e: ev.ClarificationRequested, seen: _Seen) -> list[Block]:
    ping = f"{mention(seen.requester)} " if seen.requester else ""
    question = for_people(escape(e.question), seen.people)
    text = truncate(f"❓ {ping}{question}", MAX_TEXT, md.trace_pointer(e.thread_id))
    return [_section(text), _context("Reply in this thread to answer.")]


def _decision_rejected(e: ev.DecisionRejected, seen: _Seen) -> list[Block]:
    return [_context(f"↩️ The model's proposal was refused: {_short(e.reason)}")]


def _error(e: ev.ErrorRaised, seen: _Seen) -> list[Block]:
    text = f"⚠️ *{_short(e.kind, 100)}*: {escape(e.message)}"
    return [
        _section(truncate(text, MAX_TEXT, md.trace_pointer(e.thread_id))),
        _context(f"This thread needs a human. Details: {_trace(e.thread_id)}"),
    ]


def _final_answer(e: ev.FinalAnswer, seen: _Seen) -> list[Block]:
    return answer_blocks(e.text, e.thread_id, people=seen.people)


def _cancelled(e: ev.ThreadCancelled, seen: _Seen) -> list[Block]:
    why = f": {_short(e.reason)}" if e.reason.strip() else ""
    return [_context(f"🚫 Cancelled by {mention(e.actor)}{why}")]


# One renderer per type people see as a line (``Facts.people == "line"``; a test checks).
LINES: dict[type[ev.Event], Callable[[Any, _Seen], list[Block] | None]] = {
    ev.ToolCallRequested: _tool_call,
    ev.ToolResult: _tool_result,
    ev.RetryScheduled: _retry,
    ev.WaitStarted: _wait_started,
    ev.WaitFinished: _wait_finished,
    ev.WaitTimedOut: _wait_timed_out,
    ev.ClarificationRequested: _question,
    ev.DecisionRejected: _decision_rejected,
    ev.ErrorRaised: _error,
    ev.FinalAnswer: _final_answer,
    ev.ThreadCancelled: _cancelled,
}


def answer_blocks(
    text: str,
    thread_id: str,
    max_blocks: int = MAX_MESSAGE_BLOCKS,
    people: People = frozenset(),
) -> list[Block]:
    """The model's text as mrkdwn sections: split over 3000 characters, at most
    ``max_blocks`` of them, the last one pointing to the trace when cut.

    ``people``: the thread's user ids, named as mentions where the text has their id."""
    shown = for_people(escape(text.strip()), people)
    chunks = md.split_text(shown, MAX_TEXT) or ["_(empty answer)_"]
    if len(chunks) > max_blocks:
        chunks = chunks[:max_blocks]
        last = truncate(chunks[-1], MAX_TEXT - 300)
        if last.count("```") % 2:  # the cut dropped the chunk's closing fence
            last += "\n```"
        chunks[-1] = f"{last}\n{md.trace_pointer(thread_id)}"
    return [_section(c) for c in chunks]


def _trace(thread_id: str) -> str:
    return inline_code(f"opsloop trace {thread_id}")


# --- the status line --------------------------------------------------------------------


def status_text(state: ThreadState, approvers: Sequence[str] = ()) -> str:
    """One line saying what the thread is doing or waiting for (mrkdwn)."""
    call = state.pending
    status = state.status
    if status == "awaiting_approval" and call is not None:
        who = _approvers_of(call, approvers) or "a reviewer"
        expires = f" (expires {date(call.expires_at)})" if call.expires_at else ""
        quorum = _quorum(call)
        done = f", {len(call.votes)} of {quorum} so far" if quorum > 1 else ""
        return f"⏸️ Waiting for approval from {who} to run {_tool(call.intent)}{expires}{done}"
    if status == "awaiting_reply":
        return f"💬 Waiting for your reply, {mention(state.requester)}: answer in this thread"
    if status == "awaiting_job" and call is not None and call.wait is not None:
        return (
            f"⏳ Waiting for job: {_short(call.wait.description, 500)} "
            f"(gives up {date(call.wait.timeout_at)})"
        )
    if status == "awaiting_reconcile" and call is not None:
        who = _approvers_of(call, approvers) or "someone"
        return (
            f"❓ {_tool(call.intent)} was interrupted: waiting for {who} to say whether it "
            "happened (see the card)"
        )
    if status == "sleeping" and state.wake_at is not None:
        return f"🔁 Retrying {date(state.wake_at)}"
    if status == "idle" and state.setback is not None:
        # Answered, but the call it asked for did not happen: not a green check.
        tool = _tool(state.setback.intent)
        return {
            "rejected": f"🛑 Ended without running {tool}: a reviewer rejected it",
            "expired": f"⌛ Ended without running {tool}: nobody approved it in time",
            "failed": f"⚠️ Ended: {tool} failed",
        }[state.setback.kind]
    return _STATUS_TEXT.get(status, "⚙️ Working…")


_STATUS_TEXT = {
    "idle": "✅ Done",
    "failed": "⚠️ Failed: needs a human",
    "cancelled": "🚫 Cancelled",
    "sleeping": "🔁 Retrying soon",
    "awaiting_approval": "⏸️ Waiting for approval",
    "awaiting_job": "⏳ Waiting for a job",
    "awaiting_reconcile": "❓ Waiting for a person to say whether a call happened",
}


def _approvers_of(call: PendingCall, process: Sequence[str]) -> str:
    """Who may decide ``call``: its recorded approvers, else the process's."""
    named = list(call.approvers if call.approvers is not None else process)
    return ", ".join(approver_text(a) for a in named[:10])


def status_message(
    state: ThreadState, thread_id: str, *, approvers: Sequence[str] = ()
) -> list[Block]:
    """The thread's status line, with a Cancel button while the thread is active.

    ``approvers`` (user and user-group ids) are named while an approval is awaited.
    """
    section = _section(status_text(state, approvers))
    if state.status in ACTIVE:
        section["accessory"] = _button(
            "Cancel",
            CANCEL_ACTION,
            thread_id,
            "danger",
            confirm=_confirm(
                "Cancel this thread?",
                "opsloop stops working on it. A tool call already running is not undone.",
                "Cancel thread",
                "Keep going",
                "danger",
            ),
        )
    return [section, _context(f"Thread {inline_code(thread_id)} · full log: {_trace(thread_id)}")]


# --- the reject modal -------------------------------------------------------------------


def reject_modal(
    *, thread_id: str, tool_call_id: str, arguments_hash: str, tool_name: str
) -> dict[str, Any]:
    """The ``views.open`` modal asking for an optional reason to reject a call."""
    return {
        "type": "modal",
        "callback_id": REJECT_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": _plain("Reject tool call", MAX_VIEW_TITLE),
        "submit": _plain("Reject", MAX_VIEW_TITLE),
        "close": _plain("Cancel", MAX_VIEW_TITLE),
        "blocks": [
            _section(f"Reject {_tool(tool_name)}? The model sees your reason."),
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "optional": True,
                # Slack adds "(optional)" to an optional input's label itself.
                "label": _plain("Reason", MAX_INPUT_LABEL),
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_ACTION,
                    "multiline": True,
                    "max_length": REASON_MAX_LENGTH,
                    "placeholder": _plain("What should it do instead?", MAX_PLACEHOLDER),
                },
            },
        ],
    }


def note_modal(
    *, thread_id: str, tool_call_id: str, arguments_hash: str, tool_name: str
) -> dict[str, Any]:
    """The ``views.open`` modal for **It happened**: an optional note, the result the
    model reads (without one, "a person confirmed it happened")."""
    return {
        "type": "modal",
        "callback_id": NOTE_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": _plain("It happened", MAX_VIEW_TITLE),
        "submit": _plain("It happened", MAX_VIEW_TITLE),
        "close": _plain("Cancel", MAX_VIEW_TITLE),
        "blocks": [
            _section(f"{_tool(tool_name)} took effect? The model reads your note as its result."),
            {
                "type": "input",
                "block_id": NOTE_BLOCK,
                "optional": True,
                "label": _plain("What happened", MAX_INPUT_LABEL),
                "element": {
                    "type": "plain_text_input",
                    "action_id": NOTE_ACTION,
                    "multiline": True,
                    "max_length": NOTE_MAX_LENGTH,
                    "placeholder": _plain("e.g. the service restarted at 10:02", MAX_PLACEHOLDER),
                },
            },
        ],
    }


# --- the notification text --------------------------------------------------------------


def fallback_text(blocks_or_event: Sequence[Block] | ev.Event) -> str:
    """The plain ``text`` sent with blocks (notifications, screen readers), escaped."""
    if isinstance(blocks_or_event, ev.Event):
        blocks = event_line(blocks_or_event)
        if blocks is None:
            return truncate(escape(summarize(blocks_or_event)), MAX_FALLBACK_TEXT) or " "
        blocks_or_event = blocks
    parts = [_strip_fences(t) for t in _texts(blocks_or_event)]
    text = " · ".join(p for p in parts if p.strip()) or "opsloop"
    return truncate(text, MAX_FALLBACK_TEXT)


def _texts(blocks: Iterable[Block]) -> Iterable[str]:
    for block in blocks:
        if block.get("type") in ("header", "section") and isinstance(block.get("text"), dict):
            yield block["text"].get("text", "")
        for field in block.get("fields") or ():
            yield field.get("text", "")
        if block.get("type") == "context":
            for element in block.get("elements") or ():
                yield element.get("text", "")


def _strip_fences(text: str) -> str:
    return md.one_line(text.replace("```", " ").replace(md.ZWSP, ""))
