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
not meet the call's quorum yet: the open card then shows "1 of 2: @bob".

A ``tool_outcome_unknown`` posts the reconcile card (its buttons bound to the call by
its arguments hash), updated in place by the ``reconcile_decided`` (or cancellation)
that closes it.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bot import blocks as bk
from bot.mrkdwn import USER_ID
from engine import events as ev
from engine.policy import arguments_hash
from engine.state import ThreadState, apply

METADATA_TYPE = "opsloop_event"
# The events that close an open approval card, and what the card then says.
OUTCOMES: dict[type[ev.Event], bk.Outcome] = {
    ev.ApprovalGranted: "approved",
    ev.ApprovalRejected: "rejected",
    ev.ApprovalExpired: "expired",
    ev.ThreadCancelled: "cancelled",
}
Card = ev.ApprovalRequested | ev.ToolOutcomeUnknown  # the event a card's metadata names
# What posts a card, and what settles a reconcile card: with OUTCOMES, every type people
# see on a card (``Facts.people == "card"``; a test checks none is left out).
CARD_POSTS: tuple[type[ev.ApprovalRequested], type[ev.ToolOutcomeUnknown]] = (
    ev.ApprovalRequested,
    ev.ToolOutcomeUnknown,
)
RECONCILE_OUTCOMES: tuple[type[ev.ReconcileDecided]] = (ev.ReconcileDecided,)


