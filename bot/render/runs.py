"""A thread's log cut into runs, each shown as one plan message (:mod:`bot.render.plan`).

A run is a stretch of the log while the thread works (status ``running`` or ``sleeping``
between retries, as the reducer says): it starts at the event after which the thread has
work to do again (a message or a firing alert to a thread at rest, an answer to its
question, an approval that reached its quorum, a rejection, an expiry, a withdrawal, a
reconcile decision, a finished or timed-out wait) and ends at the event after which it
no longer does (the final answer, an approval card, a question, a wait, an unknown
outcome, an error, a cancellation, a stop honoured). Approval and reconcile cards stay
messages of their own, so the work an approval lets through is a new run, whose plan
message is below the card. The reducer decides, so a quorum, a standing grant or a stop
that waits for a running tool are read exactly as the engine reads them.

Events after a run's end and before the next start (delivery receipts, feedback, votes
short of a quorum, a late result) belong to the run before them.

Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bot.render import tasks as tk
from engine import events as ev
from engine.chat_markup import decoded
from engine.errors import IllegalTransition
from engine.state import ThreadState, apply

TITLE_WORDS = 60  # the request in a few words: cut on a word boundary near this
UNTITLED = "New request"
WORKING = frozenset({"running", "sleeping"})  # the statuses of a thread at work

# What a later run needs to know of a call requested before it: its request, the edits
# of its arguments and the votes that approved it.
_CALL_HISTORY: tuple[type[ev.Event], ...] = (
    ev.ToolCallRequested,
    ev.ApprovalEdited,
    ev.ApprovalGranted,
)


@dataclass(frozen=True)
class Run:
    """One run of a thread: ``start`` (the event that resumed work, ``events[0]``) and
    every event up to the next run's start; ``ended`` once ``stop`` came (the event
    after which the thread no longer worked). ``title`` is the plan's title, escaped
    for Slack (it may be sent as is). ``earlier``: events before the run about the calls
    it continues (their request, edits and votes); ``requester``: who asked in the
    thread first (a question pings them)."""

    start: ev.AnyEvent
    events: tuple[ev.AnyEvent, ...]
    ended: bool
    title: str
    earlier: tuple[ev.AnyEvent, ...] = ()
    requester: str | None = None
    stop: ev.AnyEvent | None = None

    @property
    def thread_id(self) -> str:
        return self.start.thread_id

    @property
    def stopped_by(self) -> str | None:
        """Who pressed stop on this run, if anyone did before it ended."""
        for e in self.events:
            if isinstance(e, ev.StopRequested):
                return e.user
            if e is self.stop:
                break
        return None

    def until(self, seq: int) -> Run:
        """The run as it stood once event ``seq`` was stored (its start always kept): what
        a plan message showed then."""
        kept = (self.start, *(e for e in self.events[1:] if 0 < e.seq <= seq))
        stop = self.stop if self.stop is not None and self.stop in kept else None
        return replace(self, events=kept, ended=stop is not None, stop=stop)


def runs(events: Sequence[ev.AnyEvent], *, bot_user_id: str | None = None) -> list[Run]:
    """The runs of a thread's log, oldest first. ``events`` is the whole log, from its
    first event (the reducer reads it; an event it refuses, which a stored log never
    holds, changes nothing). ``bot_user_id``: the bot's own mentions are left out of
    titles."""
    state = ThreadState()
    history: dict[str, list[ev.AnyEvent]] = {}
    cut: list[_Cut] = []
    for e in events:
        try:
            state = apply(state, e)
        except (IllegalTransition, ValueError):
            pass
        working = state.status in WORKING
        if working and (not cut or cut[-1].stop is not None):
            cut.append(_Cut(e, {k: tuple(v) for k, v in history.items()}))
        elif cut:
            cut[-1].events.append(e)
        if cut and cut[-1].stop is None and not working:
            cut[-1].stop = e
        if isinstance(e, _CALL_HISTORY):
            history.setdefault(tk.call_id(e) or "", []).append(e)
    return _titled(cut, bot_user_id)


def request_words(
    text: str,
    source: Mapping[str, Any] | None = None,
    *,
    bot_user_id: str | None = None,
    limit: int = TITLE_WORDS,
) -> str:
    """A request in a few words, plain (not escaped): its first sentence as the person
    saw it (mentions as names, links as their labels), the bot's mention left out, cut
    on a word boundary near ``limit`` characters."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    plain = decoded(text, source or {}) if (source or {}).get("kind") == "slack" else text
    plain = tk.visible(plain)
    first = next((line.strip() for line in plain.splitlines() if line.strip()), "")
    sentence = re.split(r"(?<=[.!?…])\s", first, maxsplit=1)[0]
    words = " ".join(sentence.split()).rstrip(".,;:")
    if len(words) <= limit:
        return words
    head = words[: limit - 1]
    space = head.rfind(" ")
    if space > limit // 2:
        head = head[:space]
    return head.rstrip(" .,;:-") + "…"


