"""An alert's thread in Slack, against the fake Slack, on SQLite and PostgreSQL: the alert
is the bot's post at the top of its channel and the thread lives under it; the post is
made once whatever crashes between Slack's answer and our records; the whole path
through ``opsloop serve``'s app, from ``POST /alerts/alertmanager`` to the answer."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.outbox import shown_event
from bot.runtime import start_runtime, web_app
from engine import events as ev
from engine.alerts import is_pending_root
from engine.config import load_settings
from engine.context import Prompt
from engine.errors import StoreUnavailable
from engine.inputs import Accepted, receive_alert
from engine.models.base import Decision
from engine.models.scripted import ScriptedModel, call, say
from engine.runner import Runner
from engine.store import Store
from tests.bot.test_alerts import AM_TOKEN, CONFIG, bearer, config, dumps
from tests.engine.test_alerts import ALERTMANAGER
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic
from tests.fakes.slack import SIGNING_SECRET, TEAM_ID, TOKEN, FakeSlack, message_event, signed
from tests.support.demo_tools import make_tools
from tests.support.logs import alert

CHANNEL = "C0ALERTS"
INSTRUCTION = "Investigate with read-only tools and summarise. Do not act."


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def client_for(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url)


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = Delivery(store, client_for(slack), owner="proc-a", retry_base=None)
    yield d
    await d.close()


async def opened(store: Store, status: str = "firing", n: int = 1) -> str:
    event = alert(status, dedupe_key=f"delivery-{status}-{n}")  # type: ignore[arg-type]
    done = await receive_alert(store, event, team=TEAM_ID)
    assert isinstance(done, Accepted)
    return done.thread_id


def top_level(slack: FakeSlack) -> list[dict[str, Any]]:
    """The bot's posts at the top of the alerts channel (not in a thread)."""
    return [m for m in slack.posted(CHANNEL) if "thread_ts" not in m]


def text_of(message: dict[str, Any]) -> str:
    return message.get("text", "") + json.dumps(message.get("blocks", []), ensure_ascii=False)


