"""The thread's status message: one line saying what the thread is doing or waiting
for, with a Cancel button while the thread is active.

Pure: no I/O here.
"""

from __future__ import annotations

from bot.limits import Block
from bot.mrkdwn import date, mention
from bot.render.common import approver_text, button, confirm, section, short, titled
from engine.reviewers import ANYONE, ReviewerRule
from engine.state import PendingCall, ThreadState

CANCEL_ACTION = "opsloop_cancel"
# Statuses in which the thread can be cancelled (the reducer refuses it when "new").
ACTIVE = frozenset(
    {
        "running",
        "awaiting_approval",
        "awaiting_reply",
        "awaiting_job",
        "awaiting_reconcile",
        "sleeping",
    }
)


def status_text(state: ThreadState, reviewers: ReviewerRule = ANYONE) -> str:
    """One line saying what the thread is doing or waiting for (mrkdwn)."""
    call = state.pending
    status = state.status
    if status == "awaiting_approval" and call is not None:
        who = _approvers_of(call, reviewers) or "a reviewer"
        expires = f" (expires {date(call.expires_at)})" if call.expires_at else ""
        done = f", {len(call.votes)} of {call.quorum} so far" if call.quorum > 1 else ""
        return f"⏸️ Waiting for approval from {who} to run {titled(call.intent)}{expires}{done}"
    if status == "awaiting_reply":
        return f"💬 Waiting for your reply, {mention(state.requester)}: answer in this thread"
    if status == "awaiting_job" and call is not None and call.wait is not None:
        return (
            f"⏳ Waiting for {short(call.wait.description, 500)} "
            f"(gives up {date(call.wait.timeout_at)})"
        )
    if status == "awaiting_reconcile" and call is not None:
        who = _approvers_of(call, reviewers) or "someone"
        return (
            f"❓ {titled(call.intent)} was interrupted: waiting for {who} to say whether it "
            "happened (see the card)"
        )
    if status == "sleeping" and state.wake_at is not None:
        return f"🔁 Retrying {date(state.wake_at)}"
    if status == "idle" and state.setback is not None:
        # Answered, but the call it asked for did not happen: not a green check.
        name = titled(state.setback.intent)
        return {
            "rejected": f"🛑 Ended without running {name}: a reviewer rejected it",
            "expired": f"⌛ Ended without running {name}: nobody approved it in time",
            "withdrawn": f"✅ Done; {name} was withdrawn when its requester wrote again",
            "failed": f"⚠️ Ended: {name} failed",
        }[state.setback.kind]
    return _STATUS_TEXT.get(status, "⚙️ Working…")


_STATUS_TEXT = {
    "idle": "✅ Done",
    "failed": "⚠️ Failed: needs a human",
    "cancelled": "🚫 Cancelled",
    "sleeping": "🔁 Retrying soon",
    "awaiting_approval": "⏸️ Waiting for approval",
    "awaiting_job": "⏳ Waiting for a job",
    "awaiting_reconcile": "❓ Waiting for a person to say whether a call happened",
}


def _approvers_of(call: PendingCall, default: ReviewerRule) -> str:
    """Who may decide ``call``: its recorded rule's approvers, else the process's."""
    named = sorted((call.reviewers or default).approvers)
    return ", ".join(approver_text(a) for a in named[:10])


def status_message(
    state: ThreadState, thread_id: str, *, reviewers: ReviewerRule = ANYONE
) -> list[Block]:
    """The thread's status line, with a Cancel button while the thread is active.

    ``approvers`` (user and user-group ids) are named while an approval is awaited. No
    thread id: people find the log from the thread (``opsloop trace CHANNEL/TS``,
    ``/opsloop audit`` with its link), and an id in every thread is noise to them.
    """
    line = section(status_text(state, reviewers))
    if state.status in ACTIVE:
        line["accessory"] = button(
            "Cancel",
            CANCEL_ACTION,
            thread_id,
            "danger",
            confirm=confirm(
                "Cancel this thread?",
                # Shown alike to every clicker: it says who may cancel.
                "opsloop stops working on it. A tool call already running is not undone. "
                "Only the requester or an approver may cancel.",
                "Cancel thread",
                "Keep going",
                "danger",
            ),
        )
    return [line]
