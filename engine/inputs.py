"""Front-door functions: how people and other systems feed a thread.

Each one appends one input event (deduplicated by its delivery key) in one short
transaction and returns at once; the caller then kicks the runner. None of them calls
the model or a tool. Concurrent inputs meet ``ConcurrencyConflict`` and re-read
(:func:`engine.retrying.retrying`, the writers' one retry helper).

Whether a person may decide something is asked in one place, :func:`may_decide`: every
click (approve, the reject button before its modal, the modal's submission, the
reconcile buttons, cancel) goes through it, and so does the decision itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from engine import events as ev
from engine.alerts import pending_root
from engine.edits import GENERAL, after_edit, field_errors
from engine.errors import ConcurrencyConflict, ThreadNotFound
from engine.events import utcnow
from engine.grants import GrantAsk, new_grant_id
from engine.policy import Registry, ToolLike
from engine.policy import arguments_hash as call_hash
from engine.retrying import retrying
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.state import PendingCall, ThreadState, apply
from engine.store import Store, ThreadKey
from tools.output import storable
from tools.schemas import instance_too_large

# Which of these entries hold the user (the S… user groups they are in, the oncall:<id>
# entries they are on call for now); may raise (the front door maps its lookup error to
# "try again").
GroupResolver = Callable[[frozenset[str]], Awaitable[frozenset[str]]]


@dataclass(frozen=True)
class Org:
    """The organisation a person acts from, as a team-scoped front door (Slack) says it.

    ``teams``: every team id the input names (Slack: the payload's ``team.id`` and the
    user's ``team_id``); each must be the thread's team. ``enterprise``: an Enterprise
    Grid id, compared with the thread's (``source["enterprise"]`` of its first
    ``user_message``) when both have one. Team ids are unique across Slack, so a matching
    team already implies the same enterprise; the comparison is a second lock, not a
    relaxation: a person from another workspace of the same Grid is refused too.
    """

    teams: tuple[str, ...]
    enterprise: str | None = None


@dataclass(frozen=True)
class Decider:
    """Who decides: a user, the approver groups they are in (and on-call entries they
    are on call for), and where they act from (None: a front door without teams, such
    as the CLI or a test)."""

    user: str
    groups: frozenset[str] = frozenset()
    org: Org | None = None
    # Called with a call's looked-up approver entries (groups, on-call) when ``groups``
    # may not cover them (a rule's own approvers); None: ``groups`` is all there is.
    resolve: GroupResolver | None = None


@dataclass(frozen=True)
class DecisionRequest:
    """One person's decision on a thread, as a front door hands it in: which call (None
    for a cancel), with which arguments (the card's hash), deduplicated by the click."""

    thread_id: str
    decider: Decider
    decision: ev.RefusedDecision
    tool_call_id: str | None = None
    arguments_hash: str | None = None
    dedupe_key: str | None = None
    now: datetime | None = None


@dataclass(frozen=True)
class Decidable:
    """A call that ``Decider`` may decide now (nothing was stored), with the arguments
    it has now (what an edit starts from)."""

    thread_id: str
    tool_call_id: str
    intent: str
    arguments: dict[str, Any] = field(default_factory=dict)
    max_grant_s: float | None = None  # a grant's longest span (None: none allowed)


@dataclass(frozen=True)
class Accepted:
    """An input stored (or found stored: ``deduplicated``)."""

    thread_id: str
    event: ev.AnyEvent
    deduplicated: bool = False


@dataclass(frozen=True)
class Refused:
    """An input that may not change the thread; ``event`` is the audit record, if any."""

    thread_id: str
    reason: str
    event: ev.AnyEvent | None = None


@dataclass(frozen=True)
class Invalid:
    """Arguments an edit may not give a call, nothing stored: what is wrong, by top-level
    argument (``engine.edits.GENERAL`` for what is about none)."""

    thread_id: str
    errors: dict[str, str]


async def _append_one(
    store: Store, thread_id: str, state: ThreadState, event: ev.Event
) -> Accepted:
    done = await store.append(thread_id, state.last_seq, [event], state=state)
    return Accepted(thread_id, done.events[0], done.deduplicated)


async def post_user_message(
    store: Store,
    key: ThreadKey,
    *,
    text: str,
    user: str,
    dedupe_key: str | None = None,
    source: dict[str, Any] | None = None,
    start: bool = True,
    fresh: bool = False,
) -> Accepted:
    """A person wrote in the thread at ``key``, created if new (``ThreadNotFound``
    instead, writing nothing, when ``start`` is false). While the thread waits for a
    clarification, the message is the answer. While the requester's own call waits for
    a reviewer, their message withdraws it (``approval_withdrawn``, in the same
    transaction, so no click can approve it after): they changed their mind or added
    to the request, and the model decides again. ``fresh``: the message is its thread's
    root, so the thread is most likely new (``Store.append_input``). The accepted event
    is the message."""

    def build(state: ThreadState) -> list[ev.Event]:
        if state.status == "awaiting_reply" and state.question is not None:
            answer = ev.ClarificationAnswered(
                actor=user,
                tool_call_id=state.question.tool_call_id,
                text=text,
                source=source or {},
                dedupe_key=dedupe_key,
            )
            return [answer]
        message = ev.UserMessage(actor=user, text=text, source=source or {}, dedupe_key=dedupe_key)
        call = state.pending
        if (
            state.status == "awaiting_approval"
            and call is not None
            and call.phase == "awaiting_approval"
            and user == state.requester
        ):
            why = f"superseded by a newer message from <@{user}>"
            withdrawn = ev.ApprovalWithdrawn(actor=user, tool_call_id=call.tool_call_id, reason=why)
            return [withdrawn, message]
        return [message]

    async def once() -> Accepted:
        thread_id, done = await store.append_input(
            key, build, dedupe_key=dedupe_key, start=start, fresh=fresh
        )
        return Accepted(thread_id, done.events[-1], done.deduplicated)

    return await retrying(once)


async def answer_clarification(
    store: Store, thread_id: str, *, text: str, user: str, dedupe_key: str | None = None
) -> Accepted | Refused:
    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await store.find_by_dedupe_key(thread_id, dedupe_key)):
            return Accepted(thread_id, seen, deduplicated=True)
        state = await store.load(thread_id)
        if state.status != "awaiting_reply" or state.question is None:
            return Refused(thread_id, "the thread is not waiting for an answer")
        event = ev.ClarificationAnswered(
            actor=user, tool_call_id=state.question.tool_call_id, text=text, dedupe_key=dedupe_key
        )
        return await _append_one(store, thread_id, state, event)

    return await retrying(once)


