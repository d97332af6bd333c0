"""Issue 17 §3, in Slack: a rule's reminder is one reply in the thread mentioning the
approvers and linking the card; its expiry updates the card and, with ``escalate_to``,
is posted in the rule's channel or in the thread mentioning its people. Both timers are
events: a runner and a delivery started again across them (as after a restart) remind
once and post once. Against the fake Slack, with a fake clock, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.limits import check_limits
from bot.outbox import shown_event
from bot.render.approval import APPROVE_ACTION
from engine import events as ev
from engine.config_file import PolicyRule
from engine.events import utcnow
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.bot.test_cli import _free_port, fakes_in_a_thread
from tests.bot.test_serve_crash import (
    _send,
    _wait_healthy,
    _wait_shown,
    serve,
    shown_event_ids,
)
from tests.fakes.slack import (
    BOT_USER_ID,
    TEAM_DOMAIN,
    TEAM_ID,
    TOKEN,
    FakeSlack,
    app_mention_event,
)
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

CHANNEL = "C0OPS00001"
ESCALATION = "C0ESCALATE1"
REQUESTER, BOB, CAROL = "U0REQUEST", "U0BOB0001", "U0CAROL01"
SRE = "S0SRE0001"
SCRIPT = [call("deploy", name="api"), say("Nobody approved; nothing was deployed.")]


def policy(**keys: Any) -> PolicySet:
    rule = {"approvers": [BOB, SRE], "expires_in": "2h", "remind_after": "30m", **keys}
    return PolicySet(
        rules=(PolicyRule(tool="deploy", policy="approve_before_run", **rule),),
        policy_hash="f" * 64,
    )


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


class Thread:
    """One thread whose deploy awaits approval, run and shown by a "process" (a runner
    and a delivery) that can be replaced by a new one, as a restart does."""

    def __init__(self, store: Store, slack: FakeSlack, rules: PolicySet) -> None:
        self.store, self.slack, self.rules = store, slack, rules
        self.clock = FakeClock(utcnow())
        self.effects: Counter = Counter()
        self.tid = ""
        self.root = ""
        self._types: dict[str, str] = {}
        self.restart()

    def restart(self, **client: Any) -> None:
        """A new process: a runner and a delivery that remember nothing."""
        self.runner = Runner(
            self.store,
            ScriptedModel(SCRIPT),
            make_tools(self.effects),
            policy=self.rules,
            clock=self.clock,
        )
        self.delivery = Delivery(
            self.store,
            AsyncWebClient(token=TOKEN, base_url=self.slack.url, **client),
            owner=f"proc-{len(self.slack.calls)}",
            retry_base=None,
            clock=self.clock,
        )

    async def start(self) -> dict[str, Any]:
        """The request, the run up to the card, the card in Slack: the card message."""
        self.root = self.slack.add_message(CHANNEL, "deploy api", user=REQUESTER)["ts"]
        key = ThreadKey(TEAM_ID, CHANNEL, self.root)
        posted = await post_user_message(self.store, key, text="deploy api", user=REQUESTER)
        self.tid = posted.thread_id
        assert (await self.runner.run(self.tid)).status == "awaiting_approval"
        await self.delivery.deliver(self.tid)
        [card] = await self.shown("approval_requested")
        return card

    async def at(self, minutes: float) -> None:
        """The clock moves on; the scheduler's wake-up runs the thread, then shows it."""
        self.clock.advance(minutes * 60)
        await self.runner.run(self.tid)
        await self.delivery.deliver(self.tid)

    def posts(self, channel: str = CHANNEL) -> list[dict[str, Any]]:
        return [m for m in self.slack.posted(channel) if shown_event(m, self.tid)]

    async def shown(self, type_: str, channel: str = CHANNEL) -> list[dict[str, Any]]:
        """The bot's messages in ``channel`` whose metadata names an event of ``type_``."""
        types = {e.event_id: e.type for e in await self.store.select_events(self.tid)}
        return [
            m for m in self.posts(channel) if types.get(shown_event(m, self.tid) or "") == type_
        ]

    async def types(self) -> list[str]:
        return [e.type for e in await self.store.select_events(self.tid)]

    def card_updates(self, card: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            c.params for c in self.slack.calls_to("chat.update") if c.params["ts"] == card["ts"]
        ]

    async def close(self) -> None:
        await self.delivery.close()


@pytest.fixture
async def thread(store: Store, slack: FakeSlack) -> AsyncIterator[Thread]:
    t = Thread(store, slack, policy())
    yield t
    await t.close()


def text_of(message: dict[str, Any]) -> str:
    return message.get("text", "") + json.dumps(message.get("blocks", []))


