"""The progress hub: the first notification of a call is passed on at once, the next
ones at most once per interval (the latest held, passed on when the interval is up), per
call; nothing held outlives its call; a failing listener stops nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from tools.mcp.progress import ProgressHub


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hub_with(clock: Clock, every_s: float = 3.0) -> tuple[ProgressHub, list[tuple[Any, ...]]]:
    hub = ProgressHub(every_s=every_s, clock=clock)
    heard: list[tuple[Any, ...]] = []
    hub.listen(lambda *args: heard.append(args))
    return hub, heard


async def test_the_first_is_told_at_once_and_the_rest_no_more_than_once_per_interval() -> None:
    clock = Clock()
    hub, heard = hub_with(clock)
    for step in range(1, 6):
        hub.report("t1", "c1", step, 10, f"step {step}")
        clock.now += 0.1
    assert heard == [("t1", "c1", 1, 10, "step 1")]  # 2-5 came within the interval
    clock.now += 3.0
    hub.report("t1", "c1", 7, 10, "step 7")  # past the interval: told at once
    assert heard[-1] == ("t1", "c1", 7, 10, "step 7") and len(heard) == 2


async def test_the_latest_held_is_told_when_the_interval_is_up() -> None:
    clock = Clock()
    hub = ProgressHub(every_s=0.05, clock=clock)
    told = asyncio.Event()
    heard: list[tuple[Any, ...]] = []

    def hook(*args: Any) -> None:
        heard.append(args)
        if len(heard) == 2:
            told.set()

    hub.listen(hook)
    hub.report("t1", "c1", 1, None, None)
    hub.report("t1", "c1", 2, None, "two")
    hub.report("t1", "c1", 3, None, "three")
    assert len(heard) == 1
    await asyncio.wait_for(told.wait(), 10)
    assert heard[1] == ("t1", "c1", 3, None, "three")  # the latest, once
    await asyncio.sleep(0)
    assert len(heard) == 2


async def test_calls_are_limited_each_on_their_own() -> None:
    clock = Clock()
    hub, heard = hub_with(clock)
    hub.report("t1", "c1", 1, None, None)
    hub.report("t1", "c2", 1, None, None)
    hub.report("t2", "c1", 1, None, None)
    assert len(heard) == 3


async def test_nothing_held_outlives_its_call() -> None:
    clock = Clock()
    hub, heard = hub_with(clock, every_s=0.01)
    hub.report("t1", "c1", 1, None, None)
    hub.report("t1", "c1", 2, None, None)
    hub.done("t1", "c1")
    await asyncio.sleep(0.05)  # well past the interval: the held one is dropped
    assert heard == [("t1", "c1", 1, None, None)]


async def test_a_failing_listener_stops_neither_the_others_nor_the_call() -> None:
    clock = Clock()
    hub = ProgressHub(clock=clock)
    heard: list[tuple[Any, ...]] = []

    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    hub.listen(broken)
    stop = hub.listen(lambda *args: heard.append(args))
    hub.report("t1", "c1", 1, None, None)
    assert len(heard) == 1
    stop()
    clock.now += 10
    hub.report("t1", "c1", 2, None, None)
    assert len(heard) == 1
