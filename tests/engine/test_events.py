"""The event schema: one frozen model per type, parsed back from JSON by its ``type``."""

from __future__ import annotations

import gc
import re
import typing

import pytest
from pydantic import ValidationError

from engine import events as ev
from engine.errors import InvalidEvent
from tests.support.logs import T0, at, stamp

SAMPLES: dict[str, ev.Event] = {
    e.type: e
    for e in [
        ev.UserMessage(actor="U1", text="deploy api", source={"channel": "C1", "ts": "1.0"}),
        ev.ClarificationAnswered(actor="U1", tool_call_id="toolu_1", text="staging"),
        ev.AlertReceived(
            actor="alert:alertmanager",
            source="alertmanager",
            fingerprint="5b9b5a2e3c1f0a7d",
            status="firing",
            summary="p99 latency above 2s",
            labels={"alertname": "HighLatency", "service": "api"},
            annotations={"runbook_url": "https://runbooks.example/latency"},
            url="https://prometheus.example/graph?g0.expr=x",
            instruction="Investigate with read-only tools and summarise. Do not act.",
            channel="C0ALERTS",
            dedupe_key="alert:alertmanager:abc",
        ),
        ev.ThreadCancelled(actor="U1", reason="never mind"),
        ev.ModelDecision(
            actor="model",
            text="Deploying.",
            tool_name="deploy",
            tool_call_id="toolu_2",
            arguments={"service": "api", "replicas": 3, "tags": ["a", "b"]},
            stop_reason="tool_use",
            model="claude",
            usage=ev.Usage(input_tokens=10, output_tokens=5, cache_read_input_tokens=2),
            prompt_hash="ab" * 32,
            projection_version="v1",
        ),
        ev.DecisionRejected(tool_call_id="toolu_3", reason="unknown tool 'x'"),
        ev.FinalAnswer(actor="model", text="Done."),
        ev.ClarificationRequested(tool_call_id="toolu_4", question="Which env?"),
        ev.ToolCallRequested(
            tool_call_id="toolu_5",
            intent="deploy",
            arguments={"service": "api", "nested": {"x": [1, 2.5, None, True]}},
            policy="approve_before_run",
            idempotency_key="thr_1:toolu_5",
        ),
        ev.ApprovalRequested(
            tool_call_id="toolu_5", arguments_hash="0" * 32, expires_at=at(60), reason="why"
        ),
        ev.ApprovalGranted(actor="U2", tool_call_id="toolu_5", dedupe_key="1700000000.123"),
        ev.ApprovalRejected(actor="U2", tool_call_id="toolu_5", reason="not on a Friday"),
        ev.ApprovalRefused(
            actor="U3", tool_call_id="toolu_5", decision="approve", reason="not an approver"
        ),
        ev.ApprovalExpired(tool_call_id="toolu_5"),
        ev.ApprovalWithdrawn(actor="U1", tool_call_id="toolu_5", reason="superseded"),
        ev.ApprovalEdited(
            actor="U2",
            tool_call_id="toolu_5",
            reviewer="U2",
            arguments={"service": "api", "env": "production"},
            arguments_hash="1" * 32,
            previous_hash="0" * 32,
            rule=2,
            approvers=("S0SRE",),
            quorum=2,
            allow_self=False,
        ),
        ev.ApprovalReminded(tool_call_id="toolu_5"),
        ev.GrantCreated(
            actor="U2",
            grant_id="grant_1",
            tool="deploy",
            arguments_schema={"type": "object", "properties": {"service": {"const": "api"}}},
            until=at(3600),
            reviewer="U2",
            tool_call_id="toolu_5",
        ),
        ev.GrantRevoked(actor="U2", grant_id="grant_1"),
        ev.ToolStarted(tool_call_id="toolu_5", attempt=2),
        ev.ToolResult(
            actor="tool", tool_call_id="toolu_5", attempt=2, ok=True, output={"v": [1, "x"]}
        ),
        ev.ToolOutcomeUnknown(
            tool_call_id="toolu_5", attempt=1, started_at=at(1), error="connection lost"
        ),
        ev.ReconcileDecided(
            actor="U2", tool_call_id="toolu_5", decision="happened", reviewer="U2", note="ok"
        ),
        ev.RetryScheduled(tool_call_id="toolu_5", attempt=1, wake_at=at(2), error="503"),
        ev.WaitStarted(
            actor="tool",
            tool_call_id="toolu_6",
            wait_id="thr_1.abc",
            description="build",
            data={"id": 7},
            wake_at=at(5),
            timeout_at=at(60),
            poll_every_s=30.0,
        ),
        ev.WaitFinished(tool_call_id="toolu_6", wait_id="thr_1.abc", result={"ok": True}),
        ev.WaitTimedOut(tool_call_id="toolu_6", wait_id="thr_1.abc"),
        ev.ErrorRaised(message="3 invalid decisions", kind="rejections"),
        ev.MessagePosted(shows_event_id="evt_1", channel="C1", ts="1700000000.000100"),
        ev.StreamStopped(ts="1700000000.000200", channel="C1"),
        ev.FeedbackGiven(actor="U2", ts="1700000000.000200", value="down", user="U2"),
        ev.StopRequested(actor="U1", user="U1", dedupe_key="Ev0STOP"),
        ev.ContextCompacted(upto_seq=12, summary="Task: deploy api. Steps: …"),
    ]
}


