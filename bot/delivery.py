"""Delivery: show in the Slack thread what the log says people need to see.

What a thread shows is a projection of its events (DESIGN, "Slack"): one message per
shown event (the approval card; one line per tool call, result, question, error,
answer), the card updated in place when its approval is decided, expires or the thread
is cancelled, and the thread's status message (with its Cancel button while the thread
is active) posted first and updated in place as the status changes; each delivery is
recorded as a ``message_posted`` receipt. The pure
:func:`bot.outbox.pending_deliveries` says what is still to do; :class:`Delivery` does it
in log order, one thread at a time.

One writer per lease: while the runner holds a thread, it calls :meth:`Delivery.show`
(the engine's ``FrontDoor``) with the log and state it holds; the pass posts and hands
the receipts back for the runner to append with its next batch. :meth:`Delivery.deliver`
shows a thread at rest, under a lease of its own, and appends the receipts itself. The
two differ only in where receipts go (``_ToRunner``, ``_ToLog``); the Slack side of a
pass is one ``_SlackThread``.

chat.postMessage has no idempotency key, so every post carries metadata naming its
event; where an earlier post may have landed without its receipt (first post for the
thread in this process, an unknown outcome, an event older than a lease), the thread is
read back (conversations.replies) and what is there gets its receipt instead of a
second post. A post outside the thread (an expiry escalated to a channel) is looked for
in that channel (conversations.history); one Slack refuses there for good goes in the
thread instead.

Each run (from an input to the next stop) is one streamed plan message instead of its
lines (DESIGN, "The thread as a live plan"): :mod:`bot.plan_outbox` says which runs and
where each stands, :mod:`bot.stream` does their Slack side within the same passes, in
log order with the posts (a run's plan above the card it stops at). Its receipts are
recorded as posts' are, and a pass's look back also finds a plan message started
without its receipt. The final answer is streamed into its plan message while the
model writes it (:meth:`Delivery.answer_text`, :mod:`bot.answer_stream`), and a running
MCP call's progress shows in its task card's title (``progress``: nothing recorded).

A thread an alert opened is stored before it has a place in Slack (its root is a
placeholder, ``engine.alerts.pending_root``): its first post is the alert, at the top of
the channel, and the thread then moves to that post (``Store.set_root``) before anything
else is posted in it. Where that post may be in Slack without the move, it is looked for
at the top of the channel by its metadata, as an escalation's post is.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot import stream
from bot.answer_stream import HOLD_S, AnswerStreams
from bot.oncall import OnCall
from bot.outbox import (
    Outbound,
    metadata,
    on_call_in,
    pending_deliveries,
    render,
    shown_event,
    shown_upto,
)
from bot.plan_outbox import PlanRun, plan_runs
from bot.render.notification import fallback_text
from bot.render.oncall import OnCallNow
from bot.render.tasks import progress_note, task_id, titled
from bot.slack_calls import Stop as _Stop
from bot.slack_calls import call, refusal, surely_not_done
from bot.slack_metrics import instrument
from bot.stream import ROTATE_AFTER_S, DisplayMode, PlanMessages
from engine import events as ev
from engine import faults
from engine.alerts import is_pending_root
from engine.leases import Lease
from engine.logs import bind
from engine.retrying import retrying
from engine.reviewers import ANYONE, ReviewerRule
from engine.state import ThreadState, reduce
from engine.store import Store, ThreadInfo
from tools.mcp.progress import ProgressHub

log = logging.getLogger("opsloop.delivery")

MAX_RETRY_S = 300.0
MAX_RETRIES = 10  # in-process retries in a row; then the next deliver call or a restart
_MAX_STEPS = 1000  # Slack calls per pass; the next pass does the rest
_REMEMBERED = 10_000  # threads this process remembers having looked up in Slack
_MAX_HISTORY_PAGES = 10  # of a channel, looking for a post made outside the thread
ROOT_LOOKBACK_S = 600.0  # an alert's root post is looked for from this long before it


Receipt = ev.MessagePosted | ev.StreamStopped  # what a pass records
Planned = tuple[PlanRun, stream.Step]  # a run's plan message and what it needs next


class Delivery:
    """Shows threads in Slack. One instance per process: it serialises its own passes
    over a thread; the lease keeps other processes out.

    ``owner`` names the lease of a pass over a thread at rest (a lease found held by
    the same owner is used and left in place). ``reviewers``: the process's rule, whose
    approvers the status message names for a call that records no rule of its own.
    ``retry_base``: first delay of the in-process retry of a pass a Slack error stopped
    (None: only the next ``deliver`` call retries). ``on_call``: who is on call, for
    the ``oncall:`` approvers a card shows and a reminder or an escalation mentions
    (None: no PagerDuty here; they are said to reach nobody). ``live_plan``: each run
    is one streamed plan message where Slack allows (False: a line per call and answer,
    as before plans); ``task_display_mode`` and ``rotate_after`` (seconds a stream
    segment lives): see :class:`bot.stream.PlanMessages`. ``answer_hold``: seconds the
    first words of a reply wait before they are streamed (:mod:`bot.answer_stream`).
    ``progress``: the hub whose MCP progress the task cards show (None: not shown).
    """

    def __init__(
        self,
        store: Store,
        client: AsyncWebClient,
        *,
        owner: str,
        reviewers: ReviewerRule = ANYONE,
        max_inline_wait: float = 5.0,
        lease_ttl: float = 30.0,
        retry_base: float | None = 2.0,
        clock: Callable[[], datetime] = ev.utcnow,
        on_call: OnCall | None = None,
        live_plan: bool = True,
        task_display_mode: DisplayMode = "plan",
        rotate_after: float = ROTATE_AFTER_S,
        answer_hold: float = HOLD_S,
        progress: ProgressHub | None = None,
    ) -> None:
        self.store = store
        self.on_call = on_call
        # Every call of this client (and of the copy below) is counted for GET /metrics.
        self.client = instrument(client)
        # slack_sdk re-sends a post after a connection error: a second message if the
        # first landed. Posts use a copy without that retry; we look in Slack instead.
        self._post_client = copy.copy(client)
        self._post_client.retry_handlers = [
            h for h in client.retry_handlers if not isinstance(h, AsyncConnectionErrorRetryHandler)
        ]
        self.owner = owner
        self.reviewers = reviewers
        self.max_inline_wait = max_inline_wait
        self.lease_ttl = lease_ttl
        self.retry_base = retry_base
        self.clock = clock
        # In-process facts; they only save Slack calls. After a restart all are unknown.
        self._looked: dict[str, None] = {}  # threads looked up in Slack, oldest first
        # Where each thread is in Slack (its key never changes): read once per process.
        self._where: dict[str, _Where] = {}  # thread id -> (channel, root ts, team)
        self.plans = PlanMessages(
            live=live_plan, display_mode=task_display_mode, rotate_after=rotate_after
        )
        self._unsure: set[str] = set()  # a post's outcome is unknown: look before posting
        # Events whose receipts were handed to the runner, per thread: until the log has
        # them (the runner may die first), a post may be in Slack without its receipt.
        self._handed: dict[str, set[str]] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.answers = AnswerStreams(self, hold=answer_hold)
        self._unlisten = progress.listen(self._progress) if progress is not None else None

    async def deliver(self, thread_id: str) -> int:
        """Show what ``thread_id`` at rest still has to show; how many posts and updates
        it made.

        0 when another owner holds the thread's lease: the holder (the runner) has it
        shown when done. A Slack error stops the pass where it happened (logged;
        retried later).
        """
        with bind(thread_id=thread_id):
            return await self._deliver(thread_id)

    async def _deliver(self, thread_id: str) -> int:
        async with self._exclusive(thread_id):
            events = await self.store.select_events(thread_id)
            if not self._due(thread_id, events):
                return 0
            info = await self.store.get_thread(thread_id)
            now = self.clock()
            live = info.lease_owner is not None and (info.lease_expires_at or now) > now
            held = live and info.lease_owner == self.owner  # ours already: left in place
            lease = await Lease.take(
                self.store, thread_id, self.owner, self.lease_ttl, clock=self.clock, leave=held
            )
            if lease is None:
                log.debug("thread leased elsewhere thread_id=%s", thread_id)
                # A live holder shows it when done; a dead one (a crash) holds the lease
                # until it expires: look again then, or nothing shows an idle thread.
                until = (info.lease_expires_at or now) - now
                self._retry_later(thread_id, max(0.5, until.total_seconds() + 0.5))
                return 0
            async with lease:
                sink = _ToLog(self.store, events, lease, self.clock)
                run = _Pass(self, await self._slack_thread(thread_id, info), sink)
                try:
                    # The log only grows: what others appended before we held the lease.
                    await sink.catch_up()
                    await self._settle(run)
                    made = await run.run()
                except _Stop as stop:
                    self._retry_later(thread_id, stop.retry_in)
                    return run.made
                except Exception:
                    self._retry_later(thread_id, None)
                    raise
            self._failures.pop(thread_id, None)
            return made

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[Receipt]:
        """Show what ``thread_id`` has to show under the lease its runner holds, and
        return the receipts for the runner to append (the engine's ``FrontDoor``).

        ``events`` and ``state``: the log and its state as the runner holds them, shown
        without reading them again. Only a log that is not whole (a compacted thread's
        tail) is read here.
        A Slack error stops the pass where it happened (logged): what was shown until
        then is returned, and the pass at rest, after the run, does the rest.
        """
        async with self._exclusive(thread_id):
            log = list(events)
            if not log or log[0].seq != 1 or log[-1].seq != state.last_seq:
                log = await self.store.select_events(thread_id)
            if not self._due(thread_id, log):
                return []
            sink = _ToRunner(self, thread_id, log)
            run = _Pass(self, await self._slack_thread(thread_id), sink)
            try:
                await self._settle(run)
                await run.run()
            except _Stop:
                pass
            return sink.handed

    async def answer_text(self, thread_id: str, delta: str, *, reset: bool = False) -> None:
        """The runner's ``StreamsAnswers`` hook: the answer's text while the model writes
        it, streamed into the run's plan message from a task of its own (it returns at
        once): see :mod:`bot.answer_stream`. Nothing where runs are lines."""
        if self.plans.live_plan:
            self.answers.text(thread_id, delta, reset=reset)

    async def deliver_recent(self, since: datetime) -> None:
        """Deliver every thread updated since ``since``: at startup, finish what a crash
        cut off. One thread's failure does not stop the others."""
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
        for info in await self.store.list_threads(limit=100_000):
            if info.updated_at < since:
                break  # newest first
            try:
                await self.deliver(info.id)
            except Exception:
                log.exception("delivery failed thread_id=%s", info.id)

    async def close(self) -> None:
        """Cancel the retries this instance scheduled."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        await self.answers.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- internals ------------------------------------------------------------------

    def _pending(self, events: Sequence[ev.AnyEvent], channel: str | None) -> list[Outbound]:
        """The posts and updates still due (``channel``: the thread's, None if not known
        yet: then as if it took streams)."""
        live = self.plans.live(channel) if channel is not None else self.plans.live_plan
        return pending_deliveries(events, reviewers=self.reviewers, live_plan=live)

    def _planned(
        self, events: Sequence[ev.AnyEvent], channel: str | None, *, answering: bool = False
    ) -> list[Planned]:
        """The plan messages with something to do now, and what (``answering``: the open
        run's answer is being written: see :func:`bot.plan_outbox.plan_runs`)."""
        live = self.plans.live(channel) if channel is not None else self.plans.live_plan
        now = self.clock()
        return [
            (plan, step)
            for plan in plan_runs(events, live_plan=live, answering=answering)
            if (step := self.plans.step(plan, now)) is not None
        ]

    def _due(self, thread_id: str, events: Sequence[ev.AnyEvent]) -> bool:
        if self.answers.holds(thread_id):
            return True
        channel = where[0] if (where := self._where.get(thread_id)) else None
        return bool(self._pending(events, channel) or self._planned(events, channel))

    async def _settle(self, run: _Pass) -> None:
        """Before a pass: the thread's streamed answer settles (what is in flight lands;
        the rest is the pass's), and the receipts of what it showed early are recorded
        first (or handed to the runner)."""
        await self.answers.settle(run.thread_id)
        early = self.answers.take(run.thread_id)
        if early:
            await run.record(early)
            if isinstance(run.sink, _ToLog):  # in the log now: no need to look for them
                shown = {r.shows_event_id for r in early if isinstance(r, ev.MessagePosted)}
                self._handed.get(run.thread_id, set()).difference_update(shown)

    # --- progress ---------------------------------------------------------------------

    def _progress(
        self,
        thread_id: str,
        tool_call_id: str,
        progress: float,
        total: float | None,
        message: str | None,
    ) -> None:
        """A running MCP call's progress (``ProgressHub``'s listener, on the loop): its
        task card's title says it, in the background."""
        if self.plans.latest(thread_id) is None:
            return  # no plan message here (lines, or another process shows it)
        note = progress_note(progress, total, message)
        task = asyncio.get_running_loop().create_task(
            self._show_progress(thread_id, tool_call_id, note)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _show_progress(self, thread_id: str, tool_call_id: str, note: str) -> None:
        """Append the card's title with ``note`` to the plan message showing the call, if
        the card is still in progress there. The card's title as the log says it is
        kept (:class:`bot.stream.Sent`): the next change of the card replaces this one."""
        async with self._exclusive(thread_id):
            found = self.plans.latest(thread_id)
            if found is None:
                return
            ts, sent = found
            key = task_id(tool_call_id)
            card = sent.shown.get(key)
            if card is None or card.get("status") != "in_progress" or not sent.channel:
                return
            chunk = {
                "type": "task_update",
                "id": key,
                "title": titled(str(card.get("title", "")), note),
                "status": "in_progress",
            }
            where = f"thread_id={thread_id} tool_call_id={tool_call_id}"
            try:
                await self._call(
                    "chat.appendStream",
                    self.client.chat_appendStream,
                    where,
                    channel=sent.channel,
                    ts=ts,
                    chunks=[chunk],
                )
            except _Stop as stop:  # progress is a courtesy: the card's next change wins
                log.info("progress not shown %s error=%s", where, stop)

    async def _slack_thread(self, thread_id: str, info: ThreadInfo | None = None) -> _SlackThread:
        """The thread in Slack. Its place never changes: read from its row once per
        process, unless ``info`` (just read) has it."""
        where = self._where.pop(thread_id, None)
        if where is None:
            info = info or await self.store.get_thread(thread_id)
            where = (info.channel, info.root_ts, info.team)
        if is_pending_root(where[1]):  # an alert's root, not posted yet: it will move
            return _SlackThread(self, thread_id, *where)
        self._where[thread_id] = where  # the least recently used is forgotten first
        if len(self._where) > _REMEMBERED:
            del self._where[next(iter(self._where))]
        return _SlackThread(self, thread_id, *where)

    @contextlib.asynccontextmanager
    async def _exclusive(self, thread_id: str) -> AsyncIterator[None]:
        """One pass per thread at a time in this process (a lease is per owner, and two
        passes with one owner would both hold it)."""
        lock, users = self._locks.get(thread_id) or (asyncio.Lock(), 0)
        self._locks[thread_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            users = self._locks[thread_id][1] - 1
            if users:
                self._locks[thread_id] = (lock, users)
            else:
                del self._locks[thread_id]

    def _retry_later(self, thread_id: str, delay: float | None) -> None:
        """Try again in this process: nothing else would show an idle thread's last
        events before its next input (a restart does, through ``deliver_recent``)."""
        failures = self._failures[thread_id] = self._failures.get(thread_id, 0) + 1
        if self.retry_base is None or failures > MAX_RETRIES:
            return
        if delay is None:
            delay = min(MAX_RETRY_S, self.retry_base * 2 ** (failures - 1))
        if (old := self._timers.pop(thread_id, None)) is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[thread_id] = loop.call_later(delay, self._spawn_retry, thread_id)

    def _spawn_retry(self, thread_id: str) -> None:
        self._timers.pop(thread_id, None)
        task = asyncio.get_running_loop().create_task(self._retry(thread_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retry(self, thread_id: str) -> None:
        try:
            await self.deliver(thread_id)
        except Exception:
            log.exception("delivery retry failed thread_id=%s", thread_id)

    def _note_looked(self, thread_id: str) -> None:
        self._looked.pop(thread_id, None)
        self._looked[thread_id] = None
        if len(self._looked) > _REMEMBERED:
            del self._looked[next(iter(self._looked))]
        self._unsure.discard(thread_id)

    async def _call(
        self, method: str, send: Callable[..., Awaitable[Any]], where: str, **kwargs: Any
    ) -> Any:
        """One Web API call (:func:`bot.slack_calls.call`): 429s up to
        ``max_inline_wait`` waited out, any other failure a ``_Stop``."""
        return await call(method, send, where, self.max_inline_wait, **kwargs)


Posted = tuple[str, str]  # a message's ts and channel
_Where = tuple[str, str, str]  # a thread's channel, root ts and team


class _SlackThread:
    """One agent thread's thread in Slack: looks back through it, posts into it and
    updates its messages, through the delivery's clients (``_call``: 429s waited out,
    any other failure a ``_Stop``)."""

    def __init__(
        self, d: Delivery, thread_id: str, channel: str, root_ts: str, team: str = ""
    ) -> None:
        self.d = d
        self.thread_id = thread_id
        self.channel = channel
        self.root_ts = root_ts
        self.team = team

    @property
    def unrooted(self) -> bool:
        """Whether the thread's root is still a placeholder: an alert's thread whose
        post at the top of the channel is not known to be there (it has no thread in
        Slack yet to look back through or post into)."""
        return is_pending_root(self.root_ts)

    async def rooted(self, ts: str) -> None:
        """The root is the bot's post at ``ts``: the thread moves there (its row first,
        so replies in Slack find it), and so do this pass's posts."""
        await self.d.store.set_root(self.thread_id, self.root_ts, ts)
        self.root_ts = ts
        self.d._where.pop(self.thread_id, None)
        self.d._where[self.thread_id] = (self.channel, ts, self.team)

    async def replies(self) -> list[dict[str, Any]]:
        """The thread's messages, with their metadata."""
        messages: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self.d._call(
                "conversations.replies",
                self.d.client.conversations_replies,
                f"thread_id={self.thread_id}",
                channel=self.channel,
                ts=self.root_ts,
                include_all_metadata=True,
                limit=200,
                cursor=cursor,
            )
            messages += [m for m in page.get("messages") or [] if isinstance(m, dict)]
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor or not page.get("has_more", True):
                return messages

    def showing(
        self, messages: list[dict[str, Any]], wanted: list[str]
    ) -> dict[str, dict[str, Any]]:
        """The first message of ``messages`` showing each event of ``wanted``, by its id."""
        found: dict[str, dict[str, Any]] = {}
        for message in messages:
            event_id = shown_event(message, self.thread_id)
            if event_id in wanted and isinstance(message.get("ts"), str):
                found.setdefault(event_id, message)
        return found

    async def look_in_channel(
        self, channel: str, event_id: str, since: str
    ) -> dict[str, Any] | None:
        """The message at the top of ``channel``, posted after ts ``since`` (Slack's
        clock: the card's ts), that shows ``event_id``; None when there is none, or Slack
        refuses to say (a post there is then refused too, and goes in the thread, where
        :meth:`look_back` looks)."""
        cursor: str | None = None
        for _ in range(_MAX_HISTORY_PAGES):
            try:
                page = await self.d._call(
                    "conversations.history",
                    self.d.client.conversations_history,
                    f"thread_id={self.thread_id} channel={channel}",
                    channel=channel,
                    oldest=since or None,
                    include_all_metadata=True,
                    limit=200,
                    cursor=cursor,
                )
            except _Stop as stop:
                if refusal(stop) is None:
                    raise
                return None
            for message in page.get("messages") or []:
                if shown_event(message, self.thread_id) == event_id and message.get("ts"):
                    return message
            cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor or not page.get("has_more", True):
                break
        return None

    async def permalink(self, ts: str, where: str) -> str | None:
        """The link to message ``ts`` of the thread, from Slack; None if Slack gave none
        (a reminder is still worth posting without it)."""
        try:
            answer = await self.d._call(
                "chat.getPermalink",
                self.d.client.chat_getPermalink,
                where,
                channel=self.channel,
                message_ts=ts,
            )
        except _Stop:
            return None
        link = answer.get("permalink")
        return link if isinstance(link, str) else None

    async def post(
        self, message: dict[str, Any], shows: dict[str, Any], where: str, channel: str = ""
    ) -> Posted:
        """Post ``message`` in the thread (or at the top of ``channel``); its ts and
        channel. A post whose outcome is unknown marks the thread: the next pass looks
        back before posting."""
        place = {"channel": channel} if channel else {"channel": self.channel}
        if not channel:
            place["thread_ts"] = self.root_ts
        try:
            answer = await self.d._call(
                "chat.postMessage",
                self.d._post_client.chat_postMessage,
                where,
                metadata=shows,
                **place,
                **message,
            )
        except BaseException as exc:
            if not surely_not_done(exc):
                self.d._unsure.add(self.thread_id)  # it may have been posted
            raise
        faults.hit("slack_posted")  # crash tests: Slack has it, our log does not yet
        return answer["ts"], answer.get("channel") or place["channel"]

    async def update(
        self, ts: str, message: dict[str, Any], shows: dict[str, Any], where: str
    ) -> Posted:
        """Update the message at ``ts`` in place."""
        await self.d._call(
            "chat.update",
            self.d.client.chat_update,
            where,
            channel=self.channel,
            ts=ts,
            metadata=shows,
            **message,
        )
        return ts, self.channel


class _ToRunner:
    """Receipts of a pass under the runner's lease: handed to the runner, which appends
    them with its next batch. The pass shows the log as the runner had it."""

    def __init__(self, d: Delivery, thread_id: str, events: list[ev.AnyEvent]) -> None:
        self.d = d
        self.thread_id = thread_id
        self.events = events
        self.handed: list[Receipt] = []

    def check(self) -> None:
        """The runner stops the turn when its lease is lost; nothing to check here."""

    async def catch_up(self) -> list[ev.AnyEvent]:
        return []  # the runner's log as it was; its receipts are drafts

    async def record(self, receipts: list[Receipt]) -> None:
        self.handed += receipts
        shown = (r.shows_event_id for r in receipts if isinstance(r, ev.MessagePosted))
        self.d._handed.setdefault(self.thread_id, set()).update(shown)
        self.events.extend(receipts)


class _ToLog:
    """Receipts of a pass under a lease of its own: appended to the log, re-reading past
    what another writer (a click, a reply) appended meanwhile."""

    def __init__(
        self,
        store: Store,
        events: list[ev.AnyEvent],
        lease: Lease,
        clock: Callable[[], datetime] = ev.utcnow,
    ) -> None:
        self.store = store
        self.thread_id = lease.thread_id
        self.events = events
        self.state = reduce(events)
        self.lease = lease
        self.clock = clock  # stamps the receipts, as the runner's stamps its batches

    def check(self) -> None:
        if self.lease.lost.is_set():
            raise _Stop("lease lost")

    async def catch_up(self) -> list[ev.AnyEvent]:
        tail = await self.store.select_events(self.thread_id, after=self.state.last_seq)
        self.events.extend(tail)
        self.state = reduce(tail, self.state)
        return tail

    async def record(self, receipts: list[Receipt]) -> None:
        todo = list(receipts)

        async def reread() -> None:
            tail = await self.catch_up()
            have = {_same(e) for e in tail if isinstance(e, ev.MessagePosted | ev.StreamStopped)}
            todo[:] = [r for r in todo if _same(r) not in have]

        async def once() -> None:
            if not todo:
                return
            done = await self.store.append(
                self.thread_id, self.state.last_seq, todo, state=self.state, now=self.clock()
            )
            assert done.state is not None
            self.events.extend(done.events)
            self.state = done.state

        await retrying(once, reread=reread)


def _same(receipt: Receipt) -> tuple[str, str, str]:
    """What makes two receipts the same record."""
    if isinstance(receipt, ev.StreamStopped):
        return ("stopped", "", receipt.ts)
    return (receipt.kind, receipt.shows_event_id, receipt.ts)


class _Pass:
    """One pass over one thread: show what is pending, in log order, in ``slack``.
    ``sink`` holds the log as the pass knows it and takes the receipts."""

    def __init__(
        self,
        delivery: Delivery,
        slack: _SlackThread,
        sink: _ToRunner | _ToLog,
        *,
        answer: str = "",
    ) -> None:
        self.d = delivery
        self.slack = slack
        self.thread_id = slack.thread_id
        self.sink = sink
        self.made = 0
        # The first words of the open run's answer, being written (bot.answer_stream):
        # its plan message is started with them; ``answered`` is then its ts.
        self.answer = answer
        self.answered = ""

    async def run(self) -> int:
        events = self.sink.events
        channel = self.slack.channel
        answering = bool(self.answer)
        planned = self.d._planned(events, channel, answering=answering)
        look = self._must_look(self.d._pending(events, channel), planned)
        self.d._handed.pop(self.thread_id, None)  # looked at: what is still due is in todo
        for _ in range(_MAX_STEPS):
            todo = self.d._pending(events, self.slack.channel)
            plans = self.d._planned(events, self.slack.channel, answering=answering)
            starts = [plan for plan, step in plans if step == "start"]
            if not todo and not plans:
                if not await self.sink.catch_up():  # nothing appended meanwhile: done
                    break
            elif look and (any(item.kind == "post" for item in todo) or starts):
                await self._look_in_slack(todo, starts)
                look = False
            elif plans and (not todo or plans[0][0].index < self._place(todo[0], events)):
                plan, step = plans[0]
                with bind(thread_id=self.thread_id, event_id=plan.run.start.event_id):
                    await stream.show(self, plan, step)
            else:
                await self._show(todo[0])
        else:
            raise _Stop("more to show than one pass does", retry_in=0.0)
        return self.made

    @staticmethod
    def _place(item: Outbound, events: list[ev.AnyEvent]) -> float:
        """Where ``item`` goes among the runs' plan messages: the status message first
        (and its updates last), anything else after the runs that began before it."""
        if item.status is not None:
            return -1 if item.kind == "post" else float("inf")
        eid = item.event.event_id
        return next((i for i, e in enumerate(events) if e.event_id == eid), float("inf"))

    async def record(self, receipts: list[Receipt]) -> None:
        """Record what this pass showed; if that fails, it is in Slack without a receipt."""
        try:
            await self.sink.record(receipts)
        except BaseException:
            self.d._unsure.add(self.thread_id)  # shown, but the log does not know it
            raise

    def _must_look(self, todo: list[Outbound], plans: list[Planned]) -> bool:
        """Whether a post of ``todo`` (or a plan message to start) may be in Slack
        without its receipt: not looked since this process started, a post's outcome
        unknown, receipts handed to the runner that the log does not have, or an event
        older than a lease (a deliverer may have died holding it, after posting)."""
        if self.thread_id not in self.d._looked or self.thread_id in self.d._unsure:
            return True
        handed = self.d._handed.get(self.thread_id, set())
        shown = [item.event for item in todo]
        shown += [plan.run.start for plan, step in plans if step == "start"]
        if any(e.event_id in handed for e in shown):
            return True
        now = self.d.clock()
        return any((now - e.created_at).total_seconds() > self.d.lease_ttl for e in shown)

    async def _look_in_slack(self, todo: list[Outbound], starts: list[PlanRun]) -> None:
        """Record receipts for the posts already in the Slack thread (for the status
        message, also the receipt of the last event whose state it shows), and for the
        plan messages of ``starts`` started there (:func:`bot.stream.adopt`)."""
        wanted = [item.event.event_id for item in todo if item.kind == "post"]
        messages: list[dict[str, Any]] = []
        if self.slack.unrooted:
            found = await self._look_for_root(todo)
        else:
            messages = await self.slack.replies()
            found = self.slack.showing(messages, wanted)
        known = {e.event_id for e in self.sink.events}
        receipts: list[Receipt] = []
        for eid in (eid for eid in wanted if eid in found):
            ts = found[eid]["ts"]
            upto = shown_upto(found[eid], self.thread_id)
            for shows in dict.fromkeys([eid, *([upto] if upto in known else [])]):
                receipts.append(
                    ev.MessagePosted(shows_event_id=shows, channel=self.slack.channel, ts=ts)
                )
        # A post meant for another channel is there, or (refused there) in the thread.
        for item in todo:
            eid = item.event.event_id
            if item.kind == "post" and item.channel and eid not in found:
                if there := await self.slack.look_in_channel(item.channel, eid, item.card_ts):
                    receipts.append(
                        ev.MessagePosted(shows_event_id=eid, channel=item.channel, ts=there["ts"])
                    )
        if starts and messages:
            adopted = stream.adopt(
                starts,
                messages,
                self.sink.events,
                thread_id=self.thread_id,
                channel=self.slack.channel,
                root_ts=self.slack.root_ts,
            )
            for found_stream in adopted:
                self.d.plans.sent.pop(found_stream.ts, None)  # what it holds is not known
            receipts += adopted
        if receipts:
            shown = ",".join(r.shows_event_id for r in receipts if isinstance(r, ev.MessagePosted))
            log.info(
                "posts found without receipts thread_id=%s event_ids=%s", self.thread_id, shown
            )
            await self.sink.record(receipts)
        self.d._note_looked(self.thread_id)

    async def _on_call(self, item: Outbound) -> OnCallNow | None:
        """Who is on call for the entries ``item`` names (bounded: a lookup that fails
        or is slow is shown as not known, never holds the thread)."""
        entries = on_call_in(item)
        if not entries or self.d.on_call is None:
            return None
        return await self.d.on_call.now(entries)

    async def _look_for_root(self, todo: list[Outbound]) -> dict[str, dict[str, Any]]:
        """An alert's thread whose root is a placeholder: its post may be at the top of
        the channel all the same (a crash between Slack's answer and the thread's move),
        found by its metadata; if so, the thread moves there. Nothing else of the thread
        can be in Slack before its root."""
        root = next((i for i in todo if i.status is not None and i.status.root), None)
        if root is None:
            return {}
        eid = root.event.event_id
        # Slack's clock against ours: a generous margin before the alert arrived.
        since = f"{root.event.created_at.timestamp() - ROOT_LOOKBACK_S:.6f}"
        found = await self.slack.look_in_channel(self.slack.channel, eid, since)
        if found is None:
            return {}
        log.info("root post found thread_id=%s ts=%s", self.thread_id, found["ts"])
        await self.slack.rooted(found["ts"])
        return {eid: found}

    async def _show(self, item: Outbound) -> None:
        with bind(thread_id=self.thread_id, event_id=item.event.event_id):
            await self._show_now(item)

    async def _show_now(self, item: Outbound) -> None:
        self.sink.check()
        event_id = item.event.event_id
        where = f"thread_id={self.thread_id} event_id={event_id}"
        link = None
        if item.kind == "post" and item.card is not None and item.card_ts:
            link = await self.slack.permalink(item.card_ts, where)  # a reminder's, say
        # Looked up as it is shown: a card says who is on call now (a click asks again).
        on_call = await self._on_call(item)
        message = _message(item, link, on_call)
        status = item.status
        if status is not None:  # the first user_message's, and the state's last event
            shows = metadata(self.thread_id, status.anchor, upto=status.upto)
        elif item.kind == "update" and item.card is not None:
            shows = metadata(self.thread_id, item.card.event_id)  # the card's, unchanged
        else:
            shows = metadata(self.thread_id, event_id)
        if item.kind == "update":
            assert item.card_ts, "a message is posted before its update"
            ts, channel = await self.slack.update(item.card_ts, message, shows, where)
        elif status is not None and status.root is not None:
            # An alert's thread: its root is this post at the top of the channel. The
            # thread moves to it before the receipt is recorded; a crash between the
            # post and the move is healed by _look_for_root, one after the move by
            # look_back (the root is the first message of its own thread).
            ts, channel = await self.slack.post(message, shows, where, self.slack.channel)
            try:
                await self.slack.rooted(ts)
            except BaseException:
                self.d._unsure.add(self.thread_id)  # posted, but the thread did not move
                raise
        elif item.channel and not item.refusal:
            try:
                ts, channel = await self.slack.post(message, shows, where, item.channel)
            except _Stop as stop:
                if (refused := refusal(stop)) is None:
                    raise
                # Refused there for good (not in the channel, archived): in the thread
                # instead, saying so, rather than never.
                log.warning("post refused channel=%s %s error=%s", item.channel, where, refused)
                message = _message(replace(item, refusal=refused), link, on_call)
                ts, channel = await self.slack.post(message, shows, where)
        else:
            ts, channel = await self.slack.post(message, shows, where)
        self.made += 1
        # A status message shows the state after status.upto: that event's receipt says so.
        ids = dict.fromkeys([event_id, *([status.upto] if status is not None else [])])
        await self.record([ev.MessagePosted(shows_event_id=i, channel=channel, ts=ts) for i in ids])


def _message(
    item: Outbound, card_link: str | None, on_call: OnCallNow | None = None
) -> dict[str, Any]:
    blocks = render(item, card_link, on_call)
    return {"text": fallback_text(blocks), "blocks": blocks}
