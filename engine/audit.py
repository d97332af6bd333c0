"""Who asked, who decided, what ran: a thread's approvals, read from its log.

``audit(events)`` folds a thread's events into one :class:`CallAudit` per call that
needed someone's word (a call that asked for approval, a call a rule refused, a call
whose outcome a person had to reconcile, a call cancelled or refused mid-way): its
arguments, the reviewer rule recorded with it, every step people took on it (votes,
rejections, refused clicks, withdrawals, expiry, edits, grants, reconciles) and what
came of it. Calls that simply ran (``run_now`` tools) are left to ``opsloop trace``.
Nothing is stored for it: ``/opsloop audit`` reads the log and calls this.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from engine import events as ev
from engine.reviewers import ReviewerRule

# The actor of an approval that a standing grant gave: ``grant:<grant_id>``.
GRANT_PREFIX = "grant:"

StepKind = Literal[
    "approved",  # one vote (by a person, or by a grant)
    "rejected",
    "refused",  # a click that was not allowed (kept for the audit, changed nothing)
    "withdrawn",
    "expired",
    "edited",  # by a reviewer: new arguments, earlier votes void
    "reminded",  # nobody had decided: the approvers were reminded
    "unknown",  # the outcome of an attempt became unknown
    "reconciled",
    "cancelled",
]
# Where a call ended up (or stands now).
Outcome = Literal[
    "awaiting_approval",
    "approved",  # approved, not started yet
    "running",
    "ok",
    "error",
    "unknown",  # awaiting a person's word on whether it happened
    "happened",  # a person said it did
    "abandoned",  # a person said it did not
    "refused_by_rule",
    "rejected",
    "withdrawn",
    "expired",
    "cancelled",
    "failed",  # the thread failed while the call was open
]
# Outcomes after which a thread's cancel or failure no longer concerns the call.
SETTLED: frozenset[str] = frozenset(
    {"ok", "error", "happened", "abandoned", "refused_by_rule", "rejected", "withdrawn", "expired"}
)


@dataclass(frozen=True)
class Step:
    """One thing a person (or the system, for an expiry) did to a call, in log order.

    ``text``: a reason, a note or an error, as written (a renderer escapes it).
    ``decision``: what a reconcile decided (happened, retry, abandon), or what a refused
    click attempted (approve, reject, cancel…). ``arguments``: an edit's new arguments.
    """

    kind: StepKind
    actor: str
    at: datetime
    text: str = ""
    decision: str = ""
    arguments: dict[str, Any] | None = None

    @property
    def grant(self) -> str | None:
        """The grant id whose approval this is, if a grant gave it."""
        return self.actor.removeprefix(GRANT_PREFIX) if is_grant(self.actor) else None


def is_grant(actor: str) -> bool:
    return actor.startswith(GRANT_PREFIX)


@dataclass(frozen=True)
class CallAudit:
    """One call: who asked, under which rule, who did what to it, and what came of it.

    ``arguments`` are the arguments the model asked for; ``final_arguments`` those the
    call ran (or would run) with, after any edits. ``reviewers`` is the rule recorded
    with the call (None: the process's approvers decided, as in logs from before
    rules). ``output`` / ``error``: the result's, when there is one (for ``happened``,
    the reviewer's note).
    """

    tool_call_id: str
    intent: str
    arguments: dict[str, Any]
    requester: str | None
    requested_at: datetime
    policy: ev.CallPolicy
    reviewers: ReviewerRule | None
    rule: int | None
    policy_hash: str | None
    reason: str  # the model's reason for the approval, or the rule's for a refusal
    expires_at: datetime | None
    steps: tuple[Step, ...]
    outcome: Outcome
    outcome_at: datetime | None
    attempts: int = 0
    output: Any = None
    error: str = ""

    @property
    def final_arguments(self) -> dict[str, Any]:
        edits = [s.arguments for s in self.steps if s.kind == "edited" and s.arguments is not None]
        return edits[-1] if edits else self.arguments

    @property
    def votes(self) -> tuple[Step, ...]:
        """The approvals that count: those since the latest edit (an edit voids earlier
        votes)."""
        counted: list[Step] = []
        for s in self.steps:
            if s.kind == "edited":
                counted = []
            elif s.kind == "approved":
                counted.append(s)
        return tuple(counted)

    @property
    def grants(self) -> tuple[str, ...]:
        """The standing grants that approved it, in order."""
        return tuple(g for s in self.steps if (g := s.grant) is not None)

    @property
    def quorum(self) -> int:
        return self.reviewers.quorum if self.reviewers is not None else 1


@dataclass
class _Call:
    """A call while the log is folded (mutable; frozen into a CallAudit at the end)."""

    audit: CallAudit
    steps: list[Step] = field(default_factory=list)

    def step(self, kind: StepKind, e: ev.Event, **more: Any) -> None:
        self.steps.append(Step(kind, e.actor, e.created_at, **more))

    def end(self, outcome: Outcome, e: ev.Event, **more: Any) -> None:
        self.audit = replace(self.audit, outcome=outcome, outcome_at=e.created_at, **more)

    def frozen(self) -> CallAudit:
        return replace(self.audit, steps=tuple(self.steps))

    @property
    def worth_auditing(self) -> bool:
        return self.audit.policy in ("approve_before_run", "reject") or bool(self.steps)


@dataclass
class _Fold:
    requester: str | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    current: str | None = None  # the call asked for last: a cancel or a failure ends it

    def call(self, tool_call_id: str | None) -> _Call | None:
        return self.calls.get(tool_call_id) if tool_call_id else None


def _message(f: _Fold, e: ev.UserMessage) -> None:
    f.requester = f.requester or e.actor  # the reducer's requester: the first author


def _requested(f: _Fold, e: ev.ToolCallRequested) -> None:
    refused = e.policy == "reject"
    audit = CallAudit(
        tool_call_id=e.tool_call_id,
        intent=e.intent,
        arguments=e.arguments,
        requester=f.requester,
        requested_at=e.created_at,
        policy=e.policy,
        reviewers=e.reviewers,
        rule=e.rule,
        policy_hash=e.policy_hash,
        reason=e.reason,
        expires_at=None,
        steps=(),
        outcome="refused_by_rule" if refused else "running",
        outcome_at=e.created_at if refused else None,
    )
    f.calls[e.tool_call_id] = _Call(audit)
    f.current = e.tool_call_id


def _approval_requested(c: _Call, e: ev.ApprovalRequested) -> None:
    c.audit = replace(c.audit, reason=e.reason or c.audit.reason, expires_at=e.expires_at)
    c.end("awaiting_approval", e)


def _granted(c: _Call, e: ev.ApprovalGranted) -> None:
    c.step("approved", e)
    if len(c.frozen().votes) >= c.audit.quorum:
        c.end("approved", e)


def _rejected(c: _Call, e: ev.ApprovalRejected) -> None:
    c.step("rejected", e, text=e.reason)
    c.end("rejected", e)


def _refused(c: _Call, e: ev.ApprovalRefused) -> None:
    c.step("refused", e, text=e.reason, decision=e.decision)


def _withdrawn(c: _Call, e: ev.ApprovalWithdrawn) -> None:
    c.step("withdrawn", e, text=e.reason)
    c.end("withdrawn", e)


def _expired(c: _Call, e: ev.ApprovalExpired) -> None:
    c.step("expired", e)
    c.end("expired", e)


def _edited(c: _Call, e: ev.ApprovalEdited) -> None:
    """New arguments, earlier votes void; the rule the policy gives them replaces the
    call's when the edit records one, and a policy that refuses them closes the call."""
    c.steps.append(Step("edited", e.reviewer, e.created_at, arguments=e.arguments))
    if e.policy == "reject":
        c.audit = replace(c.audit, rule=e.rule, reason=e.reason)
        c.end("refused_by_rule", e)
        return
    if e.reviewers is not None:
        c.audit = replace(c.audit, reviewers=e.reviewers, rule=e.rule)
    c.end("awaiting_approval", e)


