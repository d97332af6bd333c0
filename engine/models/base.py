"""The Model port: a stateless function from a projected prompt to one next step."""

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


class Model(Protocol):
    name: str

    async def next_step(self, prompt: Prompt) -> Decision: ...
