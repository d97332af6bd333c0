"""The reconcile card (issue 9 §5): posted when a call's outcome is unknown, decided by
real signed clicks through the Bolt app, and updated in place, against the fake Slack,
on SQLite and PostgreSQL. Also the quorum: two approvers, a repeated vote refused, the
card updated in place after each vote."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot import limits
from bot.delivery import Delivery
from bot.outbox import shown_event
from bot.render.approval import APPROVE_ACTION
from bot.render.common import Binding, binding_value, parse_binding
from bot.render.modals import NOTE_ACTION, NOTE_BLOCK, NOTE_CALLBACK
from bot.render.reconcile import ABANDON_ACTION, HAPPENED_ACTION, RETRY_ACTION
from engine import events as ev
from engine.events import utcnow
from engine.policy import arguments_hash
from engine.reviewers import ReviewerRule
from engine.store import Store, ThreadKey
from tests.bot.test_app import Served, served
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_ID, TOKEN, FakeSlack

CHANNEL = "C0OPS00001"
ANN = "U0ANN00001"  # the requester
BOB = "U0BOB00001"  # an approver
CAROL = "U0CAROL001"  # another approver
EVE = "U0EVE00001"  # not an approver
SRE = "S0SRE00001"
CALL = "toolu_01"
ARGS = {"service": "api"}


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


@pytest.fixture
async def delivery(store: Store, slack: FakeSlack) -> AsyncIterator[Delivery]:
    d = Delivery(store, AsyncWebClient(token=TOKEN, base_url=slack.url), owner="proc-a")
    d.retry_base = None
    yield d
    await d.close()


async def thread_with(store: Store, slack: FakeSlack, events: list[ev.Event]) -> str:
    """A thread rooted in a real (fake) Slack message, with ``events`` after ann's ask."""
    root = slack.add_message(CHANNEL, "restart api", user=ANN)
    tid = await store.create_thread(ThreadKey(TEAM_ID, CHANNEL, root["ts"]))
    asked = ev.UserMessage(actor=ANN, text="restart api")
    await store.append(tid, 0, [asked, *events])
    return tid


def requested(policy: str = "run_now", **kw: Any) -> list[ev.Event]:
    return [
        ev.ModelDecision(
            actor="model", tool_name="restart", tool_call_id=CALL, arguments=ARGS, model="s"
        ),
        ev.ToolCallRequested(
            tool_call_id=CALL,
            intent="restart",
            arguments=ARGS,
            policy=policy,  # type: ignore[arg-type]
            idempotency_key=f"thr:{CALL}",
            idempotent=False,
            **kw,
        ),
    ]


async def awaiting_reconcile(
    store: Store, slack: FakeSlack, approvers: tuple[str, ...] = (BOB, CAROL)
) -> str:
    """restart api was interrupted mid-call (rule 2: bob or carol decides)."""
    started = utcnow() - timedelta(minutes=3)
    tid = await thread_with(
        store,
        slack,
        [
            *requested(rule=1, approvers=approvers, policy_hash="cd" * 32),
            ev.ToolStarted(tool_call_id=CALL, attempt=1),
            ev.ToolOutcomeUnknown(
                tool_call_id=CALL, attempt=1, started_at=started, error="connection reset"
            ),
        ],
    )
    assert (await store.load(tid)).status == "awaiting_reconcile"
    return tid


def card_post(slack: FakeSlack, action_id: str) -> Any:
    """The chat.postMessage call that posted the card with the ``action_id`` button."""
    [post] = [c for c in slack.calls_to("chat.postMessage") if action_id in json.dumps(c.params)]
    return post


def card_ts(slack: FakeSlack, post: Any) -> str:
    """The ts of the message ``post`` made, found by its metadata (updates keep it)."""
    return next(
        m["ts"]
        for m in slack.thread(CHANNEL, post.params["thread_ts"])
        if m.get("metadata") == post.params["metadata"]
    )


