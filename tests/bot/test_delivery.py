"""Delivery: the Slack thread as a projection of the log, against the fake Slack, on
SQLite and PostgreSQL; ``pending_deliveries`` alone, without Slack."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot import blocks as bk
from bot.delivery import Delivery, Outbound, pending_deliveries, render, shown_event
from engine import events as ev
from engine.errors import StoreUnavailable
from engine.events import utcnow
from engine.inputs import cancel, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.policy import ApproverPolicy
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support import logs
from tests.support.demo_tools import make_tools

CHANNEL = "C0OPS00001"
REQUESTER = "U0REQUEST"
REVIEWER = "U0REVIEW"
LOOKUP = [call("lookup", name="db"), say("db found")]
DEPLOY = [call("deploy", name="api"), say("Deployed api.")]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def client_for(slack: FakeSlack, **kw: Any) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=slack.url, **kw)


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = Delivery(store, client_for(slack), owner="proc-a", retry_base=None)
    yield d
    await d.close()


async def start(store: Store, slack: FakeSlack, script: list[Step], text: str = "help") -> str:
    """A person's message in Slack, its thread, and a run of the scripted model."""
    root = slack.add_message(CHANNEL, text, user=REQUESTER)
    key = ThreadKey(TEAM_ID, CHANNEL, root["ts"])
    tid = (await post_user_message(store, key, text=text, user=REQUESTER)).thread_id
    await runner(store, script).run(tid)
    return tid


def runner(store: Store, script: list[Step]) -> Runner:
    return Runner(store, ScriptedModel(script), make_tools(Counter()), owner="runner")


async def receipts(store: Store, tid: str) -> list[ev.MessagePosted]:
    return [e for e in await store.select_events(tid) if isinstance(e, ev.MessagePosted)]


async def by_id(store: Store, tid: str) -> dict[str, ev.AnyEvent]:
    return {e.event_id: e for e in await store.select_events(tid)}


shown = shown_event  # the event id a posted message's metadata names


def all_text(message: dict[str, Any]) -> str:
    return message.get("text", "") + json.dumps(message.get("blocks", []))


# --- posting --------------------------------------------------------------------------


async def test_thread_to_final_answer_posts_each_line_once_with_metadata_and_receipts(
    store, slack, delivery
):
    tid = await start(store, slack, LOOKUP)
    root = (await store.get_thread(tid)).root_ts
    assert await delivery.deliver(tid) == 3
    posts = slack.posted(CHANNEL)
    events = await by_id(store, tid)
    shown_types = [events[shown(m, tid)].type for m in posts]
    assert shown_types == ["tool_call_requested", "tool_result", "final_answer"]
    assert all(m["thread_ts"] == root for m in posts)
    assert all(m["metadata"]["event_type"] == "opsloop_event" for m in posts)
    assert "db found" in posts[-1]["text"]
    assert "lookup" in all_text(posts[0])
    got = await receipts(store, tid)
    assert [(r.shows_event_id, r.ts, r.channel) for r in got] == [
        (shown(m, tid), m["ts"], CHANNEL) for m in posts
    ]
    # The first post for the thread in this process looked in Slack first.
    [replies] = slack.calls_to("conversations.replies")
    assert replies.params["include_all_metadata"] in ("1", "true", True)


