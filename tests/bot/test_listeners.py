"""Listeners that only translate: the team check on every click, what is acknowledged
and ignored, ``/me`` replies, and the names of the people a message mentions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.render.approval import APPROVE_ACTION, REJECT_ACTION
from bot.render.modals import REASON_BLOCK
from bot.render.status import CANCEL_ACTION
from engine import events as ev
from engine.store import Store
from tests.bot.test_app import (
    ANN,
    BOB,
    CHANNEL,
    ROOT,
    awaiting_approval,
    button,
    events_of,
    mention,
    served,
    submission,
    thread_at,
    types_of,
)
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_ID, FakeSlack

OTHER_TEAM = "T0OTHER001"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


def from_other_team(payload: dict[str, Any], where: str) -> dict[str, Any]:
    """``payload`` as if sent by a user of another organisation (Slack Connect)."""
    if where in ("team", "both"):
        payload["team"] = {"id": OTHER_TEAM, "domain": "other"}
    if where in ("user", "both"):
        payload["user"] = {**payload["user"], "team_id": OTHER_TEAM}
    if where == "enterprise":
        payload["enterprise"] = {"id": "E0OTHER001", "name": "other"}
    return payload


@pytest.mark.parametrize("where", ["team", "user", "both"])
@pytest.mark.parametrize("action", [APPROVE_ACTION, REJECT_ACTION])
async def test_a_click_from_another_team_is_refused(
    store: Store, slack: FakeSlack, where: str, action: str
) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:  # OPSLOOP_APPROVERS empty: anyone but ANN
        click = from_other_team(button(BOB, action, value, action_ts="1700000100.1"), where)
        assert (await s.send(click))[0] == 200
        [note] = await slack.wait_for("chat.postEphemeral")
        await s.settle()
    refused = (await events_of(store, thread_id))[-1]
    assert isinstance(refused, ev.ApprovalRefused)
    assert refused.actor == BOB and "Slack team" in refused.reason
    assert (await store.load(thread_id)).status == "awaiting_approval"
    assert note.params["user"] == BOB and note.params["text"].startswith("Nothing changed:")
    assert slack.calls_to("views.open") == []
    assert s.kicks == []


async def test_the_same_click_from_the_thread_team_approves(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        assert (await s.send(button(BOB, APPROVE_ACTION, value)))[0] == 200
    assert (await types_of(store, thread_id))[-1] == "approval_granted"


async def test_a_click_from_another_grid_org_is_refused(store: Store, slack: FakeSlack) -> None:
    """The thread's enterprise id is kept in its first message's ``source``."""
    grid = {**mention(), "enterprise_id": "E0HOME0001"}
    async with served(store, slack) as s:
        assert (await s.send(grid))[0] == 200
        thread_id = await thread_at(store)
        assert thread_id is not None
        [first] = await events_of(store, thread_id)
        assert first.source["enterprise"] == "E0HOME0001"  # type: ignore[union-attr]
        cancel = from_other_team(button(ANN, CANCEL_ACTION, thread_id), "enterprise")
        assert (await s.send(cancel))[0] == 200
        [note] = await slack.wait_for("chat.postEphemeral")
    assert "organisation" in note.params["text"]
    assert (await store.load(thread_id)).status == "running"


async def test_cancel_from_another_team_changes_nothing(store: Store, slack: FakeSlack) -> None:
    thread_id, _value = await awaiting_approval(store)
    async with served(store, slack) as s:
        cancel = from_other_team(button(ANN, CANCEL_ACTION, thread_id), "user")
        assert (await s.send(cancel))[0] == 200
        [note] = await slack.wait_for("chat.postEphemeral")
    assert "Slack team" in note.params["text"]
    assert (await store.load(thread_id)).status == "awaiting_approval"


async def test_a_reject_modal_from_another_team_is_refused(store: Store, slack: FakeSlack) -> None:
    thread_id, value = await awaiting_approval(store)
    async with served(store, slack) as s:
        payload = submission(value, "no")
        payload["team"] = {"id": OTHER_TEAM, "domain": "other"}
        status, text = await s.send(payload)
    assert status == 200
    answer = json.loads(text)
    assert answer["response_action"] == "errors"
    assert "Slack team" in answer["errors"][REASON_BLOCK]
    assert (await types_of(store, thread_id))[-1] == "approval_refused"
    assert (await store.load(thread_id)).status == "awaiting_approval"


async def test_a_me_message_reply_in_our_thread_is_stored(store: Store, slack: FakeSlack) -> None:
    reply = fake.message_event(
        user=BOB, text="is on it", channel=CHANNEL, ts="1700000000.000400", thread_ts=ROOT,
        subtype="me_message",
    )  # fmt: skip
    async with served(store, slack) as s:
        await s.send(mention())
        assert (await s.send(reply))[0] == 200
    thread_id = await thread_at(store)
    assert thread_id is not None
    last = (await events_of(store, thread_id))[-1]
    assert isinstance(last, ev.UserMessage)
    assert (last.text, last.actor) == ("is on it", BOB)


def interaction(kind: str) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": kind,
        "team": {"id": TEAM_ID, "domain": "opsloop-test"},
        "user": {"id": ANN, "team_id": TEAM_ID},
        "api_app_id": fake.APP_ID,
        "token": fake.VERIFICATION_TOKEN,
        "trigger_id": "1.2.abc",
    }
    if kind in ("shortcut", "message_action", "dialog_submission"):
        base["callback_id"] = "someone_elses"
    if kind == "message_action":
        base["channel"] = {"id": CHANNEL}
        base["message"] = {"type": "message", "ts": ROOT, "text": "hi"}
    if kind == "dialog_submission":
        base["submission"] = {"a": "b"}
        base["channel"] = {"id": CHANNEL}
    if kind == "block_suggestion":
        base.update(action_id="pick_one", block_id="b", value="de", container={})
    return base


@pytest.mark.parametrize(
    "kind", ["shortcut", "message_action", "dialog_submission", "block_suggestion"]
)
async def test_shortcuts_dialogs_and_options_requests_get_a_2xx(
    store: Store, slack: FakeSlack, kind: str
) -> None:
    async with served(store, slack) as s:
        status, text = await s.send(interaction(kind))
    assert status == 200, text
    if kind == "block_suggestion":
        assert json.loads(text) == {"options": []}
    assert await store.list_threads() == []


async def test_mentioned_people_are_named_in_the_source(store: Store, slack: FakeSlack) -> None:
    slack.add_user("U0CAROL001", "carol")
    text = "<@U0FAKEBOT1> page <@U0CAROL001> and <@U0NOBODY01>, cc <@U0CAROL001>"
    slack.fail("users.info", "user_not_found")  # the first lookup (carol's) fails
    async with served(store, slack) as s:
        await s.send(mention(text))
        await s.send(mention(text, ts="1700000000.000300", thread_ts=ROOT))
    thread_id = await thread_at(store)
    assert thread_id is not None
    first, second = await events_of(store, thread_id)
    names = [e.source.get("names", {}) for e in (first, second)]  # type: ignore[union-attr]
    assert "U0FAKEBOT1" not in names[0]
    assert names[1]["U0CAROL001"] == "carol"
    assert names[1]["U0NOBODY01"] == "u0nobody01"  # open-world fake: every id is someone
    looked_up = [c.params["user"] for c in slack.calls_to("users.info")]
    assert looked_up.count("U0NOBODY01") == 1  # cached for the second message


async def test_a_reply_in_a_thread_not_ours_looks_nobody_up(store: Store, slack: FakeSlack) -> None:
    """Names are resolved for messages we store, not for channel chatter we ignore."""
    reply = fake.message_event(
        user=ANN,
        text="ask <@U0CAROL001> about lunch",
        channel=CHANNEL,
        ts="1700000000.000400",
        thread_ts=ROOT,
    )
    async with served(store, slack) as s:
        status, _ = await s.send(reply)
    assert status == 200
    assert await store.list_threads() == []
    assert slack.calls_to("users.info") == []
