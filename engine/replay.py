"""Replay: the exact request a stored decision was made from, recomputed from the log.

Every ``model_decision`` keeps the hash and version of its prompt, and what its tools
part was built from (the tools' names and the hash of their definitions). Projecting
the events before it again, with that version and those tools, must give the same
bytes; a mismatch is reported with its likely cause, never hidden. A decision offered
tools the replaying process has not loaded cannot be recomputed: that is its own verdict
("tools not loaded here: …"), not a mismatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine import events as ev
from engine.context import KNOWN_VERSIONS, PROJECTION_VERSION, Prompt, ToolSpec, project
from engine.errors import ThreadNotFound


@dataclass(frozen=True)
class Replayed:
    decision: ev.ModelDecision
    prompt: Prompt
    # Tools the decision was offered that the process replaying it has not loaded (a
    # server it cannot reach, a module it does not import): nothing to compare with.
    missing: tuple[str, ...] = ()

    @property
    def matches(self) -> bool:
        return self.prompt.hash == self.decision.prompt_hash

    @property
    def mismatch(self) -> bool:
        """The request was recomputed with every tool it was offered, and differs."""
        return not self.missing and not self.matches

    def verdict(self) -> str:
        d = self.decision
        if self.matches:
            return (
                f"seq {d.seq}: ok (projection {d.projection_version}, sha256 {d.prompt_hash[:12]})"
            )
        if self.missing:
            return (
                f"seq {d.seq}: tools not loaded here: {_names(self.missing)} (the decision was "
                "offered them; without their definitions its request cannot be recomputed)"
            )
        return (
            f"seq {d.seq}: MISMATCH: stored {d.prompt_hash[:12]}, "
            f"recomputed {self.prompt.hash[:12]}: {'; '.join(self.causes())}"
        )

    def causes(self) -> list[str]:
        """Why the recomputed prompt may differ, most likely first."""
        d, p = self.decision, self.prompt
        causes: list[str] = []
        version = d.projection_version or "(none recorded)"
        if d.projection_version not in KNOWN_VERSIONS:
            known = ", ".join(sorted(KNOWN_VERSIONS))
            causes.append(f"made with projection {version}, this code knows {known}")
        if not d.tools_hash:
            causes.append("the decision predates tool fingerprints, so the tools may differ")
        elif tuple(d.tool_names) != p.tool_names:
            here, saw = set(p.tool_names), set(d.tool_names)
            gaps = [
                f"{label}: {_names(names)}"
                for label, names in (("missing here", saw - here), ("new here", here - saw))
                if names
            ]
            causes.append(
                f"the tools differ: this process has {_names(here)}, "
                f"the decision saw {_names(saw)} ({'; '.join(gaps)})"
            )
        elif d.tools_hash != p.tools_hash:
            causes.append(
                "the tools' definitions differ (same names; a description or an argument "
                "schema changed)"
            )
        if not causes:
            causes.append(
                f"same tools and projection {version}: the events before seq {d.seq} were "
                "changed, or the projection code changed without a new version"
            )
        return causes


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def decisions(events: Sequence[ev.Event]) -> list[ev.ModelDecision]:
    return [e for e in events if isinstance(e, ev.ModelDecision)]


def tools_seen(events: Sequence[ev.Event]) -> set[str]:
    """Every tool the thread's decisions were offered or called (older logs: called)."""
    seen: set[str] = set()
    for d in decisions(events):
        seen.update(d.tool_names)
        if d.tool_name and d.tool_name != ev.CLARIFICATION_TOOL:
            seen.add(d.tool_name)
    return seen


def tools_for(decision: ev.ModelDecision, available: Sequence[ToolSpec]) -> list[ToolSpec]:
    """The tools ``decision`` was offered, when this process has them all; else all
    that it has (and the verdict names the difference)."""
    by_name = {t.name: t for t in available}
    if decision.tools_hash and all(n in by_name for n in decision.tool_names):
        return [by_name[n] for n in decision.tool_names]
    return list(available)


def replay(
    events: Sequence[ev.Event], tools: Iterable[ToolSpec], seq: int | None = None
) -> Replayed:
    """The prompt of the decision at ``seq`` (default: the latest), from ``events``."""
    made = decisions(events)
    if not made:
        raise ThreadNotFound("the thread has no model decision to replay")
    if seq is None:
        decision = made[-1]
    else:
        found = [d for d in made if d.seq == seq]
        if not found:
            seqs = ", ".join(str(d.seq) for d in made[-10:])
            raise ThreadNotFound(f"no model decision at seq {seq} (decisions at: {seqs})")
        decision = found[0]
    before = [e for e in events if e.seq < decision.seq]
    available = list(tools)
    offered = tools_for(decision, available)
    version = decision.projection_version or PROJECTION_VERSION
    have = {t.name for t in available}
    missing = tuple(n for n in decision.tool_names if n not in have)
    return Replayed(decision, project(before, offered, version), missing)


def replay_all(events: Sequence[ev.Event], tools: Iterable[ToolSpec]) -> list[Replayed]:
    specs = list(tools)
    return [replay(events, specs, d.seq) for d in decisions(events)]
