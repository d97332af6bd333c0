"""The approval card: its structure, the rule and the votes it shows, and its decided form."""

from __future__ import annotations

import json

import pytest

from bot import limits
from bot import mrkdwn as md
from bot.render.approval import (
    Edited,
    Votes,
    approval_card,
    decided_card,
    duration_text,
    rule_text,
)
from bot.render.common import Binding, parse_binding
from engine.edits import changes
from tests.bot.render.support import (
    CALL_ID,
    EVIL,
    HASH,
    LATER,
    NOW,
    REQUESTER,
    REVIEWER,
    THREAD,
    all_text,
    card_inputs,
    find,
    pending,
    requested,
    ruled_call,
)


def test_arguments_show_bidi_tricks_instead_of_obeying_them() -> None:
    blocks = approval_card(**card_inputs(arguments={"amount": "\u202e0005"}))
    assert '"amount": "\\u202e0005"' in blocks[2]["text"]["text"]


def test_approval_card_structure() -> None:
    blocks = approval_card(**card_inputs())
    assert [blk["type"] for blk in blocks] == [
        "header",
        "section",
        "section",
        "section",
        "context",
        "actions",
    ]
    header, who, arguments, why, expiry, actions = blocks
    assert header["text"] == {
        "type": "plain_text",
        "text": "Approval needed: Refund customer",
        "emoji": True,
    }
    assert who["fields"][0]["text"] == f"*Requested by*\n<@{REQUESTER}>"
    assert who["fields"][1]["text"] == "*Tool*\n*Refund customer*"
    assert arguments["text"]["text"] == (
        '*Arguments*\n```\n{\n  "amount_cents": 500,\n  "order_id": "A-1"\n}\n```'
    )
    assert why["text"]["text"] == "*Why*\nCustomer asked for it"
    assert md.date(LATER) in expiry["elements"][0]["text"]
    assert CALL_ID not in json.dumps(expiry)  # the trace's, not people's
    assert actions["block_id"] == f"opsloop_approval:{CALL_ID}"
    approve, edit, reject = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["text"]["text"]) == (
        "opsloop_approve",
        "primary",
        "Approve",
    )
    assert (edit["action_id"], edit["text"]["text"]) == ("opsloop_edit", "Edit")
    assert "style" not in edit and "confirm" not in edit  # it opens the arguments modal
    assert (reject["action_id"], reject["style"], reject["text"]["text"]) == (
        "opsloop_reject",
        "danger",
        "Reject",
    )
    assert approve["confirm"]["confirm"]["text"] == "Approve"
    assert approve["confirm"]["title"]["text"].startswith("Approve ")
    assert "confirm" not in reject  # reject opens the reason modal instead
    for button in (approve, edit, reject):
        assert json.loads(button["value"]) == {"t": THREAD, "c": CALL_ID, "h": HASH}
        assert parse_binding(button["value"]) == Binding(THREAD, CALL_ID, HASH)
        assert " " not in button["value"]  # compact
    assert limits.check_limits(blocks) == []


def test_approval_card_from_a_pending_call_uses_its_hash() -> None:
    blocks = approval_card(
        thread_id=THREAD, requester=REQUESTER, call=pending(), reason="", expires_at=LATER
    )
    assert parse_binding(blocks[-1]["elements"][0]["value"]).arguments_hash == HASH
    assert "_The model gave no reason._" in blocks[3]["text"]["text"]


def test_approval_card_without_a_hash_is_refused() -> None:
    with pytest.raises(ValueError, match="arguments hash"):
        approval_card(
            thread_id=THREAD, requester=REQUESTER, call=requested(), reason="", expires_at=LATER
        )


def test_approval_card_shows_long_arguments_cut_with_a_pointer_to_the_trace() -> None:
    blocks = approval_card(**card_inputs(arguments={"blob": "x" * 100_000}))
    text = blocks[2]["text"]["text"]
    assert len(text) <= limits.MAX_TEXT
    assert text.endswith(f"```\n… (truncated; full text: `opsloop trace {THREAD}`)")


