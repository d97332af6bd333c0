"""The Slack side of plan messages: each run one streamed message, exactly once.

A run's plan message (:mod:`bot.plan_outbox` says which runs have one) is started with
``chat.startStream`` carrying the plan so far, and its receipt (``message_posted`` of
kind ``stream``) is recorded before anything is appended to it. Later passes append
the task cards that changed since this process sent them (``chat.appendStream``).
A card's title and status are replaced by each ``task_update`` naming it; what Slack
does with its ``details`` and ``output`` named again is not clear (some report they are
appended), so each is sent once (:func:`bot.render.plan.chunks_since`; whatever
changes later is in the card's title). When the run stops, the rest of its answer is
appended as markdown and the stream stopped (``chat.stopStream``, with the feedback row
after an answer, and metadata naming the run's input); ``stream_stopped`` records it.

The answer may have been streamed while the model wrote it (:mod:`bot.answer_stream`,
whose plan message may be started, with the answer's first words, before its receipt
is in the log). Streamed text is not idempotent: a message whose text is not known to
be the start of the answer (words that were no answer, a process that did not stream
it itself, a call whose outcome is unknown) is stopped and replaced whole when the run
ends (``chat.update`` with :func:`bot.render.plan.plan_blocks`).

A process that takes over an open plan message it did not send to (a restart, a
takeover) does not know what it shows: it sends every card's title and status again,
never its details or output (:func:`resync_plan`), and the message is replaced whole
when the run ends, so it ends as the log says whatever the process before sent. A
stream Slack closed (``message_not_in_streaming_state``: stopped, expired) is updated in
place so, and a run that goes on continues in a new segment. So does one about to
outlive Slack's limit on a stream (``rotate_after``). A stream started but not recorded
(a crash between Slack's answer and the receipt) is adopted by the pass's look back
(:func:`adopt`), never started twice.

Where Slack refuses streams in a channel (any refusal of ``chat.startStream``, not a
429, a 5xx or a timeout), the channel gets today's lines instead, decided once per
channel per process and logged once.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from bot.outbox import is_ours, metadata, shown_event, shown_run
from bot.plan_outbox import PlanRun
from bot.render.plan import (
    Run,
    Shown,
    answer_text,
    bare,
    chunks_since,
    feedback_blocks,
    note_shown,
    plan_blocks,
    plan_chunks,
)
from bot.slack_calls import Stop, refusal, surely_not_done
from engine import events as ev
from engine import faults

if TYPE_CHECKING:
    from bot.delivery import Delivery, _Pass

log = logging.getLogger("opsloop.delivery")

DisplayMode = Literal["plan", "timeline"]
ROTATE_AFTER_S = 240.0  # Slack ends a stream about five minutes after it started
ANSWER_PIECE = 1000  # characters of the answer per appendStream call (12,000 at most)
ADOPT_MARGIN_S = 60.0  # our clock against Slack's, looking for a stream not recorded
_REMEMBERED = 10_000  # plan messages this process remembers sending to
Step = Literal["start", "rotate", "resync", "append", "finish"]


@dataclass
class Sent:
    """What this process sent to one plan message: what its cards show (by task id, the
    plan's title under "": :data:`bot.render.plan.Shown`), and the answer's text so far
    (None: not known, as after a call whose outcome is unknown: the message is then
    replaced whole). ``junk``: the message holds text that is not the answer (words
    before a tool call, or what a process before this one may have streamed): it is
    replaced whole when the run ends. ``early``: started with the first words of the
    answer (:mod:`bot.answer_stream`), before its receipt is in the log: cards may
    follow the text at once. ``thread_id`` and ``channel``: whose and where it is."""

    shown: Shown = field(default_factory=dict)
    answer: str | None = ""
    junk: bool = False
    early: bool = False
    thread_id: str = ""
    channel: str = ""

    def note(self, chunks: Sequence[dict[str, Any]]) -> None:
        note_shown(self.shown, chunks)

    def changed(self, chunks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return chunks_since(self.shown, chunks)


class PlanMessages:
    """One process's plan messages: what it sent to each (forgotten at a restart: the
    next process sends the cards again), and the channels that refuse streams.

    ``live``: runs are shown as plan messages where Slack allows (False: lines, as
    before plans); ``display_mode``: ``plan`` (tasks together) or ``timeline``;
    ``rotate_after``: seconds a segment lives before a new one continues the plan.
    """

    def __init__(
        self,
        *,
        live: bool = True,
        display_mode: DisplayMode = "plan",
        rotate_after: float = ROTATE_AFTER_S,
    ) -> None:
        self.live_plan = live
        self.display_mode = display_mode
        self.rotate_after = rotate_after
        self.sent: OrderedDict[str, Sent] = OrderedDict()  # by the stream's ts
        self.refused: dict[str, str] = {}  # channel -> Slack's error

    def live(self, channel: str) -> bool:
        """Whether runs not shown yet in ``channel`` become plan messages."""
        return self.live_plan and channel not in self.refused

    def refuse(self, channel: str, error: str) -> None:
        if channel not in self.refused:
            log.warning("streams refused channel=%s error=%s: lines instead", channel, error)
        self.refused[channel] = error

    def remember(self, ts: str, sent: Sent) -> Sent:
        self.sent.pop(ts, None)
        self.sent[ts] = sent
        if len(self.sent) > _REMEMBERED:
            self.sent.popitem(last=False)
        return sent

    def step(self, plan: PlanRun, now: datetime) -> Step | None:
        """What ``plan`` needs next from this process (None: nothing now)."""
        current = plan.current
        if current is None or not plan.open:
            return "start"  # its first segment, or the next one
        sent = self.sent.get(current.ts)
        if current.seq == 0 and (sent is None or not sent.early):
            return None  # handed to the runner: appended to once the log has it
        if plan.run.ended:
            return "finish"
        if (now - current.created_at).total_seconds() >= self.rotate_after:
            return "rotate"
        if sent is None:
            return "resync"
        return "append" if sent.changed(_chunks(plan.run)) else None

    def latest(self, thread_id: str) -> tuple[str, Sent] | None:
        """The plan message of ``thread_id`` this process sent to last, open as far as
        it knows (a stopped one is forgotten)."""
        for ts in reversed(self.sent):
            if self.sent[ts].thread_id == thread_id:
                return ts, self.sent[ts]
        return None


async def append_stream(d: Delivery, where: str, channel: str, ts: str, **content: Any) -> None:
    """Append ``content`` (``chunks`` or ``markdown_text``) to the open stream at ``ts``."""
    await d._call(
        "chat.appendStream", d.client.chat_appendStream, where, channel=channel, ts=ts, **content
    )


def _chunks(run: Run) -> list[dict[str, Any]]:
    return plan_chunks(run, done=run.ended)


def _answered(run: Run) -> bool:
    """Whether the run stopped at an answer (the plan message then takes feedback)."""
    return any(isinstance(e, ev.FinalAnswer) for e in run.events)


def pieces(text: str, size: int = ANSWER_PIECE) -> list[str]:
    """``text`` in pieces of at most ``size`` characters, cut after a newline or a space
    where there is one (the pieces joined are ``text``)."""
    out: list[str] = []
    while len(text) > size:
        cut = max(text.rfind("\n", 0, size), text.rfind(" ", 0, size))
        cut = cut + 1 if cut > 0 else size
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text] if text else out


async def show(p: _Pass, plan: PlanRun, step: Step) -> None:
    """Do ``step`` for ``plan`` in pass ``p``."""
    where = f"thread_id={p.thread_id} event_id={plan.run.start.event_id}"
    if step == "start":
        await _start(p, plan, where)
        return
    current = plan.current
    assert current is not None
    if step == "finish" and _must_replace(p, plan, current):
        await _replace(p, plan, current.ts, where, stopped=False)
        return
    try:
        if step == "rotate":
            await _stop(p, plan, current.ts, where, feedback=False)
        elif step == "finish":
            await _finish(p, plan, current.ts, where)
        else:
            await _append(p, plan, current.ts, where, resync=step == "resync")
    except Stop as stop:
        if _refusal_of_stream(stop) is None:
            raise
        # Slack closed it (stopped, expired, a person stopped it): the message shows
        # the whole plan so far instead, and a run that goes on gets a new segment.
        log.info("plan message closed %s ts=%s error=%s", where, current.ts, stop)
        await _replace(p, plan, current.ts, where, stopped=True)


def _refusal_of_stream(stop: Stop) -> str | None:
    error = refusal(stop)
    return None if error in (None, "channel_not_found", "not_in_channel") else error


async def _start(p: _Pass, plan: PlanRun, where: str) -> None:
    d, slack, run = p.d, p.slack, plan.run
    chunks = _chunks(run)
    # A pass the answer's first words asked for (bot.answer_stream) starts the open
    # run's plan with them: the answer is not in the log yet.
    text = p.answer if p.answer and not run.ended else ""
    args: dict[str, Any] = {
        "channel": slack.channel,
        "thread_ts": slack.root_ts,
        "chunks": [*chunks, {"type": "markdown_text", "text": text}] if text else chunks,
        "task_display_mode": d.plans.display_mode,
    }
    if not slack.channel.startswith("D"):  # in a channel: the person it is for
        args["recipient_user_id"] = plan.recipient
        args["recipient_team_id"] = _team(run, slack.team)
    p.sink.check()
    try:
        answer = await d._call("chat.startStream", d._post_client.chat_startStream, where, **args)
    except Stop as stop:
        error = refusal(stop)
        if error is not None and not plan.segments:
            d.plans.refuse(slack.channel, error)  # the run shows as lines instead
            return
        if not surely_not_done(stop):
            d._unsure.add(p.thread_id)  # it may have started: look before starting again
        raise
    faults.hit("stream_started")  # crash tests: Slack has it, our log does not yet
    ts = answer["ts"]
    channel = answer.get("channel") or slack.channel
    sent = Sent(answer=text, early=bool(text), thread_id=p.thread_id, channel=channel)
    d.plans.remember(ts, sent).note(chunks)
    if text:
        p.answered = ts
    p.made += 1
    receipt = ev.MessagePosted(
        shows_event_id=run.start.event_id,
        channel=channel,
        ts=ts,
        kind="stream",
        created_at=d.clock(),
    )
    await p.record([receipt])


def _team(run: Run, team: str) -> str:
    """The requester's team: where their message came from, or the thread's."""
    source = getattr(run.start, "source", None)
    found = source.get("team") if isinstance(source, dict) else None
    return found if isinstance(found, str) and found else team


async def _append(p: _Pass, plan: PlanRun, ts: str, where: str, *, resync: bool) -> None:
    d = p.d
    sent = d.plans.sent.get(ts)
    if resync or sent is None:
        await resync_plan(d, p.slack.channel, plan, ts, where, thread_id=p.thread_id)
        p.made += 1
        return
    todo = sent.changed(_chunks(plan.run))
    if todo:
        faults.hit("stream_appending")  # crash tests: recorded, not appended to yet
        await append_stream(d, where, p.slack.channel, ts, chunks=todo)
        p.made += 1
    d.plans.remember(ts, sent).note(todo)


async def resync_plan(
    d: Delivery, channel: str, plan: PlanRun, ts: str, where: str, *, thread_id: str
) -> Sent:
    """Take over the open plan message at ``ts``, whose content this process does not
    know (a restart, a takeover): every card once more, but only its title and status.

    Its details and output may be there already, and Slack may append what is named
    again; so they are taken as shown and never sent (a card the process before never
    sent lacks them until the message is replaced). Text may be there too: an answer
    the process before streamed, or words that were no answer; an ended run's answer
    was recorded, so it may be partly there. So the message is replaced whole (stop,
    ``chat.update`` with :func:`bot.render.plan.plan_blocks`) when the run ends
    (``junk``, or an answer not known), and ends as the log says."""
    chunks = _chunks(plan.run)
    ended = plan.run.ended
    sent = Sent(answer=None if ended else "", junk=not ended, thread_id=thread_id, channel=channel)
    faults.hit("stream_appending")  # crash tests: recorded, not appended to yet
    await append_stream(d, where, channel, ts, chunks=bare(chunks))
    sent.note(chunks)  # what it may show
    return d.plans.remember(ts, sent)


def _must_replace(p: _Pass, plan: PlanRun, current: ev.MessagePosted) -> bool:
    """Whether the stopped run's message is replaced whole rather than streamed to the
    end: what of its answer it holds is not known here (or is not the answer's start),
    or it is about to expire."""
    sent = p.d.plans.sent.get(current.ts)
    if sent is None or sent.answer is None or sent.junk:
        return True
    if not answer_text(plan.run).startswith(sent.answer):
        return True
    return (p.d.clock() - current.created_at).total_seconds() >= p.d.plans.rotate_after


async def _finish(p: _Pass, plan: PlanRun, ts: str, where: str) -> None:
    """The run stopped: the rest of its answer into the stream, and the stream stopped."""
    d, run = p.d, plan.run
    await _append(p, plan, ts, where, resync=False)
    sent = d.plans.sent[ts]
    assert sent.answer is not None
    text = answer_text(run)
    for piece in pieces(text[len(sent.answer) :]):
        so_far, sent.answer = sent.answer, None  # not known until Slack says it took it
        await append_stream(d, where, p.slack.channel, ts, markdown_text=piece)
        sent.answer = so_far + piece
        p.made += 1
        faults.hit("stream_answering")  # crash tests: the answer partly streamed
    await _stop(p, plan, ts, where, feedback=_answered(run))


async def _stop(p: _Pass, plan: PlanRun, ts: str, where: str, *, feedback: bool) -> None:
    d = p.d
    args: dict[str, Any] = {
        "channel": p.slack.channel,
        "ts": ts,
        "metadata": metadata(p.thread_id, plan.run.start.event_id, stream=True),
    }
    if feedback:
        args["blocks"] = feedback_blocks(p.thread_id, ts)
    await d._call("chat.stopStream", d.client.chat_stopStream, where, **args)
    p.made += 1
    d.plans.sent.pop(ts, None)  # it takes nothing more
    await p.record([ev.StreamStopped(ts=ts, channel=p.slack.channel, created_at=d.clock())])


async def _replace(p: _Pass, plan: PlanRun, ts: str, where: str, *, stopped: bool) -> None:
    """The message at ``ts`` shows the run's whole plan (and its answer), in place."""
    d, run = p.d, plan.run
    shows = metadata(p.thread_id, run.start.event_id, stream=True)
    if not stopped:
        try:
            await d._call(
                "chat.stopStream",
                d.client.chat_stopStream,
                where,
                channel=p.slack.channel,
                ts=ts,
                metadata=shows,
            )
        except Stop as stop:
            if _refusal_of_stream(stop) is None:
                raise  # closed already is as good as stopped
    blocks = plan_blocks(run)
    if run.ended and _answered(run):
        blocks = [*blocks, *feedback_blocks(p.thread_id, ts)]
    await d._call(
        "chat.update",
        d.client.chat_update,
        where,
        channel=p.slack.channel,
        ts=ts,
        text=run.title or "opsloop",
        blocks=blocks,
        metadata=shows,
    )
    p.made += 1
    d.plans.sent.pop(ts, None)
    await p.record([ev.StreamStopped(ts=ts, channel=p.slack.channel, created_at=d.clock())])


def adopt(
    plans: Sequence[PlanRun],
    messages: Sequence[dict[str, Any]],
    events: Sequence[ev.AnyEvent],
    *,
    thread_id: str,
    channel: str,
    root_ts: str,
) -> list[ev.MessagePosted]:
    """Receipts for plan messages in Slack that the log lacks (a crash between Slack's
    answer to ``chat.startStream`` and the receipt): for each run of ``plans`` without
    a segment, the first bot message of the thread (``messages``) without opsloop's
    metadata, newer than the run's input and not recorded. Every post and stopped plan
    message carries that metadata; an open stream has none."""
    known = {e.ts for e in events if isinstance(e, ev.MessagePosted)}
    # Our bot is the one whose messages carry our metadata (the status message, first).
    bots = {m.get("bot_id") for m in messages if is_ours(m) and m.get("bot_id")}
    candidates = [
        m
        for m in messages
        if m.get("bot_id")
        and (not bots or m.get("bot_id") in bots)
        and isinstance(m.get("ts"), str)
        and m["ts"] != root_ts
        and m["ts"] not in known
        and (not is_ours(m) or shown_run(m, thread_id) is not None)
        and shown_event(m, thread_id) is None
    ]
    out: list[ev.MessagePosted] = []
    for plan in plans:
        if plan.segments:
            continue
        since = _since(plan.run.start)
        mine = next(
            (
                m
                for m in candidates
                if _ts(m["ts"]) > since
                and shown_run(m, thread_id) in (None, plan.run.start.event_id)
            ),
            None,
        )
        if mine is None:
            continue
        candidates.remove(mine)
        created = datetime.fromtimestamp(_ts(mine["ts"]), UTC)
        out.append(
            ev.MessagePosted(
                shows_event_id=plan.run.start.event_id,
                channel=channel,
                ts=mine["ts"],
                kind="stream",
                created_at=created,
            )
        )
    return out


def _since(start: ev.AnyEvent) -> float:
    """Slack's ts before which a plan message of the run ``start`` began cannot be: its
    message's ts, or (another input) when it was recorded, less a margin for clocks."""
    source = getattr(start, "source", None)
    ts = source.get("ts") if isinstance(source, dict) else None
    if isinstance(ts, str):
        try:
            return _ts(ts)
        except ValueError:
            pass
    return start.created_at.timestamp() - ADOPT_MARGIN_S


def _ts(ts: str) -> float:
    return float(ts)
