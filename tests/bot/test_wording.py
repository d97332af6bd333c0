"""What people read (issue 8, item 8): dates without a doubled "at", the reject modal's
label, names instead of user ids, text escaped exactly once, a status line that says how
the thread ended, and none of our internal markers. Pure rendering, no Slack."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot import outbox
from bot.render.approval import approval_card, decided_card
from bot.render.lines import event_line
from bot.render.modals import reject_modal
from bot.render.status import status_message, status_text
from engine import events as ev
from engine.state import reduce
from tests.support import logs

NOW = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
THREAD = logs.THREAD_ID
ALICE, BOB = logs.REQUESTER, logs.REVIEWER


def card_inputs(reason: str = "Deploying api to production.") -> dict[str, Any]:
    call = ev.ToolCallRequested(
        thread_id=THREAD,
        tool_call_id="toolu_1",
        intent="deploy",
        arguments={"service": "api"},
        policy="approve_before_run",
        idempotency_key=f"{THREAD}:toolu_1",
    )
    return {
        "thread_id": THREAD,
        "requester": ALICE,
        "call": call,
        "reason": reason,
        "expires_at": NOW + timedelta(hours=1),
        "arguments_hash": "0f" * 16,
    }


def texts(node: Any) -> list[str]:
    return re.findall(r'"text": "((?:[^"\\]|\\.)*)"', json.dumps(node, ensure_ascii=False))


def shown(events: list[ev.Event]) -> list[list[dict[str, Any]]]:
    """What delivering this whole log would show, each thing rendered."""
    return [outbox.render(item) for item in outbox.pending_deliveries(logs.stamp(events))]


# --- dates ---------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["approved", "rejected", "expired", "cancelled"])
@pytest.mark.parametrize("by", [BOB, None])
def test_a_decision_date_reads_today_at_not_at_today_at(outcome: str, by: str | None) -> None:
    """Slack renders ``{date_short_pretty} at {time}`` as "today at 6:25 PM"; "Approved
    by @bob at today at 6:25 PM" doubled the "at"."""
    blocks = decided_card(**card_inputs(), outcome=outcome, by=by, at=NOW)  # type: ignore[arg-type]
    line = blocks[-1]["text"]["text"]
    assert "<!date^" in line
    assert not re.search(r"\bat <!date\^", line), line


def test_no_rendering_puts_at_or_on_before_a_pretty_date() -> None:
    later = NOW + timedelta(hours=1)
    sleeping = reduce(
        logs.stamp([logs.user(), ev.RetryScheduled(attempt=1, wake_at=later, error="503")])
    )
    renderings = [
        approval_card(**card_inputs()),
        status_message(sleeping, THREAD),
        event_line(ev.RetryScheduled(thread_id=THREAD, attempt=1, wake_at=later, error="x")),
    ]
    for text in (t for r in renderings for t in texts(r)):
        assert not re.search(r"\b(?:at|on) <!date\^\d+\^\{date_short_pretty\}", text), text


# --- the reject modal ------------------------------------------------------------------


def test_the_reject_reason_label_does_not_say_optional_twice() -> None:
    view = reject_modal(thread_id=THREAD, tool_call_id="toolu_1", arguments_hash="h", tool_name="x")
    [reason] = [blk for blk in view["blocks"] if blk["type"] == "input"]
    assert reason["optional"] is True  # Slack appends "(optional)" itself
    assert "optional" not in reason["label"]["text"].lower()


# --- names and escaping in the answer after a rejection ----------------------------------


def rejected_then_answered(answer: str, reason: str = "not now > later") -> list[ev.Event]:
    return [
        logs.user(),
        *logs.approval_pending("toolu_2"),
        ev.ApprovalRejected(actor=BOB, tool_call_id="toolu_2", reason=reason),
        *logs.answered(answer),
    ]


def test_the_answer_after_a_rejection_names_the_reviewer_and_escapes_once() -> None:
    """The model echoes the prompt's "Reviewer U0BOB rejected this call: …" (and the
    offline model quotes it with "> "): people see @bob and "a > b", not U0BOB or &gt;."""
    answer = f"Not deployed: api to staging.\n> Reviewer {BOB} rejected this call: not now > later"
    *_, final = shown(rejected_then_answered(answer))
    [section] = final
    text = section["text"]["text"]
    assert text == (
        f"Not deployed: api to staging.\n> Reviewer <@{BOB}> rejected this call: not now &gt; later"
    )
    assert "&amp;gt;" not in text and "&gt; Reviewer" not in text


