"""What the rendering tests share: inputs for every renderer, and checks on what they
render (escaping, Slack's own models). Pure: no Slack."""

from __future__ import annotations

import pkgutil
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from slack_sdk.models.blocks import Block as SdkBlock
from slack_sdk.models.views import View as SdkView

import bot.render
from bot.render import approval, lines, modals, reconcile, status
from engine import events as ev
from engine.state import CallSetback, PendingCall, SaidSince, ThreadState, WaitInfo

# Every rendering module: the purity and limits checks cover each one added later too.
RENDERERS = sorted(f"bot.render.{m.name}" for m in pkgutil.iter_modules(bot.render.__path__))
NOW = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
LATER = NOW + timedelta(hours=1)
THREAD = "thr_0123456789abcdef0123"
CALL_ID = "toolu_01ABCdef"
HASH = "0f" * 16
REQUESTER = "U0REQUEST1"
REVIEWER = "U0REVIEW01"
EVIL = "<!channel> <@U999> <https://evil.example|bank> & stuff"
WEIRD = "Z̤͔ͧ̑̓ä͖̭̈̇ 👩‍👩‍👧‍👦 🇫🇷🇩🇪 \u202eevil\u202c \x00 ﷽ 𝕏 e\u0301 ```"
DATE_TOKEN = r"<!date\^\d+\^\{date_short_pretty\} at \{time\}\|[0-9: -]+UTC>"
OUR_TOKENS = re.compile(rf"<@(?:{REQUESTER}|{REVIEWER})>|<!subteam\^S0GROUP01>|{DATE_TOKEN}")


# --- builders -------------------------------------------------------------------------


def requested(intent: str = "refund_customer", arguments: dict[str, Any] | None = None, **kw):
    return ev.ToolCallRequested(
        thread_id=THREAD,
        tool_call_id=kw.pop("tool_call_id", CALL_ID),
        intent=intent,
        arguments={"order_id": "A-1", "amount_cents": 500} if arguments is None else arguments,
        policy=kw.pop("policy", "approve_before_run"),
        idempotency_key=f"{THREAD}:{CALL_ID}",
        **kw,
    )


def card_inputs(text: str = "Customer asked for it", **call_kw: Any) -> dict[str, Any]:
    return {
        "thread_id": THREAD,
        "requester": REQUESTER,
        "call": requested(**call_kw),
        "reason": text,
        "expires_at": LATER,
        "arguments_hash": HASH,
    }


def pending(phase: str = "awaiting_approval", intent: str = "refund_customer", **kw: Any):
    return PendingCall(
        tool_call_id=CALL_ID,
        intent=intent,
        arguments={"order_id": "A-1"},
        policy="approve_before_run",
        idempotency_key=f"{THREAD}:{CALL_ID}",
        phase=phase,
        arguments_hash=HASH,
        expires_at=LATER,
        **kw,
    )


def state(status: str, **kw: Any) -> ThreadState:
    return ThreadState(thread_id=THREAD, status=status, requester=REQUESTER, **kw)


def wait_info(text: str = "deploy job 42") -> WaitInfo:
    return WaitInfo(wait_id="w1", description=text, data={}, wake_at=NOW, timeout_at=LATER)


def shown_events(text: str = EVIL, args: Any = None) -> list[ev.Event]:
    """One event of every type the thread shows, with ``text`` wherever text goes."""
    args = {"q": text} if args is None else args
    env = {"thread_id": THREAD}
    return [
        requested(text, args, policy="run_now"),
        ev.ToolResult(**env, tool_call_id=CALL_ID, attempt=1, ok=True, output={"out": text}),
        ev.ToolResult(**env, tool_call_id=CALL_ID, attempt=1, ok=False, error=text),
        ev.RetryScheduled(**env, tool_call_id=CALL_ID, attempt=2, wake_at=LATER, error=text),
        ev.RetryScheduled(**env, attempt=1, wake_at=LATER, error=text),
        ev.WaitStarted(
            **env,
            tool_call_id=CALL_ID,
            wait_id="w1",
            description=text,
            wake_at=NOW,
            timeout_at=LATER,
        ),
        ev.WaitFinished(**env, tool_call_id=CALL_ID, wait_id="w1", result={"r": text}),
        ev.WaitTimedOut(**env, tool_call_id=CALL_ID, wait_id="w1"),
        ev.ClarificationRequested(**env, tool_call_id=CALL_ID, question=text),
        ev.DecisionRejected(**env, tool_call_id=CALL_ID, reason=text),
        ev.ErrorRaised(**env, message=text, kind="tool_failed"),
        ev.FinalAnswer(**env, text=text),
        ev.ThreadCancelled(**env, actor=REQUESTER, reason=text),
    ]


def statuses(text: str = EVIL, intent: str = "refund_customer") -> list[ThreadState]:
    return [
        state("new"),
        state("running"),
        state("awaiting_approval", pending=pending(intent=intent)),
        state(
            "awaiting_approval",
            pending=pending(intent=intent, approvers=("S0GROUP01",), quorum=2, votes=(REVIEWER,)),
        ),
        state("awaiting_reconcile", pending=pending("unknown", intent=intent)),
        state("awaiting_reply"),
        state("awaiting_job", pending=pending("waiting", intent=intent, wait=wait_info(text))),
        state("sleeping", pending=pending("retry_wait", retry_at=LATER)),
        state("sleeping", model_retry_at=LATER),
        state("idle"),
        *(state("idle", setback=CallSetback(kind=k, intent=intent)) for k in SETBACKS),
        state("failed"),
        state("cancelled"),
    ]


