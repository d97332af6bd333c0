"""Policy rules: first match decides, channels, hints, offered(), quorum, compare()."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.config_file import PolicyRule, load_config_file, parse_config
from engine.reviewers import ReviewerRule
from engine.rules import (
    Defaults,
    RuleDecision,
    compare,
    decide,
    matches,
    offered,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = Defaults(ReviewerRule(frozenset({"S0SRE"})), expires_in_s=86400.0)
PROD = {"properties": {"environment": {"const": "production"}}, "required": ["environment"]}


def example_rules() -> list[PolicyRule]:
    cfg = load_config_file(
        str(ROOT / "opsloop.example.yaml"), {"GRAFANA_TOKEN": "g", "PLATFORM_TOKEN": "p"}
    )
    assert cfg is not None
    return cfg.policy


def rules(*raw: dict[str, Any]) -> list[PolicyRule]:
    return parse_config(json.dumps({"policy": list(raw)}), {}).policy


def call(
    rule_list: list[PolicyRule],
    tool: str,
    arguments: dict[str, Any] | None = None,
    *,
    default_policy: str = "run_now",
    source: str = "module:acme",
    channel: str | None = "C0OPS",
    annotations: dict[str, Any] | None = None,
    defaults: Defaults = DEFAULTS,
) -> RuleDecision:
    return decide(
        rule_list,
        defaults,
        tool=tool,
        arguments=arguments or {},
        default_policy=default_policy,
        source=source,
        channel=channel,
        annotations=annotations,
    )


# --- the DESIGN example -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "source", "channel", "policy", "rule"),
    [
        ("mcp__grafana__query", {}, "mcp:grafana", "C1", "run_now", 0),
        ("mcp__kube__resources_delete", {"name": "x"}, "mcp:kube", "C1", "reject", 1),
        ("mcp__kube__pods_list", {}, "mcp:kube", "C1", "approve_before_run", None),
        ("deploy", {"environment": "production"}, "module:acme", "C1", "approve_before_run", 2),
        ("deploy", {"environment": "staging"}, "module:acme", "C1", "run_now", None),
        ("deploy", {}, "module:acme", "C1", "run_now", None),
        ("restart_service", {"service": "api"}, "http", "C0OPS", "approve_before_run", 3),
        ("restart_service", {"service": "api"}, "http", "C0DEV", "reject", 3),
        ("refund", {}, "module:shop", None, "run_now", None),
        ("fetch", {}, "http", None, "approve_before_run", None),
    ],
)
def test_the_example_policy(tool, arguments, source, channel, policy, rule):
    got = call(example_rules(), tool, arguments, source=source, channel=channel)
    assert (got.policy, got.rule) == (policy, rule)


def test_the_example_rule_keys_reach_the_decision():
    deploy = call(example_rules(), "deploy", {"environment": "production"})
    assert deploy == RuleDecision(
        policy="approve_before_run",
        reviewers=ReviewerRule(frozenset({"S0SRE"}), quorum=2, rule=2),
        expires_in_s=7200.0,
        remind_after_s=1800.0,
        escalate_to=("oncall:PXXXXXX",),
    )
    restart = call(example_rules(), "restart_service", {"service": "web"}, source="http")
    assert (restart.reviewers.quorum, restart.expires_in_s) == (1, 86400.0)
    delete = call(example_rules(), "mcp__kube__resources_delete", source="mcp:kube")
    assert delete.reason == "Deleting resources is not allowed from chat."


def test_the_example_hides_only_the_unconditional_reject():
    rule_list = example_rules()
    assert not offered(rule_list, "mcp__kube__resources_delete")
    assert all(offered(rule_list, t) for t in ("deploy", "restart_service", "mcp__kube__pods_log"))


# --- every rule key -----------------------------------------------------------------------


def test_every_rule_key_is_carried():
    got = call(
        rules(
            {
                "tool": "t",
                "when": {"type": "object"},
                "policy": "approve_before_run",
                "reason": "because",
                "approvers": ["U0A1", "W0B2", "S0C3", "oncall:P123ABC"],
                "quorum": 3,
                "allow_self": True,
                "expires_in": "10m",
                "channels": ["C0OPS", "G0PRIV", "D0DM"],
                "idempotent": False,
                "trust_hints": True,
            }
        ),
        "t",
        channel="G0PRIV",
    )
    assert got == RuleDecision(
        policy="approve_before_run",
        reviewers=ReviewerRule(
            frozenset({"U0A1", "W0B2", "S0C3", "oncall:P123ABC"}), quorum=3, allow_self=True, rule=0
        ),
        reason="because",
        expires_in_s=600.0,
        idempotent=False,
        trust_hints=True,
    )


@pytest.mark.parametrize(
    ("rule", "field", "expected"),
    [
        ({}, "approvers", frozenset({"S0SRE"})),
        ({"approvers": ["U0X1"]}, "approvers", frozenset({"U0X1"})),
        ({"approvers": []}, "approvers", frozenset()),
        ({}, "allow_self", False),
        ({"allow_self": True}, "allow_self", True),
        ({}, "expires_in_s", 86400.0),
        ({"expires_in": "2h"}, "expires_in_s", 7200.0),
        ({}, "quorum", 1),
        ({}, "idempotent", None),
        ({"idempotent": True}, "idempotent", True),
        ({}, "remind_after_s", None),
        ({"remind_after": "30m"}, "remind_after_s", 1800.0),
        ({}, "max_grant_s", None),
        ({"max_grant": "90m"}, "max_grant_s", 5400.0),
        ({}, "escalate_to", ()),
        (
            {"escalate_to": ["S0SRE", "oncall:P1", "C0OPS", "S0SRE"]},
            "escalate_to",
            ("S0SRE", "oncall:P1", "C0OPS"),
        ),
    ],
)
def test_a_rule_key_left_out_falls_back_to_the_defaults(rule, field, expected):
    got = call(rules({"tool": "t", "policy": "approve_before_run", **rule}), "t")
    holder = got.reviewers if field in ("approvers", "allow_self", "quorum") else got
    assert getattr(holder, field) == expected


# --- first match, globs, when ---------------------------------------------------------------------


def test_the_first_matching_rule_decides():
    rule_list = rules(
        {"tool": "deploy", "policy": "reject", "reason": "frozen", "when": PROD},
        {"tool": "deploy", "policy": "approve_before_run"},
        {"tool": "*", "policy": "run_now"},
        {"tool": "deploy", "policy": "reject"},
    )
    prod = call(rule_list, "deploy", {"environment": "production"})
    assert (prod.policy, prod.rule, prod.reason) == ("reject", 0, "frozen")
    dev = call(rule_list, "deploy", {"environment": "dev"})
    assert (dev.policy, dev.rule) == ("approve_before_run", 1)
    other = call(rule_list, "status", default_policy="approve_before_run")
    assert (other.policy, other.rule) == ("run_now", 2)


@pytest.mark.parametrize(
    ("glob", "name", "hit"),
    [
        ("deploy", "deploy", True),
        ("deploy", "deploy_api", False),
        ("deploy", "Deploy", False),  # case-sensitive
        ("Deploy", "deploy", False),
        ("deploy*", "deploy", True),
        ("deploy*", "deploy_api", True),
        ("*", "anything", True),
        ("mcp__grafana__*", "mcp__grafana__query", True),
        ("mcp__grafana__*", "mcp__grafana", False),
        ("mcp__grafana__*", "mcp__grafana2__query", False),
        ("mcp__*__delete*", "mcp__kube__delete_pod", True),
        ("mcp__*", "mcp__a__b", True),
        ("mcp_?_x", "mcp_a_x", True),
        ("mcp_?_x", "mcp_ab_x", False),
        ("restart_[aw]*", "restart_api", True),
        ("restart_[!aw]*", "restart_api", False),
        ("restart_[!aw]*", "restart_db", True),
        ("restart_[", "restart_[", True),  # an unclosed [ is literal
        ("*_service", "restart_service", True),
        ("", "", True),
    ],
)
def test_globs(glob, name, hit):
    rule = PolicyRule.model_construct(tool=glob, policy="run_now")
    assert matches(rule, name) is hit


@pytest.mark.parametrize(
    ("arguments", "decided_by_rule"),
    [
        ({"environment": "production"}, True),
        ({"environment": "production", "service": "api"}, True),
        ({"environment": "staging"}, False),
        ({"environment": "Production"}, False),
        ({"service": "api"}, False),  # required
        ({}, False),
        ({"environment": ["production"]}, False),
    ],
)
def test_when_holds_only_for_matching_arguments(arguments, decided_by_rule):
    rule_list = rules({"tool": "deploy", "when": PROD, "policy": "approve_before_run"})
    got = call(rule_list, "deploy", arguments, default_policy="run_now")
    assert (got.rule == 0) is decided_by_rule
    assert got.policy == ("approve_before_run" if decided_by_rule else "run_now")


# --- no rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "default_policy", "expected"),
    [
        ("module:acme", "run_now", "run_now"),
        ("module:acme", "wait_for_external_event", "wait_for_external_event"),
        ("module:acme", "approve_before_run", "approve_before_run"),
        ("mcp:grafana", "run_now", "approve_before_run"),
        ("http", "run_now", "approve_before_run"),
        ("httpx", "run_now", "run_now"),
    ],
)
def test_no_rule_leaves_the_tools_own_policy(source, default_policy, expected):
    got = call(
        rules({"tool": "other", "policy": "reject"}),
        "t",
        source=source,
        default_policy=default_policy,
    )
    assert (got.policy, got.rule, got.idempotent) == (expected, None, None)
    assert got.reviewers == DEFAULTS.reviewers and got.expires_in_s == DEFAULTS.expires_in_s


# --- channels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("channels", "channel", "reason"),
    [
        (["C0OPS"], "C0OPS", ""),
        (["C0OPS"], "C0DEV", "restart_service may be used only in <#C0OPS>"),
        (["C0OPS"], None, "restart_service may be used only in <#C0OPS>"),
        (["C0OPS", "C0SRE"], "C0SRE", ""),
        (["C0OPS", "C0SRE"], "D0DM", "restart_service may be used only in <#C0OPS> or <#C0SRE>"),
        (
            ["C1AA", "C2BB", "C3CC"],
            "C4",
            "restart_service may be used only in <#C1AA>, <#C2BB> or <#C3CC>",
        ),
    ],
)
def test_channels_restrict_where_a_tool_may_be_used(channels, channel, reason):
    rule_list = rules({"tool": "restart_service", "policy": "run_now", "channels": channels})
    got = call(rule_list, "restart_service", channel=channel)
    assert (got.policy, got.reason, got.rule) == ("reject" if reason else "run_now", reason, 0)


def test_a_reject_without_a_reason_still_says_why():
    got = call(rules({"tool": "drop_*", "policy": "reject"}), "drop_db")
    assert got.reason == "the policy does not allow drop_db"


# --- MCP hints ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "hints", "policy", "idempotent"),
    [
        # without trust_hints nothing lowers a policy
        ({"policy": "approve_before_run"}, {"readOnlyHint": True}, "approve_before_run", None),
        ({"policy": "approve_before_run"}, {"idempotentHint": True}, "approve_before_run", None),
        # with it, a read-only, non-destructive tool runs now and may re-run
        (
            {"policy": "approve_before_run", "trust_hints": True},
            {"readOnlyHint": True},
            "run_now",
            True,
        ),
        (
            {"policy": "approve_before_run", "trust_hints": True},
            {"readOnlyHint": True, "destructiveHint": True},
            "approve_before_run",
            None,
        ),
        (
            {"policy": "approve_before_run", "trust_hints": True},
            {"readOnlyHint": "true"},  # only a real true counts
            "approve_before_run",
            None,
        ),
        (
            {"policy": "approve_before_run", "trust_hints": True},
            {"idempotentHint": True},
            "approve_before_run",
            True,
        ),
        ({"policy": "approve_before_run", "trust_hints": True}, {}, "approve_before_run", None),
        # hints never lower a reject or a wait, and the rule's idempotent wins
        ({"policy": "reject", "trust_hints": True}, {"readOnlyHint": True}, "reject", True),
        (
            {"policy": "wait_for_external_event", "trust_hints": True},
            {"readOnlyHint": True},
            "wait_for_external_event",
            True,
        ),
        (
            {"policy": "approve_before_run", "trust_hints": True, "idempotent": False},
            {"readOnlyHint": True, "idempotentHint": True},
            "run_now",
            False,
        ),
        ({"policy": "run_now", "trust_hints": True}, {"destructiveHint": True}, "run_now", None),
    ],
)
def test_hints_count_only_with_trust_hints(rule, hints, policy, idempotent):
    got = call(
        rules({"tool": "mcp__kube__*", **rule}),
        "mcp__kube__pods_list",
        source="mcp:kube",
        annotations=hints,
    )
    assert (got.policy, got.idempotent) == (policy, idempotent)


def test_hints_without_a_rule_never_lower_an_mcp_tool():
    got = call([], "mcp__kube__pods_list", source="mcp:kube", annotations={"readOnlyHint": True})
    assert (got.policy, got.idempotent) == ("approve_before_run", None)


def test_channels_win_over_trusted_hints():
    rule_list = rules(
        {"tool": "t", "policy": "approve_before_run", "trust_hints": True, "channels": ["C0OPS"]}
    )
    got = call(rule_list, "t", channel="C0DEV", annotations={"readOnlyHint": True})
    assert got.policy == "reject"


# --- offered ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "tool", "shown"),
    [
        ([], "t", True),
        ([{"tool": "t", "policy": "reject"}], "t", False),
        ([{"tool": "t*", "policy": "reject"}], "tool", False),
        ([{"tool": "t", "policy": "reject"}], "u", True),
        ([{"tool": "t", "policy": "reject", "when": PROD}], "t", True),  # conditional
        (
            [{"tool": "t", "policy": "reject", "when": PROD}, {"tool": "t", "policy": "reject"}],
            "t",
            False,
        ),
        ([{"tool": "t", "policy": "run_now"}, {"tool": "t", "policy": "reject"}], "t", True),
        (
            [{"tool": "*", "policy": "approve_before_run"}, {"tool": "t", "policy": "reject"}],
            "t",
            True,
        ),
        ([{"tool": "t", "policy": "reject", "channels": ["C0OPS"]}], "t", False),
    ],
)
def test_offered(raw, tool, shown):
    assert offered(rules(*raw), tool) is shown


def test_a_conditional_reject_answers_the_call_with_its_reason():
    rule_list = rules(
        {"tool": "deploy", "when": PROD, "policy": "reject", "reason": "Use the pipeline."}
    )
    assert offered(rule_list, "deploy")
    got = call(rule_list, "deploy", {"environment": "production"})
    assert (got.policy, got.reason) == ("reject", "Use the pipeline.")


# --- quorum -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("votes", "quorum", "requester", "met"),
    [
        ([], 1, "U0REQ", False),
        (["U0A"], 1, "U0REQ", True),
        (["U0A"], 2, "U0REQ", False),
        (["U0A", "U0A"], 2, "U0REQ", False),  # distinct people
        (["U0A", "U0B"], 2, "U0REQ", True),
        (["U0REQ"], 1, "U0REQ", False),  # the requester never counts
        (["U0REQ", "U0A"], 2, "U0REQ", False),
        (["U0REQ", "U0A", "U0B"], 2, "U0REQ", True),
        (["U0A", "U0B", "U0C"], 2, None, True),
    ],
)
def test_quorum_counts_distinct_approvers_not_the_requester(votes, quorum, requester, met):
    assert ReviewerRule(quorum=quorum).met(votes, requester) is met


def test_self_approval_counts_the_requester_once_when_allowed():
    assert ReviewerRule(allow_self=True).met(["U0REQ"], "U0REQ")
    assert not ReviewerRule(quorum=2, allow_self=True).met(["U0REQ", "U0REQ"], "U0REQ")


# --- compare ------------------------------------------------------------------------------

SRE = ReviewerRule(frozenset({"S0SRE"}), quorum=2)
APPROVE = RuleDecision(policy="approve_before_run", reviewers=SRE)


def approve(**changes: Any) -> RuleDecision:
    """APPROVE with reviewer fields (approvers, quorum, allow_self, rule) or its own changed."""
    mine = {
        k: changes.pop(k)
        for k in list(changes)
        if k in ("approvers", "quorum", "allow_self", "rule")
    }
    return RuleDecision(**{**APPROVE.__dict__, "reviewers": replace(SRE, **mine), **changes})


@pytest.mark.parametrize(
    ("recorded", "new", "expected"),
    [
        (APPROVE, APPROVE, "same"),
        (APPROVE, approve(rule=7, reason="x"), "same"),
        (
            RuleDecision(policy="run_now"),
            RuleDecision(policy="wait_for_external_event"),
            "stricter",
        ),
        (
            RuleDecision(policy="wait_for_external_event"),
            RuleDecision(policy="approve_before_run"),
            "stricter",
        ),
        (APPROVE, RuleDecision(policy="reject"), "stricter"),
        (RuleDecision(policy="reject"), APPROVE, "looser"),
        (APPROVE, RuleDecision(policy="run_now"), "looser"),
        (
            RuleDecision(policy="approve_before_run"),
            RuleDecision(policy="wait_for_external_event"),
            "looser",
        ),
        # approvals: wider / emptied approvers, lower quorum, self on, longer expiry or grant
        (APPROVE, approve(approvers=frozenset({"S0SRE", "U0X"})), "looser"),
        (APPROVE, approve(approvers=frozenset()), "looser"),
        (approve(approvers=frozenset()), APPROVE, "stricter"),
        (approve(approvers=frozenset({"S0SRE", "U0X"})), APPROVE, "stricter"),
        (APPROVE, approve(approvers=frozenset({"S0DBA"})), "different"),
        (APPROVE, approve(quorum=1), "looser"),
        (APPROVE, approve(quorum=3), "stricter"),
        (APPROVE, approve(allow_self=True), "looser"),
        (APPROVE, approve(expires_in_s=10**6), "looser"),
        (APPROVE, approve(expires_in_s=60.0), "stricter"),
        (APPROVE, approve(max_grant_s=3600.0), "looser"),
        (approve(max_grant_s=3600.0), APPROVE, "stricter"),
        (APPROVE, approve(idempotent=True), "same"),  # None: tool's own
        (approve(idempotent=False), approve(idempotent=True), "looser"),
        # mixed: looser one way, stricter another
        (APPROVE, approve(quorum=3, allow_self=True), "different"),
        # approval details do not matter once the policy itself changes
        (APPROVE, RuleDecision(policy="reject"), "stricter"),
    ],
)
def test_compare(recorded, new, expected):
    assert compare(recorded, new) == expected


# --- purity -------------------------------------------------------------------------------


def test_rules_import_no_io_library():
    code = "import engine.rules, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = {name.partition(".")[0] for name in json.loads(out.stdout)}
    assert "engine" in loaded
    forbidden = {
        "sqlalchemy",
        "sqlmodel",
        "slack_sdk",
        "slack_bolt",
        "aiohttp",
        "asyncpg",
        "aiosqlite",
        "anthropic",
        "apscheduler",
        "bot",
    }
    assert not loaded & forbidden


# --- PolicySet: what the runner is handed ------------------------------------------------


class _Facts:
    def __init__(self, name: str, policy: str = "run_now", source: str = "module:acme") -> None:
        self.name, self.policy, self.source, self.annotations = name, policy, source, {}


def test_an_empty_policy_set_is_the_behaviour_of_the_environment_alone() -> None:
    from engine.rules import Defaults, PolicySet

    policy = PolicySet(defaults=Defaults(ReviewerRule(frozenset({"S0SRE"})), 3600.0))
    d = policy.decide(_Facts("deploy", "approve_before_run"), {}, "C1")
    assert (d.policy, d.rule, d.reviewers.approvers, d.reviewers.quorum, d.expires_in_s) == (
        "approve_before_run",
        None,
        frozenset({"S0SRE"}),
        1,
        3600.0,
    )
    assert policy.decide(_Facts("search_docs"), {}, None).policy == "run_now"
    assert policy.decide(_Facts("mcp__k__pods", source="mcp:k"), {}, None).policy == (
        "approve_before_run"
    )
    assert policy.offered("anything") and policy.policy_hash is None
