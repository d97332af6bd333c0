"""The final answer streamed into its run's plan message while the model writes it.

The runner hands the answer's text over as the model writes it (the front door's
``answer_text``, ``engine.runner.StreamsAnswers``: pieces, and a reset when what came
was no answer after all). The model's stream waits for each piece, so a piece is only
kept here; a task per thread sends what was kept to Slack.

**When.** Which reply is an answer is known only at its end: words before a tool call
come first, as text, and a stream cannot take text back. People read an answer as it is
written (Slack's agents do; the target is its first character within 50 ms of the
model's first token), so serve sends a reply's words at once (``HOLD_S`` is 0; a
``Delivery(answer_hold=…)`` holds them that long for a tool call first, which tests use
to pin that case down) and then every ``EVERY_S`` at most. Words
sent that turned out to be no answer (a reset after sending) stay in the message until
the run ends; the message is then replaced in place (stopped, and ``chat.update`` with
the whole plan: :mod:`bot.stream`, ``Sent.junk``), so it ends with the plan and the
answer only. The answers after them are streamed all the same: people read them at once.

**What.** The text as the final message shows it (:func:`bot.render.plan.answer_text`,
escaped by :mod:`bot.render.markdown`), escaped now as the whole answer will be: only
what later words cannot change is sent (:func:`bot.render.markdown.growing_markdown`).
Should the recorded answer still differ from what was sent (or outgrow what a stream
takes, which the end cuts), the pass that ends the run sees it (it compares the two)
and replaces the message whole.

**Where.** The run's plan message (its receipt in the log). A run without one yet (its
only step is the answer) gets it now: a pass like any other (:class:`bot.delivery._Pass`,
its receipts handed over like the runner's), so the thread's status message comes first
and a plan message started without its receipt is adopted rather than started twice;
the plan is started with its title and the first words. Those receipts are recorded
by the next pass over the thread (:meth:`take`): the runner's next batch, or the pass
at rest. A crash before that leaves a plan message without a receipt, which the look
back finds (:func:`bot.stream.adopt`); what it holds is not known, so it is replaced
whole. A plan message this process did not send to (a restart) is taken over first
(:func:`bot.stream.resync_plan`).

A pass over the thread first settles its answer (:meth:`settle`): what is in flight
lands, the rest is the pass's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from bot import stream
from bot.mrkdwn import slack_len
from bot.plan_outbox import answering
from bot.render.markdown import MAX_MARKDOWN, growing_markdown
from bot.slack_calls import Stop, surely_not_done
from engine import events as ev
from engine import faults

if TYPE_CHECKING:
    from bot.delivery import Delivery, _SlackThread

log = logging.getLogger("opsloop.delivery")

HOLD_S = 0.0  # how long a reply's first words wait for a tool call before they show
EVERY_S = 0.15  # then what came is sent at most this often
ROOM = 400  # of Slack's 12,000 characters, kept for the end's cut pointer
IDLE_S = 900.0  # a thread no pass settled (its run went elsewhere) is forgotten then

Receipt = ev.MessagePosted | ev.StreamStopped


class _Answer:
    """One thread's reply while it is written: its text since the last reset, and what
    of it is in the plan message at ``ts``."""

    def __init__(self) -> None:
        self.raw = ""
        self.first_at: float | None = None  # when its first words came (monotonic)
        self.taken = 0  # how much of ``raw`` the last send looked at
        self.last = 0.0  # when it was last sent (monotonic)
        self.shown = ""  # this reply's text in the message, escaped
        self.generation = 0  # resets so far: a send that lands after one sent no answer
        self.off = False  # nothing more of this reply is sent (the end shows it)
        self.ts = ""  # the plan message ("" while not known)
        self.channel = ""
        self.closed = False
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def void(self) -> None:
        self.generation += 1
        self.raw, self.first_at, self.taken, self.shown = "", None, 0, ""
        self.off, self.ts, self.channel = False, "", ""


class AnswerStreams:
    """The answers being written in one process's threads (see the module docstring)."""

    def __init__(self, d: Delivery, *, hold: float = HOLD_S, every: float = EVERY_S) -> None:
        self.d = d
        self.hold = hold
        self.every = every
        self._answers: dict[str, _Answer] = {}
        self._early: dict[str, list[Receipt]] = {}  # receipts of passes the answer made

    def text(self, thread_id: str, delta: str, *, reset: bool = False) -> None:
        """A piece of the answer of ``thread_id`` (or a reset): kept, never waited on."""
        a = self._answers.get(thread_id)
        if reset:
            if a is not None:
                if a.shown and a.ts:
                    self._junk(a.ts)  # in the message, and no answer
                a.void()
                a.wake.set()
            return
        if not delta:
            return
        if a is None:
            a = self._answers[thread_id] = _Answer()
            a.task = asyncio.get_running_loop().create_task(self._loop(thread_id, a))
        if a.first_at is None:
            a.first_at = time.monotonic()
        a.raw += delta
        a.wake.set()

    def holds(self, thread_id: str) -> bool:
        """Whether a pass over ``thread_id`` has receipts of ours to record."""
        return bool(self._early.get(thread_id))

    async def settle(self, thread_id: str) -> None:
        """The model is done with ``thread_id`` for now: its send in flight lands, nothing
        more of it is sent."""
        a = self._answers.pop(thread_id, None)
        if a is None:
            return
        a.closed = True
        a.wake.set()
        if a.task is not None:
            await asyncio.gather(a.task, return_exceptions=True)

    def take(self, thread_id: str) -> list[Receipt]:
        """The receipts of what the answer of ``thread_id`` showed, for a pass to record."""
        return self._early.pop(thread_id, [])

    async def close(self) -> None:
        tasks = [a.task for a in self._answers.values() if a.task is not None]
        self._answers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the thread's task ------------------------------------------------------------

    async def _loop(self, thread_id: str, a: _Answer) -> None:
        while not a.closed:
            wait = self._due_in(a)
            if wait is None or wait > 0:
                a.wake.clear()
                try:
                    await asyncio.wait_for(a.wake.wait(), wait or IDLE_S)
                except TimeoutError:
                    if wait is None and self._answers.get(thread_id) is a:
                        del self._answers[thread_id]  # nothing came for long: done
                        return
                continue
            try:
                await self._send(thread_id, a)
            except Stop as stop:
                log.info("answer not streamed thread_id=%s error=%s", thread_id, stop)
                a.off = True
            except Exception:  # showing progress never stops the work
                log.warning("answer not streamed thread_id=%s", thread_id, exc_info=True)
                a.off = True

    def _due_in(self, a: _Answer) -> float | None:
        """Seconds until what came of the reply is to be sent (None: nothing to send)."""
        if a.off or a.first_at is None or a.taken == len(a.raw):
            return None
        return max(a.first_at + self.hold, a.last + self.every) - time.monotonic()

    async def _send(self, thread_id: str, a: _Answer) -> None:
        generation = a.generation
        a.taken, a.last = len(a.raw), time.monotonic()
        text = growing_markdown(a.raw)
        if not text.startswith(a.shown) or slack_len(text) > MAX_MARKDOWN - ROOM:
            a.off = True  # no longer a prefix of what the end shows: the end replaces it
            return
        piece = text[len(a.shown) :]
        if not piece:
            return
        if not a.ts:
            await self._place(thread_id, a, piece, generation)
        else:
            await self._append(thread_id, a, piece, generation)

    async def _place(self, thread_id: str, a: _Answer, piece: str, generation: int) -> None:
        """Find the run's plan message (or start it with ``piece``), then send to it."""
        d = self.d
        slack = await d._slack_thread(thread_id)
        if slack.unrooted:
            a.off = True
            return
        events = [*await d.store.select_events(thread_id), *self._early.get(thread_id, [])]
        if a.closed or generation != a.generation:
            return
        plan = answering(events, live_plan=d.plans.live(slack.channel))
        current = plan.current if plan is not None else None
        if plan is None or (current is not None and not plan.open):
            a.off = True  # lines, or its message is closed: the pass shows the answer
            return
        if current is None:
            await self._start(thread_id, a, slack, events, piece, generation)
            return
        if (d.clock() - current.created_at).total_seconds() >= d.plans.rotate_after:
            a.off = True  # the next pass continues it in a new segment
            return
        where = f"thread_id={thread_id} event_id={plan.run.start.event_id}"
        sent = d.plans.sent.get(current.ts)
        if sent is None:  # not sent to here: a restart, a takeover
            sent = await stream.resync_plan(
                d, slack.channel, plan, current.ts, where, thread_id=thread_id
            )
        if a.closed or generation != a.generation or sent.answer is None:
            a.off = a.off or sent.answer is None
            return
        a.ts, a.channel = current.ts, slack.channel
        await self._append(thread_id, a, piece, generation)

    async def _start(
        self,
        thread_id: str,
        a: _Answer,
        slack: _SlackThread,
        events: list[ev.AnyEvent],
        piece: str,
        generation: int,
    ) -> None:
        """A pass over the thread that starts the open run's plan message with ``piece``."""
        from bot.delivery import _Pass, _ToRunner  # they use this module

        sink = _ToRunner(self.d, thread_id, events)
        p = _Pass(self.d, slack, sink, answer=piece)
        try:
            await p.run()
        except Stop as stop:
            log.info("answer not streamed thread_id=%s error=%s", thread_id, stop)
        finally:
            if sink.handed:
                self._early.setdefault(thread_id, []).extend(sink.handed)
        if not p.answered:
            a.off = True  # adopted or refused: the pass at the end shows the answer
        elif generation != a.generation:
            self._junk(p.answered)
        else:
            a.ts, a.channel, a.shown = p.answered, slack.channel, piece

    async def _append(self, thread_id: str, a: _Answer, piece: str, generation: int) -> None:
        d = self.d
        sent = d.plans.sent.get(a.ts)
        if sent is None or sent.answer is None:
            a.off = True
            return
        so_far, sent.answer = sent.answer, None  # not known until Slack says it took it
        try:
            await stream.append_stream(
                d, f"thread_id={thread_id}", a.channel, a.ts, markdown_text=piece
            )
        except Stop as stop:
            a.off = True
            sent.answer = so_far
            if not surely_not_done(stop):
                sent.junk = True  # part of it may be there: the end replaces it
            log.info("answer not streamed thread_id=%s error=%s", thread_id, stop)
            return
        faults.hit("stream_answering")  # crash tests: the answer partly streamed
        if generation != a.generation:
            sent.junk, sent.answer = True, ""
            return
        sent.answer = so_far + piece
        a.shown += piece

    def _junk(self, ts: str) -> None:
        """The message at ``ts`` holds words that were no answer: replaced at the end."""
        sent = self.d.plans.sent.get(ts)
        if sent is not None:
            sent.junk, sent.answer = True, ""
