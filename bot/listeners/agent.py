"""Slack's agent surface: the 👍 / 👎 row under a plan's answer, and the session's stop
button (``agent_session_stopped``).

Both are inputs like a click: stored (:mod:`engine.agent_inputs`, deduplicated on the
click's ``action_ts`` or the event's ``event_id``) before the ack. A feedback click on a
message that is no thread of ours, or a stop for such a thread, is acknowledged and
ignored. A stop that may not happen (the thread rests, or the person may not cancel
it) is refused in a note only they see; nothing is stored.
https://docs.slack.dev/reference/events/agent_session_stopped
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners.deps import Deps
from bot.refusals import LOOKUP_FAILED, Refusal
from bot.render.plan import parse_feedback_block
from bot.reviewers import ReviewerLookupError
from engine.agent_inputs import NOT_WORKING, give_feedback, request_stop
from engine.errors import ThreadNotFound
from engine.inputs import Org, Refused
from engine.types import ThreadKey

log = logging.getLogger("opsloop.bot")

NOTHING_TO_STOP = "Nothing to stop: this thread is not working on anything right now."


# --- the feedback row ------------------------------------------------------------------


async def on_feedback(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """👍 / 👎: ``feedback_given`` on the thread whose plan message was clicked."""
    d, clicked = Deps.of(context), p.parse_click(body)
    action = _first_action(body)
    value = action.get("value")
    if isinstance(clicked, str) or value not in ("up", "down"):
        log.info("ignored a feedback click: %s", clicked if isinstance(clicked, str) else value)
        await ack()
        return
    found = await _feedback_thread(d, clicked, action.get("block_id"))
    if found is None:
        await ack()  # a message that is no plan of ours
        return
    thread_id, ts = found
    await give_feedback(
        d.store,
        thread_id,
        ts=ts,
        value=value,
        user=clicked.user,
        dedupe_key=f"click:{clicked.action_ts}",
    )
    await ack()


def _first_action(body: dict[str, Any]) -> dict[str, Any]:
    actions = body.get("actions")
    first = actions[0] if isinstance(actions, list) and actions else None
    return first if isinstance(first, dict) else {}


async def _feedback_thread(d: Deps, clicked: p.Click, block_id: Any) -> tuple[str, str] | None:
    """The thread and message ts a feedback click is about: the row's block_id names
    them (``bot.render.plan.feedback_blocks``), checked against where the click came
    from; else the thread the message is in, found by its Slack key."""
    named = parse_feedback_block(block_id if isinstance(block_id, str) else None)
    ts = clicked.message_ts or (named[1] if named else "")
    if not ts or not clicked.channel:
        return None
    if named is not None:
        try:
            info = await d.store.get_thread(named[0])
        except ThreadNotFound:
            info = None
        if info is not None and info.channel == clicked.channel:
            return info.id, ts
    if clicked.thread_ts is None:
        return None
    for team in clicked.org.teams:
        thread_id = await d.store.find_thread(ThreadKey(team, clicked.channel, clicked.thread_ts))
        if thread_id is not None:
            return thread_id, ts
    return None


# --- the stop button -------------------------------------------------------------------

_Id = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
_Ts = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,20}\.[0-9]{1,12}$")]


class _Stopped(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    type: Literal["agent_session_stopped"]
    user: _Id
    channel: _Id
    thread_ts: _Ts
    event_ts: Annotated[str, StringConstraints(max_length=64)] = ""


class SessionStopped(BaseModel):
    """An ``agent_session_stopped`` delivery with what a stop needs."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    team_id: _Id
    enterprise_id: _Id | None = None
    event_id: Annotated[str, StringConstraints(max_length=64)] | None = None
    event: _Stopped

    @property
    def key(self) -> ThreadKey:
        return ThreadKey(self.team_id, self.event.channel, self.event.thread_ts)

    @property
    def dedupe_key(self) -> str:
        e = self.event
        return f"stop:{self.event_id or f'{e.channel}:{e.thread_ts}:{e.event_ts}'}"


async def on_session_stopped(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """The stop button: ``stop_requested`` by the person who pressed it, checked as
    Cancel is; the runner honours it at its next step boundary."""
    d = Deps.of(context)
    try:
        stopped = SessionStopped.model_validate(body)
    except ValidationError as exc:
        log.info("ignored an agent_session_stopped event: %s", p.first_error(exc))
        await ack()
        return
    thread_id = await d.store.find_thread(stopped.key)
    if thread_id is None:
        await ack()  # a session that is no thread of ours
        return
    user = stopped.event.user
    decider = await d.decider(user, Org((stopped.team_id,), stopped.enterprise_id))
    try:
        result = await request_stop(
            d.store,
            thread_id,
            decider=decider,
            reviewers=d.reviewers,
            dedupe_key=stopped.dedupe_key,
        )
        told = _refusal_words(result) if isinstance(result, Refused) else ""
    except ReviewerLookupError:  # Slack or PagerDuty could not say who they are
        told = LOOKUP_FAILED
    await ack()
    if told:
        _tell(d, client, stopped, told)
    else:
        d.wake(thread_id)


def _refusal_words(refused: Refused) -> str:
    if refused.reason == NOT_WORKING:
        return NOTHING_TO_STOP
    return Refusal.because(refused.reason).text


def _tell(d: Deps, client: AsyncWebClient, stopped: SessionStopped, text: str) -> None:
    """A note only the person who pressed stop sees, in the thread (in the background)."""
    d.background.spawn(
        "chat.postEphemeral",
        client.chat_postEphemeral(
            channel=stopped.event.channel,
            user=stopped.event.user,
            text=text,
            thread_ts=stopped.event.thread_ts,
        ),
    )
