"""Delivery: the Slack thread as a projection of the log, against the fake Slack, on
SQLite and PostgreSQL; ``pending_deliveries`` alone, without Slack.

Every thread's first bot message is its status message (see ``status_and_lines``)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot import outbox
from bot.delivery import Delivery
from bot.outbox import Outbound, pending_deliveries, render, shown_event
from bot.render.approval import APPROVE_ACTION, EDIT_ACTION, REJECT_ACTION
from bot.render.reconcile import RETRY_ACTION
from bot.render.status import CANCEL_ACTION, status_message
from engine import events as ev
from engine.errors import StoreUnavailable
from engine.events import utcnow
from engine.inputs import Decider, cancel, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, Step, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.state import reduce
from engine.store import Store, ThreadKey
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support import logs
from tests.support.demo_tools import make_tools

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = "C0OPS00001"
CAROL = "U0CAROL01"
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


def lines_delivery(*args: Any, **kw: Any) -> Delivery:
    """A delivery showing a line per call and answer: what this module is about (each
    run as one plan message: tests/bot/test_stream_delivery.py)."""
    return Delivery(*args, live_plan=False, **kw)


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = lines_delivery(store, client_for(slack), owner="proc-a", retry_base=None)
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


async def first_message(store: Store, tid: str) -> ev.UserMessage:
    return next(e for e in await store.select_events(tid) if isinstance(e, ev.UserMessage))


async def status_and_lines(
    store: Store, slack: FakeSlack, tid: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The thread's status message (its one message showing the first user_message,
    and its first bot message) and the other bot messages in the thread."""
    posts = [m for m in slack.posted(CHANNEL) if shown(m, tid) is not None]
    anchor = (await first_message(store, tid)).event_id
    assert [shown(m, tid) for m in posts].count(anchor) == 1, "one status message"
    assert shown(posts[0], tid) == anchor, "the status message comes first"
    return posts[0], posts[1:]


async def line_receipts(store: Store, tid: str, status: dict[str, Any]) -> list[ev.MessagePosted]:
    """The receipts of everything but the status message."""
    return [r for r in await receipts(store, tid) if r.ts != status["ts"]]


def cancel_button(message: dict[str, Any]) -> dict[str, Any] | None:
    accessories = [b.get("accessory") for b in message["blocks"] if b.get("accessory")]
    buttons = [a for a in accessories if a.get("action_id") == CANCEL_ACTION]
    assert len(buttons) <= 1
    return buttons[0] if buttons else None


# --- posting --------------------------------------------------------------------------


async def test_thread_to_final_answer_posts_each_line_once_with_metadata_and_receipts(
    store, slack, delivery
):
    tid = await start(store, slack, LOOKUP)
    root = (await store.get_thread(tid)).root_ts
    assert await delivery.deliver(tid) == 4  # the status message and three lines
    status, posts = await status_and_lines(store, slack, tid)
    events = await by_id(store, tid)
    shown_types = [events[shown(m, tid)].type for m in posts]
    assert shown_types == ["tool_call_requested", "tool_result", "final_answer"]
    assert all(m["thread_ts"] == root for m in [status, *posts])
    assert all(m["metadata"]["event_type"] == "opsloop_event" for m in [status, *posts])
    assert "db found" in posts[-1]["text"]
    assert "Lookup" in all_text(posts[0])
    got = await line_receipts(store, tid, status)
    assert [(r.shows_event_id, r.ts, r.channel) for r in got] == [
        (shown(m, tid), m["ts"], CHANNEL) for m in posts
    ]
    # The first post for the thread in this process looked in Slack first.
    [replies] = slack.calls_to("conversations.replies")
    assert replies.params["include_all_metadata"] in ("1", "true", True)


