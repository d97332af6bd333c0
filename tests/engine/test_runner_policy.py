"""The runner under a policy file (issue 9): rules decide each call, quorum, a refused
call, pinned definitions, and an outcome a person reconciles; SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel

from engine import events as ev
from engine.config_file import PolicyRule
from engine.inputs import (
    Decider,
    Edit,
    decide_approval,
    decide_reconcile,
    edit_call,
    finish_wait,
    post_user_message,
)
from engine.models.scripted import call, say
from engine.reviewers import ReviewerRule
from engine.rules import Defaults, PolicySet
from engine.runner import Runner, RunnerConfig
from engine.store import Store, ThreadKey
from tests.support.demo_tools import make_ruled_tools
from tests.support.fakes import FakeClock, RecordingModel
from tools import ToolContext, ToolRegistry, tool

KEY = ThreadKey("T1", "C1", "1700000000.000100")
ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
OPEN = ReviewerRule()
HASH = "f" * 64
POLICY = PolicySet(
    rules=(
        PolicyRule(tool="purge", policy="reject", reason="nothing is ever purged"),
        PolicyRule(
            tool="restart",
            when={"properties": {"name": {"const": "db"}}},
            policy="reject",
            reason="the database is restarted by hand",
        ),
        PolicyRule(tool="restart", policy="approve_before_run", approvers=[BOB, CAROL], quorum=2),
        PolicyRule(tool="gated_train", policy="approve_before_run", expires_in="2h"),
        PolicyRule(tool="lookup", policy="run_now", channels=["C0OPS"]),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash=HASH,
)


async def start(store: Store, text: str = "please help") -> str:
    posted = await post_user_message(store, KEY, text=text, user=ALICE, dedupe_key="m1")
    return posted.thread_id


async def events(store: Store, tid: str) -> list[ev.AnyEvent]:
    return list(await store.select_events(tid))


def requested(log: list[ev.AnyEvent]) -> list[ev.ToolCallRequested]:
    return [e for e in log if isinstance(e, ev.ToolCallRequested)]


async def approve(store: Store, tid: str, call_id: str, who: str):
    return await decide_approval(
        store, tid, tool_call_id=call_id, decision="approve", reviewers=OPEN, decider=Decider(who)
    )


async def test_unconditionally_rejected_tools_are_not_offered(store):
    model = RecordingModel([say("hi")])
    tid = await start(store)
    await Runner(store, model, make_ruled_tools(Counter()), policy=POLICY).run(tid)
    [decision] = [e for e in await events(store, tid) if e.type == "model_decision"]
    assert "purge" not in decision.tool_names  # type: ignore[union-attr]
    assert "restart" in decision.tool_names  # type: ignore[union-attr]  # conditional: offered
    names = [t["name"] for t in model.prompts[-1].tools]
    assert "purge" not in names


async def test_a_conditional_reject_closes_the_call_and_the_model_reads_why(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="db"), say("I will not")])
    tid = await start(store)
    state = await Runner(store, model, make_ruled_tools(effects), policy=POLICY).run(tid)
    assert state.status == "idle" and effects["restart"] == 0
    [req] = requested(await events(store, tid))
    assert (req.policy, req.rule, req.reason) == ("reject", 1, "the database is restarted by hand")
    assert req.policy_hash == HASH
    assert "Not run: the policy refused it: the database is restarted by hand" in (
        model.last_prompt_text()
    )
    assert '"is_error": true' in model.last_prompt_text()


async def test_a_channel_the_rule_does_not_list_refuses_the_call(store):
    effects: Counter = Counter()
    model = RecordingModel([call("lookup", name="x"), say("not here")])
    tid = await start(store)
    await Runner(store, model, make_ruled_tools(effects), policy=POLICY).run(tid)
    [req] = requested(await events(store, tid))
    assert req.policy == "reject" and "<#C0OPS>" in req.reason and effects["lookup"] == 0


async def test_a_quorum_of_two_runs_the_call_once_after_the_second_vote(store):
    effects: Counter = Counter()
    tools = make_ruled_tools(effects)
    model = RecordingModel([call("restart", name="api"), say("restarted")])
    runner = Runner(store, model, tools, policy=POLICY)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    [req] = requested(await events(store, tid))
    assert (req.rule, req.approvers, req.quorum, req.allow_self) == (2, (BOB, CAROL), 2, False)
    assert req.idempotent is False
    assert req.definition_hash == tools.get("restart").definition_hash  # type: ignore[union-attr]
    cid = req.tool_call_id
    assert (await approve(store, tid, cid, BOB)).event.type == "approval_granted"  # type: ignore[union-attr]
    assert (await runner.run(tid)).status == "awaiting_approval" and effects["restart"] == 0
    refused = await approve(store, tid, cid, ALICE)
    assert refused.reason.startswith("you asked for this call")  # type: ignore[union-attr]
    await approve(store, tid, cid, CAROL)
    assert (await runner.run(tid)).status == "idle" and effects["restart"] == 1


async def test_no_rule_matched_records_the_defaults_and_the_tools_own_policy(store):
    effects: Counter = Counter()
    model = RecordingModel([call("deploy", name="api"), say("ok")])
    tid = await start(store)
    await Runner(store, model, make_ruled_tools(effects), policy=POLICY).run(tid)
    [req] = requested(await events(store, tid))
    assert (req.policy, req.rule, req.approvers, req.quorum) == (
        "approve_before_run",
        None,
        (BOB,),
        1,
    )
    assert req.policy_hash == HASH and req.idempotent is True


async def test_without_a_policy_the_call_records_no_reviewer_rule(store):
    model = RecordingModel([call("deploy", name="api"), say("ok")])
    tid = await start(store)
    await Runner(store, model, make_ruled_tools(Counter())).run(tid)
    [req] = requested(await events(store, tid))
    assert (req.rule, req.policy_hash, req.approvers, req.allow_self) == (None, None, None, None)


async def test_a_changed_definition_is_not_run_and_the_model_is_told(store):
    effects: Counter = Counter()
    model = RecordingModel([call("deploy", name="api"), say("it changed")])
    tid = await start(store)
    state = await Runner(store, model, make_ruled_tools(effects), policy=POLICY).run(tid)
    await approve(store, tid, state.pending.tool_call_id, BOB)
    changed = make_ruled_tools(effects)
    changed.get("deploy").description = "Deploy a service, and also drop its database."  # type: ignore[union-attr]
    await Runner(store, model, changed, policy=POLICY).run(tid)
    assert effects["deploy"] == 0
    [result] = [e for e in await events(store, tid) if e.type == "tool_result"]
    assert result.error.startswith("the definition of deploy changed since it was approved")  # type: ignore[union-attr]
    assert "the definition of deploy changed since it was approved" in model.last_prompt_text()


async def test_a_waiting_tool_behind_an_approval_runs_then_waits(store):
    effects: Counter = Counter()
    model = RecordingModel([call("gated_train", name="m1"), say("trained")])
    runner = Runner(store, model, make_ruled_tools(effects), policy=POLICY)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "awaiting_approval" and effects["gated_train"] == 0
    asked = next(e for e in await events(store, tid) if e.type == "approval_requested")
    assert round((asked.expires_at - asked.created_at).total_seconds()) == 7200  # type: ignore[union-attr]
    await approve(store, tid, state.pending.tool_call_id, BOB)
    state = await runner.run(tid)
    assert state.status == "awaiting_job" and effects["gated_train"] == 1
    await finish_wait(store, tid, wait_id=state.pending.wait.wait_id, result={"acc": 0.9})
    assert (await runner.run(tid)).status == "idle"
    assert '"acc": 0.9' in model.last_prompt_text()


async def test_a_run_now_rule_on_a_waiting_tool_lifts_the_approval_and_it_still_waits(store):
    """A rule saying run_now for a deploy that waits on its run (github_dispatch_workflow)
    means "no card", not "fail when it asks to wait"."""
    effects: Counter = Counter()
    model = RecordingModel([call("gated_train", name="m1"), say("trained")])
    rules = PolicySet(rules=(PolicyRule(tool="gated_train", policy="run_now"),), policy_hash=HASH)
    runner = Runner(store, model, make_ruled_tools(effects), policy=rules)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "awaiting_job" and effects["gated_train"] == 1
    [asked] = requested(await events(store, tid))
    assert asked.policy == "wait_for_external_event"
    await finish_wait(store, tid, wait_id=state.pending.wait.wait_id, result={"acc": 0.9})
    assert (await runner.run(tid)).status == "idle"


async def test_outcome_unknown_waits_for_a_person_then_happened_is_the_result(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="lost"), say("noted")])
    runner = Runner(store, model, make_ruled_tools(effects), policy=POLICY)
    tid = await start(store)
    cid = (await runner.run(tid)).pending.tool_call_id
    await approve(store, tid, cid, BOB)
    await approve(store, tid, cid, CAROL)
    state = await runner.run(tid)
    assert state.status == "awaiting_reconcile" and effects["restart"] == 1
    [unknown] = [e for e in await events(store, tid) if e.type == "tool_outcome_unknown"]
    assert "connection dropped" in unknown.error  # type: ignore[union-attr]
    assert (await runner.run(tid)).status == "awaiting_reconcile" and effects["restart"] == 1
    done = await decide_reconcile(
        store, tid, tool_call_id=cid, decider=Decider(CAROL), decision="happened",
        note="api is up again", reviewers=OPEN,
    )  # fmt: skip
    assert done.event.type == "reconcile_decided"  # type: ignore[union-attr]
    assert (await runner.run(tid)).status == "idle" and effects["restart"] == 1
    assert f"<@{CAROL}> says it happened: api is up again" in model.last_prompt_text()


async def test_outcome_unknown_then_retry_runs_it_once_more_with_the_same_key(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="lost"), say("noted")])
    runner = Runner(store, model, make_ruled_tools(effects), policy=POLICY)
    tid = await start(store)
    cid = (await runner.run(tid)).pending.tool_call_id
    await approve(store, tid, cid, BOB)
    await approve(store, tid, cid, CAROL)
    await runner.run(tid)
    await decide_reconcile(
        store, tid, tool_call_id=cid, decider=Decider(BOB), decision="retry", reviewers=OPEN
    )
    state = await runner.run(tid)
    assert effects["restart"] == 2
    assert state.status == "awaiting_reconcile"  # "lost" loses its connection again
    started = [e for e in await events(store, tid) if e.type == "tool_started"]
    assert [e.attempt for e in started] == [1, 2]  # type: ignore[union-attr]
    await decide_reconcile(
        store, tid, tool_call_id=cid, decider=Decider(BOB), decision="abandon", reviewers=OPEN
    )
    assert (await runner.run(tid)).status == "idle" and effects["restart"] == 2
    assert f"Not run: <@{BOB}> says it did not happen" in model.last_prompt_text()


async def test_a_non_idempotent_call_that_times_out_waits_for_a_person(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="slow"), say("noted")])
    config = RunnerConfig(tool_timeout_s=0.2)
    runner = Runner(store, model, make_ruled_tools(effects), config, policy=POLICY)
    tid = await start(store)
    cid = (await runner.run(tid)).pending.tool_call_id
    await approve(store, tid, cid, BOB)
    await approve(store, tid, cid, CAROL)
    state = await runner.run(tid)
    assert state.status == "awaiting_reconcile" and effects["restart"] == 1
    [unknown] = [e for e in await events(store, tid) if e.type == "tool_outcome_unknown"]
    assert "did not finish within 0.2 s" in unknown.error  # type: ignore[union-attr]


# A `when` that passes loading but cannot be evaluated for these arguments: its ref names
# nothing. Before, the exception escaped classify, the thread stayed running and the
# dispatcher asked the model again, forever.
UNEVALUABLE = PolicySet(
    rules=(
        PolicyRule(
            tool="restart",
            when={"properties": {"name": {"$ref": "#/$defs/missing"}}},
            policy="run_now",
        ),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash=HASH,
)


async def test_a_rule_that_cannot_be_evaluated_rejects_and_fails_after_three(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="api") for _ in range(5)])
    tid = await start(store)
    state = await Runner(store, model, make_ruled_tools(effects), policy=UNEVALUABLE).run(tid)
    assert state.status == "failed" and effects["restart"] == 0
    assert len(model.prompts) == 3  # three decisions, then the thread stops asking
    log = await events(store, tid)
    rejected = [e for e in log if isinstance(e, ev.DecisionRejected)]
    assert len(rejected) == 3
    assert "the policy could not decide 'restart'" in rejected[0].reason
    assert "cannot be resolved" in rejected[0].reason
    assert isinstance(log[-1], ev.ErrorRaised) and "3 invalid decisions" in log[-1].message


async def test_a_withheld_tool_called_anyway_is_answered_with_the_rules_reason(store):
    """Not offered, but the model calls it (seen earlier, or invented): before, the answer
    was "unknown tool … the tools are: …", so the model never learned why."""
    effects: Counter = Counter()
    model = RecordingModel([call("purge", name="db"), say("understood")])
    tid = await start(store)
    state = await Runner(store, model, make_ruled_tools(effects), policy=POLICY).run(tid)
    assert state.status == "idle" and effects["purge"] == 0
    [req] = requested(await events(store, tid))
    assert (req.policy, req.rule, req.reason) == ("reject", 0, "nothing is ever purged")
    assert "nothing is ever purged" in json.dumps(model.prompts[-1].messages)


async def test_an_invented_tool_a_reject_glob_covers_gets_the_reason_too(store):
    withholding = PolicySet(
        rules=(PolicyRule(tool="drop_*", policy="reject", reason="no drops from chat"),),
        policy_hash=HASH,
    )
    model = RecordingModel([call("drop_table", name="users"), say("ok")])
    tid = await start(store)
    state = await Runner(store, model, make_ruled_tools(Counter()), policy=withholding).run(tid)
    assert state.status == "idle"
    [req] = requested(await events(store, tid))
    assert (req.intent, req.policy, req.reason) == ("drop_table", "reject", "no drops from chat")
    assert req.definition_hash is None  # no such tool is registered


async def test_a_withdrawn_call_is_never_run_and_the_model_decides_again(store):
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="api"), say("Restarting web instead.")])
    tools = make_ruled_tools(effects)
    tid = await start(store)
    state = await Runner(store, model, tools, policy=POLICY).run(tid)
    assert state.status == "awaiting_approval"
    await post_user_message(store, KEY, text="no wait, web not api", user=ALICE, dedupe_key="m2")
    state = await Runner(store, model, tools, policy=POLICY).run(tid)
    assert state.status == "idle" and effects["restart"] == 0
    prompt = json.dumps(model.prompts[-1].messages)
    assert "withdrawn before anyone decided" in prompt
    assert prompt.index("withdrawn before anyone decided") < prompt.index("no wait, web not api")


REMINDING = PolicySet(
    rules=(
        PolicyRule(
            tool="restart",
            policy="approve_before_run",
            approvers=[BOB],
            expires_in="2h",
            remind_after="30m",
            escalate_to=["S0SRE", "C0ESCALATE"],
        ),
    ),
    defaults=Defaults(ReviewerRule(frozenset({BOB}))),
    policy_hash=HASH,
)


async def test_the_thread_wakes_at_the_reminder_once_then_expires(store):
    """Issue 17 §3: the rule's reminder and escalation are recorded on the call; the
    thread wakes at the reminder (approval_reminded, once, whichever process runs it),
    then at the expiry, which never approves."""
    clock = FakeClock()
    effects: Counter = Counter()
    model = RecordingModel([call("restart", name="api"), say("Nobody approved; not restarting.")])
    tools = make_ruled_tools(effects)

    def runner(policy: PolicySet = REMINDING) -> Runner:  # a new process each time
        return Runner(store, model, tools, policy=policy, clock=clock)

    tid = await start(store)
    asked_at = clock()
    assert (await runner().run(tid)).status == "awaiting_approval"
    [req] = requested(await events(store, tid))
    assert req.escalate_to == ("S0SRE", "C0ESCALATE")
    [card] = [e for e in await events(store, tid) if isinstance(e, ev.ApprovalRequested)]
    assert card.remind_at == asked_at + timedelta(minutes=30)
    assert card.expires_at == asked_at + timedelta(hours=2)
    assert (await store.get_thread(tid)).wake_at == card.remind_at
    clock.advance(29 * 60)
    assert await store.due_threads(clock()) == []
    clock.advance(60)
    assert await store.due_threads(clock()) == [tid]
    # The policy file changed meanwhile: the pending call keeps its recorded timers.
    assert (await runner(POLICY).run(tid)).status == "awaiting_approval"
    assert (await store.get_thread(tid)).wake_at == card.expires_at
    clock.advance(60)
    assert (await runner().run(tid)).status == "awaiting_approval"  # as after a restart
    types = [e.type for e in await events(store, tid)]
    assert types.count("approval_reminded") == 1
    assert await store.due_threads(clock()) == []
    clock.advance(90 * 60)
    assert await store.due_threads(clock()) == [tid]
    assert (await runner().run(tid)).status == "idle"
    types = [e.type for e in await events(store, tid)]
    assert types.count("approval_reminded") == 1 and types.count("approval_expired") == 1
    assert types.index("approval_reminded") < types.index("approval_expired")
    assert effects["restart"] == 0
    assert "Nobody approved this call in time." in json.dumps(model.prompts[-1].messages)


async def test_a_reminder_is_not_recorded_for_a_rule_without_one(store):
    model = RecordingModel([call("restart", name="api")])
    tid = await start(store)
    await Runner(store, model, make_ruled_tools(Counter()), policy=POLICY).run(tid)
    [card] = [e for e in await events(store, tid) if isinstance(e, ev.ApprovalRequested)]
    [req] = requested(await events(store, tid))
    assert (card.remind_at, req.escalate_to) == (None, ())
    assert (await store.get_thread(tid)).wake_at == card.expires_at


# --- an edit before approval (issue 17 §2) ------------------------------------------------


class Named(BaseModel):
    name: str


def recording_tools(ran: list[tuple[dict, str]]) -> ToolRegistry:
    """A ``restart`` that records the arguments and the idempotency key it ran with."""
    tools = ToolRegistry()

    @tool(policy="approve_before_run", idempotent=False, registry=tools)
    async def restart(args: Named, ctx: ToolContext) -> dict:
        """Restart a service."""
        ran.append((args.model_dump(), ctx.idempotency_key))
        return {"restarted": args.name}

    return tools


async def edited_by(store: Store, tid: str, tools: ToolRegistry, who: str, **arguments: str):
    call = (await store.load(tid)).pending
    assert call is not None
    change = Edit(tid, call.tool_call_id, arguments, call.arguments_hash, approve=True)
    return await edit_call(
        store, change, decider=Decider(who), tools=tools, policies=POLICY, reviewers=OPEN
    )


async def test_an_edited_call_runs_with_the_edited_arguments_only(store):
    ran: list[tuple[dict, str]] = []
    tools = recording_tools(ran)
    model = RecordingModel([call("restart", name="api"), say("web restarted")])
    runner = Runner(store, model, tools, policy=POLICY)
    tid = await start(store)
    assert (await runner.run(tid)).status == "awaiting_approval"
    [req] = requested(await events(store, tid))
    done = await edited_by(store, tid, tools, BOB, name="web")  # and BOB's vote
    assert done.event.type == "approval_edited"  # type: ignore[union-attr]
    assert (await runner.run(tid)).status == "awaiting_approval" and ran == []
    await approve(store, tid, req.tool_call_id, CAROL)
    assert (await runner.run(tid)).status == "idle"
    assert ran == [({"name": "web"}, f"{tid}:{req.tool_call_id}")]  # the call's own key
    prompt = model.last_prompt_text()
    assert '"name": "api"' in prompt  # the model's tool_use, as it wrote it
    assert (
        f'<@{BOB}> changed name: api → web before it was approved; it ran with {{"name": "web"}}.'
        in prompt
    )


async def test_an_edit_the_policy_refuses_never_runs_and_the_model_reads_why(store):
    ran: list[tuple[dict, str]] = []
    tools = recording_tools(ran)
    model = RecordingModel([call("restart", name="api"), say("I will not")])
    runner = Runner(store, model, tools, policy=POLICY)
    tid = await start(store)
    assert (await runner.run(tid)).status == "awaiting_approval"
    await edited_by(store, tid, tools, CAROL, name="db")
    assert (await runner.run(tid)).status == "idle" and ran == []
    prompt = model.last_prompt_text()
    assert "Not run: the policy refuses the edited call: the database is restarted by hand" in (
        prompt
    )
