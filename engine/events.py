"""The typed event schema of an agent thread.

Every meaningful transition of a thread is one immutable event. An event carries the
envelope (thread_id, seq, event_id, type, created_at, actor) and a typed payload; the
union of all event types is discriminated on ``type``. Events are built by code as
*drafts* (envelope not yet stamped) and stamped by the store when appended, which gives
them their ``seq`` and ``event_id``.

Each event type declares its :class:`Facts` (is it an input, how people and the model
see it); the tables elsewhere derive from them. What each type *does* stays in the
module that does it, in a table keyed by the event class (the reducer's branch, the
trace summary, the prompt projection, the Slack line), and a test over
``EVENT_CLASSES`` names any type a table forgot. Adding an event type: its class here
(with its facts, in ``AnyEvent``), its reducer branch and its trace summary; a
projection branch if the model sees it, a line renderer if people see it as a line.

Pure: no I/O here.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from engine.errors import InvalidEvent
from engine.reviewers import ReviewerRule

Actor = str  # a Slack user id (U…/W…), "model", "tool" or "system"
JsonDict = dict[str, Any]
Policy = Literal["run_now", "approve_before_run", "wait_for_external_event"]
# What the policy decided for one call: a tool's policy, or "reject" (a rule refused it).
CallPolicy = Literal["run_now", "approve_before_run", "wait_for_external_event", "reject"]
ReconcileDecision = Literal["happened", "retry", "abandon"]
ApprovalDecision = Literal["approve", "reject"]
# What a person may try to decide, each checked by one function (engine.inputs.may_decide).
RefusedDecision = Literal["approve", "reject", "edit", "happened", "retry", "abandon", "cancel"]

CLARIFICATION_TOOL = "request_clarification"


def new_event_id() -> str:
    # 128 random bits, as a uuid4's hex but without building the UUID.
    return "evt_" + os.urandom(16).hex()


def utcnow() -> datetime:
    return datetime.now(UTC)


# How people see an event in the thread: a line of its own, on a card (the approval or
# reconcile card, posted or updated), or not at all.
Shown = Literal["line", "card", "nothing"]
# What a compaction summary does with an event: always keeps it (people's words and
# their constraints), keeps it as a step while there is room, or leaves it out.
Summarised = Literal["kept", "step", "omitted"]


@dataclass(frozen=True)
class Facts:
    """What holds for every event of a type, declared once on its class.

    ``input``: a person or another system feeds it in and the runner reacts to it.
    ``people``: how the thread shows it (bot.render.lines renders the lines). ``model``: the
    prompt projection shows it to the model (engine.context has its branch).
    ``summary``: its place in a compaction summary (engine.compaction).
    """

    input: bool
    people: Shown
    model: bool
    summary: Summarised


class Event(BaseModel):
    """Envelope shared by every event. ``seq`` is 0 on a draft, >= 1 once stored."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    facts: ClassVar[Facts]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # Every event type declares its facts itself: an inherited default would let a
        # new type slip into every table unnoticed.
        super().__pydantic_init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("facts"), Facts):
            raise TypeError(f"event class {cls.__name__} must declare facts = Facts(...)")

    type: str
    thread_id: str = ""
    seq: int = Field(default=0, ge=0)
    event_id: str = Field(default_factory=new_event_id)
    created_at: AwareDatetime = Field(default_factory=utcnow)
    actor: Actor = "system"
    # An input's delivery id (Slack event_id, a click's action_ts): a redelivery is a no-op.
    dedupe_key: str | None = None


# --- inputs from people -------------------------------------------------------------


class UserMessage(Event):
    type: Literal["user_message"] = "user_message"
    facts = Facts(input=True, people="nothing", model=True, summary="kept")
    text: str
    # Where it came from (a Slack channel and message ts, say); opaque to the engine.
    source: JsonDict = Field(default_factory=dict)


