"""Policy: what a model decision means, who may decide an approval, and the hash that
binds an approval to one exact call."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from engine.events import CLARIFICATION_TOOL
from engine.models.base import Decision, ToolUse
from engine.policy import arguments_hash, classify
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
