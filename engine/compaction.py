"""Deterministic summaries of a thread's older events, for compacting the prompt.

When a prompt outgrows its token budget, the runner stores a ``context_compacted``
event whose ``summary`` replaces the events up to ``upto_seq`` in every later prompt.
The summary is a pure function of those events (and of the previous summary), so it
is reproducible; it is stored anyway, so a replay never depends on this code's
version. What people said, and every reviewer's rejection, is always kept; tool steps
are kept newest first until the summary's size cap (``Facts.summary`` of each type says
which is which).

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine import events as ev
from engine.trace import one_line, summarize

MAX_SUMMARY_CHARS = 6000
MAX_PREVIOUS_CHARS = 2500
HUMAN_WIDTH = 300
STEP_WIDTH = 100


@dataclass
class _Line:
    """One event's line of a future summary, written only if a summary is made (most
    threads never compact; every step of every thread would pay for it)."""

    event: ev.Event
    keep: bool
    said: Said
    _text: str | None = None

    @property
    def seq(self) -> int:
        return self.event.seq

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _line_text(self.event, self.keep, self.said)
        return self._text


Said = Callable[[ev.UserMessage | ev.ClarificationAnswered], str]


def _verbatim(e: ev.UserMessage | ev.ClarificationAnswered) -> str:
    return e.text


class Digest:
    """The lines a future summary may need, collected as events are projected.

    ``said`` renders a person's words as the prompt shows them (chat markup decoded).
    """

    def __init__(self, said: Said = _verbatim) -> None:
        self.said = said
        self.task: str | None = None
        self.previous: str | None = None
        self.lines: list[_Line] = []

    def add(self, e: ev.Event) -> None:
        if isinstance(e, ev.UserMessage) and self.task is None and self.previous is None:
            self.task = one_line(f"[{e.actor}] {self.said(e)}", 1000)
            return
        if isinstance(e, ev.AlertReceived) and e.seq <= 1 and self.task is None:
            # The alert that opened the thread, with the team's instruction: a summary
            # must not lose what the model was told to do (or not to do) with it.
            told = f" Instruction: {e.instruction}" if e.instruction else ""
            alert = f"[{e.actor}] {e.status} alert {e.fingerprint}: {e.summary}.{told}"
            self.task = one_line(alert, 1000)
            return
        # Each type's place in a summary is one of its facts (engine.events.Facts).
        role = e.facts.summary
        if role == "omitted":
            return
        self.lines.append(_Line(e, role == "kept", self.said))

    def restart(self, compacted: ev.ContextCompacted) -> None:
        """After a compaction, its summary stands for everything up to ``upto_seq``."""
        self.previous = compacted.summary
        self.task = None
        self.lines = [line for line in self.lines if line.seq > compacted.upto_seq]

    def summary(self, upto_seq: int) -> str:
        """The summary of everything projected up to ``upto_seq``, within the size cap."""
        head = [
            f"[opsloop compacted this conversation: events up to seq {upto_seq} are "
            "summarised here; `opsloop trace` shows them in full.]"
        ]
        if self.task:
            head.append(f"Task: {self.task}")
        if self.previous:
            prev = self.previous
            if len(prev) > MAX_PREVIOUS_CHARS:
                prev = prev[:MAX_PREVIOUS_CHARS] + " …"
            head += ["Earlier summary:", prev]
        lines = [line for line in self.lines if line.seq <= upto_seq]
        budget = MAX_SUMMARY_CHARS - sum(len(h) + 1 for h in head)
        budget -= sum(len(line.text) + 1 for line in lines if line.keep)
        chosen: set[int] = set()
        for line in reversed(lines):  # newest steps first
            if line.keep:
                continue
            if len(line.text) + 1 > budget:
                break
            budget -= len(line.text) + 1
            chosen.add(line.seq)
        body = [line.text for line in lines if line.keep or line.seq in chosen]
        omitted = len(lines) - len(body)
        if omitted:
            body.insert(0, f"… {omitted} earlier steps omitted …")
        return "\n".join([*head, "Steps:", *body] if body else head)


def _line_text(e: ev.Event, keep: bool, said: Said) -> str:
    if not keep:
        return one_line(f"seq {e.seq} {e.actor} {e.type}: {summarize(e)}", STEP_WIDTH)
    if isinstance(e, ev.UserMessage | ev.ClarificationAnswered):
        words = said(e) or summarize(e)
    else:
        words = getattr(e, "reason", None) or summarize(e)
    return one_line(f"seq {e.seq} {e.actor} {e.type}: {words}", HUMAN_WIDTH)
