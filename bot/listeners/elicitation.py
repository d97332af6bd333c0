"""The buttons of an MCP server's question (Answer, Decline, Cancel, the url mode's link)
and the answer's modal.

Only the thread's requester may answer (anyone in the thread when it has none, as a
thread an alert opened), from the thread's Slack team. Answer opens the modal built from
the requested schema (``views.open`` with the click's trigger id), storing nothing; the
submission is read and checked against the schema (errors under their inputs), then
stored as ``wait_finished`` with ``{"action": "accept", "content": …}`` before the ack,
deduplicated by the view; Decline and Cancel store ``{"action": "decline"}`` and
``{"action": "cancel"}``, the link's click ``{"action": "accept"}``, deduplicated by the
click. The runner, woken, gives the answer to the server.
"""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners.approvals import accepted, click_of
from bot.listeners.deps import Deps
from bot.mrkdwn import mention
from bot.refusals import INVALID_BUTTON, INVALID_FORM, Listener, Refusal, plain
from bot.render.elicitation import form_modal, parse_ask, read_form
from engine.errors import ThreadNotFound
from engine.inputs import Accepted, Org, finish_wait, why_not_same_org
from tools.mcp.elicitation import Question, question_of

CLOSED = "this question is no longer open (answered, cancelled or expired)"


async def on_answer(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """Opens the answer's modal, storing nothing, when the clicker may answer."""
    d, clicked = Deps.of(context), click_of(body)
    thread_id, wait_id = _binding(clicked.value, INVALID_BUTTON)
    asked = await _open_question(d, thread_id, wait_id, clicked.user, clicked.org)
    modal = form_modal(thread_id, wait_id, asked)
    if modal is None:
        raise Refusal("This form cannot be filled in Slack: decline or cancel it instead.")
    await ack()
    # The trigger id expires 3 s after the click: open the modal now.
    d.background.spawn("views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal))


async def on_decline(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    await _clicked(ack, body, context, {"action": "decline"})


async def on_cancel(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    await _clicked(ack, body, context, {"action": "cancel"})


async def on_open(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """The url mode's link button: Slack opens the page; the click is the requester's
    consent (accept). Anybody else's click opens the page and changes nothing."""
    await _clicked(ack, body, context, {"action": "accept"})


async def _clicked(
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, result: dict[str, Any]
) -> None:
    d, clicked = Deps.of(context), click_of(body)
    thread_id, wait_id = _binding(clicked.value, INVALID_BUTTON)
    key = f"click:{clicked.action_ts}"
    if await d.store.find_by_dedupe_key(thread_id, key) is not None:
        await ack()  # a redelivered click: stored already
        d.wake(thread_id)
        return
    await _open_question(d, thread_id, wait_id, clicked.user, clicked.org)
    stored = await _answer(d, thread_id, wait_id, clicked.user, result, key)
    await ack()
    accepted(d, stored)


async def on_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """The modal's answer: stored once it fits the requested schema; otherwise each
    error is shown under its input and nothing is stored."""
    d = Deps.of(context)
    submitted = p.parse_submission(body)
    if isinstance(submitted, str):
        raise Refusal(INVALID_FORM)
    thread_id, wait_id = _binding(submitted.private_metadata, INVALID_FORM)
    key = f"view:{submitted.view_id}"
    if await d.store.find_by_dedupe_key(thread_id, key) is not None:
        await ack()  # Slack resent it: stored already
        d.wake(thread_id)
        return
    asked = await _open_question(d, thread_id, wait_id, submitted.user, submitted.org)
    read = read_form(asked.schema, p.view_values(body.get("view") or {}))
    if read.errors:
        await ack(response_action="errors", errors=read.errors)
        return
    result = {"action": "accept", "content": read.content}
    stored = await _answer(d, thread_id, wait_id, submitted.user, result, key)
    await ack()  # closes the modal
    accepted(d, stored)


def shown_on_form(listener: Listener) -> Listener:
    """``on_submitted`` with its refusals told in the modal: under its first input, or,
    a form without one, in the modal's place."""

    async def submission(
        ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        try:
            await listener(ack, body, client, context)
        except (Refusal, ThreadNotFound) as exc:
            why = exc.plain if isinstance(exc, Refusal) else INVALID_FORM
            first = _first_input(body)
            if first:
                await ack(response_action="errors", errors={first: plain(why)})
            else:
                await ack(response_action="update", view=_told(why))

    submission.__name__ = listener.__name__
    return submission


def _first_input(body: dict[str, Any]) -> str:
    view = body.get("view")
    blocks = view.get("blocks") if isinstance(view, dict) else None
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, dict) and block.get("type") == "input":
            found = block.get("block_id")
            return found if isinstance(found, str) else ""
    return ""


def _told(why: str) -> dict[str, Any]:
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Answer"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [{"type": "section", "text": {"type": "plain_text", "text": plain(why)}}],
    }


def _binding(value: str, invalid: str) -> tuple[str, str]:
    try:
        return parse_ask(value)
    except ValueError:
        raise Refusal(invalid) from None


async def _open_question(
    d: Deps, thread_id: str, wait_id: str, user: str, org: Org | None
) -> Question:
    """The question of the open wait ``wait_id``, if ``user`` may answer it now."""
    state = await d.store.load(thread_id)
    call = state.pending
    wait = call.wait if call is not None else None
    if state.status != "awaiting_job" or wait is None or wait.wait_id != wait_id:
        raise Refusal.because(CLOSED)
    asked = question_of(wait.data)
    if asked is None:
        raise Refusal(INVALID_BUTTON)
    if (why := await why_not_same_org(d.store, thread_id, org)) is not None:
        raise Refusal.because(why)
    if state.requester is not None and user != state.requester:
        raise Refusal(
            f"Nothing changed: only {mention(state.requester)}, who asked in this thread, "
            "can answer this question.",
            "Nothing changed: only the person who asked in this thread can answer it.",
        )
    return asked


async def _answer(
    d: Deps, thread_id: str, wait_id: str, user: str, result: dict[str, Any], key: str
) -> Accepted:
    stored = await finish_wait(
        d.store, thread_id, wait_id=wait_id, result=result, actor=user, dedupe_key=key
    )
    if not isinstance(stored, Accepted):
        raise Refusal.because(CLOSED)
    return stored
