"""This process as a worker: registered in the database, beating, provably alive.

A serving process registers its lease owner id in ``workers`` and holds, for its whole
life, a lock that the database or the kernel drops when it dies (a PostgreSQL session
advisory lock; on SQLite a ``flock`` on ``<db>.workers/<id>.lock``). A lease whose
owner is provably dead (registered, lock free) is taken at once; one whose owner is
merely slow (stopped, in a long pause) keeps its lease until it expires. A restarted
process therefore takes over its predecessor's threads at its first sweep.

The heartbeat every ``beat_s`` seconds records ``heartbeat_at`` for people (who runs,
since when) and re-establishes the PostgreSQL session if it was lost; liveness never
depends on its age. On PostgreSQL the same session LISTENs for threads that another
session made runnable (``on_runnable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime

from engine.errors import StoreUnavailable
from engine.events import utcnow
from engine.store import Store
from engine.store.base import OnRunnable

log = logging.getLogger("opsloop.workers")

BEAT_S = 5.0


class Presence:
    """One worker's registration: ``start`` registers (raises if the database cannot
    be reached or the id is taken), then beats in the background until ``stop``."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        *,
        beat_s: float = BEAT_S,
        on_runnable: OnRunnable | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.beat_s = beat_s
        self.on_runnable = on_runnable
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.store.register_worker(
            self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            now=self.clock(),
            on_runnable=self.on_runnable,
        )
        log.info("worker registered worker_id=%s", self.worker_id)
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.beat_s)
            try:
                if not await self.store.beat_worker(self.worker_id, self.clock()):
                    # Others may have taken our threads meanwhile: our leases say so
                    # (their renewal fails and the run stops at its next boundary).
                    log.warning("worker proof of life was lost; held again")
            except StoreUnavailable as exc:  # the next beat tries again; one line each
                log.warning("worker heartbeat failed worker_id=%s: %s", self.worker_id, exc)
            except Exception:
                log.exception("worker heartbeat failed worker_id=%s", self.worker_id)

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await self.store.unregister_worker(self.worker_id)
        except Exception:  # the lock goes with the store's close or the process anyway
            log.warning("worker unregister failed worker_id=%s", self.worker_id, exc_info=True)
