"""``/opsloop audit`` and the App Home's "Decided by me", driven through the Bolt app with
signed requests and Slack's payload shapes (as tests/bot/test_app.py), on SQLite and
PostgreSQL: decisions made by clicks are read back from the log, privately."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot import limits
from bot.render.approval import APPROVE_ACTION
from engine import events as ev
from engine.store import Store
from tests.bot.render.support import all_text
from tests.bot.test_app import (
    ANN,
    BOB,
    CHANNEL,
    EVE,
    ROOT,
    Served,
    awaiting_approval,
    button,
    served,
    submission,
)
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_DOMAIN, FakeSlack

LINK = f"https://{TEAM_DOMAIN}.slack.com/archives/{CHANNEL}/p{ROOT.replace('.', '')}"
OTHER_TEAM = "T0OTHER001"
NO_SUCH = "No such thread in this workspace."


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as s:
        yield s


async def audit(s: Served, text: str, user: str = EVE, **fields: str) -> dict[str, Any]:
    """``/opsloop audit TEXT`` as ``user`` runs it (``fields`` override the payload's);
    the answer, which must be private."""
    payload = fake.slash_command_payload(user=user, text=f"audit {text}".strip(), channel=CHANNEL)
    payload.update(fields)
    status, body = await s.send(payload)
    assert status == 200
    answer: dict[str, Any] = json.loads(body)
    assert answer["response_type"] == "ephemeral"
    return answer


async def test_audit_by_link_by_id_and_in_the_thread_tells_who_decided_privately(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, value = await awaiting_approval(store, approvers=(BOB,))
    async with served(store, slack) as s:
        await s.send(button(EVE, APPROVE_ACTION, value))  # refused: not an approver
        await s.send(button(BOB, APPROVE_ACTION, value))
        await slack.wait_for("chat.postEphemeral")
        by_link = await audit(s, LINK)
        reply_link = f"{LINK[:-4]}9999?thread_ts={ROOT}&cid={CHANNEL}"
        by_reply_link = await audit(s, f"<{reply_link}>")
        by_id = await audit(s, thread_id, user=ANN)
        in_thread = await audit(s, "", thread_ts=ROOT)
    blocks = by_link["blocks"]
    assert limits.check_limits(blocks) == []
    text = all_text(blocks)
    assert f"*Approvals in <{LINK}|this thread>*" in text
    assert f"*1.* *deploy* asked by <@{ANN}>" in text
    assert f"📜 default approvers: needs 1 of <@{BOB}>" in text  # no policy-file rule
    assert f"🚫 <@{EVE}> tried to approve " in text and "not on the approvers list" in text
    assert f"✅ approved by <@{BOB}> " in text
    assert "*Result:* ▶️ approved; not started yet" in text  # no worker runs in this test
    for other in (by_reply_link, by_id, in_thread):
        assert other["blocks"] == blocks
    assert by_link["text"] == "Approvals in this thread: 1 calls (deploy)"
    events = await store.select_events(thread_id)
    assert [e.type for e in events][-2:] == ["approval_refused", "approval_granted"]  # nothing new


async def test_a_thread_of_another_team_or_none_at_all_is_no_such_thread(
    store: Store, slack: FakeSlack
) -> None:
    thread_id, _value = await awaiting_approval(store)
    async with served(store, slack) as s:
        for ref in (LINK, thread_id):
            answer = await audit(s, ref, team_id=OTHER_TEAM, team_domain="other")
            assert (answer["text"], answer.get("blocks")) == (NO_SUCH, None)
            grid = await audit(s, ref, enterprise_id="E0OTHER001")  # another org's team id
            assert "blocks" in grid  # the thread records no Grid: its team decides
        for ref in ("thr_00000000000000000000", f"{LINK[:-3]}999"):
            assert (await audit(s, ref))["text"] == NO_SUCH
        usage = (await audit(s, ""))["text"]  # no argument, not in a thread
        assert usage.startswith("Usage: `/opsloop audit THREAD`")
        for junk in ("<!channel>", "https://evil.example/archives/C1/p1", "a b", "x" * 5000):
            answer = await audit(s, junk)
            assert answer["text"].startswith("Usage:") and "<!channel>" not in answer["text"]


async def test_app_home_shows_what_i_decided_newest_first(store: Store, slack: FakeSlack) -> None:
    approved, approve = await awaiting_approval(store)
    rejected, reject = await awaiting_approval(store, root="1700000000.000500", tool="restart")
    untouched, _ = await awaiting_approval(store, root="1700000000.000600", tool="scale")
    async with served(store, slack) as s:
        assert (await s.send(button(BOB, APPROVE_ACTION, approve)))[0] == 200
        assert (await s.send(submission(reject, "not now", view_id="V0REJECT09")))[0] == 200
        assert (await s.send(fake.app_home_opened_event(user=BOB)))[0] == 200
        [call] = await slack.wait_for("views.publish")
        assert (await s.send(fake.app_home_opened_event(user=EVE)))[0] == 200
        calls = await slack.wait_for("views.publish", 2)
    view = call.params["view"]
    assert limits.check_limits(view) == []
    [mine] = [t for t in _texts(view) if t.startswith("*Decided by me*")]
    first, second = mine.splitlines()[1:]
    assert first.startswith("• ❌ rejected *restart* · ") and "p1700000000000500" in first
    assert second.startswith("• ✅ approved *deploy* · ") and "p1700000000000100" in second
    assert "scale" not in mine
    eves = calls[1].params["view"]
    assert calls[1].params["user_id"] == EVE
    assert "*Decided by me*\nYou have not decided anything yet." in _texts(eves)
    decided = [e for e in await store.select_events(rejected) if isinstance(e, ev.ApprovalRejected)]
    assert [(e.actor, e.reason) for e in decided] == [(BOB, "not now")]
    assert approved != untouched


def _texts(view: dict[str, Any]) -> list[str]:
    return [b["text"]["text"] for b in view["blocks"] if b.get("type") == "section"]
