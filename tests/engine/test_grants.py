"""Standing grants (issue 17 §4): "Approve for 1 h" approves later calls of the same tool
with the same arguments in the thread at once, until it is revoked or its time is up,
and never a call whose rule needs two people. A reviewer may let some arguments vary,
choose the span within the rule's max_grant, and grant a whole channel: then calls in
the channel's other threads are covered, where the reviewer could have approved them
themselves. SQLite and PostgreSQL."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from engine import events as ev
from engine.config_file import PolicyRule
from engine.grants import GrantAsk, exact_schema
from engine.inputs import Decider, Refused, decide_approval, post_user_message, revoke_grant
from engine.models.scripted import call, say
from engine.reviewers import ReviewerRule
from engine.rules import Defaults, PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.support.demo_tools import make_ruled_tools
from tests.support.fakes import FakeClock, RecordingModel

KEY = ThreadKey("T1", "C1", "1700000000.000100")
ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
OPEN = ReviewerRule()


def policy(quorum: int = 1, max_grant: str | None = "2h") -> PolicySet:
    people = [BOB, CAROL]
    return PolicySet(
        rules=(
            PolicyRule(
                tool="restart",
                policy="approve_before_run",
                approvers=people,
                quorum=quorum,
                max_grant=max_grant,  # type: ignore[arg-type]  # parsed as a duration
            ),
            PolicyRule(
                tool="gated_train", policy="approve_before_run", approvers=people, max_grant="2h"
            ),
        ),
        defaults=Defaults(ReviewerRule(frozenset({BOB}))),
        policy_hash="f" * 64,
    )


class Thread:
    """One thread, run by a new Runner (a new process) each time, on a fake clock."""

    def __init__(
        self,
        store: Store,
        steps: list,
        rules: PolicySet | None = None,
        key: ThreadKey = KEY,
        requester: str = ALICE,
    ) -> None:
        self.store, self.clock, self.effects = store, FakeClock(), Counter()
        self.model = RecordingModel(steps)
        self.tools = make_ruled_tools(self.effects)
        self.rules = rules or policy()
        self.key, self.requester = key, requester
        self.tid = ""

    async def start(self) -> str:
        posted = await post_user_message(
            self.store, self.key, text="restart api", user=self.requester
        )
        self.tid = posted.thread_id
        return (await self.run()).status

    async def run(self, rules: PolicySet | None = None):
        runner = Runner(
            self.store, self.model, self.tools, policy=rules or self.rules, clock=self.clock
        )
        return await runner.run(self.tid)

    async def log(self) -> list[ev.AnyEvent]:
        return list(await self.store.select_events(self.tid))

    async def pending_id(self) -> str:
        state = await self.store.load(self.tid)
        assert state.status == "awaiting_approval" and state.pending is not None
        return state.pending.tool_call_id

    async def approve_for_an_hour(self, who: str = BOB, grant: GrantAsk | None = None):
        return await decide_approval(
            self.store,
            self.tid,
            tool_call_id=await self.pending_id(),
            decision="approve",
            reviewers=OPEN,
            decider=Decider(who),
            now=self.clock(),
            grant=grant or GrantAsk(),
        )

    async def grants(self) -> list[ev.GrantCreated]:
        return [e for e in await self.log() if isinstance(e, ev.GrantCreated)]

    async def grant_approvals(self) -> list[ev.ApprovalGranted]:
        log = await self.log()
        return [
            e for e in log if isinstance(e, ev.ApprovalGranted) and e.actor.startswith("grant:")
        ]


async def test_approve_for_an_hour_stores_the_vote_and_a_grant_of_the_exact_arguments(store):
    t = Thread(store, [call("restart", name="api"), say("restarted")])
    assert await t.start() == "awaiting_approval"
    cid = await t.pending_id()
    accepted = await t.approve_for_an_hour()
    assert accepted.event.type == "approval_granted"  # type: ignore[union-attr]
    log = await t.log()
    vote, grant = log[-2], log[-1]
    assert isinstance(vote, ev.ApprovalGranted) and (vote.actor, vote.tool_call_id) == (BOB, cid)
    assert isinstance(grant, ev.GrantCreated) and grant.seq == vote.seq + 1  # one append
    assert (grant.tool, grant.scope, grant.reviewer, grant.tool_call_id) == (
        "restart",
        "thread",
        BOB,
        cid,
    )
    assert grant.arguments_schema == exact_schema({"name": "api"})
    assert grant.until == t.clock() + timedelta(hours=1)  # an hour: max_grant is 2h
    assert (await t.run()).status == "idle" and t.effects["restart"] == 1


async def test_a_grant_lasts_no_longer_than_the_rules_max_grant(store):
    t = Thread(store, [call("restart", name="api"), say("ok")], policy(max_grant="20m"))
    await t.start()
    await t.approve_for_an_hour()
    [grant] = await t.grants()
    assert grant.until == t.clock() + timedelta(minutes=20)


async def test_a_grant_approves_a_second_matching_call_at_once_and_not_a_different_one(store):
    steps = [
        call("restart", name="api"),
        call("restart", name="api"),  # the same: approved by the grant
        call("restart", name="web"),  # other arguments: a card
        say("web waits"),
    ]
    t = Thread(store, steps)
    await t.start()
    await t.approve_for_an_hour()
    assert (await t.run()).status == "awaiting_approval"
    [grant] = await t.grants()
    [by_grant] = await t.grant_approvals()
    assert by_grant.actor == f"grant:{grant.grant_id}"
    assert t.effects["restart"] == 2
    log = await t.log()
    cards = [e.tool_call_id for e in log if isinstance(e, ev.ApprovalRequested)]
    assert by_grant.tool_call_id not in cards and len(cards) == 2  # the first and web's
    state = await t.store.load(t.tid)
    assert state.pending is not None and state.pending.arguments == {"name": "web"}


async def test_a_grant_never_covers_another_tool(store):
    t = Thread(store, [call("restart", name="api"), call("gated_train", name="api"), say("-")])
    await t.start()
    await t.approve_for_an_hour()
    assert (await t.run()).status == "awaiting_approval"
    assert await t.grant_approvals() == []
    state = await t.store.load(t.tid)
    assert state.pending is not None and state.pending.intent == "gated_train"


async def test_a_revoked_grant_approves_nothing(store):
    t = Thread(store, [call("restart", name="api"), call("restart", name="api"), say("-")])
    await t.start()
    await t.approve_for_an_hour()
    [grant] = await t.grants()
    refused = await revoke_grant(
        store, t.tid, grant_id=grant.grant_id, decider=Decider(ALICE), reviewers=OPEN
    )
    assert isinstance(refused, Refused) and "only the reviewer" in refused.reason
    revoked = await revoke_grant(
        store, t.tid, grant_id=grant.grant_id, decider=Decider(CAROL), reviewers=OPEN
    )
    assert revoked.event.type == "grant_revoked"  # type: ignore[union-attr]  # an approver
    again = await revoke_grant(
        store, t.tid, grant_id=grant.grant_id, decider=Decider(BOB), reviewers=OPEN
    )
    assert isinstance(again, Refused)
    assert (await t.run()).status == "awaiting_approval"
    assert await t.grant_approvals() == [] and t.effects["restart"] == 1


async def test_an_expired_grant_approves_nothing(store):
    t = Thread(store, [call("restart", name="api"), call("restart", name="api"), say("-")])
    await t.start()
    await t.approve_for_an_hour()
    t.clock.advance(3600)  # `until` is now: no longer live
    assert (await t.run()).status == "awaiting_approval"
    assert await t.grant_approvals() == [] and t.effects["restart"] == 1


async def test_a_grant_never_covers_a_rule_with_a_quorum_of_two(store):
    t = Thread(store, [call("restart", name="api"), call("restart", name="api"), say("-")])
    await t.start()
    await t.approve_for_an_hour()
    # The file now asks two people for restarts: the live grant stands in for nobody.
    assert (await t.run(policy(quorum=2))).status == "awaiting_approval"
    assert await t.grant_approvals() == [] and t.effects["restart"] == 1


@pytest.mark.parametrize(("quorum", "max_grant"), [(2, "2h"), (1, None)])
async def test_approve_for_is_refused_when_the_rule_allows_no_grants(store, quorum, max_grant):
    t = Thread(store, [call("restart", name="api"), say("-")], policy(quorum, max_grant))
    await t.start()
    refused = await t.approve_for_an_hour()
    assert isinstance(refused, Refused)
    assert refused.reason == "this call's rule allows no standing grants"
    assert await t.grants() == []
    assert isinstance((await t.log())[-1], ev.ApprovalRefused)


async def test_a_narrowed_grant_covers_any_value_of_the_arguments_let_vary(store):
    steps = [call("restart", name="api"), call("restart", name="web"), say("-")]
    t = Thread(store, steps)
    await t.start()
    await t.approve_for_an_hour(grant=GrantAsk(seconds=1800, exact=frozenset()))
    [grant] = await t.grants()
    assert grant.until == t.clock() + timedelta(minutes=30)
    assert grant.approvers == tuple(sorted([BOB, CAROL]))
    assert (await t.run()).status == "idle"
    [by_grant] = await t.grant_approvals()
    assert by_grant.grant is not None and by_grant.grant.thread_id == t.tid
    assert t.effects["restart"] == 2


@pytest.mark.parametrize(
    ("ask", "why"),
    [
        (GrantAsk(seconds=3 * 3600), "longer than this call's rule allows"),
        (GrantAsk(exact=frozenset({"other"})), "an argument the call does not have"),
    ],
)
async def test_a_grant_beyond_what_the_rule_allows_is_refused(store, ask, why):
    t = Thread(store, [call("restart", name="api"), say("-")])  # max_grant 2h
    await t.start()
    refused = await t.approve_for_an_hour(grant=ask)
    assert isinstance(refused, Refused) and why in refused.reason
    assert await t.grants() == []


def elsewhere(channel: str = "C1", ts: str = "1700000100.000100") -> ThreadKey:
    return ThreadKey("T1", channel, ts)


async def granted_channel_wide(store) -> Thread:
    t = Thread(store, [call("restart", name="api"), say("-")])
    await t.start()
    await t.approve_for_an_hour(grant=GrantAsk(scope="channel"))
    assert (await t.run()).status == "idle"
    return t


async def test_a_channel_grant_approves_a_matching_call_in_another_thread_of_the_channel(
    store,
):
    first = await granted_channel_wide(store)
    [grant] = await first.grants()
    assert grant.scope == "channel"
    other = Thread(store, [call("restart", name="api"), say("done")], key=elsewhere())
    other.clock = first.clock
    assert await other.start() == "idle"
    [by_grant] = await other.grant_approvals()
    assert by_grant.actor == f"grant:{grant.grant_id}"
    assert by_grant.grant is not None and by_grant.grant.thread_id == first.tid
    assert (by_grant.grant.reviewer, by_grant.grant.until) == (BOB, grant.until)
    assert other.effects["restart"] == 1
    # The other thread's state, rebuilt from its own log alone, agrees.
    assert (await store.load(other.tid)).status == "idle"


async def test_a_channel_grant_covers_nothing_in_another_channel_or_after_revoke(store):
    first = await granted_channel_wide(store)
    [grant] = await first.grants()
    away = Thread(store, [call("restart", name="api"), say("-")], key=elsewhere("C2"))
    away.clock = first.clock
    assert await away.start() == "awaiting_approval"
    assert await away.grant_approvals() == []
    revoked = await revoke_grant(
        store, first.tid, grant_id=grant.grant_id, decider=Decider(BOB), reviewers=OPEN
    )
    assert not isinstance(revoked, Refused)
    later = Thread(store, [call("restart", name="api"), say("-")], key=elsewhere(ts="1700000200.1"))
    later.clock = first.clock
    assert await later.start() == "awaiting_approval"
    assert await later.grant_approvals() == []


async def test_a_channel_grant_never_approves_its_reviewers_own_request(store):
    """Bob's grant stands in for Bob's vote, which does not count on Bob's own call."""
    first = await granted_channel_wide(store)
    own = Thread(store, [call("restart", name="api"), say("-")], key=elsewhere(), requester=BOB)
    own.clock = first.clock
    assert await own.start() == "awaiting_approval"
    assert await own.grant_approvals() == []


async def test_a_grant_covers_no_call_its_reviewer_could_not_approve(store):
    """Under a policy where only Carol approves restarts, Bob's grant covers nothing."""
    first = await granted_channel_wide(store)
    carol_only = PolicySet(
        rules=(
            PolicyRule(
                tool="restart",
                policy="approve_before_run",
                approvers=[CAROL],
                max_grant="2h",  # type: ignore[arg-type]  # parsed as a duration
            ),
        ),
        policy_hash="e" * 64,
    )
    other = Thread(store, [call("restart", name="api"), say("-")], carol_only, key=elsewhere())
    other.clock = first.clock
    assert await other.start() == "awaiting_approval"
    assert await other.grant_approvals() == []
