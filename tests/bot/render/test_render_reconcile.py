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
    assert blocks[0]["text"]["text"] == "Did it happen? restart"
    assert f"*restart* was running since {md.date(NOW)} when it was interrupted" in text
    assert '"service": "api"' in text
    assert "*What was observed*\nconnection lost after the request went out" in text
    assert "Attempt 1" in text
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
    assert abandon["style"] == "danger"
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
    assert blocks[0]["text"]["text"] == f"{title}: refund_customer"
    last = blocks[-1]["text"]["text"]
    assert last.startswith(f"{line} {md.date(NOW)}")
    if outcome == "happened":
        assert last.endswith("— “restarted at 10:02 &lt;!here&gt;”")
    assert all(blk["type"] != "actions" for blk in blocks)
