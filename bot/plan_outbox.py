"""Which runs a thread shows as plan messages, and where each stands: pure.

Each run (:func:`bot.render.plan.runs`: from an input to the next stop) with something
to show is one streamed plan message (DESIGN, "The thread as a live plan"). Its
receipts say where it stands: a ``message_posted`` of kind ``stream`` per segment (the
run's input in ``shows_event_id``), a ``stream_stopped`` per segment stopped. A run
shows as lines instead (today's posts) where it already did (a line of it has a
receipt: a thread from before plans, or a channel that refused streams), where
streams are off for the channel (``live_plan`` false) and it has no segment yet, or
where nobody could receive a stream (no person asked: an alert nobody answered).

:func:`plan_runs` gives the runs shown as plan messages that are not finished;
:func:`plan_shown` the events whose lines those plan messages replace (the outbox
leaves them out). A tool's question to the requester (an MCP elicitation: a
``wait_started`` holding a question) is not one of them: it is asked in a message of its
own, below the plan, with its buttons (the plan's card says to look there). What the
Slack side still has to send also depends on what this process sent (:mod:`bot.stream`).

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.mrkdwn import USER_ID
from bot.render.plan import Run, answer_text, plan_chunks, runs
from engine import events as ev
from tools.mcp.elicitation import question_of

# The lines a plan message shows instead: its task cards (a call, its retries, its
# result, its wait) and its answer (or the question, or the error it stopped at).
PLAN_SHOWS: tuple[type[ev.Event], ...] = (
    ev.ToolCallRequested,
    ev.RetryScheduled,
    ev.ToolResult,
    ev.WaitStarted,
    ev.FinalAnswer,
    ev.ClarificationRequested,
    ev.ErrorRaised,
)


@dataclass(frozen=True)
class PlanRun:
    """A run shown as a plan message: ``segments`` are its stream receipts in log order
    (drafts a runner has not appended yet included), ``stopped`` the ts of those
    stopped; ``index`` is where its input is in the log (what it shows goes in log
    order with the posts); ``recipient`` the person the stream is for."""

    run: Run
    index: int
    segments: tuple[ev.MessagePosted, ...]
    stopped: frozenset[str]
    recipient: str
    finished: bool

    @property
    def current(self) -> ev.MessagePosted | None:
        """The segment shown last (None: no plan message yet)."""
        return self.segments[-1] if self.segments else None

    @property
    def open(self) -> bool:
        """Whether its last segment is in Slack and not stopped."""
        return self.current is not None and self.current.ts not in self.stopped


def in_plan(e: ev.AnyEvent) -> bool:
    """Whether a plan message shows ``e`` instead of a line (a question with buttons is
    a message of its own)."""
    if isinstance(e, ev.WaitStarted):
        return question_of(e.data) is None
    return isinstance(e, PLAN_SHOWS)


def has_content(run: Run) -> bool:
    """Whether ``run`` has anything for a plan to show: a tool call, or its answer."""
    chunks = plan_chunks(run, done=run.ended)
    return any(c.get("type") == "task_update" for c in chunks) or bool(answer_text(run))


def plan_runs(
    events: Sequence[ev.AnyEvent], *, live_plan: bool, answering: bool = False
) -> list[PlanRun]:
    """The runs of ``events`` shown as plan messages, but those finished (ended, and
    their last segment stopped after the end), in log order. ``answering``: the last
    run, still open, is being answered (its answer is being written, not recorded yet):
    it is shown as a plan message even with nothing else to show."""
    plans = _plans(events, live_plan=live_plan, answering=answering)
    return [p for p in plans if not p.finished]


def answering(events: Sequence[ev.AnyEvent], *, live_plan: bool) -> PlanRun | None:
    """The plan message of the thread's last run, while that run is open (its answer may
    be being written); None when the run is not shown as a plan message."""
    last = next(iter(reversed(runs(events))), None)
    if last is None or last.ended:
        return None
    plans = plan_runs(events, live_plan=live_plan, answering=True)
    found = plans[-1] if plans else None
    return found if found is not None and found.run.start is last.start else None


def plan_shown(events: Sequence[ev.AnyEvent], *, live_plan: bool) -> set[str]:
    """The ids of the events whose lines plan messages show instead."""
    shown: set[str] = set()
    for plan in _plans(events, live_plan=live_plan):
        shown.update(e.event_id for e in plan.run.events if in_plan(e))
        if isinstance(plan.run.stop, ev.ThreadCancelled):  # its answer says who cancelled
            shown.add(plan.run.stop.event_id)
    return shown


def _plans(
    events: Sequence[ev.AnyEvent], *, live_plan: bool, answering: bool = False
) -> list[PlanRun]:
    index = {e.event_id: i for i, e in enumerate(events)}
    segments: dict[str, list[ev.MessagePosted]] = {}
    lined: set[str] = set()  # events with a receipt of a post (the status message's aside)
    stopped_at: dict[str, int] = {}  # a stopped segment's ts -> where its stop is
    status_ts = _status_ts(events)
    for i, e in enumerate(events):
        if isinstance(e, ev.MessagePosted):
            if e.kind == "stream":
                segments.setdefault(e.shows_event_id, []).append(e)
            elif not (e.ts and e.ts == status_ts):
                lined.add(e.shows_event_id)
        elif isinstance(e, ev.StreamStopped):
            stopped_at.setdefault(e.ts, i)
    requester = next((e.actor for e in events if isinstance(e, ev.UserMessage)), None)
    out: list[PlanRun] = []
    cut = runs(events)
    for n, run in enumerate(cut):
        start = run.start.event_id
        mine = tuple(segments.get(start, ()))
        if not mine:
            as_lines = any(in_plan(e) and e.event_id in lined for e in run.events)
            answered = answering and n == len(cut) - 1 and not run.ended
            if as_lines or not live_plan or not (answered or has_content(run)):
                continue
        recipient = run.start.actor if USER_ID.match(run.start.actor) else requester
        if recipient is None and not mine:
            continue  # nobody to stream to: lines
        end = index.get(run.stop.event_id, -1) if run.stop is not None else -1
        last = mine[-1].ts if mine else ""
        finished = run.ended and last in stopped_at and stopped_at[last] > end
        stopped = frozenset(s.ts for s in mine if s.ts in stopped_at)
        where = index.get(start, len(events))
        out.append(PlanRun(run, where, mine, stopped, recipient or "", finished))
    return out


def _status_ts(events: Sequence[ev.AnyEvent]) -> str:
    """The ts of the thread's status message (see :mod:`bot.outbox`): the first post
    receipt of its first ``user_message`` (or of the alert that opened it)."""
    first: ev.AnyEvent | None
    if events and isinstance(events[0], ev.AlertReceived):
        first = events[0]
    else:
        first = next((e for e in events if isinstance(e, ev.UserMessage)), None)
    if first is None:
        return ""
    return next(
        (
            e.ts
            for e in events
            if isinstance(e, ev.MessagePosted)
            and e.kind == "post"
            and e.shows_event_id == first.event_id
            and e.ts
        ),
        "",
    )
