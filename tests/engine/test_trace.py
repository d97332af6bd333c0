"""engine.trace: one summary, line and record per event type, built by hand (no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from engine import events as ev
from engine.trace import (
    SUMMARIES,
    format_usage,
    one_line,
    summarize,
    trace_line,
    trace_record,
    usage_totals,
)

T0 = datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
CALL = "toolu_01"


def _env(seq: int, actor: str = "system", **extra: object) -> dict[str, object]:
    return {"thread_id": "thr_1", "seq": seq, "created_at": T0, "actor": actor, **extra}


# One hand-built event per type, with the summary it must give.
SAMPLES: dict[str, tuple[ev.Event, str]] = {
    "user_message": (
        ev.UserMessage(**_env(1, "U1", dedupe_key="Ev1"), text="deploy\n  the api please"),
        "deploy the api please",
    ),
    "clarification_answered": (
        ev.ClarificationAnswered(**_env(2, "U1"), tool_call_id=CALL, text="staging"),
        f"answer to {CALL}: staging",
    ),
    "alert_received": (
        ev.AlertReceived(
            **_env(1, "alert:alertmanager"),
            source="alertmanager",
            fingerprint="5b9b5a2e",
            status="firing",
            summary="p99 latency\n above 2s",
        ),
        "firing 5b9b5a2e: p99 latency above 2s",
    ),
    "thread_cancelled": (
        ev.ThreadCancelled(**_env(3, "U1"), reason="not needed"),
        "cancelled: not needed",
    ),
    "model_decision": (
        ev.ModelDecision(
            **_env(4, "model"),
            tool_name="lookup",
            tool_call_id=CALL,
            arguments={"q": "x"},
            stop_reason="tool_use",
        ),
        'tool lookup {"q":"x"}',
    ),
    "decision_rejected": (
        ev.DecisionRejected(**_env(5), tool_call_id=CALL, reason="unknown tool 'nope'"),
        f"rejected {CALL}: unknown tool 'nope'",
    ),
    "final_answer": (ev.FinalAnswer(**_env(6, "model"), text="All done."), "All done."),
    "clarification_requested": (
        ev.ClarificationRequested(**_env(7), tool_call_id=CALL, question="Which env?"),
        "asks: Which env?",
    ),
    "tool_call_requested": (
        ev.ToolCallRequested(
            **_env(8),
            tool_call_id=CALL,
            intent="create_ticket",
            arguments={"title": "Disk full"},
            policy="approve_before_run",
            idempotency_key="thr_1:toolu_01",
        ),
        'create_ticket({"title":"Disk full"}) policy=approve_before_run',
    ),
    "approval_requested": (
        ev.ApprovalRequested(
            **_env(9),
            tool_call_id=CALL,
            arguments_hash="abc",
            expires_at=T0 + timedelta(hours=2),
        ),
        f"approval of {CALL} until 14:00:00",
    ),
    "approval_granted": (
        ev.ApprovalGranted(**_env(10, "U2"), tool_call_id=CALL),
        f"approved {CALL}",
    ),
    "approval_rejected": (
        ev.ApprovalRejected(**_env(11, "U2"), tool_call_id=CALL, reason="too risky"),
        f"rejected {CALL}: too risky",
    ),
    "approval_refused": (
        ev.ApprovalRefused(
            **_env(12, "U1"),
            tool_call_id=CALL,
            decision="approve",
            reason="the requester cannot approve",
        ),
        f"refused to approve {CALL}: the requester cannot approve",
    ),
    "approval_expired": (
        ev.ApprovalExpired(**_env(13), tool_call_id=CALL),
        f"approval of {CALL} expired",
    ),
    "approval_withdrawn": (
        ev.ApprovalWithdrawn(**_env(13), tool_call_id=CALL, reason="superseded by a newer message"),
        f"withdrew {CALL}: superseded by a newer message",
    ),
    "approval_edited": (
        ev.ApprovalEdited(
            **_env(13, "U2"),
            tool_call_id=CALL,
            reviewer="U2",
            arguments={"env": "production"},
            arguments_hash="1" * 32,
            previous_hash="0" * 32,
            rule=2,
            approvers=("S0SRE",),
            quorum=2,
        ),
        f'edited {CALL}: {{"env":"production"}} rule 3 quorum 2',  # policy[2]: counted from 1
    ),
    "approval_reminded": (
        ev.ApprovalReminded(**_env(13), tool_call_id=CALL),
        f"reminded the approvers of {CALL}",
    ),
    "grant_created": (
        ev.GrantCreated(
            **_env(13, "U2"),
            grant_id="grant_1",
            tool="restart",
            arguments_schema={"type": "object", "properties": {"service": {"const": "api"}}},
            until=T0 + timedelta(hours=1),
            reviewer="U2",
            tool_call_id=CALL,
        ),
        'grant grant_1: restart({"type":"object","properties":{"service":{"const":"api"}}})'
        f" in the thread until 13:00:00 on {CALL}",
    ),
    "grant_revoked": (
        ev.GrantRevoked(**_env(13, "U2"), grant_id="grant_1"),
        "revoked grant grant_1",
    ),
    "tool_started": (
        ev.ToolStarted(**_env(14), tool_call_id=CALL, attempt=2),
        f"{CALL} attempt 2",
    ),
    "tool_result": (
        ev.ToolResult(**_env(15, "tool"), tool_call_id=CALL, attempt=1, ok=True, output={"n": 1}),
        'ok: {"n":1}',
    ),
    "retry_scheduled": (
        ev.RetryScheduled(
            **_env(16),
            tool_call_id=CALL,
            attempt=3,
            wake_at=T0 + timedelta(seconds=8),
            error="503 from upstream",
        ),
        f"attempt 3 failed: 503 from upstream; retry at 12:00:08 ({CALL})",
    ),
    "wait_started": (
        ev.WaitStarted(
            **_env(17),
            tool_call_id=CALL,
            wait_id="thr_1.w1",
            description="deploy job 42",
            wake_at=T0 + timedelta(seconds=30),
            timeout_at=T0 + timedelta(minutes=30),
        ),
        "wait thr_1.w1: deploy job 42; timeout 12:30:00",
    ),
    "wait_finished": (
        ev.WaitFinished(
            **_env(18), tool_call_id=CALL, wait_id="thr_1.w1", result={"state": "done"}
        ),
        'wait thr_1.w1 finished: {"state":"done"}',
    ),
    "wait_timed_out": (
        ev.WaitTimedOut(**_env(19), tool_call_id=CALL, wait_id="thr_1.w1"),
        "wait thr_1.w1 timed out",
    ),
    "error": (
        ev.ErrorRaised(**_env(20), message="too many rejected decisions", kind="rejections"),
        "rejections: too many rejected decisions",
    ),
    "message_posted": (
        ev.MessagePosted(**_env(21), shows_event_id="evt_9", channel="C1", ts="1700.1"),
        "posted evt_9 at C1/1700.1",
    ),
    "stream_stopped": (
        ev.StreamStopped(**_env(21), ts="1700.2", channel="C1"),
        "stopped the stream at C1/1700.2",
    ),
    "feedback_given": (
        ev.FeedbackGiven(**_env(21, "U2"), ts="1700.2", value="up", user="U2"),
        "👍 (up) by U2 on 1700.2",
    ),
    "stop_requested": (
        ev.StopRequested(**_env(21, "U1", dedupe_key="Ev9"), user="U1"),
        "stop pressed by U1",
    ),
    "context_compacted": (
        ev.ContextCompacted(**_env(22), upto_seq=12, summary="x" * 40),
        "prompt compacted: seq 1–12 summarised (40 chars, deterministic)",
    ),
    "tool_outcome_unknown": (
        ev.ToolOutcomeUnknown(
            **_env(23), tool_call_id=CALL, attempt=1, started_at=T0, error="connection lost"
        ),
        f"outcome of {CALL} attempt 1 unknown (started 12:00:00): connection lost",
    ),
    "reconcile_decided": (
        ev.ReconcileDecided(
            **_env(24, "U2"), tool_call_id=CALL, decision="happened", reviewer="U2", note="done"
        ),
        f"{CALL}: it happened (by U2): done",
    ),
}


def test_a_ruled_call_shows_its_rule_and_policy_hash() -> None:
    ruled = ev.ToolCallRequested(
        **_env(8),
        tool_call_id=CALL,
        intent="mcp__svc__restart",
        arguments={"name": "api"},
        policy="approve_before_run",
        idempotency_key="thr_1:toolu_01",
        rule=3,
        policy_hash="0123456789abcdef" * 4,
        quorum=2,
        idempotent=False,
    )
    assert summarize(ruled) == (
        'mcp__svc__restart({"name":"api"}) policy=approve_before_run rule 4 policy 01234567'
        " quorum 2 non-idempotent"
    )
    refused = ruled.model_copy(update={"policy": "reject", "reason": "not in prod", "quorum": 1})
    assert summarize(refused).endswith(
        "policy=reject rule 4 policy 01234567 non-idempotent: not in prod"
    )
    cancel = ev.ApprovalRefused(**_env(12, "U1"), decision="cancel", reason="not yours")
    assert summarize(cancel) == "refused to cancel: not yours"


def test_samples_cover_every_event_type() -> None:
    assert set(SAMPLES) == set(ev.EVENT_TYPES)
    assert all(event.type == name for name, (event, _) in SAMPLES.items())


def test_every_event_type_has_a_summary() -> None:
    assert ev.missing_from(SUMMARIES) == []


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_summary_of_each_type(name: str) -> None:
    event, expected = SAMPLES[name]
    assert summarize(event) == expected


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_trace_line_columns(name: str) -> None:
    event, expected = SAMPLES[name]
    line = trace_line(event)
    assert "\n" not in line
    assert line.split()[:4] == [str(event.seq), "2024-05-01T12:00:00Z", event.actor, name]
    assert line.endswith(expected)


def test_trace_lines_align_their_columns() -> None:
    lines = [(trace_line(e), e, summary) for e, summary in SAMPLES.values()]
    # Time, actor, type and summary each start at the same column on every line.
    assert len({line.index("2024-") for line, _, _ in lines}) == 1
    assert len({line.index(f" {e.actor} ") for line, e, _ in lines}) == 1
    assert len({line.index(f" {e.type} ") for line, e, _ in lines}) == 1
    assert len({line.rindex(summary) for line, _, summary in lines}) == 1


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_trace_record_is_envelope_then_payload(name: str) -> None:
    event, _ = SAMPLES[name]
    record = trace_record(event)
    assert list(record)[:5] == ["seq", "event_id", "type", "created_at", "actor"]
    assert record["seq"] == event.seq
    assert record["event_id"] == event.event_id
    assert record["type"] == name
    assert record["created_at"] == "2024-05-01T12:00:00.250000Z"
    assert record["actor"] == event.actor
    assert "thread_id" not in record
    payload = {
        k: v
        for k, v in event.model_dump(mode="json").items()
        if k not in ("thread_id", "seq", "event_id", "type", "created_at", "actor", "dedupe_key")
    }
    assert {k: record[k] for k in payload} == payload
    assert ("dedupe_key" in record) == (event.dedupe_key is not None)
    json.dumps(record)  # plain JSON, as `trace --json` prints it


def test_trace_record_keeps_a_set_dedupe_key() -> None:
    record = trace_record(SAMPLES["user_message"][0])
    assert record["dedupe_key"] == "Ev1"
    assert record["text"] == "deploy\n  the api please"  # the record is not abridged


def test_model_decision_final_and_clarify_and_cut_reply() -> None:
    final = ev.ModelDecision(**_env(1, "model"), text="Here you go", stop_reason="end_turn")
    assert summarize(final) == "final: Here you go"
    clarify = ev.ModelDecision(
        **_env(2, "model"),
        tool_name=ev.CLARIFICATION_TOOL,
        tool_call_id=CALL,
        arguments={"question": "Which region?"},
    )
    assert summarize(clarify) == "clarify: Which region?"
    cut = ev.ModelDecision(
        **_env(3, "model"), tool_name="deploy", arguments={}, stop_reason="max_tokens"
    )
    assert summarize(cut) == "tool deploy {} [stop=max_tokens]"


def test_tool_result_error_and_model_retry() -> None:
    failed = ev.ToolResult(**_env(1, "tool"), tool_call_id=CALL, attempt=2, ok=False, error="boom")
    assert summarize(failed) == "error: boom"
    model_retry = ev.RetryScheduled(
        **_env(2), attempt=1, wake_at=T0 + timedelta(days=1), error="overloaded"
    )
    # A retry on another day shows the date as well.
    assert summarize(model_retry) == (
        "attempt 1 failed: overloaded; retry at 2024-05-02 12:00:00 (model)"
    )


def test_long_text_is_cut_to_one_short_line() -> None:
    long = ev.UserMessage(**_env(1, "U1"), text="word " * 100)
    summary = summarize(long)
    assert len(summary) <= 80 and summary.endswith("…")
    big = ev.ToolResult(
        **_env(2, "tool"), tool_call_id=CALL, attempt=1, ok=True, output={"rows": list(range(500))}
    )
    summary = summarize(big)
    assert summary.startswith('ok: {"rows":[0,1,2') and summary.endswith("…")
    assert len(summary) < 100
    assert one_line("a\n\tb   c") == "a b c"


def test_empty_fields_still_summarise() -> None:
    assert summarize(ev.ThreadCancelled(**_env(1, "U1"))) == "cancelled"
    assert summarize(ev.MessagePosted(**_env(2), shows_event_id="evt_1")) == "posted evt_1"
    stream = ev.MessagePosted(**_env(2), shows_event_id="evt_1", ts="1700.3", kind="stream")
    assert summarize(stream) == "streamed the plan of evt_1 at 1700.3"
    assert summarize(ev.ToolResult(**_env(3), tool_call_id=CALL, attempt=1, ok=True)) == (
        "ok: null"
    )


def test_usage_totals_sums_model_decisions_only() -> None:
    events = [
        SAMPLES["user_message"][0],
        ev.ModelDecision(
            **_env(2, "model"),
            text="a",
            usage=ev.Usage(input_tokens=100, output_tokens=10, cache_read_input_tokens=80),
        ),
        ev.ModelDecision(
            **_env(3, "model"),
            text="b",
            usage=ev.Usage(input_tokens=50, output_tokens=5, cache_creation_input_tokens=7),
        ),
        SAMPLES["final_answer"][0],
    ]
    totals = usage_totals(events)
    assert totals == {
        "model_decisions": 2,
        "input_tokens": 150,
        "output_tokens": 15,
        "cache_read_input_tokens": 80,
        "cache_creation_input_tokens": 7,
    }
    assert format_usage(totals) == (
        "usage: 2 model decisions, input 150, output 15, cache read 80, cache write 7 tokens"
    )


def test_no_usage_line_without_tokens() -> None:
    totals = usage_totals([SAMPLES["model_decision"][0], SAMPLES["final_answer"][0]])
    assert totals["model_decisions"] == 1
    assert totals["input_tokens"] == 0
    assert format_usage(totals) is None
    assert usage_totals([])["model_decisions"] == 0
