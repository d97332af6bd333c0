"""The thread's status message: what it says in each status, and its Cancel button."""

from __future__ import annotations

import json

import pytest

from bot import limits
from bot import mrkdwn as md
from bot.render.status import CANCEL_ACTION, status_message, status_text
from engine.reviewers import ReviewerRule
from engine.state import ThreadState
from tests.bot.render.support import LATER, REQUESTER, REVIEWER, THREAD, pending, state, wait_info


@pytest.mark.parametrize(
    ("s", "text", "cancel"),
    [
        (state("new"), "⚙️ Working…", False),  # the engine cannot cancel a new thread
        (state("running"), "⚙️ Working…", True),
        (
            state("awaiting_approval", pending=pending()),
            # Named in sorted order: group and user ids as the rule holds them.
            f"⏸️ Waiting for approval from <!subteam^S0GROUP01>, <@{REVIEWER}> "
            f"to run *Refund customer* (expires {md.date(LATER)})",
            True,
        ),
        (
            state("awaiting_reply"),
            f"💬 Waiting for your reply, <@{REQUESTER}>: answer in this thread",
            True,
        ),
        (
            state("awaiting_job", pending=pending("waiting", wait=wait_info())),
            # What it waits for, as the tool describes it: no "job: job backfill".
            f"⏳ Waiting for deploy job 42 (gives up {md.date(LATER)})",
            True,
        ),
        (state("sleeping", model_retry_at=LATER), f"🔁 Retrying {md.date(LATER)}", True),
        (state("idle"), "✅ Done", False),
        (state("failed"), "⚠️ Failed: needs a human", False),
        (state("cancelled"), "🚫 Cancelled", False),
    ],
    ids=lambda v: v.status if isinstance(v, ThreadState) else None,
)
def test_status_message(s: ThreadState, text: str, cancel: bool) -> None:
    blocks = status_message(s, THREAD, reviewers=ReviewerRule(frozenset({REVIEWER, "S0GROUP01"})))
    assert blocks[0]["text"]["text"] == text
    assert ("accessory" in blocks[0]) is cancel
    if cancel:
        button = blocks[0]["accessory"]
        assert (button["action_id"], button["value"], button["style"]) == (
            "opsloop_cancel",
            THREAD,
            "danger",
        )
        assert button["confirm"]["confirm"]["text"] == "Cancel thread"
        # One dialog for every clicker (issue 15 §5): it says who may cancel.
        assert button["confirm"]["text"]["text"].endswith(
            "Only the requester or an approver may cancel."
        )
    assert limits.check_limits(blocks) == []


def test_the_status_message_shows_no_thread_id() -> None:
    """Issue 15 §7: the thread's id and the trace command are for operators (opsloop
    trace CHANNEL/TS finds the log); the status message is only its line."""
    for s in (state("running"), state("awaiting_approval", pending=pending()), state("idle")):
        blocks = status_message(s, THREAD)
        assert len(blocks) == 1
        shown = json.dumps([b.get("text") for b in blocks])
        assert THREAD not in shown and "opsloop trace" not in shown


def test_status_without_approvers_asks_for_a_reviewer() -> None:
    blocks = status_message(state("awaiting_approval", pending=pending()), THREAD)
    assert blocks[0]["text"]["text"].startswith("⏸️ Waiting for approval from a reviewer")


def test_the_status_line_while_an_outcome_is_unknown_or_a_quorum_is_open() -> None:
    unknown = state("awaiting_reconcile", pending=pending("unknown", intent="restart"))
    text = status_text(unknown, ReviewerRule(frozenset({REVIEWER})))
    assert text.startswith("❓ *Restart* was interrupted: waiting for")
    assert f"<@{REVIEWER}>" in text
    quorum = state(
        "awaiting_approval",
        pending=pending(approvers=("S0GROUP01",), quorum=2, votes=(REVIEWER,)),
    )
    # The call's own approvers win over the process's.
    text = status_text(quorum, ReviewerRule(frozenset({REVIEWER})))
    assert "<!subteam^S0GROUP01>" in text and f"<@{REVIEWER}>" not in text
    assert text.endswith(", 1 of 2 so far")
    blocks = status_message(unknown, THREAD)
    assert blocks[0]["accessory"]["action_id"] == CANCEL_ACTION  # cancellable


def test_the_status_line_names_a_tool_by_its_title() -> None:
    """Issue 15 §7: "to run *Scale service*", not the registered mcp__catalog__… name."""
    call = pending(intent="mcp__catalog__scale_service")
    text = status_text(state("awaiting_approval", pending=call))
    assert "to run *Scale service*" in text and "mcp__" not in text
