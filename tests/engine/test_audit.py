"""``engine.audit``: a thread's approvals read from hand-made logs (pure: no database)."""

from __future__ import annotations

from hypothesis import given

from engine import events as ev
from engine.audit import audit
from engine.reviewers import ReviewerRule
from tests.support.logs import (
    OTHER,
    PROPERTY,
    REQUESTER,
    REVIEWER,
    answered,
    approval_asked,
    approval_pending,
    at,
    decided,
    legal_logs,
    outcome_unknown,
    reconciled,
    requested,
    result,
    run_now_call,
    stamp,
    started,
    user,
)

CAROL = "U0CAROL"


def restart_pending(call_id: str = "toolu_r") -> list[ev.Event]:
    """``restart`` (rule 0: two of REVIEWER and OTHER, non-idempotent) awaiting approval."""
    return [
        decided(call_id, "restart", service="api"),
        requested(call_id, "restart", service="api"),
        approval_asked(call_id, "restart", service="api"),
    ]


def granted(call_id: str, actor: str) -> ev.ApprovalGranted:
    return ev.ApprovalGranted(actor=actor, tool_call_id=call_id)


def refused(call_id: str, actor: str, why: str, decision: str = "approve") -> ev.ApprovalRefused:
    return ev.ApprovalRefused(actor=actor, tool_call_id=call_id, decision=decision, reason=why)  # type: ignore[arg-type]


def test_a_quorum_call_names_its_rule_each_vote_in_order_and_what_ran() -> None:
    log = stamp(
        [
            user(),
            *restart_pending(),
            granted("toolu_r", REVIEWER),
            refused("toolu_r", REVIEWER, "you already approved this call; it needs another person"),
            refused("toolu_r", CAROL, "you are not on the approvers list"),
            granted("toolu_r", OTHER),
            started("toolu_r"),
            result("toolu_r", output={"restarted": "api"}),
            *answered(),
        ]
    )
    [call] = audit(log)
    assert (call.intent, call.arguments, call.requester) == (
        "restart",
        {"service": "api"},
        REQUESTER,
    )
    assert call.reviewers == ReviewerRule(frozenset({REVIEWER, OTHER}), 2, False, 0)
    assert call.rule == 0 and call.quorum == 2
    assert [(s.kind, s.actor) for s in call.steps] == [
        ("approved", REVIEWER),
        ("refused", REVIEWER),
        ("refused", CAROL),
        ("approved", OTHER),
    ]
    assert call.steps[2].text == "you are not on the approvers list"
    assert call.steps[2].decision == "approve"
    assert [v.actor for v in call.votes] == [REVIEWER, OTHER]
    assert [s.at for s in call.steps] == [e.created_at for e in log[4:8]]
    assert (call.outcome, call.output, call.attempts) == ("ok", {"restarted": "api"}, 1)
    assert call.outcome_at == log[9].created_at


def test_one_vote_of_two_is_still_awaiting_approval() -> None:
    [call] = audit(stamp([user(), *restart_pending(), granted("toolu_r", REVIEWER)]))
    assert call.outcome == "awaiting_approval" and len(call.votes) == 1
    assert call.expires_at == at(24 * 60)


def test_a_rejection_carries_who_and_why_and_nothing_ran() -> None:
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            ev.ApprovalRejected(actor=REVIEWER, tool_call_id="toolu_2", reason="not on a Friday"),
            *answered(),
        ]
    )
    [call] = audit(log)
    assert call.reviewers is None  # recorded no rule: the process's approvers decided
    [step] = call.steps
    assert (step.kind, step.actor, step.text) == ("rejected", REVIEWER, "not on a Friday")
    assert call.outcome == "rejected" and call.attempts == 0


def test_a_withdrawal_and_then_the_call_asked_again() -> None:
    why = f"superseded by a newer message from <@{REQUESTER}>"
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            ev.ApprovalWithdrawn(actor=REQUESTER, tool_call_id="toolu_2", reason=why),
            user("no, production", actor=REQUESTER),
            *approval_pending("toolu_3"),
        ]
    )
    first, second = audit(log)
    assert first.outcome == "withdrawn"
    assert [(s.kind, s.actor, s.text) for s in first.steps] == [("withdrawn", REQUESTER, why)]
    assert (second.tool_call_id, second.outcome, second.steps) == (
        "toolu_3",
        "awaiting_approval",
        (),
    )


def test_an_expiry_is_a_step_of_the_system() -> None:
    log = stamp([user(), *approval_pending(), ev.ApprovalExpired(tool_call_id="toolu_2")])
    [call] = audit(log)
    assert [(s.kind, s.actor) for s in call.steps] == [("expired", "system")]
    assert call.outcome == "expired"


def test_an_unknown_outcome_then_reconciled_as_happened_and_as_retried() -> None:
    happened = stamp(
        [
            user(),
            *restart_pending(),
            granted("toolu_r", REVIEWER),
            granted("toolu_r", OTHER),
            started("toolu_r"),
            outcome_unknown("toolu_r"),
            reconciled("toolu_r", "happened", note="I saw it restart"),
        ]
    )
    [call] = audit(happened)
    assert [s.kind for s in call.steps] == ["approved", "approved", "unknown", "reconciled"]
    assert call.steps[2].text == "connection lost"
    recon = call.steps[3]
    assert (recon.actor, recon.decision, recon.text) == (REVIEWER, "happened", "I saw it restart")
    assert (call.outcome, call.output) == ("happened", "I saw it restart")

    retried = stamp(
        [
            *happened[:-1],
            reconciled("toolu_r", "retry"),
            started("toolu_r", 2),
            result("toolu_r", 2, output={"ok": 1}),
        ]
    )
    [call] = audit(retried)
    assert call.steps[-1].decision == "retry"
    assert (call.outcome, call.attempts, call.output) == ("ok", 2, {"ok": 1})
    [abandoned] = audit(stamp([*happened[:-1], reconciled("toolu_r", "abandon")]))
    assert abandoned.outcome == "abandoned"