def union_members() -> set[type]:
    union = typing.get_args(ev.AnyEvent)[0]
    return set(typing.get_args(union))


def test_samples_cover_every_event_type() -> None:
    assert set(SAMPLES) == set(ev.EVENT_TYPES)
    assert len(ev.EVENT_TYPES) == len(set(ev.EVENT_TYPES))


def test_event_types_match_the_discriminated_union() -> None:
    members = {cls.model_fields["type"].default for cls in union_members()}
    assert members == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_draft_round_trips_through_json(type_: str) -> None:
    event = SAMPLES[type_]
    back = ev.parse_event(event.model_dump(mode="json"))
    assert type(back) is type(event)
    assert back == event


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_stamped_round_trips_through_json_text(type_: str) -> None:
    (event,) = stamp([SAMPLES[type_]], "thr_rt", start=7)
    back = ev.parse_event(ev.EVENT_ADAPTER.validate_json(event.model_dump_json()).model_dump())
    assert back == event
    assert (back.thread_id, back.seq, back.created_at) == ("thr_rt", 7, T0.replace(second=7))


def test_a_draft_has_seq_zero_and_a_fresh_event_id() -> None:
    a, b = ev.FinalAnswer(text="x"), ev.FinalAnswer(text="x")
    assert a.seq == 0 and a.thread_id == ""
    assert a.event_id.startswith("evt_") and a.event_id != b.event_id
    assert a.created_at.tzinfo is not None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "user_message"}, "text"),
        ({"type": "tool_started", "tool_call_id": "c", "attempt": 0}, "attempt"),
        ({"type": "tool_result", "tool_call_id": "c", "attempt": 1}, "ok"),
        ({"type": "user_message", "text": "x", "bogus": 1}, "bogus"),
        (
            {
                "type": "approval_requested",
                "tool_call_id": "c",
                "arguments_hash": "h",
                "expires_at": "2025-01-01T00:00:00",  # naive: refused
            },
            "expires_at",
        ),
        (
            {
                "type": "tool_call_requested",
                "tool_call_id": "c",
                "intent": "deploy",
                "arguments": {},
                "policy": "whenever",
                "idempotency_key": "k",
            },
            "policy",
        ),
        (
            {"type": "approval_refused", "tool_call_id": "c", "decision": "maybe", "reason": ""},
            "decision",
        ),
        ({"type": "final_answer", "text": "x", "seq": -1}, "seq"),
        ({"type": "model_decision", "usage": {"input_tokens": "many"}}, "input_tokens"),
    ],
)
def test_invalid_payload_is_refused_naming_the_field(data: dict, field: str) -> None:
    with pytest.raises(InvalidEvent) as info:
        ev.parse_event(data)
    assert re.search(rf"\b{field}\b", str(info.value)), str(info.value)
    assert data["type"] in str(info.value)


@pytest.mark.parametrize("data", [{"type": "deploy_happened", "text": "x"}, {"text": "no type"}])
def test_unknown_or_missing_type_is_refused(data: dict) -> None:
    with pytest.raises(InvalidEvent) as info:
        ev.parse_event(data)
    assert "type" in str(info.value)
    if "type" in data:
        assert data["type"] in str(info.value)


@pytest.mark.parametrize("type_", sorted(SAMPLES))
def test_events_are_frozen(type_: str) -> None:
    event = SAMPLES[type_]
    with pytest.raises(ValidationError):
        event.seq = 5  # type: ignore[misc]
    with pytest.raises(ValidationError):
        event.actor = "someone else"  # type: ignore[misc]
    assert event.seq == 0


def test_model_copy_stamps_without_touching_the_draft() -> None:
    draft = SAMPLES["final_answer"]
    stamped = draft.model_copy(update={"seq": 3, "thread_id": "thr_x"})
    assert (draft.seq, draft.thread_id) == (0, "")
    assert (stamped.seq, stamped.thread_id, stamped.text) == (3, "thr_x", draft.text)


def test_input_types_are_event_types() -> None:
    assert ev.INPUT_TYPES <= set(ev.EVENT_TYPES)
    assert "user_message" in ev.INPUT_TYPES and "tool_result" not in ev.INPUT_TYPES


# --- the facts each type declares (issue 11, section 5) ----------------------------------


