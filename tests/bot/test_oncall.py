"""``oncall:<id>`` approvers: whoever PagerDuty has on call, as Slack users, on the card
when it is posted and again at each click (signed Slack requests through the Bolt app,
a fake PagerDuty and a fake Slack at the wire)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import SecretStr
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.oncall import OnCall
from bot.render.approval import APPROVE_ACTION
from bot.reviewers import Reviewers
from engine import events as ev
from engine.store import Store
from tests.bot.test_app import (
    ANN,
    CHANNEL,
    awaiting_approval,
    button,
    cards_in,
    ephemeral_texts,
    served,
    types_of,
)
from tests.fakes.pagerduty import FROM_EMAIL, TOKEN, FakePagerDuty
from tests.fakes.slack import TOKEN as SLACK_TOKEN
from tests.fakes.slack import FakeSlack
from tools.integrations.config import PagerDutyConfig
from tools.integrations.pagerduty_client import PagerDutyClient

ALICE = "U0ALICE001"  # on call first
BOB = "U0BOB00001"  # takes over
EVE = "U0EVE00001"  # never on call
SCHEDULE = "PSCHED01"
ON_CALL = f"oncall:{SCHEDULE}"


class Clock:
    """The on-call cache's clock, moved by the test (no sleeping past the TTL)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        for user, name in ((ALICE, "alice"), (BOB, "bob"), (EVE, "eve")):
            s.add_user(user, name)["profile"]["email"] = f"{name}@acme.example"
        yield s


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as fake:
        fake.add_user("PALICE1", "Alice", "alice@acme.example")
        fake.add_user("PBOB0001", "Bob", "bob@acme.example")
        fake.add_user("PBOT0001", "Ops bot", FROM_EMAIL)
        fake.put_on_call(["PALICE1"], schedule=SCHEDULE)
        yield fake


MakeOnCall = Callable[..., OnCall]


@pytest.fixture
async def on_call(pd: FakePagerDuty, slack: FakeSlack) -> AsyncIterator[MakeOnCall]:
    """``on_call(clock=None)``: who is on call, from the fake PagerDuty and Slack; as a
    process has one per loop, a test makes one per side (the cards', the clicks')."""
    opened: list[PagerDutyClient] = []

    def make(clock: Clock | None = None) -> OnCall:
        config = PagerDutyConfig(token=SecretStr(TOKEN), api_url=pd.url, from_email=FROM_EMAIL)
        opened.append(PagerDutyClient(config))
        slack_client = AsyncWebClient(token=SLACK_TOKEN, base_url=slack.url)
        return OnCall(opened[-1], slack_client, clock=clock or Clock())

    yield make
    for client in opened:
        await client.close()


def reviewers(slack: FakeSlack, found: OnCall | None) -> Reviewers:
    return Reviewers(AsyncWebClient(token=SLACK_TOKEN, base_url=slack.url), on_call=found)


async def card_thread(store: Store, slack: FakeSlack, *approvers: str) -> tuple[str, str]:
    root = slack.add_message(CHANNEL, "deploy api to staging", user=ANN)["ts"]
    return await awaiting_approval(store, root=root, approvers=approvers or (ON_CALL,))


