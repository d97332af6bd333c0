"""The ``policy:`` rules of ``opsloop.yaml``: which rule decides a call, and how.

:func:`decide` takes the first rule whose ``tool`` glob matches the tool's name (fnmatch,
case-sensitive) and whose ``when`` holds for the arguments, and turns it into a
:class:`RuleDecision`. With no rule, the tool's own ``@tool`` policy decides, except for
MCP tools and HTTP actions, which need an approval.

MCP annotations are the server's claims, so they never lower a policy by themselves.
Only a deciding rule with ``trust_hints: true`` lets them: ``readOnlyHint: true``
without ``destructiveHint: true`` turns ``approve_before_run`` into ``run_now`` (never a
``reject`` or a wait) and makes the call idempotent; ``idempotentHint: true`` makes it
idempotent. A rule's own ``idempotent:`` wins over either hint.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Protocol

from engine.config_file import PolicyRule, RulePolicy
from engine.config_file import rule_name as rule_name  # re-exported: what prints a rule's number
from engine.reviewers import Comparison, ReviewerRule, direction

# Strictness, loosest first: what `opsloop policy check` compares.
_ORDER: dict[str, int] = {
    "run_now": 0,
    "wait_for_external_event": 1,
    "approve_before_run": 2,
    "reject": 3,
}
DEFAULT_EXPIRES_IN_S = 24 * 3600.0


@dataclass(frozen=True)
class Defaults:
    """The effective ``approvals:`` defaults (file values with the environment laid over:
    ``settings.reviewers`` and ``settings.runner.approval_ttl_s``)."""

    reviewers: ReviewerRule = field(default_factory=ReviewerRule)
    expires_in_s: float = DEFAULT_EXPIRES_IN_S


@dataclass(frozen=True)
class RuleDecision:
    """What the policy says about one call: its policy and who may decide it (with the
    deciding rule's 0-based index, None when no rule matched, shown to people as
    :func:`rule_name` numbers it); ``idempotent`` None means the tool's own."""

    policy: RulePolicy
    reviewers: ReviewerRule = field(default_factory=ReviewerRule)
    reason: str = ""
    expires_in_s: float = DEFAULT_EXPIRES_IN_S
    remind_after_s: float | None = None
    escalate_to: tuple[str, ...] = ()
    max_grant_s: float | None = None
    idempotent: bool | None = None
    trust_hints: bool = False

    @property
    def rule(self) -> int | None:
        return self.reviewers.rule


