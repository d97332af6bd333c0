"""Finding work: the dispatcher runs threads in the background; the scheduler wakes them.

Each process runs its own in-memory APScheduler 3 whose jobs only *look* in the
database (job stores must not be shared between schedulers); leases in the database
decide who runs a thread. A sweep every ``interval`` seconds claims (takes the lease
of) timers that are due and threads left ``running`` by a dead process (their lease
expired, or their owner is provably dead: engine.workers), so at startup every thread
left mid-step resumes with nobody touching it, and N replicas sweeping at once never
take the same thread. Wake-ups for timers known in this process are date jobs with
deterministic ids (``wake-{thread_id}-{due}``), so scheduling one twice never doubles it.

With ``presence`` the worker registers itself (engine.workers); on PostgreSQL it then
hears, within milliseconds, of threads another replica made runnable (NOTIFY) and runs
them at once. The sweep stays as the safety net: a notification reaches only sessions
listening at commit time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from engine.events import utcnow
from engine.runner import Runner
from engine.store import Store
from engine.workers import BEAT_S, Presence

log = logging.getLogger("opsloop.scheduler")

MAX_PAUSE_S = 60.0


class Dispatcher:
    """Runs each kicked thread in a task, one task per thread in this process.

    A kick while the thread is running here marks it to run once more afterwards, so an
    input that lands just as the runner decides to rest is never left unnoticed.
    """

    def __init__(
        self,
        run: Callable[[str], Awaitable[object]],
        *,
        max_concurrency: int = 16,
        on_rest: Callable[[str], Awaitable[None]] | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._run = run
        self._on_rest = on_rest
        # Awaited before each run: lets the front door defer background work while it
        # has answers to give (they have a deadline; runs do not).
        self._gate = gate
        self._limit = asyncio.Semaphore(max_concurrency)
        self.max_concurrency = max_concurrency
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._closed = False
        # Threads whose run raised, with when the sweep may try them again: a thread
        # that fails each time must not be re-run every second. In memory on purpose:
        # it only paces retries; the log alone decides what runs.
        self._cooling: dict[str, tuple[int, float]] = {}

    def kick(self, thread_id: str) -> None:
        if self._closed:
            return
        if thread_id in self._tasks:
            self._again.add(thread_id)
            return
        self._tasks[thread_id] = asyncio.create_task(self._drive(thread_id))

    def cooling_ids(self) -> list[str]:
        """The threads the sweep should leave alone for now."""
        now = time.monotonic()
        return [t for t, (_, until) in self._cooling.items() if until > now]

    @property
    def closed(self) -> bool:
        return self._closed

    def cooling(self, thread_id: str) -> bool:
        """Whether the sweep should leave this thread alone for now (its run failed)."""
        entry = self._cooling.get(thread_id)
        return entry is not None and entry[1] > time.monotonic()

    @property
    def busy(self) -> int:
        return len(self._tasks)

    @property
    def room(self) -> int:
        """How many more threads could start now: what a sweep should claim at most."""
        return max(0, self.max_concurrency - len(self._tasks))

    async def _drive(self, thread_id: str) -> None:
        try:
            while True:
                self._again.discard(thread_id)
                async with self._limit:
                    # The gate inside the slot: a run that waited for a slot while answers
                    # began to be given waits for them too.
                    if self._gate is not None:
                        await self._gate()
                    try:
                        await self._run(thread_id)
                    except Exception:
                        # The thread stays in the log as it was; the sweep retries later.
                        failures = self._cooling.get(thread_id, (0, 0.0))[0] + 1
                        pause = min(MAX_PAUSE_S, 2.0**failures)
                        self._cooling[thread_id] = (failures, time.monotonic() + pause)
                        log.exception(
                            "run failed thread_id=%s failures=%d retry_in=%.0fs",
                            thread_id,
                            failures,
                            pause,
                        )
                    else:
                        self._cooling.pop(thread_id, None)
                if self._on_rest is not None:
                    await self._on_rest(thread_id)
                if thread_id not in self._again or self._closed:
                    return
        finally:
            self._tasks.pop(thread_id, None)

    async def idle(self) -> None:
        """Wait until nothing runs (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        await self.idle()


class Scheduler:
    """The sweep and the wake-ups of one process."""

    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        *,
        owner: str,
        lease_ttl: float,
        interval: float = 1.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        # The sweep claims due threads for the runner's lease owner; the runner's own
        # take of the lease is then re-entrant, and releases it when the run ends.
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.interval = interval
        self.clock = clock
        self._aps = AsyncIOScheduler(timezone="UTC")
        self._sweeps: set[asyncio.Task[object]] = set()  # in flight, awaited at shutdown

    def start(self) -> None:
        self._aps.add_job(
            self.sweep,
            "interval",
            seconds=self.interval,
            id="opsloop-sweep",
            max_instances=1,
            coalesce=True,
            next_run_time=self.clock(),  # at once: recover what a dead process left
            misfire_grace_time=None,
        )
        self._aps.start()

    async def shutdown(self) -> None:
        if not self._aps.running:
            return
        # APScheduler's shutdown cancels a coroutine job mid-query, leaving its database
        # connection to the garbage collector: no new sweeps, let the running one end.
        self._aps.pause()
        if self._sweeps:
            await asyncio.gather(*self._sweeps, return_exceptions=True)
        self._aps.shutdown(wait=False)

    async def sweep(self) -> list[str]:
        """Claim and kick every thread with work due now; returns their ids."""
        task = asyncio.current_task()
        if task is not None:
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)
        # A claim nobody runs soon would sit until it expires, keeping the thread from
        # replicas with room: claim only what can start now.
        room = self.dispatcher.room
        if self.dispatcher.closed or room == 0:
            return []
        try:
            due = await self.store.claim_due(
                self.owner,
                self.lease_ttl,
                now=self.clock(),
                limit=room,
                skip=self.dispatcher.cooling_ids(),
            )
        except Exception:
            log.warning("sweep could not read the database", exc_info=True)
            return []
        for thread_id in due:
            self.dispatcher.kick(thread_id)
        return due

    def sweep_soon(self) -> None:
        """A sweep now, besides the interval's (a notification channel came back)."""
        if self._aps.running:
            task = asyncio.get_running_loop().create_task(self.sweep())
            self._sweeps.add(task)  # held until done (the loop keeps only a weak one)
            task.add_done_callback(self._sweeps.discard)

    async def _wake(self, thread_id: str) -> None:
        # A coroutine job runs on the event loop; a plain function would run in a thread.
        self.dispatcher.kick(thread_id)

    async def after_run(self, thread_id: str) -> None:
        """Set a precise wake-up for a timer due before the next sweep would see it."""
        try:
            info = await self.store.get_thread(thread_id)
        except Exception:
            return
        if info.wake_at is None or not self._aps.running:
            return
        if info.wake_at - self.clock() > timedelta(seconds=self.interval * 2):
            return  # the sweep will see it in time
        self._aps.add_job(
            self._wake,
            "date",
            run_date=info.wake_at,
            args=[thread_id],
            id=f"wake-{thread_id}-{info.wake_at.isoformat()}",
            replace_existing=True,
            misfire_grace_time=None,
        )