def text_of(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"], ensure_ascii=False)


async def test_an_on_call_hand_over_between_the_card_and_the_click_is_honoured(
    store: Store, slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    thread_id, value = await card_thread(store, slack)
    client = AsyncWebClient(token=SLACK_TOKEN, base_url=slack.url)
    delivery = Delivery(store, client, owner="proc-a", retry_base=None, on_call=on_call())
    await delivery.deliver(thread_id)
    [card] = cards_in(slack)
    assert f"📟 On call now: {SCHEDULE}: <@{ALICE}>" in text_of(card)  # who, as posted
    clock = Clock()
    async with served(store, slack, groups=reviewers(slack, on_call(clock))) as s:
        await s.send(button(EVE, APPROVE_ACTION, value, action_ts="1700000100.1"))
        await slack.wait_for("chat.postEphemeral")
        pd.put_on_call(["PBOB0001"], schedule=SCHEDULE)  # Alice hands over to Bob
        clock.now += 61  # past the cache's minute
        await s.send(button(ALICE, APPROVE_ACTION, value, action_ts="1700000100.2"))
        await slack.wait_for("chat.postEphemeral", 2)
        await s.send(button(BOB, APPROVE_ACTION, value, action_ts="1700000100.3"))
        await s.settle()
    assert (await types_of(store, thread_id))[-3:] == [
        "approval_refused",
        "approval_refused",
        "approval_granted",
    ]
    granted = (await store.select_events(thread_id))[-1]
    assert isinstance(granted, ev.ApprovalGranted) and granted.actor == BOB
    assert ephemeral_texts(slack, ALICE) == [
        "Nothing changed: you are not on the approvers list, nor on call for it now."
    ]
    # Two listings (schedule, escalation policy) per lookup: the card's, Eve's click's,
    # Alice's after the minute; Bob's click, within the next minute, used the cache.
    assert len(pd.calls_to("GET", "/oncalls")) == 2 + 2 + 2


async def test_the_on_call_is_cached_for_a_burst_of_clicks(
    store: Store, slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    thread_id, value = await card_thread(store, slack)
    async with served(store, slack, groups=reviewers(slack, on_call())) as s:
        await s.send(button(EVE, APPROVE_ACTION, value, action_ts="1700000100.1"))
        await s.send(button(ALICE, APPROVE_ACTION, value, action_ts="1700000100.2"))
        await s.settle()
    assert (await types_of(store, thread_id))[-2:] == ["approval_refused", "approval_granted"]
    assert len(pd.calls_to("GET", "/oncalls")) == 2  # one lookup (schedule, policy)
    assert len(slack.calls_to("users.lookupByEmail")) == 1


@pytest.mark.parametrize("failing", ["pagerduty", "slack"])
async def test_a_failed_on_call_lookup_refuses_the_click_and_stores_nothing(
    store: Store, slack: FakeSlack, pd: FakePagerDuty, failing: str, on_call: MakeOnCall
) -> None:
    thread_id, value = await card_thread(store, slack)
    before = await types_of(store, thread_id)
    if failing == "pagerduty":
        pd.fail("GET", "/oncalls", 503, times=2)
    else:
        slack.fail("users.lookupByEmail", "missing_scope")
    async with served(store, slack, groups=reviewers(slack, on_call())) as s:
        assert (await s.send(button(ALICE, APPROVE_ACTION, value)))[0] == 200
        await slack.wait_for("chat.postEphemeral")
    assert await types_of(store, thread_id) == before  # never let through, nothing stored
    assert ephemeral_texts(slack, ALICE) == [
        f"I could not check who is on call ({SCHEDULE}) with PagerDuty just now. Nothing "
        "changed: try again in a minute."
    ]


async def test_without_pagerduty_an_on_call_click_is_refused_saying_why(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await card_thread(store, slack)
    before = await types_of(store, thread_id)
    async with served(store, slack, groups=reviewers(slack, None)) as s:
        await s.send(button(ALICE, APPROVE_ACTION, value))
        await slack.wait_for("chat.postEphemeral")
    assert await types_of(store, thread_id) == before
    [note] = ephemeral_texts(slack, ALICE)
    assert "PagerDuty is not connected here (integrations.pagerduty in opsloop.yaml)" in note


async def test_an_approver_named_by_id_is_not_held_up_by_pagerduty_being_down(
    store: Store, slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    thread_id, value = await card_thread(store, slack, EVE, ON_CALL)
    pd.fail("GET", "/oncalls", 503, times=10)
    async with served(store, slack, groups=reviewers(slack, on_call())) as s:
        await s.send(button(EVE, APPROVE_ACTION, value))
        await s.settle()
    assert (await types_of(store, thread_id))[-1] == "approval_granted"
    assert pd.calls_to("GET", "/oncalls") == []  # named: no lookup needed


async def test_an_escalation_policy_is_on_call_by_its_first_level(
    slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    pd.put_on_call(["PALICE1"], escalation_policy="PEPOL0002", level=1)
    pd.put_on_call(["PBOB0001"], escalation_policy="PEPOL0002", level=2)
    assert await on_call().users("oncall:PEPOL0002") == {ALICE}


async def test_an_on_call_user_without_a_slack_account_is_left_out(
    slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    pd.add_user("PCAROL01", "Carol", "carol@elsewhere.example")
    pd.put_on_call(["PALICE1", "PCAROL01"], schedule=SCHEDULE)
    assert await on_call().users(ON_CALL) == {ALICE}


async def test_a_card_posted_while_pagerduty_is_down_says_the_on_call_is_not_known(
    store: Store, slack: FakeSlack, pd: FakePagerDuty, on_call: MakeOnCall
) -> None:
    thread_id, _value = await card_thread(store, slack)
    pd.fail("GET", "/oncalls", 503, times=2)
    client = AsyncWebClient(token=SLACK_TOKEN, base_url=slack.url)
    delivery = Delivery(store, client, owner="proc-a", retry_base=None, on_call=on_call())
    # Posted all the same: the status message, the plan (started, stopped), the card.
    assert await delivery.deliver(thread_id) == 4
    [card] = cards_in(slack)
    assert f"{SCHEDULE}: not known (PagerDuty did not answer)" in text_of(card)
    assert "who is on call is asked of PagerDuty at each click" in text_of(card)
