"""`opsloop serve` SIGKILLed between Slack's answer to a post and our receipt: the next
process finds the post by its metadata and never posts it twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from bot.render.approval import APPROVE_ACTION
from tests.bot.test_cli import KEY, ROOT, SECRETS, _free_port, _http, _post, fakes_in_a_thread
from tests.fakes.slack import BOT_USER_ID, app_mention_event, signed

pytestmark = pytest.mark.slow


def serve(
    db: str,
    claude_url: str,
    slack_url: str,
    faults: str | None,
    *,
    port: int | None = None,
    **extra: str,
) -> subprocess.Popen:
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
        PORT=str(port or _free_port()),
        OPSLOOP_SWEEP_SECONDS="0.2",
        OPSLOOP_LEASE_SECONDS="2",  # how long the dead process keeps the thread
        **extra,
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
            while not slack.showing("Here is the answer."):
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


def test_a_card_posted_before_a_kill_is_approved_after_the_restart(tmp_path: Path) -> None:
    """Mention → approval card → SIGKILL → a new process → the reviewer clicks Approve on
    the card the dead process posted: the ticket is filed once and the answer arrives."""
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    tickets = f"sqlite:///{tmp_path / 'tickets.db'}"
    channel, root = "C0DEPLOYS", "1700000500.000100"
    with fakes_in_a_thread() as (claude, slack):
        claude.tool_use("create_ticket", {"title": "Flaky deploys"}, text="Filing it.")
        claude.text("Filed the ticket.")
        text = f"<@{BOT_USER_ID}> file a ticket"
        slack.add_message(channel, text, user="U_ALICE", ts=root)

        port = _free_port()
        first = serve(db, claude.url, slack.url, None, port=port, OPSLOOP_TICKETS_URL=tickets)
        try:
            _wait_healthy(first, port)
            mention = app_mention_event(user="U_ALICE", text=text, channel=channel, ts=root)
            assert _send(port, mention) == 200
            card = _wait_call(slack, first, lambda c: APPROVE_ACTION in str(c.params))
        finally:
            first.kill()  # SIGKILL: the card is out, the thread awaits approval
            first.communicate()

        port = _free_port()
        second = serve(db, claude.url, slack.url, None, port=port, OPSLOOP_TICKETS_URL=tickets)
        try:
            _wait_healthy(second, port)
            click = slack.click_on(card, APPROVE_ACTION, user="U_BOB", thread_ts=root)
            assert _send(port, click) == 200
            assert _send(port, click) == 200  # a double click changes nothing
            _wait_shown(slack, second, "Filed the ticket.")
            _wait_call(
                slack, second, lambda c: c.method == "chat.update" and "U_BOB" in str(c.params)
            )
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        claude.assert_clean()
    # Shown once: streamed into the plan message of the run the approval began.
    assert len(slack.showing("Filed the ticket.")) == 1
    assert asyncio.run(_ticket_titles(tickets)) == ["Flaky deploys"]  # filed once


def _wait_healthy(proc: subprocess.Popen, port: int, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        with contextlib.suppress(OSError):
            if _http("GET", f"http://127.0.0.1:{port}/healthz")[0] == 200:
                return
        time.sleep(0.1)
    raise AssertionError("serve never became healthy")


def _send(port: int, payload: dict) -> int:
    body, headers = signed(payload, SECRETS["SLACK_SIGNING_SECRET"])
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/slack/events", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_shown(slack, proc: subprocess.Popen, text: str, within: float = 60) -> dict:
    """The bot's first message that shows ``text`` (an answer streamed in pieces is in
    no single call: the message as Slack shows it is what counts)."""
    deadline = time.monotonic() + within
    while not (found := slack.showing(text)):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, f"{text!r} never shown in Slack"
        time.sleep(0.1)
    return found[0]


def _wait_call(slack, proc: subprocess.Popen, match, within: float = 60):
    deadline = time.monotonic() + within
    while True:
        found = [c for c in list(slack.calls) if match(c)]
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "never seen in Slack"
        time.sleep(0.1)


async def _ticket_titles(url: str) -> list[str]:
    engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://"))
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT title FROM tickets"))
            return [r.title for r in rows]
    finally:
        await engine.dispose()
