"""The approval card's buttons, the reject and edit modals, and the status line's Cancel.

Each listener reads the click, asks the engine once (``engine.inputs``: may this person
decide this card now, and if so, decide), wakes the worker and acks. A refusal is raised
as :class:`~bot.refusals.Refusal` and told by the wrapper it is registered with.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.listeners.deps import Deps
from bot.refusals import INVALID_BUTTON, INVALID_FORM, Refusal
from bot.render.common import Binding, parse_binding
from bot.render.edit import edit_modal, error_blocks, read_edit
from bot.render.grants import grant_modal, read_grant
from bot.render.modals import REASON_ACTION, REASON_BLOCK, reject_modal
from engine import events as ev
from engine.errors import ThreadNotFound
from engine.grants import GrantAsk
from engine.inputs import (
    Accepted,
    Decidable,
    Decider,
    Edit,
    Invalid,
    Refused,
    cancel,
    check_decision,
    check_reconcile,
    decide_approval,
    edit_call,
)


async def on_approve(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    result = await _decide(d, binding, decider, "approve", f"click:{clicked.action_ts}")
    await ack()
    accepted(d, result)


async def on_approve_for(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """ "Approve for 1 h": opens the grant's modal, storing nothing, when the clicker may
    approve the call and its rule allows grants; otherwise refused, no modal."""
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    checked = await _check(d, binding, decider, "approve", f"click:{clicked.action_ts}")
    if checked.max_grant_s is None:
        raise Refusal.because("this call's rule allows no standing grants")
    modal = grant_modal(
        thread_id=binding.thread_id,
        tool_call_id=binding.tool_call_id,
        arguments_hash=binding.arguments_hash,
        tool_name=checked.intent,
        arguments=checked.arguments,
        max_grant_s=checked.max_grant_s,
    )
    await ack()
    # The trigger id expires 3 s after the click: open the modal now.
    d.background.spawn("views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal))


async def on_grant_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """The vote and the grant the modal asks for; a choice the call does not allow is
    shown under its input and stores nothing."""
    d, (submitted, binding) = Deps.of(context), form_of(body)
    key = f"view:{submitted.view_id}"
    if await _resent(d, binding, key, ack):
        return
    decider = await d.decider(submitted.user, submitted.org)
    checked = await _check(d, binding, decider, "approve", key)
    if checked.max_grant_s is None:
        raise Refusal.because("this call's rule allows no standing grants")
    values = p.view_values(body.get("view") or {})
    asked = read_grant(values, checked.arguments, checked.max_grant_s)
    if isinstance(asked, dict):
        await ack(response_action="errors", errors=asked)
        return
    result = await _decide(d, binding, decider, "approve", key, grant=asked)
    await ack()  # closes the modal
    accepted(d, result)


async def on_reject(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """Opens the reason modal, storing nothing, when the clicker may reject the card;
    otherwise the refusal is recorded now and no modal opens."""
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    checked = await _check(d, binding, decider, "reject", f"click:{clicked.action_ts}")
    await ack()
    # The trigger id expires 3 s after the click: open the modal now.
    modal = reject_modal(
        thread_id=binding.thread_id,
        tool_call_id=binding.tool_call_id,
        arguments_hash=binding.arguments_hash,
        tool_name=checked.intent,
    )
    d.background.spawn("views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal))


async def on_reject_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    d, (submitted, binding) = Deps.of(context), form_of(body)
    decider = await d.decider(submitted.user, submitted.org)
    reason = p.view_value(body.get("view") or {}, REASON_BLOCK, REASON_ACTION)
    result = await _decide(d, binding, decider, "reject", f"view:{submitted.view_id}", reason)
    await ack()  # closes the modal
    accepted(d, result)


async def on_edit(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """Opens the arguments modal, storing nothing, when the clicker may approve the call
    (who may edit it); otherwise the refusal is recorded now and no modal opens."""
    d, clicked = Deps.of(context), click_of(body)
    binding = binding_of(clicked.value, INVALID_BUTTON)
    decider = await d.decider(clicked.user, clicked.org)
    checked = await _check(d, binding, decider, "edit", f"click:{clicked.action_ts}")
    schema = _schema(d, checked.intent)
    modal = edit_modal(
        thread_id=binding.thread_id,
        tool_call_id=binding.tool_call_id,
        arguments_hash=binding.arguments_hash,
        tool_name=checked.intent,
        schema=schema,
        arguments=checked.arguments,
    )
    if modal is None:
        raise Refusal("Nothing changed: these arguments are too large to edit in Slack.")
    await ack()
    # The trigger id expires 3 s after the click: open the modal now.
    d.background.spawn("views.open", client.views_open(trigger_id=clicked.trigger_id, view=modal))


async def on_edit_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    """Saves the edit (and the editor's vote with "Save and approve"); arguments that do
    not fit the tool's schema keep the modal open, each error under its input, and
    store nothing."""
    d, (submitted, binding) = Deps.of(context), form_of(body)
    values = p.view_values(body.get("view") or {})
    # Slack resends the same submission alike; a corrected one is another input.
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]
    key = f"view:{submitted.view_id}:{digest}"
    if await _resent(d, binding, key, ack):
        return
    decider = await d.decider(submitted.user, submitted.org)
    checked = await _check(d, binding, decider, "edit", key)
    schema = _schema(d, checked.intent)
    form = read_edit(schema, values)
    if form.errors:
        await ack(response_action="errors", errors=form.errors)
        return
    edit = Edit(
        binding.thread_id,
        binding.tool_call_id,
        form.arguments,
        binding.arguments_hash,
        approve=form.approve,
        dedupe_key=key,
    )
    assert d.tools is not None  # _schema found the tool
    result = await edit_call(
        d.store, edit, decider=decider, tools=d.tools, policies=d.policy, reviewers=d.reviewers
    )
    if isinstance(result, Invalid):
        await ack(response_action="errors", errors=error_blocks(schema, values, result.errors))
        return
    await ack()  # closes the modal
    accepted(d, result)


async def _resent(d: Deps, binding: Binding, key: str, ack: AsyncAck) -> bool:
    """Was this submission stored already (Slack resends one alike)? Then it is acked
    again, or its refusal told again."""
    if (seen := await d.store.find_by_dedupe_key(binding.thread_id, key)) is None:
        return False
    if isinstance(seen, ev.ApprovalRefused):
        raise Refusal.because(seen.reason)
    await ack()
    d.wake(binding.thread_id)
    return True


async def _check(
    d: Deps,
    binding: Binding,
    decider: Decider,
    decision: ev.ApprovalDecision | Literal["edit", "happened"],
    key: str,
) -> Decidable:
    """May ``decider`` make ``decision`` on the bound call now (before a modal opens)?
    The call if so; a refusal is recorded by the engine and raised here, so a clicker
    who may not decide never fills a modal only to be refused. The one step before the
    reject, edit and grant modals and the reconcile card's note modal (``happened``)."""
    if decision == "happened":
        checked = await check_reconcile(
            d.store,
            binding.thread_id,
            tool_call_id=binding.tool_call_id,
            decider=decider,
            reviewers=d.reviewers,
            arguments_hash=binding.arguments_hash,
            dedupe_key=key,
        )
    else:
        checked = await check_decision(
            d.store,
            binding.thread_id,
            tool_call_id=binding.tool_call_id,
            decider=decider,
            decision=decision,
            reviewers=d.reviewers,
            arguments_hash=binding.arguments_hash,
            dedupe_key=key,
        )
    if isinstance(checked, Refused):
        raise Refusal.because(checked.reason)
    return checked


def _schema(d: Deps, intent: str) -> dict[str, Any]:
    """The JSON Schema of the tool ``intent``'s arguments, if this process has it."""
    found = d.tools.get(intent) if d.tools is not None else None
    if found is None:
        why = f"{intent} is not loaded here, so its arguments cannot be edited"
        raise Refusal.because(why)
    return found.input_schema()


async def on_cancel(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
) -> None:
    d, clicked = Deps.of(context), click_of(body)
    thread_id = clicked.value.strip()
    dedupe_key = f"click:{clicked.action_ts}"
    if not thread_id:
        raise ThreadNotFound("no thread id on the button")
    if await d.store.find_by_dedupe_key(thread_id, dedupe_key) is not None:
        await ack()  # a redelivered click: told already
        d.wake(thread_id)
        return
    decider = await d.decider(clicked.user, clicked.org)
    result = await cancel(
        d.store,
        thread_id,
        reviewers=d.reviewers,
        decider=decider,
        dedupe_key=dedupe_key,
    )
    await ack()
    accepted(d, result)


def click_of(body: dict[str, Any]) -> p.Click:
    clicked = p.parse_click(body)
    if isinstance(clicked, str):
        raise Refusal(INVALID_BUTTON)
    return clicked


def form_of(body: dict[str, Any]) -> tuple[p.Submission, Binding]:
    """A submitted card modal and the call its private metadata binds it to."""
    submitted = p.parse_submission(body)
    if isinstance(submitted, str):
        raise Refusal(INVALID_FORM)
    return submitted, binding_of(submitted.private_metadata, INVALID_FORM)


def binding_of(value: str, invalid: str) -> Binding:
    try:
        return parse_binding(value)
    except ValueError:
        raise Refusal(invalid) from None


async def _decide(
    d: Deps,
    binding: Binding,
    decider: Decider,
    decision: ev.ApprovalDecision,
    dedupe_key: str,
    reason: str = "",
    grant: GrantAsk | None = None,
) -> Accepted:
    """``decision`` on exactly the call the card was made for; refusals raised."""
    result = await decide_approval(
        d.store,
        binding.thread_id,
        tool_call_id=binding.tool_call_id,
        decision=decision,
        reviewers=d.reviewers,
        reason=reason,
        arguments_hash=binding.arguments_hash,
        decider=decider,
        dedupe_key=dedupe_key,
        grant=grant,
    )
    if isinstance(result, Refused):
        raise Refusal.because(result.reason)
    return result


def accepted(d: Deps, result: Accepted | Refused) -> None:
    if isinstance(result, Refused):
        raise Refusal.because(result.reason)
    d.wake(result.thread_id)