def test_only_the_threads_own_people_become_mentions() -> None:
    answer = f"Ask U0STRANGER or {ALICE}; &lt;@{BOB}&gt; said <@U0STRANGER> <!channel>"
    *_, final = shown(rejected_then_answered(answer))
    text = final[0]["text"]["text"]
    assert f"<@{ALICE}>" in text and "Ask U0STRANGER" in text
    assert "&lt;@U0STRANGER&gt;" in text and "&lt;!channel&gt;" in text
    assert "<@U0STRANGER>" not in text and "<!channel>" not in text


# --- how the thread ended --------------------------------------------------------------


def status_of(events: list[ev.Event]) -> str:
    return status_text(reduce(logs.stamp(events)))


def test_a_rejected_deploy_does_not_end_with_a_green_check() -> None:
    text = status_of(rejected_then_answered("Not deployed."))
    assert "✅" not in text and "Done" not in text
    assert text == "🛑 Ended without running *Deploy*: a reviewer rejected it"


def test_an_expired_or_failed_call_does_not_look_successful() -> None:
    expired = [
        logs.user(),
        *logs.approval_pending("toolu_2"),
        ev.ApprovalExpired(tool_call_id="toolu_2"),
    ]
    assert status_of([*expired, *logs.answered("Nobody approved.")]).startswith("⌛ Ended without")
    failed = [
        logs.user(),
        *logs.approval_pending("toolu_2"),
        ev.ApprovalGranted(actor=BOB, tool_call_id="toolu_2"),
        logs.started("toolu_2"),
        logs.result("toolu_2", ok=False),
        *logs.answered("It failed."),
    ]
    assert status_of(failed) == "⚠️ Ended: *Deploy* failed"
    succeeded = [*failed[:6], logs.result("toolu_2"), *logs.answered("Deployed.")]
    assert status_of(succeeded) == "✅ Done"


# --- no internal markers ---------------------------------------------------------------


def test_the_cards_why_shows_names_not_our_internal_notes() -> None:
    """The offline model reported the cancelled call's result, the prompt's
    "[system] U0ALICE cancelled this thread.", in the next card's reason."""
    reason = (
        f"Not deployed: api to staging.\n> [system] {ALICE} cancelled this thread.\n\n"
        "Deploying api to production, once a reviewer approves."
    )
    [why] = [t for t in texts(approval_card(**card_inputs(reason))) if t.startswith("*Why*")]
    assert "[system]" not in why
    assert f"> <@{ALICE}> cancelled this thread." in why.replace("\\n", "\n")


def test_the_thread_shows_no_internal_marker_anywhere() -> None:
    note = f"[system] {ALICE} cancelled this thread."
    events = [
        logs.user(),
        ev.ModelDecision(actor="model", text=note, stop_reason="end_turn"),
        ev.FinalAnswer(actor="model", text=f"Earlier: {note}"),
    ]
    dumped = json.dumps(shown(events))
    assert "[system]" not in dumped and f"<@{ALICE}> cancelled" in dumped


# --- one rule numbering (issue 15 §9) --------------------------------------------------


def test_every_place_that_numbers_a_rule_counts_from_one() -> None:
    """The card said "rule 4" where the trace said "rule 3", and ``config check`` said
    ``policy[1]`` for what a card calls "rule 2". The second entry of ``policy:`` is
    "rule 2" everywhere; an error about the file shows its index beside it."""
    from bot.policy_check import _rule
    from bot.render.approval import rule_text
    from bot.render.audit import audit_blocks
    from engine.audit import audit as audit_of
    from engine.config_file import parse_config
    from engine.errors import ConfigError
    from engine.trace import summarize

    refused = card_inputs()["call"].model_copy(
        update={"rule": 1, "policy": "reject", "reason": "no purges from chat"}
    )
    ruled = card_inputs()["call"].model_copy(update={"rule": 1, "approvers": (BOB,)})
    edited = ev.ApprovalEdited(
        thread_id=THREAD,
        tool_call_id="toolu_1",
        reviewer=BOB,
        arguments={"service": "web"},
        arguments_hash="1" * 32,
        previous_hash="0" * 32,
        rule=1,
        approvers=(BOB,),
    )
    said = {
        "card": rule_text(ruled) or "",
        "line": json.dumps(event_line(refused)),
        "trace": summarize(refused),
        "trace of an edit": summarize(edited),
        "policy check": _rule(1),
        "audit": json.dumps(
            audit_blocks(
                thread_id=THREAD, link=None, calls=audit_of(logs.stamp([logs.user(), refused]))
            )
        ),
    }
    for where, text in said.items():
        assert re.search(r"\brule 2\b", text), (where, text)
        assert not re.search(r"\brule [013]\b", text), (where, text)
    with pytest.raises(ConfigError) as caught:
        parse_config("policy:\n  - {tool: a, policy: run_now}\n  - {tool: b, quorum: 0}\n", {})
    assert str(caught.value).startswith("opsloop.yaml: policy[1].policy (rule 2): ")
