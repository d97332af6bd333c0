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
from bot.render import (
    alerts,
    approval,
    audit,
    edit,
    grants,
    home,
    lines,
    modals,
    reconcile,
    reminders,
    status,
)
from engine import events as ev
from engine.audit import audit as audit_of
from engine.edits import changes
from engine.grants import exact_schema
from engine.reviewers import ReviewerRule
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
OUR_TOKENS = re.compile(
    rf"<@(?:{REQUESTER}|{REVIEWER})>|<!subteam\^S0GROUP01>|{DATE_TOKEN}|<#C0OPS00001>"
)


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
        alert_event(text, "firing"),
        alert_event(text, "resolved"),
    ]


def alert_event(text: str, status: Any) -> ev.AlertReceived:
    """An alert with ``text`` wherever a monitoring system writes (its link aside: only
    an http(s) URL ever gets that far, engine.alerts)."""
    return ev.AlertReceived(
        thread_id=THREAD,
        actor="alert:generic",
        source="generic",
        fingerprint=text[:200] or "f",
        status=status,
        summary=text,
        labels={f"k{i}{text[:50]}": text for i in range(64)},
        annotations={"description": text, "runbook_url": text},
        instruction=text,
        channel="C0OPS00001",
    )


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
            status.status_message(
                s, THREAD, reviewers=ReviewerRule(frozenset({REVIEWER, "S0GROUP01"}))
            ),
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
    edits = edited_by(text) * 5  # more than a card lists
    yield "approval_card[edited]", approval.approval_card(**ruled, edits=edits)
    yield (
        "decided_card[refused after an edit]",
        approval.decided_card(
            **ruled, outcome="refused", by=REVIEWER, at=NOW, decision_reason=text, edits=edits
        ),
    )
    yield (
        "edit_modal",
        edit.edit_modal(
            thread_id=THREAD,
            tool_call_id=CALL_ID,
            arguments_hash=HASH,
            tool_name=intent,
            schema=edit_schema(text),
            arguments={"env": "staging", "replicas": 2, "opts": {"k": 1}, "on": True},
        )
        or {},
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
    yield from reminded(text, ruled["call"], votes)
    calls = audit_of(audited_log(text, intent, args))
    yield "audit_blocks", audit.audit_blocks(thread_id=THREAD, link=None, calls=calls)
    yield "audit_blocks[empty]", audit.audit_blocks(thread_id=THREAD, link=None, calls=[])
    yield "home_view[decided]", home.home_view(REVIEWER, [], [], decision_rows(text, intent))
    granting = card_inputs(text, intent=intent, arguments={"x": text} if args is None else args)
    granting["call"] = granting["call"].model_copy(update={"max_grant_s": 3600.0})
    yield "approval_card[grants allowed]", approval.approval_card(**granting)
    yield (
        "granted_line",
        lines.granted_line(granting["call"], f"U{text}", LATER),
    )
    yield "grants_message", grants.grants_message(grant_rows(text, intent, 25))[1]
    for alerted in (alert_event(text, "firing"), alert_event(text, "resolved")):
        yield (
            f"alert_root[{alerted.status}]",
            alerts.alert_root(alerted, resolved=alerted.status == "resolved"),
        )
    yield "grants_message[empty]", grants.grants_message([])[1]


def grant_rows(text: str = EVIL, intent: str = "deploy", n: int = 1) -> list[grants.GrantRow]:
    """``n`` live grants for ``/opsloop grants``, ``text`` wherever text goes."""
    return [
        grants.GrantRow(
            thread_id=THREAD,
            grant_id=f"grant_{i:04d}",
            tool=intent,
            schema=exact_schema({"x": text}) if i % 2 else {"type": "object"},
            reviewer=f"U{text}",
            until=LATER,
            scope="channel" if i % 3 == 2 else "thread",
            link=None,  # a link is our own <…> token: its test checks it
        )
        for i in range(n)
    ]


def reminded(
    text: str, call: ev.ToolCallRequested, votes: approval.Votes
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The reminded card, the reminder and the escalation (issue 17 §3), ``text`` in the
    call and in a link Slack would never give (it is left out)."""
    inputs = card_inputs(text) | {"call": call}
    yield "approval_card[reminded]", approval.approval_card(**inputs, votes=votes, reminded_at=NOW)
    timers = {"thread_id": THREAD, "call": call, "asked_at": NOW, "expires_at": LATER}
    link = f"https://acme.slack.com/archives/C0OPS00001/p1?x={text}"
    yield "reminder_reply", reminders.reminder_reply(**timers, votes=votes, card_link=link)
    anyone = call.model_copy(update={"approvers": ()})
    yield (
        "reminder_reply[anyone]",
        reminders.reminder_reply(**timers | {"call": anyone}, votes=approval.NO_VOTES),
    )
    people = (REVIEWER, "S0GROUP01", f"oncall:{text}")
    for channel, refusal in (("", ""), ("C0OPS00001", ""), ("C0OPS00001", text)):
        yield (
            f"escalation_post[{channel or 'thread'}{', refused' if refusal else ''}]",
            reminders.escalation_post(
                **timers,
                requester=REQUESTER,
                escalate_to=(*people, channel) if channel else people,
                votes=votes,
                card_link=link,
                channel=channel,
                refusal=refusal,
            ),
        )


def audited_log(text: str = EVIL, intent: str = "deploy", args: Any = None) -> list[ev.Event]:
    """A thread's log with a call of every audited kind, ``text`` wherever text goes: a
    quorum call (votes, a grant, refused clicks) that ran; a rejected, a withdrawn, an
    expired one; one a rule refused; one whose outcome a person reconciled; one that
    failed; one still open."""
    args = {"x": text} if args is None else args
    env = {"thread_id": THREAD}
    log: list[ev.Event] = [ev.UserMessage(**env, actor=REQUESTER, text=text)]

    def ask(call_id: str, **kw: Any) -> None:
        log.extend(
            [
                requested(intent, args, tool_call_id=call_id, **kw),
                ev.ApprovalRequested(
                    **env, tool_call_id=call_id, arguments_hash=HASH, expires_at=LATER, reason=text
                ),
            ]
        )

    def then(*events: ev.Event) -> None:
        log.extend(events)

    ask("toolu_1", rule=2, approvers=(REVIEWER, "S0GROUP01", f"oncall:{text}"), quorum=3)
    then(
        ev.ApprovalGranted(**env, actor=REVIEWER, tool_call_id="toolu_1"),
        ev.ApprovalRefused(
            **env, actor=f"U{text}", tool_call_id="toolu_1", decision="approve", reason=text
        ),
        ev.ApprovalGranted(**env, actor=f"grant:{text}", tool_call_id="toolu_1"),
        ev.ApprovalGranted(**env, actor=REQUESTER, tool_call_id="toolu_1"),
        ev.ToolStarted(**env, tool_call_id="toolu_1", attempt=1),
        ev.ToolResult(**env, tool_call_id="toolu_1", attempt=1, ok=True, output={"o": text}),
    )
    ask("toolu_2")
    then(ev.ApprovalRejected(**env, actor=REVIEWER, tool_call_id="toolu_2", reason=text))
    ask("toolu_3")
    then(ev.ApprovalWithdrawn(**env, actor=REQUESTER, tool_call_id="toolu_3", reason=text))
    ask("toolu_4")
    then(ev.ApprovalExpired(**env, tool_call_id="toolu_4"))
    then(requested(intent, args, tool_call_id="toolu_5", policy="reject", rule=1, reason=text))
    ask("toolu_6", idempotent=False)
    then(
        ev.ApprovalGranted(**env, actor=REVIEWER, tool_call_id="toolu_6"),
        ev.ToolStarted(**env, tool_call_id="toolu_6", attempt=1),
        ev.ToolOutcomeUnknown(**env, tool_call_id="toolu_6", attempt=1, error=text),
        ev.ReconcileDecided(
            **env,
            actor=REVIEWER,
            tool_call_id="toolu_6",
            decision="happened",
            reviewer=REVIEWER,
            note=text,
        ),
    )
    ask("toolu_7")
    then(
        ev.ApprovalGranted(**env, actor=REVIEWER, tool_call_id="toolu_7"),
        ev.ToolStarted(**env, tool_call_id="toolu_7", attempt=1),
        ev.ToolResult(**env, tool_call_id="toolu_7", attempt=1, ok=False, error=text),
    )
    ask("toolu_8")
    then(ev.ThreadCancelled(**env, actor=REQUESTER, reason=text))
    ask("toolu_9")
    then(
        ev.ApprovalGranted(**env, actor=REVIEWER, tool_call_id="toolu_9"),
        ev.ApprovalEdited(
            **env,
            actor=REVIEWER,
            reviewer=REVIEWER,
            tool_call_id="toolu_9",
            arguments={text: text, "y": [text] * 3},
            arguments_hash=HASH,
            previous_hash=HASH,
        ),
        ev.ApprovalReminded(**env, tool_call_id="toolu_9"),
    )
    return log


def decision_rows(text: str = EVIL, intent: str = "deploy") -> list[home.DecisionRow]:
    """One Home "Decided by me" row of each kind, ``text`` as the tool and the channel."""
    return [
        home.DecisionRow(
            decision=d, tool=intent, thread_id=THREAD, channel=c, root_ts="1.2", at=NOW
        )
        for d in (*home.DECISION_LABELS, text)
        for c in ("C0OPS00001", text)
    ]


def edited_by(text: str = EVIL) -> tuple[approval.Edited, ...]:
    """One edit changing, adding and removing arguments, ``text`` in names and values."""
    before = {"env": text, "gone": 1, "n": 2}
    after = {"env": f"{text}!", "n": 3, text[:300] or "t": [text] * 3}
    return (approval.Edited(REVIEWER, NOW, tuple(changes(before, after)) * 4),)


def edit_schema(text: str = EVIL) -> dict[str, Any]:
    """A tool's arguments of every kind the edit modal knows, ``text`` in what it shows
    (an argument's name and value are what the form edits: shown as they are)."""
    return {
        "type": "object",
        "properties": {
            "env": {"type": "string", "enum": ["staging", "production"], "description": text},
            "replicas": {"type": "integer", "description": text},
            "note": {"type": "string", "description": text},
            "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "on": {"type": "boolean"},
            "opts": {"type": "object"},
        },
        "required": ["env"],
    }


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
