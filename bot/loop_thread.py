"""An event loop of its own, in a thread, for the work that must never delay an ack.

Slack gives an answer 3 seconds, and each answer waits for one short transaction; a
burst of mentions starts as many runs (model calls, tools, posts). On one event loop
those runs queue ahead of the next request's callbacks. The worker and delivery
therefore run on this loop, with their own store and clients (asyncio objects belong
to the loop that made them), and the serving loop only stores inputs and kicks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("opsloop.loop")


class LoopThread:
    def __init__(self, name: str = "opsloop-worker") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Whatever ``run`` left behind is cancelled and awaited before the loop
            # closes, so no connection is left to be finalised by a dead loop.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on this loop; await its result from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def call(self, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` on this loop soon (thread-safe, returns at once)."""
        with contextlib.suppress(RuntimeError):  # the loop has stopped: shutting down
            self.loop.call_soon_threadsafe(fn, *args)

    async def stop(self) -> None:
        """Stop the loop and wait for its thread (after ``run``'s work is done)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join)


class AnswersFirst:
    """Answers to Slack before background runs.

    The serving loop counts the requests it is answering (``answering``); the worker
    awaits ``quiet`` on its loop before each run and each step. A burst of mentions thus
    gets its acknowledgements out first (each has a 3 s deadline) and the runs it
    started follow. Quiet means no request for ``settle_s``: the requests of a burst
    come back to back, and a run let in between two of them would hold the interpreter
    while the next waits. ``max_defer_s`` bounds the wait, so a steady stream of
    requests never starves the runs.
    """

    def __init__(
        self, thread: LoopThread, max_defer_s: float = 2.0, settle_s: float = 0.01
    ) -> None:
        self._thread = thread
        self.max_defer_s = max_defer_s
        self.settle_s = settle_s
        self.in_flight = 0
        # On the worker loop: one event all waiters share (set once per calm, so a
        # burst does not wake every waiting run at each gap), and the settling timer.
        self._calm: asyncio.Event | None = None
        self._settling: asyncio.TimerHandle | None = None

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Around one request, on the serving loop."""
        self.in_flight += 1
        if self.in_flight == 1:
            self._thread.call(self._update)
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._thread.call(self._update)

    def _event(self) -> asyncio.Event:
        if self._calm is None:
            # Not calm yet: an answer may have just been given (this call may be the one
            # it made); calm comes with the settling time after the count is zero.
            self._calm = asyncio.Event()
            if not self.in_flight:
                self._settling = self._thread.loop.call_later(self.settle_s, self._settled)
        return self._calm

    def _update(self) -> None:
        # Reads the count now: calls may arrive late, but the last one is right. Each
        # change of the count restarts the settling time.
        calm = self._event()
        if self._settling is not None:
            self._settling.cancel()
            self._settling = None
        if self.in_flight:
            calm.clear()
        elif not calm.is_set():
            self._settling = self._thread.loop.call_later(self.settle_s, self._settled)

    def _settled(self) -> None:
        self._settling = None
        if not self.in_flight:  # else the call that counted it is on its way
            self._event().set()

    async def quiet(self) -> None:
        """Return once no request has been answered for ``settle_s``, or after
        ``max_defer_s``."""
        calm = self._event()
        if calm.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(calm.wait(), self.max_defer_s)
