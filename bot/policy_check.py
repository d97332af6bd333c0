"""``opsloop policy check``: the dry run a team does before changing its policy.

Every recorded ``tool_call_requested`` (of the threads named, else all; with ``--since``,
only calls made since then) is decided again by the candidate file's rules, with the
call's tool, arguments and thread channel, and compared with what was recorded. A call
whose rule, policy, approvers or quorum would differ is listed with how
(``engine.rules.compare``); ``looser`` and ``different`` (some ways looser, some
stricter: it may hide a loosening) fail the check.

What the rules read of a tool comes from the tools this process loads (its modules and
the candidate file's HTTP actions); an MCP tool's server is not asked, so its hints are
taken at their loosest (read-only, idempotent), which a ``trust_hints`` rule may turn
into a looser decision: a loosening is never hidden by a server that is down. A call
of a tool that is none of these, which no rule of the file would decide and a rule
decided when it was made, is ``not judged``: its own ``@tool`` policy would decide it,
and that is not known here (never assumed).

Calls decided by another rule to the same effect (``rule 3 -> rule 4``: ``same``) are
listed but are not "decided differently".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from engine import events as ev
from engine.config_file import ConfigFile
from engine.rules import Comparison, PolicySet, RuleDecision, compare
from engine.store import Store
from engine.types import ThreadInfo
from tools import ToolRegistry

FAILING: frozenset[str] = frozenset({"looser", "different"})
NotJudged = Literal["not judged"]
NOT_JUDGED: NotJudged = "not judged"
LOOSEST_HINTS: dict[str, Any] = {"readOnlyHint": True, "idempotentHint": True}


@dataclass(frozen=True)
class _Facts:
    """What the rules read of a tool this process does not have loaded."""

    name: str
    policy: str
    source: str
    annotations: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    thread: ThreadInfo
    call: ev.ToolCallRequested
    new: RuleDecision
    comparison: Comparison | NotJudged

    @property
    def fails(self) -> bool:
        return self.comparison in FAILING

    @property
    def changed(self) -> bool:
        """Decided otherwise: not only by another rule to the same effect, and judged."""
        return self.comparison not in ("same", NOT_JUDGED)

    def line(self) -> str:
        call, new = self.call, self.new
        if self.comparison == NOT_JUDGED:
            return (
                f"{self.thread.id} seq={call.seq} {call.intent}: {call.policy} "
                f"({_rule(call.rule)}) -> no rule: {call.intent} is not a tool loaded here, "
                f"so the policy it would get of its own is unknown: {NOT_JUDGED}"
            )
        changes = []
        if (call.policy, call.rule) != (new.policy, new.rule):
            changes.append(
                f"{call.policy} ({_rule(call.rule)}) -> {new.policy} ({_rule(new.rule)})"
            )
        else:
            changes.append(f"{new.policy} ({_rule(new.rule)})")
        needs_approval = "approve_before_run" in (call.policy, new.policy)
        old = call.reviewers
        if needs_approval and old is not None and old.approvers != new.reviewers.approvers:
            changes.append(
                f"approvers {_people(old.approvers)} -> {_people(new.reviewers.approvers)}"
            )
        if needs_approval and call.quorum != new.reviewers.quorum:
            changes.append(f"quorum {call.quorum} -> {new.reviewers.quorum}")
        return (
            f"{self.thread.id} seq={call.seq} {call.intent}: {', '.join(changes)}: "
            f"{self.comparison}"
        )


def _rule(index: int | None) -> str:
    return "no rule" if index is None else f"rule {index + 1}"


def _people(ids: Sequence[str] | frozenset[str]) -> str:
    return ",".join(sorted(ids)) or "anyone"


def tool_facts(name: str, tools: ToolRegistry, config: ConfigFile | None) -> Any:
    """The registered tool, else what its name and the file say of it."""
    tool = tools.get(name)
    if tool is not None:
        return tool
    if config is not None and name in config.tools.http:
        return _Facts(name, "approve_before_run", "http")
    if name.startswith("mcp__") and name.count("__") >= 2:
        server = name.split("__")[1]
        return _Facts(name, "approve_before_run", f"mcp:{server}", LOOSEST_HINTS)
    # A tool no longer loaded: judged by its name alone, with the policy it had.
    return None


def differs(call: ev.ToolCallRequested, new: RuleDecision) -> bool:
    """Would the rule, policy, approvers or quorum of ``call`` differ? Approvers and
    quorum count only for a call that needs (or needed) an approval."""
    if call.rule != new.rule or call.policy != new.policy:
        return True
    if new.policy != "approve_before_run":
        return False
    old = call.reviewers
    return (
        old is not None and old.approvers != new.reviewers.approvers
    ) or call.quorum != new.reviewers.quorum


def check_call(
    thread: ThreadInfo,
    call: ev.ToolCallRequested,
    policy: PolicySet,
    tools: ToolRegistry,
    config: ConfigFile | None,
) -> Finding | None:
    facts = tool_facts(call.intent, tools, config)
    if facts is None:
        # A tool not loaded here: a rule that matches decides without it. With no rule,
        # its own @tool policy would, which is known only if no rule decided the call
        # then either (the file cannot change it); else it is named, never assumed.
        own = call.policy if call.rule is None and call.policy != "reject" else None
        new = policy.decide(
            _Facts(call.intent, own or "approve_before_run", "module:?"),
            call.arguments,
            thread.channel,
        )
        if new.rule is None and own is None:
            return Finding(thread, call, new, NOT_JUDGED)
    else:
        new = policy.decide(facts, call.arguments, thread.channel)
    if not differs(call, new):
        return None
    return Finding(thread, call, new, compare(recorded(call, new), new))


def recorded(call: ev.ToolCallRequested, new: RuleDecision) -> RuleDecision:
    """The decision ``call`` records, for comparing with ``new``. What a call does not
    record (its expiry and grant, its reviewers in logs from before they were recorded,
    whether the tool's own idempotency was overridden) is taken from ``new``, so it
    compares as unchanged."""
    return RuleDecision(
        policy=call.policy,
        reviewers=call.reviewers or new.reviewers,
        reason=call.reason,
        expires_in_s=new.expires_in_s,
        max_grant_s=new.max_grant_s,
        idempotent=None if new.idempotent is None else call.idempotent,
    )


async def check_threads(
    store: Store,
    policy: PolicySet,
    tools: ToolRegistry,
    config: ConfigFile | None,
    *,
    threads: Sequence[str] = (),
    since: datetime | None = None,
) -> tuple[int, list[Finding]]:
    """(calls checked, the calls that would differ), oldest thread first."""
    if threads:
        infos = [await store.resolve_thread(ref) for ref in threads]
    else:
        infos = list(reversed(await store.list_threads(limit=1_000_000)))
    checked, findings = 0, []
    for info in infos:
        for event in await store.select_events(info.id):
            if not isinstance(event, ev.ToolCallRequested):
                continue
            if since is not None and event.created_at < since:
                continue
            checked += 1
            finding = check_call(info, event, policy, tools, config)
            if finding is not None:
                findings.append(finding)
    return checked, findings
