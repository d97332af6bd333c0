"""Deterministic rules: what a model decision means (who may decide a call is
``engine/reviewers.py``).

The model proposes an intent; this code decides: run now, approve before running, wait
for an external event, or reject. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from engine.events import CLARIFICATION_TOOL, Policy
from engine.models.base import Decision
from engine.rules import PolicySet, RuleDecision
from tools.schemas import instance_too_large

# "reject" is a decision the model got wrong (validation); "refuse" a valid call the
# policy refuses (a rule's reject, a channel it may not be used in): recorded as
# tool_call_requested(policy="reject") with the reason.
Kind = Literal[
    "final",
    "clarify",
    "run_now",
    "approve_before_run",
    "wait_for_external_event",
    "reject",
    "refuse",
]


class ToolLike(Protocol):
    name: str
    policy: Policy
    source: str
    annotations: dict[str, Any]

    def parse_arguments(self, arguments: dict[str, Any]) -> BaseModel: ...


class Registry(Protocol):
    def get(self, name: str) -> ToolLike | None: ...
    def names(self) -> list[str]: ...


_CUT_OFF = frozenset({"max_tokens", "model_context_window_exceeded", "pause_turn"})


@dataclass(frozen=True)
class Verdict:
    kind: Kind
    reason: str = ""
    # For a valid call: what the policy decided (its rule, approvers, quorum, …).
    rule: RuleDecision | None = None


def classify(
    decision: Decision,
    registry: Registry,
    policies: PolicySet | None = None,
    channel: str | None = None,
) -> Verdict:
    """Validate one decision and classify it; a valid call is decided by ``policies``
    (None: the tool's own policy, as before a policy file) in ``channel``."""
    use = decision.tool_use
    if decision.stop_reason in _CUT_OFF:
        # A tool call in a reply that was cut off may be partial: never execute it.
        why = f"the reply was cut off ({decision.stop_reason}); nothing was executed"
        return Verdict("reject", why)
    if decision.stop_reason == "refusal":
        return Verdict("reject", "the model refused to continue")
    if use is None:
        if decision.text.strip():
            return Verdict("final")
        return Verdict("reject", "the reply was empty")
    if use.name == CLARIFICATION_TOOL:
        question = use.input.get("question")
        if isinstance(question, str) and question.strip() and set(use.input) == {"question"}:
            return Verdict("clarify")
        return Verdict("reject", 'request_clarification takes {"question": "<text>"}')
    tool = registry.get(use.name)
    offered = policies.offered if policies is not None else (lambda name: True)
    withheld = policies.withheld(use.name) if policies is not None else None
    if withheld is not None:
        # Not offered, called anyway (seen in an earlier turn, or invented): the rule's
        # reason, so the model learns why instead of trying again.
        return Verdict("refuse", withheld.reason, withheld)
    if tool is None or not offered(use.name):
        known = ", ".join([*(n for n in registry.names() if offered(n)), CLARIFICATION_TOOL])
        return Verdict("reject", f"unknown tool {use.name!r}; the tools are: {known}")
    if (too_large := instance_too_large(use.input)) is not None:
        return Verdict("reject", f"arguments for {use.name!r} are invalid: {too_large}")
    try:
        tool.parse_arguments(use.input)
    except ValidationError as exc:
        return Verdict("reject", f"arguments for {use.name!r} are invalid: {_first_error(exc)}")
    except Exception as exc:  # a schema that cannot be evaluated must not loop the thread
        return Verdict("reject", f"arguments for {use.name!r} could not be checked: {_one(exc)}")
    if policies is None:
        return Verdict(tool.policy)
    try:
        rule = policies.decide(tool, use.input, channel)
    except Exception as exc:  # a rule's `when` that cannot be evaluated: refused, not retried
        return Verdict("reject", f"the policy could not decide {use.name!r}: {_one(exc)}")
    if rule.policy == "reject":
        return Verdict("refuse", rule.reason, rule)
    return Verdict(rule.policy, rule=rule)


def _one(exc: BaseException) -> str:
    """An unexpected exception as one short line (its type when it says nothing)."""
    text = " ".join(str(exc).split())[:200]
    return text or type(exc).__name__


def _first_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "(input)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def arguments_hash(intent: str, arguments: dict[str, Any]) -> str:
    """Binds an approval to the exact call: same tool, same arguments."""
    canon = json.dumps([intent, arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:32]