def _reminded(c: _Call, e: ev.ApprovalReminded) -> None:
    c.step("reminded", e)


def _started(c: _Call, e: ev.ToolStarted) -> None:
    c.audit = replace(c.audit, attempts=e.attempt)
    c.end("running", e)


def _result(c: _Call, e: ev.ToolResult) -> None:
    c.end("ok" if e.ok else "error", e, output=e.output, error=e.error or "")


def _unknown(c: _Call, e: ev.ToolOutcomeUnknown) -> None:
    c.step("unknown", e, text=e.error)
    c.end("unknown", e)


_RECONCILED: dict[str, Outcome] = {
    "happened": "happened",
    "abandon": "abandoned",
    "retry": "approved",
}


def _reconciled(c: _Call, e: ev.ReconcileDecided) -> None:
    c.steps.append(Step("reconciled", e.reviewer, e.created_at, text=e.note, decision=e.decision))
    output = e.note if e.decision == "happened" else c.audit.output
    c.end(_RECONCILED[e.decision], e, output=output)


def _wait_finished(c: _Call, e: ev.WaitFinished) -> None:
    c.end("ok", e, output=e.result)


def _wait_timed_out(c: _Call, e: ev.WaitTimedOut) -> None:
    c.end("error", e, error="the job it waited for timed out")


def _cancelled(f: _Fold, e: ev.ThreadCancelled) -> None:
    c = f.call(f.current)
    if c is not None and c.audit.outcome not in SETTLED:
        c.step("cancelled", e, text=e.reason)
        c.end("cancelled", e)


def _failed(f: _Fold, e: ev.ErrorRaised) -> None:
    c = f.call(f.current)
    if c is not None and c.audit.outcome not in SETTLED:
        c.end("failed", e, error=e.message)


# What each event does to the call it names (events of other types change nothing).
ON_CALL: dict[type[ev.Event], Callable[[_Call, Any], None]] = {
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalEdited: _edited,
    ev.ApprovalReminded: _reminded,
    ev.ApprovalGranted: _granted,
    ev.ApprovalRejected: _rejected,
    ev.ApprovalRefused: _refused,
    ev.ApprovalWithdrawn: _withdrawn,
    ev.ApprovalExpired: _expired,
    ev.ToolStarted: _started,
    ev.ToolResult: _result,
    ev.ToolOutcomeUnknown: _unknown,
    ev.ReconcileDecided: _reconciled,
    ev.WaitFinished: _wait_finished,
    ev.WaitTimedOut: _wait_timed_out,
}
# What each event does to the thread as a whole.
ON_THREAD: dict[type[ev.Event], Callable[[_Fold, Any], None]] = {
    ev.UserMessage: _message,
    ev.ToolCallRequested: _requested,
    ev.ThreadCancelled: _cancelled,
    ev.ErrorRaised: _failed,
}


def audit(events: Iterable[ev.Event]) -> list[CallAudit]:
    """The calls of a thread's log that needed someone's word, in the order asked."""
    fold = _Fold()
    for e in events:
        if (on_thread := ON_THREAD.get(type(e))) is not None:
            on_thread(fold, e)
        elif (on_call := ON_CALL.get(type(e))) is not None:
            c = fold.call(getattr(e, "tool_call_id", None))
            if c is not None:  # a refused click may name a call that never was
                on_call(c, e)
    return [c.frozen() for c in fold.calls.values() if c.worth_auditing]
