"""Slack's stop button (``stop_requested``), pure: the reducer stops the run at its next
step boundary, a running call ends by its normal path, and the model's next prompt
says who stopped it. The feedback and stream events change nothing that matters."""

from __future__ import annotations

from typing import Any

import pytest

from engine import events as ev
from engine.compaction import Digest
from engine.context import project
from engine.errors import IllegalTransition
from engine.state import ThreadState, apply, next_action, reduce
from tests.support.logs import (
    OTHER,
    REQUESTER,
    REVIEWER,
    approval_pending,
    at,
    decided,
    outcome_unknown,
    reconciled,
    requested,
    result,
    retry,
    stamp,
    started,
    user,
    waiting_on_job,
)

STOPPER = "U0STOPPER"


def stop(who: str = STOPPER) -> ev.StopRequested:
    return ev.StopRequested(actor=who, user=who)


def fold(*events: ev.Event) -> ThreadState:
    return reduce(stamp(list(events)))


def lookup(call_id: str = "c1") -> list[ev.Event]:
    return [decided(call_id, "lookup", q="db"), requested(call_id, "lookup", q="db")]


# --- the reducer ------------------------------------------------------------------------


def test_a_stop_before_the_model_answers_rests_the_thread_at_once() -> None:
    state = apply(fold(user()), stop())
    assert state.status == "idle" and state.stop_by is None
    assert next_action(state, at(1)) == "none"
    # The model's reply that was in flight no longer has a thread to act in.
    with pytest.raises(IllegalTransition, match="not running"):
        apply(state, decided("c1", "lookup", q="db"))


