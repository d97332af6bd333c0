"""Reading a thread's log as people and scripts want it: one line or one record per event.

``summarize`` gives a short one-line summary of an event, ``trace_line`` the aligned
human line (``seq  time  actor  type  summary``), ``trace_record`` the flat JSON object
of ``opsloop trace --json``, ``usage_totals`` the model tokens a log spent.

Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from engine import events as ev
from engine.rules import rule_name

if TYPE_CHECKING:  # a type only: this module does no I/O
    from engine.types import ThreadInfo

SUMMARY_WIDTH = 80
EXCERPT_WIDTH = 60
ENVELOPE_FIELDS = ("thread_id", "seq", "event_id", "type", "created_at", "actor")
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# Column widths of ``trace_line``; longer values push the line, never cut it.
SEQ_WIDTH = 4
ACTOR_WIDTH = 18  # a Slack user id (U + 10), or an alert's source ("alert:alertmanager")
TYPE_WIDTH = max(len(t) for t in ev.EVENT_TYPES)


# --- formatting helpers ---------------------------------------------------------------


def one_line(text: str, width: int = SUMMARY_WIDTH) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``width`` with an ellipsis."""
    flat = " ".join(str(text).split())
    if len(flat) <= width:
        return flat
    return flat[: max(width - 1, 0)].rstrip() + "…"


def excerpt(value: Any, width: int = EXCERPT_WIDTH) -> str:
    """Compact JSON of ``value``, cut to ``width``."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except ValueError:  # a circular structure: no JSON, but still a summary
        text = repr(value)
    return one_line(text, width)


def iso(when: datetime) -> str:
    """ISO 8601 in UTC with a ``Z``, full precision (as the JSON of an event has it)."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def iso_seconds(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(when: datetime, ref: datetime) -> str:
    """``HH:MM:SS`` (UTC) when on the day of ``ref``, else the date too."""
    when, ref = when.astimezone(UTC), ref.astimezone(UTC)
    if when.date() == ref.date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _reason(reason: str) -> str:
    return f": {one_line(reason, EXCERPT_WIDTH)}" if reason else ""


# --- one summary per event type -------------------------------------------------------


def _user_message(e: ev.UserMessage) -> str:
    return one_line(e.text)


def _clarification_answered(e: ev.ClarificationAnswered) -> str:
    return f"answer to {e.tool_call_id}: {one_line(e.text, EXCERPT_WIDTH)}"


def _alert_received(e: ev.AlertReceived) -> str:
    return f"{e.status} {e.fingerprint}: {one_line(e.summary, EXCERPT_WIDTH)}"


def _thread_cancelled(e: ev.ThreadCancelled) -> str:
    return "cancelled" + _reason(e.reason)


def _model_decision(e: ev.ModelDecision) -> str:
    if e.tool_name == ev.CLARIFICATION_TOOL:
        question = (e.arguments or {}).get("question", "")
        text = f"clarify: {one_line(str(question), EXCERPT_WIDTH)}"
    elif e.tool_name:
        text = f"tool {e.tool_name} {excerpt(e.arguments or {})}"
    else:
        text = f"final: {one_line(e.text, EXCERPT_WIDTH)}"
    if e.stop_reason not in (None, "end_turn", "tool_use"):
        text += f" [stop={e.stop_reason}]"
    return text


def _decision_rejected(e: ev.DecisionRejected) -> str:
    call = f" {e.tool_call_id}" if e.tool_call_id else ""
    return f"rejected{call}: {one_line(e.reason, EXCERPT_WIDTH)}"


def _final_answer(e: ev.FinalAnswer) -> str:
    return one_line(e.text)


def _clarification_requested(e: ev.ClarificationRequested) -> str:
    return f"asks: {one_line(e.question, EXCERPT_WIDTH)}"


def _tool_call_requested(e: ev.ToolCallRequested) -> str:
    text = f"{e.intent}({excerpt(e.arguments)}) policy={e.policy}"
    if e.rule is not None:
        text += f" {rule_name(e.rule)}"
    if e.policy_hash:
        text += f" policy {e.policy_hash[:8]}"
    if e.quorum > 1:
        text += f" quorum {e.quorum}"
    if not e.idempotent:
        text += " non-idempotent"
    if e.escalate_to:
        text += f" escalate to {','.join(e.escalate_to)}"
    if e.max_grant_s is not None:
        text += f" max grant {e.max_grant_s:g}s"
    return text + _reason(e.reason)


def _approval_requested(e: ev.ApprovalRequested) -> str:
    until = f"until {_at(e.expires_at, e.created_at)}"
    if e.remind_at is not None:
        until += f", reminder {_at(e.remind_at, e.created_at)}"
    return f"approval of {e.tool_call_id} {until}" + _reason(e.reason)


