"""The plain text sent with a message, for notifications and screen readers."""

from __future__ import annotations

from bot.render.approval import approval_card
from bot.render.notification import fallback_text
from engine import events as ev
from tests.bot.render.support import CALL_ID, EVIL, THREAD, assert_safe, card_inputs, shown_events


def test_fallback_text_of_blocks_and_events() -> None:
    card = approval_card(**card_inputs())
    assert fallback_text(card).startswith("Approval needed: Refund customer · ")
    answer = ev.FinalAnswer(thread_id=THREAD, text="x" * 20_000)
    assert len(fallback_text(answer)) <= 3000
    started = ev.ToolStarted(thread_id=THREAD, tool_call_id=CALL_ID, attempt=1)
    assert fallback_text(started) == f"{CALL_ID} attempt 1"
    assert fallback_text([]) == "opsloop"


def test_fallback_text_is_escaped() -> None:
    for event in shown_events():
        assert_safe(fallback_text(event))
    refused = ev.ApprovalRefused(
        thread_id=THREAD, tool_call_id=CALL_ID, decision="approve", reason=EVIL
    )
    assert_safe(fallback_text(refused))