class Worker:
    """Runner + dispatcher + scheduler: what a serving process runs in the background."""

    def __init__(
        self,
        runner: Runner,
        *,
        interval: float = 1.0,
        max_concurrency: int = 16,
        after_run: Callable[[str], Awaitable[object]] | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        presence: bool = False,
        beat_s: float = BEAT_S,
    ) -> None:
        self.runner = runner
        # What the front door does once a thread rests (Slack: show what happened).
        self.after_run = after_run
        self._gate = gate  # as each run and each step, showing waits for the answers
        self.dispatcher = Dispatcher(
            self._run_until_settled,
            max_concurrency=max_concurrency,
            on_rest=self._rest,
            gate=gate,
        )
        self.scheduler = Scheduler(
            runner.store,
            self.dispatcher,
            owner=runner.owner,
            lease_ttl=runner.config.lease_ttl_s,
            interval=interval,
            clock=runner.clock,
        )
        # Registered under the runner's lease owner id (engine.workers): a serving
        # process does; tests that drive one worker in-process need not.
        self.presence = (
            Presence(runner.store, runner.owner, beat_s=beat_s, on_runnable=self._heard)
            if presence
            else None
        )

    def _heard(self, thread_id: str | None) -> None:
        """Another session made ``thread_id`` runnable (None: we may have missed some)."""
        if thread_id is None:
            self.scheduler.sweep_soon()
        else:
            self.dispatcher.kick(thread_id)

    async def _run_until_settled(self, thread_id: str) -> None:
        state = await self.runner.run(thread_id)
        if state is None:
            return
        # An input may have landed between our last read and the lease release.
        info = await self.runner.store.get_thread(thread_id)
        if info.last_seq != state.last_seq:
            self.dispatcher.kick(thread_id)

    async def _rest(self, thread_id: str) -> None:
        await self.scheduler.after_run(thread_id)
        if self.after_run is not None:
            if self._gate is not None:
                await self._gate()
            try:
                await self.after_run(thread_id)
            except Exception:  # delivery retries on the next rest; the log keeps it all
                log.exception("after-run hook failed thread_id=%s", thread_id)

    def kick(self, thread_id: str) -> None:
        self.dispatcher.kick(thread_id)

    async def register(self) -> None:
        """Register this worker (with ``presence``); before ``start``, so its first
        sweep already runs as a registered worker. Raises if the database refuses."""
        if self.presence is not None:
            await self.presence.start()

    def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.shutdown()
        await self.dispatcher.close()
        if self.presence is not None:  # after the runs: their leases are released
            await self.presence.stop()
