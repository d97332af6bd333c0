"""A thread's lease while one holds it: taken, kept alive by a heartbeat, released.

Whoever holds a thread's lease is the only one appending to its log: the runner for a
run, delivery for a pass over a thread at rest. The heartbeat renews the lease every
third of its ttl; when renewal finds it taken by another owner (a long pause, a
partition), ``lost`` is set and the holder starts nothing new. Appends stay safe even
then: ``expected_seq`` turns a stale writer into a conflict.

A lease is taken from another owner when it expired, or at once when its owner is a
registered worker that is provably dead (engine.workers): a paused owner keeps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from types import TracebackType

from engine.events import utcnow
from engine.store import Store

log = logging.getLogger("opsloop.leases")

Clock = Callable[[], datetime]


class Lease:
    """A held lease; ``async with`` it to keep it alive while inside and release it on
    the way out (unless ``leave``: it was held by the same owner before it was taken)."""

    def __init__(
        self,
        store: Store,
        thread_id: str,
        owner: str,
        ttl: float,
        *,
        clock: Clock = utcnow,
        leave: bool = False,
    ) -> None:
        self.store = store
        self.thread_id = thread_id
        self.owner = owner
        self.ttl = ttl
        self.clock = clock
        self.leave = leave
        self.lost = asyncio.Event()
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    async def take(
        cls,
        store: Store,
        thread_id: str,
        owner: str,
        ttl: float,
        *,
        clock: Clock = utcnow,
        leave: bool = False,
    ) -> Lease | None:
        """The lease, or None when another owner holds a live one."""
        if not await store.acquire_lease(thread_id, owner, ttl, now=clock()):
            return None
        return cls(store, thread_id, owner, ttl, clock=clock, leave=leave)

    async def __aenter__(self) -> Lease:
        self._heartbeat = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        if self.leave:
            return
        try:
            await self.store.release_lease(self.thread_id, self.owner)
        except Exception:  # it expires on its own; do not mask what happened inside
            log.warning("lease release failed thread_id=%s", self.thread_id, exc_info=True)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                held = await self.store.renew_lease(
                    self.thread_id, self.owner, self.ttl, now=self.clock()
                )
            except Exception:  # a blip; the next beat tries again before expiry
                log.warning("lease renewal failed thread_id=%s", self.thread_id, exc_info=True)
                continue
            if not held:
                log.warning("lease lost thread_id=%s owner=%s", self.thread_id, self.owner)
                self.lost.set()
                return