async def test_delivering_again_posts_nothing_and_calls_slack_no_more(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await delivery.deliver(tid) == 3
    calls = len(slack.calls)
    assert await delivery.deliver(tid) == 0
    assert await Delivery(store, client_for(slack), owner="proc-b").deliver(tid) == 0
    assert len(slack.calls) == calls
    assert len(await receipts(store, tid)) == 3


async def test_concurrent_deliveries_post_each_event_once(store, slack):
    tid = await start(store, slack, LOOKUP)
    a = Delivery(store, client_for(slack), owner="proc-a", retry_base=None)
    b = Delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    made = await asyncio.gather(a.deliver(tid), a.deliver(tid), b.deliver(tid), b.deliver(tid))
    assert len(slack.posted(CHANNEL)) == 3
    assert len({shown(m, tid) for m in slack.posted(CHANNEL)}) == 3
    assert len(await receipts(store, tid)) == 3
    assert sum(made) == 3  # a pass that lost the lease race made nothing


async def test_another_owner_holding_the_lease_gets_0_and_it_delivers_later(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await store.acquire_lease(tid, "someone-else", 30)
    assert await delivery.deliver(tid) == 0
    assert slack.calls == []
    await store.release_lease(tid, "someone-else")
    assert await delivery.deliver(tid) == 3
    assert (await store.get_thread(tid)).lease_owner is None  # released after the pass


async def test_a_lease_held_by_the_same_owner_is_used_and_left_in_place(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await store.acquire_lease(tid, "proc-a", 30)  # say, this process's runner
    assert await delivery.deliver(tid) == 3
    assert (await store.get_thread(tid)).lease_owner == "proc-a"


async def test_posts_escape_what_the_model_wrote(store, slack, delivery):
    tid = await start(store, slack, [say("<!channel> done & <https://evil.example|login>")])
    assert await delivery.deliver(tid) == 1
    [answer] = slack.posted(CHANNEL)
    text = all_text(answer)
    assert "&lt;!channel&gt; done &amp; &lt;https://evil.example|login&gt;" in text
    assert "<!channel>" not in text and "<https://evil" not in text


# --- the approval card ----------------------------------------------------------------


async def card_for(store: Store, slack: FakeSlack, delivery: Delivery) -> tuple[str, dict, str]:
    """A thread awaiting approval, its card delivered: (thread, card message, call id)."""
    tid = await start(store, slack, DEPLOY)
    state = await store.load(tid)
    assert state.status == "awaiting_approval"
    assert await delivery.deliver(tid) == 1
    [card] = slack.posted(CHANNEL)
    assert (await by_id(store, tid))[shown(card, tid)].type == "approval_requested"
    actions = [b for b in card["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions[0]["elements"]] == [bk.APPROVE_ACTION, bk.REJECT_ACTION]
    return tid, card, state.pending.tool_call_id


async def decide(store: Store, tid: str, cid: str, decision: str, reason: str = "") -> None:
    await decide_approval(
        store, tid, tool_call_id=cid, reviewer=REVIEWER, decision=decision,  # type: ignore[arg-type]
        policy=ApproverPolicy(), reason=reason,
    )  # fmt: skip


async def the_update(slack: FakeSlack, card: dict[str, Any]) -> dict[str, Any]:
    [update] = slack.calls_to("chat.update")
    assert update.params["ts"] == card["ts"] and update.params["channel"] == CHANNEL
    return update.params


async def test_approval_updates_the_card_in_place_naming_the_reviewer(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    await decide(store, tid, cid, "approve")
    assert await delivery.deliver(tid) == 1
    params = await the_update(slack, card)
    text = json.dumps(params["blocks"])
    assert f"Approved by <@{REVIEWER}>" in text
    assert not [b for b in params["blocks"] if b["type"] == "actions"]  # no live buttons
    assert params["metadata"] == card["metadata"]  # still names the card's event
    assert len(slack.posted(CHANNEL)) == 1  # updated, not posted again
    granted = [e for e in await store.select_events(tid) if e.type == "approval_granted"]
    assert [(r.shows_event_id, r.ts) for r in await receipts(store, tid)][-1] == (
        granted[0].event_id,
        card["ts"],
    )
    # The call runs; its result and the answer follow in the thread.
    await runner(store, DEPLOY).run(tid)
    assert await delivery.deliver(tid) == 2
    assert "Deployed api." in slack.posted(CHANNEL)[-1]["text"]


async def test_rejection_with_a_reason_shows_who_and_why_on_the_card(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    await decide(store, tid, cid, "reject", reason="freeze until <Monday>")
    assert await delivery.deliver(tid) == 1
    text = json.dumps((await the_update(slack, card))["blocks"])
    assert f"Rejected by <@{REVIEWER}>" in text
    assert "freeze until &lt;Monday&gt;" in text


async def test_expiry_updates_the_card(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    state = await store.load(tid)
    await store.append(tid, state.last_seq, [ev.ApprovalExpired(tool_call_id=cid)], state=state)
    assert await delivery.deliver(tid) == 1
    assert "Expired" in json.dumps((await the_update(slack, card))["blocks"])


async def test_cancelling_updates_the_pending_card_and_posts_a_line(store, slack, delivery):
    tid, card, _ = await card_for(store, slack, delivery)
    await cancel(store, tid, by=REQUESTER, policy=ApproverPolicy(), reason="wrong env")
    assert await delivery.deliver(tid) == 2
    assert f"Cancelled by <@{REQUESTER}>" in json.dumps((await the_update(slack, card))["blocks"])
    line = slack.posted(CHANNEL)[-1]
    assert "wrong env" in all_text(line)
    cancelled = next(e for e in await store.select_events(tid) if e.type == "thread_cancelled")
    assert {r.ts for r in await receipts(store, tid) if r.shows_event_id == cancelled.event_id} == {
        card["ts"],
        line["ts"],
    }
    assert await delivery.deliver(tid) == 0


# --- crashes and lost answers ---------------------------------------------------------


@pytest.mark.parametrize("later", ["same process", "new process"])
async def test_a_post_whose_answer_was_lost_is_found_in_slack_not_posted_again(store, slack, later):
    tid = await start(store, slack, LOOKUP)
    gate = slack.hold("chat.postMessage")  # Slack posts, its answer never arrives
    first = Delivery(store, client_for(slack, timeout=1), owner="proc-a", retry_base=None)
    assert await first.deliver(tid) == 0
    assert len(slack.posted(CHANNEL)) == 1
    assert await receipts(store, tid) == []
    gate.set()
    again = first if later == "same process" else Delivery(store, client_for(slack), owner="p-b")
    assert await again.deliver(tid) == 2  # the two others; the first one is found
    posts = slack.posted(CHANNEL)
    assert len(slack.calls_to("chat.postMessage")) == 3 and len(posts) == 3
    got = await receipts(store, tid)
    assert [(r.shows_event_id, r.ts) for r in got] == [(shown(m, tid), m["ts"]) for m in posts]


async def test_a_receipt_lost_in_a_crash_is_recovered_without_a_second_post(
    store, slack, delivery, monkeypatch
):
    tid = await start(store, slack, LOOKUP)
    real = store.append

    async def crash_on_receipts(thread_id: str, expected_seq: int, events, **kw):  # type: ignore[no-untyped-def]
        if any(e.type == "message_posted" for e in events):
            raise StoreUnavailable("cannot reach the database: gone")
        return await real(thread_id, expected_seq, events, **kw)

    monkeypatch.setattr(store, "append", crash_on_receipts)
    with pytest.raises(StoreUnavailable):
        await delivery.deliver(tid)
    monkeypatch.setattr(store, "append", real)
    [posted] = slack.posted(CHANNEL)
    restarted = Delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    assert await restarted.deliver(tid) == 2
    assert len(slack.calls_to("chat.postMessage")) == 3
    assert (await receipts(store, tid))[0].ts == posted["ts"]


async def test_deliver_recent_finishes_threads_updated_since(store, slack, delivery):
    old = await start(store, slack, LOOKUP, text="old")
    since = utcnow()
    await asyncio.sleep(0.01)
    new = await start(store, slack, [say("new answer")], text="new")
    await delivery.deliver_recent(since)
    assert [shown(m, new) is not None for m in slack.posted(CHANNEL)] == [True]
    await delivery.deliver_recent(since.replace(year=since.year - 1))
    assert len(await receipts(store, old)) == 3 and len(await receipts(store, new)) == 1


# --- Slack errors ---------------------------------------------------------------------


async def test_a_429_is_waited_out_and_retried(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    slack.rate_limit("chat.postMessage", times=1, retry_after=1)
    began = time.monotonic()
    assert await delivery.deliver(tid) == 3
    assert time.monotonic() - began >= 1
    assert len(slack.calls_to("chat.postMessage")) == 4  # the 429, then three posts
    assert len(slack.posted(CHANNEL)) == 3


async def test_a_429_longer_than_the_inline_wait_stops_for_now(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    slack.rate_limit("chat.postMessage", times=1, retry_after=60)
    began = time.monotonic()
    assert await delivery.deliver(tid) == 0
    assert time.monotonic() - began < 5
    assert slack.posted(CHANNEL) == [] and await receipts(store, tid) == []
    assert await delivery.deliver(tid) == 3


async def test_a_slack_error_is_logged_and_the_event_delivered_later(
    store, slack, delivery, caplog
):
    tid = await start(store, slack, LOOKUP)
    first = pending_deliveries(await store.select_events(tid))[0].event.event_id
    slack.fail("chat.postMessage", "internal_error")
    with caplog.at_level(logging.WARNING, logger="opsloop.delivery"):
        assert await delivery.deliver(tid) == 0
    assert f"thread_id={tid} event_id={first}" in caplog.text
    assert "internal_error" in caplog.text and TOKEN not in caplog.text
    assert await receipts(store, tid) == []
    assert await delivery.deliver(tid) == 3
    assert len(slack.posted(CHANNEL)) == 3


async def test_a_stopped_pass_is_retried_in_process(store, slack):
    tid = await start(store, slack, LOOKUP)
    d = Delivery(store, client_for(slack), owner="proc-a", retry_base=0.05)
    slack.fail("chat.postMessage", "internal_error")
    try:
        assert await d.deliver(tid) == 0
        await slack.wait_for("chat.postMessage", 4)  # the failed one, then three
        await asyncio.gather(*d._tasks)  # the retry's receipts
        assert len(await receipts(store, tid)) == 3
    finally:
        await d.close()
    assert len(slack.posted(CHANNEL)) == 3


async def test_posts_are_not_resent_by_the_sdk_after_a_connection_error(store, slack):
    client = client_for(slack)
    d = Delivery(store, client, owner="proc-a")
    handlers = d._post_client.retry_handlers
    assert not [h for h in handlers if isinstance(h, AsyncConnectionErrorRetryHandler)]
    assert [h for h in client.retry_handlers if isinstance(h, AsyncConnectionErrorRetryHandler)]


# --- pending_deliveries, pure ---------------------------------------------------------


def kinds(items: list[Outbound]) -> list[tuple[str, str]]:
    return [(i.kind, i.event.type) for i in items]


def receipt(event: ev.Event, ts: str) -> ev.MessagePosted:
    return ev.MessagePosted(shows_event_id=event.event_id, channel="C1", ts=ts)


def test_pending_deliveries_of_a_whole_thread_in_log_order():
    log = logs.stamp(logs.happy_path())
    assert kinds(pending_deliveries(log)) == [
        ("post", "tool_call_requested"), ("post", "tool_result"),
        ("post", "approval_requested"), ("update", "approval_granted"),
        ("post", "tool_result"), ("post", "final_answer"),
    ]  # fmt: skip
    items = pending_deliveries(log)
    assert items[4].call is not None and items[4].call.intent == "deploy"  # names the tool
    assert items[3].card_ts == ""  # the card is not posted yet


def test_receipts_take_events_off_and_give_the_card_its_ts():
    log = logs.stamp(logs.happy_path())
    first3 = [i.event for i in pending_deliveries(log)[:3]]
    log = logs.stamp([*log, *(receipt(e, f"1.{n}") for n, e in enumerate(first3))])
    todo = pending_deliveries(log)
    assert kinds(todo) == [
        ("update", "approval_granted"), ("post", "tool_result"), ("post", "final_answer"),
    ]  # fmt: skip
    assert todo[0].card_ts == "1.2" and todo[0].requester == logs.REQUESTER
    assert "Approved by" in json.dumps(render(todo[0]))


def test_a_cancel_updates_the_open_card_and_posts_its_line_each_once():
    log = logs.stamp([logs.user(), *logs.approval_pending(), ev.ThreadCancelled(actor="U0X")])
    card, cancelled = log[3], log[4]
    with_card = [*log, receipt(card, "5.0")]
    assert kinds(pending_deliveries(logs.stamp(with_card))) == [
        ("update", "thread_cancelled"), ("post", "thread_cancelled"),
    ]  # fmt: skip
    updated = logs.stamp([*with_card, receipt(cancelled, "5.0")])
    assert kinds(pending_deliveries(updated)) == [("post", "thread_cancelled")]
    lined = logs.stamp([*with_card, receipt(cancelled, "6.0")])
    assert kinds(pending_deliveries(lined)) == [("update", "thread_cancelled")]


def test_events_people_need_not_see_are_never_pending():
    log = logs.stamp([logs.user(), *logs.approval_pending(), logs.user("also this")])
    assert kinds(pending_deliveries(log)) == [("post", "approval_requested")]


@pytest.mark.parametrize("seed", range(40))
def test_delivering_random_logs_shows_each_thing_once_and_ends(seed):
    log = logs.stamp(logs.random_log(seed, 60))
    done: list[tuple[str, str]] = []
    for n in range(200):
        todo = pending_deliveries(log)
        if not todo:
            break
        item = todo[0]
        assert item.kind == "post" or item.card_ts, "a card is updated only once posted"
        assert render(item), f"{item.event.type} renders nothing"
        done.append((item.kind, item.event.event_id))
        ts = item.card_ts if item.kind == "update" else f"9{n}.0"
        log = logs.stamp([*log, receipt(item.event, ts)])
    assert pending_deliveries(log) == []
    assert len(done) == len(set(done))
