"""What a Slack thread still has to show: a pure projection of the thread's log.

What a thread shows is a projection of its events (DESIGN, "Slack"): one message per
shown event (the approval card; one line per tool call, result, question, error,
answer), the card updated in place when its approval is decided, expires or the thread
is cancelled. Each delivery is recorded as a ``message_posted`` receipt, so the log alone
says what is still to do (:func:`pending_deliveries`); :func:`render` gives a message's
blocks, and :func:`metadata` / :func:`shown_event` name, in Slack, the event a message
shows. :mod:`bot.delivery` does the I/O.

The thread's status message (what it is doing, with a Cancel button while it is
active) is the thread's first bot message. It shows the first ``user_message``: that
event's first receipt carries its ts. Every receipt of an event E with that ts records
that it shows the state after E, so the latest one says what it shows now, and it is
updated in place, last, when that differs from what the whole log says.

A message a person writes while a card is open updates the card in place (it shows
what was written since it was posted, so the reviewer reads it before clicking); that
update's receipt names the message and carries the card's ts. So does a vote that does
not meet the call's quorum yet: the open card then shows "1 of 2: @bob". So does a
reviewer's edit of the arguments (``approval_edited``): the card shows the call as
edited, with the diff, its buttons bound to the new hash; an edit the policy refuses
closes it instead.

An ``approval_reminded`` posts a reply about the open card (its receipt has another ts
than the card's) and notes the reminder on the card; an ``approval_expired`` whose call
records ``escalate_to`` also posts about the closed card, in the rule's channel or in
the thread.

A ``tool_outcome_unknown`` posts the reconcile card (its buttons bound to the call by
its arguments hash), updated in place by the ``reconcile_decided`` (or cancellation)
that closes it.

A thread an alert opened (its first event an ``alert_received``) has no message of a
person at its root: the bot's post of the alert, at the top of the channel, is its root
and its status message at once (updated in place when the status changes or the alert
resolves); the same alert firing again or resolving is a line in the thread.

Where a run is shown as a plan message (``live_plan``, :mod:`bot.plan_outbox`), its
calls', retries', result and answer lines are not posted: the plan shows them. Cards,
reminders, escalations and the status message are posted as ever.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from bot.limits import Block
from bot.mrkdwn import USER_ID
from bot.plan_outbox import plan_shown
from bot.render.alerts import alert_root
from bot.render.approval import (
    NO_NOTES,
    NO_VOTES,
    Edited,
    Notes,
    Outcome,
    Votes,
    approval_card,
    decided_card,
)
from bot.render.lines import event_line, granted_line
from bot.render.oncall import OnCallNow, on_call_blocks, on_call_entries
from bot.render.reconcile import reconcile_card, reconciled_card
from bot.render.reminders import escalation_channel, escalation_post, reminder_reply
from bot.render.status import status_message
from engine import events as ev
from engine.edits import changes
from engine.policy import arguments_hash
from engine.reviewers import ANYONE, ReviewerRule
from engine.state import GRANT_PREFIX, Grant, ThreadState, apply

METADATA_TYPE = "opsloop_event"
# The events that close an open approval card, and what the card then says.
OUTCOMES: dict[type[ev.Event], Outcome] = {
    ev.ApprovalGranted: "approved",
    ev.ApprovalRejected: "rejected",
    ev.ApprovalExpired: "expired",
    ev.ApprovalWithdrawn: "withdrawn",
    ev.ThreadCancelled: "cancelled",
    ev.ApprovalEdited: "refused",  # only an edit the policy refuses closes the card
}
Card = ev.ApprovalRequested | ev.ToolOutcomeUnknown  # the event a card's metadata names
# Receipts and clicks on feedback: no step of the thread, so no state a status shows.
NOT_SHOWN_STATE = (ev.MessagePosted, ev.StreamStopped, ev.FeedbackGiven)


@dataclass(frozen=True)
class StatusView:
    """What the thread's status message shows: ``state``, the state after event ``upto``.

    ``anchor`` is the thread's first ``user_message``, the event the message's metadata
    (and its first receipt) names; ``reviewers`` (the process's rule) are named while an
    approval of a call that records no rule of its own is awaited.

    A thread an alert opened (``root``, its first event, is the anchor) shows its status
    on the bot's post of the alert at the top of the channel, the thread's root: posted
    there, not in the thread, and updated in place as the status or the alert changes.
    """

    state: ThreadState
    anchor: str
    upto: str
    reviewers: ReviewerRule = ANYONE
    root: ev.AlertReceived | None = None


@dataclass(frozen=True)
class Outbound:
    """One thing to show: a new message (``post``), or the card ``card`` to ``update``.

    ``event`` is what the receipt names (``shows_event_id``); ``call`` is the tool call
    of a card or of a line; ``card`` the ``approval_requested`` of an approval card or
    the ``tool_outcome_unknown`` of a reconcile card; ``card_ts`` is empty while the
    card is not posted yet. ``notes``: what people wrote while the card was open, up to
    ``event``; ``votes``: its approvals so far; ``still_open``: the update shows the card
    still open (for a ``user_message``, or a vote short of the quorum). ``people``: the
    user ids of the thread so far, named as mentions in what the model wrote.

    With ``status`` set, the message is the thread's status message instead: posted for
    the first ``user_message`` (``event``), or updated at ``card_ts`` for ``event``, the
    last event its state includes.

    A post with ``card`` set is about that approval card (a reminder, an expiry's
    escalation) and links to it. ``channel``: a post's place outside the thread (at the
    top of that channel; "" is the thread); ``refusal``: why Slack refused it there, so
    it goes in the thread instead. ``reminded_at``: when the open card's approvers were
    reminded.
    """

    kind: Literal["post", "update"]
    event: ev.AnyEvent
    requester: str | None = None
    call: ev.ToolCallRequested | None = None
    card: Card | None = None
    card_ts: str = ""
    status: StatusView | None = None
    notes: Notes = NO_NOTES
    people: frozenset[str] = frozenset()
    votes: Votes = NO_VOTES
    still_open: bool = False
    edits: tuple[Edited, ...] = ()
    channel: str = ""
    refusal: str = ""
    reminded_at: datetime | None = None
    grant: Grant | ev.GrantUse | None = None  # the standing grant that approved it at once
    created: ev.GrantCreated | None = None  # the grant the deciding vote made with it


def pending_deliveries(
    events: Sequence[ev.AnyEvent], *, reviewers: ReviewerRule = ANYONE, live_plan: bool = False
) -> list[Outbound]:
    """What a whole log still has to show, in log order (pure).

    ``live_plan``: runs not shown yet are shown as plan messages where they can be
    (:mod:`bot.plan_outbox`), so their calls' and answers' lines are left out; a run
    with a plan message leaves them out either way.

    An event with a receipt is shown. A card update is done when a receipt for the
    closing event carries the card's ts; a cancellation also posts its own line, whose
    receipt has another ts. What each event does is its entry in ``SHOWS``; any other
    type is a line of its own if people see it as one.

    The thread's status message comes first and is updated last: see :func:`_status`.
    Receipts carrying its ts say what it shows, so they do not count for lines and cards.
    """
    receipts: dict[str, list[str]] = {}
    streams = False
    for e in events:
        if isinstance(e, ev.MessagePosted):
            if e.kind == "stream":  # a plan message: bot.plan_outbox's
                streams = True
            else:
                receipts.setdefault(e.shows_event_id, []).append(e.ts)
    first: ev.UserMessage | ev.AlertReceived | None
    if events and isinstance(events[0], ev.AlertReceived):
        first = events[0]  # the alert that opened the thread: its root post is the status
    else:
        first = next((e for e in events if isinstance(e, ev.UserMessage)), None)
    # The status message's ts: the first receipt of the first user_message carries it.
    status_ts = next((ts for ts in receipts.get(first.event_id, ()) if ts), "") if first else ""
    walk = _Walk(first.actor if isinstance(first, ev.UserMessage) else None)
    if live_plan or streams:
        walk.planned = plan_shown(events, live_plan=live_plan)
    status_shows = ThreadState()  # the state the status message shows (see _status)
    for e in events:
        walk.before, walk.state = walk.state, apply(walk.state, e)
        # An alert's thread has a requester once a person writes in it.
        walk.requester = walk.requester or walk.state.requester
        if USER_ID.match(e.actor) and e.actor not in walk.people:
            walk.people = walk.people | {e.actor}
        ts_of = receipts.get(e.event_id, ())
        if status_ts and status_ts in ts_of:
            status_shows = walk.state
        shown = [ts for ts in ts_of if not (ts and ts == status_ts)]
        SHOWS.get(type(e), _line)(walk, e, shown)
    out = walk.out
    status = None
    if first is not None:
        last = next(e for e in reversed(events) if not isinstance(e, NOT_SHOWN_STATE))
        status = _status(first, last, walk.state, status_shows, status_ts, receipts, reviewers)
    if status is not None:
        if status.kind == "post":
            out.insert(0, status)
        else:
            out.append(status)
    return out


Opened = tuple[ev.ApprovalRequested, str]  # an open approval card and its ts ("": unposted)
Checking = tuple[ev.ToolOutcomeUnknown, str]  # an open reconcile card, alike


class _Walk:
    """What a walk over the log has seen so far, and what it found still to show.

    ``shown`` (each step's last argument) holds the ts of the event's receipts, the
    status message's left out.
    """

    def __init__(self, requester: str | None) -> None:
        self.requester = requester
        self.out: list[Outbound] = []
        self.calls: dict[str, ev.ToolCallRequested] = {}
        self.cards: dict[str, Opened] = {}  # open approval cards by call id
        self.checks: dict[str, Checking] = {}  # open reconcile cards by call id
        self.noted: dict[str, Outbound] = {}  # open cards' latest undelivered update
        self.edits: dict[str, tuple[Edited, ...]] = {}  # the edits of each call, in order
        self.people: frozenset[str] = frozenset()
        self.before = self.state = ThreadState()  # around the event being walked
        self.planned: set[str] = set()  # events a plan message shows: no line of their own

    def post(self, e: ev.AnyEvent) -> None:
        call = self.calls.get(getattr(e, "tool_call_id", None) or "")
        self.out.append(Outbound("post", e, self.requester, call, people=self.people))

    def update(self, e: ev.AnyEvent, card: Card, ts: str, **shows: Any) -> Outbound:
        cid = card.tool_call_id
        edits = self.edits.get(cid, ())
        call = self.calls[cid]
        return Outbound(
            "update", e, self.requester, call, card, ts, people=self.people, edits=edits, **shows
        )

    def post_card(self, e: Card, shown: list[str]) -> str:
        """Post the card of ``e`` unless a receipt says it is; its ts ("" until then)."""
        if not shown:
            self.post(e)
        return shown[0] if shown else ""

    def still_open(self, e: ev.AnyEvent, cid: str, shown: list[str]) -> None:
        """The open card of ``cid`` shows what ``e`` changed: the latest such update
        stands for the earlier ones (it shows them too)."""
        card, ts = self.cards[cid]
        if (stale := self.noted.pop(cid, None)) is not None:
            self.out.remove(stale)
        if not ts or ts not in shown:
            notes, votes = _notes(self.state, cid), _votes(self.state, cid)
            reminded = _reminded(self.state, cid)
            self.noted[cid] = self.update(
                e, card, ts, notes=notes, votes=votes, still_open=True, reminded_at=reminded
            )
            self.out.append(self.noted[cid])

    def post_about(self, e: ev.AnyEvent, opened: Opened, shown: list[str], **more: Any) -> None:
        """Post a message of its own about the card ``opened`` (it links to the card), once:
        a receipt of ``e`` other than the card's update says it is posted."""
        card, ts = opened
        if [t for t in shown if t != ts]:
            return
        call = self.calls[card.tool_call_id]
        votes = _votes(self.before, card.tool_call_id)
        self.out.append(
            Outbound(
                "post", e, self.requester, call, card, ts, people=self.people, votes=votes, **more
            )
        )

    def close(self, opened: Opened, e: ev.AnyEvent, shown: list[str]) -> None:
        """Update the approval card to its decided form, once."""
        card, ts = opened
        cid = card.tool_call_id
        if (stale := self.noted.pop(cid, None)) is not None:
            self.out.remove(stale)  # the decided card shows them too
        if not ts or ts not in shown:
            # The votes the card had, and the one that met the quorum.
            voted = self.state if isinstance(e, ev.ApprovalGranted) else self.before
            notes, votes = _notes(self.before, cid), _votes(voted, cid)
            self.out.append(self.update(e, card, ts, notes=notes, votes=votes))

    def settle(self, checking: Checking, e: ev.AnyEvent, shown: list[str]) -> None:
        """Update the reconcile card to say what became of the call, once."""
        check, ts = checking
        if not ts or ts not in shown:
            self.out.append(self.update(e, check, ts))


def _line(w: _Walk, e: ev.AnyEvent, shown: list[str]) -> None:
    """Any type without an entry: a line of its own if people see it as one (and no
    plan message shows it)."""
    if e.facts.people == "line" and not shown and e.event_id not in w.planned:
        w.post(e)


def _tool_call_requested(w: _Walk, e: ev.ToolCallRequested, shown: list[str]) -> None:
    w.calls[e.tool_call_id] = e
    if e.policy != "approve_before_run":  # else its approval card shows it
        _line(w, e, shown)


def _approval_requested(w: _Walk, e: ev.ApprovalRequested, shown: list[str]) -> None:
    if e.tool_call_id in w.calls:
        w.cards[e.tool_call_id] = (e, w.post_card(e, shown))


def _tool_outcome_unknown(w: _Walk, e: ev.ToolOutcomeUnknown, shown: list[str]) -> None:
    if e.tool_call_id in w.calls:
        w.checks[e.tool_call_id] = (e, w.post_card(e, shown))


def _user_message(w: _Walk, e: ev.UserMessage, shown: list[str]) -> None:
    for cid in list(w.cards):
        if _notes(w.state, cid).latest:
            w.still_open(e, cid, shown)


def _approval_granted(w: _Walk, e: ev.ApprovalGranted, shown: list[str]) -> None:
    if e.actor.startswith(GRANT_PREFIX):  # approved at once, no card: a line says by whom
        # The grant as the approval names it (a channel-wide one lives in another
        # thread), or, in logs from before that, as this thread's state holds it.
        grant = e.grant or w.before.grants.get(e.actor.removeprefix(GRANT_PREFIX))
        call = w.calls.get(e.tool_call_id)
        if not shown and grant is not None and call is not None:
            w.out.append(Outbound("post", e, w.requester, call, people=w.people, grant=grant))
        return
    if e.tool_call_id in w.cards and _awaits_votes(w.state, e.tool_call_id):
        w.still_open(e, e.tool_call_id, shown)  # a vote short of the quorum
    else:
        _approval_closed(w, e, shown)


Closing = (
    ev.ApprovalGranted
    | ev.ApprovalRejected
    | ev.ApprovalExpired
    | ev.ApprovalWithdrawn
    | ev.ApprovalEdited
)


def _approval_closed(w: _Walk, e: Closing, shown: list[str]) -> None:
    if (opened := w.cards.pop(e.tool_call_id, None)) is not None:
        w.close(opened, e, shown)


def _approval_edited(w: _Walk, e: ev.ApprovalEdited, shown: list[str]) -> None:
    """The card shows the call as edited (its arguments, its rule, the diff; its
    buttons bound to the new hash), still open, or closed when the policy refuses it."""
    cid = e.tool_call_id
    if cid not in w.cards:
        return
    call = w.calls[cid]
    edit = Edited(e.reviewer, e.created_at, tuple(changes(call.arguments, e.arguments)))
    w.edits[cid] = (*w.edits.get(cid, ()), edit)
    # The card renders the call as it now is: the event with the edit's arguments and rule.
    flat = ("rule", "approvers", "quorum", "allow_self") if e.reviewers is not None else ()
    update = {"arguments": e.arguments, **{k: getattr(e, k) for k in flat}}
    w.calls[cid] = call.model_copy(update=update)
    card, ts = w.cards[cid]
    w.cards[cid] = (card.model_copy(update={"arguments_hash": e.arguments_hash}), ts)
    if e.policy == "reject":
        _approval_closed(w, e, shown)
    else:
        w.still_open(e, cid, shown)


def _approval_reminded(w: _Walk, e: ev.ApprovalReminded, shown: list[str]) -> None:
    """A reply reminding the approvers, and the open card noting it."""
    if (opened := w.cards.get(e.tool_call_id)) is not None:
        w.post_about(e, opened, shown)
        w.still_open(e, e.tool_call_id, shown)


def _approval_expired(w: _Walk, e: ev.ApprovalExpired, shown: list[str]) -> None:
    """The card closes; with the rule's ``escalate_to``, a post says it expired (in its
    channel, or in the thread mentioning its people)."""
    opened = w.cards.get(e.tool_call_id)
    _approval_closed(w, e, shown)
    call = w.calls.get(e.tool_call_id)
    if opened is not None and call is not None and call.escalate_to:
        w.post_about(e, opened, shown, channel=escalation_channel(call.escalate_to))


def _grant_created(w: _Walk, e: ev.GrantCreated, shown: list[str]) -> None:
    """The vote that made it closed the card just now: the decided card says so."""
    for i, item in enumerate(w.out):
        closing = item.kind == "update" and isinstance(item.event, ev.ApprovalGranted)
        if closing and item.call is not None and item.call.tool_call_id == e.tool_call_id:
            w.out[i] = replace(item, created=e)


def _reconcile_decided(w: _Walk, e: ev.ReconcileDecided, shown: list[str]) -> None:
    if (checking := w.checks.pop(e.tool_call_id, None)) is not None:
        w.settle(checking, e, shown)


def _alert_received(w: _Walk, e: ev.AlertReceived, shown: list[str]) -> None:
    """The alert that opened the thread is its root post (the status message); the
    same alert firing again, or resolving, is a line in the thread."""
    if w.before.status != "new":
        _line(w, e, shown)


def _thread_cancelled(w: _Walk, e: ev.ThreadCancelled, shown: list[str]) -> None:
    """Every open card closes; the cancellation has its line too (another ts)."""
    cards, w.cards = list(w.cards.values()), {}
    checks, w.checks = list(w.checks.values()), {}
    for opened in cards:
        w.close(opened, e, shown)
    for checking in checks:
        w.settle(checking, e, shown)
    card_ts = {ts for _, ts in cards} | {ts for _, ts in checks}
    if not [ts for ts in shown if ts not in card_ts] and e.event_id not in w.planned:
        w.post(e)  # unless the run's plan message says it


# What an event does to what the thread shows, keyed by its class (as the reducer's
# ``APPLY``). Every type people see on a card has an entry (a test checks); any other
# type is a line of its own when its facts say people see it as one (``_line``).
SHOWS: dict[type[ev.Event], Callable[[_Walk, Any, list[str]], None]] = {
    ev.UserMessage: _user_message,
    ev.AlertReceived: _alert_received,
    ev.ToolCallRequested: _tool_call_requested,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalGranted: _approval_granted,
    ev.ApprovalRejected: _approval_closed,
    ev.ApprovalExpired: _approval_expired,
    ev.ApprovalWithdrawn: _approval_closed,
    ev.ApprovalReminded: _approval_reminded,
    ev.ApprovalEdited: _approval_edited,
    ev.GrantCreated: _grant_created,
    ev.ToolOutcomeUnknown: _tool_outcome_unknown,
    ev.ReconcileDecided: _reconcile_decided,
    ev.ThreadCancelled: _thread_cancelled,
}


def _status(
    first: ev.UserMessage | ev.AlertReceived,
    last: ev.AnyEvent,
    state: ThreadState,
    shown: ThreadState,
    status_ts: str,
    receipts: dict[str, list[str]],
    reviewers: ReviewerRule,
) -> Outbound | None:
    """The status message to post (none has a receipt yet), or to update (``shown``,
    what it shows, differs from ``state``, what the whole log says), or None.

    A receipt of event E carrying the status message's ts records that it shows the
    state after E; the latest such E in log order is what it shows now. Posting it
    records two: the first ``user_message``'s, and the last event's (``last``, the log's
    last but receipts), whose state it shows.
    """
    root = first if isinstance(first, ev.AlertReceived) else None
    requester = first.actor if root is None else state.requester
    view = StatusView(state, first.event_id, last.event_id, reviewers, root)
    if first.event_id not in receipts:
        return Outbound("post", first, requester, status=view)
    if not status_ts:
        return None  # a receipt without a ts: nothing to update
    tid = first.thread_id
    if status_message(shown, tid, reviewers=reviewers) == status_message(
        state, tid, reviewers=reviewers
    ) and (root is None or (shown.alert is None) == (state.alert is None)):
        return None
    return Outbound("update", last, requester, card_ts=status_ts, status=view)


def _notes(state: ThreadState, call_id: str) -> Notes:
    """What people wrote since the card of ``call_id`` was posted, as ``state`` has it."""
    call = state.pending
    if call is None or call.tool_call_id != call_id:
        return NO_NOTES
    return Notes(call.said_since, call.said_since_count)


def _votes(state: ThreadState, call_id: str) -> Votes:
    """The approvals of ``call_id`` as ``state`` has them (none once it is closed)."""
    call = state.pending
    if call is None or call.tool_call_id != call_id:
        return NO_VOTES
    return Votes(call.votes, call.quorum)


def _reminded(state: ThreadState, call_id: str) -> datetime | None:
    """When the approvers of ``call_id``'s open card were reminded, as ``state`` has it."""
    call = state.pending
    return call.reminded_at if call is not None and call.tool_call_id == call_id else None


def _awaits_votes(state: ThreadState, call_id: str) -> bool:
    call = state.pending
    return call is not None and call.tool_call_id == call_id and call.phase == "awaiting_approval"


def on_call_in(item: Outbound) -> list[str]:
    """The ``oncall:`` entries whose users showing ``item`` names (delivery looks them up
    first): an open card's approvers, a reminder's, an expiry's ``escalate_to``. A call
    that records no rule names none (its card names no approvers either)."""
    call, e = item.call, item.event
    if call is None or item.status is not None:
        return []
    approvers = call.reviewers.approvers if call.reviewers is not None else frozenset()
    if isinstance(e, ev.ApprovalRequested) and item.kind == "post":
        return on_call_entries(list(approvers))
    if not isinstance(item.card, ev.ApprovalRequested):
        return []
    if item.kind == "update":
        return on_call_entries(list(approvers)) if item.still_open else []
    if isinstance(e, ev.ApprovalExpired):
        return on_call_entries(call.escalate_to)
    return on_call_entries(list(approvers))


def render(
    item: Outbound, card_link: str | None = None, on_call: OnCallNow | None = None
) -> list[Block]:
    """The blocks showing ``item`` (pure); ``card_link``: the permalink of the card a
    reminder or an escalation is about, when the delivery could get it; ``on_call``: who
    is on call for the entries :func:`on_call_in` named (None: no PagerDuty here)."""
    e = item.event
    if item.status is not None:
        view = item.status
        blocks = status_message(view.state, e.thread_id, reviewers=view.reviewers)
        if view.root is not None:  # the alert's post, at the top of the channel
            blocks = [*alert_root(view.root, resolved=view.state.alert is None), *blocks]
        return blocks
    if isinstance(item.card, ev.ToolOutcomeUnknown) or isinstance(e, ev.ToolOutcomeUnknown):
        return _reconcile(item)
    if item.kind == "update" and item.still_open:  # the open card, noted or voted on
        assert isinstance(item.card, ev.ApprovalRequested) and item.call is not None
        return _open_card(item, item.card, on_call)
    if item.kind == "update":
        assert isinstance(item.card, ev.ApprovalRequested) and item.call is not None
        by = None if isinstance(e, ev.ApprovalExpired) or e.actor == "system" else e.actor
        return decided_card(
            thread_id=e.thread_id,
            requester=item.requester,
            call=item.call,
            reason=item.card.reason,
            expires_at=item.card.expires_at,
            outcome=OUTCOMES[type(e)],
            by=by,
            at=e.created_at,
            decision_reason=_why(e),
            notes=item.notes,
            people=item.people,
            votes=item.votes,
            edits=item.edits,
            grant=item.created,
        )
    if isinstance(e, ev.ApprovalRequested):
        return _open_card(item, e, on_call)
    if isinstance(e, ev.ApprovalReminded | ev.ApprovalExpired):
        return _about_card(item, e, card_link, on_call)
    if item.grant is not None and item.call is not None:
        return granted_line(item.call, item.grant.reviewer, item.grant.until)
    name = item.call.intent if item.call is not None else None
    return event_line(e, tool_name=name, requester=item.requester, people=item.people) or []


def _why(e: ev.AnyEvent) -> str:
    """What a decided card says why: a reviewer's reject reason, the policy's refusal."""
    return e.reason if isinstance(e, ev.ApprovalRejected | ev.ApprovalEdited) else ""


def _about_card(
    item: Outbound,
    e: ev.ApprovalReminded | ev.ApprovalExpired,
    card_link: str | None,
    on_call: OnCallNow | None,
) -> list[Block]:
    """The reminder in the thread, or the post escalating an expiry."""
    card, call = item.card, item.call
    assert isinstance(card, ev.ApprovalRequested) and call is not None
    when = {"asked_at": card.created_at, "expires_at": card.expires_at}
    if isinstance(e, ev.ApprovalReminded):
        return reminder_reply(
            thread_id=e.thread_id,
            call=call,
            votes=item.votes,
            card_link=card_link,
            on_call=on_call,
            **when,
        )
    return escalation_post(
        thread_id=e.thread_id,
        requester=item.requester,
        call=call,
        escalate_to=call.escalate_to,
        votes=item.votes,
        card_link=card_link,
        channel=item.channel,
        refusal=item.refusal,
        on_call=on_call,
        **when,
    )


def _open_card(
    item: Outbound, card: ev.ApprovalRequested, on_call: OnCallNow | None
) -> list[Block]:
    assert item.call is not None
    blocks = approval_card(
        thread_id=card.thread_id,
        requester=item.requester,
        call=item.call,
        reason=card.reason,
        expires_at=card.expires_at,
        arguments_hash=card.arguments_hash,
        notes=item.notes,
        people=item.people,
        votes=item.votes if item.votes.by else None,
        edits=item.edits,
        reminded_at=item.reminded_at,
    )
    # Who is on call, just above the buttons (the card's last block): what a reviewer
    # reads before clicking.
    entries = on_call_in(item)
    return [*blocks[:-1], *on_call_blocks(entries, on_call), *blocks[-1:]]


def _reconcile(item: Outbound) -> list[Block]:
    """The reconcile card, open (posted for ``tool_outcome_unknown``) or settled."""
    call, e = item.call, item.event
    assert call is not None
    if item.kind == "post":
        assert isinstance(e, ev.ToolOutcomeUnknown)
        return reconcile_card(
            thread_id=e.thread_id,
            requester=item.requester,
            call=call,
            unknown=e,
            arguments_hash=arguments_hash(call.intent, call.arguments),
            people=item.people,
        )
    assert isinstance(item.card, ev.ToolOutcomeUnknown)
    decided = e if isinstance(e, ev.ReconcileDecided) else None
    return reconciled_card(
        thread_id=e.thread_id,
        requester=item.requester,
        call=call,
        unknown=item.card,
        outcome=decided.decision if decided else "cancelled",
        by=decided.reviewer if decided else (None if e.actor == "system" else e.actor),
        at=e.created_at,
        note=decided.note if decided else "",
    )


def metadata(
    thread_id: str, event_id: str, upto: str = "", *, stream: bool = False
) -> dict[str, Any]:
    """The Slack message metadata naming the event a message shows (and for the status
    message, ``upto``: the last event whose state it shows). ``stream``: a plan
    message's (set when it is stopped), naming the run's input; a post showing that
    input (the status message) is another message."""
    payload = {"thread_id": thread_id, "event_id": event_id}
    if upto:
        payload["upto"] = upto
    if stream:
        payload["kind"] = "stream"
    return {"event_type": METADATA_TYPE, "event_payload": payload}


def shown_event(message: dict[str, Any], thread_id: str) -> str | None:
    """The id of the event of ``thread_id`` that a Slack post's metadata names (None
    for a plan message: see :func:`shown_run`)."""
    payload = _payload(message, thread_id)
    if payload is None or payload.get("kind") == "stream":
        return None
    event_id = payload.get("event_id")
    return event_id if isinstance(event_id, str) else None


def shown_run(message: dict[str, Any], thread_id: str) -> str | None:
    """The input of the run of ``thread_id`` whose plan message this is, by its metadata."""
    payload = _payload(message, thread_id)
    if payload is None or payload.get("kind") != "stream":
        return None
    event_id = payload.get("event_id")
    return event_id if isinstance(event_id, str) else None


def is_ours(message: dict[str, Any]) -> bool:
    """Whether a Slack message carries opsloop's metadata (any thread's)."""
    meta = message.get("metadata")
    return isinstance(meta, dict) and meta.get("event_type") == METADATA_TYPE


def _payload(message: dict[str, Any], thread_id: str) -> dict[str, Any] | None:
    meta = message.get("metadata")
    if not isinstance(meta, dict) or meta.get("event_type") != METADATA_TYPE:
        return None
    payload = meta.get("event_payload")
    if not isinstance(payload, dict) or payload.get("thread_id") != thread_id:
        return None
    return payload


def shown_upto(message: dict[str, Any], thread_id: str) -> str | None:
    """The id of the last event whose state a status message shows, from its metadata."""
    if shown_event(message, thread_id) is None:
        return None
    upto = message["metadata"]["event_payload"].get("upto")
    return upto if isinstance(upto, str) and upto else None