@pytest.mark.parametrize(
    ("outcome", "by", "title", "line"),
    [
        # Slack renders the date as "today at 6:25 PM": no "at" before it (issue 8).
        ("approved", REVIEWER, "Approved: Refund customer", f"✅ Approved by <@{REVIEWER}> <!date"),
        ("rejected", REVIEWER, "Rejected: Refund customer", f"❌ Rejected by <@{REVIEWER}> <!date"),
        ("expired", None, "Approval expired: Refund customer", "⌛ Expired <!date"),
        ("withdrawn", REQUESTER, "Withdrawn: Refund customer", "↩️ Withdrawn <!date"),
        ("cancelled", REQUESTER, "Cancelled: Refund customer", f"🚫 Cancelled by <@{REQUESTER}>"),
        ("cancelled", None, "Cancelled: Refund customer", "🚫 Cancelled <!date"),
    ],
)
def test_decided_card_has_no_buttons_and_names_who_and_when(
    outcome: str, by: str | None, title: str, line: str
) -> None:
    blocks = decided_card(**card_inputs(), outcome=outcome, by=by, at=NOW)
    assert not find(blocks, "actions")
    assert "opsloop_approve" not in json.dumps(blocks)
    assert blocks[0]["text"]["text"] == title
    outcome_text = blocks[-1]["text"]["text"]
    assert outcome_text.startswith(line)
    assert md.date(NOW) in outcome_text
    assert blocks[1:4] == approval_card(**card_inputs())[1:4]  # same audit record
    assert limits.check_limits(blocks) == []


def test_decided_card_carries_the_reject_reason_escaped() -> None:
    blocks = decided_card(
        **card_inputs(), outcome="rejected", by=REVIEWER, at=NOW, decision_reason="no <@U1>"
    )
    assert blocks[-1]["text"]["text"].endswith(" — no &lt;@U1&gt;")


def test_our_own_mentions_do_appear() -> None:
    dumped = json.dumps(approval_card(**card_inputs(EVIL)))
    assert f"<@{REQUESTER}>" in dumped


def test_a_requester_that_is_not_a_user_id_is_escaped() -> None:
    inputs = card_inputs() | {"requester": "<!everyone>"}
    fields = approval_card(**inputs)[1]["fields"]
    assert fields[0]["text"] == "*Requested by*\n&lt;!everyone&gt;"


def test_the_card_names_the_rule_that_decided_and_who_may_approve() -> None:
    call = requested("deploy", rule=2, approvers=(REVIEWER, "S0GROUP01"), quorum=2)
    # Named in sorted order, whatever order the event holds them in (the runner sorts).
    assert rule_text(call) == f"📜 rule 3: needs 2 of <!subteam^S0GROUP01> and <@{REVIEWER}>"
    anyone = requested("deploy", rule=0, approvers=(), quorum=1)
    assert rule_text(anyone) == "📜 rule 1: needs 1 approval, from anyone but the requester"
    oncall = requested("deploy", rule=4, approvers=("oncall:PXYZ123",), allow_self=True)
    text = rule_text(oncall) or ""
    assert text.startswith("📜 rule 5: needs 1 of whoever is on call (PXYZ123)")
    assert "(the requester may approve too)" in text
    assert "who is on call is asked of PagerDuty at each click" in text
    # A call from before policy files shows no rule line.
    assert rule_text(requested()) is None
    assert "📜" not in all_text(approval_card(**card_inputs()))


def test_an_open_quorum_card_shows_its_progress_and_not_the_policy_hash() -> None:
    inputs = card_inputs() | {"call": ruled_call("x", "deploy", {"env": "production"})}
    fresh = approval_card(**inputs)
    assert "🗳️ 0 of 2 approvals so far" in all_text(fresh)
    voted = approval_card(**inputs, votes=Votes((REVIEWER,), 2))
    text = all_text(voted)
    assert f"🗳️ 1 of 2: <@{REVIEWER}>" in text
    assert "rule 3: needs 2 of" in text
    assert "ab" * 6 not in text and "policy `" not in text  # the trace's, not people's
    assert voted[-1]["type"] == "actions"  # still open: the buttons stay
    confirm = voted[-1]["elements"][0]["confirm"]["text"]["text"]
    assert "once 2 different people have approved it (1 so far)" in confirm
    assert "(0 so far)" in fresh[-1]["elements"][0]["confirm"]["text"]["text"]
    assert limits.check_limits(voted) == []