class ToolFacts(Protocol):
    """What the rules read of a tool (a :class:`tools.Tool` fits)."""

    # Read-only members, so a tool whose policy is a narrower Literal still fits.
    @property
    def name(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def annotations(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class PolicySet:
    """The policy a process enforces: the file's rules (none without a file), the
    effective approval defaults and the file's hash (None without a file). With no
    rules it gives every tool its own ``@tool`` policy and the global approvers, which
    is the behaviour of the environment variables alone."""

    rules: tuple[PolicyRule, ...] = ()
    defaults: Defaults = Defaults()
    policy_hash: str | None = None

    def decide(
        self, tool: ToolFacts, arguments: Mapping[str, Any], channel: str | None
    ) -> RuleDecision:
        return decide(
            self.rules,
            self.defaults,
            tool=tool.name,
            arguments=arguments,
            default_policy=tool.policy,
            source=tool.source,
            channel=channel,
            annotations=tool.annotations,
        )

    def offered(self, name: str) -> bool:
        return offered(self.rules, name)

    def withheld(self, name: str) -> RuleDecision | None:
        """The reject of a tool that is not offered (its first rule without ``when`` is
        ``reject``): a call the model makes anyway is answered with the rule's reason."""
        for index, rule in enumerate(self.rules):
            if rule.when is None and matches(rule, name):
                if rule.policy != "reject":
                    return None
                reason = rule.reason or f"the policy does not allow {name}"
                return RuleDecision("reject", ReviewerRule(rule=index), reason)
        return None


def matches(rule: PolicyRule, tool: str) -> bool:
    return fnmatchcase(tool, rule.tool)


def decide(
    rules: Sequence[PolicyRule],
    defaults: Defaults,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    default_policy: str,
    source: str,
    channel: str | None,
    annotations: Mapping[str, Any] | None,
) -> RuleDecision:
    """The decision for calling ``tool`` with ``arguments`` in ``channel``."""
    for index, rule in enumerate(rules):
        if matches(rule, tool) and rule.holds(arguments):
            return _from_rule(index, rule, defaults, tool, channel, annotations or {})
    outside = source.startswith("mcp:") or source == "http"
    policy = "approve_before_run" if outside else default_policy
    if policy not in _ORDER:
        raise ValueError(f"unknown policy {policy!r} for {tool!r}")  # a bug in the caller
    return RuleDecision(
        policy=policy,  # type: ignore[arg-type]
        reviewers=defaults.reviewers,
        expires_in_s=defaults.expires_in_s,
    )


def _from_rule(
    index: int,
    rule: PolicyRule,
    defaults: Defaults,
    tool: str,
    channel: str | None,
    hints: Mapping[str, Any],
) -> RuleDecision:
    policy: RulePolicy = rule.policy
    idempotent = rule.idempotent
    if rule.trust_hints:
        read_only = hints.get("readOnlyHint") is True and hints.get("destructiveHint") is not True
        if read_only and policy == "approve_before_run":
            policy = "run_now"
        if idempotent is None and (read_only or hints.get("idempotentHint") is True):
            idempotent = True
    reason = rule.reason or (f"the policy does not allow {tool}" if policy == "reject" else "")
    if rule.channels and channel not in rule.channels:
        policy, reason = "reject", f"{tool} may be used only in {_places(rule.channels)}"
    default = defaults.reviewers
    reviewers = ReviewerRule(
        approvers=default.approvers if rule.approvers is None else frozenset(rule.approvers),
        quorum=rule.quorum or 1,
        allow_self=default.allow_self if rule.allow_self is None else rule.allow_self,
        rule=index,
    )
    return RuleDecision(
        policy=policy,
        reviewers=reviewers,
        reason=reason,
        expires_in_s=rule.expires_in or defaults.expires_in_s,
        remind_after_s=rule.remind_after,
        escalate_to=tuple(dict.fromkeys(rule.escalate_to or ())),
        max_grant_s=rule.max_grant,
        idempotent=idempotent,
        trust_hints=bool(rule.trust_hints),
    )


def _places(channels: Sequence[str]) -> str:
    """``<#C1>``, ``<#C1> or <#C2>``, ``<#C1>, <#C2> or <#C3>`` (Slack channel links)."""
    links = [f"<#{c}>" for c in dict.fromkeys(channels)]
    return links[0] if len(links) == 1 else f"{', '.join(links[:-1])} or {links[-1]}"


def offered(rules: Sequence[PolicyRule], tool: str) -> bool:
    """Is ``tool`` shown to the model? Not when its first matching rule without ``when``
    is ``reject`` (a conditional reject answers the call instead, so it stays offered)."""
    for rule in rules:
        if rule.when is None and matches(rule, tool):
            return rule.policy != "reject"
    return True


# --- policy check ---------------------------------------------------------------------------


def compare(old: RuleDecision, new: RuleDecision) -> Comparison:
    """How ``new`` differs from the decision ``old`` made for a call.

    Looser: a looser policy (run_now < wait_for_external_event < approve_before_run <
    reject) or, when both need an approval, reviewers that let more people decide
    (:meth:`ReviewerRule.compared_to`), a longer expiry or grant, idempotent turning on.
    ``different``: some ways looser and some stricter, or approvers neither wider nor
    narrower; treat it as needing a look, since it may hide a loosening.
    """
    steps = {direction(_ORDER[new.policy] - _ORDER[old.policy])}
    if old.policy == new.policy == "approve_before_run":
        steps |= new.reviewers.compared_to(old.reviewers)
        steps.add(direction(old.expires_in_s - new.expires_in_s))
        if old.max_grant_s is None or new.max_grant_s is None:
            # None: no grants at all, the strictest.
            steps.add(direction((old.max_grant_s is not None) - (new.max_grant_s is not None)))
        else:
            steps.add(direction(old.max_grant_s - new.max_grant_s))
    if old.idempotent is not None and new.idempotent is not None:
        steps.add(direction(int(old.idempotent) - int(new.idempotent)))
    steps.discard("same")
    if not steps:
        return "same"
    return steps.pop() if len(steps) == 1 else "different"
