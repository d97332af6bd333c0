"""What an approval's timers post (issue 17 §3): the reminder in the thread, the post
escalating an expiry, and the open card once reminded; each within Slack's limits."""

from __future__ import annotations

import json

from bot import limits
from bot import mrkdwn as md
from bot.render.approval import APPROVE_ACTION, NO_VOTES, Votes, approval_card
from bot.render.reminders import escalation_channel, escalation_post, reminder_reply
from tests.bot.render.support import (
    CALL_ID,
    LATER,
    NOW,
    REQUESTER,
    REVIEWER,
    THREAD,
    all_text,
    card_inputs,
    requested,
)

LINK = "https://acme.slack.com/archives/C0OPS00001/p1767000000000100?thread_ts=1.2&cid=C0OPS00001"
GROUP = "S0GROUP01"
TIMERS = {"thread_id": THREAD, "asked_at": NOW, "expires_at": LATER}


def ruled(*approvers: str, quorum: int = 1, **kw):  # type: ignore[no-untyped-def]
    return requested("deploy", {"service": "api"}, rule=0, approvers=approvers, quorum=quorum, **kw)


def test_the_reminder_mentions_each_approver_and_links_the_card() -> None:
    call = ruled(REVIEWER, GROUP, "oncall:P0NCALL1")
    blocks = reminder_reply(**TIMERS, call=call, votes=NO_VOTES, card_link=LINK)
    text = all_text(blocks)
    assert text.startswith(f"🔔 <!subteam^{GROUP}>, <@{REVIEWER}>: *deploy* is still waiting")
    assert f"<{LINK}|Open the approval card>" in text
    assert md.date(NOW) in text and md.date(LATER) in text  # asked, and when it expires
    assert "whoever is on call (P0NCALL1)" in text and "reaches nobody" in text
    assert f"`{CALL_ID}`" in text
    assert f"<@{REQUESTER}>" not in text  # only approvers are pinged
    assert limits.check_limits(blocks) == []


def test_the_reminder_and_the_escalation_mention_whoever_is_on_call() -> None:
    call = ruled(REVIEWER, "oncall:P0NCALL1", "oncall:P0NCALL2", quorum=2)
    on_call = {"oncall:P0NCALL1": ("U0ALICE01", REVIEWER), "oncall:P0NCALL2": None}
    text = all_text(reminder_reply(**TIMERS, call=call, votes=NO_VOTES, on_call=on_call))
    assert text.startswith(f"🔔 <@{REVIEWER}>, <@U0ALICE01>: *deploy* is still waiting")
    assert "whoever is on call (P0NCALL1)" not in text  # reached: the people are named
    assert "Not notified: whoever is on call (P0NCALL2): PagerDuty could not say" in text
    to = ("oncall:P0NCALL1",)
    expired = escalation_post(
        **TIMERS, requester=REQUESTER, call=call, escalate_to=to, votes=NO_VOTES, on_call=on_call
    )
    assert all_text(expired).startswith(f"⌛ <@U0ALICE01>, <@{REVIEWER}>: an approval expired")
    nobody = {"oncall:P0NCALL1": ()}
    blocks = escalation_post(
        **TIMERS, requester=REQUESTER, call=call, escalate_to=to, votes=NO_VOTES, on_call=nobody
    )
    assert "nobody on call has a Slack account" in all_text(blocks)


def test_the_reminder_pings_nobody_who_voted_and_counts_the_votes() -> None:
    call = ruled(REVIEWER, "U0OTHER01", quorum=2)
    blocks = reminder_reply(**TIMERS, call=call, votes=Votes((REVIEWER,), 2))
    text = all_text(blocks)
    assert "<@U0OTHER01>" in text and f"<@{REVIEWER}>" not in text
    assert "So far 1 of 2 approvals." in text


def test_a_reminder_for_anyone_but_the_requester_mentions_nobody() -> None:
    blocks = reminder_reply(**TIMERS, call=ruled(), votes=NO_VOTES)
    text = all_text(blocks)
    assert "<@" not in text and "<!subteam" not in text
    assert "anyone but the requester may approve it" in text
    assert "The approval card is in this thread" in text  # no link from Slack
    self_ok = reminder_reply(**TIMERS, call=ruled(allow_self=True), votes=NO_VOTES)
    assert "anyone may approve it" in all_text(self_ok)


