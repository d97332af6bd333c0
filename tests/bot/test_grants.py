"""Standing grants through Slack (issue 17 §4): the card offers "Approve for 1 h" only
when the call's rule allows grants, its click stores the vote and the grant, a matching
call in the thread then runs at once with a line saying whose grant approved it, and
``/opsloop grants`` lists live grants with a Revoke button that works. Signed requests
and Slack's payload shapes through the Bolt app, a runner and a delivery; SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.delivery import Delivery
from bot.limits import check_limits
from bot.outbox import shown_event
from bot.render.approval import APPROVE_ACTION, GRANT_ACTION
from bot.render.grants import REVOKE_ACTION
from engine import events as ev
from engine.config_file import PolicyRule
from engine.events import utcnow
from engine.inputs import post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.bot.test_app import BOB, CHANNEL, EVE, Served, button, filled, served
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack
from tests.support.demo_tools import make_tools
from tests.support.fakes import FakeClock

ANN = "U0ANN00001"
SCRIPT = [
    call("deploy", name="api"),
    call("deploy", name="api"),  # the same again: the grant approves it
    say("Deployed twice."),
]


def policy(**keys: Any) -> PolicySet:
    rule = {"approvers": [BOB], **keys}
    return PolicySet(
        rules=(PolicyRule(tool="deploy", policy="approve_before_run", **rule),),
        policy_hash="f" * 64,
    )


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


class Thread:
    """A thread run by a runner and shown by a delivery, on a fake clock."""

    def __init__(
        self, store: Store, slack: FakeSlack, rules: PolicySet, script: list | None = None
    ) -> None:
        self.store, self.slack = store, slack
        self.clock = FakeClock(utcnow())
        self.effects: Counter = Counter()
        model = ScriptedModel(script or SCRIPT)
        self.runner = Runner(store, model, make_tools(self.effects), policy=rules, clock=self.clock)
        self.delivery = Delivery(
            store,
            AsyncWebClient(token=TOKEN, base_url=slack.url),
            owner="proc",
            retry_base=None,
            clock=self.clock,
        )
        self.tid = ""

    async def start(self) -> dict[str, Any]:
        assert await self.begin() == "awaiting_approval"
        [card] = await self.shown("approval_requested")
        return card

    async def begin(self) -> str:
        """A new thread's first message, run and shown: the status it stops at."""
        root = self.slack.add_message(CHANNEL, "deploy api", user=ANN)["ts"]
        posted = await post_user_message(
            self.store, ThreadKey(TEAM_ID, CHANNEL, root), text="deploy api", user=ANN
        )
        self.tid = posted.thread_id
        status = (await self.runner.run(self.tid)).status
        await self.delivery.deliver(self.tid)
        return status

    async def step(self) -> ev.AnyEvent:
        await self.runner.run(self.tid)
        await self.delivery.deliver(self.tid)
        return (await self.store.select_events(self.tid))[-1]

    async def shown(self, type_: str) -> list[dict[str, Any]]:
        types = {e.event_id: e.type for e in await self.store.select_events(self.tid)}
        posts = [m for m in self.slack.posted(CHANNEL) if shown_event(m, self.tid)]
        return [m for m in posts if types.get(shown_event(m, self.tid) or "") == type_]

    async def events(self) -> list[ev.AnyEvent]:
        return list(await self.store.select_events(self.tid))


def buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The card's buttons by action id."""
    return {
        e["action_id"]: e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    }


async def open_grant(s: Served, value: str, user: str = BOB) -> dict[str, Any]:
    """Click "Approve for 1 h"; the modal views.open was called with."""
    before = len(s.slack.calls_to("views.open"))
    click = button(user, GRANT_ACTION, value)
    assert (await s.send(click))[0] == 200
    opened = await s.slack.wait_for("views.open", before + 1)
    assert opened[-1].params["trigger_id"] == click["trigger_id"]
    view = opened[-1].params["view"]
    return json.loads(view) if isinstance(view, str) else view


def grant_submission(
    view: dict[str, Any], values: dict[str, Any], *, user: str = BOB, view_id: str = "V0GRANT001"
) -> dict[str, Any]:
    return fake.view_submission_payload(
        user=user,
        callback_id=view["callback_id"],
        private_metadata=view["private_metadata"],
        values=values,
        view_id=view_id,
        blocks=view["blocks"],
    )


async def grants_command(s: Served, user: str = EVE) -> dict[str, Any]:
    payload = fake.slash_command_payload(user=user, text="grants", channel=CHANNEL)
    status, body = await s.send(payload)
    assert status == 200
    answer: dict[str, Any] = json.loads(body)
    assert answer["response_type"] == "ephemeral" and check_limits(answer["blocks"]) == []
    return answer


@pytest.mark.parametrize(
    "keys", [{}, {"max_grant": "1h", "quorum": 2, "approvers": [BOB, EVE]}], ids=["none", "q2"]
)
async def test_no_approve_for_button_when_the_rule_allows_no_grants(
    store: Store, slack: FakeSlack, keys: dict[str, Any]
) -> None:
    t = Thread(store, slack, policy(**keys))
    card = await t.start()
    assert APPROVE_ACTION in buttons(card) and GRANT_ACTION not in buttons(card)
    await t.delivery.close()


async def test_approve_for_is_labelled_with_the_rules_shorter_max_grant(
    store: Store, slack: FakeSlack
) -> None:
    t = Thread(store, slack, policy(max_grant="20m"))
    card = await t.start()
    assert buttons(card)[GRANT_ACTION]["text"]["text"] == "Approve for 20 min"
    await t.delivery.close()