def _approval_reminded(e: ev.ApprovalReminded) -> str:
    return f"reminded the approvers of {e.tool_call_id}"


def _grant_created(e: ev.GrantCreated) -> str:
    on = f" on {e.tool_call_id}" if e.tool_call_id else ""
    return (
        f"grant {e.grant_id}: {e.tool}({excerpt(e.arguments_schema)}) in the {e.scope}"
        f" until {_at(e.until, e.created_at)}{on}"
    )


def _grant_revoked(e: ev.GrantRevoked) -> str:
    return f"revoked grant {e.grant_id}"


def _approval_granted(e: ev.ApprovalGranted) -> str:
    if e.grant is not None and e.grant.thread_id:
        return f"approved {e.tool_call_id} by {e.grant.grant_id} of thread {e.grant.thread_id}"
    return f"approved {e.tool_call_id}"


def _approval_rejected(e: ev.ApprovalRejected) -> str:
    return f"rejected {e.tool_call_id}" + _reason(e.reason)


def _approval_refused(e: ev.ApprovalRefused) -> str:
    what = f"{e.decision} {e.tool_call_id}" if e.tool_call_id else e.decision
    return f"refused to {what}" + _reason(e.reason)


def _tool_outcome_unknown(e: ev.ToolOutcomeUnknown) -> str:
    since = f" (started {_at(e.started_at, e.created_at)})" if e.started_at else ""
    return f"outcome of {e.tool_call_id} attempt {e.attempt} unknown{since}" + _reason(e.error)


def _reconcile_decided(e: ev.ReconcileDecided) -> str:
    said = {"happened": "it happened", "retry": "run it again", "abandon": "it did not happen"}
    return f"{e.tool_call_id}: {said[e.decision]} (by {e.reviewer})" + _reason(e.note)


def _approval_edited(e: ev.ApprovalEdited) -> str:
    text = f"edited {e.tool_call_id}: {excerpt(e.arguments)}"
    if e.rule is not None:
        text += f" {rule_name(e.rule)}"
    if e.quorum > 1:
        text += f" quorum {e.quorum}"
    if e.policy == "reject":
        text += " refused by the policy"
    return text + _reason(e.reason)


def _approval_withdrawn(e: ev.ApprovalWithdrawn) -> str:
    return f"withdrew {e.tool_call_id}" + _reason(e.reason)


def _approval_expired(e: ev.ApprovalExpired) -> str:
    return f"approval of {e.tool_call_id} expired"


def _tool_started(e: ev.ToolStarted) -> str:
    return f"{e.tool_call_id} attempt {e.attempt}"


def _tool_result(e: ev.ToolResult) -> str:
    if e.ok:
        return f"ok: {excerpt(e.output)}"
    return f"error: {one_line(e.error or 'failed', EXCERPT_WIDTH)}"


def _retry_scheduled(e: ev.RetryScheduled) -> str:
    what = e.tool_call_id or "model"
    err = one_line(e.error, EXCERPT_WIDTH)
    return f"attempt {e.attempt} failed: {err}; retry at {_at(e.wake_at, e.created_at)} ({what})"


def _wait_started(e: ev.WaitStarted) -> str:
    return (
        f"wait {e.wait_id}: {one_line(e.description, 40)}; "
        f"timeout {_at(e.timeout_at, e.created_at)}"
    )


def _wait_finished(e: ev.WaitFinished) -> str:
    return f"wait {e.wait_id} finished: {excerpt(e.result)}"


def _wait_timed_out(e: ev.WaitTimedOut) -> str:
    return f"wait {e.wait_id} timed out"


def _error(e: ev.ErrorRaised) -> str:
    return f"{e.kind}: {one_line(e.message, EXCERPT_WIDTH)}"


def _message_posted(e: ev.MessagePosted) -> str:
    where = "/".join(p for p in (e.channel, e.ts) if p)
    # A stream receipt is the run's plan message, started for its input.
    what = "streamed the plan of" if e.kind == "stream" else "posted"
    return f"{what} {e.shows_event_id}" + (f" at {where}" if where else "")


def _stream_stopped(e: ev.StreamStopped) -> str:
    where = "/".join(p for p in (e.channel, e.ts) if p)
    return f"stopped the stream at {where}"


def _feedback_given(e: ev.FeedbackGiven) -> str:
    said = "👍" if e.value == "up" else "👎"
    return f"{said} ({e.value}) by {e.user} on {e.ts}"


def _stop_requested(e: ev.StopRequested) -> str:
    return f"stop pressed by {e.user}"


def _context_compacted(e: ev.ContextCompacted) -> str:
    return f"prompt compacted: seq 1–{e.upto_seq} summarised ({len(e.summary)} chars, {e.method})"


