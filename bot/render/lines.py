"""One compact line per event people need to see: a tool call, its result, a retry, a
wait, a question, an error, the answer, a cancellation.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from bot import mrkdwn as md
from bot.limits import MAX_MESSAGE_BLOCKS, MAX_TEXT, Block
from bot.mrkdwn import date, escape, for_people, mention, truncate
from bot.render import readable
from bot.render.alerts import alert_line
from bot.render.common import People, context, section, short, titled, trace
from bot.render.elicitation import question_blocks
from engine import events as ev
from engine.rules import rule_name

# How people see each type is one of its facts (engine.events.Facts): a line of its own
# (rendered by ``LINES``), or on the approval or reconcile card.
SHOWN_TYPES = frozenset(ev.type_name(c) for c in ev.EVENT_CLASSES if c.facts.people == "line")
CARD_TYPES = frozenset(ev.type_name(c) for c in ev.EVENT_CLASSES if c.facts.people == "card")
RESULT_EXCERPT = 1200  # of a result shown as text (the log keeps all of it)


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


def granted_line(call: ev.ToolCallRequested, reviewer: str, until: datetime) -> list[Block]:
    """A call a standing grant approved at once (no card): "approved by @bob's grant
    until 15:40"."""
    return [
        context(
            f"🔧 {titled(call.intent)}{_arguments(call.arguments)} · approved by"
            f" {mention(reviewer)}'s grant until {date(until)}"
        )
    ]


def _call_name(call_id: str | None, tool_name: str | None) -> str:
    if tool_name:
        return titled(tool_name)
    return "the call" if call_id else "the model call"  # its id is for the trace


def _arguments(arguments: dict[str, Any]) -> str:
    """ " · service: api, replicas: 6", or nothing for a call without arguments."""
    text = readable.arguments_text(arguments)
    return f" · {short(text)}" if text else ""


def _readable(value: Any) -> str:
    """A result as people read it, after what it completes: ": Scaled api" on the same
    line, ``key: value`` lines below it, or nothing."""
    text = readable.result_text(value)
    if not text:
        return ""
    shown = truncate(md.fence_safe(escape(text)), RESULT_EXCERPT)
    return f"\n{shown}" if "\n" in text or ": " in text else f": {shown}"


def _tool_call(e: ev.ToolCallRequested, seen: _Seen) -> list[Block] | None:
    if e.policy == "approve_before_run":
        return None  # the approval card shows this call
    if e.policy == "reject":  # a policy rule refused it; the model reads the reason
        rule = f" by {rule_name(e.rule)}" if e.rule is not None else ""
        why = f": {short(e.reason)}" if e.reason.strip() else ""
        return [context(f"🛑 {titled(e.intent)} was refused{rule}{why}")]
    waits = " (waits for an external job)" if e.policy == "wait_for_external_event" else ""
    return [context(f"🔧 {titled(e.intent)}{_arguments(e.arguments)}{waits}")]


def _tool_result(e: ev.ToolResult, seen: _Seen) -> list[Block]:
    who = _call_name(e.tool_call_id, seen.tool_name)
    if e.ok:
        return [context(f"✔️ {who} done{_readable(e.output)}")]
    return [context(f"⚠️ {who} failed: {short(e.error or 'no error message')}")]


def _retry(e: ev.RetryScheduled, seen: _Seen) -> list[Block]:
    who = _call_name(e.tool_call_id, seen.tool_name)
    return [
        context(
            f"🔁 Attempt {e.attempt} of {who} failed: {short(e.error, 200)}; "
            f"retrying {date(e.wake_at)}"
        )
    ]


def _wait_started(e: ev.WaitStarted, seen: _Seen) -> list[Block]:
    # A tool's question to the requester (MCP elicitation) is asked with its buttons.
    asked = question_blocks(e, requester=seen.requester, people=seen.people)
    if asked is not None:
        return asked
    return [context(f"⏳ Waiting for {short(e.description, 500)} (gives up {date(e.timeout_at)})")]


def _wait_finished(e: ev.WaitFinished, seen: _Seen) -> list[Block]:
    if e.resumes:  # a person's answer to the tool's question: what they chose, not
        action = e.result.get("action")  # what they typed (the trace has that)
        said = {"accept": "answered", "decline": "declined"}.get(str(action), "cancelled")
        return [context(f"✔️ {mention(e.actor)} {said} the question; the call goes on")]
    return [context(f"✔️ The wait is over{_readable(e.result)}")]


def _wait_timed_out(e: ev.WaitTimedOut, seen: _Seen) -> list[Block]:
    if e.resumes:
        return [context("⌛ Nobody answered the question in time: the tool is told so")]
    return [context("⌛ Gave up waiting: it timed out")]


def _question(e: ev.ClarificationRequested, seen: _Seen) -> list[Block]:
    ping = f"{mention(seen.requester)} " if seen.requester else ""
    question = for_people(escape(e.question), seen.people)
    text = truncate(f"❓ {ping}{question}", MAX_TEXT, md.trace_pointer(e.thread_id))
    # The status line says where to answer ("answer in this thread"): said once.
    return [section(text)]


def _decision_rejected(e: ev.DecisionRejected, seen: _Seen) -> list[Block]:
    return [context(f"↩️ The model's proposal was refused: {short(e.reason)}")]


def _error(e: ev.ErrorRaised, seen: _Seen) -> list[Block]:
    text = f"⚠️ *{short(e.kind, 100)}*: {escape(e.message)}"
    return [
        section(truncate(text, MAX_TEXT, md.trace_pointer(e.thread_id))),
        context(f"This thread needs a human. Details: {trace(e.thread_id)}"),
    ]


def _final_answer(e: ev.FinalAnswer, seen: _Seen) -> list[Block]:
    return answer_blocks(e.text, e.thread_id, people=seen.people)


def _alert(e: ev.AlertReceived, seen: _Seen) -> list[Block]:
    # The alert that opened the thread is its root post (bot.outbox), not a line.
    return alert_line(e)


def _cancelled(e: ev.ThreadCancelled, seen: _Seen) -> list[Block]:
    why = f": {short(e.reason)}" if e.reason.strip() else ""
    return [context(f"🚫 Cancelled by {mention(e.actor)}{why}")]


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
    ev.AlertReceived: _alert,
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
    return [section(c) for c in chunks]
