"""The agent surface's inputs through Bolt, signed as Slack signs them, on SQLite and
PostgreSQL: a 👍 / 👎 click is a ``feedback_given`` (any person, once per click), and
the agent session's stop button an ``agent_session_stopped`` event stored as a
``stop_requested`` by whoever may cancel, once per delivery, before the ack."""

from __future__ import annotations

from typing import Any

import pytest

from bot.render.plan import FEEDBACK_ACTION, feedback_blocks
from engine import events as ev
from engine import metrics
from engine.inputs import post_user_message
from engine.store import Store, ThreadKey
from tests.bot.test_app import ANN, CHANNEL, EVE, ROOT, ephemeral_texts, served
from tests.fakes import slack as fake
from tests.fakes.slack import TEAM_ID, FakeSlack

PLAN_TS = "1700000000.000300"


@pytest.fixture
async def slack():
    async with FakeSlack() as s:
        yield s


async def thread(store: Store, *, answered: bool = True) -> str:
    """A thread of ANN's at ROOT: answered (at rest), or still working."""
    done = await post_user_message(
        store, ThreadKey(TEAM_ID, CHANNEL, ROOT), text="check api", user=ANN, dedupe_key="m1"
    )
    if answered:
        state = await store.load(done.thread_id)
        said = [ev.ModelDecision(actor="model", text="ok"), ev.FinalAnswer(text="ok")]
        await store.append(done.thread_id, state.last_seq, said, state=state)
    return done.thread_id


def feedback(
    user: str, value: str, *, block_id: str, action_ts: str | None = None, thread_ts: str = ROOT
) -> dict[str, Any]:
    payload = fake.feedback_buttons_payload(
        user=user,
        action_id=FEEDBACK_ACTION,
        value=value,
        channel=CHANNEL,
        message_ts=PLAN_TS,
        block_id=block_id,
        thread_ts=thread_ts,
    )
    if action_ts is not None:
        payload["actions"][0]["action_ts"] = action_ts
    return payload


def counted(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def of_type(events: list[ev.AnyEvent], cls: type[ev.Event]) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


# --- feedback ---------------------------------------------------------------------------


async def test_a_feedback_click_is_stored_once_by_whoever_clicks(
    store: Store, slack: FakeSlack
) -> None:
    tid = await thread(store)
    [row] = feedback_blocks(tid, PLAN_TS)
    down = counted("opsloop_feedback_total", value="down")
    async with served(store, slack) as s:
        click = feedback(EVE, "down", block_id=row["block_id"], action_ts="1700000100.000001")
        assert (await s.send(click))[0] == 200
        assert (await s.send(click, retry=1))[0] == 200  # Slack delivers it again
        up = feedback(ANN, "up", block_id=row["block_id"], action_ts="1700000100.000002")
        assert (await s.send(up))[0] == 200
    given = of_type(await store.select_events(tid), ev.FeedbackGiven)
    assert [(g.ts, g.value, g.user, g.actor) for g in given] == [
        (PLAN_TS, "down", EVE, EVE),
        (PLAN_TS, "up", ANN, ANN),
    ]
    assert given[0].dedupe_key == "click:1700000100.000001"
    assert counted("opsloop_feedback_total", value="down") == down + 1
    assert (await store.load(tid)).status == "idle"  # no model turn
    assert s.kicks == []


async def test_a_feedback_row_without_its_block_id_is_found_by_the_thread(
    store: Store, slack: FakeSlack
) -> None:
    tid = await thread(store)
    async with served(store, slack) as s:
        assert (await s.send(feedback(EVE, "up", block_id="feedback")))[0] == 200
    [given] = of_type(await store.select_events(tid), ev.FeedbackGiven)
    assert given.value == "up" and given.ts == PLAN_TS


async def test_a_feedback_click_on_no_thread_of_ours_stores_nothing(
    store: Store, slack: FakeSlack
) -> None:
    tid = await thread(store)
    [row] = feedback_blocks("thr_unknown", PLAN_TS)
    async with served(store, slack) as s:
        stray = feedback(EVE, "up", block_id=row["block_id"], thread_ts="1700000999.000100")
        assert (await s.send(stray))[0] == 200
        odd = feedback(EVE, "sideways", block_id=feedback_blocks(tid, PLAN_TS)[0]["block_id"])
        assert (await s.send(odd))[0] == 200
    assert of_type(await store.select_events(tid), ev.FeedbackGiven) == []


# --- the stop button --------------------------------------------------------------------


async def test_the_requester_stops_a_working_thread_once(store: Store, slack: FakeSlack) -> None:
    tid = await thread(store, answered=False)
    stops = counted("opsloop_stops_total")
    async with served(store, slack) as s:
        pressed = slack.press_stop(CHANNEL, ROOT, user=ANN)
        assert (await s.send(pressed))[0] == 200
        assert (await s.send(pressed, retry=1))[0] == 200  # redelivered: stored once
    events = await store.select_events(tid)
    [stop] = of_type(events, ev.StopRequested)
    assert stop.user == ANN and stop.actor == ANN
    assert stop.dedupe_key == f"stop:{pressed['event_id']}"
    assert (await store.load(tid)).status == "idle"  # nothing was running: stopped at once
    assert counted("opsloop_stops_total") == stops + 1
    assert s.kicks == [tid, tid]
    assert ephemeral_texts(slack) == []


async def test_someone_who_may_not_cancel_is_told_and_nothing_is_stored(
    store: Store, slack: FakeSlack
) -> None:
    tid = await thread(store, answered=False)
    async with served(store, slack) as s:
        assert (await s.send(slack.press_stop(CHANNEL, ROOT, user=EVE)))[0] == 200
    assert of_type(await store.select_events(tid), ev.StopRequested) == []
    assert (await store.load(tid)).status == "running"
    assert ephemeral_texts(slack, EVE) == ["Nothing changed: only the requester can stop."]
    assert s.kicks == []


async def test_a_stop_when_nothing_runs_is_refused_politely(store: Store, slack: FakeSlack) -> None:
    tid = await thread(store)
    async with served(store, slack) as s:
        assert (await s.send(slack.press_stop(CHANNEL, ROOT, user=ANN)))[0] == 200
    assert of_type(await store.select_events(tid), ev.StopRequested) == []
    assert ephemeral_texts(slack, ANN) == [
        "Nothing to stop: this thread is not working on anything right now."
    ]
    [note] = slack.ephemerals
    assert note["channel"] == CHANNEL and note.get("thread_ts") == ROOT


async def test_a_stop_for_no_thread_of_ours_or_malformed_is_acknowledged(
    store: Store, slack: FakeSlack
) -> None:
    async with served(store, slack) as s:
        stray = fake.agent_session_stopped_event(
            user=ANN, channel=CHANNEL, thread_ts="1700000999.000100"
        )
        assert (await s.send(stray))[0] == 200
        broken = fake.agent_session_stopped_event(user=ANN, channel=CHANNEL, thread_ts=ROOT)
        del broken["event"]["thread_ts"]
        assert (await s.send(broken))[0] == 200
    assert s.kicks == [] and slack.ephemerals == []
