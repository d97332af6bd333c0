"""Who may decide a call: one ReviewerRule, from the settings or a rule (engine/reviewers.py)."""

from __future__ import annotations

import pytest

from engine.config import load_settings
from engine.errors import ConfigError
from engine.reviewers import ReviewerRule

# --- who may decide --------------------------------------------------------------------------


def test_empty_list_lets_anyone_but_the_requester_approve() -> None:
    policy = ReviewerRule()
    assert policy.may_decide("approve", "U2", requester="U1") is None
    assert policy.may_decide("reject", "U3", requester="U1") is None
    why = policy.may_decide("approve", "U1", requester="U1")
    assert why is not None and "self-approval" in why
    assert policy.is_approver("U_ANYONE")


def test_self_approval_flag_lets_the_requester_approve() -> None:
    assert ReviewerRule(allow_self=True).may_decide("approve", "U1", requester="U1") is None
    listed = ReviewerRule(frozenset({"U1"}), allow_self=False)
    assert listed.may_decide("approve", "U1", requester="U1") is not None
    assert (
        ReviewerRule(frozenset({"U1"}), allow_self=True).may_decide("approve", "U1", "U1") is None
    )


def test_listed_user_ids_may_decide_and_others_may_not() -> None:
    policy = ReviewerRule(frozenset({"U_BOSS", "W_ENT"}))
    assert policy.may_decide("approve", "U_BOSS", requester="U1") is None
    assert policy.may_decide("approve", "W_ENT", requester="U1") is None
    for decision in ("approve", "reject"):
        why = policy.may_decide(decision, "U_RANDOM", requester="U1")
        assert why is not None and "approvers list" in why


def test_user_groups_grant_approval_through_membership() -> None:
    policy = ReviewerRule(frozenset({"S_ONCALL", "U_BOSS"}))
    assert policy.groups == frozenset({"S_ONCALL"})
    assert policy.may_decide("approve", "U7", "U1", reviewer_groups=["S_ONCALL"]) is None
    assert policy.may_decide("approve", "U7", "U1", reviewer_groups={"S_OTHER", "S_ONCALL"}) is None
    assert policy.may_decide("approve", "U7", "U1", reviewer_groups=["S_OTHER"]) is not None
    assert policy.may_decide("approve", "U7", "U1") is not None
    # A group id is not a user id: a user called like the group gains nothing.
    assert not ReviewerRule(frozenset({"S_ONCALL"})).is_approver("U7", ["U_BOSS"])


def test_requester_may_reject_their_own_call() -> None:
    policy = ReviewerRule(frozenset({"U_BOSS"}))
    assert policy.may_decide("reject", "U1", requester="U1") is None
    assert policy.may_decide("approve", "U1", requester="U1") is not None


def test_requester_on_the_list_still_needs_self_approval() -> None:
    why = ReviewerRule(frozenset({"U1"})).may_decide("approve", "U1", requester="U1")
    assert why is not None and "self-approval" in why


