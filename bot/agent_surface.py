"""The thread's loading status and agent session in Slack, following its log.

:class:`AgentSurface` calls ``assistant.threads.setStatus`` with the words of
:func:`bot.render.agent_status.loading_status` when they change ("is thinking…", "is
running check_health…", "" to clear it once the thread waits or rests), sets them again
before Slack's two-minute timeout while the same step runs (a timer per thread), and
``agents.sessions.setStatus`` (processing, suspended, active, closed, and the title) when
the session changes. A workspace where the app is not declared an agent answers
``not_authorized``: noted once, and its sessions are not set again. No Slack error
reaches the run: each is logged once per thread and kind.
https://docs.slack.dev/reference/methods/assistant.threads.setStatus

:class:`FollowingDoor` wires it: the runner's front door (``Delivery``) with the surface
following each batch it shows, each model call (``working``) and each thread at rest
(``deliver``, the worker's after-run hook), so the status clears when the run stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.render.agent_status import LOADING_MESSAGES, loading_status, session_status, session_title
from engine import events as ev
from engine.alerts import is_pending_root
from engine.errors import ThreadNotFound
from engine.state import ThreadState, reduce
from engine.store import Store

log = logging.getLogger("opsloop.surface")

# Slack drops a loading status after two minutes without a message: set it again before.
REFRESH_S = 100.0
CALL_TIMEOUT_S = 10.0  # a Slack call that hangs holds the run back no longer
REMEMBERED = 10_000  # threads whose shown status and session this process remembers
STATUS, SESSION = "assistant.threads.setStatus", "agents.sessions.setStatus"


class Timer(Protocol):
    def cancel(self) -> object: ...


# ``call_later(delay, callback)``: the event loop's, or a test's that fires when told.
CallLater = Callable[[float, Callable[[], None]], Timer]


@dataclass
class _Shown:
    """What this process last showed of one thread."""

    channel: str
    thread_ts: str
    team: str = ""
    words: str = ""  # the loading status ("" none)
    session: tuple[str, str] | None = None  # (status, title or "") last set
    title: str | None = None  # the session's title, from the whole log
    timer: Timer | None = None
    noted: set[str] = field(default_factory=set)  # error kinds logged for this thread
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class AgentSurface:
    """Drives one workspace client's loading statuses and agent sessions."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        refresh_s: float = REFRESH_S,
        call_later: CallLater | None = None,
    ) -> None:
        self.client = client
        self.refresh_s = refresh_s
        self._call_later = call_later
        self._shown: dict[str, _Shown] = {}
        self._no_sessions: set[str] = set()  # teams where the app is not an agent
        self._tasks: set[asyncio.Task[None]] = set()

    async def follow(
        self,
        thread_id: str,
        channel: str,
        thread_ts: str,
        state: ThreadState,
        events: Sequence[ev.AnyEvent],
        *,
        team: str = "",
        posted: bool = False,
    ) -> None:
        """Show ``state`` (its log: ``events``, from seq 1 or a compacted tail).
        ``posted``: the app just posted in the thread, which ends Slack's status."""
        shown = self._remember(thread_id, channel, thread_ts, team)
        async with shown.lock:
            words = loading_status(state, events) or ""
            if words != shown.words or (posted and words):
                await self._set_status(thread_id, shown, words)
            if shown.title is None and events and events[0].seq == 1:
                shown.title = session_title(events)
            await self._set_session(thread_id, shown, state)

    def titled(self, thread_id: str) -> bool:
        """Whether the session's title of ``thread_id`` is known (read from its log)."""
        shown = self._shown.get(thread_id)
        return shown is not None and shown.title is not None

    async def settle(self) -> None:
        """Wait for the refreshes under way."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop the refresh timers; let calls in flight end."""
        for shown in self._shown.values():
            _cancel(shown)
        await self.settle()

    # --- the loading status ---------------------------------------------------------

    async def _set_status(self, thread_id: str, shown: _Shown, words: str) -> None:
        _cancel(shown)
        loading = list(LOADING_MESSAGES) if words else None
        ok = await self._call(
            thread_id,
            shown,
            STATUS,
            self.client.assistant_threads_setStatus(
                channel_id=shown.channel,
                thread_ts=shown.thread_ts,
                status=words,
                loading_messages=loading,
            ),
        )
        # A failed clear is not retried (Slack drops the status within two minutes);
        # a failed set is, at the next change or refresh.
        shown.words = words if ok or not words else ""
        if shown.words:
            shown.timer = self._later(self.refresh_s, lambda: self._refresh(thread_id, shown))

    def _refresh(self, thread_id: str, shown: _Shown) -> None:
        """The timer: the same words again, if they still stand."""
        shown.timer = None
        task = asyncio.get_running_loop().create_task(self._refreshed(thread_id, shown))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refreshed(self, thread_id: str, shown: _Shown) -> None:
        async with shown.lock:
            if shown.words and shown.timer is None:
                await self._set_status(thread_id, shown, shown.words)

    def _later(self, delay: float, callback: Callable[[], None]) -> Timer:
        if self._call_later is not None:
            return self._call_later(delay, callback)
        return asyncio.get_running_loop().call_later(delay, callback)

    # --- the agent session ----------------------------------------------------------

    async def _set_session(self, thread_id: str, shown: _Shown, state: ThreadState) -> None:
        if shown.team in self._no_sessions:
            return
        status = session_status(state)
        # Unknown until a whole log is seen (a compacted run holds its tail): Slack then
        # keeps the title it has.
        title = shown.title
        if shown.session == (status, title or ""):
            return
        requester = state.requester or ""
        ok = await self._call(
            thread_id,
            shown,
            SESSION,
            self.client.agents_sessions_setStatus(
                channel_id=shown.channel,
                thread_ts=shown.thread_ts,
                status=status,
                title=title,
                initiator_user_id=requester if requester[:1] in ("U", "W") else None,
            ),
        )
        if ok:
            shown.session = (status, title or "")

    # --- Slack ----------------------------------------------------------------------

    async def _call(self, thread_id: str, shown: _Shown, method: str, call: Awaitable[Any]) -> bool:
        """Make ``call``; False (logged once per thread and kind) if it failed."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await call
            return True
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "error")
        except TimeoutError:
            error = "timeout"
        except Exception as exc:  # a connection lost, a bug in a fake: never the run's
            error = type(exc).__name__
        if method == SESSION and error == "not_authorized":
            self._no_sessions.add(shown.team)
            log.info(
                "agents.sessions.setStatus: not_authorized team=%s: the app is not declared "
                "an agent (features.agent_view), so its threads show no agent session",
                shown.team or "-",
            )
            return False
        kind = f"{method}:{error}"
        if kind not in shown.noted:
            shown.noted.add(kind)
            log.warning("%s failed thread_id=%s error=%s", method, thread_id, error)
        return False

    def _remember(self, thread_id: str, channel: str, thread_ts: str, team: str) -> _Shown:
        shown = self._shown.pop(thread_id, None)
        if shown is None or (shown.channel, shown.thread_ts) != (channel, thread_ts):
            shown = _Shown(channel, thread_ts, team)
        self._shown[thread_id] = shown  # the least recently followed is forgotten first
        if len(self._shown) > REMEMBERED:
            oldest = next(iter(self._shown))
            _cancel(self._shown.pop(oldest))
        return shown


def _cancel(shown: _Shown) -> None:
    if shown.timer is not None:
        shown.timer.cancel()
        shown.timer = None


R = TypeVar("R", bound=ev.Event)  # the receipts the wrapped door hands back


class FrontDoor(Protocol[R]):
    """What :class:`FollowingDoor` wraps: ``bot.delivery.Delivery``'s two verbs."""

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[R]: ...

    async def deliver(self, thread_id: str) -> int: ...