def permalink(card: dict[str, Any], root: str) -> str:
    """The card's link as Slack gives it for a reply: it opens the thread."""
    ts = card["ts"].replace(".", "")
    return (
        f"https://{TEAM_DOMAIN}.slack.com/archives/{CHANNEL}/p{ts}?thread_ts={root}&cid={CHANNEL}"
    )


async def reminders(t: Thread) -> list[dict[str, Any]]:
    return await t.shown("approval_reminded")


async def escalations(t: Thread, channel: str = CHANNEL) -> list[dict[str, Any]]:
    return await t.shown("approval_expired", channel)


# --- the reminder ---------------------------------------------------------------------------


async def test_the_reminder_is_one_reply_mentioning_the_approvers_with_the_cards_link(thread):
    card = await thread.start()
    await thread.at(29)
    assert await reminders(thread) == []
    await thread.at(1)
    [reply] = await reminders(thread)
    assert reply["thread_ts"] == thread.root  # in the thread, under the card
    text = text_of(reply)
    assert f"<@{BOB}>" in text and f"<!subteam^{SRE}>" in text
    assert f"<@{REQUESTER}>" not in text  # only the approvers are pinged
    assert permalink(card, thread.root) in text
    assert check_limits(reply["blocks"]) == []
    # The card says so, in place, and still has its buttons.
    [update] = thread.card_updates(card)
    assert "Reminded" in json.dumps(update["blocks"])
    assert APPROVE_ACTION in json.dumps(update["blocks"])
    assert update["metadata"] == card["metadata"]
    await thread.at(30)  # nothing new until the expiry
    assert len(await reminders(thread)) == 1
    assert (await thread.types()).count("approval_reminded") == 1


async def test_a_rule_without_approvers_reminds_that_the_card_waits_mentioning_nobody(store, slack):
    t = Thread(store, slack, policy(approvers=[]))
    try:
        await t.start()
        await t.at(30)
        [reply] = await reminders(t)
        assert "<@" not in text_of(reply) and "<!subteam" not in text_of(reply)
        waits = "still waiting for an approval: anyone but the requester may approve it"
        assert waits in text_of(reply)
    finally:
        await t.close()


async def test_a_decision_before_the_reminder_leaves_no_reminder(thread):
    await thread.start()
    state = await thread.store.load(thread.tid)
    await decide_approval(
        thread.store, thread.tid, tool_call_id=state.pending.tool_call_id, decider=Decider(BOB),
        decision="approve", reviewers=ReviewerRule(),
    )  # fmt: skip
    await thread.at(0)  # the worker's run after the click: the call runs
    await thread.at(120)
    types = await thread.types()
    assert "approval_reminded" not in types and "approval_expired" not in types
    assert thread.effects["deploy"] == 1 and await reminders(thread) == []


# --- the expiry -----------------------------------------------------------------------------


async def test_an_expiry_is_posted_in_the_rules_channel(store, slack):
    t = Thread(store, slack, policy(escalate_to=[CAROL, ESCALATION, "oncall:P0NCALL1"]))
    try:
        card = await t.start()
        await t.at(30)
        await t.at(90)
        assert (await store.load(t.tid)).status == "idle"
        assert t.effects["deploy"] == 0  # expiry never approves
        [post] = await escalations(t, ESCALATION)
        assert "thread_ts" not in post  # at the top of the channel
        text = text_of(post)
        assert f"<@{CAROL}>" in text and f"<@{REQUESTER}>" in text  # who is told, who asked
        assert "an approval expired" in text and "deploy" in text and "name=api" in text
        assert permalink(card, t.root) in text
        assert "whoever is on call (P0NCALL1)" in text and "reaches nobody" in text
        assert check_limits(post["blocks"]) == []
        assert await escalations(t) == []  # not in the thread too
        closed = t.card_updates(card)[-1]
        assert "Approval expired: Deploy" in json.dumps(closed["blocks"])
        assert APPROVE_ACTION not in json.dumps(closed["blocks"])
        receipts = [e for e in await store.select_events(t.tid) if isinstance(e, ev.MessagePosted)]
        assert (ESCALATION, post["ts"]) in {(r.channel, r.ts) for r in receipts}
    finally:
        await t.close()


async def test_an_expiry_escalated_to_people_is_posted_in_the_thread_mentioning_them(store, slack):
    t = Thread(store, slack, policy(escalate_to=[CAROL, SRE]))
    try:
        await t.start()
        await t.at(120)
        [post] = await escalations(t)
        assert post["thread_ts"] == t.root
        assert f"<@{CAROL}>" in text_of(post) and f"<!subteam^{SRE}>" in text_of(post)
    finally:
        await t.close()


async def test_an_expiry_without_escalate_to_only_updates_the_card(thread):
    await thread.start()
    await thread.at(120)
    assert "approval_expired" in await thread.types()
    assert await escalations(thread) == []
    assert await escalations(thread, ESCALATION) == []


