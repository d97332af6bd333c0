"""`opsloop serve` SIGKILLed between Slack's answer to a post and our receipt: the next
process finds the post by its metadata and never posts it twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.bot.test_cli import KEY, ROOT, SECRETS, _free_port, _post, fakes_in_a_thread

pytestmark = pytest.mark.slow


def serve(db: str, claude_url: str, slack_url: str, faults: str | None) -> subprocess.Popen:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "PORT", "ANTHROPIC_"))
    }
    env.update(
        SECRETS,
        PYTHONPATH=str(ROOT),
        DATABASE_URL=db,
        ANTHROPIC_BASE_URL=claude_url,
        SLACK_API_URL=slack_url,
        OPSLOOP_HOST="127.0.0.1",
        PORT=str(_free_port()),
        OPSLOOP_SWEEP_SECONDS="0.2",
        OPSLOOP_LEASE_SECONDS="2",  # how long the dead process keeps the thread
    )
    if faults:
        env["OPSLOOP_FAULTS"] = faults
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def shown_event_ids(slack) -> Counter:
    """How many posts carry each event id in their metadata."""
    ids: Counter = Counter()
    for call in slack.calls_to("chat.postMessage"):
        meta = call.params.get("metadata")
        meta = json.loads(meta) if isinstance(meta, str) else meta
        ids[meta["event_payload"]["event_id"]] += 1
    return ids


def test_a_kill_after_slack_answered_a_post_does_not_post_it_twice(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    with fakes_in_a_thread() as (claude, slack):
        claude.text("Here is the answer.")
        slack.add_message(KEY.channel, "what is up?", user="U1", ts=KEY.root_ts)
        asyncio.run(_post(db, "what is up?"))

        first = serve(db, claude.url, slack.url, "slack_posted:1")
        try:
            _, err = first.communicate(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        assert first.returncode == -signal.SIGKILL, err[-2000:]
        assert len(slack.calls_to("chat.postMessage")) == 1  # in Slack, not in our log

        second = serve(db, claude.url, slack.url, None)
        try:
            deadline = time.monotonic() + 60
            while not any("Here is the answer." in str(c.params) for c in slack.calls):
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
    counts = shown_event_ids(slack)
    assert counts and set(counts.values()) == {1}, counts  # every event posted once
    assert slack.calls_to("conversations.replies")  # the second process looked first