def click(slack: FakeSlack, post: Any, action_id: str, user: str, n: int) -> dict[str, Any]:
    """A click by ``user`` on the card's ``action_id`` button, as Slack sends it."""
    blocks = post.params["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    [value] = [
        e["value"]
        for blk in blocks
        if blk["type"] == "actions"
        for e in blk["elements"]
        if e["action_id"] == action_id
    ]
    return fake.block_actions_payload(
        user=user,
        action_id=action_id,
        value=value,
        channel=CHANNEL,
        message_ts=card_ts(slack, post),
        thread_ts=post.params["thread_ts"],
        action_ts=f"1700000{n:03d}.1",
    )


def updates_of(slack: FakeSlack, post: Any) -> list[dict[str, Any]]:
    ts = card_ts(slack, post)
    return [c.params for c in slack.calls_to("chat.update") if c.params["ts"] == ts]


def text_of(params: dict[str, Any]) -> str:
    blocks = params["blocks"]
    return json.dumps(json.loads(blocks) if isinstance(blocks, str) else blocks)


def note_submission(value: str, note: str | None, user: str, view_id: str) -> dict[str, Any]:
    return fake.view_submission_payload(
        user=user,
        callback_id=NOTE_CALLBACK,
        private_metadata=value,
        values=fake.text_input_values(NOTE_BLOCK, NOTE_ACTION, note),
        view_id=view_id,
    )


async def last_event(store: Store, tid: str) -> ev.AnyEvent:
    return [e for e in await store.select_events(tid) if e.type != "message_posted"][-1]


def ephemerals(slack: FakeSlack, user: str) -> list[str]:
    return [e["text"] for e in slack.ephemerals if e["user"] == user]


# --- delivery -----------------------------------------------------------------------------