async def test_the_alert_is_the_root_post_and_the_thread_lives_under_it(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    seen: list[Prompt] = []

    def look(prompt: Prompt) -> Decision:
        seen.append(prompt)
        return call("lookup", name="api latency")(prompt)

    tid = await opened(store)
    model = ScriptedModel([look, say("p99 is high since 09:00.")])
    await Runner(store, model, make_tools(Counter()), owner="runner").run(tid)
    await delivery.deliver(tid)

    [root] = top_level(slack)
    first = (await store.select_events(tid))[0]
    assert shown_event(root, tid) == first.event_id  # its metadata names the alert
    assert "Firing" in text_of(root) and "p99 latency above 2s" in text_of(root)
    assert "https://prometheus.example/graph" in text_of(root)
    info = await store.get_thread(tid)
    assert info.root_ts == root["ts"]  # moved from its placeholder to the post
    replies = [m for m in slack.posted(CHANNEL) if m.get("thread_ts") == root["ts"]]
    assert replies and any("p99 is high since 09:00." in text_of(m) for m in replies)
    assert len(slack.posted(CHANNEL)) == 1 + len(replies)  # nothing anywhere else
    # The model read the alert, as data, and the source's instruction.
    said = seen[0].messages[0]["content"][0]["text"]
    assert '"fingerprint": "5b9b5a2e3c1f0a7d"' in said
    assert said.endswith(f"Instruction from the team's configuration: {INSTRUCTION}")


async def test_the_runner_shows_the_root_before_its_first_tool_runs_and_records_it(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    """Under the runner's lease the root is posted (and the thread moved) before the tool
    runs; its receipt is the runner's to append; the pass at rest posts nothing twice."""
    tid = await opened(store)
    model = ScriptedModel([call("lookup", name="api"), say("Found it.")])
    runner = Runner(store, model, make_tools(Counter()), owner="runner", front_door=delivery)
    await runner.run(tid)
    [root] = top_level(slack)
    assert (await store.get_thread(tid)).root_ts == root["ts"]
    receipts = [e for e in await store.select_events(tid) if isinstance(e, ev.MessagePosted)]
    assert receipts and receipts[0].ts == root["ts"]
    await delivery.deliver(tid)
    assert top_level(slack) == [root]
    shown = Counter(shown_event(m, tid) for m in slack.posted(CHANNEL))
    assert set(shown.values()) == {1}
    assert all(m.get("thread_ts") == root["ts"] for m in slack.posted(CHANNEL) if m != root)


async def test_a_resolution_updates_the_root_and_is_said_in_the_thread(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await opened(store)
    runner = Runner(store, ScriptedModel([say("looking")]), make_tools(Counter()), owner="r")
    await runner.run(tid)
    await delivery.deliver(tid)
    [root] = top_level(slack)
    await opened(store, "resolved")
    await runner.run(tid)  # nothing to run: a resolution wakes nobody
    assert (await store.get_thread(tid)).status == "idle"
    await delivery.deliver(tid)
    [update] = [c for c in slack.calls_to("chat.update") if c.params["ts"] == root["ts"]]
    assert "Resolved" in str(update.params["blocks"])
    [now] = top_level(slack)
    assert "Resolved" in text_of(now) and "Firing" not in text_of(now)
    last = [m for m in slack.posted(CHANNEL) if m.get("thread_ts") == root["ts"]][-1]
    assert "resolved" in text_of(last)
    assert len(slack.calls_to("chat.postMessage")) == len(slack.posted(CHANNEL))


@pytest.mark.parametrize("later", ["same process", "new process"])
async def test_a_root_posted_before_the_thread_moved_is_found_not_posted_twice(
    store: Store, slack: FakeSlack, delivery: Delivery, monkeypatch, later: str
) -> None:
    """Slack has the post; the move of the thread to it failed (the process died): the
    next pass looks at the top of the channel, finds it by its metadata, moves there."""
    tid = await opened(store)
    await Runner(store, ScriptedModel([say("looking")]), make_tools(Counter()), owner="r").run(tid)
    real = store.set_root

    async def dies(*args: Any) -> bool:
        raise StoreUnavailable("cannot reach the database: gone")

    monkeypatch.setattr(store, "set_root", dies)
    with pytest.raises(StoreUnavailable):
        await delivery.deliver(tid)
    [root] = top_level(slack)
    assert is_pending_root((await store.get_thread(tid)).root_ts)
    monkeypatch.setattr(store, "set_root", real)
    again = delivery if later == "same process" else Delivery(store, client_for(slack), owner="b")
    assert await again.deliver(tid) >= 1  # the answer, in the thread
    assert top_level(slack) == [root]
    assert (await store.get_thread(tid)).root_ts == root["ts"]
    assert slack.calls_to("conversations.history")  # it looked before posting
    answer = [m for m in slack.posted(CHANNEL) if "looking" in text_of(m)]
    assert [m.get("thread_ts") for m in answer] == [root["ts"]]
    receipts = [e for e in await store.select_events(tid) if isinstance(e, ev.MessagePosted)]
    assert receipts[0].ts == root["ts"]


async def test_a_root_whose_receipt_was_lost_is_found_in_its_own_thread(
    store: Store, slack: FakeSlack, delivery: Delivery, monkeypatch
) -> None:
    """The thread moved to the post, its receipt was never stored: the next process
    reads the thread back (its root is its first message) and posts nothing twice."""
    tid = await opened(store)
    await Runner(store, ScriptedModel([say("looking")]), make_tools(Counter()), owner="r").run(tid)
    real = store.append

    async def no_receipts(thread_id: str, expected_seq: int, events: Any, **kw: Any) -> Any:
        if any(e.type == "message_posted" for e in events):
            raise StoreUnavailable("cannot reach the database: gone")
        return await real(thread_id, expected_seq, events, **kw)

    monkeypatch.setattr(store, "append", no_receipts)
    with pytest.raises(StoreUnavailable):
        await delivery.deliver(tid)
    monkeypatch.setattr(store, "append", real)
    [root] = top_level(slack)
    assert (await store.get_thread(tid)).root_ts == root["ts"]
    restarted = Delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    await restarted.deliver(tid)
    assert top_level(slack) == [root]
    assert slack.calls_to("conversations.replies")
    shown = Counter(shown_event(m, tid) for m in slack.posted(CHANNEL))
    assert set(shown.values()) == {1}  # every event posted once


# --- through the app `opsloop serve` runs -------------------------------------------------


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeSlack, FakeAnthropic]]:
    async with FakeSlack() as slack, FakeAnthropic() as claude:
        yield slack, claude
    claude.assert_clean()


async def _wait(slack: FakeSlack, method: str, found: Any) -> Any:
    for _ in range(100):
        hits = [c for c in slack.calls_to(method) if found(c)]
        if hits:
            return hits[-1]
        await slack.wait_for(method, count=len(slack.calls_to(method)) + 1, timeout=15)
    raise AssertionError(f"no {method} as expected")


def _said(call_: Any, text: str) -> bool:
    return text in json.dumps(call_.params, ensure_ascii=False)


async def test_an_alert_through_the_served_app_opens_a_thread_people_talk_in(
    db_url: str, fakes: tuple[FakeSlack, FakeAnthropic], tmp_path: Path
) -> None:
    slack, claude = fakes
    claude.text("p99 is high on api since 09:00; no deploy since yesterday.")
    claude.text("Still high; the cache hit rate dropped.")
    claude.text("It fired again: same cause.")
    settings = load_settings(
        {
            "DATABASE_URL": db_url,
            "OPSLOOP_SWEEP_SECONDS": "0.2",
            "ANTHROPIC_API_KEY": FAKE_API_KEY,
            "ANTHROPIC_BASE_URL": claude.url,
            "SLACK_API_URL": slack.url,
            "OPSLOOP_TICKETS_URL": f"sqlite:///{tmp_path / 'tickets.db'}",
        }
    )
    rt = await start_runtime(
        settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config(CONFIG)
    )
    rt.start()
    try:
        async with TestClient(TestServer(web_app(rt))) as client:
            firing = {**ALERTMANAGER, "alerts": [ALERTMANAGER["alerts"][0]]}
            resp = await client.post("/alerts/alertmanager", data=dumps(firing), headers=bearer())
            assert resp.status == 200, await resp.text()
            [result] = (await resp.json())["alerts"]

            answer = await _wait(slack, "chat.postMessage", lambda c: _said(c, "since 09:00"))
            [root] = [m for m in slack.posted(CHANNEL) if "thread_ts" not in m]
            assert answer.params["thread_ts"] == root["ts"]
            first = claude.requests[0]["messages"][0]["content"][0]["text"]
            assert "p99 latency above 2s on api" in first and first.endswith(INSTRUCTION)

            # A person asks in the alert's thread: the same thread, no mention needed.
            reply = message_event(
                user="U_ALICE",
                text="is the cache to blame?",
                channel=CHANNEL,
                ts="1900000000.000200",
                thread_ts=root["ts"],
            )
            body, headers = signed(reply)
            assert (await client.post("/slack/events", data=body, headers=headers)).status == 200
            # A person asked: the run is a plan message streamed to them.
            await _wait(slack, "chat.appendStream", lambda c: _said(c, "cache hit rate"))
            asked = claude.requests[1]["messages"]
            assert "is the cache to blame?" in json.dumps(asked)

            # It resolves: the root says so, and so does the thread; the model is not asked.
            resolved = copy.deepcopy(firing)
            resolved["alerts"][0]["status"] = "resolved"
            resp = await client.post("/alerts/alertmanager", data=dumps(resolved), headers=bearer())
            assert (await resp.json())["alerts"][0]["thread_id"] == result["thread_id"]
            await _wait(slack, "chat.update", lambda c: _said(c, "Resolved"))
            await _wait(slack, "chat.postMessage", lambda c: _said(c, "alert resolved"))
            assert len(claude.requests) == 2

            # It fires again later (a new startsAt): a new thread, a new root post.
            again = copy.deepcopy(firing)
            again["alerts"][0]["startsAt"] = "2025-01-06T13:00:00.000Z"
            resp = await client.post("/alerts/alertmanager", data=dumps(again), headers=bearer())
            assert (await resp.json())["alerts"][0]["thread_id"] != result["thread_id"]
            await _wait(slack, "chat.postMessage", lambda c: _said(c, "same cause"))
            roots = [m for m in slack.posted(CHANNEL) if "thread_ts" not in m]
            assert len(roots) == 2
            # Unauthenticated: refused by the served app too.
            wrong = {**bearer(), "Authorization": f"Bearer {AM_TOKEN}-not"}
            resp = await client.post("/alerts/alertmanager", data=dumps(firing), headers=wrong)
            assert resp.status == 401
    finally:
        await rt.close(5)