def reviewer_rule(call: PendingCall | None, default: ReviewerRule) -> ReviewerRule:
    """Who may decide ``call`` (its approval votes, its reconcile, a cancel while it is
    pending): the rule recorded with it, or ``default`` (the process's) for a call from
    before rules were recorded. ``oncall:<id>`` entries match whoever is on call at the
    click (:func:`_groups_for`)."""
    if call is None or call.reviewers is None:
        return default
    return call.reviewers


async def _groups_for(decider: Decider, rule: ReviewerRule) -> frozenset[str]:
    """The decider's entries among ``rule``'s user groups and on-call entries, resolved
    (at each click: who is on call may have changed since the card) only when that can
    matter."""
    wanted = rule.looked_up
    if not wanted or decider.user in rule.approvers or decider.groups & wanted:
        return decider.groups
    if decider.resolve is None:
        return decider.groups
    return decider.groups | await decider.resolve(wanted)


async def may_decide(
    store: Store, state: ThreadState, request: DecisionRequest, default: ReviewerRule
) -> str | None:
    """May the request's decider make its decision now? None if so; else why not.

    The one answer for approval votes (approve, reject), edits, reconciles (happened,
    retry, abandon) and cancel. In order: the call must await this decision (with these
    arguments, not expired), the decider must act from the thread's organisation, and
    the call's reviewer rule (:func:`reviewer_rule`) must allow them. Cancel is open to
    the requester and to whoever may decide the pending call (:func:`_why_not_canceller`).
    """
    decider, decision, call_id = request.decider, request.decision, request.tool_call_id
    if decision == "cancel":
        if state.status in ("new", "cancelled"):
            return f"the thread is {state.status}"
        if (why := await why_not_same_org(store, state.thread_id, decider.org)) is not None:
            return why
        if decider.user == state.requester:
            return None
        return await _why_not_canceller(state, decider, default)
    assert call_id is not None, "an approval or a reconcile names its call"
    if decision in ("approve", "reject", "edit"):
        now = request.now or utcnow()
        why = await why_not_decidable(store, state, call_id, request.arguments_hash, now)
    else:
        why = await why_not_reconcilable(store, state, call_id, request.arguments_hash)
    if why is None:
        why = await why_not_same_org(store, state.thread_id, decider.org)
    if why is not None:
        return why
    call = state.pending
    rule = reviewer_rule(call, default)
    if decision == "approve" and call is not None and decider.user in call.votes:
        return "you already approved this call; it needs another person"
    # A reconcile and an edit are held to the approval's rule: the requester only with
    # allow_self.
    verdict: ev.ApprovalDecision = "reject" if decision == "reject" else "approve"
    groups = await _groups_for(decider, rule)
    return rule.may_decide(verdict, decider.user, state.requester, groups)