@dataclass(frozen=True)
class StatusView:
    """What the thread's status message shows: ``state``, the state after event ``upto``.

    ``anchor`` is the thread's first ``user_message``, the event the message's metadata
    (and its first receipt) names; ``approvers`` are named while an approval is awaited.
    """

    state: ThreadState
    anchor: str
    upto: str
    approvers: tuple[str, ...] = ()


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
    """

    kind: Literal["post", "update"]
    event: ev.AnyEvent
    requester: str | None = None
    call: ev.ToolCallRequested | None = None
    card: Card | None = None
    card_ts: str = ""
    status: StatusView | None = None
    notes: bk.Notes = bk.NO_NOTES
    people: frozenset[str] = frozenset()
    votes: bk.Votes = bk.NO_VOTES
    still_open: bool = False


def pending_deliveries(
    events: Sequence[ev.AnyEvent], *, approvers: Sequence[str] = ()
) -> list[Outbound]:
    """What a whole log still has to show, in log order (pure).

    An event with a receipt is shown. A card update is done when a receipt for the
    closing event carries the card's ts; a cancellation also posts its own line, whose
    receipt has another ts.

    The thread's status message comes first and is updated last: see :func:`_status`.
    Receipts carrying its ts say what it shows, so they do not count for lines and cards.
    """
    receipts: dict[str, list[str]] = {}
    for e in events:
        if isinstance(e, ev.MessagePosted):
            receipts.setdefault(e.shows_event_id, []).append(e.ts)
    first = next((e for e in events if isinstance(e, ev.UserMessage)), None)
    # The status message's ts: the first receipt of the first user_message carries it.
    status_ts = next((ts for ts in receipts.get(first.event_id, ()) if ts), "") if first else ""
    out: list[Outbound] = []
    requester = first.actor if first is not None else None
    calls: dict[str, ev.ToolCallRequested] = {}
    cards: dict[str, tuple[ev.ApprovalRequested, str]] = {}  # open cards: call id -> (card, ts)
    checks: dict[str, tuple[ev.ToolOutcomeUnknown, str]] = {}  # open reconcile cards, alike
    noted: dict[str, Outbound] = {}  # open cards' latest undelivered update (a note, a vote)
    people: frozenset[str] = frozenset()
    state = ThreadState()

    def still_open(e: ev.AnyEvent, cid: str, shown: list[str]) -> None:
        """The open card of ``cid`` shows what ``e`` changed: the latest such update
        stands for the earlier ones (it shows them too)."""
        card, ts = cards[cid]
        if (stale := noted.pop(cid, None)) is not None:
            out.remove(stale)
        if not ts or ts not in shown:
            noted[cid] = Outbound(
                "update",
                e,
                requester,
                calls[cid],
                card,
                ts,
                notes=_notes(state, cid),
                people=people,
                votes=_votes(state, cid),
                still_open=True,
            )
            out.append(noted[cid])

    for e in events:
        before, state = state, apply(state, e)
        if USER_ID.match(e.actor) and e.actor not in people:
            people = people | {e.actor}
        shown = [ts for ts in receipts.get(e.event_id, ()) if not (ts and ts == status_ts)]
        cid = getattr(e, "tool_call_id", None) or ""
        if isinstance(e, ev.ToolCallRequested):
            calls[e.tool_call_id] = e
        elif isinstance(e, CARD_POSTS) and cid in calls:
            if not shown:
                out.append(Outbound("post", e, requester, calls[cid], people=people))
            if isinstance(e, ev.ApprovalRequested):
                cards[cid] = (e, shown[0] if shown else "")
            else:
                checks[cid] = (e, shown[0] if shown else "")
            continue
        elif isinstance(e, ev.UserMessage):
            for open_cid in list(cards):
                if _notes(state, open_cid).latest:
                    still_open(e, open_cid, shown)
        elif isinstance(e, ev.ApprovalGranted) and cid in cards and _awaits_votes(state, cid):
            still_open(e, cid, shown)  # a vote short of the quorum
            continue
        closing: list[tuple[ev.ApprovalRequested, str]] = []
        settled: list[tuple[ev.ToolOutcomeUnknown, str]] = []
        if isinstance(e, ev.ThreadCancelled):
            closing, cards = list(cards.values()), {}
            settled, checks = list(checks.values()), {}
        elif type(e) in OUTCOMES and (open_card := cards.pop(cid, None)):
            closing = [open_card]
        elif isinstance(e, RECONCILE_OUTCOMES) and (open_check := checks.pop(cid, None)):
            settled = [open_check]
        for card, ts in closing:
            if (stale := noted.pop(card.tool_call_id, None)) is not None:
                out.remove(stale)  # the decided card shows them too
            if not ts or ts not in shown:
                call = calls[card.tool_call_id]
                notes = _notes(before, card.tool_call_id)
                # The votes the card had, and the one that met the quorum.
                voted = state if isinstance(e, ev.ApprovalGranted) else before
                votes = _votes(voted, call.tool_call_id)
                out.append(
                    Outbound(
                        "update",
                        e,
                        requester,
                        call,
                        card,
                        ts,
                        notes=notes,
                        people=people,
                        votes=votes,
                    )
                )
        for check, ts in settled:
            if not ts or ts not in shown:
                call = calls[check.tool_call_id]
                out.append(Outbound("update", e, requester, call, check, ts, people=people))
        card_ts = {ts for _, ts in closing} | {ts for _, ts in settled}
        if _has_line(e) and not [ts for ts in shown if ts not in card_ts]:
            out.append(Outbound("post", e, requester, calls.get(cid), people=people))
    if first is not None and (status := _status(events, first, status_ts, receipts, approvers)):
        if status.kind == "post":
            out.insert(0, status)
        else:
            out.append(status)
    return out


def _status(
    events: Sequence[ev.AnyEvent],
    first: ev.UserMessage,
    status_ts: str,
    receipts: dict[str, list[str]],
    approvers: Sequence[str],
) -> Outbound | None:
    """The status message to post (none has a receipt yet), or to update (what it shows
    differs from what the whole log says), or None.

    A receipt of event E carrying the status message's ts records that it shows the
    state after E; the latest such E in log order is what it shows now. Posting it
    records two: the first ``user_message``'s, and the last event's, whose state it shows.
    """
    last = next(e for e in reversed(events) if not isinstance(e, ev.MessagePosted))
    state = shown = ThreadState()
    for e in events:
        state = apply(state, e)
        if status_ts and status_ts in receipts.get(e.event_id, ()):
            shown = state
    view = StatusView(state, first.event_id, last.event_id, tuple(approvers))
    if first.event_id not in receipts:
        return Outbound("post", first, first.actor, status=view)
    if not status_ts:
        return None  # a receipt without a ts: nothing to update
    tid = first.thread_id
    if bk.status_message(shown, tid, approvers=approvers) == bk.status_message(
        state, tid, approvers=approvers
    ):
        return None
    return Outbound("update", last, first.actor, card_ts=status_ts, status=view)


def _notes(state: ThreadState, call_id: str) -> bk.Notes:
    """What people wrote since the card of ``call_id`` was posted, as ``state`` has it."""
    call = state.pending
    if call is None or call.tool_call_id != call_id:
        return bk.NO_NOTES
    return bk.Notes(call.said_since, call.said_since_count)


def _votes(state: ThreadState, call_id: str) -> bk.Votes:
    """The approvals of ``call_id`` as ``state`` has them (none once it is closed)."""
    call = state.pending
    if call is None or call.tool_call_id != call_id:
        return bk.NO_VOTES
    return bk.Votes(call.votes, call.quorum)


def _awaits_votes(state: ThreadState, call_id: str) -> bool:
    call = state.pending
    return call is not None and call.tool_call_id == call_id and call.phase == "awaiting_approval"


def _has_line(e: ev.AnyEvent) -> bool:
    if isinstance(e, ev.ToolCallRequested):
        return e.policy != "approve_before_run"  # its approval card shows it
    return e.facts.people == "line"


def render(item: Outbound) -> list[bk.Block]:
    """The blocks showing ``item`` (pure)."""
    e = item.event
    if item.status is not None:
        view = item.status
        return bk.status_message(view.state, e.thread_id, approvers=view.approvers)
    if isinstance(item.card, ev.ToolOutcomeUnknown) or isinstance(e, ev.ToolOutcomeUnknown):
        return _reconcile(item)
    if item.kind == "update" and item.still_open:  # the open card, noted or voted on
        assert isinstance(item.card, ev.ApprovalRequested) and item.call is not None
        return _open_card(item, item.card)
    if item.kind == "update":
        assert isinstance(item.card, ev.ApprovalRequested) and item.call is not None
        by = None if isinstance(e, ev.ApprovalExpired) or e.actor == "system" else e.actor
        return bk.decided_card(
            thread_id=e.thread_id,
            requester=item.requester,
            call=item.call,
            reason=item.card.reason,
            expires_at=item.card.expires_at,
            outcome=OUTCOMES[type(e)],
            by=by,
            at=e.created_at,
            decision_reason=e.reason if isinstance(e, ev.ApprovalRejected) else "",
            notes=item.notes,
            people=item.people,
            votes=item.votes,
        )
    if isinstance(e, ev.ApprovalRequested):
        return _open_card(item, e)
    name = item.call.intent if item.call is not None else None
    return bk.event_line(e, tool_name=name, requester=item.requester, people=item.people) or []


def _open_card(item: Outbound, card: ev.ApprovalRequested) -> list[bk.Block]:
    assert item.call is not None
    return bk.approval_card(
        thread_id=card.thread_id,
        requester=item.requester,
        call=item.call,
        reason=card.reason,
        expires_at=card.expires_at,
        arguments_hash=card.arguments_hash,
        notes=item.notes,
        people=item.people,
        votes=item.votes if item.votes.by else None,
    )


def _reconcile(item: Outbound) -> list[bk.Block]:
    """The reconcile card, open (posted for ``tool_outcome_unknown``) or settled."""
    call, e = item.call, item.event
    assert call is not None
    if item.kind == "post":
        assert isinstance(e, ev.ToolOutcomeUnknown)
        return bk.reconcile_card(
            thread_id=e.thread_id,
            requester=item.requester,
            call=call,
            unknown=e,
            arguments_hash=arguments_hash(call.intent, call.arguments),
            people=item.people,
        )
    assert isinstance(item.card, ev.ToolOutcomeUnknown)
    decided = e if isinstance(e, ev.ReconcileDecided) else None
    return bk.reconciled_card(
        thread_id=e.thread_id,
        requester=item.requester,
        call=call,
        unknown=item.card,
        outcome=decided.decision if decided else "cancelled",
        by=decided.reviewer if decided else (None if e.actor == "system" else e.actor),
        at=e.created_at,
        note=decided.note if decided else "",
    )


def metadata(thread_id: str, event_id: str, upto: str = "") -> dict[str, Any]:
    """The Slack message metadata naming the event a message shows (and for the status
    message, ``upto``: the last event whose state it shows)."""
    payload = {"thread_id": thread_id, "event_id": event_id}
    if upto:
        payload["upto"] = upto
    return {"event_type": METADATA_TYPE, "event_payload": payload}


def shown_event(message: dict[str, Any], thread_id: str) -> str | None:
    """The id of the event of ``thread_id`` that a Slack message's metadata names."""
    meta = message.get("metadata")
    if not isinstance(meta, dict) or meta.get("event_type") != METADATA_TYPE:
        return None
    payload = meta.get("event_payload")
    if not isinstance(payload, dict) or payload.get("thread_id") != thread_id:
        return None
    event_id = payload.get("event_id")
    return event_id if isinstance(event_id, str) else None


def shown_upto(message: dict[str, Any], thread_id: str) -> str | None:
    """The id of the last event whose state a status message shows, from its metadata."""
    if shown_event(message, thread_id) is None:
        return None
    upto = message["metadata"]["event_payload"].get("upto")
    return upto if isinstance(upto, str) and upto else None
