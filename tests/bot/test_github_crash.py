"""`opsloop serve` SIGKILLed right after GitHub dispatched its workflow (before the
answer reached it): the next process finds the run the dead one made and waits on it,
never dispatching a second; the run's end then reaches the thread."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bot.test_cli import KEY, _post
from tests.bot.test_serve_crash import serve
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.github import REPO, TOKEN, FakeGitHub
from tests.fakes.slack import FakeSlack

pytestmark = pytest.mark.slow

CONFIG = """\
integrations:
  github:
    token: {token}
    api_url: {url}
    repos: [{repo}]
    poll_every: 1s
policy:
  - tool: github_dispatch_workflow
    policy: wait_for_external_event  # no approval card in this test; still waits
"""


@contextlib.contextmanager
def fakes_in_a_thread() -> Iterator[
    tuple[FakeAnthropic, FakeSlack, FakeGitHub, asyncio.AbstractEventLoop]
]:
    """Claude, Slack and GitHub on their own loop, for a test that blocks on processes."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fakes = (FakeAnthropic(), FakeSlack(), FakeGitHub())
    for fake in fakes:
        asyncio.run_coroutine_threadsafe(fake.__aenter__(), loop).result(10)
    try:
        claude, slack, gh = fakes
        yield claude, slack, gh, loop
    finally:
        for fake in fakes:
            asyncio.run_coroutine_threadsafe(fake.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def on(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` on the fakes' loop (their state is that loop's) and return its value."""

    async def call() -> Any:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def _until(check: Callable[[], bool], proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("workflow", "found"),
    [("keyed.yml", "by its key in the run's name"), ("open.yml", "correlated")],
)
def test_a_kill_right_after_the_dispatch_never_dispatches_twice(
    db_url: str, tmp_path: Path, workflow: str, found: str
) -> None:
    with fakes_in_a_thread() as (claude, slack, gh, loop):
        # keyed.yml shows the call's key in its run name; open.yml takes any input but
        # shows none, so its run is found by correlation.
        on(
            loop,
            lambda: gh.add_workflow(
                REPO, "keyed.yml", inputs={"opsloop_key"}, run_name="Deploy {opsloop_key}"
            ),
        )
        on(loop, lambda: gh.add_workflow(REPO, "open.yml"))
        config = tmp_path / "opsloop.yaml"
        config.write_text(CONFIG.format(token=TOKEN, url=gh.url, repo=REPO))
        args = {"repo": REPO, "workflow": workflow, "ref": "main"}
        claude.tool_use("github_dispatch_workflow", args, text="Deploying.")
        claude.text("The deploy succeeded.")
        slack.add_message(KEY.channel, "deploy api", user="U1", ts=KEY.root_ts)
        asyncio.run(_post(db_url, "deploy api"))
        on(loop, lambda: gh.hold("POST", "/dispatches"))  # dispatched, never answered

        first = serve(db_url, claude.url, slack.url, None, OPSLOOP_CONFIG=str(config))
        try:
            _until(lambda: len(gh.runs) == 1, first, "the workflow was never dispatched")
        finally:
            first.kill()  # SIGKILL: GitHub has the run, our log only the intent
            first.communicate()
        assert first.returncode == -signal.SIGKILL
        [run_id] = list(gh.runs)
        on(loop, gh.unhold)
        on(loop, lambda: gh.complete(run_id))

        second = serve(db_url, claude.url, slack.url, None, OPSLOOP_CONFIG=str(config))
        try:

            def answered() -> bool:
                assert list(gh.runs) == [run_id], "dispatched a second time"
                return bool(slack.showing("The deploy succeeded."))

            _until(answered, second, "the answer was never shown")
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        claude.assert_clean()
        assert list(gh.runs) == [run_id]  # one run: never dispatched twice
        assert len(gh.dispatches()) == 1
        # What the model read: the run it waited on, and how the retry found it.
        [answer] = claude.last_request["messages"][-1]["content"]
        result = str(answer["content"])
        assert str(run_id) in result and found in result and "success" in result