async def test_approve_for_an_hour_then_a_matching_call_runs_at_once_until_revoked(
    store: Store, slack: FakeSlack
) -> None:
    t = Thread(store, slack, policy(max_grant="8h"))
    card = await t.start()
    grant_button = buttons(card)[GRANT_ACTION]
    assert grant_button["text"]["text"] == "Approve for 1 h"
    async with served(store, slack) as s:
        before = await t.events()
        view = await open_grant(s, grant_button["value"])
        assert await t.events() == before  # the modal stores nothing
        assert (await s.send(grant_submission(view, filled(view))))[0] == 200
        assert (await s.send(grant_submission(view, filled(view)), retry=1))[0] == 200
        vote, created = (await t.events())[-2:]
        assert isinstance(vote, ev.ApprovalGranted) and vote.actor == BOB
        assert vote.dedupe_key == "view:V0GRANT001"
        assert isinstance(created, ev.GrantCreated) and created.reviewer == BOB
        assert created.arguments_schema["properties"] == {"name": {"const": "api"}}
        assert created.scope == "thread"
        assert timedelta(minutes=59) < created.until - vote.created_at <= timedelta(hours=1)
        assert s.kicks[0] == t.tid
        assert [type(e) for e in await t.events()].count(ev.GrantCreated) == 1

        await t.step()  # runs the first, then the second at once, then answers
        assert t.effects["deploy"] == 2
        updates = [json.dumps(u.params.get("blocks")) for u in slack.calls_to("chat.update")]
        [said] = [u for u in updates if "Approved by" in u]
        assert "also granted calls of" in said and "with these exact arguments" in said
        assert "in this thread until" in said
        by_grant = [
            e for e in await t.events() if isinstance(e, ev.ApprovalGranted) and e is not vote
        ]
        assert [e.actor for e in by_grant] == [BOB, f"grant:{created.grant_id}"]
        [line] = await t.shown("approval_granted")  # the card's update is not a post
        text = json.dumps(line["blocks"])
        assert f"<@{BOB}>'s grant until" in text and "<!date^" in text
        assert len(await t.shown("approval_requested")) == 1  # no second card

        listed = await grants_command(s)
        revoke = next(
            b["accessory"] for b in listed["blocks"] if b.get("accessory", {}).get("action_id")
        )
        assert revoke["action_id"] == REVOKE_ACTION and "deploy" in json.dumps(listed["blocks"])
        # Someone who neither created it nor approves the rule may not revoke it.
        assert (await s.send(button(EVE, REVOKE_ACTION, revoke["value"])))[0] == 200
        await s.settle()
        assert not [e for e in await t.events() if isinstance(e, ev.GrantRevoked)]
        assert (await s.send(button(BOB, REVOKE_ACTION, revoke["value"])))[0] == 200
        await s.settle()
        [revoked] = [e for e in await t.events() if isinstance(e, ev.GrantRevoked)]
        assert (revoked.grant_id, revoked.actor) == (created.grant_id, BOB)
        assert "No standing grants" in (await grants_command(s))["text"]
    texts = [e["text"] for e in slack.ephemerals]
    assert any("only the reviewer who created it" in x for x in texts)
    assert any(x.startswith("Revoked") for x in texts)
    await t.delivery.close()


async def test_the_modal_grants_the_channel_letting_an_argument_vary(
    store: Store, slack: FakeSlack
) -> None:
    """Bob unticks ``name`` and picks the channel: a deploy of another service, asked in
    another thread of the channel, runs at once, its line naming Bob's grant."""
    rules = policy(max_grant="8h")
    first = Thread(store, slack, rules, [call("deploy", name="api"), say("ok")])
    card = await first.start()
    async with served(store, slack) as s:
        view = await open_grant(s, buttons(card)[GRANT_ACTION]["value"])
        chosen = filled(view, {"grant_scope": "channel", "grant_exact": [], "grant_span": "900"})
        assert (await s.send(grant_submission(view, chosen)))[0] == 200
        [created] = [e for e in await first.events() if isinstance(e, ev.GrantCreated)]
        assert (created.scope, created.arguments_schema["required"]) == ("channel", [])
        assert await first.step() and first.effects["deploy"] == 1

        second = Thread(store, slack, rules, [call("deploy", name="web"), say("done")])
        assert await second.begin() == "idle"
        assert second.effects["deploy"] == 1
        [by_grant] = [
            e
            for e in await second.events()
            if isinstance(e, ev.ApprovalGranted) and e.actor == f"grant:{created.grant_id}"
        ]
        assert by_grant.grant is not None and by_grant.grant.thread_id == first.tid
        [line] = await second.shown("approval_granted")
        assert f"<@{BOB}>'s grant until" in json.dumps(line["blocks"])
        assert await second.shown("approval_requested") == []  # no card

        listed = json.dumps((await grants_command(s))["blocks"])
        assert "whole channel" in listed and "name: _any_" in listed
    await first.delivery.close()
    await second.delivery.close()


async def test_someone_who_may_not_approve_gets_no_grant_modal(
    store: Store, slack: FakeSlack
) -> None:
    t = Thread(store, slack, policy(max_grant="1h"))
    card = await t.start()
    async with served(store, slack) as s:
        assert (await s.send(button(EVE, GRANT_ACTION, buttons(card)[GRANT_ACTION]["value"])))[
            0
        ] == 200
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert slack.calls_to("views.open") == []
    assert [e.type for e in await t.events()][-1] == "approval_refused"
    assert not [e for e in await t.events() if isinstance(e, ev.GrantCreated)]
    await t.delivery.close()
