"""The Model port: a stateless function from a projected prompt to one next step.

A model may also hand the text of a final answer over while it is being written
(``on_text``, a ``TextSink``); the ``Decision`` it returns stays the whole reply, and is
what the log records. The sink's contract:

- ``await on_text(delta)``: the next piece of the answer's text. The pieces since the
  last reset, joined, are always a prefix of the ``Decision.text`` returned when the
  reply is a final answer, and equal to it once ``next_step`` returns.
- ``await on_text("", reset=True)``: everything sent since the last reset is void: the
  reply turned out not to be a final answer (a tool call after some words, a reply cut
  at ``max_tokens``, a refusal) or the request failed (a retry starts the text over).
  Sent only when some text was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.context import Prompt
from engine.events import Usage


@dataclass(frozen=True)
class ToolUse:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """One reply of the model: text, at most one tool use, and why it stopped."""

    text: str = ""
    tool_use: ToolUse | None = None
    stop_reason: str | None = "end_turn"
    usage: Usage = field(default_factory=Usage)
    model: str = ""


class ModelError(Exception):
    """A model call failed. ``retryable``: worth another try after ``retry_after`` s."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class TextSink(Protocol):
    """Where a final answer's text goes while it is written (see the module docstring)."""

    async def __call__(self, delta: str, /, *, reset: bool = False) -> None: ...


# The stop reasons of a reply that ends on its own (not cut off, not refused).
ENDED = frozenset({"end_turn", "stop_sequence"})


def is_answer(decision: Decision) -> bool:
    """Whether ``decision`` reads as a final answer: text, no tool call, ended on its own.
    (The runner's policy has the last word; this is what a model streams on.)"""
    return (
        decision.tool_use is None and decision.stop_reason in ENDED and bool(decision.text.strip())
    )


async def hand_over(decision: Decision, on_text: TextSink | None) -> Decision:
    """For a model that has its whole reply at once: a final answer's text goes to
    ``on_text`` in one piece, so a front door streams it as it would Claude's."""
    if on_text is not None and is_answer(decision):
        await on_text(decision.text)
    return decision


class Model(Protocol):
    name: str

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        """The next step for ``prompt``; a final answer's text also goes to ``on_text``
        as it is written, when given."""
        ...
