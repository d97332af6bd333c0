"""Fault injection for crash tests: free when off.

``OPSLOOP_FAULTS="append:3"`` SIGKILLs this process right after its 3rd committed
append; ``tool_effect:1`` after the first tool side effect that calls ``hit``.

The points of a plan message (bot/stream.py): ``stream_started`` (Slack started it, its
receipt is not recorded yet), ``stream_appending`` (before an append to a recorded
stream; ``:1``, after the record and before the first append) and ``stream_answering``
(after each piece of the answer: ``:1`` leaves it partly streamed).
"""

from __future__ import annotations

import os
import signal

_TARGETS: dict[str, int] = {}
_COUNTS: dict[str, int] = {}


def _parse(spec: str) -> dict[str, int]:
    targets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, n = part.partition(":")
        targets[name] = int(n or "1")
    return targets


def configure(spec: str | None) -> None:
    _TARGETS.clear()
    _COUNTS.clear()
    _TARGETS.update(_parse(spec or ""))


def hit(point: str) -> None:
    if not _TARGETS or point not in _TARGETS:
        return
    _COUNTS[point] = _COUNTS.get(point, 0) + 1
    if _COUNTS[point] == _TARGETS[point]:
        os.kill(os.getpid(), signal.SIGKILL)


configure(os.environ.get("OPSLOOP_FAULTS"))