def test_a_stop_drops_a_call_not_started_as_a_cancel_does() -> None:
    # A run_now call whose tool_started never came, and an approved call about to run.
    for log in (
        [user(), *lookup()],
        [user(), *approval_pending(), ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_2")],
    ):
        before = fold(*log)
        assert next_action(before, at(1)) == "execute_tool"
        state = apply(before, stop())
        assert state.status == "idle" and state.pending is None and state.orphan is None
        assert next_action(state, at(1)) == "none"
        with pytest.raises(IllegalTransition):
            apply(state, started(before.pending.tool_call_id))  # type: ignore[union-attr]


def test_a_stop_while_a_call_runs_waits_for_its_result_then_rests() -> None:
    running = fold(user(), *lookup(), started("c1"))
    state = apply(running, stop())
    assert state.status == "running" and state.stop_by == STOPPER
    assert state.pending is not None and state.pending.phase == "started"
    done = apply(state, result("c1"))
    assert done.status == "idle" and done.stop_by is None and done.pending is None
    assert next_action(done, at(1)) == "none"  # the model is not asked again


def test_a_stopped_call_that_fails_transiently_is_not_retried() -> None:
    state = apply(fold(user(), *lookup(), started("c1")), stop())
    with pytest.raises(IllegalTransition, match="stopped the run"):
        apply(state, retry("c1", 1, at(2)))
    assert apply(state, result("c1", ok=False)).status == "idle"


def test_an_interrupted_call_after_a_stop_goes_to_reconcile_then_rests() -> None:
    restart = [
        decided("r1", "restart", service="api"),
        requested("r1", "restart", service="api"),
        ev.ApprovalRequested(tool_call_id="r1", arguments_hash="h", expires_at=at(60)),
        ev.ApprovalGranted(actor=REVIEWER, tool_call_id="r1"),
        ev.ApprovalGranted(actor=OTHER, tool_call_id="r1"),
        started("r1"),
    ]
    state = apply(fold(user(), *restart), stop())
    unknown = apply(state, outcome_unknown("r1"))
    assert unknown.status == "awaiting_reconcile"  # never dropped
    assert unknown.pending is not None and unknown.pending.phase == "unknown"
    assert apply(unknown, reconciled("r1", "happened")).status == "idle"


def test_a_wait_started_by_a_stopped_call_ends_the_run_when_it_finishes() -> None:
    log = waiting_on_job()
    state = apply(fold(user(), *log[:3]), stop())
    waiting = apply(state, log[3])
    assert waiting.status == "awaiting_job"
    finished = apply(waiting, ev.WaitFinished(tool_call_id="toolu_3", wait_id="thr_test.w1"))
    assert finished.status == "idle"


def test_a_new_message_after_a_stop_asks_for_work_again() -> None:
    state = apply(fold(user(), *lookup(), started("c1")), stop())
    state = apply(state, user("actually, carry on"))
    assert state.stop_by is None
    after = apply(state, result("c1"))
    assert after.status == "running" and next_action(after, at(1)) == "ask_model"


def test_a_model_retry_timer_is_stopped_too() -> None:
    sleeping = fold(user(), retry(None, 1, at(5)))
    assert sleeping.status == "sleeping"
    state = apply(sleeping, stop())
    assert state.status == "idle" and state.model_retry_at is None
    assert state.wake_at is None


@pytest.mark.parametrize(
    "log",
    [
        [user(), *approval_pending()],  # a card waits
        [user(), ev.ModelDecision(actor="model", text="hi"), ev.FinalAnswer(text="hi")],
        [user(), *waiting_on_job()],
    ],
    ids=["awaiting_approval", "answered", "awaiting_job"],
)
def test_a_stop_when_the_thread_is_not_working_is_refused(log: list[ev.Event]) -> None:
    with pytest.raises(IllegalTransition, match="not working"):
        apply(fold(*log), stop())


def test_feedback_and_stream_receipts_change_nothing_that_matters() -> None:
    state = fold(user(), ev.ModelDecision(actor="model", text="hi"))
    state = apply(state, ev.FinalAnswer(actor="model", text="hi"))
    receipts = [
        ev.MessagePosted(shows_event_id="evt_x", channel="C1", ts="1.2", kind="stream"),
        ev.StreamStopped(ts="1.2", channel="C1"),
        ev.FeedbackGiven(actor=OTHER, ts="1.2", value="down", user=OTHER),
    ]
    after = reduce(receipts, state)
    assert after.model_dump(exclude={"last_seq"}) == state.model_dump(exclude={"last_seq"})
    with pytest.raises(IllegalTransition, match="starts with a message"):
        apply(ThreadState(), receipts[2])


# --- what the model reads ---------------------------------------------------------------


def messages(*events: ev.Event) -> list[dict[str, Any]]:
    return project(stamp(list(events)), []).messages


def texts(message: dict[str, Any]) -> list[str]:
    return [b.get("text") or b.get("content") for b in message["content"]]


def test_the_model_reads_who_stopped_the_run() -> None:
    last = messages(user(), stop(), user("now check the api"))[-1]
    assert last["role"] == "user"
    assert texts(last)[-2:] == [
        f"[system] <@{STOPPER}> stopped the run.",
        f"[{REQUESTER}] now check the api",
    ]


def test_a_running_call_keeps_its_result_and_the_stop_follows_it() -> None:
    log = [user(), *lookup(), started("c1"), stop(), result("c1", output={"hits": 2})]
    last = messages(*log)[-1]
    head, note = last["content"]
    assert head["type"] == "tool_result" and head["tool_use_id"] == "c1"
    assert head["content"] == '{"hits": 2}' and "is_error" not in head
    assert note == {"type": "text", "text": f"[system] <@{STOPPER}> stopped the run."}


def test_a_call_the_stop_dropped_is_answered_as_not_run() -> None:
    log = [user(), *approval_pending(), ev.ApprovalGranted(actor=REVIEWER, tool_call_id="toolu_2")]
    last = messages(*log, stop(), user("never mind"))[-1]
    head = last["content"][0]
    assert head["type"] == "tool_result" and head["tool_use_id"] == "toolu_2"
    assert head["is_error"] is True
    assert head["content"] == f"Not run: <@{STOPPER}> stopped the run before it started."


def test_a_call_waiting_on_its_retry_timer_is_dropped_and_answered() -> None:
    log = [user(), *lookup(), started("c1"), retry("c1", 1, at(2)), stop()]
    assert fold(*log).status == "idle"
    last = messages(*log)[-1]
    assert last["content"][0]["tool_use_id"] == "c1"
    assert last["content"][0]["is_error"] is True


def test_a_compaction_summary_keeps_who_stopped_the_run() -> None:
    digest = Digest()
    log = stamp([user(), stop(), user("now the db"), *lookup("c2"), started("c2"), result("c2")])
    for e in log:
        digest.add(e)
    assert f"seq 2 {STOPPER} stop_requested: stop pressed by {STOPPER}" in digest.summary(6)