# One summary per event type, keyed by its class (a test names any type left out).
SUMMARIES: dict[type[ev.Event], Callable[[Any], str]] = {
    ev.UserMessage: _user_message,
    ev.ClarificationAnswered: _clarification_answered,
    ev.AlertReceived: _alert_received,
    ev.ThreadCancelled: _thread_cancelled,
    ev.ModelDecision: _model_decision,
    ev.DecisionRejected: _decision_rejected,
    ev.FinalAnswer: _final_answer,
    ev.ClarificationRequested: _clarification_requested,
    ev.ToolCallRequested: _tool_call_requested,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalGranted: _approval_granted,
    ev.ApprovalRejected: _approval_rejected,
    ev.ApprovalRefused: _approval_refused,
    ev.ApprovalExpired: _approval_expired,
    ev.ApprovalWithdrawn: _approval_withdrawn,
    ev.ApprovalEdited: _approval_edited,
    ev.ApprovalReminded: _approval_reminded,
    ev.GrantCreated: _grant_created,
    ev.GrantRevoked: _grant_revoked,
    ev.ToolStarted: _tool_started,
    ev.ToolResult: _tool_result,
    ev.ToolOutcomeUnknown: _tool_outcome_unknown,
    ev.ReconcileDecided: _reconcile_decided,
    ev.RetryScheduled: _retry_scheduled,
    ev.WaitStarted: _wait_started,
    ev.WaitFinished: _wait_finished,
    ev.WaitTimedOut: _wait_timed_out,
    ev.ErrorRaised: _error,
    ev.MessagePosted: _message_posted,
    ev.StreamStopped: _stream_stopped,
    ev.FeedbackGiven: _feedback_given,
    ev.StopRequested: _stop_requested,
    ev.ContextCompacted: _context_compacted,
}


def summarize(event: ev.Event) -> str:
    """A short, one-line human summary of ``event``."""
    fn = SUMMARIES.get(type(event))
    if fn is None:  # a type this module does not know yet: show its payload
        return excerpt(_payload(event), SUMMARY_WIDTH)
    return one_line(fn(event), SUMMARY_WIDTH * 2)


def trace_line(event: ev.Event) -> str:
    """``seq  time  actor  type  summary`` with aligned columns."""
    return (
        f"{event.seq:>{SEQ_WIDTH}}  {iso_seconds(event.created_at)}  "
        f"{event.actor:<{ACTOR_WIDTH}}  {event.type:<{TYPE_WIDTH}}  {summarize(event)}"
    ).rstrip()


def _payload(event: ev.Event) -> dict[str, Any]:
    data = event.model_dump(mode="json")
    for name in ENVELOPE_FIELDS:
        data.pop(name, None)
    if data.get("dedupe_key") is None:
        data.pop("dedupe_key", None)
    return data


def trace_record(event: ev.Event) -> dict[str, Any]:
    """The flat JSON object of ``trace --json``: the envelope, then the payload fields."""
    data = event.model_dump(mode="json")
    record: dict[str, Any] = {
        "seq": event.seq,
        "event_id": event.event_id,
        "type": event.type,
        "created_at": data["created_at"],
        "actor": event.actor,
    }
    record.update(_payload(event))
    return record


def usage_totals(events: Iterable[ev.Event]) -> dict[str, int]:
    """Tokens spent by the model decisions in ``events`` (and how many there were)."""
    totals = dict.fromkeys(("model_decisions", *USAGE_FIELDS), 0)
    for e in events:
        if isinstance(e, ev.ModelDecision):
            totals["model_decisions"] += 1
            for name in USAGE_FIELDS:
                totals[name] += getattr(e.usage, name)
    return totals


def format_usage(totals: dict[str, int]) -> str | None:
    """The usage line of the human trace; None when no token was counted."""
    if not any(totals.get(name, 0) for name in USAGE_FIELDS):
        return None
    n = totals.get("model_decisions", 0)
    return (
        f"usage: {n} model decision{'s' if n != 1 else ''}, "
        f"input {totals['input_tokens']}, output {totals['output_tokens']}, "
        f"cache read {totals['cache_read_input_tokens']}, "
        f"cache write {totals['cache_creation_input_tokens']} tokens"
    )


def thread_record(info: ThreadInfo) -> dict[str, Any]:
    """One thread as ``opsloop threads --json`` prints it."""
    return {
        "thread_id": info.id,
        "team": info.team,
        "channel": info.channel,
        "thread_ts": info.root_ts,
        "requester": info.requester,
        "status": info.status,
        "last_seq": info.last_seq,
        "updated_at": iso(info.updated_at),
    }