async def test_the_reconcile_card_is_posted_once_bound_to_the_call(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack)
    # The status message, the plan showing the call (started, stopped), the card.
    assert await delivery.deliver(tid) == 4
    assert await delivery.deliver(tid) == 0
    post = card_post(slack, RETRY_ACTION)
    unknown = next(e for e in await store.select_events(tid) if e.type == "tool_outcome_unknown")
    [card] = [m for m in slack.posted(CHANNEL) if RETRY_ACTION in json.dumps(m)]
    assert shown_event(card, tid) == unknown.event_id
    text = text_of(post.params)
    assert "Did it happen? Restart" in text
    assert "connection reset" in text and '\\"service\\": \\"api\\"' in text
    assert "rule 2: needs 1 of" in text and f"<@{BOB}>" in text
    blocks = post.params["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    assert limits.check_limits(blocks) == []
    buttons = [e for blk in blocks if blk["type"] == "actions" for e in blk["elements"]]
    digest = arguments_hash("restart", ARGS)
    assert {parse_binding(e["value"]) for e in buttons} == {Binding(tid, CALL, digest)}
    status = slack.calls_to("chat.postMessage")[0].params
    assert "was interrupted: waiting for" in status["text"]


@pytest.mark.parametrize(
    ("action", "decision", "line"),
    [
        (RETRY_ACTION, "retry", "asked to run it again"),
        (ABANDON_ACTION, "abandon", "said it did not happen"),
    ],
)
async def test_a_click_decides_and_the_card_is_updated_in_place(
    store: Store, slack: FakeSlack, delivery: Delivery, action: str, decision: str, line: str
) -> None:
    tid = await awaiting_reconcile(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, action)
    async with served(store, slack) as s:
        status, _ = await s.send(click(slack, post, action, BOB, 1))
        await s.settle()
    assert status == 200
    decided = await last_event(store, tid)
    assert isinstance(decided, ev.ReconcileDecided)
    assert (decided.decision, decided.reviewer, decided.dedupe_key) == (
        decision,
        BOB,
        "click:1700000001.1",
    )
    assert s.kicks == [tid]
    assert slack.ephemerals == []
    await delivery.deliver(tid)
    [update] = updates_of(slack, post)
    assert f"<@{BOB}> {line}" in text_of(update)
    assert RETRY_ACTION not in text_of(update)  # no live buttons
    assert update["metadata"] == post.params["metadata"]


async def test_it_happened_opens_the_note_modal_and_its_note_is_the_result(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, HAPPENED_ACTION)
    before = await store.select_events(tid)
    async with served(store, slack) as s:
        payload = click(slack, post, HAPPENED_ACTION, CAROL, 1)
        assert (await s.send(payload))[0] == 200
        [opened] = await slack.wait_for("views.open")
        assert await store.select_events(tid) == before  # the modal stores nothing
        view = opened.params["view"]
        view = json.loads(view) if isinstance(view, str) else view
        assert opened.params["trigger_id"] == payload["trigger_id"]
        assert view["callback_id"] == NOTE_CALLBACK
        assert limits.check_limits(view) == []
        note = "restarted at 10:02 <!here>"
        submitted = note_submission(view["private_metadata"], f"  {note} ", CAROL, "V0NOTE0001")
        status, text = await s.send(submitted)
        assert (await s.send(submitted, retry=1))[0] == 200  # redelivered: once
    assert (status, text) == (200, "")  # closes the modal
    decided = await last_event(store, tid)
    assert isinstance(decided, ev.ReconcileDecided)
    assert (decided.decision, decided.reviewer, decided.note) == ("happened", CAROL, note)
    assert [e.type for e in await store.select_events(tid)].count("reconcile_decided") == 1
    await delivery.deliver(tid)
    [update] = updates_of(slack, post)
    assert f"<@{CAROL}> said it happened" in text_of(update)
    assert "restarted at 10:02 &lt;!here&gt;" in text_of(update)  # escaped


# --- refusals -----------------------------------------------------------------------------


async def test_someone_not_on_the_calls_approvers_is_refused_privately(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, RETRY_ACTION)
    # The process allows anyone; the call's rule (bob, carol) decides.
    async with served(store, slack, reviewers=ReviewerRule()) as s:
        for n, (action, user) in enumerate(
            [(RETRY_ACTION, EVE), (ABANDON_ACTION, ANN), (HAPPENED_ACTION, EVE)]
        ):
            assert (await s.send(click(slack, post, action, user, n)))[0] == 200
        await slack.wait_for("chat.postEphemeral", 3)
        await s.settle()
    state = await store.load(tid)
    assert state.status == "awaiting_reconcile"
    refused = [e for e in await store.select_events(tid) if isinstance(e, ev.ApprovalRefused)]
    # Every refused click is in the audit, It happened's too (refused before its modal).
    assert [(r.actor, r.decision) for r in refused] == [
        (EVE, "retry"),
        (ANN, "abandon"),
        (EVE, "happened"),
    ]
    assert ephemerals(slack, EVE) == ["Nothing changed: you are not on the approvers list."] * 2
    assert "self-approval is turned off" in ephemerals(slack, ANN)[0]
    assert slack.calls_to("views.open") == []
    assert s.kicks == []


async def test_the_requester_gets_no_note_modal_only_why_not(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    """Issue 15 §5: the requester filled the note modal and was refused on submitting.
    It happened takes the step the reject and edit modals take first: refused at the
    click, told privately, recorded, and no modal opens."""
    tid = await awaiting_reconcile(store, slack, approvers=(ANN, BOB))
    await delivery.deliver(tid)
    post = card_post(slack, HAPPENED_ACTION)
    async with served(store, slack) as s:
        assert (await s.send(click(slack, post, HAPPENED_ACTION, ANN, 1)))[0] == 200
        [told] = await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert told.params["user"] == ANN and "self-approval is turned off" in told.params["text"]
    assert slack.calls_to("views.open") == []
    refused = await last_event(store, tid)
    assert isinstance(refused, ev.ApprovalRefused)
    assert (refused.actor, refused.decision) == (ANN, "happened")
    assert (await store.load(tid)).status == "awaiting_reconcile"
    assert s.kicks == []


async def test_a_decided_card_refuses_a_second_decision(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, RETRY_ACTION)
    async with served(store, slack) as s:
        await s.send(click(slack, post, ABANDON_ACTION, BOB, 1))
        await s.send(click(slack, post, RETRY_ACTION, CAROL, 2))
        await s.send(click(slack, post, HAPPENED_ACTION, CAROL, 3))
        await slack.wait_for("chat.postEphemeral", 2)
        await s.settle()
    decided = [e for e in await store.select_events(tid) if e.type == "reconcile_decided"]
    assert len(decided) == 1
    texts = ephemerals(slack, CAROL)
    assert all(
        t.startswith(f"Nothing changed: already decided (abandon) by <@{BOB}>") for t in texts
    )
    assert slack.calls_to("views.open") == []


async def test_a_failed_group_lookup_says_try_again_and_changes_nothing(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack, approvers=(SRE,))
    await delivery.deliver(tid)
    post = card_post(slack, RETRY_ACTION)
    before = await store.select_events(tid)
    slack.fail("usergroups.users.list", "missing_scope", times=2)
    async with served(store, slack) as s:  # the process names no group: the call's rule does
        await s.send(click(slack, post, RETRY_ACTION, EVE, 1))
        await s.send(click(slack, post, HAPPENED_ACTION, EVE, 2))
        await slack.wait_for("chat.postEphemeral", 2)
        await s.settle()
    assert await store.select_events(tid) == before
    assert all("could not check your user groups" in t for t in ephemerals(slack, EVE))
    assert [c.params["usergroup"] for c in slack.calls_to("usergroups.users.list")] == [SRE] * 2


async def test_a_group_member_of_the_calls_rule_may_decide(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_reconcile(store, slack, approvers=(SRE,))
    await delivery.deliver(tid)
    slack.usergroups[SRE] = [EVE]
    post = card_post(slack, RETRY_ACTION)
    async with served(store, slack) as s:
        await s.send(click(slack, post, RETRY_ACTION, EVE, 1))
        await s.settle()
    decided = await last_event(store, tid)
    assert isinstance(decided, ev.ReconcileDecided) and decided.reviewer == EVE


@pytest.mark.parametrize("forged", ["not json", '{"t":"thr_nope","c":"toolu_01","h":"x"}'])
async def test_a_forged_reconcile_button_or_form_changes_nothing(
    store: Store, slack: FakeSlack, forged: str
) -> None:
    tid = await awaiting_reconcile(store, slack)
    before = await store.select_events(tid)
    async with served(store, slack) as s:
        for action in (RETRY_ACTION, ABANDON_ACTION, HAPPENED_ACTION):
            payload = fake.block_actions_payload(
                user=BOB, action_id=action, value=forged, channel=CHANNEL, message_ts="1.2"
            )
            assert (await s.send(payload))[0] == 200
        status, text = await s.send(note_submission(forged, "x", BOB, "V0NOTE0002"))
        await slack.wait_for("chat.postEphemeral", 3)
        await s.settle()
    assert await store.select_events(tid) == before
    assert all("not valid" in t for t in ephemerals(slack, BOB))
    assert status == 200 and json.loads(text)["response_action"] == "errors"
    assert NOTE_BLOCK in json.loads(text)["errors"]


async def test_a_refused_note_shows_the_reason_under_the_note(
    store: Store, slack: FakeSlack
) -> None:
    tid = await awaiting_reconcile(store, slack)
    value = binding_value(tid, CALL, arguments_hash("restart", ARGS))
    async with served(store, slack) as s:
        status, text = await s.send(note_submission(value, "done", EVE, "V0NOTE0003"))
    assert status == 200
    answer = json.loads(text)
    assert answer["response_action"] == "errors"
    assert answer["errors"][NOTE_BLOCK] == "Nothing changed: you are not on the approvers list."
    assert (await store.load(tid)).status == "awaiting_reconcile"


# --- quorum ---------------------------------------------------------------------------------


async def awaiting_two_votes(store: Store, slack: FakeSlack) -> str:
    """restart api needs 2 of bob, carol and eve (rule 3)."""
    digest = arguments_hash("restart", ARGS)
    tid = await thread_with(
        store,
        slack,
        [
            *requested("approve_before_run", rule=2, approvers=(BOB, CAROL, EVE), quorum=2),
            ev.ApprovalRequested(
                tool_call_id=CALL,
                arguments_hash=digest,
                expires_at=utcnow() + timedelta(hours=1),
                reason="ann asked",
            ),
        ],
    )
    assert (await store.load(tid)).status == "awaiting_approval"
    return tid


async def vote(s: Served, slack: FakeSlack, post: Any, user: str, n: int) -> None:
    assert (await s.send(click(slack, post, APPROVE_ACTION, user, n)))[0] == 200


async def test_a_quorum_of_two_votes_each_updating_the_card_in_place(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_two_votes(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, APPROVE_ACTION)
    assert "rule 3: needs 2 of" in text_of(post.params)
    assert "0 of 2 approvals so far" in text_of(post.params)
    async with served(store, slack) as s:
        await vote(s, slack, post, BOB, 1)
        await s.settle()
        assert (await store.load(tid)).status == "awaiting_approval"
        await delivery.deliver(tid)
        [first] = updates_of(slack, post)
        assert f"1 of 2: <@{BOB}>" in text_of(first)
        assert APPROVE_ACTION in text_of(first)  # still open

        await vote(s, slack, post, BOB, 2)  # the same reviewer again
        [told] = await slack.wait_for("chat.postEphemeral")
        assert told.params["user"] == BOB
        assert told.params["text"].startswith("Nothing changed: you already approved this call")
        assert (await store.load(tid)).status == "awaiting_approval"
        await delivery.deliver(tid)
        assert len(updates_of(slack, post)) == 1  # a refused vote changes no card

        await vote(s, slack, post, CAROL, 3)
        await s.settle()
    assert (await store.load(tid)).status == "running"
    granted = [e.actor for e in await store.select_events(tid) if e.type == "approval_granted"]
    assert granted == [BOB, CAROL]
    assert s.kicks == [tid, tid]
    await delivery.deliver(tid)
    first, decided = updates_of(slack, post)
    assert f"Approved by <@{BOB}> and <@{CAROL}>" in text_of(decided)
    assert APPROVE_ACTION not in text_of(decided)
    assert [m for m in slack.posted(CHANNEL) if APPROVE_ACTION in json.dumps(m)] == []


async def test_the_requester_does_not_count_toward_the_quorum(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    tid = await awaiting_two_votes(store, slack)
    await delivery.deliver(tid)
    post = card_post(slack, APPROVE_ACTION)
    async with served(store, slack) as s:
        await vote(s, slack, post, ANN, 1)
        await slack.wait_for("chat.postEphemeral")
        await s.settle()
    assert (await last_event(store, tid)).type == "approval_refused"
    assert "self-approval is turned off" in ephemerals(slack, ANN)[0]


async def test_a_vote_is_checked_against_the_groups_of_the_calls_own_rule(
    store: Store, slack: FakeSlack, delivery: Delivery
) -> None:
    digest = arguments_hash("restart", ARGS)
    tid = await thread_with(
        store,
        slack,
        [
            *requested("approve_before_run", rule=0, approvers=(SRE,)),
            ev.ApprovalRequested(
                tool_call_id=CALL, arguments_hash=digest, expires_at=utcnow() + timedelta(hours=1)
            ),
        ],
    )
    await delivery.deliver(tid)
    post = card_post(slack, APPROVE_ACTION)
    slack.usergroups[SRE] = [CAROL]
    # The process's approvers name bob alone; the call's rule names the SRE group.
    async with served(store, slack, reviewers=ReviewerRule(frozenset({BOB}))) as s:
        await vote(s, slack, post, BOB, 1)
        await slack.wait_for("chat.postEphemeral")
        await vote(s, slack, post, CAROL, 2)
        await s.settle()
    votes = [(e.type, e.actor) for e in await store.select_events(tid) if e.actor in (BOB, CAROL)]
    assert votes == [("approval_refused", BOB), ("approval_granted", CAROL)]
    assert [c.params["usergroup"] for c in slack.calls_to("usergroups.users.list")] == [SRE]
