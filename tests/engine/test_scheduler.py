"""The scheduler finds work in the database: due timers and threads a dead process left."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner, RunnerConfig
from engine.scheduler import Dispatcher, Scheduler, Worker
from engine.store import Store, ThreadKey, open_store
from tests.support import crash_child
from tests.support.demo_tools import make_tools
from tests.support.processes import lines, run_child


async def wait_for_status(store: Store, thread_id: str, status: str, within: float = 20) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while loop.time() < end:
        if (await store.get_thread(thread_id)).status == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"thread never reached {status}: {await store.get_thread(thread_id)}")


async def test_at_startup_a_thread_left_mid_step_resumes_with_nobody_touching_it(
    db_url, tmp_path, monkeypatch
):
    # A process dies right after committing "run lookup" and before running it.
    killed = run_child(db_url, tmp_path, "append:2")
    assert killed.returncode == -signal.SIGKILL
    monkeypatch.setattr(crash_child, "EFFECTS", tmp_path)

    store = await open_store(db_url)
    runner = Runner(
        store,
        ScriptedModel(crash_child.SCRIPT),
        crash_child.REGISTRY,
        RunnerConfig(lease_ttl_s=1.0),
    )
    worker = Worker(runner, interval=0.2)
    try:
        (info,) = await store.list_threads()
        assert info.status == "running" and info.lease_owner is not None
        worker.start()  # no input is posted: the sweep alone must find it
        await wait_for_status(store, info.id, "awaiting_approval")
    finally:
        await worker.stop()
        await store.close()
    assert [line.split()[0] for line in lines(tmp_path / "effects.log")] == ["lookup"]


async def test_the_scheduler_expires_an_unanswered_approval(db_url):
    store = await open_store(db_url)
    effects: Counter = Counter()
    model = ScriptedModel([call("deploy", name="api"), say("expired; not deploying")])
    runner = Runner(store, model, make_tools(effects), RunnerConfig(approval_ttl_s=0.3))
    worker = Worker(runner, interval=0.2)
    worker.start()
    try:
        posted = await post_user_message(
            store, ThreadKey("T", "C", "1.1"), text="deploy", user="U1", dedupe_key="e1"
        )
        worker.kick(posted.thread_id)
        await wait_for_status(store, posted.thread_id, "idle")
    finally:
        await worker.stop()
    events = await store.select_events(posted.thread_id)
    await store.close()
    assert "approval_expired" in [e.type for e in events]
    assert effects["deploy"] == 0


async def test_a_kick_during_a_run_runs_the_thread_once_more():
    runs: list[str] = []
    release = asyncio.Event()

    async def run(thread_id: str) -> None:
        runs.append(thread_id)
        if len(runs) == 1:
            await release.wait()

    dispatcher = Dispatcher(run)
    dispatcher.kick("t1")
    await asyncio.sleep(0)
    dispatcher.kick("t1")  # lands while the first run is still going
    dispatcher.kick("t1")  # coalesced with the previous kick
    release.set()
    await dispatcher.idle()
    assert runs == ["t1", "t1"]


async def test_a_thread_whose_run_keeps_failing_is_retried_with_growing_pauses():
    calls: list[str] = []

    async def run(thread_id: str) -> None:
        calls.append(thread_id)
        raise RuntimeError("a bug")

    dispatcher = Dispatcher(run)
    dispatcher.kick("t1")
    await dispatcher.idle()
    assert calls == ["t1"]
    assert dispatcher.cooling("t1")
    assert not dispatcher.cooling("t2")


async def test_a_sweep_claims_only_what_it_can_start_and_leaves_the_rest_to_others(store):
    release = asyncio.Event()
    started: list[str] = []

    async def run(thread_id: str) -> None:
        started.append(thread_id)
        await release.wait()

    threads = [
        (
            await post_user_message(
                store, ThreadKey("T", "C", f"{i}.0"), text="hi", user="U1", dedupe_key=f"e{i}"
            )
        ).thread_id
        for i in range(5)
    ]
    dispatcher = Dispatcher(run, max_concurrency=2)
    scheduler = Scheduler(store, dispatcher, owner="w1", lease_ttl=60)
    try:
        claimed = await scheduler.sweep()
        assert len(claimed) == 2 and set(claimed) <= set(threads)
        for thread_id in claimed:
            assert (await store.get_thread(thread_id)).lease_owner == "w1"
        # Full: nothing more is claimed; another replica finds the other three.
        assert await scheduler.sweep() == []
        others = await store.claim_due("w2", 60)
        assert sorted(others) == sorted(set(threads) - set(claimed))
    finally:
        release.set()
        await dispatcher.close()
    assert sorted(started) == sorted(claimed)
