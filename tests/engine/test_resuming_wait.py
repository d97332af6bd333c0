"""A wait that resumes its call (a tool's question to a person, MCP elicitation): the
reducer sends the call back to run with the answer, under any policy; the answer goes
to the next attempt only; the model sees the call's final outcome, never the answer
as its result."""

from __future__ import annotations

import pytest

from engine import events as ev
from engine.context import PROJECTION_VERSION, Projector
from engine.errors import IllegalTransition
from engine.state import apply, next_action, reduce
from tests.support.logs import at, decided, requested, result, started, user

ASKED = {"elicitation": {"kind": "input_required", "request_state": "s1"}}


def asked(call_id: str = "c1", wait_id: str = "thr_test.w1", **kw: object) -> ev.WaitStarted:
    return ev.WaitStarted(
        actor="tool",
        tool_call_id=call_id,
        wait_id=wait_id,
        description="an answer",
        data=ASKED,
        wake_at=at(600),
        timeout_at=at(600),
        resumes=True,
        **kw,  # type: ignore[arg-type]
    )


def run_now_call() -> list[ev.Event]:
    """A run_now call (``lookup``), started: a policy under which no job may be awaited."""
    return [user(), decided("c1", "lookup", q="x"), requested("c1", "lookup", q="x"), started("c1")]


def test_a_question_may_be_asked_under_any_policy_but_a_job_may_not() -> None:
    state = reduce(run_now_call())
    waiting = apply(state, asked())
    assert waiting.status == "awaiting_job" and waiting.wake_at == at(600)
    with pytest.raises(IllegalTransition, match="does not wait"):
        apply(state, asked().model_copy(update={"resumes": False}))


def test_the_answer_sends_the_call_back_to_run_with_it_for_one_attempt() -> None:
    state = reduce([*run_now_call(), asked()])
    answer = {"action": "accept", "content": {"env": "stg"}}
    resumed = apply(
        state,
        ev.WaitFinished(tool_call_id="c1", wait_id="thr_test.w1", result=answer, resumes=True),
    )
    call = resumed.pending
    assert resumed.status == "running" and call is not None
    assert (call.phase, call.wait) == ("ready", None)
    assert call.answer is not None and call.answer.result == answer
    assert call.answer.data == ASKED and not call.answer.timed_out
    assert next_action(resumed, at(1)) == "execute_tool"
    again = apply(resumed, started("c1", 2))
    assert again.pending is not None and again.pending.answer is None  # that attempt had it
    done = apply(again, result("c1", 2))
    assert done.pending is None and done.setback is None


def test_expiry_resumes_the_call_too_as_nobody_answering() -> None:
    state = reduce([*run_now_call(), asked()])
    expired = apply(state, ev.WaitTimedOut(tool_call_id="c1", wait_id="thr_test.w1", resumes=True))
    call = expired.pending
    assert call is not None and call.phase == "ready" and call.answer is not None
    assert (call.answer.result, call.answer.timed_out) == ({}, True)
    assert expired.setback is None


def test_the_end_must_say_resumes_as_its_wait_did() -> None:
    state = reduce([*run_now_call(), asked()])
    with pytest.raises(IllegalTransition, match="resumes must be as the wait started"):
        apply(state, ev.WaitFinished(tool_call_id="c1", wait_id="thr_test.w1"))


def test_the_model_sees_the_call_answered_once_by_its_final_result() -> None:
    log = [
        *run_now_call(),
        asked(),
        ev.WaitFinished(
            tool_call_id="c1", wait_id="thr_test.w1", result={"action": "decline"}, resumes=True
        ),
        started("c1", 2),
        result("c1", 2, output={"text": "declined by the user"}),
    ]
    prompt = Projector([], PROJECTION_VERSION).feed(log).prompt()
    answers = [
        block
        for message in prompt.messages
        if isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]
    assert len(answers) == 1
    assert "declined by the user" in str(answers[0]["content"])
    assert "decline" not in str(prompt.messages[:-1])
