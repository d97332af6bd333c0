"""`opsloop serve` SIGKILLed at each point of a run's plan message, on SQLite and
PostgreSQL: after Slack started the stream and before its receipt, after the receipt and
before the first append, and mid-answer (the answer partly streamed while the model
was writing it: the model call is made again). The next process ends with exactly one
plan message, whose task cards are what the log says and whose answer is there once
(the interrupted text replaced, not appended after)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bot.plan_outbox import plan_runs
from bot.render.plan import answer_text, plan_chunks, runs
from engine import events as ev
from engine.store import open_store
from tests.bot.test_cli import KEY, _post, fakes_in_a_thread
from tests.bot.test_serve_crash import serve
from tests.fakes.anthropic import Reply
from tests.fakes.slack import FakeSlack

pytestmark = pytest.mark.slow

# Two calls of a run_now tool (two task cards), then an answer long enough to be
# streamed in several pieces (bot.stream.ANSWER_PIECE), written over seconds (the fake
# writes 3 characters a delta): streamed while the model writes it.
ANSWER = " ".join(f"Finding {i} is documented." for i in range(120))
SLOW_ANSWER = Reply(content=[{"type": "text", "text": ANSWER}], gap=0.003)


async def _events(db: str, thread_id: str) -> list[ev.AnyEvent]:
    store = await open_store(db)
    try:
        return await store.select_events(thread_id)
    finally:
        await store.close()


def _done(events: list[ev.AnyEvent]) -> bool:
    """The run answered and its plan message is stopped (nothing left to show)."""
    answered = any(isinstance(e, ev.FinalAnswer) for e in events)
    return answered and not plan_runs(events, live_plan=True)


def _plan_block(message: dict[str, Any]) -> dict[str, Any]:
    [plan] = [b for b in message.get("blocks") or [] if b.get("type") == "plan"]
    return plan


@pytest.mark.parametrize("point", ["stream_started", "stream_appending", "stream_answering"])
def test_a_kill_at_each_point_of_a_plan_message_leaves_exactly_one(
    db_url: str, tmp_path: Path, point: str
) -> None:
    with fakes_in_a_thread() as (claude, slack):
        claude.tool_use("search_docs", {"query": "deploy"}, text="Looking.")
        claude.tool_use("search_docs", {"query": "rollback"}, text="And rollbacks.")
        claude.reply(SLOW_ANSWER)
        claude.responder = lambda _body: Reply.text(ANSWER)  # a call the kill cut, again
        slack.add_message(KEY.channel, "what do the docs say?", user="U1", ts=KEY.root_ts)
        thread_id = asyncio.run(_post(db_url, "what do the docs say?"))

        first = serve(db_url, claude.url, slack.url, f"{point}:1")
        try:
            _, err = first.communicate(timeout=90)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        assert first.returncode == -signal.SIGKILL, err[-2000:]
        _dead_at(point, slack, asyncio.run(_events(db_url, thread_id)))

        second = serve(db_url, claude.url, slack.url, None)
        try:
            deadline = time.monotonic() + 90
            while not _done(asyncio.run(_events(db_url, thread_id))):
                assert second.poll() is None, second.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "the plan message never stopped"
                time.sleep(0.2)
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        claude.assert_clean()  # every scripted reply was used, nothing refused
        events = asyncio.run(_events(db_url, thread_id))
        _exactly_one_plan_message_as_the_log_says(slack, events)


def _dead_at(point: str, slack: FakeSlack, events: list[ev.AnyEvent]) -> None:
    """What the first process left: Slack's side and the log's, at ``point``."""
    assert len(slack.calls_to("chat.startStream")) == 1
    recorded = [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]
    appends = slack.calls_to("chat.appendStream")
    texts = [c.params["markdown_text"] for c in appends if c.params.get("markdown_text")]
    if point == "stream_started":  # in Slack, not in the log
        assert recorded == [] and appends == []
    elif point == "stream_appending":  # in the log, nothing appended yet
        assert len(recorded) == 1 and appends == []
    else:  # the answer's first piece streamed while the model wrote it, the rest not
        assert len(recorded) == 1 and len(texts) == 1 and ANSWER.startswith(texts[0])
        assert len(texts[0]) < len(ANSWER)
        assert not any(isinstance(e, ev.FinalAnswer) for e in events)


def _exactly_one_plan_message_as_the_log_says(slack: FakeSlack, events: list[ev.AnyEvent]) -> None:
    assert len(slack.calls_to("chat.startStream")) == 1  # never a second plan message
    plans = [m for m in slack.posted(KEY.channel) if slack.workspace.stream(KEY.channel, m["ts"])]
    [plan] = plans
    receipts = [e for e in events if isinstance(e, ev.MessagePosted) and e.kind == "stream"]
    assert [r.ts for r in receipts] == [plan["ts"]]
    assert [e.ts for e in events if isinstance(e, ev.StreamStopped)] == [plan["ts"]]
    [run] = runs(events)
    wanted = [
        (c["id"], c["title"], c["status"])
        for c in plan_chunks(run, done=True)
        if c["type"] == "task_update"
    ]
    assert len(wanted) == 2
    shown = [(t["task_id"], t["title"], t["status"]) for t in _plan_block(plan)["tasks"]]
    assert shown == wanted
    markdown = "".join(b["text"] for b in plan["blocks"] if b.get("type") == "markdown")
    assert markdown == answer_text(run)  # the answer once, whole
    assert "Finding 119 is documented." in markdown
    # No line per call or for the answer: the thread is the status message and the plan.
    others = [m for m in slack.posted(KEY.channel) if m["ts"] != plan["ts"]]
    assert len(others) == 1
