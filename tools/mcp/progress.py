"""Progress of MCP tool calls (``notifications/progress``), kept in memory, passed on
at most once every few seconds per call.

Every ``tools/call`` carries a progress token; each notification the server sends for
it reaches :meth:`ProgressHub.report`. Nothing is recorded as an event (a progress bar
is not a transition of the thread): the hub calls its listeners with the latest
progress of a call, at once for the first notification and then no more often than
``every_s``; one that arrives sooner is held and passed on when the interval is up, so
the last word (100 %) is never lost. A listener is the front door's: the call's line or
its task card in the live plan. :data:`PROGRESS` is the process's hub.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

EVERY_S = 3.0

# on_progress(thread_id, tool_call_id, progress, total, message)
ProgressHook = Callable[[str, str, float, float | None, str | None], None]


@dataclass
class _Call:
    last: float  # when a listener last heard of it (the hub's clock)
    held: tuple[float, float | None, str | None] | None = None  # newer, not passed on yet
    flush: asyncio.TimerHandle | None = None


class ProgressHub:
    """Rate-limited fan-out of the progress of running calls to the listeners."""

    def __init__(
        self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.clock = clock
        self._hooks: list[ProgressHook] = []
        self._calls: dict[tuple[str, str], _Call] = {}

    def listen(self, hook: ProgressHook) -> Callable[[], None]:
        """Call ``hook`` with progress from now on; returns what stops it."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    def report(
        self,
        thread_id: str,
        tool_call_id: str,
        progress: float,
        total: float | None = None,
        message: str | None = None,
    ) -> None:
        """A notification of the call ``tool_call_id`` of ``thread_id`` (on the loop)."""
        key, now = (thread_id, tool_call_id), self.clock()
        call = self._calls.get(key)
        if call is None or now - call.last >= self.every_s:
            if call is not None and call.flush is not None:
                call.flush.cancel()
            self._calls[key] = _Call(last=now)
            self._tell(key, (progress, total, message))
            return
        call.held = (progress, total, message)
        if call.flush is None:
            delay = max(self.every_s - (now - call.last), 0.0)
            call.flush = asyncio.get_running_loop().call_later(delay, self._flush, key)

    def done(self, thread_id: str, tool_call_id: str) -> None:
        """The call ended (or waits for a person): forget it; nothing held is told."""
        call = self._calls.pop((thread_id, tool_call_id), None)
        if call is not None and call.flush is not None:
            call.flush.cancel()

    def _flush(self, key: tuple[str, str]) -> None:
        call = self._calls.get(key)
        if call is None or call.held is None:
            return
        held, call.held, call.flush, call.last = call.held, None, None, self.clock()
        self._tell(key, held)

    def _tell(self, key: tuple[str, str], said: tuple[float, float | None, str | None]) -> None:
        (thread_id, tool_call_id), (progress, total, message) = key, said
        for hook in list(self._hooks):
            try:
                hook(thread_id, tool_call_id, progress, total, message)
            except Exception:  # a listener's failure never stops the call
                log.warning("progress listener failed", exc_info=True)


PROGRESS = ProgressHub()