class ClarificationAnswered(Event):
    type: Literal["clarification_answered"] = "clarification_answered"
    facts = Facts(input=True, people="nothing", model=True, summary="kept")
    tool_call_id: str
    text: str
    # As on ``user_message``: where the answer came from, opaque to the engine.
    source: JsonDict = Field(default_factory=dict)


class AlertReceived(Event):
    """A monitoring system's alert (``source``: alertmanager, pagerduty, generic), as its
    route parsed it. The first one (``firing``) starts the thread, whose root is the bot's
    post of it in ``channel``; later ones with the same ``fingerprint`` append to it until
    one says ``resolved``. ``instruction`` is the source's, from ``opsloop.yaml`` when it
    arrived (recorded, so a replay and a changed file see what the model saw). The actor
    is ``alert:<source>``; the delivery's id (``dedupe_key``) makes a resent one a no-op.
    """

    type: Literal["alert_received"] = "alert_received"
    facts = Facts(input=True, people="line", model=True, summary="kept")
    source: str
    fingerprint: str
    status: Literal["firing", "resolved"]
    summary: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    url: str = ""
    instruction: str = ""
    channel: str = ""

    @property
    def alert_key(self) -> str:
        """Which alert this is, across threads: at most one open thread holds it."""
        return alert_key(self.source, self.fingerprint)


def alert_key(source: str, fingerprint: str) -> str:
    return f"{source}:{fingerprint}"


class ThreadCancelled(Event):
    type: Literal["thread_cancelled"] = "thread_cancelled"
    facts = Facts(input=True, people="line", model=True, summary="kept")
    reason: str = ""


# --- the model ----------------------------------------------------------------------


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class ModelDecision(Event):
    """What the model proposed, verbatim, before validation and policy."""

    type: Literal["model_decision"] = "model_decision"
    facts = Facts(input=False, people="nothing", model=True, summary="omitted")
    text: str = ""
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: JsonDict | None = None
    stop_reason: str | None = None
    model: str = ""
    usage: Usage = Field(default_factory=Usage)
    prompt_hash: str = ""
    projection_version: str = ""
    # What the prompt was built from, so a replay can say why it differs: the offered
    # tools' names and the hash of their definitions (empty in logs from before).
    tool_names: tuple[str, ...] = ()
    tools_hash: str = ""


class DecisionRejected(Event):
    type: Literal["decision_rejected"] = "decision_rejected"
    facts = Facts(input=False, people="line", model=True, summary="step")
    tool_call_id: str | None = None
    reason: str


class FinalAnswer(Event):
    type: Literal["final_answer"] = "final_answer"
    facts = Facts(input=False, people="line", model=False, summary="step")
    text: str


class ClarificationRequested(Event):
    type: Literal["clarification_requested"] = "clarification_requested"
    facts = Facts(input=False, people="line", model=False, summary="step")
    tool_call_id: str
    question: str


# --- tool calls ---------------------------------------------------------------------


class ToolCallRequested(Event):
    """The model asked for a call and the policy decided what it needs.

    ``policy`` "reject" (a rule refused the call, with ``reason``) closes the call at
    once: the model reads the reason as the call's error result. ``rule`` is the index
    of the ``opsloop.yaml`` rule that decided (None: none matched), ``policy_hash`` the
    file's hash (None: no file). ``approvers`` / ``quorum`` / ``allow_self`` are the
    reviewer rule for its approval and for a reconcile (None: the process's approvers,
    as logs from before record). ``definition_hash`` pins the tool definition the call
    (and its approval) was made for. ``idempotent``: a call interrupted after it
    started may simply run again; otherwise a person says whether it happened.
    ``escalate_to``: the rule's people, groups or channel told when its approval expires
    (recorded, so a changed policy file does not change a pending call). ``max_grant_s``:
    the longest standing grant its approval may create (None: none), recorded alike.
    """

    type: Literal["tool_call_requested"] = "tool_call_requested"
    facts = Facts(input=False, people="line", model=True, summary="step")
    tool_call_id: str
    intent: str
    arguments: JsonDict
    policy: CallPolicy
    idempotency_key: str
    reason: str = ""
    rule: int | None = None
    policy_hash: str | None = None
    definition_hash: str | None = None
    idempotent: bool = True
    approvers: tuple[str, ...] | None = None
    quorum: int = Field(default=1, ge=1)
    allow_self: bool | None = None
    escalate_to: tuple[str, ...] = ()
    max_grant_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _spread_reviewers(cls, data: Any) -> Any:
        return spread_reviewers(data)

    @property
    def reviewers(self) -> ReviewerRule | None:
        """Who may decide the call (None: a call from before this was recorded, which the
        process's default rule decides)."""
        return reviewers_of(self.approvers, self.quorum, self.allow_self, self.rule)


