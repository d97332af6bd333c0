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
