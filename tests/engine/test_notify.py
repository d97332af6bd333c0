"""Wake-ups across replicas (PostgreSQL LISTEN/NOTIFY): an input stored through one
store wakes a worker listening through another at once, not at its next sweep; the
listening session, lost, is opened again and hears the next one; a worker does not
hear what its own process stored (its front door kicked it), nor a new thread (its
creator runs it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, say
from engine.runner import Runner
from engine.scheduler import Worker
from engine.store import Store, ThreadKey, open_store
from engine.store.postgres import RUNNABLE_CHANNEL, WORKER_LOCK_CLASS
from tests.conftest import PG_URL
from tools import ToolRegistry

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SWEEP_S = 30.0  # only a notification can explain a wake-up within the test's bounds


async def resting_thread(url: str, root_ts: str) -> str:
    """A thread another replica has answered and left at rest (idle)."""
    store = await open_store(url)
    try:
        posted = await post_user_message(
            store, ThreadKey("T", "C", root_ts), text="hi", user="U1", dedupe_key=root_ts
        )
        await Runner(store, ScriptedModel([say("hello")]), ToolRegistry()).run(posted.thread_id)
        assert (await store.get_thread(posted.thread_id)).status == "idle"
        return posted.thread_id
    finally:
        await store.close()


async def reply(url: str, root_ts: str, *, origin: str | None = None) -> str:
    """A person's reply in the thread at ``root_ts``, stored by a front door whose
    store has ``origin`` (None: a store of its own, as another replica's)."""
    front_door = await open_store(url, create=False, origin=origin)
    try:
        posted = await post_user_message(
            front_door, ThreadKey("T", "C", root_ts), text="more", user="U1", dedupe_key="r"
        )
        return posted.thread_id
    finally:
        await front_door.close()


@contextlib.asynccontextmanager
async def listening_worker(url: str) -> AsyncIterator[tuple[Worker, list[str]]]:
    """A registered worker on its own store whose sweep runs at start, then every 30 s;
    yields it and the ids of the threads it ran."""
    store = await open_store(url)
    ran: list[str] = []
    model = ScriptedModel([say("on it"), say("on it again")])
    worker = Worker(
        Runner(store, model, ToolRegistry()), interval=SWEEP_S, presence=True, beat_s=0.2
    )

    async def after_run(thread_id: str) -> None:
        ran.append(thread_id)

    worker.after_run = after_run
    try:
        await worker.register()
        worker.start()
        await asyncio.sleep(0.3)  # its first sweep (at start) has found nothing
        yield worker, ran
    finally:
        await worker.stop()
        await store.close()


async def wait_ran(store: Store, ran: list[str], thread_id: str, within: float) -> None:
    """Until the listening worker has run the thread to rest (its after-run hook ran)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while thread_id not in ran:
        assert loop.time() < end, "the listening worker never ran the thread"
        await asyncio.sleep(0.02)
    assert (await store.get_thread(thread_id)).status == "idle"


async def lock_holder(admin: asyncpg.Connection, worker_id: str) -> int | None:
    return await admin.fetchval(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
        " AND classid = $1 AND objid = hashtext($2)::oid",
        WORKER_LOCK_CLASS,
        worker_id,
    )


async def test_an_input_stored_elsewhere_wakes_the_listening_worker_at_once(pg_url):
    thread_id = await resting_thread(pg_url, "1.0")
    async with listening_worker(pg_url) as (_, ran):
        assert await reply(pg_url, "1.0") == thread_id  # another replica's front door
        store = await open_store(pg_url, create=False)
        try:
            await wait_ran(store, ran, thread_id, within=10)  # the sweep: 30 s away
        finally:
            await store.close()
        assert ran == [thread_id]


async def test_a_worker_does_not_hear_what_its_own_process_stored(pg_url):
    """The front door of the worker's own process kicked it: hearing the input too
    would run the thread a second time."""
    thread_id = await resting_thread(pg_url, "4.0")
    async with listening_worker(pg_url) as (worker, ran):
        await reply(pg_url, "4.0", origin=worker.runner.store.origin)
        await asyncio.sleep(1.0)  # a notification arrives in milliseconds
        assert ran == []
        assert (await worker.runner.store.get_thread(thread_id)).status == "running"


async def test_a_new_thread_notifies_nobody(pg_url):
    """Its creator runs it; no other process can hold it."""
    async with listening_worker(pg_url) as (_, ran):
        other = await open_store(pg_url, create=False)
        try:
            posted = await post_user_message(
                other, ThreadKey("T", "C", "5.0"), text="hi", user="U1", dedupe_key="e5"
            )
            await asyncio.sleep(1.0)
            assert ran == []
            assert (await other.get_thread(posted.thread_id)).status == "running"
        finally:
            await other.close()


async def test_the_listening_session_lost_is_opened_again_and_hears_the_next_input(pg_url):
    thread_id = await resting_thread(pg_url, "2.0")
    admin = await asyncpg.connect(PG_URL, timeout=5)
    try:
        async with listening_worker(pg_url) as (worker, ran):
            owner = worker.runner.owner
            before = await lock_holder(admin, owner)
            assert before is not None
            await admin.execute("SELECT pg_terminate_backend($1)", before)

            async def back() -> int | None:
                pid = await lock_holder(admin, owner)
                return pid if pid not in (None, before) else None

            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while await back() is None:
                assert loop.time() < end, "the worker never took its lock again"
                await asyncio.sleep(0.05)
            # The sweep that follows a reconnect has run; the next is 30 s away, so only
            # the new session's LISTEN can explain what follows.
            await asyncio.sleep(0.3)

            assert await reply(pg_url, "2.0") == thread_id
            await wait_ran(worker.runner.store, ran, thread_id, within=10)
            assert ran == [thread_id]
    finally:
        await admin.close()


async def test_only_an_append_that_makes_a_resting_thread_runnable_notifies(pg_url):
    """A reply reopening an answered thread notifies, naming the thread and the
    storing store's origin; the new thread, the runner's own appends and a redelivered
    reply do not."""
    store = await open_store(pg_url)
    heard: list[str] = []
    one = asyncio.Event()

    def hear(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        heard.append(payload)
        one.set()

    listener = await asyncpg.connect(PG_URL, timeout=5)
    try:
        schema = pg_url.rsplit("schema=", 1)[1]
        await listener.add_listener(RUNNABLE_CHANNEL + schema, hear)
        runner = Runner(store, ScriptedModel([say("done")]), ToolRegistry())
        posted = await post_user_message(
            store, ThreadKey("T", "C", "3.0"), text="hi", user="U1", dedupe_key="e3"
        )
        await runner.run(posted.thread_id)  # appends the answer: the thread rests
        again = await post_user_message(
            store, ThreadKey("T", "C", "3.0"), text="more", user="U1", dedupe_key="e4"
        )
        dup = await post_user_message(
            store, ThreadKey("T", "C", "3.0"), text="more", user="U1", dedupe_key="e4"
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(one.wait(), 5)
        await asyncio.sleep(0.3)  # room for one that should not come
    finally:
        await listener.close()
        await store.close()
    assert again.thread_id == dup.thread_id == posted.thread_id
    assert heard == [f"{posted.thread_id} {store.origin}"]  # the reopen only
