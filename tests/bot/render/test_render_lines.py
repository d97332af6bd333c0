"""One line per event people need to see: what each says, which types have one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot import limits
from bot import mrkdwn as md
from bot.render.lines import CARD_TYPES, LINES, SHOWN_TYPES, event_line
from engine import events as ev
from tests.bot.render.support import (
    CALL_ID,
    HASH,
    LATER,
    REQUESTER,
    REVIEWER,
    THREAD,
    requested,
    shown_events,
    text_objects,
)


def line_text(blocks: list[dict[str, Any]] | None) -> str:
    assert blocks is not None
    return "\n".join(text_objects(blocks))


def test_tool_call_line_shows_the_tool_and_its_arguments_on_one_line() -> None:
    blocks = event_line(requested("search_docs", {"query": "a\nb"}, policy="run_now"))
    assert blocks == [
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "🔧 *Search docs* · query: a b"}],
        }
    ]


def test_tool_call_line_truncates_arguments() -> None:
    text = line_text(event_line(requested("t", {"q": "x" * 10_000}, policy="run_now")))
    assert len(text) < 400 and text.endswith("…")


def test_a_call_without_arguments_is_its_title_alone() -> None:
    text = line_text(event_line(requested("mcp__catalog__list_services", {}, policy="run_now")))
    assert text == "🔧 *List services*"


def test_an_mcp_result_is_its_content_as_key_value_lines_not_json() -> None:
    """Issue 15 §7: the catalog's answer showed as
    `{"text":"{\\"services\\": [{\\"owner\\": …`; people read its rows instead."""
    rows = [
        {"owner": "platform", "replicas": 3, "service": "api"},
        {"owner": "data", "replicas": 1, "service": "worker"},
    ]
    output = {"text": json.dumps({"services": rows}), "structured": {"services": rows}}
    result = ev.ToolResult(
        thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, ok=True, output=output
    )
    text = line_text(event_line(result, tool_name="mcp__catalog__list_services"))
    assert text == (
        "✔️ *List services* done\n"
        "services:\n"
        "• owner: platform, replicas: 3, service: api\n"
        "• owner: data, replicas: 1, service: worker"
    )
    text_only = {"text": json.dumps({"service": "api", "replicas": 6, "was": 3})}
    scaled = result.model_copy(update={"output": text_only})
    assert line_text(event_line(scaled, tool_name="mcp__catalog__scale_service")) == (
        "✔️ *Scale service* done\nservice: api\nreplicas: 6\nwas: 3"
    )
    words = result.model_copy(update={"output": {"text": "Restarted api"}})
    assert line_text(event_line(words, tool_name="restart")) == "✔️ *Restart* done: Restarted api"


def test_a_result_is_escaped_and_cut_within_the_line() -> None:
    output = {"note": "<!channel> ```", "blob": "x" * 10_000, "rows": list(range(1000))}
    result = ev.ToolResult(
        thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, ok=True, output=output
    )
    blocks = event_line(result, tool_name="t")
    text = line_text(blocks)
    assert "&lt;!channel&gt;" in text and "```" not in text
    assert "and 995 more" in text and len(text) < 1000
    assert limits.check_limits(blocks or []) == []


def test_a_call_that_needs_approval_is_shown_by_its_card() -> None:
    assert event_line(requested()) is None


def test_event_lines_say_what_happened() -> None:
    lines = {}
    for event in shown_events("boom"):
        key = event.type + ("" if getattr(event, "ok", True) else ":error")
        key += ":model" if event.type == "retry_scheduled" and not event.tool_call_id else ""
        lines[key] = line_text(event_line(event, tool_name="deploy", requester=REQUESTER))
    assert lines["tool_call_requested"] == "🔧 *Boom* · q: boom"
    assert lines["tool_result"] == "✔️ *Deploy* done\nout: boom"
    assert lines["tool_result:error"] == "⚠️ *Deploy* failed: boom"
    assert lines["retry_scheduled"].startswith("🔁 Attempt 2 of *Deploy* failed: boom; retrying")
    assert md.date(LATER) in lines["retry_scheduled"]
    assert lines["wait_started"] == f"⏳ Waiting for boom (gives up {md.date(LATER)})"
    assert lines["wait_finished"] == "✔️ The wait is over\nr: boom"
    assert lines["wait_timed_out"] == "⌛ Gave up waiting: it timed out"
    # Once, by the status line: not again under the question (issue 15 §12).
    assert lines["clarification_requested"] == f"❓ <@{REQUESTER}> boom"
    assert lines["decision_rejected"] == "↩️ The model's proposal was refused: boom"
    assert lines["error"].startswith("⚠️ *tool_failed*: boom\nThis thread needs a human.")
    assert lines["final_answer"] == "boom"
    assert lines["thread_cancelled"] == f"🚫 Cancelled by <@{REQUESTER}>: boom"


def test_model_retry_and_unnamed_calls() -> None:
    retry = ev.RetryScheduled(thread_id=THREAD, attempt=1, wake_at=LATER, error="529")
    assert "Attempt 1 of the model call failed: 529" in line_text(event_line(retry))
    result = ev.ToolResult(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1, ok=True)
    assert line_text(event_line(result)) == "✔️ the call done"  # its id is the trace's


def test_the_question_is_a_prominent_section() -> None:
    question = ev.ClarificationRequested(thread_id=THREAD, tool_call_id=CALL_ID, question="Which?")
    blocks = event_line(question)
    assert blocks is not None and blocks[0]["type"] == "section"
    assert blocks[0]["text"]["text"] == "❓ Which?"


@pytest.mark.parametrize(
    "event",
    [
        ev.UserMessage(thread_id=THREAD, text="hi", actor=REQUESTER),
        ev.ModelDecision(thread_id=THREAD, text="thinking", tool_name="t", tool_call_id="c"),
        ev.ToolStarted(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1),
        ev.ApprovalRequested(
            thread_id=THREAD, tool_call_id=CALL_ID, arguments_hash=HASH, expires_at=LATER
        ),
        ev.ApprovalGranted(thread_id=THREAD, tool_call_id=CALL_ID, actor=REVIEWER),
        ev.ApprovalRejected(thread_id=THREAD, tool_call_id=CALL_ID, actor=REVIEWER),
        ev.ApprovalExpired(thread_id=THREAD, tool_call_id=CALL_ID),
        ev.ApprovalRefused(
            thread_id=THREAD, tool_call_id=CALL_ID, decision="approve", reason="not an approver"
        ),
        ev.ClarificationAnswered(thread_id=THREAD, tool_call_id=CALL_ID, text="this one"),
        ev.MessagePosted(thread_id=THREAD, shows_event_id="evt_1", channel="C1", ts="1.2"),
    ],
    ids=lambda e: e.type,
)
def test_events_not_shown_as_lines(event: ev.Event) -> None:
    assert event_line(event) is None
    assert event.type not in SHOWN_TYPES


def test_shown_and_card_types_cover_every_event_type_at_most_once() -> None:
    assert not SHOWN_TYPES & CARD_TYPES
    assert SHOWN_TYPES | CARD_TYPES <= set(ev.EVENT_TYPES)


def test_every_type_people_see_as_a_line_has_a_renderer_and_no_other_does() -> None:
    lines = [c for c in ev.EVENT_CLASSES if c.facts.people == "line"]
    assert ev.missing_from(LINES, lines) == []
    assert {ev.type_name(c) for c in LINES} == SHOWN_TYPES


def test_shown_and_card_types_are_as_before_the_facts_replaced_the_tables() -> None:
    assert SHOWN_TYPES == {
        "tool_call_requested",
        "tool_result",
        "retry_scheduled",
        "wait_started",
        "wait_finished",
        "wait_timed_out",
        "clarification_requested",
        "decision_rejected",
        "error",
        "final_answer",
        "thread_cancelled",
        "alert_received",  # the same alert firing again or resolving (its first: the root)
    }
    assert CARD_TYPES == {
        "approval_requested",
        "approval_granted",
        "approval_rejected",
        "approval_expired",
        "approval_withdrawn",
        "approval_reminded",
        "approval_edited",
        "grant_created",  # the card its vote closes says what it lets through
        "tool_outcome_unknown",
        "reconcile_decided",
    }


def test_a_long_final_answer_is_split_into_sections() -> None:
    text = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum " * 40 for i in range(40))
    blocks = event_line(ev.FinalAnswer(thread_id=THREAD, text=text))
    assert blocks is not None and len(text) > 3000 * 5
    assert all(blk["type"] == "section" for blk in blocks)
    assert all(len(blk["text"]["text"]) <= 3000 for blk in blocks)
    assert "".join(blk["text"]["text"] for blk in blocks) == text.strip()
    assert limits.check_limits(blocks) == []


def test_an_enormous_final_answer_stops_at_50_blocks_with_a_pointer() -> None:
    blocks = event_line(ev.FinalAnswer(thread_id=THREAD, text="word " * 60_000))
    assert blocks is not None and len(blocks) == 50
    assert blocks[-1]["text"]["text"].endswith(md.trace_pointer(THREAD))
    assert limits.check_limits(blocks) == []


def test_a_20000_character_answer_fits() -> None:
    blocks = event_line(ev.FinalAnswer(thread_id=THREAD, text="z" * 20_000))
    assert blocks is not None and 7 <= len(blocks) <= 50
    assert limits.check_limits(blocks) == []


def test_a_call_a_rule_refused_is_one_line_with_the_reason() -> None:
    refused = requested("purge", policy="reject", rule=1, reason="Nothing is purged from chat.")
    [line] = event_line(refused) or []
    assert line["elements"][0]["text"] == (
        "🛑 *Purge* was refused by rule 2: Nothing is purged from chat."
    )