async def may_approve(state: ThreadState, decider: Decider, default: ReviewerRule) -> bool:
    """Could ``decider`` cast a vote on the call ``state`` awaits approval for, by that
    call's own rule? For lists of what a person may decide (the Home tab, ``/opsloop
    pending``); the click itself is still asked :func:`may_decide`."""
    call = state.pending
    if state.status != "awaiting_approval" or call is None or decider.user in call.votes:
        return False
    rule = reviewer_rule(call, default)
    groups = await _groups_for(decider, rule)
    return rule.may_decide("approve", decider.user, state.requester, groups) is None


async def _why_not_canceller(
    state: ThreadState, decider: Decider, default: ReviewerRule
) -> str | None:
    """May ``decider``, who is not the requester, cancel? Stopping a pending call is
    deciding it, so its own reviewer rule says who; with nothing pending, the process's
    approvers, and nobody else when there are none ("anyone" would let a stranger end
    another person's thread)."""
    call = state.pending
    if call is None:
        if not default.approvers:
            return "only the requester can cancel"
        if default.is_approver(decider.user, await _groups_for(decider, default)):
            return None
        return "only the requester or an approver can cancel"
    rule = reviewer_rule(call, default)
    if rule.is_approver(decider.user, await _groups_for(decider, rule)):
        return None
    why = "only the requester or an approver of the pending call can cancel"
    if rule.on_call:
        why += " (or whoever is on call for it now)"
    return why


async def decide_approval(
    store: Store,
    thread_id: str,
    *,
    tool_call_id: str,
    decider: Decider,
    decision: ev.ApprovalDecision,
    reviewers: ReviewerRule,
    reason: str = "",
    arguments_hash: str | None = None,
    dedupe_key: str | None = None,
    now: datetime | None = None,
    grant: GrantAsk | None = None,
) -> Accepted | Refused:
    """Vote on (approve) or reject the pending call ``tool_call_id``; ``reviewers`` is
    the process's rule, for calls that record none.

    Each approval is one vote; the call runs once its quorum is met. Refused (with an
    ``approval_refused`` event for the audit) when :func:`may_decide` says so. A
    redelivered click (same ``dedupe_key``) is a no-op. ``grant`` ("Approve for 1 h", or
    its modal): the vote also creates the standing grant asked for (``grant_created``,
    same transaction), within the rule's ``max_grant``; only on a call whose rule allows
    grants and needs one vote.
    """
    request = DecisionRequest(
        thread_id, decider, decision, tool_call_id, arguments_hash, dedupe_key, now
    )

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen
        state, refused = await _load_checked(store, request, reviewers)
        if refused is not None:
            return refused
        event: ev.Event
        if decision == "approve" and grant is not None:
            return await _grant(
                store, state, request, grant, reviewer_rule(state.pending, reviewers)
            )
        if decision == "approve":
            event = ev.ApprovalGranted(
                actor=decider.user, tool_call_id=tool_call_id, dedupe_key=dedupe_key
            )
        else:
            event = ev.ApprovalRejected(
                actor=decider.user, tool_call_id=tool_call_id, reason=reason, dedupe_key=dedupe_key
            )
        return await _append_one(store, thread_id, state, event)

    return await retrying(once)