def test_a_reminder_to_hundreds_of_approvers_stays_within_limits() -> None:
    many = [f"U{i:08d}" for i in range(500)]
    blocks = reminder_reply(**TIMERS, call=ruled(*many), votes=NO_VOTES, card_link=LINK)
    assert limits.check_limits(blocks) == []
    assert "more: *deploy* is still waiting" in all_text(blocks)  # "…and 400 more"
    assert "<@U000" not in all_text(blocks).split(" and ")[-1]  # no mention is cut


def test_a_link_slack_would_never_give_is_left_out() -> None:
    for bad in ("http://acme.slack.com/x", "https://x.example/a|b>", "https://a/" + "p" * 3000):
        text = all_text(reminder_reply(**TIMERS, call=ruled(), votes=NO_VOTES, card_link=bad))
        assert "Open the approval card" not in text


def test_the_escalation_says_what_expired_who_asked_and_links_the_card() -> None:
    to = ("U0ONCALL1", GROUP, "C0ESCALATE1", "oncall:P0NCALL1")
    call = ruled(REVIEWER, quorum=2, escalate_to=to)
    blocks = escalation_post(
        **TIMERS,
        requester=REQUESTER,
        call=call,
        escalate_to=to,
        votes=Votes((REVIEWER,), 2),
        card_link=LINK,
        channel=escalation_channel(to),
    )
    text = all_text(blocks)
    assert text.startswith(f"⌛ <@U0ONCALL1>, <!subteam^{GROUP}>: an approval expired")
    assert "*deploy* `service=api`" in text  # what expired
    assert f"<@{REQUESTER}> asked for it {md.date(NOW)}" in text  # who asked, when
    assert "with 1 of 2 approvals. It did not run." in text
    assert f"<@{REVIEWER}>" not in text
    assert "C0ESCALATE1" not in text  # the channel is where it goes, not whom it pings
    assert f"<{LINK}|Open the approval card>" in text
    assert "whoever is on call (P0NCALL1)" in text
    assert limits.check_limits(blocks) == []


def test_an_escalation_refused_in_its_channel_says_so_in_the_thread() -> None:
    to = ("C0ESCALATE1",)
    blocks = escalation_post(
        **TIMERS,
        requester=REQUESTER,
        call=ruled(escalate_to=to),
        escalate_to=to,
        votes=NO_VOTES,
        channel="C0ESCALATE1",
        refusal="not_in_channel",
    )
    text = all_text(blocks)
    assert text.startswith("⌛ an approval expired")  # nobody to mention
    assert "Slack refused this post in <#C0ESCALATE1> (not_in_channel)" in text
    assert "The approval card is in this thread" in text


def test_an_escalation_in_a_channel_without_a_link_names_the_thread() -> None:
    blocks = escalation_post(
        **TIMERS,
        requester=REQUESTER,
        call=ruled(),
        escalate_to=("C0ESCALATE1",),
        votes=NO_VOTES,
        channel="C0ESCALATE1",
    )
    assert f"`opsloop trace {THREAD}`" in all_text(blocks)


def test_the_escalation_channel_is_the_first_channel_entry() -> None:
    assert escalation_channel(["U0A1", "S0B2", "oncall:P1"]) == ""
    assert escalation_channel(["U0A1", "C0OPS", "G0PRIVATE"]) == "C0OPS"


def test_the_reminded_card_says_when_and_keeps_its_buttons() -> None:
    blocks = approval_card(**card_inputs(), reminded_at=NOW)
    expiry = next(b for b in blocks if b["type"] == "context" and "Expires" in json.dumps(b))
    assert f"🔔 Reminded {md.date(NOW)}" in expiry["elements"][0]["text"]
    assert APPROVE_ACTION in json.dumps(blocks)
    assert limits.check_limits(blocks) == []
    assert "Reminded" not in json.dumps(approval_card(**card_inputs()))
