"""Replay: the exact request a stored decision was made from, recomputed from the log.

Every ``model_decision`` keeps the hash and version of its prompt. Projecting the
events before it again must give the same bytes; a mismatch (after a change to the
projection, or to the tools' descriptions) is reported, never hidden.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine import events as ev
from engine.context import PROJECTION_VERSION, Prompt, ToolSpec, project
from engine.errors import ThreadNotFound


@dataclass(frozen=True)
class Replayed:
    decision: ev.ModelDecision
    prompt: Prompt

    @property
    def matches(self) -> bool:
        return self.prompt.hash == self.decision.prompt_hash

    def verdict(self) -> str:
        d = self.decision
        if self.matches:
            return (
                f"seq {d.seq}: ok (projection {d.projection_version}, sha256 {d.prompt_hash[:12]})"
            )
        why = ""
        if d.projection_version != PROJECTION_VERSION:
            why = f" (made with projection {d.projection_version}, not {PROJECTION_VERSION})"
        return (
            f"seq {d.seq}: MISMATCH{why}: stored {d.prompt_hash[:12]}, "
            f"recomputed {self.prompt.hash[:12]}"
        )


def decisions(events: Sequence[ev.Event]) -> list[ev.ModelDecision]:
    return [e for e in events if isinstance(e, ev.ModelDecision)]


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
    return Replayed(
        decision, project(before, tools, decision.projection_version or PROJECTION_VERSION)
    )


def replay_all(events: Sequence[ev.Event], tools: Iterable[ToolSpec]) -> list[Replayed]:
    specs = list(tools)
    return [replay(events, specs, d.seq) for d in decisions(events)]