def spread_reviewers(data: Any) -> Any:
    """``reviewers=ReviewerRule(...)`` is stored as the flat fields logs have always held
    (``rule``, ``approvers`` sorted, ``quorum``, ``allow_self``)."""
    if isinstance(data, dict) and isinstance(data.get("reviewers"), ReviewerRule):
        data = dict(data)
        r: ReviewerRule = data.pop("reviewers")
        data |= {
            "rule": r.rule,
            "approvers": tuple(sorted(r.approvers)),
            "quorum": r.quorum,
            "allow_self": r.allow_self,
        }
    return data


def reviewers_of(
    approvers: tuple[str, ...] | None, quorum: int, allow_self: bool | None, rule: int | None
) -> ReviewerRule | None:
    """The flat fields back as one rule (None when no approvers were recorded)."""
    if approvers is None:
        return None
    return ReviewerRule(frozenset(approvers), quorum, bool(allow_self), rule)


class ApprovalRequested(Event):
    """The card: ``expires_at`` closes it unanswered; ``remind_at`` (None: no reminder)
    is when the approvers are reminded if nobody has decided by then."""

    type: Literal["approval_requested"] = "approval_requested"
    facts = Facts(input=False, people="card", model=False, summary="omitted")
    tool_call_id: str
    arguments_hash: str
    expires_at: AwareDatetime
    reason: str = ""
    remind_at: AwareDatetime | None = None