def test_the_approved_quorum_card_names_every_approver() -> None:
    inputs = card_inputs() | {"call": ruled_call("x")}
    carol = "U0CAROL001"
    blocks = decided_card(
        **inputs, outcome="approved", by=carol, at=NOW, votes=Votes((REVIEWER, carol), 2)
    )
    assert blocks[-1]["text"]["text"].startswith(
        f"✅ Approved by <@{REVIEWER}> and <@{carol}> <!date^"
    )
    assert all(blk["type"] != "actions" for blk in blocks)
    rejected = decided_card(
        **inputs, outcome="rejected", by=carol, at=NOW, votes=Votes((REVIEWER,), 2)
    )
    assert f"(after approvals by <@{REVIEWER}>)" in rejected[-1]["text"]["text"]


# --- edited before approval (issue 17 §2) -----------------------------------------------


def edit(before: dict, after: dict, by: str = REVIEWER) -> Edited:
    return Edited(by, NOW, tuple(changes(before, after)))


def test_an_edited_card_shows_the_new_arguments_and_the_diff() -> None:
    new_hash = "1e" * 16
    call = requested("deploy", {"service": "api", "environment": "production"})
    edits = [edit({"service": "api", "environment": "staging"}, call.arguments)]
    blocks = approval_card(
        **card_inputs() | {"call": call, "arguments_hash": new_hash}, edits=edits
    )
    text = all_text(blocks)
    assert '"environment": "production"' in text  # the arguments shown are the new ones
    [diff] = [b for b in blocks if "✏️" in b.get("text", {}).get("text", "")]
    assert diff["text"]["text"] == (
        f"✏️ Edited by <@{REVIEWER}> {md.date(NOW)}: environment: staging → production"
    )
    assert blocks.index(diff) == 3  # under the arguments, before the model's reason
    for button in blocks[-1]["elements"]:
        assert parse_binding(button["value"]).arguments_hash == new_hash
    assert limits.check_limits(blocks) == []


def test_the_diff_escapes_names_and_values_and_keeps_the_latest_edits() -> None:
    many = [edit({"a": i}, {"a": i + 1, EVIL: EVIL}) for i in range(5)]
    blocks = approval_card(**card_inputs(), edits=many)
    [diff] = [b for b in blocks if "✏️" in b.get("text", {}).get("text", "")]
    body = diff["text"]["text"]
    assert body.startswith("✏️ 5 edits; the latest:\n")
    assert body.count("✏️ Edited by") == 3 and "a: 4 → 5" in body and "a: 1 → 2" not in body
    assert "(unset) → &lt;!channel&gt;" in body and "<!channel>" not in body
    removed = edit({"force": True, "note": "x"}, {"note": "x"})
    assert "force: true → (unset)" in all_text(approval_card(**card_inputs(), edits=[removed]))


def test_a_card_the_policy_refuses_after_an_edit_says_so_and_keeps_the_diff() -> None:
    inputs = card_inputs() | {"call": ruled_call("x", "deploy", {"environment": "prod-eu"})}
    edits = [edit({"environment": "staging"}, {"environment": "prod-eu"})]
    blocks = decided_card(
        **inputs,
        outcome="refused",
        by=REVIEWER,
        at=NOW,
        decision_reason="Nothing deploys to prod-eu from chat.",
        edits=edits,
    )
    assert blocks[0]["text"]["text"] == "Refused by the policy: Deploy"
    assert blocks[-1]["text"]["text"] == (
        f"⛔ Refused by the policy {md.date(NOW)}, after <@{REVIEWER}>'s edit — "
        "Nothing deploys to prod-eu from chat."
    )
    assert "environment: staging → prod-eu" in all_text(blocks)
    assert all(blk["type"] != "actions" for blk in blocks)
    assert limits.check_limits(blocks) == []


# --- standing grants (issue 17 §4) --------------------------------------------------------


@pytest.mark.parametrize(
    ("max_grant_s", "label"),
    [(7200.0, "Approve for 1 h"), (3600.0, "Approve for 1 h"), (1200.0, "Approve for 20 min")],
)
def test_a_rule_with_max_grant_offers_approve_for_its_real_duration(
    max_grant_s: float, label: str
) -> None:
    blocks = approval_card(**card_inputs(max_grant_s=max_grant_s))
    [actions] = [b for b in blocks if b["type"] == "actions"]
    approve, grant, _edit, _reject = actions["elements"]
    assert (grant["action_id"], grant["text"]["text"]) == ("opsloop_approve_for", label)
    assert grant["value"] == approve["value"]  # bound to the same call and arguments
    assert "confirm" not in grant  # its modal is the confirmation
    assert limits.check_limits(blocks) == []