async def test_a_channel_that_refuses_the_post_gets_it_in_the_thread_instead(store, slack):
    t = Thread(store, slack, policy(escalate_to=[ESCALATION]))
    try:
        await t.start()
        await t.at(30)
        slack.fail("chat.postMessage", "not_in_channel")  # the next post: the escalation's
        await t.at(90)
        assert await escalations(t, ESCALATION) == []
        [post] = await escalations(t)
        assert post["thread_ts"] == t.root
        assert "Slack refused this post in" in text_of(post) and "not_in_channel" in text_of(post)
        # Nothing was left behind: the answer that followed was shown too (in the plan
        # message of the run the expiry began, the thread's last message).
        assert "Nobody approved; nothing was deployed." in text_of(slack.posted(CHANNEL)[-1])
    finally:
        await t.close()


# --- restarts -------------------------------------------------------------------------------


async def test_a_restart_across_the_reminder_and_the_expiry_posts_each_once(store, slack):
    """Each timer fires in one process whose Slack answer is lost (the post landed, its
    receipt never made it): the next process neither reminds nor posts again."""
    t = Thread(store, slack, policy(escalate_to=[ESCALATION]))
    try:
        card = await t.start()
        for minutes in (30, 90):
            gate = slack.hold("chat.postMessage")  # Slack posts; its answer never arrives
            gate.clear()  # held again, the second time
            await t.close()
            t.restart(timeout=1)
            await t.at(minutes)
            gate.set()
            await t.close()
            t.restart()  # a new process, at the same time
            await t.at(0)
            await t.delivery.deliver(t.tid)
        types = await t.types()
        assert types.count("approval_reminded") == 1 and types.count("approval_expired") == 1
        assert len(await reminders(t)) == 1
        assert len(await escalations(t, ESCALATION)) == 1
        assert await escalations(t) == []
        assert t.effects["deploy"] == 0
        assert card["ts"] in {c.params["ts"] for c in slack.calls_to("chat.update")}
    finally:
        await t.close()


# --- a real restart -------------------------------------------------------------------------

SERVED_RULE = """\
policy:
  - tool: create_ticket
    policy: approve_before_run
    approvers: [U0BOB0001]
    expires_in: 20s
    remind_after: 1s
    escalate_to: [U0LEAD001, C0ESCALATE1]
"""


@pytest.mark.slow
def test_serve_killed_after_posting_the_reminder_reminds_and_escalates_once(tmp_path) -> None:
    """`opsloop serve` SIGKILLed right after Slack took the reminder, before its receipt:
    the next process finds it (no second reminder, no second post), then escalates the
    expiry to the rule's channel, once."""
    db = f"sqlite:///{tmp_path / 'serve.db'}"
    config = tmp_path / "opsloop.yaml"
    config.write_text(SERVED_RULE)
    extra = {"OPSLOOP_CONFIG": str(config), "OPSLOOP_TICKETS_URL": f"sqlite:///{tmp_path}/t.db"}
    channel, root = "C0DEPLOYS", "1700000600.000100"
    with fakes_in_a_thread() as (claude, slack):
        claude.tool_use("create_ticket", {"title": "Flaky deploys"}, text="Filing it.")
        claude.text("Nobody approved; no ticket was filed.")
        text = f"<@{BOT_USER_ID}> file a ticket"
        slack.add_message(channel, text, user=REQUESTER, ts=root)
        port = _free_port()
        # Posts: the status message, the card, then the reminder: killed right after it.
        first = serve(db, claude.url, slack.url, "slack_posted:3", port=port, **extra)
        try:
            _wait_healthy(first, port)
            mention = app_mention_event(user=REQUESTER, text=text, channel=channel, ts=root)
            assert _send(port, mention) == 200
            first.communicate(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        [*_, last] = slack.calls_to("chat.postMessage")
        assert "still waiting for your approval" in str(last.params)  # in Slack, not our log

        port = _free_port()
        second = serve(db, claude.url, slack.url, None, port=port, **extra)
        try:
            _wait_healthy(second, port)
            _wait_shown(slack, second, "no ticket was filed")
            second.send_signal(signal.SIGTERM)
            second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        claude.assert_clean()
    counts = shown_event_ids(slack)
    assert counts and set(counts.values()) == {1}, counts  # every event posted once
    posts = slack.calls_to("chat.postMessage")
    assert sum("still waiting for your approval" in str(c.params) for c in posts) == 1
    [escalation] = [c for c in posts if "an approval expired" in str(c.params)]
    assert escalation.params["channel"] == "C0ESCALATE1"
    assert "<@U0LEAD001>" in str(escalation.params)