class FollowingDoor(Generic[R]):
    """``door`` (the runner's front door and the worker's after-run hook), with the
    agent surface following the thread: after each batch ``show`` hands back, before
    each model call (``working``, the runner's optional hook) and once the thread
    rests (``deliver``). Any other attribute is ``door``'s (its optional hooks)."""

    def __init__(self, door: FrontDoor[R], surface: AgentSurface, store: Store) -> None:
        self.door = door
        self.surface = surface
        self.store = store
        self._where: dict[str, tuple[str, str, str]] = {}  # thread -> team, channel, root

    def __getattr__(self, name: str) -> Any:
        return getattr(self.door, name)

    async def show(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> list[R]:
        receipts = await self.door.show(thread_id, events, state)
        await self._follow(thread_id, state, events, posted=bool(receipts))
        return receipts

    async def working(
        self, thread_id: str, events: Sequence[ev.AnyEvent], state: ThreadState
    ) -> None:
        await self._follow(thread_id, state, events)

    async def deliver(self, thread_id: str) -> int:
        made = await self.door.deliver(thread_id)
        try:
            # The state (a snapshot and its tail); the whole log only for the title.
            if self.surface.titled(thread_id):
                state, events = await self.store.load(thread_id), []
            else:
                events = await self.store.select_events(thread_id)
                state = reduce(events)
        except Exception:
            log.warning("surface could not read thread_id=%s", thread_id, exc_info=True)
            return made
        await self._follow(thread_id, state, events, posted=made > 0)
        return made

    async def _follow(
        self,
        thread_id: str,
        state: ThreadState,
        events: Sequence[ev.AnyEvent],
        *,
        posted: bool = False,
    ) -> None:
        try:
            where = await self._place(thread_id)
            if where is None:
                return
            team, channel, root = where
            await self.surface.follow(
                thread_id, channel, root, state, events, team=team, posted=posted
            )
        except Exception:  # showing progress never stops the work
            log.warning("agent surface failed thread_id=%s", thread_id, exc_info=True)

    async def _place(self, thread_id: str) -> tuple[str, str, str] | None:
        """Where the thread is in Slack; None while an alert's root is not posted yet."""
        where = self._where.get(thread_id)
        if where is not None:
            return where
        try:
            info = await self.store.get_thread(thread_id)
        except ThreadNotFound:
            return None
        if is_pending_root(info.root_ts):
            return None
        where = self._where[thread_id] = (info.team, info.channel, info.root_ts)
        if len(self._where) > REMEMBERED:
            del self._where[next(iter(self._where))]
        return where