@pytest.mark.parametrize(
    ("approvers", "allow_self", "ids", "allowed"),
    [
        (None, None, frozenset(), False),
        ("", "", frozenset(), False),
        ("U012AB", "true", frozenset({"U012AB"}), True),
        (" U012AB, S0ONCALL ,,W99ZZ ", "TRUE", frozenset({"U012AB", "S0ONCALL", "W99ZZ"}), True),
        ("U012AB,U012AB", "1", frozenset({"U012AB"}), True),
        ("U012AB", "yes", frozenset({"U012AB"}), True),
        ("U012AB", " on ", frozenset({"U012AB"}), True),
        ("U012AB", "false", frozenset({"U012AB"}), False),
        ("U012AB", "0", frozenset({"U012AB"}), False),
        ("U012AB", "off", frozenset({"U012AB"}), False),
    ],
)
def test_parse_from_environment_strings(
    approvers: str | None, allow_self: str | None, ids: frozenset[str], allowed: bool
) -> None:
    env = {
        k: v
        for k, v in {
            "OPSLOOP_APPROVERS": approvers,
            "OPSLOOP_ALLOW_SELF_APPROVAL": allow_self,
        }.items()
        if v is not None
    }
    assert load_settings(env).reviewers == ReviewerRule(ids, allow_self=allowed)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OPSLOOP_APPROVERS": "alice"}, "OPSLOOP_APPROVERS"),
        ({"OPSLOOP_APPROVERS": "U012AB,#ops"}, "OPSLOOP_APPROVERS"),
        ({"OPSLOOP_ALLOW_SELF_APPROVAL": "sometimes"}, "OPSLOOP_ALLOW_SELF_APPROVAL"),
    ],
)
def test_bad_environment_strings_are_refused_naming_the_variable(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert variable in str(info.value)


# --- comparing two rules (policy check) ---------------------------------------------------


SRE = ReviewerRule(frozenset({"S0SRE"}), quorum=2)


@pytest.mark.parametrize(
    ("new", "steps"),
    [
        (SRE, set()),
        (ReviewerRule(frozenset({"S0SRE"}), quorum=2, rule=4), set()),  # where it came from
        (ReviewerRule(frozenset({"S0SRE", "U0X"}), quorum=2), {"looser"}),
        (ReviewerRule(quorum=2), {"looser"}),  # empty: anyone but the requester
        (ReviewerRule(frozenset({"S0DBA"}), quorum=2), {"different"}),
        (ReviewerRule(frozenset({"S0SRE"}), quorum=1), {"looser"}),
        (ReviewerRule(frozenset({"S0SRE"}), quorum=3), {"stricter"}),
        (ReviewerRule(frozenset({"S0SRE"}), quorum=2, allow_self=True), {"looser"}),
        (ReviewerRule(frozenset({"S0SRE"}), quorum=3, allow_self=True), {"looser", "stricter"}),
    ],
)
def test_a_rule_compared_to_the_one_a_call_recorded(new: ReviewerRule, steps: set[str]) -> None:
    assert new.compared_to(SRE) == steps
    assert new.widens(SRE) is bool(steps & {"looser", "different"})


def test_narrower_approvers_are_stricter_and_never_widen() -> None:
    narrow = ReviewerRule(frozenset({"U0A"}))
    wide = ReviewerRule(frozenset({"U0A", "U0B"}))
    assert narrow.compared_to(wide) == {"stricter"} and not narrow.widens(wide)
    assert wide.widens(narrow)
    assert ReviewerRule(frozenset({"U0A"})).compared_to(ReviewerRule()) == {"stricter"}


def test_on_call_entries_are_known_as_such() -> None:
    assert ReviewerRule(frozenset({"oncall:PX1", "U0A"})).on_call
    assert not ReviewerRule(frozenset({"U0A", "S0B"})).on_call


def test_an_on_call_entry_admits_whom_the_lookup_found_on_call_and_nobody_else() -> None:
    rule = ReviewerRule(frozenset({"oncall:PX1", "S0B", "U0A"}))
    assert rule.looked_up == {"oncall:PX1", "S0B"}
    assert rule.is_approver("U0ONCALL", ["oncall:PX1"])
    assert not rule.is_approver("U0ONCALL", [])  # not looked up (or not on call): no
    assert not rule.is_approver("U0ONCALL", ["oncall:PX2"])  # another schedule's on-call
    assert rule.may_decide("approve", "U0Z", "U0A") == (
        "you are not on the approvers list, nor on call for it now"
    )


# --- after an edit (issue 17 §2) -----------------------------------------------------------


DEV = ReviewerRule(frozenset({"S0DEV"}), rule=1)
PROD = ReviewerRule(frozenset({"S0SRE"}), quorum=2, rule=0)


def test_an_edit_into_what_another_group_approves_needs_that_group() -> None:
    """staging (developers) edited to production (SRE, 2): production's rule holds in
    full; developers approving it would be a way around the policy."""
    from engine.edits import after_edit

    assert after_edit(DEV, PROD) == PROD


def test_an_edit_never_lowers_what_the_call_needed() -> None:
    from engine.edits import after_edit

    lowered = after_edit(PROD, DEV)  # production edited to staging
    assert lowered.quorum == 2 and lowered.approvers == frozenset({"S0DEV"})
    anyone = ReviewerRule(rule=2)
    assert after_edit(PROD, anyone).approvers == frozenset({"S0SRE"})  # wider: kept
    wider = ReviewerRule(frozenset({"S0SRE", "S0DEV"}), rule=3)
    assert after_edit(PROD, wider) == ReviewerRule(frozenset({"S0SRE"}), quorum=2, rule=0)
    selfish = ReviewerRule(frozenset({"S0SRE"}), quorum=2, allow_self=True, rule=4)
    assert not after_edit(PROD, selfish).allow_self