@dataclass
class _Cut:
    """A run while the log is read."""

    start: ev.AnyEvent
    history: dict[str, tuple[ev.AnyEvent, ...]]
    events: list[ev.AnyEvent] = field(default_factory=list)
    stop: ev.AnyEvent | None = None

    def __post_init__(self) -> None:
        self.events.append(self.start)


# --- titles -----------------------------------------------------------------------------


def _titled(cut: list[_Cut], bot_user_id: str | None) -> list[Run]:
    out: list[Run] = []
    request = ""  # the latest request's words, for "Continuing: …"
    requester: str | None = None
    for c in cut:
        events = tuple(c.events)
        for e in events:
            if requester is None and isinstance(e, ev.UserMessage):
                requester = e.actor
        own = _request_of(c.start, events, bot_user_id)
        request = own or request
        earlier = _earlier(events, c.history)
        title = own or _continuing(c.start, request, earlier)
        out.append(
            Run(
                start=c.start,
                events=events,
                ended=c.stop is not None,
                title=tk.safe(title or UNTITLED, tk.MAX_TITLE),
                earlier=earlier,
                requester=requester,
                stop=c.stop,
            )
        )
    return out


def _request_of(start: ev.AnyEvent, events: tuple[ev.AnyEvent, ...], bot: str | None) -> str:
    """The words of a run that starts with a request (a message, an alert, or a
    withdrawal, which comes with the requester's new message)."""
    if isinstance(start, ev.UserMessage):
        return request_words(start.text, start.source, bot_user_id=bot) or UNTITLED
    if isinstance(start, ev.AlertReceived):
        return request_words(start.summary) or "Alert"
    if isinstance(start, ev.ApprovalWithdrawn):
        message = next((e for e in events if isinstance(e, ev.UserMessage)), None)
        if message is not None:
            return request_words(message.text, message.source, bot_user_id=bot)
    return ""


_AFTER_A_CARD: dict[type[ev.Event], str] = {
    ev.ApprovalGranted: "Approved",
    ev.ApprovalRejected: "Rejected",
    ev.ApprovalExpired: "Not approved in time",
    ev.ApprovalEdited: "Refused after an edit",
}


def _continuing(start: ev.AnyEvent, request: str, earlier: tuple[ev.AnyEvent, ...]) -> str:
    """A later run's title: what a card decided of which call, else the request it goes on
    with."""
    label = _AFTER_A_CARD.get(type(start))
    call = tk.latest_call(earlier, tk.call_id(start) or "")
    if label and call is not None:
        return f"{label}: {tk.call_words(call[0], call[1])}"
    return f"Continuing: {request}" if request else "Continuing"


def _earlier(
    events: tuple[ev.AnyEvent, ...], history: dict[str, tuple[ev.AnyEvent, ...]]
) -> tuple[ev.AnyEvent, ...]:
    """The history of the calls the run continues (requested before it started)."""
    requested_here = {e.tool_call_id for e in events if isinstance(e, ev.ToolCallRequested)}
    ids = dict.fromkeys(i for e in events if (i := tk.call_id(e)) and i not in requested_here)
    return tuple(e for i in ids for e in history.get(i, ()))
