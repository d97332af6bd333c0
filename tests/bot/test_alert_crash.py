"""`opsloop serve` SIGKILLed right after Slack answered the post an alert's thread opens
on (before the thread moved to it): the next process finds the post at the top of the
channel by its metadata, moves the thread there and never posts the alert twice."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest

from engine.alerts import is_pending_root
from engine.inputs import Accepted, receive_alert
from engine.store import open_store
from tests.bot.test_cli import fakes_in_a_thread
from tests.bot.test_serve_crash import serve, shown_event_ids
from tests.fakes.slack import TEAM_ID
from tests.support.logs import alert

pytestmark = pytest.mark.slow

CHANNEL = "C0ALERTS"
CONFIG = """
alerts:
  alertmanager:
    channel: C0ALERTS
    token: am-token
"""


async def _opened(db: str) -> str:
    store = await open_store(db)
    try:
        done = await receive_alert(store, alert(dedupe_key="d1"), team=TEAM_ID)
        assert isinstance(done, Accepted)
        return done.thread_id
    finally:
        await store.close()


async def _root(db: str, thread_id: str) -> str:
    store = await open_store(db)
    try:
        return (await store.get_thread(thread_id)).root_ts
    finally:
        await store.close()


def test_a_kill_after_the_alert_was_posted_does_not_post_it_twice(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    config = tmp_path / "opsloop.yaml"
    config.write_text(CONFIG)
    with fakes_in_a_thread() as (claude, slack):
        claude.text("p99 is high on api since 09:00.")
        thread_id = asyncio.run(_opened(db))

        first = serve(db, claude.url, slack.url, "slack_posted:1", OPSLOOP_CONFIG=str(config))
        try:
            _, err = first.communicate(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        assert first.returncode == -signal.SIGKILL, err[-2000:]
        [root] = slack.posted(CHANNEL)  # in Slack, at the top of the channel
        assert "thread_ts" not in root
        assert is_pending_root(asyncio.run(_root(db, thread_id)))  # the thread did not move

        second = serve(db, claude.url, slack.url, None, OPSLOOP_CONFIG=str(config))
        try:
            deadline = time.monotonic() + 60
            posts = lambda: slack.calls_to("chat.postMessage")  # noqa: E731
            while not any("since 09:00" in str(c.params) for c in posts()):
                assert second.poll() is None, second.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "the answer was never shown"
                time.sleep(0.1)
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        claude.assert_clean()  # asked once: the answer was in the log already
    assert [m for m in slack.posted(CHANNEL) if "thread_ts" not in m] == [root]
    answer = [m for m in slack.posted(CHANNEL) if "since 09:00" in json.dumps(m)]
    assert [m.get("thread_ts") for m in answer] == [root["ts"]]
    assert asyncio.run(_root(db, thread_id)) == root["ts"]
    counts = shown_event_ids(slack)
    assert counts and set(counts.values()) == {1}, counts  # every event posted once
    assert slack.calls_to("conversations.history")  # the second process looked first
