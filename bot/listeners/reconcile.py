"""The reconcile card's buttons and its note modal: a person says what became of a call
whose outcome is unknown.

**It happened** takes the step every modal takes first (``approvals._check``: may this
person decide now) and opens the note modal, storing nothing (a refusal is recorded and
told, and no modal opens); its submission decides ``happened`` with the note. **Run it
again** and **It did not happen** decide at once. Every decision is ``decide_reconcile``
on exactly the call the card names; a refusal is raised as
:class:`~bot.refusals.Refusal` and told by the wrapper it is registered with.
"""

from __future__ import annotations

from typing import Any

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners.approvals import _check, accepted, binding_of, click_of, form_of
from bot.listeners.deps import Deps
from bot.refusals import INVALID_BUTTON, Refusal
from bot.render.modals import NOTE_ACTION, NOTE_BLOCK, note_modal
from engine import events as ev
from engine.inputs import Refused, decide_reconcile


async def on_happened(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """Opens the note modal when the clicker may decide; otherwise says why not."""
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    # The step the reject and edit modals take first: a refusal is recorded and told,
    # and no modal opens (the requester was refused only after writing the note).
    checked = await _check(d, binding, decider, "happened", f"click:{clicked.action_ts}")
    await ack()
    # The trigger id expires 3 s after the click: open the modal now.
    modal = note_modal(
        thread_id=binding.thread_id,
        tool_call_id=binding.tool_call_id,
        arguments_hash=binding.arguments_hash,
        tool_name=checked.intent,
    )
    d.background.spawn("views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal))


async def on_retry(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    await _decide_click(ack, body, context, "retry")


async def on_abandon(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    await _decide_click(ack, body, context, "abandon")


async def on_note_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    d, (submitted, binding) = Deps.of(context), form_of(body)
    decider = await d.decider(submitted.user, submitted.org)
    note = p.view_value(body.get("view") or {}, NOTE_BLOCK, NOTE_ACTION)
    result = await decide_reconcile(
        d.store,
        binding.thread_id,
        tool_call_id=binding.tool_call_id,
        decider=decider,
        decision="happened",
        note=note,
        reviewers=d.reviewers,
        arguments_hash=binding.arguments_hash,
        dedupe_key=f"view:{submitted.view_id}",
    )
    if isinstance(result, Refused):
        raise Refusal.because(result.reason)
    await ack()  # closes the modal
    accepted(d, result)


async def _decide_click(
    ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext, decision: ev.ReconcileDecision
) -> None:
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    result = await decide_reconcile(
        d.store,
        binding.thread_id,
        tool_call_id=binding.tool_call_id,
        decider=decider,
        decision=decision,
        reviewers=d.reviewers,
        arguments_hash=binding.arguments_hash,
        dedupe_key=f"click:{clicked.action_ts}",
    )
    if isinstance(result, Refused):
        raise Refusal.because(result.reason)
    await ack()
    accepted(d, result)
