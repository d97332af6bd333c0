"""The pure reducer: ``ThreadState = reduce(events)``.

``apply(state, event)`` returns the next state or raises ``IllegalTransition``; the
store applies every event before inserting it, so the log never holds an illegal
sequence. The state holds no collection that grows with the log, so it is cheap to
copy, to snapshot and to fold from a snapshot plus the tail.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, model_validator

from engine import events as ev
from engine.errors import IllegalTransition
from engine.frozen import replaced as evolve  # a changed copy, not validated again
from engine.reviewers import ReviewerRule

Status = Literal[
    "new",
    "running",
    "awaiting_approval",
    "awaiting_reply",
    "awaiting_job",
    "awaiting_reconcile",
    "sleeping",
    "idle",
    "failed",
    "cancelled",
]
Phase = Literal[
    "requested", "awaiting_approval", "ready", "started", "retry_wait", "waiting", "unknown"
]
Action = Literal[
    "execute_tool",
    "ask_model",
    "remind_approval",
    "expire_approval",
    "check_wait",
    "wait_timeout",
    "none",
]

NOTES_KEPT = 3  # SaidSince kept per pending call (the count goes on)
NOTE_CHARS = 300

# The policies under which a call may start a wait.
WAITING_POLICIES: frozenset[str] = frozenset({"wait_for_external_event", "approve_before_run"})

# Statuses in which nothing happens until a person (or a new message) acts.
AT_REST: frozenset[str] = frozenset({"new", "idle", "failed", "cancelled", "awaiting_reply"})


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WaitInfo(_Frozen):
    wait_id: str
    description: str
    data: dict[str, Any]
    wake_at: AwareDatetime
    timeout_at: AwareDatetime
    poll_every_s: float | None = None
    resumes: bool = False  # its end hands the call's next attempt how it ended


class WaitAnswer(_Frozen):
    """How a wait that resumes its call ended (``WaitStarted.resumes``), for the call's
    next attempt alone: the wait's ``data``, and ``result`` (``wait_finished``'s; empty
    when it timed out)."""

    data: dict[str, Any]
    result: dict[str, Any]
    timed_out: bool = False


class SaidSince(_Frozen):
    """A person's message that arrived while the call's approval card was open.

    Kept so the card can show it before a reviewer clicks: the first line of the text,
    cut to ``NOTE_CHARS`` (the log has the whole message, ``event_id``).
    """

    event_id: str
    actor: str
    text: str
    created_at: AwareDatetime
    source_kind: str = ""  # the front door's ``source["kind"]``: how to read ``text``


class CallSetback(_Frozen):
    """How the latest call of a turn ended, when it did not succeed."""

    kind: Literal["rejected", "expired", "withdrawn", "failed"]
    intent: str


class Grant(_Frozen):
    """A live standing grant of the thread (``grant_created``; gone once revoked)."""

    grant_id: str
    tool: str
    arguments_schema: dict[str, Any]
    until: AwareDatetime
    reviewer: str
    scope: Literal["thread", "channel"] = "thread"
    approvers: tuple[str, ...] | None = None  # of the rule it was created under

    def live(self, now: datetime) -> bool:
        """Expiry is just ``until`` passing: no job, no event."""
        return now < self.until

    @classmethod
    def created(cls, e: ev.GrantCreated) -> Grant:
        """The grant ``e`` made (a thread's own, or a channel grant found elsewhere)."""
        return cls(
            grant_id=e.grant_id,
            tool=e.tool,
            arguments_schema=e.arguments_schema,
            until=e.until,
            reviewer=e.reviewer,
            scope=e.scope,
            approvers=e.approvers,
        )


GRANTS_KEPT_AFTER = timedelta(days=1)
GRANT_PREFIX = "grant:"  # the actor of an approval a grant gave: grant:<grant_id>


class PendingCall(_Frozen):
    """The one tool call in flight: from request to its result."""

    tool_call_id: str
    intent: str
    arguments: dict[str, Any]
    policy: ev.Policy
    idempotency_key: str
    phase: Phase
    attempt: int = 0  # the last attempt started
    arguments_hash: str = ""
    expires_at: AwareDatetime | None = None
    requested_at: AwareDatetime | None = None  # when its approval was asked for
    # When its approvers are reminded (None: never), and when they were, once.
    remind_at: AwareDatetime | None = None
    reminded_at: AwareDatetime | None = None
    retry_at: AwareDatetime | None = None
    wait: WaitInfo | None = None
    # Messages since its approval was requested: the latest few, and how many in all.
    said_since: tuple[SaidSince, ...] = ()
    said_since_count: int = 0
    # Who may decide it, as recorded on tool_call_requested (None: the process's default).
    reviewers: ReviewerRule | None = None
    votes: tuple[str, ...] = ()  # who approved so far, in order (at most a quorum)
    idempotent: bool = True
    definition_hash: str | None = None
    rule: int | None = None
    max_grant_s: float | None = None  # the longest grant its approval may create
    started_at: AwareDatetime | None = None  # when the latest attempt started
    # When its first attempt started: what an effect of any attempt came after (a tool
    # looking for what an interrupted attempt did, ToolContext.first_started_at).
    first_started_at: AwareDatetime | None = None
    # Why the outcome is unknown (phase "unknown"), as tool_outcome_unknown said.
    unknown_error: str = ""
    # How its resuming wait ended: handed to the attempt that starts next, then dropped.
    answer: WaitAnswer | None = None

    @model_validator(mode="before")
    @classmethod
    def _upcast(cls, data: Any) -> Any:
        """A snapshot written before the reviewer rule was one value held it flat."""
        if isinstance(data, dict) and "approvers" in data:
            data = dict(data)
            approvers = data.pop("approvers")
            quorum, allow_self = data.pop("quorum", 1), data.pop("allow_self", None)
            if approvers is not None:
                data["reviewers"] = ReviewerRule(
                    frozenset(approvers), quorum, bool(allow_self), data.get("rule")
                )
        return data

    @property
    def quorum(self) -> int:
        return self.reviewers.quorum if self.reviewers is not None else 1

    @property
    def approval_due(self) -> datetime | None:
        """When its open approval needs the runner: the reminder, until it is sent (if it
        comes before the expiry), then the expiry."""
        remind, expires = self.remind_at, self.expires_at
        if remind is not None and self.reminded_at is None:
            if expires is None or remind < expires:
                return remind
        return expires

    @property
    def grants_allowed(self) -> bool:
        """May its approval create a standing grant, and a grant approve it? Only when
        its rule sets max_grant and one vote decides it."""
        return self.max_grant_s is not None and self.quorum == 1

    @property
    def counted_votes(self) -> int:
        """Distinct votes that count toward the quorum (the requester's only with
        allow_self, which the reducer checks as each vote arrives)."""
        return len(set(self.votes))


class ThreadState(_Frozen):
    thread_id: str = ""
    status: Status = "new"
    last_seq: int = 0
    requester: str | None = None
    # A model_decision whose consequence (a call, a question, an answer, a rejection)
    # must follow; holds the decision's tool_call_id ("" when it proposed no tool).
    open_decision: str | None = None
    pending: PendingCall | None = None
    # A call that was mid-run when the thread was cancelled or failed: never run again,
    # but the result of its side effect may still arrive and must be recordable.
    orphan: PendingCall | None = None
    question: ev.ClarificationRequested | None = None
    consecutive_rejections: int = 0
    decisions_since_input: int = 0
    decisions: int = 0  # model decisions in the whole thread
    model_attempt: int = 0  # consecutive failed model calls, from retry_scheduled
    model_retry_at: AwareDatetime | None = None
    # The latest context_compacted: (its seq, the seq it summarises up to). A projection
    # starts there instead of at the first event.
    compaction: tuple[int, int] | None = None
    # How this turn's latest call ended if it did not succeed (rejected, expired, an
    # error result); cleared by a call that succeeds and by a new message. It says
    # whether an answered thread got what it asked for.
    setback: CallSetback | None = None
    # The thread's standing grants not revoked, by id (expired ones are dropped as new
    # ones come, so this stays small).
    grants: dict[str, Grant] = {}
    # The alert this thread is open for (``AlertReceived.alert_key``) until it resolves;
    # the store keeps it in a unique column, so one alert has one open thread at most.
    alert: str | None = None
    # Who pressed stop while a tool call was running (``stop_requested``): that call
    # ends by its normal path, then the thread rests instead of asking the model.
    stop_by: str | None = None

    @property
    def wake_at(self) -> datetime | None:
        """When the scheduler must look at this thread again, if it waits on time."""
        if self.status == "sleeping":
            return self.pending.retry_at if self.pending else self.model_retry_at
        if self.status == "awaiting_approval" and self.pending:
            return self.pending.approval_due
        if self.status == "awaiting_job" and self.pending and self.pending.wait:
            return min(self.pending.wait.wake_at, self.pending.wait.timeout_at)
        return None


def _refuse(event: ev.Event, state: ThreadState, why: str) -> IllegalTransition:
    return IllegalTransition(event.type, state.status, why)


def _require(ok: bool, event: ev.Event, state: ThreadState, why: str) -> None:
    if not ok:
        raise _refuse(event, state, why)


def _pending(state: ThreadState, event: ev.Event, call_id: str, *phases: str) -> PendingCall:
    call = state.pending
    _require(
        call is not None and call.tool_call_id == call_id,
        event,
        state,
        f"tool call {call_id!r} is not pending",
    )
    assert call is not None
    _require(call.phase in phases, event, state, f"call {call_id!r} is {call.phase}")
    return call


def _decision(state: ThreadState, event: ev.Event, call_id: str | None) -> None:
    _require(state.open_decision is not None, event, state, "no model decision to follow")
    if call_id is not None:
        _require(
            state.open_decision == call_id,
            event,
            state,
            f"decision was for call {state.open_decision!r}, not {call_id!r}",
        )


# --- one small branch per event type ------------------------------------------------


def _user_message(s: ThreadState, e: ev.UserMessage) -> dict[str, Any]:
    _require(s.status != "awaiting_reply", e, s, "a reply answers the open question")
    _require(s.open_decision is None, e, s, "a model decision is half-written")
    # A new message asks for work again: a stop pressed before it no longer holds.
    update: dict[str, Any] = {"requester": s.requester or e.actor, "stop_by": None}
    if s.status in ("new", "idle", "failed", "cancelled"):
        update.update(
            status="running",
            consecutive_rejections=0,
            decisions_since_input=0,
            model_attempt=0,
            model_retry_at=None,
        )
        # A call left over from a cancelled or failed turn is never run again.
        update["pending"] = None
        update["setback"] = None
    else:
        update["decisions_since_input"] = 0
        call = s.pending
        if call is not None and call.phase == "awaiting_approval":
            update["pending"] = _said_since(call, e)
    return update


def _said_since(call: PendingCall, e: ev.UserMessage) -> PendingCall:
    """``call`` noting that ``e`` arrived while its card waits for a reviewer."""
    lines = [line.strip() for line in e.text.strip().splitlines()]
    first = next((line for line in lines if line), "")
    note = SaidSince(
        event_id=e.event_id,
        actor=e.actor,
        text=first[:NOTE_CHARS],
        created_at=e.created_at,
        source_kind=str(e.source.get("kind") or ""),
    )
    return evolve(
        call,
        {
            "said_since": (*call.said_since, note)[-NOTES_KEPT:],
            "said_since_count": call.said_since_count + 1,
        },
    )


def _alert_received(s: ThreadState, e: ev.AlertReceived) -> dict[str, Any]:
    """The first (firing) alert starts the thread; the same alert firing again is an
    input as a message is (it reopens a thread at rest); its resolution closes the
    alert and wakes nobody (the thread says so; a running turn sees it in its prompt)."""
    if s.status == "new":
        _require(e.status == "firing", e, s, "an alert thread starts with a firing alert")
        return {"status": "running", "alert": e.alert_key}
    _require(s.alert is not None, e, s, "the thread's alert is resolved (or it has none)")
    _require(s.alert == e.alert_key, e, s, f"the thread is open for alert {s.alert!r}")
    if e.status == "resolved":
        return {"alert": None}
    _require(s.open_decision is None, e, s, "a model decision is half-written")
    if s.status in ("idle", "failed", "cancelled"):
        return {
            "status": "running",
            "consecutive_rejections": 0,
            "decisions_since_input": 0,
            "model_attempt": 0,
            "model_retry_at": None,
            "pending": None,  # a call left over from a turn that ended never runs again
            "setback": None,
        }
    return {"decisions_since_input": 0}


def _clarification_answered(s: ThreadState, e: ev.ClarificationAnswered) -> dict[str, Any]:
    _require(s.status == "awaiting_reply" and s.question is not None, e, s, "no open question")
    assert s.question is not None
    _require(s.question.tool_call_id == e.tool_call_id, e, s, "answers another question")
    return {"status": "running", "question": None, "decisions_since_input": 0}


def _orphaned(s: ThreadState) -> PendingCall | None:
    if s.pending is not None and s.pending.phase == "started":
        return s.pending
    return s.orphan


def _thread_cancelled(s: ThreadState, e: ev.ThreadCancelled) -> dict[str, Any]:
    _require(s.status not in ("new", "cancelled"), e, s, "nothing to cancel")
    return {
        "status": "cancelled",
        "pending": None,
        "orphan": _orphaned(s),
        "question": None,
        "open_decision": None,
        "stop_by": None,
    }


def _stop_requested(s: ThreadState, e: ev.StopRequested) -> dict[str, Any]:
    """Slack's stop button: only while the thread works (a wait already rests). A
    running tool call ends by its normal path (its result, or a reconcile card) and
    the thread rests then (``apply``); anything else stops now: a call not started is
    dropped as a cancel drops it, and a decision being written no longer counts."""
    _require(s.status in ("running", "sleeping"), e, s, "the thread is not working")
    if s.pending is not None and s.pending.phase == "started":
        return {"stop_by": e.user}
    return {
        "status": "idle",
        "pending": None,
        "open_decision": None,
        "model_attempt": 0,
        "model_retry_at": None,
        "stop_by": None,
    }


def _model_decision(s: ThreadState, e: ev.ModelDecision) -> dict[str, Any]:
    _require(s.status in ("running", "sleeping"), e, s, "the thread is not running")
    _require(s.open_decision is None, e, s, "the previous decision has no outcome")
    _require(s.pending is None, e, s, "a tool call is pending")
    return {
        "status": "running",
        "open_decision": e.tool_call_id or "",
        "decisions_since_input": s.decisions_since_input + 1,
        "decisions": s.decisions + 1,
        "model_attempt": 0,
        "model_retry_at": None,
    }


def _decision_rejected(s: ThreadState, e: ev.DecisionRejected) -> dict[str, Any]:
    _decision(s, e, None)
    return {"open_decision": None, "consecutive_rejections": s.consecutive_rejections + 1}


def _final_answer(s: ThreadState, e: ev.FinalAnswer) -> dict[str, Any]:
    _decision(s, e, None)
    return {"open_decision": None, "status": "idle", "consecutive_rejections": 0}


def _clarification_requested(s: ThreadState, e: ev.ClarificationRequested) -> dict[str, Any]:
    _decision(s, e, e.tool_call_id)
    return {
        "open_decision": None,
        "status": "awaiting_reply",
        "question": e,
        "consecutive_rejections": 0,
    }


def _tool_call_requested(s: ThreadState, e: ev.ToolCallRequested) -> dict[str, Any]:
    _decision(s, e, e.tool_call_id)
    if e.policy == "reject":
        # A rule refused it: closed at once, the model reads the reason.
        setback = CallSetback(kind="rejected", intent=e.intent)
        return {"open_decision": None, "consecutive_rejections": 0, "setback": setback}
    phase: Phase = "requested" if e.policy == "approve_before_run" else "ready"
    call = PendingCall(
        tool_call_id=e.tool_call_id,
        intent=e.intent,
        arguments=e.arguments,
        policy=e.policy,
        idempotency_key=e.idempotency_key,
        phase=phase,
        reviewers=e.reviewers,
        idempotent=e.idempotent,
        definition_hash=e.definition_hash,
        rule=e.rule,
        max_grant_s=e.max_grant_s,
    )
    return {"open_decision": None, "pending": call, "consecutive_rejections": 0}


def _approval_requested(s: ThreadState, e: ev.ApprovalRequested) -> dict[str, Any]:
    call = _pending(s, e, e.tool_call_id, "requested")
    call = evolve(
        call,
        {
            "phase": "awaiting_approval",
            "expires_at": e.expires_at,
            "remind_at": e.remind_at,
            "requested_at": e.created_at,
            "arguments_hash": e.arguments_hash,
        },
    )
    return {"pending": call, "status": "awaiting_approval"}


def _approval_granted(s: ThreadState, e: ev.ApprovalGranted) -> dict[str, Any]:
    """One reviewer's vote; the call is ready once ``quorum`` distinct people voted. A
    live grant (actor ``grant:<id>``) approves a call that allows grants at once, in
    place of its card."""
    if e.actor.startswith(GRANT_PREFIX):
        return _granted_by_grant(s, e)
    _require(s.status == "awaiting_approval", e, s, "no approval is awaited")
    call = _pending(s, e, e.tool_call_id, "awaiting_approval")
    _require(e.actor not in call.votes, e, s, f"{e.actor} already approved this call")
    self_vote = e.actor == s.requester
    _require(
        not (self_vote and call.reviewers is not None and not call.reviewers.allow_self),
        e,
        s,
        "the requester's vote does not count",
    )
    voted = evolve(call, {"votes": (*call.votes, e.actor)})
    if voted.counted_votes < call.quorum:
        return {"pending": voted}
    return {"pending": evolve(voted, {"phase": "ready"}), "status": "running"}


def _granted_by_grant(s: ThreadState, e: ev.ApprovalGranted) -> dict[str, Any]:
    call = _pending(s, e, e.tool_call_id, "requested")
    grant_id = e.actor.removeprefix(GRANT_PREFIX)
    # A grant of this thread, or a channel-wide one of another thread, which the event
    # carries (logs from before ``grant`` name only grants of their own thread).
    known = s.grants.get(grant_id)
    tool = known.tool if known is not None else e.grant.tool if e.grant is not None else None
    elsewhere = e.grant is not None and e.grant.thread_id != s.thread_id
    _require(known is not None or elsewhere, e, s, f"{e.actor} is not a grant of this thread")
    _require(e.grant is None or e.grant.grant_id == grant_id, e, s, "names another grant")
    # Whether it is still live is the runner's to say, at decision time, by its clock.
    _require(tool == call.intent, e, s, f"{e.actor} is for {tool}")
    _require(call.grants_allowed, e, s, "the call's rule allows no grants")
    ready = evolve(call, {"phase": "ready", "votes": (e.actor,)})
    return {"pending": ready, "status": "running"}


def _grant_created(s: ThreadState, e: ev.GrantCreated) -> dict[str, Any]:
    grant = Grant.created(e)
    _require(e.grant_id not in s.grants, e, s, f"grant {e.grant_id!r} exists")
    # Long-expired grants go (a day's slack: the runner's clock decides liveness).
    live = {k: g for k, g in s.grants.items() if g.until > e.created_at - GRANTS_KEPT_AFTER}
    return {"grants": {**live, e.grant_id: grant}}


def _grant_revoked(s: ThreadState, e: ev.GrantRevoked) -> dict[str, Any]:
    _require(e.grant_id in s.grants, e, s, f"grant {e.grant_id!r} is not live")
    return {"grants": {k: g for k, g in s.grants.items() if k != e.grant_id}}


def _approval_reminded(s: ThreadState, e: ev.ApprovalReminded) -> dict[str, Any]:
    """The approvers are reminded once, while the card still waits for a decision."""
    _require(s.status == "awaiting_approval", e, s, "no approval is awaited")
    call = _pending(s, e, e.tool_call_id, "awaiting_approval")
    _require(call.remind_at is not None, e, s, "the call's rule sets no reminder")
    _require(call.reminded_at is None, e, s, "its approvers were reminded already")
    return {"pending": evolve(call, {"reminded_at": e.created_at})}


def _approval_edited(s: ThreadState, e: ev.ApprovalEdited) -> dict[str, Any]:
    """The call has new arguments: earlier votes no longer count, and its reviewer rule
    is the one recorded with the edit; an edit the policy refuses closes the call."""
    _require(s.status == "awaiting_approval", e, s, "no approval is awaited")
    call = _pending(s, e, e.tool_call_id, "awaiting_approval")
    _require(e.previous_hash == call.arguments_hash, e, s, "edits arguments the call no longer has")
    if e.policy == "reject":
        setback = CallSetback(kind="rejected", intent=call.intent)
        return {"pending": None, "status": "running", "setback": setback}
    update: dict[str, Any] = {
        "arguments": e.arguments,
        "arguments_hash": e.arguments_hash,
        "votes": (),
    }
    if e.reviewers is not None:
        update |= {"reviewers": e.reviewers, "rule": e.rule}
    return {"pending": evolve(call, update)}


_CLOSED_AS: dict[type[ev.Event], Literal["rejected", "expired", "withdrawn"]] = {
    ev.ApprovalRejected: "rejected",
    ev.ApprovalExpired: "expired",
    ev.ApprovalWithdrawn: "withdrawn",
}


def _approval_closed(
    s: ThreadState, e: ev.ApprovalRejected | ev.ApprovalExpired | ev.ApprovalWithdrawn
) -> dict[str, Any]:
    _require(s.status == "awaiting_approval", e, s, "no approval is awaited")
    call = _pending(s, e, e.tool_call_id, "awaiting_approval")
    setback = CallSetback(kind=_CLOSED_AS[type(e)], intent=call.intent)
    return {"pending": None, "status": "running", "setback": setback}


def _tool_started(s: ThreadState, e: ev.ToolStarted) -> dict[str, Any]:
    _require(s.status in ("running", "sleeping"), e, s, "the thread is not running")
    call = _pending(s, e, e.tool_call_id, "ready", "started", "retry_wait")
    _require(e.attempt == call.attempt + 1, e, s, f"attempt {call.attempt + 1} is next")
    _require(
        call.phase != "started" or call.idempotent,
        e,
        s,
        "an interrupted non-idempotent call runs again only when a person says so",
    )
    started = evolve(
        call,
        {
            "phase": "started",
            "attempt": e.attempt,
            "started_at": e.created_at,
            "first_started_at": call.first_started_at or e.created_at,
            "answer": None,  # this attempt has it; a later one starts afresh
        },
    )
    return {"pending": started, "status": "running"}


def _tool_result(s: ThreadState, e: ev.ToolResult) -> dict[str, Any]:
    late = s.orphan
    if late is not None and late.tool_call_id == e.tool_call_id and late.attempt == e.attempt:
        return {"orphan": None}
    call = _pending(s, e, e.tool_call_id, "started")
    _require(e.attempt == call.attempt, e, s, f"attempt {call.attempt} is running")
    setback = None if e.ok else CallSetback(kind="failed", intent=call.intent)
    return {"pending": None, "setback": setback}


def _tool_outcome_unknown(s: ThreadState, e: ev.ToolOutcomeUnknown) -> dict[str, Any]:
    _require(s.status == "running", e, s, "the thread is not running")
    call = _pending(s, e, e.tool_call_id, "started")
    _require(e.attempt == call.attempt, e, s, f"attempt {call.attempt} is running")
    _require(not call.idempotent, e, s, "an idempotent call simply runs again")
    unknown = evolve(call, {"phase": "unknown", "unknown_error": e.error})
    return {"pending": unknown, "status": "awaiting_reconcile"}


def _reconcile_decided(s: ThreadState, e: ev.ReconcileDecided) -> dict[str, Any]:
    _require(s.status == "awaiting_reconcile", e, s, "no outcome is unknown")
    call = _pending(s, e, e.tool_call_id, "unknown")
    if e.decision == "retry":  # the next attempt, with the same idempotency key
        again = evolve(call, {"phase": "ready", "unknown_error": ""})
        return {"pending": again, "status": "running"}
    setback = CallSetback(kind="failed", intent=call.intent) if e.decision == "abandon" else None
    return {"pending": None, "status": "running", "setback": setback}


def _retry_scheduled(s: ThreadState, e: ev.RetryScheduled) -> dict[str, Any]:
    _require(s.status == "running", e, s, "the thread is not running")
    # A stopped run starts no new attempt: the failed one's result ends the call.
    _require(s.stop_by is None, e, s, f"{s.stop_by} stopped the run: nothing is retried")
    if e.tool_call_id is None:
        _require(s.pending is None and s.open_decision is None, e, s, "a call is pending")
        return {"status": "sleeping", "model_attempt": e.attempt, "model_retry_at": e.wake_at}
    call = _pending(s, e, e.tool_call_id, "started")
    _require(e.attempt == call.attempt, e, s, f"attempt {call.attempt} is running")
    waiting = evolve(call, {"phase": "retry_wait", "retry_at": e.wake_at})
    return {"pending": waiting, "status": "sleeping"}


def _wait_started(s: ThreadState, e: ev.WaitStarted) -> dict[str, Any]:
    _require(s.status == "running", e, s, "the thread is not running")
    call = _pending(s, e, e.tool_call_id, "started")
    # A waiting tool may sit behind an approval: approval, the call, then the wait.
    # A question to a person (a resuming wait) may come from a call of any policy.
    _require(call.policy in WAITING_POLICIES or e.resumes, e, s, "the tool does not wait")
    info = WaitInfo(
        wait_id=e.wait_id,
        description=e.description,
        data=e.data,
        wake_at=e.wake_at,
        timeout_at=e.timeout_at,
        poll_every_s=e.poll_every_s,
        resumes=e.resumes,
    )
    return {
        "pending": evolve(call, {"phase": "waiting", "wait": info}),
        "status": "awaiting_job",
    }


def _wait_closed(s: ThreadState, e: ev.WaitFinished | ev.WaitTimedOut) -> dict[str, Any]:
    _require(s.status == "awaiting_job", e, s, "no job is awaited")
    call = _pending(s, e, e.tool_call_id, "waiting")
    assert call.wait is not None
    _require(call.wait.wait_id == e.wait_id, e, s, f"wait {e.wait_id!r} is not open")
    _require(e.resumes == call.wait.resumes, e, s, "resumes must be as the wait started")
    timed_out = isinstance(e, ev.WaitTimedOut)
    if call.wait.resumes:  # the call goes on: its next attempt is handed how this ended
        result = {} if isinstance(e, ev.WaitTimedOut) else e.result
        answer = WaitAnswer(data=call.wait.data, result=result, timed_out=timed_out)
        resumed = evolve(call, {"phase": "ready", "wait": None, "answer": answer})
        return {"pending": resumed, "status": "running"}
    setback = CallSetback(kind="failed", intent=call.intent) if timed_out else None
    return {"pending": None, "status": "running", "setback": setback}


def _error(s: ThreadState, e: ev.ErrorRaised) -> dict[str, Any]:
    _require(s.status not in ("new", "cancelled"), e, s, "the thread is not active")
    return {
        "status": "failed",
        "open_decision": None,
        "pending": None,
        "orphan": _orphaned(s),
        "question": None,
        "stop_by": None,
    }


def _context_compacted(s: ThreadState, e: ev.ContextCompacted) -> dict[str, Any]:
    _require(
        s.status in ("running", "sleeping") and s.pending is None and s.open_decision is None,
        e,
        s,
        "the prompt is compacted only right before asking the model",
    )
    seq = e.seq or s.last_seq + 1
    done = s.compaction[1] if s.compaction else 0
    _require(done < e.upto_seq < seq, e, s, f"upto_seq must be in ({done}, {seq})")
    return {"compaction": (seq, e.upto_seq)}


def _no_change(s: ThreadState, e: ev.Event) -> dict[str, Any]:
    return {}


# One branch per event type, keyed by its class (a test names any type left out).
APPLY: dict[type[ev.Event], Callable[[ThreadState, Any], dict[str, Any]]] = {
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
    ev.ApprovalRejected: _approval_closed,
    ev.ApprovalExpired: _approval_closed,
    ev.ApprovalWithdrawn: _approval_closed,
    ev.ApprovalEdited: _approval_edited,
    ev.ApprovalReminded: _approval_reminded,
    ev.GrantCreated: _grant_created,
    ev.GrantRevoked: _grant_revoked,
    ev.ApprovalRefused: _no_change,
    ev.ToolStarted: _tool_started,
    ev.ToolResult: _tool_result,
    ev.ToolOutcomeUnknown: _tool_outcome_unknown,
    ev.ReconcileDecided: _reconcile_decided,
    ev.RetryScheduled: _retry_scheduled,
    ev.WaitStarted: _wait_started,
    ev.WaitFinished: _wait_closed,
    ev.WaitTimedOut: _wait_closed,
    ev.ErrorRaised: _error,
    ev.MessagePosted: _no_change,
    ev.StreamStopped: _no_change,
    ev.FeedbackGiven: _no_change,
    ev.StopRequested: _stop_requested,
    ev.ContextCompacted: _context_compacted,
}


def apply(state: ThreadState, event: ev.Event) -> ThreadState:
    """The state after ``event``; raises ``IllegalTransition`` if it may not happen now."""
    if state.thread_id and event.thread_id and event.thread_id != state.thread_id:
        raise _refuse(event, state, f"event of thread {event.thread_id!r}")
    if event.seq and event.seq != state.last_seq + 1:
        raise _refuse(event, state, f"seq {event.seq} does not follow {state.last_seq}")
    if state.status == "new":
        _require(
            isinstance(event, ev.UserMessage | ev.AlertReceived),
            event,
            state,
            "a thread starts with a message or an alert",
        )
    update = APPLY[type(event)](state, event)
    update["last_seq"] = event.seq or state.last_seq + 1
    if not state.thread_id:
        update["thread_id"] = event.thread_id
    return _stopped(evolve(state, update))


def _stopped(state: ThreadState) -> ThreadState:
    """A stop pressed while a call ran is honoured once the thread would next ask the
    model (the call ended by its result, its wait or a person's reconcile): it rests."""
    if (
        state.stop_by is not None
        and state.status == "running"
        and state.pending is None
        and state.open_decision is None
    ):
        return evolve(state, {"status": "idle", "stop_by": None})
    return state


def reduce(events: Iterable[ev.Event], state: ThreadState | None = None) -> ThreadState:
    """Fold events onto ``state`` (a snapshot), or onto a new thread."""
    current = state if state is not None else ThreadState()
    for event in events:
        current = apply(current, event)
    return current


def next_action(state: ThreadState, now: datetime) -> Action:
    """What the runner must do next in this state at time ``now`` (pure)."""
    status, call = state.status, state.pending
    if status == "running":
        if call is not None and call.phase in ("ready", "started"):
            return "execute_tool"
        if call is None and state.open_decision is None:
            return "ask_model"
        return "none"
    wake = state.wake_at
    if wake is None or wake > now:
        return "none"
    if status == "sleeping":
        return "execute_tool" if call is not None else "ask_model"
    if status == "awaiting_approval":
        # Due: the reminder while the expiry is still ahead, else the expiry (a thread
        # woken late, past both, expires without a reminder first).
        expires = call.expires_at if call is not None else None
        return "remind_approval" if expires is not None and expires > now else "expire_approval"
    if status == "awaiting_job" and call is not None and call.wait is not None:
        return "wait_timeout" if call.wait.timeout_at <= now else "check_wait"
    return "none"