async def _grant(
    store: Store, state: ThreadState, request: DecisionRequest, ask: GrantAsk, rule: ReviewerRule
) -> Accepted | Refused:
    """The vote and the standing grant it creates, in one append (``may_decide`` said
    yes to the vote)."""
    call = state.pending
    assert call is not None  # may_decide
    if not call.grants_allowed or call.max_grant_s is None:
        return await _refuse(store, state, request, "this call's rule allows no standing grants")
    if (why := ask.problem(call.max_grant_s, call.arguments)) is not None:
        return await _refuse(store, state, request, why)
    user = request.decider.user
    vote = ev.ApprovalGranted(
        actor=user, tool_call_id=call.tool_call_id, dedupe_key=request.dedupe_key
    )
    created = ev.GrantCreated(
        actor=user,
        grant_id=new_grant_id(),
        tool=call.intent,
        arguments_schema=ask.schema(call.arguments),
        scope=ask.scope,
        until=ask.until(request.now or utcnow(), call.max_grant_s),
        reviewer=user,
        tool_call_id=call.tool_call_id,
        approvers=tuple(sorted(rule.approvers)),
    )
    done = await store.append(
        state.thread_id, state.last_seq, [vote, created], state=state, now=request.now
    )
    return Accepted(state.thread_id, done.events[0], done.deduplicated)