async def test_delivering_again_posts_nothing_and_calls_slack_no_more(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await delivery.deliver(tid) == 4
    calls = len(slack.calls)
    assert await delivery.deliver(tid) == 0
    assert await lines_delivery(store, client_for(slack), owner="proc-b").deliver(tid) == 0
    assert len(slack.calls) == calls
    status, _ = await status_and_lines(store, slack, tid)
    assert len(await line_receipts(store, tid, status)) == 3


async def test_concurrent_deliveries_post_each_event_once(store, slack):
    tid = await start(store, slack, LOOKUP)
    a = lines_delivery(store, client_for(slack), owner="proc-a", retry_base=None)
    b = lines_delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    made = await asyncio.gather(a.deliver(tid), a.deliver(tid), b.deliver(tid), b.deliver(tid))
    assert len(slack.posted(CHANNEL)) == 4
    assert len({shown(m, tid) for m in slack.posted(CHANNEL)}) == 4
    status, _ = await status_and_lines(store, slack, tid)
    assert len(await line_receipts(store, tid, status)) == 3
    assert sum(made) == 4  # a pass that lost the lease race made nothing


async def test_another_owner_holding_the_lease_gets_0_and_it_delivers_later(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await store.acquire_lease(tid, "someone-else", 30)
    assert await delivery.deliver(tid) == 0
    assert slack.calls == []
    await store.release_lease(tid, "someone-else")
    assert await delivery.deliver(tid) == 4
    assert (await store.get_thread(tid)).lease_owner is None  # released after the pass


async def test_a_lease_held_by_the_same_owner_is_used_and_left_in_place(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    assert await store.acquire_lease(tid, "proc-a", 30)  # this owner holds it already
    assert await delivery.deliver(tid) == 4
    assert (await store.get_thread(tid)).lease_owner == "proc-a"


async def test_posts_escape_what_the_model_wrote(store, slack, delivery):
    tid = await start(store, slack, [say("<!channel> done & <https://evil.example|login>")])
    assert await delivery.deliver(tid) == 2
    _, [answer] = await status_and_lines(store, slack, tid)
    text = all_text(answer)
    assert "&lt;!channel&gt; done &amp; &lt;https://evil.example|login&gt;" in text
    assert "<!channel>" not in text and "<https://evil" not in text


# --- the approval card ----------------------------------------------------------------


async def card_for(store: Store, slack: FakeSlack, delivery: Delivery) -> tuple[str, dict, str]:
    """A thread awaiting approval, its card delivered: (thread, card message, call id)."""
    tid = await start(store, slack, DEPLOY)
    state = await store.load(tid)
    assert state.status == "awaiting_approval"
    assert await delivery.deliver(tid) == 2  # the status message, then the card
    _, [card] = await status_and_lines(store, slack, tid)
    assert (await by_id(store, tid))[shown(card, tid)].type == "approval_requested"
    actions = [b for b in card["blocks"] if b["type"] == "actions"]
    buttons = [e["action_id"] for e in actions[0]["elements"]]
    assert buttons == [APPROVE_ACTION, EDIT_ACTION, REJECT_ACTION]
    return tid, card, state.pending.tool_call_id


async def decide(store: Store, tid: str, cid: str, decision: str, reason: str = "") -> None:
    await decide_approval(
        store, tid, tool_call_id=cid, decider=Decider(REVIEWER), decision=decision,  # type: ignore[arg-type]
        reviewers=ReviewerRule(), reason=reason,
    )  # fmt: skip


async def the_update(slack: FakeSlack, card: dict[str, Any]) -> dict[str, Any]:
    [update] = [c for c in slack.calls_to("chat.update") if c.params["ts"] == card["ts"]]
    assert update.params["channel"] == CHANNEL
    return update.params


async def test_approval_updates_the_card_in_place_naming_the_reviewer(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    await decide(store, tid, cid, "approve")
    assert await delivery.deliver(tid) == 2  # the card, and the status message
    params = await the_update(slack, card)
    text = json.dumps(params["blocks"])
    assert f"Approved by <@{REVIEWER}>" in text
    assert not [b for b in params["blocks"] if b["type"] == "actions"]  # no live buttons
    assert params["metadata"] == card["metadata"]  # still names the card's event
    assert len(slack.posted(CHANNEL)) == 2  # updated, not posted again
    granted = [e for e in await store.select_events(tid) if e.type == "approval_granted"]
    assert [(r.shows_event_id, r.ts) for r in await receipts(store, tid)][-2] == (
        granted[0].event_id,
        card["ts"],
    )
    # The call runs; its result and the answer follow in the thread.
    await runner(store, DEPLOY).run(tid)
    assert await delivery.deliver(tid) == 3  # two lines, and the status message
    assert "Deployed api." in slack.posted(CHANNEL)[-1]["text"]


async def test_rejection_with_a_reason_shows_who_and_why_on_the_card(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    await decide(store, tid, cid, "reject", reason="freeze until <Monday>")
    assert await delivery.deliver(tid) == 2
    text = json.dumps((await the_update(slack, card))["blocks"])
    assert f"Rejected by <@{REVIEWER}>" in text
    assert "freeze until &lt;Monday&gt;" in text


async def test_a_reply_while_the_card_waits_updates_the_card_in_place(store, slack, delivery):
    """Issue 8 item 7: carol writes while bob has the card in front of him; the card
    says so at once (who, and the first line of what she wrote, escaped once). The
    requester writing withdraws the card instead (the next test)."""
    tid, card, cid = await card_for(store, slack, delivery)
    info = await store.get_thread(tid)
    key = ThreadKey(TEAM_ID, CHANNEL, info.root_ts)
    text = "actually, deploy version 2.0.0 to production &amp; <@U0OTHER1>\nthanks"
    await post_user_message(
        store, key, text=text, user=CAROL, source={"kind": "slack"}, start=False
    )
    await runner(store, DEPLOY).run(tid)  # the worker's run after the reply: nothing to do
    assert (await store.load(tid)).status == "awaiting_approval"
    assert await delivery.deliver(tid) == 1  # the card, updated; nothing posted
    params = await the_update(slack, card)
    assert params["metadata"] == card["metadata"]
    [note] = [b for b in params["blocks"] if "wrote since this was posted" in json.dumps(b)]
    assert note["text"]["text"] == (
        f"⚠️ <@{CAROL}> wrote since this was posted: "
        "“actually, deploy version 2.0.0 to production &amp; @U0OTHER1”"  # pings nobody new
    )
    assert params["blocks"].index(note) < [b["type"] for b in params["blocks"]].index("actions")
    assert [e["action_id"] for b in params["blocks"] if b["type"] == "actions"
            for e in b["elements"]] == [APPROVE_ACTION, EDIT_ACTION, REJECT_ACTION]  # fmt: skip
    assert "thanks" not in json.dumps(params["blocks"])  # the first line only
    assert "wrote since" in params["text"]  # the notification text says it too
    assert len(slack.posted(CHANNEL)) == 2
    reply = next(
        e for e in await store.select_events(tid) if e.type == "user_message" and e.seq > 1
    )
    assert (await receipts(store, tid))[-1].shows_event_id == reply.event_id
    assert await delivery.deliver(tid) == 0
    # bob approves: the decided card still says what carol wrote.
    await decide(store, tid, cid, "approve")
    assert await delivery.deliver(tid) == 2
    decided = slack.calls_to("chat.update")[-2].params
    assert decided["ts"] == card["ts"] and "wrote since this was posted" in json.dumps(
        decided["blocks"]
    )


async def test_the_requesters_reply_withdraws_the_card_in_place(store, slack, delivery):
    """Issue 17 §1: the requester writes while the card waits: the card is updated in
    place, buttons gone, saying who wrote; a click on it afterwards changes nothing."""
    tid, card, cid = await card_for(store, slack, delivery)
    info = await store.get_thread(tid)
    key = ThreadKey(TEAM_ID, CHANNEL, info.root_ts)
    await post_user_message(
        store, key, text="wait, production", user=REQUESTER, dedupe_key="Ev-w", start=False
    )
    assert await delivery.deliver(tid) >= 1
    params = await the_update(slack, card)
    assert params["metadata"] == card["metadata"]
    blocks = json.dumps(params["blocks"])
    assert "Withdrawn: Deploy" in blocks and f"<@{REQUESTER}> wrote since" in blocks
    assert not [b for b in params["blocks"] if b["type"] == "actions"]  # no buttons
    late = await decide_approval(
        store, tid, tool_call_id=cid, decider=Decider(REVIEWER), decision="approve",
        reviewers=ReviewerRule(),
    )  # fmt: skip
    assert late.event is not None and late.event.type == "approval_refused"
    assert (await store.load(tid)).status == "running"  # the model decides again


async def test_expiry_updates_the_card(store, slack, delivery):
    tid, card, cid = await card_for(store, slack, delivery)
    state = await store.load(tid)
    await store.append(tid, state.last_seq, [ev.ApprovalExpired(tool_call_id=cid)], state=state)
    assert await delivery.deliver(tid) == 2
    assert "Expired" in json.dumps((await the_update(slack, card))["blocks"])


async def test_cancelling_updates_the_pending_card_and_posts_a_line(store, slack, delivery):
    tid, card, _ = await card_for(store, slack, delivery)
    await cancel(
        store, tid, decider=Decider(REQUESTER), reviewers=ReviewerRule(), reason="wrong env"
    )
    assert await delivery.deliver(tid) == 3  # the card, a line, the status message
    assert f"Cancelled by <@{REQUESTER}>" in json.dumps((await the_update(slack, card))["blocks"])
    status, [_, line] = await status_and_lines(store, slack, tid)
    assert "wrong env" in all_text(line)
    cancelled = next(e for e in await store.select_events(tid) if e.type == "thread_cancelled")
    assert {r.ts for r in await receipts(store, tid) if r.shows_event_id == cancelled.event_id} == {
        card["ts"],
        line["ts"],
        status["ts"],
    }
    assert "Cancelled" in all_text(status) and cancel_button(status) is None
    assert await delivery.deliver(tid) == 0


# --- the status message ----------------------------------------------------------------


def status_updates(slack: FakeSlack, status: dict[str, Any]) -> list[dict[str, Any]]:
    return [c.params for c in slack.calls_to("chat.update") if c.params["ts"] == status["ts"]]


async def test_the_status_message_is_posted_first_once_and_updated_in_place(store, slack):
    """Awaiting approval, running, done: each stage delivered by a new process, so what
    the status message shows is read from the log, not remembered."""

    def process(name: str) -> Delivery:
        return lines_delivery(
            store, client_for(slack), owner=name, reviewers=ReviewerRule(frozenset({REVIEWER}))
        )

    tid = await start(store, slack, DEPLOY)
    assert await process("proc-1").deliver(tid) == 2
    status, [card] = await status_and_lines(store, slack, tid)
    assert shown(card, tid) is not None and card["ts"] > status["ts"]
    assert status["thread_ts"] == (await store.get_thread(tid)).root_ts
    first = await first_message(store, tid)
    assert status["metadata"]["event_payload"]["event_id"] == first.event_id
    assert (await receipts(store, tid))[0].shows_event_id == first.event_id
    assert (await receipts(store, tid))[0].ts == status["ts"]
    assert "Waiting for approval" in all_text(status) and f"<@{REVIEWER}>" in all_text(status)
    button = cancel_button(status)
    assert button is not None and button["value"] == tid
    assert await process("proc-2").deliver(tid) == 0  # nothing changed: no call at all

    await decide(store, tid, (await store.load(tid)).pending.tool_call_id, "approve")
    assert await process("proc-3").deliver(tid) == 2  # the card, then the status message
    [running] = status_updates(slack, status)
    assert slack.calls_to("chat.update")[-1].params is running  # after the card's update
    assert "Working" in all_text(running) and cancel_button(running)["value"] == tid
    assert running["metadata"]["event_payload"]["event_id"] == first.event_id

    await runner(store, DEPLOY).run(tid)
    assert await process("proc-4").deliver(tid) == 3  # two lines, then the status message
    [_, done] = status_updates(slack, status)
    assert "Done" in all_text(done) and cancel_button(done) is None
    assert await process("proc-5").deliver(tid) == 0
    shown_now, _ = await status_and_lines(store, slack, tid)  # still one, still first
    assert shown_now["ts"] == status["ts"] and cancel_button(shown_now) is None
    assert len(slack.calls_to("chat.postMessage")) == 4  # status, card, result, answer
    # Each update is recorded: a receipt of the latest event, with the message's ts.
    events = await store.select_events(tid)
    last = [e for e in events if e.type != "message_posted"][-1]
    assert [r.shows_event_id for r in await receipts(store, tid) if r.ts == status["ts"]] == [
        first.event_id,
        next(e.event_id for e in events if e.type == "approval_requested"),  # when posted
        next(e.event_id for e in events if e.type == "approval_granted"),
        last.event_id,
    ]


async def test_the_status_message_is_not_posted_twice_by_two_processes(store, slack):
    tid = await start(store, slack, DEPLOY)
    a = lines_delivery(store, client_for(slack), owner="proc-a", retry_base=None)
    b = lines_delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    await asyncio.gather(a.deliver(tid), b.deliver(tid), a.deliver(tid), b.deliver(tid))
    assert await a.deliver(tid) == 0 and await b.deliver(tid) == 0
    status, [_card] = await status_and_lines(store, slack, tid)
    await cancel(store, tid, decider=Decider(REQUESTER), reviewers=ReviewerRule())
    await asyncio.gather(b.deliver(tid), a.deliver(tid))
    status, [_card, _line] = await status_and_lines(store, slack, tid)
    [update] = status_updates(slack, status)
    assert "Cancelled" in all_text(update) and cancel_button(update) is None


async def test_a_status_post_whose_receipt_was_lost_is_found_and_then_updated(store, slack):
    """The post landed, its receipts did not; meanwhile the thread moved on. A new
    process finds the message by its metadata (never posts another) and updates it."""
    tid = await start(store, slack, DEPLOY)
    gate = slack.hold("chat.postMessage")
    first = lines_delivery(store, client_for(slack, timeout=1), owner="proc-a", retry_base=None)
    assert await first.deliver(tid) == 0
    gate.set()
    [status] = slack.posted(CHANNEL)
    assert "Waiting for approval" in all_text(status) and await receipts(store, tid) == []
    await cancel(
        store, tid, decider=Decider(REQUESTER), reviewers=ReviewerRule(), reason="not today"
    )
    again = lines_delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    assert await again.deliver(tid) == 4  # the card posted and updated, a line, the status
    status, [card, line] = await status_and_lines(store, slack, tid)
    assert "Cancelled" in all_text(status) and cancel_button(status) is None
    assert "Cancelled" in all_text(card) and "not today" in all_text(line)
    assert len(slack.calls_to("chat.postMessage")) == 3  # the status message once, card, line
    assert await lines_delivery(store, client_for(slack), owner="proc-c").deliver(tid) == 0


def test_the_pure_modules_do_no_io():
    code = (
        "import json, sys\nimport bot.outbox, bot.plan_outbox, bot.limits\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    roots = {name.partition(".")[0] for name in json.loads(out.stdout)}
    assert not roots & {"slack_sdk", "slack_bolt", "aiohttp", "sqlalchemy", "asyncpg"}


# --- crashes and lost answers ---------------------------------------------------------


@pytest.mark.parametrize("later", ["same process", "new process"])
async def test_a_post_whose_answer_was_lost_is_found_in_slack_not_posted_again(store, slack, later):
    tid = await start(store, slack, LOOKUP)
    gate = slack.hold("chat.postMessage")  # Slack posts, its answer never arrives
    first = lines_delivery(store, client_for(slack, timeout=1), owner="proc-a", retry_base=None)
    assert await first.deliver(tid) == 0
    assert len(slack.posted(CHANNEL)) == 1
    assert await receipts(store, tid) == []
    gate.set()
    again = (
        first if later == "same process" else lines_delivery(store, client_for(slack), owner="p-b")
    )
    assert await again.deliver(tid) == 3  # the three lines; the status message is found
    status, posts = await status_and_lines(store, slack, tid)
    assert len(slack.calls_to("chat.postMessage")) == 4 and len(posts) == 3
    got = await receipts(store, tid)
    # Its metadata names the last event whose state it shows: that receipt is recovered
    # too, so it is not updated for nothing.
    last = (await store.select_events(tid))[-len(got) - 1]
    assert last.type == "final_answer"
    assert [(r.shows_event_id, r.ts) for r in got] == [
        (shown(status, tid), status["ts"]),
        (last.event_id, status["ts"]),
        *((shown(m, tid), m["ts"]) for m in posts),
    ]
    assert slack.calls_to("chat.update") == []


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
    [posted] = slack.posted(CHANNEL)  # the status message
    restarted = lines_delivery(store, client_for(slack), owner="proc-b", retry_base=None)
    assert await restarted.deliver(tid) == 3
    assert len(slack.calls_to("chat.postMessage")) == 4
    assert (await receipts(store, tid))[0].ts == posted["ts"]
    status, _ = await status_and_lines(store, slack, tid)
    assert status["ts"] == posted["ts"]


async def test_show_hands_the_receipts_to_the_runner_and_appends_nothing(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    before = await store.select_events(tid)
    assert await store.acquire_lease(tid, "runner", 30)  # the runner holds the thread
    handed = await delivery.show(tid, before, reduce(before))
    assert await store.select_events(tid) == before  # one writer: the runner
    posts = slack.posted(CHANNEL)
    assert len(posts) == 4 == len({r.ts for r in handed})
    assert {r.shows_event_id for r in handed} >= {shown(m, tid) for m in posts}
    assert (await store.get_thread(tid)).lease_owner == "runner"  # left alone
    await store.append(tid, before[-1].seq, handed)  # the runner's next batch
    await store.release_lease(tid, "runner")
    assert await delivery.deliver(tid) == 0
    assert len(slack.calls_to("chat.postMessage")) == 4


async def test_showing_for_the_runner_reads_the_thread_row_once_and_the_log_never(
    store, slack, delivery, monkeypatch
):
    """Issue 20 §3: the runner hands the delivery the log and state it holds at each tool
    call; the thread's place in Slack is read once per process."""
    root = slack.add_message(CHANNEL, "find them", user=REQUESTER)
    key = ThreadKey(TEAM_ID, CHANNEL, root["ts"])
    tid = (await post_user_message(store, key, text="find them", user=REQUESTER)).thread_id
    reads: Counter[str] = Counter()

    def counted(name: str) -> Any:
        read = getattr(store, name)

        async def spy(*args: Any, **kw: Any) -> Any:
            reads[name] += 1
            return await read(*args, **kw)

        return spy

    for name in ("select_events", "get_thread"):
        monkeypatch.setattr(store, name, counted(name))
    script = [call("lookup", name=n) for n in ("db", "api", "web")] + [say("found")]
    tools = make_tools(Counter())
    run = Runner(store, ScriptedModel(script), tools, owner="runner", front_door=delivery)
    assert (await run.run(tid)).status == "idle"
    assert reads == Counter({"get_thread": 1})  # three tool calls shown
    monkeypatch.undo()
    _, lines = await status_and_lines(store, slack, tid)
    assert len(lines) == 5  # each call and the first two results, before the next call
    assert len(await receipts(store, tid)) == 1 + 1 + 5  # the status message's two


async def test_a_compacted_threads_tail_is_shown_from_the_whole_log(store, slack, delivery):
    """A compacted thread's runner holds only the tail its prompt needs: the delivery
    reads the whole log then, and shows the same as for the whole log."""
    tid = await start(store, slack, LOOKUP)
    events = await store.select_events(tid)
    assert await store.acquire_lease(tid, "runner", 30)
    handed = await delivery.show(tid, events[3:], reduce(events))
    posts = slack.posted(CHANNEL)
    assert len(posts) == 4 == len({r.ts for r in handed})  # the status message first
    assert shown(posts[0], tid) == events[0].event_id


async def test_receipts_a_runner_died_holding_are_found_in_slack_not_posted_again(
    store, slack, delivery
):
    tid = await start(store, slack, LOOKUP)
    assert await store.acquire_lease(tid, "runner", 30)
    events = await store.select_events(tid)
    handed = await delivery.show(tid, events, reduce(events))
    await store.release_lease(tid, "runner")  # gone before appending them
    assert not await receipts(store, tid)
    looked = len(slack.calls_to("conversations.replies"))
    assert await delivery.deliver(tid) == 0  # found in Slack: no second post
    assert len(slack.calls_to("conversations.replies")) == looked + 1
    assert len(slack.calls_to("chat.postMessage")) == 4
    got = {(r.shows_event_id, r.ts) for r in await receipts(store, tid)}
    assert got == {(r.shows_event_id, r.ts) for r in handed}


async def test_deliver_recent_finishes_threads_updated_since(store, slack, delivery):
    old = await start(store, slack, LOOKUP, text="old")
    since = utcnow()
    await asyncio.sleep(0.01)
    new = await start(store, slack, [say("new answer")], text="new")
    await delivery.deliver_recent(since)
    assert [shown(m, new) is not None for m in slack.posted(CHANNEL)] == [True, True]
    await delivery.deliver_recent(since.replace(year=since.year - 1))
    old_status, old_lines = await status_and_lines(store, slack, old)
    new_status, new_lines = await status_and_lines(store, slack, new)
    assert len(old_lines) == 3 and len(new_lines) == 1
    assert len(await line_receipts(store, old, old_status)) == 3
    assert len(await line_receipts(store, new, new_status)) == 1


# --- Slack errors ---------------------------------------------------------------------


async def test_a_429_is_waited_out_and_retried(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    slack.rate_limit("chat.postMessage", times=1, retry_after=1)
    began = time.monotonic()
    assert await delivery.deliver(tid) == 4
    assert time.monotonic() - began >= 1
    assert len(slack.calls_to("chat.postMessage")) == 5  # the 429, then four posts
    assert len(slack.posted(CHANNEL)) == 4


async def test_a_429_longer_than_the_inline_wait_stops_for_now(store, slack, delivery):
    tid = await start(store, slack, LOOKUP)
    slack.rate_limit("chat.postMessage", times=1, retry_after=60)
    began = time.monotonic()
    assert await delivery.deliver(tid) == 0
    assert time.monotonic() - began < 5
    assert slack.posted(CHANNEL) == [] and await receipts(store, tid) == []
    assert await delivery.deliver(tid) == 4


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
    assert await delivery.deliver(tid) == 4
    assert len(slack.posted(CHANNEL)) == 4


async def test_a_stopped_pass_is_retried_in_process(store, slack):
    tid = await start(store, slack, LOOKUP)
    d = lines_delivery(store, client_for(slack), owner="proc-a", retry_base=0.05)
    slack.fail("chat.postMessage", "internal_error")
    try:
        assert await d.deliver(tid) == 0
        await slack.wait_for("chat.postMessage", 5)  # the failed one, then four
        await asyncio.gather(*d._tasks)  # the retry's receipts
        status, _ = await status_and_lines(store, slack, tid)
        assert len(await line_receipts(store, tid, status)) == 3
    finally:
        await d.close()
    assert len(slack.posted(CHANNEL)) == 4


async def test_posts_are_not_resent_by_the_sdk_after_a_connection_error(store, slack):
    client = client_for(slack)
    d = lines_delivery(store, client, owner="proc-a")
    handlers = d._post_client.retry_handlers
    assert not [h for h in handlers if isinstance(h, AsyncConnectionErrorRetryHandler)]
    assert [h for h in client.retry_handlers if isinstance(h, AsyncConnectionErrorRetryHandler)]


# --- pending_deliveries, pure ---------------------------------------------------------


def kinds(items: list[Outbound]) -> list[tuple[str, str]]:
    """(kind, the event type), or (kind, "status") for the status message."""
    return [(i.kind, "status" if i.status else i.event.type) for i in items]


def receipt(event: ev.Event, ts: str) -> ev.MessagePosted:
    return receipt_of(event.event_id, ts)


def receipt_of(event_id: str, ts: str) -> ev.MessagePosted:
    return ev.MessagePosted(shows_event_id=event_id, channel="C1", ts=ts)


def test_pending_deliveries_of_a_whole_thread_in_log_order():
    log = logs.stamp(logs.happy_path())
    assert kinds(pending_deliveries(log)) == [
        ("post", "status"),
        ("post", "tool_call_requested"), ("post", "tool_result"),
        ("post", "approval_requested"), ("update", "approval_granted"),
        ("post", "tool_result"), ("post", "final_answer"),
    ]  # fmt: skip
    items = pending_deliveries(log)
    assert items[5].call is not None and items[5].call.intent == "deploy"  # names the tool
    assert items[4].card_ts == ""  # the card is not posted yet


def test_the_status_message_is_posted_first_for_the_first_user_message_showing_now():
    log = logs.stamp([*logs.happy_path(), logs.user("and again")])
    [status, *_] = pending_deliveries(log, reviewers=ReviewerRule(frozenset({logs.REVIEWER})))
    assert status.kind == "post" and status.event is log[0]
    assert status.status is not None and status.status.anchor == log[0].event_id
    assert status.status.upto == log[-1].event_id  # it shows the state after the last event
    assert status.status.state == reduce(log)
    assert render(status) == status_message(reduce(log), logs.THREAD_ID)


def test_receipts_take_events_off_and_give_the_card_its_ts():
    log = logs.stamp(logs.happy_path())
    first4 = [i.event for i in pending_deliveries(log)[:4]]
    log = logs.stamp([*log, *(receipt(e, f"1.{n}") for n, e in enumerate(first4))])
    todo = pending_deliveries(log)
    assert kinds(todo) == [
        ("update", "approval_granted"), ("post", "tool_result"), ("post", "final_answer"),
        ("update", "status"),
    ]  # fmt: skip
    assert todo[0].card_ts == "1.3" and todo[0].requester == logs.REQUESTER
    assert "Approved by" in json.dumps(render(todo[0]))
    # The status message's receipt names the first message: it shows that state, not now.
    assert todo[-1].card_ts == "1.0" and todo[-1].event is log[len(logs.happy_path()) - 1]
    assert "Done" in json.dumps(render(todo[-1]))


def test_the_status_message_is_updated_when_what_it_shows_differs_from_the_log():
    log = logs.stamp([logs.user(), *logs.approval_pending()])
    [status, card] = pending_deliveries(log)
    assert status.status is not None and status.status.state.status == "awaiting_approval"
    posted = logs.stamp([*log, receipt(log[0], "1.0"), receipt(log[-1], "1.0")])
    posted = logs.stamp([*posted, receipt(card.event, "2.0")])
    assert pending_deliveries(posted) == []  # it shows the state after the last event
    grant = ev.ApprovalGranted(actor=logs.REVIEWER, tool_call_id=card.event.tool_call_id)
    granted = logs.stamp([*posted, grant])
    todo = pending_deliveries(granted)
    assert kinds(todo) == [("update", "approval_granted"), ("update", "status")]
    assert todo[-1].card_ts == "1.0" and todo[-1].event is granted[-1]
    assert todo[0].card_ts == "2.0"
    # Its receipt (the granted event, with the status message's ts) takes it off, and
    # does not count as the card's update.
    shown_now = logs.stamp([*granted, receipt(granted[-1], "1.0")])
    assert kinds(pending_deliveries(shown_now)) == [("update", "approval_granted")]


def test_a_cancel_updates_the_open_card_and_posts_its_line_each_once():
    log = logs.stamp([logs.user(), *logs.approval_pending(), ev.ThreadCancelled(actor="U0X")])
    card, cancelled = log[3], log[4]
    with_card = [*log, receipt(log[0], "4.0"), receipt(card, "5.0")]
    assert kinds(pending_deliveries(logs.stamp(with_card))) == [
        ("update", "thread_cancelled"), ("post", "thread_cancelled"), ("update", "status"),
    ]  # fmt: skip
    updated = logs.stamp([*with_card, receipt(cancelled, "5.0"), receipt(cancelled, "4.0")])
    assert kinds(pending_deliveries(updated)) == [("post", "thread_cancelled")]
    lined = logs.stamp([*with_card, receipt(cancelled, "6.0"), receipt(cancelled, "4.0")])
    assert kinds(pending_deliveries(lined)) == [("update", "thread_cancelled")]


def test_events_people_need_not_see_are_never_pending():
    refused = ev.ApprovalRefused(
        actor=logs.REQUESTER, tool_call_id="toolu_2", decision="approve", reason="self"
    )
    log = logs.stamp([logs.user(), *logs.approval_pending(), refused])
    assert kinds(pending_deliveries(log)) == [("post", "status"), ("post", "approval_requested")]


def test_a_message_while_the_card_is_open_updates_the_card_once_with_all_of_them():
    """Issue 8 item 7 (pure half): a reply to a pending card is shown on the card, not
    silently queued; several undelivered replies make one update showing the latest."""
    log = logs.stamp([logs.user(), *logs.approval_pending()])
    card = log[-1]
    posted = [*log, receipt(log[0], "1.0"), receipt(card, "1.0"), receipt(card, "2.0")]
    assert pending_deliveries(logs.stamp(posted)) == []
    first = logs.user("actually, deploy version 2.0.0 to production")
    second = logs.user("to production, I mean", actor=logs.REVIEWER)
    wrote = logs.stamp([*posted, first, second])
    [update] = pending_deliveries(wrote)
    assert (update.kind, update.event, update.card_ts) == ("update", wrote[-1], "2.0")
    assert update.card is not None and update.card.event_id == card.event_id
    assert [n.text for n in update.notes.latest] == [first.text, second.text]
    assert update.notes.count == 2
    text = json.dumps(render(update))
    assert "2 messages since this was posted" in text and "to production, I mean" in text
    assert APPROVE_ACTION in text  # still the open card, buttons and all
    done = logs.stamp([*wrote, receipt(wrote[-1], "2.0")])
    assert pending_deliveries(done) == []
    # Decided later: the decided card keeps the note (the audit shows what was known).
    grant = ev.ApprovalGranted(actor=logs.REVIEWER, tool_call_id=card.tool_call_id)
    granted = logs.stamp([*done, grant])
    [decided, _status] = pending_deliveries(granted)
    assert decided.event.type == "approval_granted" and decided.notes.count == 2
    assert "to production, I mean" in json.dumps(render(decided))


def test_a_message_not_yet_shown_on_the_card_is_shown_by_its_decided_form():
    log = logs.stamp([logs.user(), *logs.approval_pending()])
    card = log[-1]
    posted = [*log, receipt(log[0], "1.0"), receipt(card, "1.0"), receipt(card, "2.0")]
    grant = ev.ApprovalGranted(actor=logs.REVIEWER, tool_call_id=card.tool_call_id)
    late = logs.stamp([*posted, logs.user("wait, not staging"), grant])
    todo = pending_deliveries(late)
    assert kinds(todo) == [("update", "approval_granted"), ("update", "status")]
    assert "wait, not staging" in json.dumps(render(todo[0]))


@pytest.mark.parametrize("seed", range(40))
def test_delivering_random_logs_shows_each_thing_once_and_ends(seed):
    log = logs.stamp(logs.random_log(seed, 60))
    first = next((e for e in log if e.type == "user_message"), None)
    # The simulator's noise may have posted the status message already.
    posted = first is not None and any(
        getattr(e, "shows_event_id", "") == first.event_id for e in log
    )
    done: list[tuple[str, str, bool]] = []
    for n in range(200):
        todo = pending_deliveries(log)
        if not todo:
            break
        item = todo[0]
        assert item.kind == "post" or item.card_ts, "a card is updated only once posted"
        assert render(item), f"{item.event.type} renders nothing"
        assert [i for i in todo if i.status and i.kind == "post"] in ([], [item]), "first"
        done.append((item.kind, item.event.event_id, item.status is not None))
        ts = item.card_ts if item.kind == "update" else f"9{n}.0"
        shows = [item.event.event_id, *([item.status.upto] if item.status else [])]
        log = logs.stamp([*log, *(receipt_of(i, ts) for i in dict.fromkeys(shows))])
    assert pending_deliveries(log) == []
    assert len(done) == len(set(done))
    assert [kind for kind, _, status in done if status][:1] in (
        [],
        ["update" if posted else "post"],
    )


def test_a_vote_short_of_the_quorum_updates_the_open_card_then_the_last_closes_it():
    cid = "toolu_q"
    log = logs.stamp(
        [
            logs.user(),
            logs.decided(cid, "restart", service="api"),
            logs.requested(cid, "restart", service="api"),  # 2 of reviewer and other
            logs.approval_asked(cid, "restart", service="api"),
        ]
    )
    log = logs.stamp([*log, receipt(log[0], "1.0"), receipt(log[3], "1.1")])
    log = logs.stamp([*log, ev.ApprovalGranted(actor=logs.REVIEWER, tool_call_id=cid)])
    [vote, *_] = pending_deliveries(log)
    assert (vote.kind, vote.event.type, vote.card_ts, vote.still_open) == (
        "update",
        "approval_granted",
        "1.1",
        True,
    )
    shown = json.dumps(render(vote))
    assert f"1 of 2: <@{logs.REVIEWER}>" in shown and APPROVE_ACTION in shown
    log = logs.stamp([*log, receipt(log[-1], "1.1")])
    log = logs.stamp([*log, ev.ApprovalGranted(actor=logs.OTHER, tool_call_id=cid)])
    [closed, *_] = pending_deliveries(log)
    assert (closed.kind, closed.still_open, closed.votes.by) == (
        "update",
        False,
        (logs.REVIEWER, logs.OTHER),
    )
    assert f"Approved by <@{logs.REVIEWER}> and <@{logs.OTHER}>" in json.dumps(render(closed))


def test_an_unknown_outcome_posts_the_reconcile_card_and_its_decision_updates_it():
    cid = "toolu_r"
    log = logs.stamp(
        [
            logs.user(),
            logs.decided(cid, "restart", service="api"),
            logs.requested(cid, "restart", policy="run_now", service="api"),
            logs.started(cid),
            logs.outcome_unknown(cid),
        ]
    )
    todo = pending_deliveries(log)
    assert kinds(todo) == [
        ("post", "status"), ("post", "tool_call_requested"), ("post", "tool_outcome_unknown"),
    ]  # fmt: skip
    assert RETRY_ACTION in json.dumps(render(todo[2]))
    log = logs.stamp([*log, *(receipt(i.event, f"1.{n}") for n, i in enumerate(todo))])
    log = logs.stamp([*log, logs.reconciled(cid, "happened", note="done by hand")])
    [update, *_] = pending_deliveries(log)
    assert (update.kind, update.card_ts, update.card) == ("update", "1.2", log[4])
    shown = json.dumps(render(update))
    assert "said it happened" in shown and "done by hand" in shown
    assert RETRY_ACTION not in shown


def test_every_type_people_see_on_a_card_posts_closes_or_settles_one() -> None:
    on_cards = [c for c in ev.EVENT_CLASSES if c.facts.people == "card"]
    handled = set(outbox.SHOWS)  # the table, keyed by event class as the reducer's
    assert ev.missing_from(handled, on_cards) == []
    # Only a cancellation closes cards without being shown on one (it has its own line).
    closing = set(outbox.OUTCOMES)
    assert {ev.type_name(c) for c in closing - set(on_cards)} == {"thread_cancelled"}
    # The other entries: the call a card is for, a message shown on the open card, and
    # the alert that opened a thread (its root post, not a line).
    others = {ev.type_name(c) for c in handled - set(on_cards) - closing}
    assert others == {"tool_call_requested", "user_message", "alert_received"}
