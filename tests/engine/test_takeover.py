"""Takeover in seconds: a thread whose runner was SIGKILLed is resumed by a live worker
at once, not when the dead one's lease expires; a live but stopped owner (SIGSTOP)
keeps its lease until it expires.

Real processes on both backends: this module is also the worker process
(``python -m tests.engine.test_takeover``), a registered worker as ``opsloop serve``
runs it, driving one thread whose tool holds (in the first process) until it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pydantic import BaseModel

from engine.events import utcnow
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner, RunnerConfig
from engine.scheduler import Worker
from engine.state import reduce
from engine.store import Store, ThreadKey, open_store
from tools import ToolContext, ToolRegistry, tool

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY = ThreadKey("T_TAKE", "C_TAKE", "1700000000.000200")
REGISTRY = ToolRegistry()
SCRIPT = [call("hold", service="api"), say("api is held")]


class HoldArgs(BaseModel):
    service: str


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)


@tool(registry=REGISTRY)
async def hold(args: HoldArgs, ctx: ToolContext) -> dict:
    """Hold a service (in a process told to, until it is killed)."""
    ledger = Path(os.environ["EFFECTS_DIR"]) / "hold.log"
    line = f"{os.getpid()} {ctx.idempotency_key} {ctx.attempt}\n"
    await asyncio.to_thread(_append, ledger, line)
    if os.environ.get("HOLD") == "1":
        await asyncio.sleep(3600)
    return {"held": args.service}


# --- the worker process --------------------------------------------------------------


async def worker_main() -> int:
    """A registered worker: sweeps, runs what it finds, exits once the thread is idle."""
    store = await open_store(os.environ["DATABASE_URL"])
    lease = float(os.environ["OPSLOOP_LEASE_SECONDS"])
    runner = Runner(store, ScriptedModel(SCRIPT), REGISTRY, RunnerConfig(lease_ttl_s=lease))
    worker = Worker(runner, interval=0.2, presence=True, beat_s=0.5)
    try:
        await worker.register()
        worker.start()
        print("ready", runner.owner, flush=True)  # healthy: registered and sweeping
        while True:
            thread_id = await store.find_thread(KEY)
            if thread_id is not None and (await store.get_thread(thread_id)).status == "idle":
                break
            await asyncio.sleep(0.05)
    finally:
        await worker.stop()
        await store.close()
    print("idle", flush=True)
    return 0


# --- the tests -----------------------------------------------------------------------


def spawn(db_url: str, effects: Path, *, hold: bool, lease: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP_")}
    env.update(
        DATABASE_URL=db_url,
        EFFECTS_DIR=str(effects),
        PYTHONPATH=str(ROOT),
        OPSLOOP_LEASE_SECONDS=str(lease),
        HOLD="1" if hold else "0",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.engine.test_takeover"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def ready(proc: subprocess.Popen, within: float = 30) -> str:
    """The worker's owner id, once it says it is registered and sweeping."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), within)
    assert line.startswith("ready "), (line, proc.stderr.read() if proc.poll() else "")
    return line.split()[1]


async def until(check, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await check():
        assert loop.time() < end, what
        await asyncio.sleep(0.05)


def held_lines(effects: Path) -> list[str]:
    path = effects / "hold.log"
    return path.read_text().splitlines() if path.exists() else []


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen):
    """Whatever happens, no process outlives the test (a stopped one is woken first)."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.communicate()


async def start_held_thread(store: Store, db_url: str, effects: Path, lease: float):
    """A thread whose tool call is under way in a first worker process."""
    posted = await post_user_message(store, KEY, text="hold api", user="U1", dedupe_key="Ev-1")
    first = spawn(db_url, effects, hold=True, lease=lease)
    owner = await ready(first)

    async def started() -> bool:
        assert first.poll() is None, first.communicate()[1][-2000:]
        return len(held_lines(effects)) == 1

    await until(started, 30, "the first worker never started the tool")
    info = await store.get_thread(posted.thread_id)
    assert info.status == "running" and info.lease_owner == owner
    return posted.thread_id, first, owner


async def finished(store: Store, thread_id: str) -> bool:
    return (await store.get_thread(thread_id)).status == "idle"


async def test_a_sigkilled_runner_is_taken_over_at_once_not_at_lease_expiry(db_url, tmp_path):
    store = await open_store(db_url)
    try:
        thread_id, first, _ = await start_held_thread(store, db_url, tmp_path, lease=60)
        with reaped(first):
            expires = (await store.get_thread(thread_id)).lease_expires_at
            first.kill()  # SIGKILL mid-tool: its lease has about 60 s left
            first.wait()
            second = spawn(db_url, tmp_path, hold=False, lease=60)
            with reaped(second):
                await ready(second)
                healthy = time.monotonic()
                # The correctness bound: done long before the dead one's lease ends.
                await until(lambda: finished(store, thread_id), 20, "never taken over")
                took = time.monotonic() - healthy
                assert expires is not None
                assert (await store.get_thread(thread_id)).updated_at < expires
                _, err = second.communicate(timeout=30)
                assert second.returncode == 0, err[-2000:]
        print(f"takeover: idle {took:.2f}s after the replacement was healthy (lease 60s)")
        events = await store.select_events(thread_id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert reduce(events).status == "idle"
    types = Counter(e.type for e in events)
    assert types["tool_started"] == 2 and types["tool_result"] == 1  # resumed, not redone
    assert types["final_answer"] == 1
    runs = held_lines(tmp_path)
    assert len(runs) == 2 and len({line.split()[1] for line in runs}) == 1  # one key
    assert runs[1].split()[0] != runs[0].split()[0]  # by the replacement


async def test_a_stopped_but_live_owner_keeps_its_lease_until_it_expires(db_url, tmp_path):
    lease = 8.0
    store = await open_store(db_url)
    try:
        thread_id, first, owner = await start_held_thread(store, db_url, tmp_path, lease)
        with reaped(first):
            first.send_signal(signal.SIGSTOP)  # alive: its lock stays held
            await asyncio.sleep(0.3)  # a renewal in flight lands before we read
            expires = (await store.get_thread(thread_id)).lease_expires_at
            assert expires is not None
            second = spawn(db_url, tmp_path, hold=False, lease=lease)
            with reaped(second):
                await ready(second)
                checked = 0
                # The replacement sweeps every 0.2 s: until the lease ends, it must not
                # take the thread from its stopped owner.
                while (left := (expires - utcnow()).total_seconds()) > 0.2:
                    info = await store.get_thread(thread_id)
                    assert info.lease_owner == owner, (left, info)
                    assert info.status == "running"
                    checked += 1
                    await asyncio.sleep(0.1)
                assert checked > 5, "the replacement was not up before the lease ended"
                # Expired: then it is taken, as any expired lease is.
                await until(lambda: finished(store, thread_id), 20, "never taken after expiry")
                _, err = second.communicate(timeout=30)
                assert second.returncode == 0, err[-2000:]
            first.send_signal(signal.SIGCONT)
            # The woken owner finds its lease gone and appends nothing more.
            await asyncio.sleep(1.0)
        events = await store.select_events(thread_id)
    finally:
        await store.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert reduce(events).status == "idle"
    assert Counter(e.type for e in events)["final_answer"] == 1
    assert len(held_lines(tmp_path)) == 2


if __name__ == "__main__":
    sys.exit(asyncio.run(worker_main()))
