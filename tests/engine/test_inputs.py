"""Front-door functions on both backends: messages, replies, approval clicks, cancels."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from engine import events as ev
from engine.config_file import PolicyRule
from engine.errors import ThreadNotFound
from engine.inputs import (
    Accepted,
    Decidable,
    Decider,
    Edit,
    Invalid,
    Org,
    Refused,
    answer_clarification,
    cancel,
    check_reconcile,
    decide_approval,
    decide_reconcile,
    edit_call,
    finish_wait,
    post_user_message,
)
from engine.policy import arguments_hash
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.state import ThreadState
from engine.store import Store, ThreadKey, open_store
from tests.support.logs import answered, approval_pending, clarification_asked, waiting_on_job
from tools import ToolContext, ToolRegistry, tool

REQ = "U0REQUEST"
BOSS = "U0BOSS"
ONCALL = "S0ONCALL"
OPEN = ReviewerRule()  # anyone but the requester
STRICT = ReviewerRule(frozenset({BOSS, ONCALL}))
CALL = "toolu_9"
ARGS = {"service": "api", "env": "staging"}
HASH = arguments_hash("deploy", ARGS)


def key(ts: str = "1700000000.000100") -> ThreadKey:
    return ThreadKey("T1", "C1", ts)


async def started_thread(store: Store, ts: str = "1.0") -> str:
    posted = await post_user_message(
        store, key(ts), text="deploy api to staging", user=REQ, dedupe_key=f"Ev{ts}"
    )
    return posted.thread_id


async def awaiting_approval(store: Store, ts: str = "1.0") -> str:
    """A thread whose call CALL waits for approval (appended directly, no runner)."""
    tid = await started_thread(store, ts)
    state = await store.load(tid)
    expires = ev.utcnow() + timedelta(days=1)
    await store.append(
        tid, state.last_seq, approval_pending(CALL, expires_at=expires, thread_id=tid)
    )
    assert (await store.load(tid)).status == "awaiting_approval"
    return tid


async def types(store: Store, tid: str) -> list[str]:
    return [e.type for e in await store.select_events(tid)]


def same_but_seq(after: ThreadState, before: ThreadState) -> bool:
    return after.model_copy(update={"last_seq": before.last_seq}) == before


# --- messages -------------------------------------------------------------------------


async def test_post_user_message_creates_the_thread_and_dedupes(store: Store) -> None:
    first = await post_user_message(
        store, key(), text="deploy api", user=REQ, dedupe_key="Ev01", source={"ts": "1.0"}
    )
    assert isinstance(first, Accepted) and not first.deduplicated
    assert first.event.type == "user_message" and first.event.seq == 1
    assert await store.find_thread(key()) == first.thread_id
    state = await store.load(first.thread_id)
    assert (state.status, state.requester) == ("running", REQ)

    again = await post_user_message(store, key(), text="deploy api", user=REQ, dedupe_key="Ev01")
    assert again.deduplicated and again.thread_id == first.thread_id
    assert again.event == first.event
    assert await types(store, first.thread_id) == ["user_message"]

    other = await post_user_message(store, key(), text="and web", user="U0OTHER", dedupe_key="Ev02")
    assert not other.deduplicated and other.event.seq == 2
    assert (await store.load(first.thread_id)).requester == REQ


async def test_a_message_that_may_not_start_a_thread_needs_one(store: Store) -> None:
    with pytest.raises(ThreadNotFound):
        await post_user_message(store, key("9.0"), text="hi", user=REQ, start=False)
    assert await store.list_threads() == []  # nothing written
    tid = await started_thread(store, "9.0")
    done = await post_user_message(store, key("9.0"), text="and?", user=REQ, start=False)
    assert done.thread_id == tid and done.event.type == "user_message"


async def test_concurrent_redeliveries_store_one_message(store: Store, db_url: str) -> None:
    stores = [await open_store(db_url, create=False, pool_size=1) for _ in range(5)]
    try:
        results = await asyncio.gather(
            *(
                post_user_message(s, key(), text="hello", user=REQ, dedupe_key="Ev01")
                for s in stores
            )
        )
    finally:
        for s in stores:
            await s.close()
    assert len({r.thread_id for r in results}) == 1
    assert [r.deduplicated for r in results].count(False) == 1
    assert len({r.event.event_id for r in results}) == 1
    assert await types(store, results[0].thread_id) == ["user_message"]


async def test_a_reply_while_awaiting_reply_answers_the_question(store: Store) -> None:
    tid = await started_thread(store)
    await store.append(tid, 1, clarification_asked("toolu_4", "Which region?"))
    source = {"kind": "slack", "names": {"U0CAROL": "carol"}}
    reply = await post_user_message(
        store, key("1.0"), text="eu-west", user=REQ, dedupe_key="Ev02", source=source
    )
    assert isinstance(reply.event, ev.ClarificationAnswered)
    assert (reply.event.tool_call_id, reply.event.text) == ("toolu_4", "eu-west")
    assert reply.event.source == source  # the projection decodes an answer like a message
    state = await store.load(tid)
    assert (state.status, state.question) == ("running", None)
    # Now nothing is asked: a direct answer is refused, a message is a message.
    refused = await answer_clarification(store, tid, text="late", user=REQ)
    assert isinstance(refused, Refused) and "not waiting" in refused.reason
    more = await post_user_message(store, key("1.0"), text="thanks", user=REQ)
    assert more.event.type == "user_message"


async def test_answer_clarification_answers_the_open_question(store: Store) -> None:
    tid = await started_thread(store)
    await store.append(tid, 1, clarification_asked("toolu_4"))
    done = await answer_clarification(store, tid, text="prod", user=REQ, dedupe_key="Ev05")
    assert isinstance(done, Accepted) and done.event.type == "clarification_answered"
    again = await answer_clarification(store, tid, text="prod", user=REQ, dedupe_key="Ev05")
    # The question is closed: a redelivery writes nothing, whether refused or deduplicated.
    assert isinstance(again, Refused) or again.deduplicated
    assert (await types(store, tid)).count("clarification_answered") == 1


# --- approvals ------------------------------------------------------------------------


async def decide(store: Store, thread_id: str, **overrides: Any) -> Accepted | Refused:
    """``decide_approval`` as the card's reviewer clicks Approve on the pending call;
    ``overrides`` change one thing at a time."""
    click: dict[str, Any] = {
        "tool_call_id": CALL,
        "decider": Decider("U0REVIEW"),
        "decision": "approve",
        "reviewers": OPEN,
        "arguments_hash": HASH,
    }
    return await decide_approval(store, thread_id, **{**click, **overrides})


async def test_approve(store: Store) -> None:
    tid = await awaiting_approval(store)
    done = await decide(store, tid)
    assert isinstance(done, Accepted)
    assert isinstance(done.event, ev.ApprovalGranted) and done.event.actor == "U0REVIEW"
    state = await store.load(tid)
    assert state.status == "running"
    assert state.pending is not None and state.pending.phase == "ready"


async def test_reject_with_reason(store: Store) -> None:
    tid = await awaiting_approval(store)
    done = await decide(store, tid, decision="reject", reason="change freeze until Monday")
    assert isinstance(done, Accepted) and isinstance(done.event, ev.ApprovalRejected)
    assert done.event.reason == "change freeze until Monday"
    state = await store.load(tid)
    assert (state.status, state.pending) == ("running", None)


@pytest.mark.parametrize(
    ("first", "second", "verdict"),
    [
        ("approve", "approve", "approved"),
        ("approve", "reject", "approved"),
        ("reject", "approve", "rejected"),
    ],
)
async def test_second_click_is_refused_naming_the_first_decider(
    store: Store, first: str, second: str, verdict: str
) -> None:
    tid = await awaiting_approval(store)
    won = await decide(
        store, tid, decider=Decider("U0FIRST"), decision=first, dedupe_key="1700000001.000001"
    )
    assert isinstance(won, Accepted)
    before = await store.load(tid)
    lost = await decide(
        store, tid, decider=Decider("U0SECOND"), decision=second, dedupe_key="1700000002.000002"
    )
    assert isinstance(lost, Refused)
    assert re.fullmatch(rf"already {verdict} by U0FIRST at \d\d:\d\d UTC", lost.reason)
    assert isinstance(lost.event, ev.ApprovalRefused)
    assert (lost.event.actor, lost.event.decision, lost.event.reason) == (
        "U0SECOND",
        second,
        lost.reason,
    )
    assert same_but_seq(await store.load(tid), before)
    kinds = await types(store, tid)
    assert kinds.count("approval_granted") + kinds.count("approval_rejected") == 1


async def test_concurrent_clicks_decide_once(store: Store, db_url: str) -> None:
    tid = await awaiting_approval(store)
    stores = [await open_store(db_url, create=False, pool_size=1) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                decide(
                    s,
                    tid,
                    decider=Decider(f"U0REV{i}"),
                    decision="approve" if i % 2 else "reject",
                    dedupe_key=f"17000000{i}.0",
                )
                for i, s in enumerate(stores)
            )
        )
    finally:
        for s in stores:
            await s.close()
    winners = [r for r in results if isinstance(r, Accepted)]
    assert len(winners) == 1
    who = winners[0].event.actor
    for r in results:
        if isinstance(r, Refused):
            assert f"by {who} at" in r.reason
    kinds = await types(store, tid)
    assert kinds.count("approval_granted") + kinds.count("approval_rejected") == 1
    assert kinds.count("approval_refused") == 3


async def test_unauthorised_reviewer_is_refused_and_audited(store: Store) -> None:
    tid = await awaiting_approval(store)
    before = await store.load(tid)
    refused = await decide(
        store, tid, decider=Decider("U0RANDOM", frozenset(["S0OTHER"])), reviewers=STRICT
    )
    assert isinstance(refused, Refused) and "approvers list" in refused.reason
    assert isinstance(refused.event, ev.ApprovalRefused)
    assert (refused.event.actor, refused.event.tool_call_id) == ("U0RANDOM", CALL)
    after = await store.load(tid)
    assert after.last_seq == before.last_seq + 1
    assert same_but_seq(after, before)
    assert (await types(store, tid))[-1] == "approval_refused"

    for reviewer, groups in [(BOSS, []), ("U0MEMBER", [ONCALL])]:
        tid2 = await awaiting_approval(store, ts=f"2.{reviewer}")
        ok = await decide(
            store, tid2, decider=Decider(reviewer, frozenset(groups)), reviewers=STRICT
        )
        assert isinstance(ok, Accepted) and ok.event.type == "approval_granted"


async def test_self_approval_is_refused_unless_allowed(store: Store) -> None:
    tid = await awaiting_approval(store)
    before = await store.load(tid)
    refused = await decide(store, tid, decider=Decider(REQ))
    assert isinstance(refused, Refused) and "self-approval" in refused.reason
    assert same_but_seq(await store.load(tid), before)
    allowed = await decide(
        store, tid, decider=Decider(REQ), reviewers=ReviewerRule(allow_self=True)
    )
    assert isinstance(allowed, Accepted) and allowed.event.actor == REQ


async def test_requester_may_withdraw_their_own_call(store: Store) -> None:
    tid = await awaiting_approval(store)
    done = await decide(
        store,
        tid,
        decider=Decider(REQ),
        decision="reject",
        reviewers=STRICT,
        reason="wrong service",
    )
    assert isinstance(done, Accepted) and done.event.type == "approval_rejected"


async def test_a_stale_card_is_refused(store: Store) -> None:
    tid = await awaiting_approval(store)
    stale = arguments_hash("deploy", {**ARGS, "env": "prod"})
    refused = await decide(store, tid, arguments_hash=stale)
    assert isinstance(refused, Refused) and "arguments differ" in refused.reason
    assert (await store.load(tid)).status == "awaiting_approval"
    ok = await decide(store, tid)
    assert isinstance(ok, Accepted)


async def test_redelivered_click_is_a_no_op(store: Store) -> None:
    tid = await awaiting_approval(store)
    click = {
        "tool_call_id": CALL,
        "decider": Decider("U0REVIEW"),
        "decision": "approve",
        "reviewers": OPEN,
    }
    first = await decide_approval(store, tid, **click, dedupe_key="1700000001.000001")
    seq = (await store.load(tid)).last_seq
    again = await decide_approval(store, tid, **click, dedupe_key="1700000001.000001")
    assert isinstance(first, Accepted) and not first.deduplicated
    assert isinstance(again, Accepted) and again.deduplicated
    assert again.event == first.event
    assert (await store.load(tid)).last_seq == seq
    assert (await types(store, tid)).count("approval_granted") == 1
    assert "approval_refused" not in await types(store, tid)


async def test_redelivered_refused_click_is_refused_once(store: Store) -> None:
    tid = await awaiting_approval(store)
    click = {
        "tool_call_id": CALL,
        "decider": Decider("U0RANDOM"),
        "decision": "approve",
        "reviewers": STRICT,
    }
    first = await decide_approval(store, tid, **click, dedupe_key="1700000001.000001")
    again = await decide_approval(store, tid, **click, dedupe_key="1700000001.000001")
    assert isinstance(first, Refused) and isinstance(again, Refused)
    assert again.event == first.event and again.reason == first.reason
    assert (await types(store, tid)).count("approval_refused") == 1


@pytest.mark.parametrize(
    ("closing", "reason"),
    [
        (ev.ApprovalExpired(tool_call_id=CALL), "the approval expired"),
        (ev.ThreadCancelled(actor=REQ), "the thread was cancelled"),
    ],
)
async def test_a_closed_call_is_refused_saying_why(
    store: Store, closing: ev.Event, reason: str
) -> None:
    tid = await awaiting_approval(store)
    await store.append(tid, (await store.load(tid)).last_seq, [closing])
    refused = await decide(store, tid)
    assert isinstance(refused, Refused) and refused.reason.startswith(reason)


async def test_an_unknown_call_is_refused(store: Store) -> None:
    tid = await awaiting_approval(store)
    refused = await decide(store, tid, tool_call_id="toolu_nope")
    assert isinstance(refused, Refused) and "no such call" in refused.reason
    assert isinstance(refused.event, ev.ApprovalRefused)
    assert (await store.load(tid)).status == "awaiting_approval"


# --- waits and cancels ----------------------------------------------------------------


async def test_finish_wait_once(store: Store) -> None:
    tid = await started_thread(store)
    await store.append(tid, 1, waiting_on_job("toolu_3", f"{tid}.w1"))
    done = await finish_wait(store, tid, wait_id=f"{tid}.w1", result={"ok": 1}, dedupe_key="hook1")
    assert isinstance(done, Accepted) and done.event.type == "wait_finished"
    assert (await store.load(tid)).status == "running"
    again = await finish_wait(store, tid, wait_id=f"{tid}.w1", result={"ok": 1}, dedupe_key="hook1")
    assert isinstance(again, Accepted) and again.deduplicated and again.event == done.event
    other = await finish_wait(store, tid, wait_id=f"{tid}.w2", result={})
    assert isinstance(other, Refused) and "no open wait" in other.reason


async def test_requester_and_approvers_may_cancel_others_may_not(store: Store) -> None:
    tid = await awaiting_approval(store)
    before = await store.load(tid)
    refused = await cancel(store, tid, decider=Decider("U0RANDOM"), reviewers=STRICT)
    assert isinstance(refused, Refused) and "requester or an approver" in refused.reason
    assert isinstance(refused.event, ev.ApprovalRefused)
    assert same_but_seq(await store.load(tid), before)

    done = await cancel(store, tid, decider=Decider(REQ), reviewers=STRICT, reason="not needed")
    assert isinstance(done, Accepted) and isinstance(done.event, ev.ThreadCancelled)
    assert done.event.reason == "not needed"
    assert (await store.load(tid)).status == "cancelled"
    twice = await cancel(store, tid, decider=Decider(REQ), reviewers=STRICT)
    assert isinstance(twice, Refused) and "cancelled" in twice.reason

    for who, groups in [(BOSS, []), ("U0MEMBER", [ONCALL])]:
        other = await awaiting_approval(store, ts=f"3.{who}")
        ok = await cancel(store, other, decider=Decider(who, frozenset(groups)), reviewers=STRICT)
        assert isinstance(ok, Accepted)
    # With no approvers list, any approver (anyone) may cancel.
    anyone = await awaiting_approval(store, ts="4.0")
    assert isinstance(
        await cancel(store, anyone, decider=Decider("U0RANDOM"), reviewers=OPEN), Accepted
    )


async def test_a_thread_with_nothing_in_it_cannot_be_cancelled(store: Store) -> None:
    tid = await store.create_thread(key("9.9"))
    refused = await cancel(store, tid, decider=Decider(REQ), reviewers=OPEN)
    assert isinstance(refused, Refused) and "new" in refused.reason
    assert await store.select_events(tid) == []


# --- quorum and the call's own reviewer rule (issue 9) ----------------------------------

BOB, CAROL = "U0BOB", "U0CAROL"
SRE = "S0SRE"


def restart_log(tid: str, approvers: tuple[str, ...], quorum: int = 1) -> list[ev.Event]:
    """A non-idempotent call whose rule names ``approvers`` and ``quorum``, at its card."""
    return [
        ev.ModelDecision(actor="model", tool_name="restart", tool_call_id=CALL, arguments=ARGS),
        ev.ToolCallRequested(
            tool_call_id=CALL,
            intent="restart",
            arguments=ARGS,
            policy="approve_before_run",
            idempotency_key=f"{tid}:{CALL}",
            rule=0,
            approvers=approvers,
            quorum=quorum,
            allow_self=False,
            idempotent=False,
        ),
        ev.ApprovalRequested(
            tool_call_id=CALL,
            arguments_hash=arguments_hash("restart", ARGS),
            expires_at=ev.utcnow() + timedelta(days=1),
        ),
    ]


async def ruled_thread(store: Store, approvers: tuple[str, ...], quorum: int = 1) -> str:
    tid = await started_thread(store)
    state = await store.load(tid)
    await store.append(tid, state.last_seq, restart_log(tid, approvers, quorum))
    return tid


async def vote(store: Store, tid: str, decider: Decider, **kw: Any) -> Accepted | Refused:
    return await decide_approval(
        store, tid, tool_call_id=CALL, decision="approve", reviewers=OPEN, decider=decider, **kw
    )


async def test_a_quorum_of_two_needs_two_people_and_refuses_a_second_vote(store: Store) -> None:
    tid = await ruled_thread(store, (BOB, CAROL), quorum=2)
    assert isinstance(await vote(store, tid, Decider(BOB)), Accepted)
    state = await store.load(tid)
    assert state.status == "awaiting_approval" and state.pending is not None
    assert state.pending.votes == (BOB,)
    again = await vote(store, tid, Decider(BOB), dedupe_key="click:2")
    assert isinstance(again, Refused) and "already approved" in again.reason
    assert (await types(store, tid))[-1] == "approval_refused"
    assert isinstance(await vote(store, tid, Decider(CAROL)), Accepted)
    state = await store.load(tid)
    assert state.status == "running" and state.pending is not None
    assert state.pending.phase == "ready"
    late = await vote(store, tid, Decider(BOSS))
    assert isinstance(late, Refused) and late.reason.startswith(f"already approved by {CAROL}")


async def test_the_calls_approvers_override_the_process_policy(store: Store) -> None:
    tid = await ruled_thread(store, (BOB,))
    # OPEN would let anyone in; the rule names only BOB.
    refused = await vote(store, tid, Decider(BOSS))
    assert isinstance(refused, Refused) and refused.reason == "you are not on the approvers list"
    mine = await vote(store, tid, Decider(REQ))
    assert isinstance(mine, Refused) and "self-approval" in mine.reason
    assert isinstance(await vote(store, tid, Decider(BOB)), Accepted)


async def test_a_rules_group_is_resolved_only_when_needed(store: Store) -> None:
    tid = await ruled_thread(store, (SRE,))
    asked: list[frozenset[str]] = []

    async def resolve(groups: frozenset[str]) -> frozenset[str]:
        asked.append(groups)
        return groups if len(asked) > 1 else frozenset()

    outsider = await vote(store, tid, Decider(BOSS, resolve=resolve))
    assert isinstance(outsider, Refused) and asked == [frozenset({SRE})]
    assert isinstance(await vote(store, tid, Decider(BOB, resolve=resolve)), Accepted)
    assert len(asked) == 2


async def test_an_oncall_approver_is_whoever_the_front_door_finds_on_call_at_the_click(
    store: Store,
) -> None:
    tid = await ruled_thread(store, ("oncall:PXYZ", SRE))
    asked: list[frozenset[str]] = []

    def on_call(user: str) -> Decider:
        """``user`` as the front door sees them: BOB is on call for PXYZ now."""

        async def resolve(entries: frozenset[str]) -> frozenset[str]:
            asked.append(entries)
            return entries & {"oncall:PXYZ"} if user == BOB else frozenset()

        return Decider(user, resolve=resolve)

    refused = await vote(store, tid, on_call(BOSS))
    assert isinstance(refused, Refused)
    assert refused.reason == "you are not on the approvers list, nor on call for it now"
    assert asked == [frozenset({"oncall:PXYZ", SRE})]  # asked at the click, with the groups
    assert isinstance(await vote(store, tid, on_call(BOB)), Accepted)


# --- who may cancel: the pending call's own rule (issue 21) ----------------------------


async def test_cancel_by_someone_who_may_not_decide_the_call_is_refused_and_recorded(
    store: Store,
) -> None:
    tid = await ruled_thread(store, (BOB,))  # no process approvers: OPEN
    before = await store.load(tid)
    assert isinstance(await vote(store, tid, Decider(BOSS)), Refused)
    refused = await cancel(store, tid, decider=Decider(BOSS), reviewers=OPEN, dedupe_key="click:1")
    assert isinstance(refused, Refused)
    assert refused.reason == "only the requester or an approver of the pending call can cancel"
    event = refused.event
    assert isinstance(event, ev.ApprovalRefused)
    assert (event.actor, event.decision, event.tool_call_id) == (BOSS, "cancel", CALL)
    assert (await types(store, tid))[-1] == "approval_refused"
    after = await store.load(tid)
    assert after.status == "awaiting_approval" and after.last_seq == before.last_seq + 2
    again = await cancel(store, tid, decider=Decider(BOSS), reviewers=OPEN, dedupe_key="click:1")
    assert isinstance(again, Refused) and again.event == event  # a redelivery records once
    assert (await store.load(tid)).last_seq == after.last_seq


async def test_the_rules_own_approver_may_cancel_though_the_process_names_others(
    store: Store,
) -> None:
    tid = await ruled_thread(store, (BOB,))
    # STRICT names BOSS and ONCALL for the process; this call's rule names only BOB.
    boss = await cancel(store, tid, decider=Decider(BOSS), reviewers=STRICT)
    assert isinstance(boss, Refused) and isinstance(boss.event, ev.ApprovalRefused)
    done = await cancel(store, tid, decider=Decider(BOB), reviewers=STRICT, reason="not today")
    assert isinstance(done, Accepted) and isinstance(done.event, ev.ThreadCancelled)
    assert (await store.load(tid)).status == "cancelled"

    # A rule's user group is resolved as the approve path resolves it.
    async def resolve(groups: frozenset[str]) -> frozenset[str]:
        return groups & {SRE}

    grouped = await started_thread(store, "2.0")
    await store.append(grouped, 1, restart_log(grouped, (SRE,)))
    member = Decider(CAROL, resolve=resolve)
    assert isinstance(await cancel(store, grouped, decider=member, reviewers=STRICT), Accepted)


@pytest.mark.parametrize("pending", [True, False])
async def test_the_requester_may_cancel_whatever_the_rule_says(store: Store, pending: bool) -> None:
    # The rule names only BOB and turns self-approval off; no process approvers.
    tid = await ruled_thread(store, (BOB,))
    if not pending:
        state = await store.load(tid)
        await store.append(tid, state.last_seq, [ev.ApprovalRejected(actor=BOB, tool_call_id=CALL)])
        await store.append(tid, state.last_seq + 1, answered("not deployed"))
        assert (await store.load(tid)).pending is None
    done = await cancel(store, tid, decider=Decider(REQ), reviewers=OPEN)
    assert isinstance(done, Accepted) and done.event.type == "thread_cancelled"


async def test_a_stranger_cannot_cancel_a_finished_thread_when_no_approvers_are_set(
    store: Store,
) -> None:
    tid = await started_thread(store)
    await store.append(tid, 1, answered("done"))
    assert (await store.load(tid)).status == "idle"
    refused = await cancel(store, tid, decider=Decider(BOSS), reviewers=OPEN)
    assert isinstance(refused, Refused) and refused.reason == "only the requester can cancel"
    assert isinstance(refused.event, ev.ApprovalRefused)
    assert (refused.event.decision, refused.event.tool_call_id) == ("cancel", None)
    assert (await store.load(tid)).status == "idle"
    # With process approvers and nothing pending, they may; others still may not.
    other = await cancel(store, tid, decider=Decider(BOB), reviewers=STRICT)
    assert isinstance(other, Refused) and "requester or an approver" in other.reason
    assert isinstance(await cancel(store, tid, decider=Decider(BOSS), reviewers=STRICT), Accepted)


# --- reconcile ------------------------------------------------------------------------


async def unknown_thread(store: Store, approvers: tuple[str, ...] = (BOB, CAROL)) -> str:
    """A thread whose non-idempotent call CALL was interrupted: its outcome is unknown."""
    tid = await ruled_thread(store, approvers)
    state = await store.load(tid)
    tail = [
        ev.ApprovalGranted(actor=BOB, tool_call_id=CALL),
        ev.ToolStarted(tool_call_id=CALL, attempt=1),
        ev.ToolOutcomeUnknown(tool_call_id=CALL, attempt=1, error="connection lost"),
    ]
    await store.append(tid, state.last_seq, tail)
    assert (await store.load(tid)).status == "awaiting_reconcile"
    return tid


async def reconcile(
    store: Store, tid: str, decider: Decider, decision: ev.ReconcileDecision, **kw: Any
) -> Accepted | Refused:
    return await decide_reconcile(
        store, tid, tool_call_id=CALL, decider=decider, decision=decision, reviewers=OPEN, **kw
    )


@pytest.mark.parametrize("decision", ["happened", "retry", "abandon"])
async def test_reconcile_by_a_reviewer_of_the_call(
    store: Store, decision: ev.ReconcileDecision
) -> None:
    tid = await unknown_thread(store)
    checked = await check_reconcile(
        store, tid, tool_call_id=CALL, decider=Decider(CAROL), reviewers=OPEN
    )
    assert isinstance(checked, Decidable) and checked.tool_call_id == CALL
    assert (await store.load(tid)).status == "awaiting_reconcile"  # nothing stored
    done = await reconcile(
        store, tid, Decider(CAROL), decision, note=" restarted by hand ", dedupe_key="v1"
    )
    assert isinstance(done, Accepted) and done.event.type == "reconcile_decided"
    assert done.event.reviewer == CAROL and done.event.note == "restarted by hand"  # type: ignore[union-attr]
    state = await store.load(tid)
    assert state.status == "running"
    assert (state.pending is not None) == (decision == "retry")
    again = await reconcile(store, tid, Decider(CAROL), decision, dedupe_key="v1")
    assert isinstance(again, Accepted) and again.deduplicated
    other = await reconcile(store, tid, Decider(BOB), "retry")
    assert isinstance(other, Refused)
    assert other.reason.startswith(f"already decided ({decision}) by {CAROL}")


async def test_reconcile_is_refused_to_others_and_to_the_requester(store: Store) -> None:
    tid = await unknown_thread(store)
    for who, why in ((BOSS, "not on the approvers list"), (REQ, "self-approval")):
        # Refused before the note modal opens: recorded as any refused click is.
        before = (await store.load(tid)).last_seq
        why_not = await check_reconcile(
            store, tid, tool_call_id=CALL, decider=Decider(who), reviewers=OPEN, dedupe_key=who
        )
        assert isinstance(why_not, Refused) and why in why_not.reason
        assert isinstance(why_not.event, ev.ApprovalRefused)
        assert why_not.event.decision == "happened" and why_not.event.actor == who
        assert (await store.load(tid)).last_seq == before + 1
        again = await check_reconcile(
            store, tid, tool_call_id=CALL, decider=Decider(who), reviewers=OPEN, dedupe_key=who
        )
        assert isinstance(again, Refused) and again.event == why_not.event  # once
        assert (await store.load(tid)).last_seq == before + 1
        refused = await reconcile(store, tid, Decider(who), "happened")
        assert isinstance(refused, Refused) and why in refused.reason
        assert refused.event is not None and refused.event.decision == "happened"  # type: ignore[union-attr]
    assert (await store.load(tid)).status == "awaiting_reconcile"


async def test_reconcile_needs_a_call_in_question(store: Store) -> None:
    tid = await awaiting_approval(store)
    refused = await reconcile(store, tid, Decider(BOSS), "retry")
    assert isinstance(refused, Refused)
    assert refused.reason == "there is no such call whose outcome is unknown"


async def test_reconcile_from_another_team_is_refused(store: Store) -> None:
    tid = await unknown_thread(store)
    refused = await reconcile(store, tid, Decider(CAROL, org=Org(("T2",))), "retry")
    assert isinstance(refused, Refused) and "Slack team" in refused.reason


async def test_reconcile_is_bound_to_the_arguments_the_card_showed(store: Store) -> None:
    tid = await unknown_thread(store)
    call = (await store.load(tid)).pending
    assert call is not None
    stale = await check_reconcile(
        store,
        tid,
        tool_call_id=CALL,
        decider=Decider(CAROL),
        reviewers=OPEN,
        arguments_hash="0" * 32,
    )
    assert isinstance(stale, Refused)
    assert stale.reason == "this card is out of date: the call's arguments differ"
    refused = await reconcile(store, tid, Decider(CAROL), "retry", arguments_hash="0" * 32)
    assert isinstance(refused, Refused) and "out of date" in refused.reason
    assert (await store.load(tid)).status == "awaiting_reconcile"
    card_hash = arguments_hash(call.intent, call.arguments)
    done = await reconcile(store, tid, Decider(CAROL), "retry", arguments_hash=card_hash)
    assert isinstance(done, Accepted)


# --- a newer message supersedes the card (issue 17 §1) -------------------------------------


async def test_the_requesters_message_withdraws_the_pending_card_once(store: Store) -> None:
    tid = await awaiting_approval(store)
    said = await post_user_message(
        store, key("1.0"), text="actually, production", user=REQ, dedupe_key="Ev-newer"
    )
    assert isinstance(said, Accepted) and said.event.type == "user_message"
    assert (await types(store, tid))[-2:] == ["approval_withdrawn", "user_message"]
    withdrawn = (await store.select_events(tid))[-2]
    assert isinstance(withdrawn, ev.ApprovalWithdrawn)
    assert (withdrawn.actor, withdrawn.tool_call_id) == (REQ, CALL)
    assert withdrawn.reason == f"superseded by a newer message from <@{REQ}>"
    state = await store.load(tid)
    assert state.status == "running" and state.pending is None
    assert state.setback is not None and state.setback.kind == "withdrawn"
    # Slack redelivers the message: nothing is withdrawn twice, nothing is added.
    again = await post_user_message(
        store, key("1.0"), text="actually, production", user=REQ, dedupe_key="Ev-newer"
    )
    assert isinstance(again, Accepted) and again.deduplicated
    assert (await types(store, tid)).count("approval_withdrawn") == 1
    # A click on the withdrawn card is refused as stale, and recorded.
    late = await decide(store, tid, decider=Decider(BOSS))
    assert isinstance(late, Refused) and "withdrawn" in late.reason
    assert (await types(store, tid))[-1] == "approval_refused"


async def test_someone_elses_message_leaves_the_card_standing(store: Store) -> None:
    tid = await awaiting_approval(store)
    await post_user_message(store, key("1.0"), text="looks fine to me", user=BOSS)
    state = await store.load(tid)
    assert state.status == "awaiting_approval" and state.pending is not None
    assert [n.actor for n in state.pending.said_since] == [BOSS]
    assert "approval_withdrawn" not in await types(store, tid)
    assert isinstance(await decide(store, tid), Accepted)  # the card still decides


# --- an edit before approval (issue 17 §2) ------------------------------------------------

CHIEF = "U0CHIEF"
EVE = "U0EVE"


class DeployArgs(BaseModel):
    service: str
    env: Literal["staging", "production", "prod-eu"]


EDIT_TOOLS = ToolRegistry()


@tool(policy="approve_before_run", registry=EDIT_TOOLS)
async def deploy(args: DeployArgs, ctx: ToolContext) -> dict:
    """Deploy a service."""
    return {}


def env_is(value: str) -> dict[str, Any]:
    return {"properties": {"env": {"const": value}}, "required": ["env"]}


RULES = PolicySet(
    rules=(
        PolicyRule(tool="deploy", when=env_is("prod-eu"), policy="reject", reason="by hand"),
        PolicyRule(
            tool="deploy",
            when=env_is("production"),
            policy="approve_before_run",
            approvers=[BOSS, CHIEF],
            quorum=2,
        ),
        PolicyRule(tool="deploy", policy="run_now"),
    )
)
STAGING = RULES.decide(deploy, ARGS, "C1").reviewers  # rule 3: anyone, one vote
PRODUCTION = {"service": "api", "env": "production"}


async def ruled_call(store: Store, arguments: dict[str, Any] = ARGS) -> str:
    """A thread whose call CALL waits for approval as the rules decided it."""
    tid = await started_thread(store)
    state = await store.load(tid)
    rule = RULES.decide(deploy, arguments, "C1")
    await store.append(
        tid,
        state.last_seq,
        [
            ev.ModelDecision(
                actor="model", tool_name="deploy", tool_call_id=CALL, arguments=arguments
            ),
            ev.ToolCallRequested(
                tool_call_id=CALL,
                intent="deploy",
                arguments=arguments,
                policy="approve_before_run",
                idempotency_key=f"{tid}:{CALL}",
                reviewers=rule.reviewers,
            ),
            ev.ApprovalRequested(
                tool_call_id=CALL,
                arguments_hash=arguments_hash("deploy", arguments),
                expires_at=ev.utcnow() + timedelta(hours=1),
            ),
        ],
    )
    return tid


async def edit(
    store: Store,
    tid: str,
    arguments: dict[str, Any],
    *,
    by: str = BOSS,
    on: str = HASH,
    approve: bool = False,
    dedupe_key: str | None = None,
) -> Accepted | Refused | Invalid:
    change = Edit(tid, CALL, arguments, on, approve=approve, dedupe_key=dedupe_key)
    return await edit_call(
        store, change, decider=Decider(by), tools=EDIT_TOOLS, policies=RULES, reviewers=OPEN
    )


async def test_an_edit_to_production_needs_what_production_needs(store: Store) -> None:
    tid = await ruled_call(store)
    assert STAGING.quorum == 1 and not STAGING.approvers
    done = await edit(store, tid, PRODUCTION, by=BOSS)
    assert isinstance(done, Accepted)
    edited = done.event
    assert isinstance(edited, ev.ApprovalEdited)
    assert (edited.reviewer, edited.arguments, edited.previous_hash) == (BOSS, PRODUCTION, HASH)
    assert edited.arguments_hash == arguments_hash("deploy", PRODUCTION)
    assert edited.reviewers == ReviewerRule(frozenset({BOSS, CHIEF}), 2, rule=1)
    call = (await store.load(tid)).pending
    assert call is not None and call.arguments == PRODUCTION and call.votes == ()
    assert call.quorum == 2 and call.idempotency_key == f"{tid}:{CALL}"
    # A click on the card as it was (the old hash) is refused: it is not this call.
    stale = await decide_approval(
        store, tid, tool_call_id=CALL, decider=Decider(CHIEF), decision="approve",
        reviewers=OPEN, arguments_hash=HASH,
    )  # fmt: skip
    assert isinstance(stale, Refused) and "out of date" in stale.reason
    # One vote is not enough now, and EVE (fine for staging) is no approver of it.
    new = edited.arguments_hash
    for who in (BOSS, EVE):
        await decide_approval(
            store, tid, tool_call_id=CALL, decider=Decider(who), decision="approve",
            reviewers=OPEN, arguments_hash=new,
        )  # fmt: skip
    state = await store.load(tid)
    assert state.status == "awaiting_approval" and state.pending is not None
    assert state.pending.votes == (BOSS,)
    assert (await types(store, tid))[-1] == "approval_refused"


async def test_an_edit_never_lowers_what_the_call_needed(store: Store) -> None:
    tid = await ruled_call(store, PRODUCTION)
    done = await edit(store, tid, ARGS, by=CHIEF, on=arguments_hash("deploy", PRODUCTION))
    assert isinstance(done, Accepted) and isinstance(done.event, ev.ApprovalEdited)
    # Staging's rule (anyone, one vote, run_now) would be looser: production's stands.
    assert done.event.reviewers == ReviewerRule(frozenset({BOSS, CHIEF}), 2, rule=1)
    call = (await store.load(tid)).pending
    assert call is not None and call.arguments == ARGS and call.quorum == 2
    assert call.phase == "awaiting_approval"  # still needs its approvals, never run_now


async def test_an_edit_the_policy_refuses_closes_the_call_with_the_reason(store: Store) -> None:
    tid = await ruled_call(store)
    done = await edit(store, tid, {"service": "api", "env": "prod-eu"}, approve=True)
    assert isinstance(done, Accepted) and isinstance(done.event, ev.ApprovalEdited)
    assert (done.event.policy, done.event.reason) == ("reject", "by hand")
    state = await store.load(tid)
    assert state.pending is None and state.status == "running"
    assert (await types(store, tid))[-1] == "approval_edited"  # no vote on a closed call
    late = await decide_approval(
        store, tid, tool_call_id=CALL, decider=Decider(CHIEF), decision="approve",
        reviewers=OPEN, arguments_hash=done.event.arguments_hash,
    )  # fmt: skip
    assert isinstance(late, Refused)
    assert late.reason.startswith(f"refused by the policy after an edit by {BOSS} at ")


async def test_arguments_the_schema_refuses_are_invalid_and_store_nothing(store: Store) -> None:
    tid = await ruled_call(store)
    before = await types(store, tid)
    bad = await edit(store, tid, {"service": "api", "env": "moon"})
    assert isinstance(bad, Invalid) and set(bad.errors) == {"env"}
    missing = await edit(store, tid, {"env": "staging"}, approve=True)
    assert isinstance(missing, Invalid) and set(missing.errors) == {"service"}
    same = await edit(store, tid, ARGS)
    assert isinstance(same, Invalid) and "already" in same.errors[""]
    assert await types(store, tid) == before


async def test_who_may_not_approve_may_not_edit_and_is_recorded(store: Store) -> None:
    tid = await ruled_call(store, PRODUCTION)
    for who in (EVE, REQ):
        done = await edit(store, tid, ARGS, by=who, on=arguments_hash("deploy", PRODUCTION))
        assert isinstance(done, Refused)
        refused = done.event
        assert isinstance(refused, ev.ApprovalRefused)
        assert (refused.actor, refused.decision) == (who, "edit")
    assert (await store.load(tid)).pending.arguments == PRODUCTION  # type: ignore[union-attr]


async def test_save_and_approve_is_the_editors_one_vote_on_the_edited_call(store: Store) -> None:
    tid = await ruled_call(store)
    done = await edit(store, tid, PRODUCTION, approve=True, dedupe_key="view:V1")
    assert isinstance(done, Accepted)
    log = await store.select_events(tid)
    assert [e.type for e in log[-2:]] == ["approval_edited", "approval_granted"]
    assert (log[-1].actor, log[-2].dedupe_key) == (BOSS, "view:V1")
    state = await store.load(tid)
    assert state.status == "awaiting_approval"  # production needs a second person
    assert state.pending is not None and state.pending.votes == (BOSS,)
    again = await edit(store, tid, PRODUCTION, approve=True, dedupe_key="view:V1")
    assert isinstance(again, Accepted) and again.deduplicated
    assert len(await store.select_events(tid)) == len(log)


async def test_save_and_approve_by_someone_the_edited_call_does_not_admit(store: Store) -> None:
    """EVE may decide the staging call, so she may edit it; the production call it
    becomes is not hers to approve: her vote is refused and recorded, nothing else."""
    tid = await ruled_call(store)
    before = await types(store, tid)
    done = await edit(store, tid, PRODUCTION, by=EVE, approve=True, dedupe_key="view:V2")
    assert isinstance(done, Refused) and "not on the approvers list" in done.reason
    assert isinstance(done.event, ev.ApprovalRefused) and done.event.decision == "approve"
    assert await types(store, tid) == [*before, "approval_refused"]
    saved = await edit(store, tid, PRODUCTION, by=EVE, dedupe_key="view:V3")
    assert isinstance(saved, Accepted) and saved.event.type == "approval_edited"
