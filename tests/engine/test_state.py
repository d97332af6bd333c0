"""The reducer: legal logs fold the same way however they are split; illegal events are
refused; each status of DESIGN is reached by the events that should reach it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from engine import events as ev
from engine import frozen
from engine.errors import IllegalTransition
from engine.state import APPLY, ThreadState, apply, evolve, next_action, reduce
from tests.support.logs import (
    OTHER,
    PROPERTY,
    REQUESTER,
    REVIEWER,
    THREAD_ID,
    Simulator,
    answered,
    approval_asked,
    approval_pending,
    at,
    clarification_asked,
    decided,
    edited,
    happy_path,
    is_legal,
    legal_logs,
    outcome_unknown,
    random_log,
    reconciled,
    requested,
    result,
    retry,
    said,
    stamp,
    started,
    user,
    waiting_on_job,
)

TIMED = {"sleeping", "awaiting_approval", "awaiting_job"}

# Events that no state accepts: they name calls, questions and waits that never existed.
BOGUS: list[ev.Event] = [
    ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_bogus"),
    ev.ApprovalRejected(actor=REVIEWER, tool_call_id="toolu_bogus"),
    ev.ApprovalExpired(tool_call_id="toolu_bogus"),
    ev.ToolStarted(tool_call_id="toolu_bogus", attempt=1),
    ev.ToolResult(tool_call_id="toolu_bogus", attempt=1, ok=True),
    ev.WaitFinished(tool_call_id="toolu_bogus", wait_id="w_bogus"),
    ev.WaitTimedOut(tool_call_id="toolu_bogus", wait_id="w_bogus"),
    ev.ClarificationAnswered(tool_call_id="toolu_bogus", text="?"),
    ev.ClarificationRequested(tool_call_id="toolu_bogus", question="?"),
    ev.ToolOutcomeUnknown(tool_call_id="toolu_bogus", attempt=1),
    ev.ReconcileDecided(tool_call_id="toolu_bogus", decision="retry", reviewer=REVIEWER),
]
# Events whose legality depends on the state; probed in every state.
PROBES: list[ev.Event] = [
    said("probe"),
    decided("toolu_probe", "lookup", q="probe"),
    retry(None, 1, at(1)),
    user("probe"),
    ev.FinalAnswer(text="probe"),
    ev.DecisionRejected(reason="probe"),
    ev.ThreadCancelled(actor=REQUESTER),
    ev.ErrorRaised(message="probe"),
]


def fold(*parts: list[ev.Event]) -> ThreadState:
    return reduce([e for part in parts for e in part])


# --- properties -----------------------------------------------------------------------


@PROPERTY
@given(log=legal_logs(max_size=40), data=st.data())
def test_split_fold_equals_fold_at_once(log: list[ev.Event], data: st.DataObject) -> None:
    whole = reduce(log)
    k = data.draw(st.integers(0, len(log)), label="split")
    head = reduce(log[:k])
    assert reduce(log[k:], head) == whole
    snapshot = ThreadState.model_validate_json(head.model_dump_json())
    assert snapshot == head
    assert reduce(log[k:], snapshot) == whole


@PROPERTY
@given(log=legal_logs(max_size=40))
def test_every_reachable_state_is_consistent(log: list[ev.Event]) -> None:
    state = ThreadState()
    for event in log:
        state = apply(state, event)
        assert state.last_seq == event.seq
        assert state.thread_id == event.thread_id
        if isinstance(log[0], ev.UserMessage):
            assert state.requester == log[0].actor
        else:  # an alert's thread: whoever writes in it first
            people = [e.actor for e in log[: state.last_seq] if isinstance(e, ev.UserMessage)]
            assert state.requester == (people[0] if people else None)
        assert state.alert is None or isinstance(log[0], ev.AlertReceived)
        assert (state.wake_at is not None) == (state.status in TIMED), state
        assert (state.status == "awaiting_reply") == (state.question is not None)
        phase = state.pending.phase if state.pending else None
        assert (state.status == "awaiting_approval") == (phase == "awaiting_approval")
        if state.status == "awaiting_job":
            assert phase == "waiting"
        if phase == "retry_wait":
            assert state.status == "sleeping"
        assert (state.status == "awaiting_reconcile") == (phase == "unknown")
        if state.pending is not None:
            assert len(state.pending.votes) <= state.pending.quorum
        assert ThreadState.model_validate_json(state.model_dump_json()) == state
    assert reduce(log) == state


@PROPERTY
@given(log=legal_logs(max_size=40), data=st.data())
def test_illegal_event_is_refused_and_state_is_unchanged(
    log: list[ev.Event], data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(log)), label="prefix")
    sim = Simulator.replay(log[:k])
    state = sim.state
    illegal = [e for e in [*sim.candidates(), *PROBES, *BOGUS] if not is_legal(state, e)]
    assert illegal, "some event is always illegal"
    event = data.draw(st.sampled_from(illegal), label="illegal event")
    before = state.model_dump()
    with pytest.raises(IllegalTransition) as info:
        apply(state, event)
    assert info.value.event_type == event.type
    assert info.value.status == state.status
    assert repr(event.type) in str(info.value) and repr(state.status) in str(info.value)
    assert info.value.why
    assert state.model_dump() == before
    assert reduce(log[k:], state) == reduce(log)  # the legal tail still folds


# --- the envelope ---------------------------------------------------------------------


def test_a_thread_starts_with_a_user_message() -> None:
    with pytest.raises(IllegalTransition, match="starts with a message") as info:
        apply(ThreadState(), ev.FinalAnswer(text="hi"))
    assert info.value.status == "new"
    state = apply(ThreadState(), user(actor="U9"))
    assert (state.status, state.requester, state.last_seq) == ("running", "U9", 1)


def test_seq_must_follow_and_thread_must_match() -> None:
    log = stamp(happy_path())
    state = reduce(log[:3])
    gap = log[4]
    with pytest.raises(IllegalTransition, match="seq 5 does not follow 3"):
        apply(state, gap)
    foreign = log[3].model_copy(update={"thread_id": "thr_other"})
    with pytest.raises(IllegalTransition, match="thr_other"):
        apply(state, foreign)
    assert apply(state, log[3]).last_seq == 4


def test_drafts_get_the_next_seq() -> None:
    state = reduce(happy_path())
    assert state.last_seq == len(happy_path())
    assert state.thread_id == ""


def test_apply_does_not_mutate_its_input() -> None:
    state = reduce([user(), *approval_pending("c1")])
    dumped = state.model_dump()
    after = apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c1"))
    assert state.model_dump() == dumped
    assert after.pending is not None and state.pending is not None
    assert (state.pending.phase, after.pending.phase) == ("awaiting_approval", "ready")


# --- statuses ------------------------------------------------------------------------


def test_running_asks_the_model_until_a_decision_is_open() -> None:
    state = fold([user()])
    assert state.status == "running"
    assert next_action(state, at(0)) == "ask_model"
    state = apply(state, said("hmm"))
    assert state.open_decision == "" and state.decisions_since_input == 1
    assert next_action(state, at(0)) == "none"
    with pytest.raises(IllegalTransition, match="half-written"):
        apply(state, user("more"))


def test_run_now_call_runs_then_asks_again() -> None:
    state = fold([user(), decided("c1", "lookup", q="x"), requested("c1", "lookup", q="x")])
    assert state.pending is not None and state.pending.phase == "ready"
    assert state.pending.idempotency_key == "thr_test:c1"
    assert next_action(state, at(0)) == "execute_tool"
    state = apply(state, started("c1"))
    assert state.pending is not None and state.pending.phase == "started"
    assert next_action(state, at(0)) == "execute_tool"  # a crash mid-call re-runs it
    state = apply(state, result("c1"))
    assert state.pending is None and state.status == "running"
    assert next_action(state, at(0)) == "ask_model"


def test_idle_after_final_answer_and_reopened_by_a_message() -> None:
    state = fold([user(), said(""), ev.DecisionRejected(reason="empty"), *answered()])
    assert state.status == "idle" and state.consecutive_rejections == 0
    assert state.wake_at is None
    assert next_action(state, at(10_000)) == "none"
    state = apply(state, user("another thing", actor="U_SOMEONE"))
    assert state.status == "running"
    assert state.requester == REQUESTER  # the first asker stays the requester
    assert state.decisions_since_input == 0


def test_awaiting_approval_then_granted() -> None:
    state = fold([user(), *approval_pending("c2", expires_at=at(30))])
    assert state.status == "awaiting_approval"
    call = state.pending
    assert call is not None and call.phase == "awaiting_approval"
    assert call.arguments == {"service": "api", "env": "staging"}
    assert len(call.arguments_hash) == 32
    assert state.wake_at == at(30)
    assert next_action(state, at(29)) == "none"
    assert next_action(state, at(30)) == "expire_approval"
    with pytest.raises(IllegalTransition, match="not pending"):
        apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="other"))
    with pytest.raises(IllegalTransition, match="not running"):
        apply(state, started("c2"))
    state = apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"))
    assert state.status == "running" and state.wake_at is None
    assert state.pending is not None and state.pending.phase == "ready"
    assert next_action(state, at(0)) == "execute_tool"
    with pytest.raises(IllegalTransition, match="no approval is awaited"):
        apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"))


def reminded_card(remind: float = 30, expires: float = 120) -> list[ev.Event]:
    """A card whose rule reminds the approvers at ``remind`` and expires at ``expires``."""
    decision, call, _ = approval_pending("c2")
    asked = approval_asked(
        "c2", "deploy", at(expires), remind_at=at(remind), service="api", env="staging"
    )
    return [user(), decision, call, asked]


def test_the_thread_wakes_to_remind_once_then_to_expire() -> None:
    """Issue 17 §3: the reminder is a timer in the state, as the expiry is: the thread
    wakes at it, the reminder is recorded once, and the thread then sleeps to the expiry."""
    state = fold(reminded_card())
    assert state.pending is not None and state.pending.remind_at == at(30)
    assert state.wake_at == at(30)
    assert next_action(state, at(29)) == "none"
    assert next_action(state, at(30)) == "remind_approval"
    state = apply(state, ev.ApprovalReminded(tool_call_id="c2"))
    assert state.status == "awaiting_approval" and state.pending is not None
    assert state.pending.reminded_at is not None
    assert state.wake_at == at(120)
    assert next_action(state, at(60)) == "none"
    assert next_action(state, at(120)) == "expire_approval"
    with pytest.raises(IllegalTransition, match="reminded already"):
        apply(state, ev.ApprovalReminded(tool_call_id="c2"))
    # Reminded or not, the call is approved as any other.
    state = apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"))
    assert state.pending is not None and state.pending.phase == "ready"


def test_a_thread_woken_past_both_times_expires_without_a_reminder() -> None:
    state = fold(reminded_card())
    assert next_action(state, at(120)) == "expire_approval"
    assert next_action(state, at(500)) == "expire_approval"


def test_a_reminder_is_legal_only_for_a_waiting_card_with_one() -> None:
    remind = ev.ApprovalReminded(tool_call_id="c2")
    with pytest.raises(IllegalTransition, match="sets no reminder"):
        apply(fold([user(), *approval_pending("c2")]), remind)
    for after in (
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"),
        ev.ApprovalRejected(actor=REVIEWER, tool_call_id="c2"),
        ev.ApprovalExpired(tool_call_id="c2"),
        ev.ApprovalWithdrawn(actor=REQUESTER, tool_call_id="c2", reason="superseded"),
        ev.ThreadCancelled(actor=REQUESTER),
    ):
        state = fold(reminded_card(), [after])
        assert not is_legal(state, remind), after.type
    with pytest.raises(IllegalTransition, match="not pending"):
        apply(fold(reminded_card()), ev.ApprovalReminded(tool_call_id="other"))


def test_a_reminder_at_or_after_the_expiry_is_not_a_timer() -> None:
    state = fold(reminded_card(remind=120, expires=120))
    assert state.wake_at == at(120)
    assert next_action(state, at(120)) == "expire_approval"


@pytest.mark.parametrize(
    "closing",
    [
        ev.ApprovalRejected(actor=REVIEWER, tool_call_id="c2", reason="no"),
        ev.ApprovalExpired(tool_call_id="c2"),
    ],
)
def test_rejected_or_expired_approval_drops_the_call(closing: ev.Event) -> None:
    state = fold([user(), *approval_pending("c2")], [closing])
    assert (state.status, state.pending) == ("running", None)
    assert next_action(state, at(0)) == "ask_model"


def test_messages_after_the_card_are_noted_on_the_pending_call() -> None:
    """Issue 8 item 7: a reply while a card waits is not lost in a queue: the pending
    call knows who wrote what since its approval was requested (first line, trimmed)."""
    card = approval_pending("c2")
    before = fold([user(), *card])
    assert before.pending is not None and before.pending.said_since == ()
    assert before.pending.requested_at == card[-1].created_at  # for "asked 12 min ago"
    reply = user(
        "  \n actually, deploy version 2.0.0 to production  \nthanks", source={"kind": "slack"}
    )
    state = apply(before, reply)
    assert state.status == "awaiting_approval"
    call = state.pending
    assert call is not None and call.said_since_count == 1
    [note] = call.said_since
    assert (note.event_id, note.actor, note.text, note.source_kind) == (
        reply.event_id,
        REQUESTER,
        "actually, deploy version 2.0.0 to production",
        "slack",
    )
    assert note.created_at == reply.created_at
    for n in range(5):  # the state stays small: the latest few, and the count
        state = apply(state, user(f"more {n}", actor=REVIEWER))
    assert state.pending is not None and state.pending.said_since_count == 6
    assert [m.text for m in state.pending.said_since] == ["more 2", "more 3", "more 4"]
    snapshot = ThreadState.model_validate_json(state.model_dump_json())
    assert snapshot == state


def test_messages_before_the_card_or_without_one_are_not_noted() -> None:
    state = fold([user(), *run_now_call_pending()], [user("and also this")])
    assert state.pending is not None and state.pending.said_since == ()
    granted = fold(
        [user(), *approval_pending("c2")],
        [ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"), user("too late for the card")],
    )
    assert granted.pending is not None and granted.pending.said_since == ()


def run_now_call_pending() -> list[ev.Event]:
    return [decided("c1", "lookup", q="x"), requested("c1", "lookup", q="x")]


@pytest.mark.parametrize(
    ("closing", "kind"),
    [
        ([ev.ApprovalRejected(actor=REVIEWER, tool_call_id="c2", reason="no")], "rejected"),
        ([ev.ApprovalExpired(tool_call_id="c2")], "expired"),
        ([ev.ApprovalWithdrawn(actor=REQUESTER, tool_call_id="c2", reason="x")], "withdrawn"),
        (
            [
                ev.ApprovalGranted(actor=REVIEWER, tool_call_id="c2"),
                started("c2"),
                result("c2", ok=False),
            ],
            "failed",
        ),
    ],
)
def test_a_turn_remembers_how_its_last_call_ended(closing: list[ev.Event], kind: str) -> None:
    """Issue 8 item 8: an answered thread whose call was rejected, expired or failed
    must not look like a success, so the state says how the call ended."""
    state = fold([user(), *approval_pending("c2")], closing, answered("not done"))
    assert state.status == "idle"
    assert state.setback is not None and (state.setback.kind, state.setback.intent) == (
        kind,
        "deploy",
    )
    assert fold([user(), *approval_pending("c2")], closing).setback == state.setback
    reopened = apply(state, user("try again"))
    assert reopened.setback is None  # a new request starts clean


def test_a_call_that_succeeds_clears_the_setback() -> None:
    state = fold(
        [user(), *approval_pending("c2")],
        [ev.ApprovalRejected(actor=REVIEWER, tool_call_id="c2")],
        [decided("c3", "lookup", q="x"), requested("c3", "lookup", q="x"), started("c3")],
        [result("c3")],
        answered(),
    )
    assert state.status == "idle" and state.setback is None
    assert fold([user()], answered()).setback is None


def test_approval_requested_only_for_an_approve_before_run_call() -> None:
    state = fold([user(), decided("c1", "lookup", q="x"), requested("c1", "lookup", q="x")])
    asked = ev.ApprovalRequested(tool_call_id="c1", arguments_hash="h", expires_at=at(1))
    with pytest.raises(IllegalTransition, match="is ready"):
        apply(state, asked)


def test_requested_approval_call_waits_for_its_request() -> None:
    state = fold([user(), *approval_pending("c2")[:2]])
    assert state.status == "running"
    assert state.pending is not None and state.pending.phase == "requested"
    assert next_action(state, at(0)) == "none"


def test_awaiting_reply_until_the_question_is_answered() -> None:
    state = fold([user(), *clarification_asked("c4", "Which env?")])
    assert state.status == "awaiting_reply"
    assert state.question is not None and state.question.question == "Which env?"
    assert state.wake_at is None
    assert next_action(state, at(10_000)) == "none"
    with pytest.raises(IllegalTransition, match="a reply answers the open question"):
        apply(state, user("staging"))
    with pytest.raises(IllegalTransition, match="answers another question"):
        apply(state, ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="c9", text="x"))
    state = apply(state, ev.ClarificationAnswered(actor=REQUESTER, tool_call_id="c4", text="x"))
    assert (state.status, state.question) == ("running", None)
    assert next_action(state, at(0)) == "ask_model"


def test_clarification_must_answer_the_open_decision() -> None:
    state = fold([user(), decided("c4", ev.CLARIFICATION_TOOL, question="?")])
    with pytest.raises(IllegalTransition, match="decision was for call 'c4'"):
        apply(state, ev.ClarificationRequested(tool_call_id="c5", question="?"))


def test_awaiting_job_polls_then_times_out() -> None:
    state = fold([user(), *waiting_on_job("c3", "w1", wake_at=at(5), timeout_at=at(60))])
    assert state.status == "awaiting_job"
    assert state.pending is not None and state.pending.wait is not None
    assert state.pending.wait.wait_id == "w1"
    assert state.wake_at == at(5)
    assert next_action(state, at(4)) == "none"
    assert next_action(state, at(5)) == "check_wait"
    assert next_action(state, at(59)) == "check_wait"
    assert next_action(state, at(60)) == "wait_timeout"
    with pytest.raises(IllegalTransition, match="wait 'w2' is not open"):
        apply(state, ev.WaitFinished(tool_call_id="c3", wait_id="w2"))
    done = apply(state, ev.WaitFinished(tool_call_id="c3", wait_id="w1", result={"ok": 1}))
    assert (done.status, done.pending) == ("running", None)
    timed_out = apply(state, ev.WaitTimedOut(tool_call_id="c3", wait_id="w1"))
    assert (timed_out.status, timed_out.pending) == ("running", None)


def test_awaiting_job_wakes_at_the_earlier_of_poll_and_timeout() -> None:
    state = fold([user(), *waiting_on_job("c3", wake_at=at(90), timeout_at=at(60))])
    assert state.wake_at == at(60)
    assert next_action(state, at(60)) == "wait_timeout"


def test_only_a_waiting_tool_may_start_a_wait() -> None:
    state = fold([user(), *waiting_on_job("c3")[:3]])
    assert apply(state, waiting_on_job("c3")[3]).status == "awaiting_job"
    state = fold([user(), decided("c1", "lookup"), requested("c1", "lookup"), started("c1")])
    with pytest.raises(IllegalTransition, match="does not wait"):
        apply(state, waiting_on_job("c1")[3])


def test_sleeping_on_a_tool_retry_then_next_attempt() -> None:
    state = fold(
        [user(), decided("c1", "lookup"), requested("c1", "lookup"), started("c1", 1)],
        [retry("c1", 1, at(10))],
    )
    assert state.status == "sleeping"
    assert state.pending is not None
    assert (state.pending.phase, state.pending.attempt) == ("retry_wait", 1)
    assert state.wake_at == at(10)
    assert next_action(state, at(9)) == "none"
    assert next_action(state, at(10)) == "execute_tool"
    with pytest.raises(IllegalTransition, match="attempt 2 is next"):
        apply(state, started("c1", 3))
    with pytest.raises(IllegalTransition, match="is retry_wait"):
        apply(state, result("c1", 1))
    state = apply(state, started("c1", 2))
    assert state.status == "running" and state.wake_at is None
    with pytest.raises(IllegalTransition, match="attempt 2 is running"):
        apply(state, result("c1", 1))
    with pytest.raises(IllegalTransition, match="attempt 2 is running"):
        apply(state, retry("c1", 1, at(20)))
    state = apply(state, result("c1", 2, ok=False))
    assert state.pending is None


def test_attempts_are_numbered_from_the_log() -> None:
    base = [user(), decided("c1", "lookup"), requested("c1", "lookup")]
    with pytest.raises(IllegalTransition, match="attempt 1 is next"):
        fold(base, [started("c1", 2)])
    # A process died after tool_started: the next one starts attempt 2, then 3...
    state = fold(base, [started("c1", 1), started("c1", 2), started("c1", 3)])
    assert state.pending is not None and state.pending.attempt == 3
    with pytest.raises(IllegalTransition, match="attempt 3 is running"):
        apply(state, result("c1", 2))
    assert apply(state, result("c1", 3)).pending is None


def test_sleeping_on_a_model_retry_then_asking_again() -> None:
    state = fold([user(), retry(None, 1, at(3))])
    assert (state.status, state.model_attempt, state.wake_at) == ("sleeping", 1, at(3))
    assert next_action(state, at(2)) == "none"
    assert next_action(state, at(3)) == "ask_model"
    with pytest.raises(IllegalTransition, match="not running"):
        apply(state, retry(None, 2, at(7)))  # one retry at a time: it must be asked first
    state = apply(state, said("ok"))
    assert (state.status, state.model_retry_at, state.wake_at) == ("running", None, None)
    with pytest.raises(IllegalTransition, match="a call is pending"):
        fold([user(), *approval_pending("c2")[:2]], [retry(None, 1, at(3))])


def test_a_successful_model_call_resets_the_model_attempt() -> None:
    state = fold([user(), retry(None, 1, at(3)), *run_now_path("c1")])
    assert state.status == "running"
    assert state.model_attempt == 0


def run_now_path(call_id: str) -> list[ev.Event]:
    return [
        decided(call_id, "lookup"),
        requested(call_id, "lookup"),
        started(call_id),
        result(call_id),
    ]


def test_failed_keeps_a_started_call_and_a_message_reopens() -> None:
    base = [user(), decided("c1", "lookup"), requested("c1", "lookup"), started("c1")]
    state = fold(base, [ev.ErrorRaised(message="boom")])
    assert state.status == "failed"
    assert state.pending is None  # never run again…
    assert state.orphan is not None and state.orphan.phase == "started"
    assert next_action(state, at(10_000)) == "none"
    # …but the call that was running may still report its result.
    assert apply(state, result("c1")).orphan is None
    state = apply(state, user("try again"))
    assert (state.status, state.pending) == ("running", None)
    assert next_action(state, at(0)) == "ask_model"


def test_failed_drops_a_call_not_yet_started() -> None:
    state = fold([user(), *approval_pending("c2")], [ev.ErrorRaised(message="x")])
    assert (state.status, state.pending, state.wake_at) == ("failed", None, None)


def test_cancelled_refuses_a_second_cancel_and_reopens_on_a_message() -> None:
    state = fold([user(), *clarification_asked("c4")], [ev.ThreadCancelled(actor=REQUESTER)])
    assert (state.status, state.question, state.pending) == ("cancelled", None, None)
    assert next_action(state, at(10_000)) == "none"
    with pytest.raises(IllegalTransition, match="nothing to cancel"):
        apply(state, ev.ThreadCancelled(actor=REQUESTER))
    with pytest.raises(IllegalTransition, match="not active"):
        apply(state, ev.ErrorRaised(message="late"))
    with pytest.raises(IllegalTransition, match="not running"):
        apply(state, said("late"))
    state = apply(state, user("again"))
    assert state.status == "running"


def test_cancel_mid_decision_closes_it() -> None:
    state = fold([user(), said("x")], [ev.ThreadCancelled(actor=REQUESTER)])
    assert (state.status, state.open_decision) == ("cancelled", None)
    with pytest.raises(IllegalTransition, match="no model decision to follow"):
        apply(state, ev.FinalAnswer(text="x"))


def test_consecutive_rejections_count_and_reset() -> None:
    rejected = [said(""), ev.DecisionRejected(reason="empty")]
    state = fold([user()], rejected, rejected)
    assert (state.consecutive_rejections, state.decisions_since_input) == (2, 2)
    state = apply(apply(state, decided("c1", "lookup")), requested("c1", "lookup"))
    assert state.consecutive_rejections == 0 and state.decisions_since_input == 3


def test_receipts_and_refused_clicks_change_nothing_but_seq() -> None:
    state = fold([user(), *approval_pending("c2")])
    for event in [
        ev.MessagePosted(shows_event_id="evt_x", channel="C", ts="1.0"),
        ev.ApprovalRefused(actor="U_X", tool_call_id="c2", decision="approve", reason="no"),
    ]:
        after = apply(state, event)
        assert after.last_seq == state.last_seq + 1
        assert after.model_copy(update={"last_seq": state.last_seq}) == state


@pytest.mark.parametrize("status_log", ["idle", "failed", "cancelled", "awaiting_reply"])
def test_threads_at_rest_have_nothing_to_do_whenever(status_log: str) -> None:
    tails = {
        "idle": answered(),
        "failed": [ev.ErrorRaised(message="x")],
        "cancelled": [ev.ThreadCancelled(actor=REQUESTER)],
        "awaiting_reply": clarification_asked(),
    }
    state = fold([user()], tails[status_log])
    assert state.status == status_log
    assert state.wake_at is None
    for when in (at(-60), at(0), at(60 * 24 * 365)):
        assert next_action(state, when) == "none"


def test_new_thread_has_nothing_to_do() -> None:
    assert next_action(ThreadState(), at(0) + timedelta(days=1)) == "none"


def test_simulated_logs_reach_every_status_and_event_type() -> None:
    """The generator behind the properties above covers the whole state machine."""
    statuses: set[str] = set()
    types: set[str] = set()
    for seed in range(120):
        state = ThreadState()
        for event in random_log(seed, 40):
            state = apply(state, event)
            statuses.add(state.status)
            types.add(event.type)
    assert statuses == {
        "running",
        "awaiting_approval",
        "awaiting_reply",
        "awaiting_job",
        "awaiting_reconcile",
        "sleeping",
        "idle",
        "failed",
        "cancelled",
    }
    assert types == set(ev.EVENT_TYPES)


@pytest.mark.parametrize(
    "stop", [ev.ThreadCancelled(actor=REQUESTER), ev.ErrorRaised(message="x")], ids=lambda e: e.type
)
def test_result_of_a_started_call_stays_recordable_after_reopening(stop: ev.Event) -> None:
    base = [user(), decided("c1", "lookup"), requested("c1", "lookup"), started("c1")]
    state = fold(base, [stop, user("what happened?")])
    assert state.status == "running"
    # The tool ran: its result is a fact the log (and the model) must be able to hold.
    assert apply(state, result("c1")).last_seq == state.last_seq + 1


# --- quorum, reject, outcome unknown (issue 9) ------------------------------------------


def restart_pending(call_id: str = "r1") -> list[ev.Event]:
    """A non-idempotent call needing two of (REVIEWER, OTHER), up to its card."""
    args = {"service": "api"}
    return [
        decided(call_id, "restart", **args),
        requested(call_id, "restart", **args),
        approval_asked(call_id, "restart", **args),
    ]


def test_a_quorum_of_two_needs_two_distinct_votes() -> None:
    state = fold([user()], restart_pending())
    one = apply(state, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1"))
    assert one.status == "awaiting_approval" and one.pending is not None
    assert one.pending.votes == (REVIEWER,) and one.pending.phase == "awaiting_approval"
    assert next_action(one, at(1)) == "none"
    with pytest.raises(IllegalTransition, match="already approved"):
        apply(one, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1"))
    two = apply(one, ev.ApprovalGranted(actor=OTHER, tool_call_id="r1"))
    assert two.status == "running" and two.pending is not None
    assert two.pending.phase == "ready" and two.pending.votes == (REVIEWER, OTHER)
    assert next_action(two, at(1)) == "execute_tool"


def test_the_requesters_vote_is_refused_without_allow_self() -> None:
    state = fold([user()], restart_pending())
    with pytest.raises(IllegalTransition, match="requester"):
        apply(state, ev.ApprovalGranted(actor=REQUESTER, tool_call_id="r1"))


def test_one_rejection_ends_a_call_with_votes() -> None:
    state = fold(
        [user()], restart_pending(), [ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1")]
    )
    closed = apply(state, ev.ApprovalRejected(actor=OTHER, tool_call_id="r1"))
    assert closed.pending is None and closed.setback is not None
    assert closed.setback.kind == "rejected"


def test_a_rejected_call_closes_at_once() -> None:
    state = fold([user(), decided("p1", "purge", what="all"), requested("p1", "purge", what="all")])
    assert state.pending is None and state.open_decision is None
    assert state.status == "running" and state.setback is not None
    assert state.setback.kind == "rejected"
    assert next_action(state, at(0)) == "ask_model"
    with pytest.raises(IllegalTransition):
        apply(state, started("p1"))


def started_restart() -> list[ev.Event]:
    return [
        user(),
        *restart_pending(),
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1"),
        ev.ApprovalGranted(actor=OTHER, tool_call_id="r1"),
        started("r1"),
    ]


def test_an_interrupted_non_idempotent_call_awaits_a_person() -> None:
    state = fold(started_restart())
    with pytest.raises(IllegalTransition, match="only when a person says so"):
        apply(state, started("r1", 2))
    unknown = apply(state, outcome_unknown("r1"))
    assert unknown.status == "awaiting_reconcile" and unknown.pending is not None
    assert unknown.pending.phase == "unknown"
    assert unknown.pending.unknown_error == "connection lost"
    assert unknown.wake_at is None and next_action(unknown, at(10_000)) == "none"
    for refused in (started("r1", 2), result("r1"), outcome_unknown("r1")):
        with pytest.raises(IllegalTransition):
            apply(unknown, refused)


def test_an_idempotent_call_never_has_an_unknown_outcome() -> None:
    state = fold([user(), decided("c1", "lookup"), requested("c1", "lookup"), started("c1")])
    with pytest.raises(IllegalTransition, match="idempotent"):
        apply(state, outcome_unknown("c1"))
    assert apply(state, started("c1", 2)).pending is not None  # it simply runs again


@pytest.mark.parametrize(
    ("decision", "pending", "setback"),
    [("happened", False, None), ("abandon", False, "failed"), ("retry", True, None)],
)
def test_reconcile_decides_what_follows(
    decision: ev.ReconcileDecision, pending: bool, setback: str | None
) -> None:
    state = fold(started_restart(), [outcome_unknown("r1")])
    after = apply(state, reconciled("r1", decision, note="restarted by hand"))
    assert after.status == "running"
    assert (after.pending is not None) == pending
    assert (after.setback.kind if after.setback else None) == setback
    if pending:
        assert after.pending is not None and after.pending.phase == "ready"
        assert next_action(after, at(1)) == "execute_tool"
        again = apply(after, started("r1", 2))
        assert again.pending is not None and again.pending.attempt == 2
        assert again.pending.idempotency_key == f"{THREAD_ID}:r1"  # the same key
    else:
        assert next_action(after, at(1)) == "ask_model"


def test_a_reconcile_needs_an_unknown_outcome() -> None:
    with pytest.raises(IllegalTransition, match="no outcome is unknown"):
        apply(fold(started_restart()), reconciled("r1", "happened"))
    state = fold(started_restart(), [outcome_unknown("r1")])
    with pytest.raises(IllegalTransition, match="not pending"):
        apply(state, reconciled("other", "happened"))


def test_a_cancel_drops_a_call_in_question() -> None:
    state = fold(started_restart(), [outcome_unknown("r1")])
    cancelled = apply(state, ev.ThreadCancelled(actor=REQUESTER))
    assert cancelled.pending is None and cancelled.orphan is None
    with pytest.raises(IllegalTransition):
        apply(cancelled, reconciled("r1", "retry"))


def test_a_waiting_tool_may_sit_behind_an_approval() -> None:
    log = [
        user(),
        decided("b1", "build", ref="main"),
        requested("b1", "build", policy="approve_before_run", ref="main"),
        approval_asked("b1", "build", ref="main"),
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="b1"),
        started("b1"),
        waiting_on_job("b1")[3],
    ]
    assert fold(log).status == "awaiting_job"


# --- one branch per event type, next states validated (issue 11, section 5) -------------


def test_every_event_type_has_a_reducer_branch() -> None:
    assert ev.missing_from(APPLY) == []


@pytest.mark.parametrize("strict", [True, False])
def test_a_next_state_with_a_misspelt_field_is_refused(
    strict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frozen, "STRICT", strict)
    state = ThreadState(thread_id="thr_1")
    with pytest.raises(ValueError, match="stauts"):
        evolve(state, {"stauts": "idle"})
    idle = evolve(state, {"status": "idle"})
    assert idle == ThreadState(thread_id="thr_1", status="idle")
    assert state.status == "new"  # the original is untouched


def test_under_the_tests_strict_copies_a_wrong_value_is_refused() -> None:
    """The test suite validates every copy (engine.frozen): a branch returning a value
    of the wrong type fails in the tests, though production does not check it again."""
    assert frozen.STRICT
    with pytest.raises(ValidationError, match="status"):
        evolve(ThreadState(thread_id="thr_1"), {"status": "idel"})
    # One that validation would only convert (a list for a tuple) is refused as well:
    # production would carry the list.
    state = fold([user(), decided("c1", "lookup"), requested("c1", "lookup")])
    assert state.pending is not None
    with pytest.raises(ValueError, match="votes"):
        evolve(state.pending, {"votes": ["U1"]})


def test_a_reducer_branch_returning_a_misspelt_field_raises_instead_of_dropping_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``model_copy(update=...)`` kept the misspelt key as an attribute and went on."""
    monkeypatch.setattr(frozen, "STRICT", False)
    state = apply(ThreadState(), user())
    monkeypatch.setitem(APPLY, ev.MessagePosted, lambda s, e: {"stauts": "idle"})
    with pytest.raises(ValueError, match="stauts"):
        apply(state, ev.MessagePosted(shows_event_id="evt_1"))