async def revoke_grant(
    store: Store,
    thread_id: str,
    *,
    grant_id: str,
    decider: Decider,
    reviewers: ReviewerRule,
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """Revoke a live grant (``grant_revoked``): by the reviewer who created it, or by an
    approver of the rule of the call it was created on (``reviewers`` when none is
    recorded). Refused, storing nothing, when it is not live or they may not."""

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen
        state = await store.load(thread_id)
        grant = state.grants.get(grant_id)
        if grant is None:
            return Refused(thread_id, "that grant was revoked already")
        if (why := await why_not_same_org(store, thread_id, decider.org)) is not None:
            return Refused(thread_id, why)
        if decider.user != grant.reviewer:
            rule = await _grant_rule(store, thread_id, grant_id, reviewers)
            if not rule.is_approver(decider.user, await _groups_for(decider, rule)):
                return Refused(
                    thread_id, "only the reviewer who created it or an approver of its rule can"
                )
        revoked = ev.GrantRevoked(actor=decider.user, grant_id=grant_id, dedupe_key=dedupe_key)
        return await _append_one(store, thread_id, state, revoked)

    return await retrying(once)


async def _grant_rule(
    store: Store, thread_id: str, grant_id: str, default: ReviewerRule
) -> ReviewerRule:
    """The reviewer rule of the call whose approval created ``grant_id``."""
    events = await store.select_events(thread_id)
    created = next(
        (e for e in events if isinstance(e, ev.GrantCreated) and e.grant_id == grant_id), None
    )
    call = next(
        (
            e
            for e in events
            if isinstance(e, ev.ToolCallRequested)
            and created is not None
            and e.tool_call_id == created.tool_call_id
        ),
        None,
    )
    rule = call.reviewers if call is not None else None
    return rule if rule is not None else default


@dataclass(frozen=True)
class Edit:
    """A reviewer's new arguments for the call ``tool_call_id`` (the card's Edit modal,
    made on the arguments ``arguments_hash``); ``approve``: "Save and approve", the
    editor's own vote on the edited call."""

    thread_id: str
    tool_call_id: str
    arguments: dict[str, Any]
    arguments_hash: str
    approve: bool = False
    dedupe_key: str | None = None
    now: datetime | None = None


async def edit_call(
    store: Store,
    edit: Edit,
    *,
    decider: Decider,
    tools: Registry,
    policies: PolicySet | None,
    reviewers: ReviewerRule,
) -> Accepted | Refused | Invalid:
    """Give a call awaiting approval new arguments (``approval_edited``), and with
    ``approve`` the editor's vote in the same transaction.

    Who may edit is who may approve the call (:func:`may_decide`, recorded as any refused
    click). The arguments are checked against the tool's schema (``Invalid``, nothing
    stored). ``policies`` (None: the call keeps its rule) decide the new arguments
    again: a reject closes the call with its reason; otherwise the stricter of the two
    reviewer rules stands (:func:`engine.edits.after_edit`) and earlier votes no longer
    count. The editor's vote is asked of :func:`may_decide` on the edited call; a refusal
    is recorded and nothing else is stored. The call keeps its id and idempotency key.
    """
    thread_id, key = edit.thread_id, edit.dedupe_key
    request = DecisionRequest(
        thread_id, decider, "edit", edit.tool_call_id, edit.arguments_hash, key, edit.now
    )

    async def once() -> Accepted | Refused | Invalid:
        if key and (seen := await _seen(store, thread_id, key)):
            return seen
        state, refused = await _load_checked(store, request, reviewers)
        if refused is not None:
            return refused
        call = state.pending
        assert call is not None  # may_decide
        tool = tools.get(call.intent)
        if tool is None:
            return Invalid(thread_id, {GENERAL: f"{call.intent} is not loaded here"})
        if (errors := _argument_errors(tool, edit.arguments)) is not None:
            return Invalid(thread_id, errors)
        digest = call_hash(call.intent, edit.arguments)
        edited: ev.ApprovalEdited | None = None
        if digest != call.arguments_hash:
            try:
                edited = await _edited(store, state, call, tool, edit, decider, policies, reviewers)
            except Exception as exc:  # a rule's `when` that cannot be evaluated
                undecided = f"the policy could not decide: {_one_line(exc)}"
                return Invalid(thread_id, {GENERAL: undecided})
        elif not edit.approve:
            return Invalid(thread_id, {GENERAL: "these are the arguments the call has already"})
        batch: list[ev.Event] = [edited] if edited is not None else []
        if edit.approve and (edited is None or edited.policy != "reject"):
            # The vote is on the edited call, by its rule (the editor may not be its approver).
            vote = DecisionRequest(
                thread_id, decider, "approve", call.tool_call_id, digest, key, edit.now
            )
            after = apply(state, edited) if edited is not None else state
            if (why := await may_decide(store, after, vote, reviewers)) is not None:
                return await _refuse(store, state, vote, why)
            granted = ev.ApprovalGranted(
                actor=decider.user,
                tool_call_id=call.tool_call_id,
                dedupe_key=None if edited is not None else key,  # one per input
            )
            batch.append(granted)
        done = await store.append(thread_id, state.last_seq, batch, state=state)
        return Accepted(thread_id, done.events[0], done.deduplicated)

    return await retrying(once)


def _argument_errors(tool: ToolLike, arguments: dict[str, Any]) -> dict[str, str] | None:
    """What is wrong with ``arguments`` for ``tool``, by argument; None if nothing."""
    if (too_large := instance_too_large(arguments)) is not None:
        return {GENERAL: too_large}
    try:
        tool.parse_arguments(arguments)
    except ValidationError as exc:
        return field_errors(exc) or {GENERAL: "the arguments are not valid"}
    except Exception as exc:  # a schema that cannot be evaluated
        return {GENERAL: f"the arguments could not be checked: {_one_line(exc)}"}
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


async def _edited(
    store: Store,
    state: ThreadState,
    call: PendingCall,
    tool: ToolLike,
    edit: Edit,
    decider: Decider,
    policies: PolicySet | None,
    default: ReviewerRule,
) -> ev.ApprovalEdited:
    """The edit, with what the policy says of the new arguments (never below what the
    call needed)."""
    decided: dict[str, Any] = {}
    if policies is not None:
        channel = (await store.get_thread(state.thread_id)).channel
        new = policies.decide(tool, edit.arguments, channel)
        if new.policy == "reject":
            decided = {"policy": "reject", "reason": new.reason}
        else:  # run_now and waits too: an edit never lowers the approval it needs
            decided = {"reviewers": after_edit(reviewer_rule(call, default), new.reviewers)}
    return ev.ApprovalEdited(
        actor=decider.user,
        tool_call_id=call.tool_call_id,
        reviewer=decider.user,
        arguments=edit.arguments,
        arguments_hash=call_hash(call.intent, edit.arguments),
        previous_hash=call.arguments_hash,
        dedupe_key=edit.dedupe_key,
        **decided,
    )


async def _seen(store: Store, thread_id: str, dedupe_key: str) -> Accepted | Refused | None:
    """What a redelivered input already did, if it was seen."""
    seen = await store.find_by_dedupe_key(thread_id, dedupe_key)
    if seen is None:
        return None
    if isinstance(seen, ev.ApprovalRefused):
        return Refused(thread_id, seen.reason, seen)
    return Accepted(thread_id, seen, deduplicated=True)


async def check_decision(
    store: Store,
    thread_id: str,
    *,
    tool_call_id: str,
    decider: Decider,
    decision: ev.ApprovalDecision | Literal["edit"],
    reviewers: ReviewerRule,
    arguments_hash: str | None = None,
    dedupe_key: str | None = None,
    now: datetime | None = None,
) -> Decidable | Refused:
    """Ask before deciding (the reject and edit buttons open a modal first):
    ``Decidable`` stores nothing; a refusal is recorded as :func:`decide_approval` would
    record it."""
    request = DecisionRequest(
        thread_id, decider, decision, tool_call_id, arguments_hash, dedupe_key, now
    )
    return await _checked(store, request, reviewers)


async def _checked(
    store: Store, request: DecisionRequest, reviewers: ReviewerRule
) -> Decidable | Refused:
    thread_id, dedupe_key = request.thread_id, request.dedupe_key

    async def once() -> Decidable | Refused:
        if dedupe_key and (seen := await store.find_by_dedupe_key(thread_id, dedupe_key)):
            if isinstance(seen, ev.ApprovalRefused):
                return Refused(thread_id, seen.reason, seen)
        state, refused = await _load_checked(store, request, reviewers)
        if refused is not None:
            return refused
        call = state.pending
        assert call is not None and request.tool_call_id is not None  # may_decide
        grants = call.max_grant_s if call.grants_allowed else None
        return Decidable(thread_id, request.tool_call_id, call.intent, call.arguments, grants)

    return await retrying(once)


async def decide_reconcile(
    store: Store,
    thread_id: str,
    *,
    tool_call_id: str,
    decider: Decider,
    decision: ev.ReconcileDecision,
    note: str = "",
    reviewers: ReviewerRule,
    arguments_hash: str | None = None,
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """Say what became of the call whose outcome is unknown: ``happened`` (``note`` is
    the result the model reads), ``retry`` or ``abandon``. Decided by the call's
    reviewer rule; a refusal is recorded as ``approval_refused`` with the decision."""
    request = DecisionRequest(
        thread_id, decider, decision, tool_call_id, arguments_hash, dedupe_key
    )

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen
        state, refused = await _load_checked(store, request, reviewers)
        if refused is not None:
            return refused
        event = ev.ReconcileDecided(
            actor=decider.user,
            tool_call_id=tool_call_id,
            decision=decision,
            reviewer=decider.user,
            note=note.strip(),
            dedupe_key=dedupe_key,
        )
        return await _append_one(store, thread_id, state, event)

    return await retrying(once)


async def check_reconcile(
    store: Store,
    thread_id: str,
    *,
    tool_call_id: str,
    decider: Decider,
    reviewers: ReviewerRule,
    arguments_hash: str | None = None,
    dedupe_key: str | None = None,
) -> Decidable | Refused:
    """Ask before opening the note modal (It happened): ``Decidable`` stores nothing; a
    refusal is recorded as :func:`decide_reconcile` would record it, so the audit sees
    a refused click whichever button it was. The three decisions share one rule, so one
    answer covers them."""
    request = DecisionRequest(
        thread_id, decider, "happened", tool_call_id, arguments_hash, dedupe_key
    )
    return await _checked(store, request, reviewers)


async def why_not_reconcilable(
    store: Store, state: ThreadState, tool_call_id: str, args_hash: str | None = None
) -> str | None:
    """None if ``tool_call_id`` (with these arguments) has an unknown outcome and awaits
    a person; else why not."""
    call = state.pending
    if (
        state.status == "awaiting_reconcile"
        and call is not None
        and call.tool_call_id == tool_call_id
        and call.phase == "unknown"
    ):
        # A call that needed no approval has no approval hash: compute it from the call.
        if args_hash is not None and args_hash != call_hash(call.intent, call.arguments):
            return "this card is out of date: the call's arguments differ"
        return None
    unknown = False
    for e in await store.select_events(state.thread_id):
        if isinstance(e, ev.ToolOutcomeUnknown) and e.tool_call_id == tool_call_id:
            unknown = True
        elif unknown and isinstance(e, ev.ReconcileDecided) and e.tool_call_id == tool_call_id:
            return f"already decided ({e.decision}) by {e.actor} at {_hhmm(e.created_at)} UTC"
        elif unknown and isinstance(e, ev.ThreadCancelled | ev.ErrorRaised):
            return (
                f"the thread {'was cancelled' if isinstance(e, ev.ThreadCancelled) else 'failed'}"
            )
    if unknown:
        return "that call is no longer in question"
    return "there is no such call whose outcome is unknown"


async def why_not_same_org(store: Store, thread_id: str, org: Org | None) -> str | None:
    """None if ``org`` is the thread's organisation (or the front door has none)."""
    if org is None:
        return None
    info = await store.get_thread(thread_id)
    if not org.teams or any(team != info.team for team in org.teams):
        return "you are not in the Slack team this thread belongs to"
    if org.enterprise is not None:
        first = next(iter(await store.select_events(thread_id)), None)
        source = getattr(first, "source", None)
        # A thread an alert opened has no Slack source (its ``source`` names the system).
        theirs = source.get("enterprise") if isinstance(source, dict) else None
        if theirs is not None and theirs != org.enterprise:
            return "you are not in the Slack organisation this thread belongs to"
    return None


async def _load_checked(
    store: Store, request: DecisionRequest, reviewers: ReviewerRule
) -> tuple[ThreadState, Refused | None]:
    """The thread's state and, when :func:`may_decide` says no, the recorded refusal."""
    state = await store.load(request.thread_id)
    why = await may_decide(store, state, request, reviewers)
    if why is None:
        return state, None
    return state, await _refuse(store, state, request, why)


async def _refuse(store: Store, state: ThreadState, request: DecisionRequest, why: str) -> Refused:
    refusal = ev.ApprovalRefused(
        actor=request.decider.user,
        tool_call_id=request.tool_call_id,
        decision=request.decision,
        reason=why,
        dedupe_key=request.dedupe_key,
    )
    done = await store.append(request.thread_id, state.last_seq, [refusal], state=state)
    return Refused(request.thread_id, why, done.events[0])


async def why_not_decidable(
    store: Store, state: ThreadState, tool_call_id: str, args_hash: str | None, now: datetime
) -> str | None:
    """None if ``tool_call_id`` (with these arguments) awaits a decision now; else why
    not, e.g. "already approved by U123 at 12:03 UTC". The reviewer is not checked."""
    call = state.pending
    if call is not None and call.tool_call_id == tool_call_id and call.phase == "awaiting_approval":
        if args_hash is not None and args_hash != call.arguments_hash:
            return "this card is out of date: the call's arguments differ"
        if call.expires_at is not None and call.expires_at <= now:
            # The scheduler has not written approval_expired yet; the deadline stands.
            return f"the approval expired at {_hhmm(call.expires_at)} UTC"
        return None
    return await describe_closed_call(store, state.thread_id, tool_call_id)


async def describe_closed_call(store: Store, thread_id: str, tool_call_id: str) -> str:
    """Why a call can no longer be decided, e.g. "already approved by U123 at 12:03"."""
    verdicts: dict[type[ev.Event], str] = {
        ev.ApprovalRejected: "already rejected",
        ev.ApprovalExpired: "the approval expired",
        ev.ApprovalWithdrawn: "withdrawn: the requester wrote since",
        ev.ThreadCancelled: "the thread was cancelled",
    }
    requested = False
    granted: ev.AnyEvent | None = None  # the vote that met the quorum: the latest one
    for e in await store.select_events(thread_id):
        if isinstance(e, ev.ApprovalRequested) and e.tool_call_id == tool_call_id:
            requested = True
        if not requested or getattr(e, "tool_call_id", tool_call_id) != tool_call_id:
            continue
        if isinstance(e, ev.ApprovalGranted):
            granted = e
        elif isinstance(e, ev.ToolStarted) and granted is not None:
            break
        elif isinstance(e, ev.ApprovalEdited) and e.policy == "reject":
            return f"refused by the policy after an edit by {e.actor} at {_hhmm(e.created_at)} UTC"
        elif type(e) in verdicts:
            who = f" by {e.actor}" if isinstance(e, ev.ApprovalRejected) else ""
            return f"{verdicts[type(e)]}{who} at {_hhmm(e.created_at)} UTC"
    if granted is not None:
        return f"already approved by {granted.actor} at {_hhmm(granted.created_at)} UTC"
    if requested:
        return "that call is no longer pending"
    return "there is no such call awaiting approval"


def _hhmm(when: datetime) -> str:
    return when.strftime("%H:%M")


async def finish_wait(
    store: Store,
    thread_id: str,
    *,
    wait_id: str,
    result: dict[str, Any],
    actor: str = "system",
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """An external job finished (a webhook, say)."""

    async def once() -> Accepted | Refused:
        state = await store.load(thread_id)
        call = state.pending
        if (
            state.status != "awaiting_job"
            or call is None
            or call.wait is None
            or call.wait.wait_id != wait_id
        ):
            if dedupe_key and (seen := await store.find_by_dedupe_key(thread_id, dedupe_key)):
                return Accepted(thread_id, seen, deduplicated=True)
            return Refused(thread_id, f"no open wait {wait_id!r}")
        event = ev.WaitFinished(
            actor=actor,
            tool_call_id=call.tool_call_id,
            wait_id=wait_id,
            result=storable(result),  # a job's answer, like any tool's (tools/output.py)
            dedupe_key=dedupe_key,
            resumes=call.wait.resumes,
        )
        return await _append_one(store, thread_id, state, event)

    return await retrying(once)


async def receive_alert(store: Store, alert: ev.AlertReceived, *, team: str) -> Accepted | Refused:
    """An alert arrived (``alert.channel``: where its thread lives, in Slack team ``team``).

    The thread open for its alert (``Store.find_alert_thread``) gets it, answered or not;
    a firing alert with none opens one, rooted at a placeholder until the bot's post of
    it is in Slack (``engine.alerts.pending_root``; delivery posts it, then moves the
    thread there). A resolution with no open thread is refused, nothing stored: there
    is nothing to say it in. A resend (its ``dedupe_key``) is a no-op.

    Two deliveries of a new alert race to open its thread: the unique index on the open
    alert lets one in, and the other, conflicted, finds that thread and appends to it.
    """
    key = alert.alert_key

    async def once() -> Accepted | Refused:
        thread_id = await store.find_alert_thread(key)
        if thread_id is not None:
            if alert.dedupe_key and (seen := await _seen(store, thread_id, alert.dedupe_key)):
                return seen
            try:
                state = await store.load(thread_id)
            except ThreadNotFound:  # archived since the lookup: look again
                raise ConcurrencyConflict(thread_id, 0) from None
            if state.alert != key:  # resolved since the lookup: look again
                raise ConcurrencyConflict(thread_id, state.last_seq)
            return await _append_one(store, thread_id, state, alert)
        if alert.status == "resolved":
            return Refused("", "no thread is open for this alert")
        where = ThreadKey(team, alert.channel, pending_root())
        # Almost surely new: one round trip when it is; the unique index otherwise.
        opened, done = await store.append_input(where, lambda _: [alert], fresh=True)
        return Accepted(opened, done.events[-1], done.deduplicated)

    return await retrying(once)


def thread_of_wait(wait_id: str) -> str:
    """Wait ids are ``{thread_id}.{random}``, so a webhook finds its thread."""
    thread_id, dot, _ = wait_id.rpartition(".")
    if not dot or not thread_id:
        raise ThreadNotFound(f"not a wait id: {wait_id!r}")
    return thread_id


async def cancel(
    store: Store,
    thread_id: str,
    *,
    decider: Decider,
    reviewers: ReviewerRule,
    reason: str = "",
    dedupe_key: str | None = None,
) -> Accepted | Refused:
    """Stop the thread: allowed to its requester and to whoever may decide its pending
    call (or, with none, the process's approvers), from the thread's organisation
    (:func:`may_decide`). A refusal is recorded as ``approval_refused``, naming the
    pending call whose rule refused it, if any."""

    async def once() -> Accepted | Refused:
        if dedupe_key and (seen := await _seen(store, thread_id, dedupe_key)):
            return seen  # a redelivered click
        state = await store.load(thread_id)
        call_id = state.pending.tool_call_id if state.pending else None
        request = DecisionRequest(thread_id, decider, "cancel", call_id, dedupe_key=dedupe_key)
        if (why := await may_decide(store, state, request, reviewers)) is not None:
            if state.status == "new":
                return Refused(thread_id, why)  # a log starts with a message: nowhere to record
            return await _refuse(store, state, request, why)
        event = ev.ThreadCancelled(actor=decider.user, reason=reason, dedupe_key=dedupe_key)
        return await _append_one(store, thread_id, state, event)

    return await retrying(once)
