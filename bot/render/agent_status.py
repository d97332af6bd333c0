"""What Slack shows of a thread's work outside its messages: the loading status under
the thread (``assistant.threads.setStatus``) and the thread's agent session
(``agents.sessions.setStatus``), both read from the log.

The loading status says what happens now ("is thinking…", "is running Check health
(service: api)…") and only while something does: a thread waiting (for a reviewer, a
reply, a job, a reconcile, a timer), at rest, answered, failed or cancelled has none.
The session is ``processing`` while the thread works, ``suspended`` on every durable
wait, ``active`` once it answered and ``closed`` when cancelled or failed.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from bot.render import tasks as tk
from bot.render.runs import UNTITLED, runs
from engine import events as ev
from engine.state import ThreadState

SessionStatus = Literal["processing", "suspended", "active", "closed"]

THINKING = "is thinking…"
STOPPING = "is stopping…"
MAX_STATUS = 100  # of a loading status; the call's words are cut to fit
# Shown in turn while the status stays (``loading_messages``: Slack takes up to 10).
LOADING_MESSAGES: tuple[str, ...] = (
    "Reading the thread…",
    "Checking the details…",
    "Working through the steps…",
    "Looking at what the tools said…",
    "Putting the answer together…",
)

# A durable wait: nothing happens until a person, a job or a timer acts.
SUSPENDED: frozenset[str] = frozenset(
    {"awaiting_approval", "awaiting_reply", "awaiting_job", "awaiting_reconcile", "sleeping"}
)
CLOSED: frozenset[str] = frozenset({"cancelled", "failed"})


def loading_status(state: ThreadState, events: Sequence[ev.AnyEvent]) -> str | None:
    """The loading status while the thread works: "is thinking…" when the model is to
    be asked, "is running <the call>…" while a call is under way, "is stopping…" once
    someone pressed stop while a call ran (it ends by its normal path); None otherwise
    (a wait ends the status). ``events``: the thread's log (unused for now: the state
    says it all, but a caller holds both)."""
    if state.status != "running":
        return None
    if state.stop_by is not None:
        return STOPPING
    call = state.pending
    if call is not None and call.phase in ("ready", "started"):
        words = tk.call_words(call.intent, call.arguments)
        words = words[:1].lower() + words[1:] if words[1:2].islower() else words
        return f"is running {tk.safe(words, MAX_STATUS - len('is running …'))}…"
    return THINKING


def session_status(state: ThreadState) -> SessionStatus:
    """The thread's agent session, from its status."""
    if state.status in CLOSED:
        return "closed"
    if state.status in SUSPENDED:
        return "suspended"
    if state.status == "idle":
        return "active"
    return "processing"


def session_title(events: Sequence[ev.AnyEvent], *, bot_user_id: str | None = None) -> str:
    """The session's title: the request in a few words (the first run's title, escaped)."""
    cut = runs(events, bot_user_id=bot_user_id)
    return cut[0].title if cut else UNTITLED