def test_evolve_keeps_nested_models_by_identity() -> None:
    state = fold([user(), decided("c1", "lookup"), requested("c1", "lookup")])
    assert state.pending is not None
    after = evolve(state, {"decisions": 5})
    assert after.pending is state.pending and after.decisions == 5


# --- an edit before approval (issue 17 §2) ------------------------------------------------


def test_an_edit_gives_the_call_new_arguments_and_clears_the_votes() -> None:
    state = fold(
        [user()], restart_pending(), [ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1")]
    )
    assert state.pending is not None
    before, key = state.pending.arguments_hash, state.pending.idempotency_key
    edit = edited("restart", "r1", before, service="web")
    after = apply(state, edit)
    call = after.pending
    assert after.status == "awaiting_approval" and call is not None
    assert call.arguments == {"service": "web"}
    assert call.arguments_hash == edit.arguments_hash != before
    assert call.votes == ()  # the vote was for other arguments
    assert call.quorum == 2 and call.reviewers == edit.reviewers  # the rule recorded with it
    assert call.idempotency_key == key  # still the same call
    # REVIEWER votes again (their vote was cleared), one of the two still needed.
    voted = apply(after, ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1"))
    assert voted.status == "awaiting_approval"
    with pytest.raises(IllegalTransition, match="no longer has"):
        apply(after, edited("restart", "r1", before, service="db"))


def test_an_edit_without_a_rule_keeps_the_calls() -> None:
    state = fold([user()], approval_pending("d1"))
    assert state.pending is not None
    edit = edited("deploy", "d1", state.pending.arguments_hash, service="api", env="production")
    assert edit.reviewers is None
    after = apply(state, edit)
    assert after.pending is not None and after.pending.reviewers == state.pending.reviewers
    assert after.pending.arguments == {"service": "api", "env": "production"}


def test_an_edit_the_policy_refuses_closes_the_call() -> None:
    state = fold([user()], restart_pending())
    assert state.pending is not None
    refused = apply(state, edited("restart", "r1", state.pending.arguments_hash, "reject", x=1))
    assert refused.pending is None and refused.status == "running"
    assert refused.setback is not None and refused.setback.kind == "rejected"
    assert next_action(refused, at(1)) == "ask_model"


def test_an_edit_needs_a_call_awaiting_approval() -> None:
    state = fold(started_restart())
    assert state.pending is not None
    with pytest.raises(IllegalTransition):
        apply(state, edited("restart", "r1", state.pending.arguments_hash, service="web"))


# --- standing grants (issue 17 §4) --------------------------------------------------------


def _grant(grant_id: str = "g1", tool: str = "deploy", until: float = 60) -> ev.GrantCreated:
    return ev.GrantCreated(
        actor=REVIEWER,
        grant_id=grant_id,
        tool=tool,
        arguments_schema={"type": "object"},
        until=at(until),
        reviewer=REVIEWER,
    )


def _deploy_requested(call_id: str = "toolu_g") -> list[ev.Event]:
    """A deploy (its rule allows grants, see tests.support.logs.RULED) not yet carded."""
    return approval_pending(call_id)[:2]


def test_the_thread_keeps_its_grants_until_revoked() -> None:
    state = reduce(stamp([user(), _grant("g1"), _grant("g2", "restart")]))
    assert set(state.grants) == {"g1", "g2"} and state.grants["g2"].tool == "restart"
    state = apply(state, ev.GrantRevoked(actor=REVIEWER, grant_id="g1"))
    assert set(state.grants) == {"g2"}
    with pytest.raises(IllegalTransition, match="is not live"):
        apply(state, ev.GrantRevoked(actor=REVIEWER, grant_id="g1"))
    with pytest.raises(IllegalTransition, match="exists"):
        apply(state, _grant("g2"))


def test_a_grant_approves_a_call_of_its_tool_at_once_in_place_of_a_card() -> None:
    state = reduce(stamp([user(), _grant("g1"), *_deploy_requested()]))
    after = apply(state, ev.ApprovalGranted(actor="grant:g1", tool_call_id="toolu_g"))
    assert after.status == "running" and after.pending is not None
    assert (after.pending.phase, after.pending.votes) == ("ready", ("grant:g1",))


@pytest.mark.parametrize(
    ("events", "why"),
    [
        ([_grant("g1", "restart")], "is for restart"),
        ([_grant("g1"), ev.GrantRevoked(actor=REVIEWER, grant_id="g1")], "not a grant"),
        ([], "not a grant"),
    ],
)
def test_a_grant_of_another_tool_or_revoked_approves_nothing(events, why) -> None:
    state = reduce(stamp([user(), *events, *_deploy_requested()]))
    with pytest.raises(IllegalTransition, match=why):
        apply(state, ev.ApprovalGranted(actor="grant:g1", tool_call_id="toolu_g"))


def test_a_grant_never_approves_a_call_whose_rule_allows_none() -> None:
    # restart: a quorum of two; lookup-like calls without max_grant: no grants either.
    asked = [
        decided("toolu_r", "restart", name="api"),
        requested("toolu_r", "restart", name="api"),
    ]
    state = reduce(stamp([user(), _grant("g1", "restart"), *asked]))
    with pytest.raises(IllegalTransition, match="allows no grants"):
        apply(state, ev.ApprovalGranted(actor="grant:g1", tool_call_id="toolu_r"))


def test_long_expired_grants_are_dropped_as_new_ones_come() -> None:
    old = _grant("old", until=1).model_copy(update={"created_at": at(0)})
    new = _grant("new", until=3000).model_copy(update={"created_at": at(2 * 24 * 60)})
    state = reduce(stamp([user(), old]))
    assert set(apply(state, new).grants) == {"new"}
