"""Refusals in one place: a listener raises :class:`Refusal`; one wrapper acks and tells.

A click refused (not the clicker's to decide, a forged button, a lookup that failed) is
acknowledged with a 200 and the clicker is told privately (``chat.postEphemeral``); a
modal's submission refused stays open with the reason under its field
(``response_action=errors``). ``ThreadNotFound`` (a button naming no thread) and
``ReviewerLookupError`` (Slack could not say who is in a group, PagerDuty who is on
call) are refusals too.
Anything else propagates: Bolt answers 500 and Slack delivers again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot.mrkdwn import escape, mention
from bot.render.modals import REASON_BLOCK
from bot.reviewers import ReviewerLookupError
from engine.errors import ThreadNotFound

log = logging.getLogger("opsloop.bot")

INVALID_BUTTON = "This button is not valid (it does not belong to a pending call). Nothing changed."
INVALID_FORM = "This form is not valid."
LOOKUP_FAILED = (
    "I could not check your user groups with Slack just now. Nothing changed: try again "
    "in a minute."
)
ON_CALL_LOOKUP_FAILED = (
    "I could not check who is on call ({entries}) with PagerDuty just now. Nothing changed: "
    "try again in a minute."
)
ON_CALL_UNCONNECTED = (
    "Whoever is on call ({entries}) may decide this, but PagerDuty is not connected here "
    "(integrations.pagerduty in opsloop.yaml), so I cannot check who that is. Nothing changed."
)


_BY_USER = re.compile(r"\bby ([UW][A-Z0-9]{2,})\b")


class Refusal(Exception):
    """Nothing changed; ``text`` (mrkdwn, escaped) tells the person why, ``plain`` says
    it where mrkdwn does not render (a modal's error)."""

    def __init__(self, text: str, plain: str | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.plain = plain or text

    @classmethod
    def because(cls, reason: str) -> Refusal:
        """The engine's ``reason``, e.g. "already approved by U1 at 12:03 UTC"."""
        reason = reason.rstrip(".")
        text = _BY_USER.sub(lambda m: f"by {mention(m.group(1))}", escape(reason))
        return cls(f"Nothing changed: {text}.", f"Nothing changed: {reason}.")


Listener = Callable[[AsyncAck, dict[str, Any], AsyncWebClient, AsyncBoltContext], Awaitable[None]]
Notify = Callable[[AsyncWebClient, AsyncBoltContext, dict[str, Any], str], None]


def _why(exc: Exception, *, plain: bool = False) -> str:
    if isinstance(exc, Refusal):
        return exc.plain if plain else exc.text
    if isinstance(exc, ReviewerLookupError):
        return _lookup_failed(exc)
    return INVALID_BUTTON


def _lookup_failed(exc: ReviewerLookupError) -> str:
    """What failed, said so that the person knows whom to ask (plain: no mrkdwn in it)."""
    if exc.unconnected:
        return ON_CALL_UNCONNECTED.format(entries=_ids(exc.unconnected))
    if exc.on_call:
        return ON_CALL_LOOKUP_FAILED.format(entries=_ids(exc.on_call))
    return LOOKUP_FAILED


def _ids(entries: tuple[str, ...]) -> str:
    return ", ".join(escape(e.removeprefix("oncall:")) for e in entries)


def told_privately(listener: Listener, notify: Notify) -> Listener:
    """``listener`` for a click: a refusal is acked and told to the clicker alone."""

    async def click(
        ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        try:
            await listener(ack, body, client, context)
        except (Refusal, ThreadNotFound, ReviewerLookupError) as exc:
            if ack.response is None:
                await ack()
            notify(client, context, body, _why(exc))

    click.__name__ = listener.__name__
    return click


def shown_in_modal(listener: Listener, field: str = REASON_BLOCK) -> Listener:
    """``listener`` for a modal: a refusal keeps it open, the reason under its input
    block ``field`` (the reject modal's reason, the reconcile modal's note)."""

    async def submission(
        ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        try:
            await listener(ack, body, client, context)
        except (Refusal, ThreadNotFound, ReviewerLookupError) as exc:
            why = INVALID_FORM if isinstance(exc, ThreadNotFound) else _why(exc, plain=True)
            await ack(response_action="errors", errors={field: plain(why)})

    submission.__name__ = listener.__name__
    return submission


def plain(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` (a modal's error is plain text)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