class GrantUse(BaseModel):
    """The standing grant that approved a call (on ``approval_granted`` by a grant):
    carried whole, because a channel-wide grant lives in another thread's log."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    grant_id: str
    tool: str
    reviewer: str
    until: AwareDatetime
    thread_id: str  # the thread whose log holds its grant_created


class ApprovalGranted(Event):
    """One reviewer's vote; with a quorum, the call runs once enough distinct people
    have voted (the actor is the reviewer). A standing grant's approval has the actor
    ``grant:<grant_id>`` and names the grant in ``grant``."""

    type: Literal["approval_granted"] = "approval_granted"
    facts = Facts(input=True, people="card", model=False, summary="step")
    tool_call_id: str
    grant: GrantUse | None = None


class ApprovalRejected(Event):
    type: Literal["approval_rejected"] = "approval_rejected"
    facts = Facts(input=True, people="card", model=True, summary="kept")
    tool_call_id: str
    reason: str = ""


class ApprovalRefused(Event):
    """An attempt to decide that was not allowed; kept for the audit, changes nothing.
    ``decision`` is what was attempted: an approval vote, a reconcile or a cancel (which
    names the pending call whose reviewer rule refused it, or no call when none was
    pending)."""

    type: Literal["approval_refused"] = "approval_refused"
    facts = Facts(input=True, people="nothing", model=False, summary="omitted")
    tool_call_id: str | None = None
    decision: RefusedDecision
    reason: str


class ApprovalEdited(Event):
    """A reviewer changed the arguments of a call awaiting approval (a modal on its
    card). The call now has ``arguments`` (``arguments_hash``; ``previous_hash`` is the
    hash the edit was made on), earlier votes no longer count, and the reviewer rule is
    the one the policy gives the new arguments, never below what the call needed
    (``engine.edits.after_edit``), stored flat as on ``tool_call_requested`` (None: the
    call's rule is unchanged). ``policy`` "reject": the policy refuses the new arguments,
    which closes the call with ``reason`` as its error result. The actor is the reviewer."""

    type: Literal["approval_edited"] = "approval_edited"
    facts = Facts(input=True, people="card", model=True, summary="step")
    tool_call_id: str
    reviewer: str
    arguments: JsonDict
    arguments_hash: str
    previous_hash: str
    policy: Literal["approve_before_run", "reject"] = "approve_before_run"
    reason: str = ""
    rule: int | None = None
    approvers: tuple[str, ...] | None = None
    quorum: int = Field(default=1, ge=1)
    allow_self: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _spread_reviewers(cls, data: Any) -> Any:
        return spread_reviewers(data)

    @property
    def reviewers(self) -> ReviewerRule | None:
        """Who may decide the edited call (None: the same as before the edit)."""
        return reviewers_of(self.approvers, self.quorum, self.allow_self, self.rule)


class ApprovalWithdrawn(Event):
    """The requester wrote again while their call waited for a reviewer: the card no
    longer stands (a click on it is refused) and the model decides again, the new
    message in view. Appended with that message, in its transaction; the actor is the
    requester."""

    type: Literal["approval_withdrawn"] = "approval_withdrawn"
    facts = Facts(input=True, people="card", model=True, summary="step")
    tool_call_id: str
    reason: str


class ApprovalReminded(Event):
    """Nobody decided by the card's ``remind_at``: the approvers are reminded in the
    thread, once (the runner appends it when the thread wakes at that time)."""

    type: Literal["approval_reminded"] = "approval_reminded"
    facts = Facts(input=False, people="card", model=False, summary="omitted")
    tool_call_id: str


class GrantCreated(Event):
    """A reviewer's standing grant ("Approve for 1 h"), created with their vote: until
    ``until``, a later call of ``tool`` whose arguments satisfy ``arguments_schema`` and
    whose rule has quorum 1 and allows grants is approved at once in ``scope`` ("thread":
    the thread it is stored in; "channel": any thread of that thread's channel). The
    actor is the reviewer too."""

    type: Literal["grant_created"] = "grant_created"
    # Not shown of its own: the card its vote closes says what it lets through, and the
    # lines of the calls it approves name it.
    facts = Facts(input=True, people="card", model=False, summary="omitted")
    grant_id: str
    tool: str
    arguments_schema: JsonDict
    scope: Literal["thread", "channel"] = "thread"
    until: AwareDatetime
    reviewer: str
    tool_call_id: str = ""  # the call whose approval created it
    # The approvers of the rule the reviewer approved under: the grant stands in for
    # one of them, so it covers only calls whose rule they (or the same list) decide.
    approvers: tuple[str, ...] | None = None


class GrantRevoked(Event):
    """The grant ``grant_id`` approves nothing from now on (the actor revoked it)."""

    type: Literal["grant_revoked"] = "grant_revoked"
    facts = Facts(input=True, people="nothing", model=False, summary="omitted")
    grant_id: str


class ApprovalExpired(Event):
    type: Literal["approval_expired"] = "approval_expired"
    facts = Facts(input=False, people="card", model=True, summary="step")
    tool_call_id: str


class ToolStarted(Event):
    """Written before the side effect: the intent to run attempt ``attempt``."""

    type: Literal["tool_started"] = "tool_started"
    facts = Facts(input=False, people="nothing", model=False, summary="omitted")
    tool_call_id: str
    attempt: int = Field(ge=1)


class ToolResult(Event):
    type: Literal["tool_result"] = "tool_result"
    facts = Facts(input=False, people="line", model=True, summary="step")
    tool_call_id: str
    attempt: int = Field(ge=1)
    ok: bool
    output: Any = None
    error: str | None = None


class ToolOutcomeUnknown(Event):
    """A non-idempotent call was interrupted between ``tool_started`` and its result
    (a crash, a connection lost after the request went out): whether its effect
    happened is unknown, so nothing runs again until a person says."""

    type: Literal["tool_outcome_unknown"] = "tool_outcome_unknown"
    facts = Facts(input=False, people="card", model=False, summary="omitted")
    tool_call_id: str
    attempt: int = Field(ge=1)
    started_at: AwareDatetime | None = None  # when the interrupted attempt started
    error: str = ""  # what was observed, if anything (e.g. "connection lost")


class ReconcileDecided(Event):
    """A person said what became of a call whose outcome was unknown: ``happened``
    (``note`` is the result the model reads), ``retry`` (run it again, next attempt)
    or ``abandon`` (it did not happen: an error result)."""

    type: Literal["reconcile_decided"] = "reconcile_decided"
    # Kept in summaries, as a reviewer's rejection is: it is the only word on whether
    # the effect happened, and the model must not lose it to a compaction.
    facts = Facts(input=True, people="card", model=True, summary="kept")
    tool_call_id: str
    decision: ReconcileDecision
    reviewer: str
    note: str = ""


class RetryScheduled(Event):
    """A transient failure; the next attempt is due at ``wake_at``.

    With a ``tool_call_id`` it retries that call; without one, the model call.
    """

    type: Literal["retry_scheduled"] = "retry_scheduled"
    facts = Facts(input=False, people="line", model=False, summary="omitted")
    tool_call_id: str | None = None
    attempt: int = Field(ge=1)
    wake_at: AwareDatetime
    error: str


class WaitStarted(Event):
    """The call waits (a job, a webhook). ``resumes``: the call is not over when the
    wait ends: its next attempt is handed how it ended (a person's answer to a question
    the tool asked mid-call, MCP elicitation), and that attempt's outcome is the call's.
    Such a wait may start under any policy (a person answers it, not a job)."""

    type: Literal["wait_started"] = "wait_started"
    facts = Facts(input=False, people="line", model=False, summary="omitted")
    tool_call_id: str
    wait_id: str
    description: str
    data: JsonDict = Field(default_factory=dict)
    wake_at: AwareDatetime
    timeout_at: AwareDatetime
    poll_every_s: float | None = None
    resumes: bool = False


class WaitFinished(Event):
    """``resumes`` as the wait's ``wait_started`` says (the reducer checks): its result
    then goes to the call's next attempt, not to the model."""

    type: Literal["wait_finished"] = "wait_finished"
    facts = Facts(input=True, people="line", model=True, summary="step")
    tool_call_id: str
    wait_id: str
    result: JsonDict = Field(default_factory=dict)
    resumes: bool = False


class WaitTimedOut(Event):
    type: Literal["wait_timed_out"] = "wait_timed_out"
    facts = Facts(input=False, people="line", model=True, summary="step")
    tool_call_id: str
    wait_id: str
    resumes: bool = False


# --- the system ---------------------------------------------------------------------


class ErrorRaised(Event):
    """Something went wrong that the model cannot fix by itself; the thread fails."""

    type: Literal["error"] = "error"
    facts = Facts(input=False, people="line", model=True, summary="step")
    message: str
    kind: str = "error"


class MessagePosted(Event):
    """A delivery receipt: the front door showed event ``shows_event_id`` to people.

    ``kind`` "stream": the run's plan message (``chat.startStream``) at ``ts``, recorded
    before anything is appended to it; ``shows_event_id`` is the input that started the
    run. A run longer than Slack lets one stream live has one receipt per segment.
    """

    type: Literal["message_posted"] = "message_posted"
    facts = Facts(input=False, people="nothing", model=False, summary="omitted")
    shows_event_id: str
    channel: str = ""
    ts: str = ""
    kind: Literal["post", "stream"] = "post"


class StreamStopped(Event):
    """The plan message (stream) at ``ts`` was stopped (``chat.stopStream``): nothing
    more is appended to it."""

    type: Literal["stream_stopped"] = "stream_stopped"
    facts = Facts(input=False, people="nothing", model=False, summary="omitted")
    ts: str
    channel: str = ""


class FeedbackGiven(Event):
    """A person clicked 👍 or 👎 under the answer of the plan message at ``ts``."""

    type: Literal["feedback_given"] = "feedback_given"
    facts = Facts(input=False, people="nothing", model=False, summary="omitted")
    ts: str
    value: Literal["up", "down"]
    user: str


class StopRequested(Event):
    """``user`` pressed Slack's stop button on the thread's agent session
    (``agent_session_stopped``): the run stops at its next step boundary; a tool already
    started ends by its normal path."""

    type: Literal["stop_requested"] = "stop_requested"
    facts = Facts(input=True, people="nothing", model=True, summary="kept")
    user: str


class ContextCompacted(Event):
    """Events up to ``upto_seq`` are replaced in the prompt by ``summary`` from here on.

    Stored, so that every later projection (and a replay) sees the same summary,
    whether code or a model wrote it.
    """

    type: Literal["context_compacted"] = "context_compacted"
    facts = Facts(input=False, people="nothing", model=True, summary="omitted")
    upto_seq: int = Field(ge=1)
    summary: str
    method: Literal["deterministic", "model"] = "deterministic"


AnyEvent = Annotated[
    UserMessage
    | ClarificationAnswered
    | AlertReceived
    | ThreadCancelled
    | ModelDecision
    | DecisionRejected
    | FinalAnswer
    | ClarificationRequested
    | ToolCallRequested
    | ApprovalRequested
    | ApprovalGranted
    | ApprovalRejected
    | ApprovalRefused
    | ApprovalEdited
    | ApprovalWithdrawn
    | ApprovalReminded
    | GrantCreated
    | GrantRevoked
    | ApprovalExpired
    | ToolStarted
    | ToolResult
    | ToolOutcomeUnknown
    | ReconcileDecided
    | RetryScheduled
    | WaitStarted
    | WaitFinished
    | WaitTimedOut
    | ErrorRaised
    | MessagePosted
    | StreamStopped
    | FeedbackGiven
    | StopRequested
    | ContextCompacted,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)
# Every concrete type subclasses Event directly (a test checks they are AnyEvent's).
EVENT_CLASSES: tuple[type[Event], ...] = tuple(Event.__subclasses__())


def type_name(cls: type[Event]) -> str:
    """The ``type`` tag of an event class."""
    name: str = cls.model_fields["type"].default
    return name


EVENT_TYPES: tuple[str, ...] = tuple(type_name(cls) for cls in EVENT_CLASSES)
# Events a person or another system feeds in; the runner reacts to them.
INPUT_TYPES = frozenset(type_name(c) for c in EVENT_CLASSES if c.facts.input)


def missing_from(
    table: Collection[type[Event]], among: Sequence[type[Event]] = EVENT_CLASSES
) -> list[str]:
    """The types of ``among`` that ``table`` (event classes, or a dict keyed by them)
    has no entry for: a completeness test asserts this is empty, naming what is left out."""
    return [type_name(cls) for cls in among if cls not in table]


def parse_event(data: dict[str, Any]) -> AnyEvent:
    """Validate a dict into its typed event; the error names the first bad field."""
    if not isinstance(data, dict):
        raise InvalidEvent(f"an event is a JSON object, not {type(data).__name__}")
    try:
        return EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise InvalidEvent(_describe(exc, data)) from exc


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = list(err["loc"])
    if loc and loc[0] == data.get("type"):  # the union's tag leads the location
        loc = loc[1:]
    where = ".".join(str(p) for p in loc) or "type"
    if err["type"] == "union_tag_invalid":
        return f"unknown event type {data.get('type')!r}"
    return f"invalid {data.get('type', 'event')!r} event: field {where!r}: {err['msg']}"