@pytest.mark.parametrize(
    "call_kw",
    [{}, {"max_grant_s": 3600.0, "approvers": (REVIEWER, "U0OTHER01"), "quorum": 2}],
    ids=["no max_grant", "quorum 2"],
)
def test_no_approve_for_without_max_grant_or_with_a_quorum(call_kw: dict) -> None:
    blocks = approval_card(**card_inputs(**call_kw))
    ids = [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]
    assert ids == ["opsloop_approve", "opsloop_edit", "opsloop_reject"]


def test_duration_text_says_the_real_span() -> None:
    assert [duration_text(s) for s in (3600, 5400, 1800, 45, 0.2)] == [
        "1 h",
        "1 h 30 min",
        "30 min",
        "45 s",
        "1 s",
    ]


def test_a_card_is_titled_by_the_tool_and_shows_no_ids() -> None:
    """Issue 15 §7: "Approval needed: Scale service", the registered name only in the
    Tool field (the name rules match), and neither the call's id nor the policy's hash
    in what people read (open or decided)."""
    call = ruled_call("x", "mcp__catalog__scale_service", {"service": "api", "replicas": 6})
    inputs = card_inputs() | {"call": call}
    for blocks in (
        approval_card(**inputs),
        decided_card(**inputs, outcome="approved", by=REVIEWER, at=NOW),
    ):
        assert blocks[0]["text"]["text"].endswith(": Scale service")
        tool_field = blocks[1]["fields"][1]["text"]
        assert tool_field == "*Tool*\n*Scale service*\n`mcp__catalog__scale_service`"
        shown = all_text(blocks)
        assert CALL_ID not in shown and "ab" * 6 not in shown
        assert "call `" not in shown and "policy `" not in shown
        assert limits.check_limits(blocks) == []


def approve_dialog(blocks: list[dict]) -> str:
    [approve] = [e for e in blocks[-1]["elements"] if e["action_id"] == "opsloop_approve"]
    return approve["confirm"]["title"]["text"] + "\n" + approve["confirm"]["text"]["text"]


def test_the_approve_dialog_is_true_whoever_clicks() -> None:
    """Issue 15 §5: Slack shows one confirm dialog to every clicker. It told the
    requester "Your approval counts as one of the 2 …" and bob, after his vote, "opsloop
    runs deploy …"; both were then refused. It says what an approval does and who may
    give one, and promises no one that their click counts."""
    call = requested("deploy", rule=2, approvers=(REQUESTER, REVIEWER), quorum=2)
    inputs = card_inputs() | {"call": call}
    for votes in (None, Votes((REVIEWER,), 2)):
        text = approve_dialog(approval_card(**inputs, votes=votes))
        assert "your approval" not in text.lower() and "opsloop runs" not in text
        assert "once 2 different people have approved it" in text
        assert "each person counts once" in text  # bob's second vote
        # The requester is among the approvers, and still may not approve her own call.
        assert f"Only <@{REQUESTER}> and <@{REVIEWER}> may approve, not the requester." in text
    one = approve_dialog(approval_card(**card_inputs() | {"call": requested(approvers=())}))
    assert "runs with the arguments shown once it is approved" in one
    assert one.endswith("Anyone but the requester may approve.")
    mine = requested(approvers=(REVIEWER,), allow_self=True)
    assert approve_dialog(approval_card(**card_inputs() | {"call": mine})).endswith(
        f"Only <@{REVIEWER}> may approve."
    )
    # A call from before rules were recorded: the process's approvers decide.
    assert "Only opsloop's approvers may approve." in approve_dialog(approval_card(**card_inputs()))


def test_the_approve_dialog_fits_with_many_approvers() -> None:
    many = tuple(f"U0PERSON{i:02d}" for i in range(30))
    blocks = approval_card(**card_inputs() | {"call": requested(approvers=many, quorum=3)})
    text = approve_dialog(blocks)
    assert "and 25 more may approve" in text and text.endswith(", not the requester.")
    assert limits.check_limits(blocks) == []
