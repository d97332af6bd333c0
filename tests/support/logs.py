"""Builders of legal thread logs for tests: fixed paths and a random simulator.

A log is a list of events that ``engine.state.reduce`` accepts. Builders return
*drafts* (seq 0, no thread id), which is what ``Store.append`` takes; ``stamp`` gives a
log seq 1..n, a thread id, event ids and fixed times, as the store would, for the pure
tests.

The simulator (``Simulator``, ``simulate``, ``legal_logs``, ``random_log``) starts from a
new thread and repeatedly picks one of the events that ``engine.state.apply`` accepts in
the current state, so every log it makes is legal by construction and covers the paths
a real runner and real people produce (approvals, retries, waits, questions, cancels).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from hypothesis import settings
from hypothesis import strategies as st

from engine import events as ev
from engine.errors import IllegalTransition
from engine.policy import arguments_hash
from engine.state import ThreadState, apply

Choose = Callable[[Sequence[Any]], Any]

T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
THREAD_ID = "thr_test"
REQUESTER = "U0REQUEST"
REVIEWER = "U0REVIEW"
OTHER = "U0OTHER"
# The tools the simulated model knows, with their policies.
TOOLS: dict[str, ev.CallPolicy] = {
    "lookup": "run_now",
    "deploy": "approve_before_run",
    "build": "wait_for_external_event",
    "restart": "approve_before_run",  # non-idempotent, a quorum of two
    "purge": "reject",  # a rule refuses it
}
# What a policy file's rule records on these tools' tool_call_requested.
RULED: dict[str, dict[str, Any]] = {
    "restart": {
        "rule": 0,
        "policy_hash": "b" * 64,
        "approvers": (REVIEWER, OTHER),
        "quorum": 2,
        "allow_self": False,
        "idempotent": False,
        "escalate_to": ("S0ONCALL", "C0ESCALATE"),  # its expiry is posted in a channel
    },
    "purge": {"rule": 1, "policy_hash": "b" * 64, "reason": "nothing is ever purged"},
    "deploy": {"max_grant_s": 3600.0},  # its approval may create a standing grant
}
UNKNOWN_TOOL = "no_such_tool"

# Hypothesis settings for the pure property tests: fast, no wall-clock deadline.
PROPERTY = settings(max_examples=100, deadline=None)


def at(minutes: float) -> datetime:
    """A fixed time: ``T0`` plus ``minutes``."""
    return T0 + timedelta(minutes=minutes)


# --- single events --------------------------------------------------------------------


def user(text: str = "deploy api to staging", actor: str = REQUESTER, **kw: Any) -> ev.UserMessage:
    return ev.UserMessage(text=text, actor=actor, **kw)


ALERT_SOURCE = "alertmanager"
ALERT_FINGERPRINT = "5b9b5a2e3c1f0a7d"


def alert(
    status: Literal["firing", "resolved"] = "firing",
    fingerprint: str = ALERT_FINGERPRINT,
    summary: str = "p99 latency above 2s",
    **kw: Any,
) -> ev.AlertReceived:
    """An Alertmanager alert, as its route turns it into an input (``kw``: other fields)."""
    fields: dict[str, Any] = {
        "labels": {"alertname": "HighLatency", "service": "api"},
        "url": "https://prometheus.example/graph",
        "instruction": "Investigate with read-only tools and summarise. Do not act.",
        "channel": "C0ALERTS",
    }
    return ev.AlertReceived(
        actor=f"alert:{ALERT_SOURCE}",
        source=ALERT_SOURCE,
        fingerprint=fingerprint,
        status=status,
        summary=summary,
        **(fields | kw),
    )


def said(text: str = "done") -> ev.ModelDecision:
    """A model decision with no tool use (a final answer, or an empty reply)."""
    return ev.ModelDecision(actor="model", text=text, stop_reason="end_turn", model="scripted")


def decided(call_id: str, tool: str, text: str = "", **arguments: Any) -> ev.ModelDecision:
    """A model decision proposing ``tool(**arguments)`` as call ``call_id``."""
    return ev.ModelDecision(
        actor="model",
        text=text,
        tool_name=tool,
        tool_call_id=call_id,
        arguments=arguments,
        stop_reason="tool_use",
        model="scripted",
    )


def requested(
    call_id: str,
    tool: str,
    *,
    policy: ev.CallPolicy | None = None,
    thread_id: str = THREAD_ID,
    **arguments: Any,
) -> ev.ToolCallRequested:
    return ev.ToolCallRequested(
        tool_call_id=call_id,
        intent=tool,
        arguments=arguments,
        policy=policy or TOOLS[tool],
        idempotency_key=f"{thread_id}:{call_id}",
        **RULED.get(tool, {}),
    )


def outcome_unknown(call_id: str, attempt: int = 1) -> ev.ToolOutcomeUnknown:
    return ev.ToolOutcomeUnknown(
        tool_call_id=call_id, attempt=attempt, started_at=T0, error="connection lost"
    )


def reconciled(
    call_id: str, decision: ev.ReconcileDecision, reviewer: str = REVIEWER, note: str = ""
) -> ev.ReconcileDecided:
    return ev.ReconcileDecided(
        actor=reviewer, tool_call_id=call_id, decision=decision, reviewer=reviewer, note=note
    )


def edited(
    tool: str,
    call_id: str,
    previous_hash: str,
    policy: Literal["approve_before_run", "reject"] = "approve_before_run",
    **arguments: Any,
) -> ev.ApprovalEdited:
    """A reviewer's edit of the call awaiting approval; a ruled tool's records its rule
    again (an edit records the rule its new arguments get)."""
    rule = RULED.get(tool, {})
    kept = ("rule", "approvers", "quorum", "allow_self")
    reviewers = {k: rule[k] for k in kept} if "approvers" in rule else {}
    return ev.ApprovalEdited(
        actor=REVIEWER,
        tool_call_id=call_id,
        reviewer=REVIEWER,
        arguments=arguments,
        arguments_hash=arguments_hash(tool, arguments),
        previous_hash=previous_hash,
        policy=policy,
        reason="the policy refuses it" if policy == "reject" else "",
        **reviewers,
    )


def approval_asked(
    call_id: str,
    tool: str,
    expires_at: datetime | None = None,
    *,
    remind_at: datetime | None = None,
    **arguments: Any,
) -> ev.ApprovalRequested:
    return ev.ApprovalRequested(
        tool_call_id=call_id,
        arguments_hash=arguments_hash(tool, arguments),
        expires_at=expires_at or at(24 * 60),
        remind_at=remind_at,
    )


def started(call_id: str, attempt: int = 1) -> ev.ToolStarted:
    return ev.ToolStarted(tool_call_id=call_id, attempt=attempt)


def result(call_id: str, attempt: int = 1, *, ok: bool = True, output: Any = None) -> ev.ToolResult:
    if ok:
        return ev.ToolResult(
            actor="tool", tool_call_id=call_id, attempt=attempt, ok=True, output=output
        )
    return ev.ToolResult(
        actor="tool", tool_call_id=call_id, attempt=attempt, ok=False, error="boom"
    )


def retry(call_id: str | None, attempt: int, wake_at: datetime) -> ev.RetryScheduled:
    return ev.RetryScheduled(tool_call_id=call_id, attempt=attempt, wake_at=wake_at, error="flaky")


def wait_started(
    call_id: str,
    wait_id: str = "thr_test.w1",
    *,
    wake_at: datetime | None = None,
    timeout_at: datetime | None = None,
) -> ev.WaitStarted:
    return ev.WaitStarted(
        actor="tool",
        tool_call_id=call_id,
        wait_id=wait_id,
        description="build #1",
        data={"build": 1},
        wake_at=wake_at or at(5),
        timeout_at=timeout_at or at(60),
        poll_every_s=300.0,
    )


# --- common paths (drafts) ------------------------------------------------------------


def answered(text: str = "done") -> list[ev.Event]:
    """The model answers: decision plus final answer."""
    return [said(text), ev.FinalAnswer(actor="model", text=text)]


def run_now_call(
    call_id: str = "toolu_1", *, ok: bool = True, output: Any = None
) -> list[ev.Event]:
    """A run_now call from decision to result."""
    return [
        decided(call_id, "lookup", q="api"),
        requested(call_id, "lookup", q="api"),
        started(call_id),
        result(call_id, ok=ok, output=output if output is not None else {"hits": 1}),
    ]


def approval_pending(
    call_id: str = "toolu_2", *, expires_at: datetime | None = None, thread_id: str = THREAD_ID
) -> list[ev.Event]:
    """A decision to run an approve_before_run tool, up to the approval request."""
    return [
        decided(call_id, "deploy", text="I will deploy.", service="api", env="staging"),
        requested(call_id, "deploy", thread_id=thread_id, service="api", env="staging"),
        approval_asked(call_id, "deploy", expires_at, service="api", env="staging"),
    ]


def waiting_on_job(
    call_id: str = "toolu_3",
    wait_id: str = "thr_test.w1",
    *,
    wake_at: datetime | None = None,
    timeout_at: datetime | None = None,
) -> list[ev.Event]:
    """A wait_for_external_event call that started its wait."""
    return [
        decided(call_id, "build", ref="main"),
        requested(call_id, "build", ref="main"),
        started(call_id),
        wait_started(call_id, wait_id, wake_at=wake_at, timeout_at=timeout_at),
    ]


def clarification_asked(call_id: str = "toolu_4", question: str = "Which env?") -> list[ev.Event]:
    return [
        decided(call_id, ev.CLARIFICATION_TOOL, question=question),
        ev.ClarificationRequested(tool_call_id=call_id, question=question),
    ]


def happy_path() -> list[ev.Event]:
    """Message, a run_now call, an approved call, a final answer: the thread is idle."""
    return [
        user(),
        *run_now_call("toolu_1"),
        *approval_pending("toolu_2"),
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_2"),
        started("toolu_2"),
        result("toolu_2", output={"deployed": True}),
        *answered("Deployed api to staging."),
    ]


def chat_rounds(n: int) -> list[ev.Event]:
    """``n`` rounds of message and answer: a long, legal log of ``3 * n`` events."""
    log: list[ev.Event] = []
    for i in range(n):
        log += [user(f"question {i}"), *answered(f"answer {i}")]
    return log


def stamp(events: Iterable[ev.Event], thread_id: str = THREAD_ID, start: int = 1) -> list[Any]:
    """Give drafts what the store gives them: seq from ``start``, thread id, ids, times.

    ``message_posted`` receipts are re-pointed at the stamped ids of the events they show.
    """
    renamed: dict[str, str] = {}
    out: list[Any] = []
    for seq, event in enumerate(events, start=start):
        new_id = f"evt_{thread_id}_{seq:05d}"
        renamed[event.event_id] = new_id
        update: dict[str, Any] = {
            "thread_id": thread_id,
            "seq": seq,
            "event_id": new_id,
            "created_at": T0 + timedelta(seconds=seq),
        }
        if isinstance(event, ev.MessagePosted):
            update["shows_event_id"] = renamed.get(event.shows_event_id, event.shows_event_id)
        out.append(event.model_copy(update=update))
    return out


# --- the simulator --------------------------------------------------------------------


def is_legal(state: ThreadState, event: ev.Event) -> bool:
    try:
        apply(state, event)
    except IllegalTransition:
        return False
    return True


class Simulator:
    """Grows a legal log one event at a time, offering only what ``apply`` accepts.

    Candidates are split into *progress* (what a runner or the people in the thread do
    next on the main path) and *noise* (cancels, errors, delivery receipts, refused
    clicks, crash re-runs, messages in the middle of a step), so a caller can favour
    progress and still reach every status.
    """

    def __init__(self, thread_id: str = THREAD_ID) -> None:
        self.thread_id = thread_id
        self.state = ThreadState()
        self.log: list[ev.Event] = []
        self._decision: ev.ModelDecision | None = None
        self._boundaries: list[int] = []  # seqs after which the model was asked

    @classmethod
    def replay(cls, log: Iterable[ev.Event], thread_id: str = THREAD_ID) -> Simulator:
        sim = cls(thread_id)
        for event in log:
            sim.push(event)
        return sim

    def push(self, event: ev.Event) -> None:
        if isinstance(event, ev.ModelDecision):
            self._boundaries.append(len(self.log))
        self.state = apply(self.state, event)
        self.log.append(event)
        if isinstance(event, ev.ModelDecision):
            self._decision = event

    def options(self) -> tuple[list[ev.Event], list[ev.Event]]:
        """The legal next events: (progress, noise)."""
        progress = [e for e in self.progress_candidates() if is_legal(self.state, e)]
        noise = [e for e in self.noise_candidates() if is_legal(self.state, e)]
        return progress, noise

    def candidates(self) -> list[ev.Event]:
        """Every event this simulator would consider now, legal or not."""
        return [*self.progress_candidates(), *self.noise_candidates()]

    # -- candidates --------------------------------------------------------------------

    def _n(self) -> int:
        return len(self.log) + 1

    def progress_candidates(self) -> list[ev.Event]:
        s, n = self.state, self._n()
        out: list[ev.Event] = []
        if s.status in ("new", "idle", "failed", "cancelled"):
            out.append(user(f"message {n}"))
        if s.status == "new":  # or an alert opens the thread
            out.append(alert(summary=f"alert {n}"))
        if s.open_decision is None and s.pending is None and s.status in ("running", "sleeping"):
            out += self._decisions(n)
            out.append(retry(None, s.model_attempt + 1, at(n)))
        elif self._decision is not None:
            out += self._consequences(self._decision)
        if s.question is not None:
            out.append(
                ev.ClarificationAnswered(
                    actor=REQUESTER, tool_call_id=s.question.tool_call_id, text=f"answer {n}"
                )
            )
        call = s.pending
        if call is not None:
            cid = call.tool_call_id
            if call.phase == "requested" and call.grants_allowed:
                # A live grant of the thread approves it at once, instead of a card.
                out += [ev.ApprovalGranted(actor=f"grant:{g}", tool_call_id=cid) for g in s.grants]
            if call.phase == "requested":
                # The ruled tool's rule sets a reminder, as a policy file's may.
                remind = at(n + 30) if call.intent in RULED else None
                out.append(
                    approval_asked(cid, call.intent, at(n + 60), remind_at=remind, **call.arguments)
                )
            if call.phase == "awaiting_approval":
                out += [
                    ev.ApprovalGranted(actor=REVIEWER, tool_call_id=cid),
                    ev.ApprovalGranted(actor=OTHER, tool_call_id=cid),
                    ev.ApprovalRejected(actor=REVIEWER, tool_call_id=cid, reason="not now"),
                    ev.ApprovalExpired(tool_call_id=cid),
                    # Legal once, and only for a card with a reminder.
                    ev.ApprovalReminded(tool_call_id=cid),
                    edited(call.intent, cid, call.arguments_hash, target=f"edited {n}"),
                    edited(call.intent, cid, call.arguments_hash, "reject", target="refused"),
                ]
            if call.phase in ("ready", "retry_wait"):
                out.append(started(cid, call.attempt + 1))
            if call.phase == "started":
                out += [
                    result(cid, call.attempt, output={"n": n}),
                    result(cid, call.attempt, ok=False),
                    retry(cid, call.attempt, at(n + 2**call.attempt)),
                    wait_started(
                        cid, f"{self.thread_id}.w{n}", wake_at=at(n + 5), timeout_at=at(n + 60)
                    ),
                    outcome_unknown(cid, call.attempt),
                ]
            if call.phase == "unknown":
                out += [
                    reconciled(cid, "happened", note=f"done by hand {n}"),
                    reconciled(cid, "retry"),
                    reconciled(cid, "abandon"),
                ]
            if call.phase == "waiting" and call.wait is not None:
                wid = call.wait.wait_id
                out += [
                    ev.WaitFinished(tool_call_id=cid, wait_id=wid, result={"status": "green"}),
                    ev.WaitTimedOut(tool_call_id=cid, wait_id=wid),
                ]
        return out

    def _decisions(self, n: int) -> list[ev.Event]:
        cid = f"toolu_{n:04d}"
        return [
            said(f"answer {n}"),
            said(""),
            decided(cid, ev.CLARIFICATION_TOOL, question=f"question {n}?"),
            *(decided(cid, name, target=f"t{n}") for name in TOOLS),
            decided(cid, UNKNOWN_TOOL, target=f"t{n}"),
        ]

    def _consequences(self, d: ev.ModelDecision) -> list[ev.Event]:
        cid, name = d.tool_call_id, d.tool_name
        if name is None or cid is None:
            if d.text:
                return [ev.FinalAnswer(actor="model", text=d.text)]
            return [ev.DecisionRejected(reason="the reply was empty")]
        if name == ev.CLARIFICATION_TOOL:
            question = str((d.arguments or {}).get("question", "?"))
            return [ev.ClarificationRequested(tool_call_id=cid, question=question)]
        if name in TOOLS:
            return [requested(cid, name, thread_id=self.thread_id, **(d.arguments or {}))]
        return [ev.DecisionRejected(tool_call_id=cid, reason=f"unknown tool {name!r}")]

    def noise_candidates(self) -> list[ev.Event]:
        s, n = self.state, self._n()
        cid = s.pending.tool_call_id if s.pending else "toolu_none"
        out: list[ev.Event] = [
            user(f"by the way {n}", actor=OTHER),
            ev.ThreadCancelled(actor=REQUESTER, reason="changed my mind"),
            ev.ErrorRaised(message=f"failure {n}", kind="model"),
            ev.ApprovalRefused(
                actor=OTHER, tool_call_id=cid, decision="approve", reason="not an approver"
            ),
            ev.ApprovalRefused(
                actor=REQUESTER, tool_call_id=cid, decision="retry", reason="self-approval is off"
            ),
            # Legal only while a card waits: the requester wrote again.
            ev.ApprovalWithdrawn(actor=REQUESTER, tool_call_id=cid, reason="superseded"),
        ]
        if s.alert is not None:  # the thread's alert fires again, or resolves
            out += [alert(summary=f"again {n}"), alert("resolved", summary=f"resolved {n}")]
        if s.grants:  # one grant at a time, so noise stays a small share
            out.append(ev.GrantRevoked(actor=REVIEWER, grant_id=next(iter(s.grants))))
        elif s.status != "new":  # a reviewer's "Approve for 1 h" (noise: its vote aside)
            out.append(
                ev.GrantCreated(
                    actor=REVIEWER,
                    grant_id=f"grant_{n:04d}",
                    tool="deploy",
                    arguments_schema={"type": "object"},
                    until=at(n + 60),
                    reviewer=REVIEWER,
                )
            )
        if self.log:
            out.append(
                ev.MessagePosted(shows_event_id=self.log[-1].event_id, channel="C1", ts=f"{n}.0")
            )
        if s.status != "new":  # the plan message stopped, a 👍 on it, Slack's stop button
            out += [
                ev.StreamStopped(ts=f"{n}.1", channel="C1"),
                ev.FeedbackGiven(actor=OTHER, ts=f"{n}.1", value="up", user=OTHER),
                ev.StopRequested(actor=REQUESTER, user=REQUESTER),
            ]
        if s.open_decision:
            out.append(ev.DecisionRejected(tool_call_id=s.open_decision, reason="bad arguments"))
        done = s.compaction[1] if s.compaction else 0
        later = [b for b in self._boundaries if b > done]
        if later:
            # As the runner does: summarise up to a point where the model was asked.
            summary = f"[summary of events up to seq {later[-1]}]"
            out.append(ev.ContextCompacted(upto_seq=later[-1], summary=summary))
        if s.pending is not None and s.pending.phase == "started":
            # A process died mid-call: the next one starts the next attempt.
            out.append(started(s.pending.tool_call_id, s.pending.attempt + 1))
        return out


def simulate(choose: Choose, steps: int, thread_id: str = THREAD_ID) -> list[ev.Event]:
    """A legal draft log of ``steps`` events; ``choose`` picks from a non-empty list.

    Progress is chosen four times out of five (when there is any), noise otherwise.
    """
    sim = Simulator(thread_id)
    for _ in range(steps):
        progress, noise = sim.options()
        assert progress or noise, f"no legal event in {sim.state!r}"
        use_progress = bool(progress) and (not noise or choose([True, True, True, True, False]))
        sim.push(choose(progress if use_progress else noise))
    return sim.log


def random_log(seed: int, steps: int, thread_id: str = THREAD_ID) -> list[ev.Event]:
    """A reproducible random legal draft log (no hypothesis needed)."""
    rng = random.Random(seed)
    return simulate(rng.choice, steps, thread_id)


@st.composite
def legal_logs(
    draw: st.DrawFn,
    min_size: int = 1,
    max_size: int = 40,
    *,
    stamped: bool = True,
    thread_id: str = THREAD_ID,
) -> list[Any]:
    """Hypothesis strategy: a random legal log (stamped with seq 1..n unless told not)."""
    steps = draw(st.integers(min_size, max_size))
    log = simulate(lambda options: draw(st.sampled_from(options)), steps, thread_id)
    return stamp(log, thread_id) if stamped else log
