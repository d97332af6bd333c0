"""The worker's own loop thread, and answers to Slack before background runs."""

from __future__ import annotations

import asyncio
import threading
import time

from bot.loop_thread import AnswersFirst, LoopThread


async def test_run_executes_on_the_other_thread_and_stop_joins_it():
    thread = LoopThread()
    try:

        async def where() -> str:
            await asyncio.sleep(0)
            return threading.current_thread().name

        assert await thread.run(where()) == "opsloop-worker"
    finally:
        await thread.stop()
    assert not thread._thread.is_alive()
    assert thread.loop.is_closed()
    thread.call(print, "after stop")  # ignored, not an error


async def test_a_run_waits_while_an_answer_is_being_given():
    thread = LoopThread()
    priority = AnswersFirst(thread, max_defer_s=5)
    try:
        with priority.answering():
            started = time.monotonic()
            waiting = asyncio.ensure_future(thread.run(priority.quiet()))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # the run is held back while we answer
        await asyncio.wait_for(waiting, 2)  # released as soon as the answer is out
        assert time.monotonic() - started < 2
        await asyncio.wait_for(thread.run(priority.quiet()), 1)  # nothing in flight
    finally:
        await thread.stop()


async def test_a_steady_stream_of_requests_does_not_starve_runs():
    thread = LoopThread()
    priority = AnswersFirst(thread, max_defer_s=0.3)
    try:
        with priority.answering():
            started = time.monotonic()
            await asyncio.wait_for(thread.run(priority.quiet()), 3)
            assert 0.25 <= time.monotonic() - started < 3
    finally:
        await thread.stop()


async def test_runs_wait_until_no_answer_has_been_given_for_the_settling_time():
    """A burst's requests come back to back: a run let in between two of them would
    hold the interpreter while the next one waits."""
    thread = LoopThread()
    # A settling time far above the gaps, so a loaded machine's late sleeps cannot
    # open the gate between two answers.
    priority = AnswersFirst(thread, max_defer_s=10, settle_s=1.0)

    async def quiet_then_time() -> float:
        await priority.quiet()
        return time.monotonic()

    try:
        with priority.answering():
            waiting = [asyncio.ensure_future(thread.run(quiet_then_time())) for _ in range(3)]
        for _ in range(4):  # answers 0.1 s apart: each one restarts the settling time
            await asyncio.sleep(0.1)
            assert not any(w.done() for w in waiting)
            with priority.answering():
                await asyncio.sleep(0)
        last_answer = time.monotonic()
        released = await asyncio.wait_for(asyncio.gather(*waiting), 8)
        assert all(at - last_answer >= 0.95 for at in released)
        await asyncio.wait_for(thread.run(priority.quiet()), 1)  # calm now: at once
    finally:
        await thread.stop()
