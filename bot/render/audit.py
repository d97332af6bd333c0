"""The answer to ``/opsloop audit``: a thread's approvals, one section per call (who
asked, the rule, every vote, refusal, edit, grant and reconcile, and what ran), shown
privately to whoever asked.

Every text that the model, a tool or a person wrote is escaped; long answers are cut
with "…and N more" and a pointer to ``opsloop trace``, within Slack's limits.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bot import mrkdwn as md
from bot.limits import MAX_MESSAGE_BLOCKS, MAX_TEXT, Block
from bot.mrkdwn import date, escape, for_people, inline_code, mention, truncate
from bot.render.approval import rule_text
from bot.render.common import People, context, excerpt, section, tool, trace
from engine.audit import CallAudit, Step
from engine.edits import UNSET, UNSET_TEXT, changes
from engine.rules import rule_name

MAX_CALLS = 20  # the latest calls shown; earlier ones are counted
ARGUMENTS_CHARS = 300  # of a call's arguments (compact JSON)
STEP_CHARS = 300  # of one step's line
RESULT_CHARS = 400  # of the result line
_STEPS_ROOM = MAX_TEXT - 1200  # what a call's steps may take of its section
# Blocks besides the calls: the heading, the "earlier calls" line and the footer.
_FRAME_BLOCKS = 3
assert MAX_CALLS + _FRAME_BLOCKS <= MAX_MESSAGE_BLOCKS

_STEP_ICONS = {
    "approved": "✅",
    "rejected": "❌",
    "refused": "🚫",
    "withdrawn": "↩️",
    "expired": "⌛",
    "edited": "✏️",
    "reminded": "🔔",
    "unknown": "❓",
    "reconciled": "🧾",
    "cancelled": "🛑",
}


def audit_blocks(
    *, thread_id: str, link: str | None, calls: Sequence[CallAudit], people: People = frozenset()
) -> list[Block]:
    """The audit of one thread: a heading, one section per call (the latest
    ``MAX_CALLS``), and where the rest of the log is. ``link``: the thread's permalink,
    when the workspace URL is known. ``people``: user ids named as mentions where a
    reason has them (the thread's requester and reviewers)."""
    named = people | {c.requester for c in calls if c.requester}
    named |= {s.actor for c in calls for s in c.steps}
    where = f"<{link}|this thread>" if link else "this thread"
    heading = f"*Approvals in {where}* · {trace(thread_id)}"
    if not calls:
        body = [section(f"{heading}\nNo call in this thread needed anyone's approval.")]
        return body
    shown = calls[-MAX_CALLS:]
    blocks = [section(heading)]
    if earlier := len(calls) - len(shown):
        blocks.append(context(f"…and {earlier} earlier calls: {trace(thread_id)} has them all"))
    first = len(calls) - len(shown) + 1
    blocks += [
        section(call_text(call, n, thread_id, frozenset(named)))
        for n, call in enumerate(shown, start=first)
    ]
    blocks.append(context(f"Calls that ran without approval are in {trace(thread_id)}."))
    return blocks


def audit_text(calls: Sequence[CallAudit]) -> str:
    """The plain text sent alongside (notifications, and clients without blocks)."""
    if not calls:
        return "No call in this thread needed anyone's approval."
    names = ", ".join(md.one_line(c.intent)[:60] for c in calls[-5:])
    return escape(truncate(f"Approvals in this thread: {len(calls)} calls ({names})", 300))


def call_text(call: CallAudit, n: int, thread_id: str, people: People = frozenset()) -> str:
    """One call's section: what was asked, under which rule, every step, the result."""
    head = [
        f"*{n}.* {tool(call.intent, 80)} asked by {mention(call.requester)} "
        f"{date(call.requested_at)} · call {inline_code(call.tool_call_id[:64])}",
        _rule_line(call, people),
        f"Arguments: {excerpt(call.arguments, ARGUMENTS_CHARS)}",
    ]
    if call.final_arguments != call.arguments:
        head.append(f"Ran with (edited): {excerpt(call.final_arguments, ARGUMENTS_CHARS)}")
    steps = _steps_text(call, thread_id, people)
    result = truncate(f"*Result:* {_result(call, people)}", RESULT_CHARS)
    text = "\n".join([*head, *([steps] if steps else []), result])
    return truncate(text, MAX_TEXT, md.trace_pointer(thread_id))


def _rule_line(call: CallAudit, people: People) -> str:
    if call.outcome == "refused_by_rule":
        where = rule_name(call.rule) if call.rule is not None else "a rule"
        why = f": {_said(call.reason, people)}" if call.reason.strip() else ""
        return truncate(f"📜 {where} refuses it{why}", STEP_CHARS)
    text = rule_text(call) or "📜 default approvers (no rule recorded with the call)"
    return truncate(text, STEP_CHARS)


def _steps_text(call: CallAudit, thread_id: str, people: People) -> str:
    """The steps, one a line, in order, within ``_STEPS_ROOM``; the rest counted."""
    lines: list[str] = []
    used = 0
    previous = call.arguments
    for i, s in enumerate(call.steps):
        line = truncate(f"• {_step(s, previous, people)}", STEP_CHARS)
        if s.kind == "edited" and s.arguments is not None:
            previous = s.arguments
        if used + md.slack_len(line) + 1 > _STEPS_ROOM:
            more = len(call.steps) - i
            lines.append(f"• …and {more} more: {trace(thread_id)}")
            break
        lines.append(line)
        used += md.slack_len(line) + 1
    return "\n".join(lines)


def _step(s: Step, previous: dict[str, Any], people: People) -> str:
    icon, when = _STEP_ICONS[s.kind], date(s.at)
    who = _actor(s.actor)
    if s.kind == "approved":
        return f"{icon} approved by {who} {when}"
    if s.kind == "rejected":
        return f"{icon} rejected by {who} {when}{_why(s.text, people)}"
    if s.kind == "refused":
        attempt = escape(md.one_line(s.decision))
        return f"{icon} {who} tried to {attempt} {when}, refused{_why(s.text, people)}"
    if s.kind == "withdrawn":
        return f"{icon} withdrawn {when}{_why(s.text, people)}"
    if s.kind == "expired":
        return f"{icon} expired {when}: nobody decided in time"
    if s.kind == "edited":
        return f"{icon} edited by {who} {when}: {_diff(previous, s.arguments or {})}"
    if s.kind == "reminded":
        return f"{icon} approvers reminded {when}"
    if s.kind == "unknown":
        return f"{icon} outcome unknown {when}{_why(s.text, people)}"
    if s.kind == "reconciled":
        said = {"happened": "it happened", "retry": "run it again", "abandon": "it did not happen"}
        decided = said.get(s.decision, escape(s.decision))
        return f"{icon} {who} said {decided} {when}{_why(s.text, people)}"
    return f"{icon} cancelled by {who} {when}{_why(s.text, people)}"


def _result(call: CallAudit, people: People) -> str:
    when = f" {date(call.outcome_at)}" if call.outcome_at else ""
    outcome = call.outcome
    if outcome == "ok":
        attempts = f" (attempt {call.attempts})" if call.attempts > 1 else ""
        return f"✅ ran{attempts}{when}: {excerpt(call.output, 200)}"
    if outcome == "error":
        return f"❌ failed{when}: {excerpt(call.error or 'an error', 200)}"
    if outcome == "happened":
        return f"✅ it happened, a person said{when}{_why(str(call.output or ''), people)}"
    if outcome == "awaiting_approval":
        expires = f", expires {date(call.expires_at)}" if call.expires_at else ""
        return f"⏳ waiting for approval: {len(call.votes)} of {call.quorum}{expires}"
    labels = {
        "approved": "▶️ approved; not started yet",
        "running": "⚙️ running",
        "unknown": "❓ outcome unknown: waiting for a person to say whether it happened",
        "abandoned": "🚫 did not happen, a person said; not run again",
        "refused_by_rule": "🚫 refused by the policy; never ran",
        "rejected": "❌ rejected; never ran",
        "withdrawn": "↩️ withdrawn; never ran",
        "expired": "⌛ expired; never ran",
        "cancelled": "🛑 cancelled",
        "failed": f"💥 the thread failed{_why(call.error, people)}",
    }
    return labels[outcome] + when


def _actor(actor: str) -> str:
    """A person as a mention; a grant as ``grant `g_1```; anything else escaped."""
    if actor.startswith("grant:"):
        return f"grant {inline_code(actor.removeprefix('grant:')[:64])}"
    return mention(actor)


def _said(text: str, people: People) -> str:
    """Free text (a reason, a note, an error) on one line, escaped, people's ids named."""
    flat = md.fence_safe(escape(md.one_line(text)))
    return for_people(truncate(flat, STEP_CHARS - 80), people)


def _why(text: str, people: People) -> str:
    return f": {_said(text, people)}" if text.strip() else ""


def _diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """ "environment: `staging` → `production`": the top-level arguments an edit changed
    (as the card and the model read them: engine.edits.changes)."""
    changed = [
        f"{escape(md.one_line(c.name))[:40]}: {_value(c.before)} → {_value(c.after)}"
        for c in changes(before, after)
    ]
    return truncate("; ".join(changed), STEP_CHARS - 60) if changed else "no change"


def _value(value: Any) -> str:
    return UNSET_TEXT if value is UNSET else excerpt(value, 60)
