"""The Bolt listeners, module-level functions with typed Bolt arguments.

:func:`register` wires them to an app: each reads its payload (:mod:`bot.payloads`),
makes one front-door call of :mod:`engine.inputs`, then acks. Refusals are raised and
told in one place (:mod:`bot.refusals`). Every other event, action, view, shortcut,
dialog or options request gets a deliberate 2xx: an unmatched request is answered 404,
and Slack retries those.
"""

from __future__ import annotations

import re
from typing import Any

from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.async_context import AsyncBoltContext

from bot.listeners import agent, approvals, commands, elicitation, grants, messages, reconcile
from bot.listeners.deps import CONTEXT_KEY, Deps
from bot.refusals import shown_in_modal, told_privately
from bot.render.approval import APPROVE_ACTION, EDIT_ACTION, GRANT_ACTION, REJECT_ACTION
from bot.render.edit import APPROVE_BLOCK, EDIT_CALLBACK
from bot.render.elicitation import (
    ANSWER_ACTION,
    DECLINE_ACTION,
    FORM_CALLBACK,
    OPEN_ACTION,
)
from bot.render.elicitation import CANCEL_ACTION as ELICIT_CANCEL_ACTION
from bot.render.grants import GRANT_CALLBACK, REVOKE_ACTION, SPAN_BLOCK
from bot.render.modals import NOTE_BLOCK, NOTE_CALLBACK, REJECT_CALLBACK
from bot.render.plan import FEEDBACK_ACTION
from bot.render.reconcile import ABANDON_ACTION, HAPPENED_ACTION, RETRY_ACTION
from bot.render.status import CANCEL_ACTION

ANY = re.compile(".*")


async def ignore(ack: AsyncAck) -> None:
    await ack()


async def ignore_options(ack: AsyncAck) -> None:
    await ack(options=[])


def register(app: AsyncApp, deps: Deps) -> None:
    async def bind_deps(context: AsyncBoltContext, next: Any) -> Any:
        context[CONTEXT_KEY] = deps
        return await next()

    app.use(bind_deps)
    app.event("app_mention")(messages.on_mention)
    app.event("message")(messages.on_message)
    app.event("app_home_opened")(commands.on_home_opened)
    # Slack's stop button on the thread's agent session, and the 👍 / 👎 under an answer.
    app.event("agent_session_stopped")(agent.on_session_stopped)
    app.action(FEEDBACK_ACTION)(agent.on_feedback)
    app.action(APPROVE_ACTION)(told_privately(approvals.on_approve, deps.notify))
    app.action(GRANT_ACTION)(told_privately(approvals.on_approve_for, deps.notify))
    app.action(REVOKE_ACTION)(told_privately(grants.on_revoke, deps.notify))
    app.action(REJECT_ACTION)(told_privately(approvals.on_reject, deps.notify))
    app.action(EDIT_ACTION)(told_privately(approvals.on_edit, deps.notify))
    app.action(CANCEL_ACTION)(told_privately(approvals.on_cancel, deps.notify))
    app.view(REJECT_CALLBACK)(shown_in_modal(approvals.on_reject_submitted))
    app.view(GRANT_CALLBACK)(shown_in_modal(approvals.on_grant_submitted, SPAN_BLOCK))
    # A refused edit is told under the modal's one input it always has.
    app.view(EDIT_CALLBACK)(shown_in_modal(approvals.on_edit_submitted, APPROVE_BLOCK))
    app.action(HAPPENED_ACTION)(told_privately(reconcile.on_happened, deps.notify))
    app.action(RETRY_ACTION)(told_privately(reconcile.on_retry, deps.notify))
    app.action(ABANDON_ACTION)(told_privately(reconcile.on_abandon, deps.notify))
    app.view(NOTE_CALLBACK)(shown_in_modal(reconcile.on_note_submitted, NOTE_BLOCK))
    app.action(ANSWER_ACTION)(told_privately(elicitation.on_answer, deps.notify))
    app.action(DECLINE_ACTION)(told_privately(elicitation.on_decline, deps.notify))
    app.action(ELICIT_CANCEL_ACTION)(told_privately(elicitation.on_cancel, deps.notify))
    app.action(OPEN_ACTION)(told_privately(elicitation.on_open, deps.notify))
    app.view(FORM_CALLBACK)(elicitation.shown_on_form(elicitation.on_submitted))
    app.command(re.compile(r"^/"))(commands.on_command)
    # Everything else: a deliberate 2xx.
    app.event(ANY)(ignore)
    app.action(ANY)(ignore)
    app.view(ANY)(ignore)
    app.view_closed(ANY)(ignore)
    app.shortcut(ANY)(ignore)
    app.dialog_submission(ANY)(ignore)
    app.dialog_cancellation(ANY)(ignore)
    app.options(ANY)(ignore_options)
    app.dialog_suggestion(ANY)(ignore_options)