SETBACKS = ("rejected", "expired", "failed")


def notes(text: str = EVIL, source_kind: str = "slack", count: int = 1) -> approval.Notes:
    said = [
        SaidSince(event_id=f"evt_{i}", actor=REQUESTER, text=text, created_at=NOW, source_kind=k)
        for i, k in enumerate(["", source_kind][-count:])
    ]
    return approval.Notes(said, count)


def every_rendering(
    text: str = EVIL, args: Any = None, intent: str = "refund_customer"
) -> Iterator[tuple[str, list[dict[str, Any]] | dict[str, Any]]]:
    """(name, blocks or view) for every renderer, fed ``text`` wherever text goes."""
    inputs = card_inputs(text, intent=intent, arguments={"x": text} if args is None else args)
    yield "approval_card", approval.approval_card(**inputs)
    for kind, count in (("slack", 1), ("", 7)):
        noted = inputs | {"notes": notes(text, kind, count), "people": frozenset({REVIEWER})}
        yield f"approval_card[noted {kind} {count}]", approval.approval_card(**noted)
        yield (
            f"decided_card[noted {kind} {count}]",
            approval.decided_card(**noted, outcome="approved", by=REVIEWER, at=NOW),
        )
    for outcome in ("approved", "rejected", "expired", "cancelled"):
        yield (
            f"decided_card[{outcome}]",
            approval.decided_card(
                **inputs, outcome=outcome, by=REVIEWER, at=NOW, decision_reason=text
            ),
        )
    yield (
        "decided_card[cancelled, nobody]",
        approval.decided_card(**inputs, outcome="cancelled", by=None, at=NOW),
    )
    for event in shown_events(text, args):
        for name, req in ((intent, REQUESTER), (None, None)):
            blocks = lines.event_line(event, tool_name=name, requester=req)
            assert blocks is not None, event.type
            yield f"event_line[{event.type}]", blocks
    for s in statuses(text, intent):
        yield (
            f"status_message[{s.status}]",
            status.status_message(s, THREAD, approvers=[REVIEWER, "S0GROUP01"]),
        )
    yield (
        "reject_modal",
        modals.reject_modal(
            thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name=intent
        ),
    )
    refused = requested(
        intent, {"x": text} if args is None else args, policy="reject", rule=1, reason=text
    )
    yield "event_line[tool_call_requested, reject]", lines.event_line(refused) or []
    ruled = inputs | {"call": ruled_call(text, intent, args)}
    votes = approval.Votes((REVIEWER, f"U{text}"), 3)
    yield "approval_card[rule, votes]", approval.approval_card(**ruled, votes=votes)
    for outcome in ("approved", "rejected", "expired"):
        yield (
            f"decided_card[rule, votes, {outcome}]",
            approval.decided_card(**ruled, outcome=outcome, by=REVIEWER, at=NOW, votes=votes),
        )
    unknown = outcome_unknown(text)
    recon = {"thread_id": THREAD, "requester": REQUESTER, "call": ruled["call"], "unknown": unknown}
    yield "reconcile_card", reconcile.reconcile_card(**recon, arguments_hash=HASH)
    for decided in ("happened", "retry", "abandon", "cancelled"):
        yield (
            f"reconciled_card[{decided}]",
            reconcile.reconciled_card(**recon, outcome=decided, by=REVIEWER, at=NOW, note=text),
        )
    yield (
        "note_modal",
        modals.note_modal(
            thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, tool_name=intent
        ),
    )


def ruled_call(text: str = EVIL, intent: str = "deploy", args: Any = None) -> ev.ToolCallRequested:
    """A call decided by rule 3 of a policy file: 2 of a user, a group and the on-call."""
    return requested(
        intent,
        {"x": text} if args is None else args,
        rule=2,
        approvers=(REVIEWER, "S0GROUP01", f"oncall:{text}"),
        quorum=2,
        policy_hash="ab" * 32,
    )


def outcome_unknown(error: str = "connection lost") -> ev.ToolOutcomeUnknown:
    return ev.ToolOutcomeUnknown(
        thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, started_at=NOW, error=error
    )


# --- checks -----------------------------------------------------------------------------


def text_objects(node: Any) -> Iterator[str]:
    """Every text of every text object in ``node`` (what Slack renders)."""
    if isinstance(node, dict):
        if node.get("type") in ("plain_text", "mrkdwn") and isinstance(node.get("text"), str):
            yield node["text"]
        for value in node.values():
            yield from text_objects(value)
    elif isinstance(node, list):
        for item in node:
            yield from text_objects(item)


def all_text(blocks: list[dict[str, Any]]) -> str:
    return "\n".join(text_objects(blocks))


def assert_safe(text: str) -> None:
    """Only our own ``<…>`` tokens, and every ``&`` starts an entity."""
    rest = OUR_TOKENS.sub("", text)
    assert "<" not in rest and ">" not in rest, text
    assert not re.search(r"&(?!amp;|lt;|gt;)", text), text


def sdk_validate(rendering: list[dict[str, Any]] | dict[str, Any]) -> None:
    """slack_sdk's own models as a second opinion on the limits."""
    if isinstance(rendering, dict):
        SdkView(**rendering).validate_json()
        return
    for block in rendering:
        SdkBlock.parse(block).validate_json()


def find(blocks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [blk for blk in blocks if blk["type"] == kind]