def test_a_call_a_rule_refused_shows_the_rule_and_its_reason() -> None:
    log = stamp([user(), decided("toolu_p", "purge"), requested("toolu_p", "purge")])
    [call] = audit(log)
    assert (call.outcome, call.rule, call.reason) == (
        "refused_by_rule",
        1,
        "nothing is ever purged",
    )
    assert call.outcome_at == log[2].created_at


def test_approvals_by_a_grant_are_named_as_grants() -> None:
    log = stamp([user(), *approval_pending("toolu_2"), granted("toolu_2", "grant:g_123")])
    [call] = audit(log)
    assert call.grants == ("g_123",) and call.steps[0].grant == "g_123"
    assert call.outcome == "approved"


def test_a_cancel_ends_the_open_call_and_a_refused_cancel_is_kept() -> None:
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            refused("toolu_2", CAROL, "only the requester can cancel", "cancel"),
            ev.ThreadCancelled(actor=REQUESTER, reason="wrong service"),
        ]
    )
    [call] = audit(log)
    assert [(s.kind, s.actor, s.decision) for s in call.steps] == [
        ("refused", CAROL, "cancel"),
        ("cancelled", REQUESTER, ""),
    ]
    assert call.steps[-1].text == "wrong service" and call.outcome == "cancelled"


def test_calls_that_simply_ran_are_left_to_the_trace_and_forged_ids_are_ignored() -> None:
    log = stamp(
        [
            user(),
            *run_now_call("toolu_1"),
            refused("toolu_forged", CAROL, "there is no such call awaiting approval"),
            *approval_pending("toolu_2"),
        ]
    )
    assert [c.tool_call_id for c in audit(log)] == ["toolu_2"]
    assert audit([]) == []


def test_a_failed_thread_ends_the_open_call() -> None:
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            granted("toolu_2", REVIEWER),
            started("toolu_2"),
            ev.ErrorRaised(message="the tool crashed the worker"),
        ]
    )
    [call] = audit(log)
    assert (call.outcome, call.error) == ("failed", "the tool crashed the worker")


@PROPERTY
@given(legal_logs(max_size=60))
def test_every_legal_log_audits_and_votes_never_exceed_the_approvals(log: list) -> None:
    calls = audit(log)
    asked = [e.tool_call_id for e in log if isinstance(e, ev.ToolCallRequested)]
    ids = [c.tool_call_id for c in calls]
    assert ids == sorted(ids, key=asked.index)  # in the order asked, each once
    approvals = {e.event_id for e in log if isinstance(e, ev.ApprovalGranted)}
    for call in calls:
        assert len(call.votes) <= len(approvals)
        if call.outcome in ("ok", "error"):
            assert call.attempts >= 1


def edited(call_id: str, arguments: dict, **kw: object) -> ev.ApprovalEdited:
    return ev.ApprovalEdited(
        actor=REVIEWER,
        reviewer=REVIEWER,
        tool_call_id=call_id,
        arguments=arguments,
        arguments_hash="h2",
        previous_hash="h1",
        **kw,  # type: ignore[arg-type]
    )


def test_an_edit_voids_earlier_votes_raises_the_quorum_and_runs_the_new_arguments() -> None:
    stricter = ReviewerRule(frozenset({REVIEWER, OTHER}), 2, False, 3)
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            granted("toolu_2", OTHER),
            edited("toolu_2", {"service": "api", "env": "production"}, reviewers=stricter),
            granted("toolu_2", REVIEWER),
        ]
    )
    [call] = audit(log)
    assert [(s.kind, s.actor) for s in call.steps] == [
        ("approved", OTHER),
        ("edited", REVIEWER),
        ("approved", REVIEWER),
    ]
    assert call.steps[1].arguments == {"service": "api", "env": "production"}
    assert call.arguments == {"service": "api", "env": "staging"}  # as the model asked
    assert call.final_arguments == {"service": "api", "env": "production"}
    assert (call.reviewers, call.rule) == (stricter, 3)
    assert [v.actor for v in call.votes] == [REVIEWER]  # OTHER's vote was for the old ones
    assert call.outcome == "awaiting_approval"  # 1 of 2 after the edit
    ran = audit(stamp([*log, granted("toolu_2", OTHER), started("toolu_2"), result("toolu_2")]))
    assert ran[0].outcome == "ok" and len(ran[0].votes) == 2


def test_an_edit_the_policy_refuses_closes_the_call() -> None:
    log = stamp(
        [
            user(),
            *approval_pending("toolu_2"),
            edited("toolu_2", {"env": "prod"}, policy="reject", rule=1, reason="never prod"),
        ]
    )
    [call] = audit(log)
    assert (call.outcome, call.rule, call.reason) == ("refused_by_rule", 1, "never prod")
    assert [s.kind for s in call.steps] == ["edited"]


def test_a_reminder_is_a_step() -> None:
    log = stamp([user(), *approval_pending(), ev.ApprovalReminded(tool_call_id="toolu_2")])
    [call] = audit(log)
    assert [(s.kind, s.actor) for s in call.steps] == [("reminded", "system")]
    assert call.outcome == "awaiting_approval"
