"""People's messages: a mention or a DM starts a thread; a reply in ours continues it.

What lacks what a thread needs (a channel, a ts, a person as author) is acknowledged
and ignored with one log line: Slack would retry a 4xx to no end.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot import payloads as p
from bot.listeners.deps import Deps
from engine.errors import ThreadNotFound
from engine.inputs import post_user_message

log = logging.getLogger("opsloop.bot")


async def on_mention(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
    message = _message(body)
    if message is not None and p.is_from_a_person(message.event.model_dump(), context.bot_user_id):
        await _store(Deps.of(context), message, context.bot_user_id, start=True)
    await ack()


async def on_message(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
    event = body.get("event") or {}
    kind = p.message_kind(event, context.bot_user_id)
    message = _message(body) if kind != "ignore" else None
    if message is not None:
        # A reply counts only in a thread the bot owns; a DM starts one.
        await _store(Deps.of(context), message, context.bot_user_id, start=kind == "dm")
    await ack()  # everything else is deliberately ignored, with a 200


def _message(body: dict[str, Any]) -> p.Message | None:
    message = p.parse_message(body)
    if isinstance(message, str):
        log.info("ignored a message event without what a thread needs: %s", message)
        return None
    return message


async def _store(d: Deps, message: p.Message, bot_user_id: str | None, *, start: bool) -> None:
    """A person's message as a ``user_message`` (or the answer to an open question).
    ``start``: a message outside any thread of ours starts one; else it is ignored."""
    text = p.mention_text(message.event.text, bot_user_id)
    mentioned = p.mentioned_users(text, bot_user_id)
    if mentioned and not start and await d.store.find_thread(message.key) is None:
        return  # a reply in a thread that is not ours: no Slack lookups for chatter
    names = await d.names.of(mentioned)
    try:
        done = await post_user_message(
            d.store,
            message.key,
            text=text,
            user=message.event.user,
            dedupe_key=message.dedupe_key,
            source=message.source(names),
            start=start,
            fresh=start and message.key.root_ts == message.event.ts,
        )
    except ThreadNotFound:
        return  # a reply in a thread that is not ours
    d.wake(done.thread_id)
