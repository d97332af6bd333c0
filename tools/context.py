"""Per-call context handed to every tool function by the engine."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class WaitAnswer:
    """How the wait a call asked for with ``WaitFor(resumes=True)`` ended: the wait's
    ``data`` as the tool gave it, and ``result`` (what ``wait_finished`` brought, e.g. a
    person's answer; empty when it timed out)."""

    data: dict[str, Any]
    result: dict[str, Any]
    timed_out: bool = False


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it is serving.

    ``idempotency_key`` is stable across retries and restarts of the same
    tool call, so side-effecting tools should use it to deduplicate work.
    ``attempt`` starts at 1 and grows each time the engine retries the call.
    ``definition_hash`` is the tool definition the call was approved under (from
    ``tool_call_requested``); a tool whose definition can change under it (MCP)
    refuses to run when its current definition no longer matches.
    ``first_started_at`` is when the call's first attempt started: whatever an earlier,
    interrupted attempt did happened after it, so a tool that looks for its own effect
    before repeating it (a dispatched workflow run) looks no further back.
    ``answer`` is how the call's resuming wait ended, handed to the attempt right after
    it only (None otherwise).
    """

    thread_id: str
    tool_call_id: str
    idempotency_key: str
    attempt: int
    requester: str | None = None
    definition_hash: str | None = None
    first_started_at: datetime | None = None
    answer: WaitAnswer | None = None
