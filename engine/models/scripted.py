"""A model that plays a script, for tests, benchmarks and demos.

The step it plays is chosen from the prompt (how many assistant turns it holds), never
from memory, so a process that restarts mid-thread plays on from the right place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from engine.context import Prompt
from engine.models.base import Decision, TextSink, ToolUse, hand_over

Step = Decision | Callable[[Prompt], Decision]


def say(text: str) -> Decision:
    return Decision(text=text, stop_reason="end_turn")


def call(tool_name: str, /, *, _id: str | None = None, _text: str = "", **arguments: Any) -> Step:
    """A tool use with ``arguments``; ``_text`` is what the model says beside it. Without
    ``_id`` the id is derived from the turn, so a replay after a restart gets the same."""

    def step(prompt: Prompt) -> Decision:
        turn = prompt.turn if prompt.turn >= 0 else assistant_turns(prompt)
        cid = _id or f"toolu_{turn:04d}"
        use = ToolUse(id=cid, name=tool_name, input=dict(arguments))
        return Decision(text=_text, tool_use=use, stop_reason="tool_use")

    return step


def ask(question: str) -> Step:
    return call("request_clarification", question=question)


def assistant_turns(prompt: Prompt) -> int:
    return sum(1 for m in prompt.messages if m["role"] == "assistant")


class ScriptedModel:
    """Plays ``script[i]``, i being the decisions already in the thread (``prompt.turn``,
    or else the assistant turns in the prompt)."""

    name = "scripted"

    def __init__(self, script: Sequence[Step], *, latency: float = 0.0) -> None:
        self.script = list(script)
        self.latency = latency
        self.calls = 0

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        self.calls += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        index = prompt.turn if prompt.turn >= 0 else assistant_turns(prompt)
        if index >= len(self.script):
            return await hand_over(say("(the script has ended)"), on_text)
        step = self.script[index]
        decision = step(prompt) if callable(step) else step
        played = Decision(
            text=decision.text,
            tool_use=decision.tool_use,
            stop_reason=decision.stop_reason,
            usage=decision.usage,
            model=self.name,
        )
        return await hand_over(played, on_text)
