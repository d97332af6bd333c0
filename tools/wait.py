"""WaitFor: the return value of a ``wait_for_external_event`` tool."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WaitFor:
    """Describes what a thread is waiting on.

    ``data`` is persisted (so it must be JSON-serialisable) and handed back to
    the tool's poll function, possibly after a process restart.  The wait fails
    after ``timeout_s``; ``poll_every_s`` of None lets the engine pick a cadence.

    ``resumes``: the tool asks a person mid-call and goes on with the answer: when the
    wait ends (finished or timed out) the call runs again, its next attempt handed how
    it ended (``ToolContext.answer``), and that attempt's outcome is the call's. Any
    tool may ask so, whatever its policy.
    """

    description: str
    data: dict = field(default_factory=dict)
    timeout_s: float = 3600.0
    poll_every_s: float | None = None
    resumes: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.data, dict):
            raise TypeError("WaitFor.data must be a dict")
        try:
            json.dumps(self.data)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"WaitFor.data must be JSON-serialisable: {exc}") from exc
        if self.timeout_s <= 0:
            raise ValueError("WaitFor.timeout_s must be > 0")
        if self.poll_every_s is not None and self.poll_every_s <= 0:
            raise ValueError("WaitFor.poll_every_s must be > 0 or None")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for persistence."""
        return {
            "description": self.description,
            "data": self.data,
            "timeout_s": self.timeout_s,
            "poll_every_s": self.poll_every_s,
            "resumes": self.resumes,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WaitFor:
        """Inverse of :meth:`to_dict`."""
        return cls(
            description=raw["description"],
            data=dict(raw.get("data") or {}),
            timeout_s=float(raw.get("timeout_s", 3600.0)),
            poll_every_s=raw.get("poll_every_s"),
            resumes=bool(raw.get("resumes", False)),
        )
