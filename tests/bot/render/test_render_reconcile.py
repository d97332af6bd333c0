"""The reconcile card: what was interrupted, its three buttons, and who said what became of it."""

from __future__ import annotations

import pytest

from bot import limits
from bot import mrkdwn as md
from bot.render.common import Binding, parse_binding
from bot.render.reconcile import (
    ABANDON_ACTION,
    HAPPENED_ACTION,
    RETRY_ACTION,
    reconcile_card,
    reconciled_card,
)
from engine import events as ev
from tests.bot.render.support import (
    CALL_ID,
    HASH,
    NOW,
    REQUESTER,
    REVIEWER,
    THREAD,
    all_text,
    outcome_unknown,
    requested,
)


def test_the_reconcile_card_says_what_was_running_since_when_and_offers_three_buttons() -> None:
    call = requested("restart", {"service": "api"})
    blocks = reconcile_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=call,
        unknown=outcome_unknown("connection lost after the request went out"),
        arguments_hash=HASH,
    )
    text = all_text(blocks)
    assert blocks[0]["text"]["text"] == "Did it happen? Restart"
    assert f"*restart* was running since {md.date(NOW)} when it was interrupted" in text
    assert '"service": "api"' in text
    assert "*What was observed*\nconnection lost after the request went out" in text
    assert "Attempt 1" in text and CALL_ID not in text  # the call's id is the trace's
    actions = blocks[-1]
    assert actions["block_id"] == f"opsloop_reconcile:{CALL_ID}"
    happened, retry, abandon = actions["elements"]
    assert [e["action_id"] for e in actions["elements"]] == [
        HAPPENED_ACTION,
        RETRY_ACTION,
        ABANDON_ACTION,
    ]
    assert [e["text"]["text"] for e in actions["elements"]] == [
        "It happened",
        "Run it again",
        "It did not happen",
    ]
    assert "confirm" not in happened  # it opens the note modal
    assert "may take effect twice" in retry["confirm"]["text"]["text"]
    # No button is the default answer, least of all the one that can double the effect.
    assert all("style" not in e for e in actions["elements"])
    assert retry["confirm"]["style"] == abandon["confirm"]["style"] == "danger"
    for button in actions["elements"]:
        assert parse_binding(button["value"]) == Binding(THREAD, CALL_ID, HASH)
    assert limits.check_limits(blocks) == []


def test_a_reconcile_card_without_an_error_or_start_time_says_less() -> None:
    unknown = ev.ToolOutcomeUnknown(thread_id=THREAD, tool_call_id=CALL_ID, attempt=2)
    blocks = reconcile_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=unknown,
        arguments_hash=HASH,
    )
    text = all_text(blocks)
    assert "What was observed" not in text and " since " not in text
    assert "Attempt 2" in text


@pytest.mark.parametrize(
    ("outcome", "title", "line"),
    [
        ("happened", "It happened", f"✅ <@{REVIEWER}> said it happened"),
        ("retry", "Run again", f"🔁 <@{REVIEWER}> asked to run it again"),
        ("abandon", "It did not happen", f"🚫 <@{REVIEWER}> said it did not happen"),
        ("cancelled", "Cancelled", f"🚫 Cancelled by <@{REVIEWER}>"),
    ],
)
def test_the_decided_reconcile_card_names_who_decided_what(
    outcome: str, title: str, line: str
) -> None:
    blocks = reconciled_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=outcome_unknown(),
        outcome=outcome,  # type: ignore[arg-type]
        by=REVIEWER,
        at=NOW,
        note="restarted at 10:02 <!here>" if outcome == "happened" else "",
    )
    assert blocks[0]["text"]["text"] == f"{title}: Refund customer"
    assert CALL_ID not in all_text(blocks)
    last = blocks[-1]["text"]["text"]
    assert last.startswith(f"{line} {md.date(NOW)}")
    if outcome == "happened":
        assert "— “restarted at 10:02 &lt;!here&gt;”\n" in last
    assert all(blk["type"] != "actions" for blk in blocks)


def open_card(call: ev.ToolCallRequested) -> list[dict]:
    return reconcile_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=call,
        unknown=outcome_unknown(),
        arguments_hash=HASH,
    )


def test_the_card_asks_to_check_first_and_no_button_is_primary() -> None:
    """Issue 15 §10: "Run it again", the one answer that can double a non-idempotent
    effect, was the green primary button. Now none is styled, and the card says to
    check first, with a question opsloop can answer in a new message (this thread waits
    for the answer); in the local demo, "show service api"."""
    call = requested(
        "mcp__catalog__scale_service", {"service": "api", "replicas": 6, "simulate_crash": True}
    )
    blocks = open_card(call)
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e.get("style") for e in actions["elements"]] == [None, None, None]
    text = all_text(blocks)
    assert "🔎 Before you answer, check whether it took effect" in text
    assert "ask opsloop in a new message (e.g. “show service api”)" in text
    assert "*Run it again* does it a second time" in text
    # An argument that is no short text gives no example; the hint stays.
    plain = all_text(open_card(requested("purge", {"n": 3, "x": "y" * 80})))
    assert "🔎 Before you answer" in plain and "e.g." not in plain
    # The example is escaped: an argument cannot ping or link.
    evil = all_text(open_card(requested("restart", {"service": "<!channel>"})))
    assert "“show service &lt;!channel&gt;”" in evil and "<!channel>" not in evil


def test_each_dialog_says_who_may_decide() -> None:
    """Issue 15 §5: one dialog for every clicker, so it says who may decide (the
    requester, refused after confirming, had been told only what would happen)."""
    call = requested("restart", {"service": "api"}, rule=1, approvers=(REVIEWER,))
    [actions] = [b for b in open_card(call) if b["type"] == "actions"]
    _happened, retry, abandon = actions["elements"]
    for button in (retry, abandon):
        assert button["confirm"]["text"]["text"].endswith(
            f"Only <@{REVIEWER}> may decide, not the requester."
        )


@pytest.mark.parametrize(
    ("outcome", "then"),
    [
        ("happened", "opsloop did not run it again; the model reads that it happened."),
        ("retry", "opsloop runs it once more, with the same idempotency key."),
        ("abandon", "opsloop did not run it again; the model reads that it did not happen."),
        ("cancelled", "opsloop did not run it again."),
    ],
)
def test_the_decided_card_says_what_was_decided_not_that_nobody_can_tell(
    outcome: str, then: str
) -> None:
    """Issue 15 §10: the decided card kept "opsloop cannot tell whether it took effect"."""
    blocks = reconciled_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=outcome_unknown(),
        outcome=outcome,  # type: ignore[arg-type]
        by=REVIEWER,
        at=NOW,
    )
    text = all_text(blocks)
    assert "cannot tell" not in text and "🔎" not in text
    assert "was running since" in text and "when it was interrupted." in text
    assert blocks[-1]["text"]["text"].endswith(f"\n{then}")
    noted = reconciled_card(
        thread_id=THREAD,
        requester=REQUESTER,
        call=requested(),
        unknown=outcome_unknown(),
        outcome="happened",
        by=REVIEWER,
        at=NOW,
        note="catalog shows 6",
    )
    assert noted[-1]["text"]["text"].endswith("the model reads the note as its result.")
