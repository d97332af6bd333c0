"""Policy: what a model decision means, who may decide an approval, and the hash that
binds an approval to one exact call."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from engine.config import approver_policy
from engine.errors import ConfigError
from engine.events import CLARIFICATION_TOOL
from engine.models.base import Decision, ToolUse
from engine.policy import ApproverPolicy, arguments_hash, classify
from tools import ToolContext, ToolRegistry, tool

REGISTRY = ToolRegistry()


class LookupArgs(BaseModel):
    q: str


class DeployArgs(BaseModel):
    service: str
    replicas: int = Field(ge=1)


class BuildArgs(BaseModel):
    ref: str


@tool(registry=REGISTRY)
async def lookup(args: LookupArgs, ctx: ToolContext) -> dict:
    """Look something up."""
    return {}


@tool(policy="approve_before_run", registry=REGISTRY)
async def deploy(args: DeployArgs, ctx: ToolContext) -> dict:
    """Deploy a service."""
    return {}


@tool(policy="wait_for_external_event", registry=REGISTRY)
async def build(args: BuildArgs, ctx: ToolContext) -> dict:
    """Start a build and wait for it."""
    return {}


def use(
    tool_name: str, /, stop_reason: str = "tool_use", text: str = "", **arguments: object
) -> Decision:
    return Decision(
        text=text, tool_use=ToolUse("toolu_1", tool_name, dict(arguments)), stop_reason=stop_reason
    )


# --- classify --------------------------------------------------------------------------


def test_text_without_tool_use_is_final() -> None:
    verdict = classify(Decision(text="All done."), REGISTRY)
    assert (verdict.kind, verdict.reason) == ("final", "")


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_reply_is_rejected(text: str) -> None:
    verdict = classify(Decision(text=text), REGISTRY)
    assert verdict.kind == "reject"
    assert "empty" in verdict.reason


@pytest.mark.parametrize("decision_text", ["", "partial"])
def test_reply_cut_at_max_tokens_is_never_executed(decision_text: str) -> None:
    cut = use("deploy", stop_reason="max_tokens", text=decision_text, service="api", replicas=1)
    verdict = classify(cut, REGISTRY)
    assert verdict.kind == "reject"
    assert "max_tokens" in verdict.reason
    assert classify(Decision(text="half an answ", stop_reason="max_tokens"), REGISTRY).kind == (
        "reject"
    )


def test_refusal_is_rejected() -> None:
    verdict = classify(Decision(text="I can't help with that.", stop_reason="refusal"), REGISTRY)
    assert verdict.kind == "reject"
    assert "refused" in verdict.reason


def test_unknown_tool_is_rejected_naming_it_and_the_known_tools() -> None:
    verdict = classify(use("drop_database", name="prod"), REGISTRY)
    assert verdict.kind == "reject"
    assert "'drop_database'" in verdict.reason
    for known in ("lookup", "deploy", "build", CLARIFICATION_TOOL):
        assert known in verdict.reason


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({}, "service"),
        ({"service": "api", "replicas": 0}, "replicas"),
        ({"service": "api", "replicas": "many"}, "replicas"),
        ({"service": ["api"], "replicas": 1}, "service"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_field(arguments: dict, field: str) -> None:
    verdict = classify(use("deploy", **arguments), REGISTRY)
    assert verdict.kind == "reject"
    assert "'deploy'" in verdict.reason
    assert field in verdict.reason


def test_valid_clarification() -> None:
    verdict = classify(use(CLARIFICATION_TOOL, question="Which environment?"), REGISTRY)
    assert verdict.kind == "clarify"


@pytest.mark.parametrize(
    "arguments",
    [{}, {"question": ""}, {"question": "  "}, {"question": 42}, {"question": "ok?", "extra": 1}],
)
def test_invalid_clarification_is_rejected(arguments: dict) -> None:
    verdict = classify(use(CLARIFICATION_TOOL, **arguments), REGISTRY)
    assert verdict.kind == "reject"
    assert CLARIFICATION_TOOL in verdict.reason


@pytest.mark.parametrize(
    ("name", "arguments", "kind"),
    [
        ("lookup", {"q": "runbook"}, "run_now"),
        ("deploy", {"service": "api", "replicas": 2}, "approve_before_run"),
        ("build", {"ref": "main"}, "wait_for_external_event"),
    ],
)
def test_valid_call_gets_its_tool_policy(name: str, arguments: dict, kind: str) -> None:
    verdict = classify(use(name, **arguments), REGISTRY)
    assert (verdict.kind, verdict.reason) == (kind, "")


# --- ApproverPolicy ------------------------------------------------------------------------


def test_empty_list_lets_anyone_but_the_requester_approve() -> None:
    policy = ApproverPolicy()
    assert policy.check("approve", "U2", requester="U1") is None
    assert policy.check("reject", "U3", requester="U1") is None
    why = policy.check("approve", "U1", requester="U1")
    assert why is not None and "self-approval" in why
    assert policy.is_approver("U_ANYONE")


def test_self_approval_flag_lets_the_requester_approve() -> None:
    assert ApproverPolicy(allow_self=True).check("approve", "U1", requester="U1") is None
    listed = ApproverPolicy(frozenset({"U1"}), allow_self=False)
    assert listed.check("approve", "U1", requester="U1") is not None
    assert ApproverPolicy(frozenset({"U1"}), allow_self=True).check("approve", "U1", "U1") is None


def test_listed_user_ids_may_decide_and_others_may_not() -> None:
    policy = ApproverPolicy(frozenset({"U_BOSS", "W_ENT"}))
    assert policy.check("approve", "U_BOSS", requester="U1") is None
    assert policy.check("approve", "W_ENT", requester="U1") is None
    for decision in ("approve", "reject"):
        why = policy.check(decision, "U_RANDOM", requester="U1")
        assert why is not None and "approvers list" in why


def test_user_groups_grant_approval_through_membership() -> None:
    policy = ApproverPolicy(frozenset({"S_ONCALL", "U_BOSS"}))
    assert policy.groups == frozenset({"S_ONCALL"})
    assert policy.check("approve", "U7", "U1", reviewer_groups=["S_ONCALL"]) is None
    assert policy.check("approve", "U7", "U1", reviewer_groups={"S_OTHER", "S_ONCALL"}) is None
    assert policy.check("approve", "U7", "U1", reviewer_groups=["S_OTHER"]) is not None
    assert policy.check("approve", "U7", "U1") is not None
    # A group id is not a user id: a user called like the group gains nothing.
    assert not ApproverPolicy(frozenset({"S_ONCALL"})).is_approver("U7", ["U_BOSS"])


def test_requester_may_reject_their_own_call() -> None:
    policy = ApproverPolicy(frozenset({"U_BOSS"}))
    assert policy.check("reject", "U1", requester="U1") is None
    assert policy.check("approve", "U1", requester="U1") is not None


def test_requester_on_the_list_still_needs_self_approval() -> None:
    why = ApproverPolicy(frozenset({"U1"})).check("approve", "U1", requester="U1")
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
    policy = approver_policy(env)
    assert policy == ApproverPolicy(ids, allowed)


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
        approver_policy(env)
    assert variable in str(info.value)


# --- arguments_hash -----------------------------------------------------------------------


def test_arguments_hash_is_stable_and_order_free() -> None:
    a = arguments_hash("deploy", {"service": "api", "replicas": 2, "tags": {"b": 1, "a": 2}})
    b = arguments_hash("deploy", {"tags": {"a": 2, "b": 1}, "replicas": 2, "service": "api"})
    assert a == b
    assert len(a) == 32 and int(a, 16) >= 0
    # Pinned: approval cards and approval_requested events keep it, so it must not drift
    # between releases (a pending approval would become undecidable).
    assert arguments_hash("deploy", {"service": "api"}) == "0d5ba319a59383e0045dc806b7bf12f6"


@pytest.mark.parametrize(
    ("intent", "arguments"),
    [
        ("deploy", {"service": "api", "replicas": 3}),
        ("deploy", {"service": "web", "replicas": 2}),
        ("deploy", {"service": "api", "replicas": "2"}),
        ("deploy", {"service": "api"}),
        ("deploy", {"service": "api", "replicas": 2, "force": True}),
        ("rollback", {"service": "api", "replicas": 2}),
    ],
)
def test_arguments_hash_changes_with_tool_or_arguments(intent: str, arguments: dict) -> None:
    assert arguments_hash(intent, arguments) != arguments_hash(
        "deploy", {"service": "api", "replicas": 2}
    )