def test_every_event_class_is_in_the_union_and_declares_its_facts_itself() -> None:
    assert set(ev.EVENT_CLASSES) == union_members()
    assert all(isinstance(cls.__dict__.get("facts"), ev.Facts) for cls in ev.EVENT_CLASSES)


def test_an_event_class_without_facts_is_refused_when_it_is_defined() -> None:
    with pytest.raises(TypeError, match="event class Forgotten must declare facts"):

        class Forgotten(ev.Event):
            type: typing.Literal["forgotten"] = "forgotten"

    assert "forgotten" not in ev.EVENT_TYPES
    gc.collect()  # the half-made class must not linger among Event's subclasses
    assert "Forgotten" not in {cls.__name__ for cls in ev.Event.__subclasses__()}


def test_facts_reproduce_the_tables_they_replaced() -> None:
    assert ev.INPUT_TYPES == {
        "user_message",
        "clarification_answered",
        "alert_received",
        "thread_cancelled",
        "approval_granted",
        "approval_rejected",
        "approval_refused",
        "approval_withdrawn",
        "approval_edited",
        "grant_created",
        "grant_revoked",
        "reconcile_decided",
        "wait_finished",
        "stop_requested",
    }
    summary = {ev.type_name(c): c.facts.summary for c in ev.EVENT_CLASSES}
    kept = {t for t, role in summary.items() if role == "kept"}
    steps = {t for t, role in summary.items() if role == "step"}
    assert kept == {
        "user_message",
        "clarification_answered",
        "alert_received",  # the team's instruction must outlive a compaction
        "approval_rejected",
        "thread_cancelled",
        "reconcile_decided",  # was omitted: a compaction lost a person's word
        "stop_requested",  # a person's word too: the next run must know they stopped it
    }
    assert steps == {
        "clarification_requested",
        "tool_call_requested",
        "tool_result",
        "approval_granted",
        "approval_expired",
        "approval_withdrawn",
        "approval_edited",
        "wait_finished",
        "wait_timed_out",
        "decision_rejected",
        "error",
        "final_answer",
    }


def test_missing_from_names_the_types_a_table_forgot() -> None:
    table = {cls: None for cls in ev.EVENT_CLASSES if cls is not ev.ToolStarted}
    assert ev.missing_from(table) == ["tool_started"]
    assert ev.missing_from(table, [ev.UserMessage]) == []


def test_logs_from_before_tool_fingerprints_and_answer_sources_still_load() -> None:
    old_decision = {
        "type": "model_decision",
        "thread_id": "thr_1",
        "seq": 2,
        "event_id": "evt_2",
        "created_at": T0.isoformat(),
        "actor": "model",
        "text": "hi",
        "prompt_hash": "ab" * 32,
        "projection_version": "v1",
    }
    decision = ev.parse_event(old_decision)
    assert isinstance(decision, ev.ModelDecision)
    assert (decision.tool_names, decision.tools_hash) == ((), "")
    answer = ev.parse_event(
        {"type": "clarification_answered", "actor": "U1", "tool_call_id": "t", "text": "eu"}
    )
    assert isinstance(answer, ev.ClarificationAnswered) and answer.source == {}


def test_a_decision_keeps_what_its_prompt_was_built_from() -> None:
    decision = ev.ModelDecision(tool_names=("deploy", "lookup"), tools_hash="cd" * 32)
    back = ev.parse_event(decision.model_dump(mode="json"))
    assert isinstance(back, ev.ModelDecision)
    assert back.tool_names == ("deploy", "lookup") and back.tools_hash == "cd" * 32


def test_a_ruled_call_and_its_new_fields_round_trip() -> None:
    ruled = ev.ToolCallRequested(
        tool_call_id="toolu_7",
        intent="mcp__svc__restart",
        arguments={"name": "api"},
        policy="reject",
        idempotency_key="thr:toolu_7",
        reason="never in production",
        rule=2,
        policy_hash="a" * 64,
        definition_hash="d" * 64,
        idempotent=False,
        approvers=("U1", "S1"),
        quorum=2,
        allow_self=False,
    )
    back = ev.parse_event(ruled.model_dump(mode="json"))
    assert back == ruled and back.approvers == ("U1", "S1")  # type: ignore[union-attr]
    with pytest.raises(InvalidEvent, match="quorum"):
        ev.parse_event({**ruled.model_dump(mode="json"), "quorum": 0})
    with pytest.raises(InvalidEvent, match="decision"):
        ev.parse_event(
            {"type": "reconcile_decided", "tool_call_id": "t", "decision": "maybe", "reviewer": "U"}
        )
    cancel = ev.parse_event({"type": "approval_refused", "decision": "cancel", "reason": "no"})
    assert cancel.tool_call_id is None  # type: ignore[union-attr]
