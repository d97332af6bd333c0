"""Inputs from Slack's agent surface: the session's stop button and the 👍 / 👎 row.

Like :mod:`engine.inputs`, each appends one event (deduplicated by its delivery key) in
one short transaction and returns at once; counted in ``/metrics`` when stored.

- :func:`request_stop`: ``stop_requested``, while the thread works (running or waiting
  on a retry's timer), by whoever may cancel it (:func:`engine.inputs.may_decide`). A
  refusal stores nothing: the thread may be mid-step, and its runner should not meet
  a conflict for a click that changed nothing.
- :func:`give_feedback`: ``feedback_given``, from anyone in the thread's channel.
"""

from __future__ import annotations

from typing import Literal

from engine import events as ev
from engine import metrics
from engine.errors import IllegalTransition
from engine.inputs import (  # this module is engine.inputs' own, split for size
    Accepted,
    Decider,
    DecisionRequest,
    Refused,
    _append_one,
    _seen,
    may_decide,
)
from engine.retrying import retrying
from engine.reviewers import ReviewerRule
from engine.store import Store

WORKING = frozenset({"running", "sleeping"})
NOT_WORKING = "the thread is not working on anything right now"


async def request_stop(
    store: Store,
    thread_id: str,
    *,
    decider: Decider,
    reviewers: ReviewerRule,
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """Stop the thread's run at its next step boundary (``engine.state``): allowed to
    whoever may cancel it, while it works."""

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen
        state = await store.load(thread_id)
        if state.status not in WORKING:
            return Refused(thread_id, NOT_WORKING)
        call_id = state.pending.tool_call_id if state.pending else None
        request = DecisionRequest(thread_id, decider, "cancel", call_id, dedupe_key=dedupe_key)
        if (why := await may_decide(store, state, request, reviewers)) is not None:
            # Who may stop is who may cancel; the words say what was pressed.
            return Refused(thread_id, why.replace("cancel", "stop"))
        event = ev.StopRequested(actor=decider.user, user=decider.user, dedupe_key=dedupe_key)
        try:
            return _counted(await _append_one(store, thread_id, state, event))
        except IllegalTransition:
            return Refused(thread_id, NOT_WORKING)

    return await retrying(once)


async def give_feedback(
    store: Store,
    thread_id: str,
    *,
    ts: str,
    value: Literal["up", "down"],
    user: str,
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """Record ``user``'s 👍 (``up``) or 👎 (``down``) on the plan message at ``ts``."""

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen
        state = await store.load(thread_id)
        if state.status == "new":
            return Refused(thread_id, "the thread has no answer yet")
        event = ev.FeedbackGiven(actor=user, ts=ts, value=value, user=user, dedupe_key=dedupe_key)
        return _counted(await _append_one(store, thread_id, state, event))

    return await retrying(once)


def _counted(accepted: Accepted) -> Accepted:
    """Counted in /metrics once, as it is stored (a redelivery is not counted again)."""
    if not accepted.deduplicated:
        metrics.count_inputs([accepted.event])
    return accepted
