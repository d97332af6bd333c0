"""Small in-process fakes for engine tests: a settable clock and a recording model."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from engine.context import Prompt
from engine.models.base import Decision
from engine.models.scripted import ScriptedModel, Step


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class RecordingModel(ScriptedModel):
    """A scripted model that keeps every prompt it was shown."""

    def __init__(self, script: list[Step], *, gate: asyncio.Event | None = None) -> None:
        super().__init__(script)
        self.prompts: list[Prompt] = []
        self.gate = gate
        self.entered = asyncio.Event()

    async def next_step(self, prompt: Prompt) -> Decision:
        self.prompts.append(prompt)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return await super().next_step(prompt)

    def last_prompt_text(self) -> str:
        """The last prompt's blocks as text, tool_result contents unescaped."""
        parts = []
        for message in self.prompts[-1].messages:
            for block in message["content"]:
                flat = {k: v for k, v in block.items() if k != "content"}
                parts.append(json.dumps(flat))
                if isinstance(block.get("content"), str):
                    parts.append(block["content"])
        return "\n".join(parts)
