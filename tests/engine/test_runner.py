"""The runner's four classes and its failure paths, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from engine.context import tools_fingerprint
from engine.inputs import Decider, decide_approval, finish_wait, post_user_message
from engine.models.scripted import ask, call, say
from engine.reviewers import ReviewerRule
from engine.runner import Runner, RunnerConfig
from engine.store import Store, ThreadKey, open_store
from tests.support.demo_tools import Args, make_tools
from tests.support.fakes import FakeClock, RecordingModel
from tools import RetryableToolError, ToolContext, ToolError, ToolRegistry, tool

KEY = ThreadKey("T1", "C1", "1700000000.000100")


async def start(store: Store, text: str = "please help") -> str:
    return (
        await post_user_message(store, KEY, text=text, user="U_ALICE", dedupe_key="m1")
    ).thread_id


async def types_of(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in await store.select_events(thread_id)]


async def test_run_now_tool_result_reaches_the_model(store):
    effects: Counter = Counter()
    model = RecordingModel([call("lookup", name="db"), say("db found")])
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects)).run(tid)
    assert state.status == "idle"
    assert effects["lookup"] == 1
    assert '"found": "db"' in model.last_prompt_text()
    assert await types_of(store, tid) == [
        "user_message", "model_decision", "tool_call_requested", "tool_started",
        "tool_result", "model_decision", "final_answer",
    ]  # fmt: skip


async def test_rejection_with_reason_is_seen_by_the_model_and_nothing_runs(store):
    effects: Counter = Counter()
    model = RecordingModel([call("deploy", name="api"), say("ok, not deploying")])
    tid = await start(store)
    runner = Runner(store, model, make_tools(effects))
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    res = await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="reject", reason="freeze until Monday", reviewers=ReviewerRule(),
    )  # fmt: skip
    assert res.event.type == "approval_rejected"
    state = await runner.run(tid)
    assert state.status == "idle"
    assert effects["deploy"] == 0
    text = model.last_prompt_text()
    assert "U_BOB rejected this call: freeze until Monday" in text
    assert '"is_error": true' in text


async def test_approval_expires_and_the_model_learns_it(store):
    clock = FakeClock()
    effects: Counter = Counter()
    model = RecordingModel([call("deploy", name="api"), say("nobody approved")])
    cfg = RunnerConfig(approval_ttl_s=60)
    runner = Runner(store, model, make_tools(effects), cfg, clock=clock)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    assert (await store.get_thread(tid)).wake_at == state.pending.expires_at
    clock.advance(30)
    assert (await runner.run(tid)).status == "awaiting_approval"
    assert await store.due_threads(clock()) == []
    clock.advance(31)
    assert await store.due_threads(clock()) == [tid]
    state = await runner.run(tid)
    assert state.status == "idle"
    assert "approval_expired" in await types_of(store, tid)
    assert "Nobody approved this call in time." in model.last_prompt_text()
    assert effects["deploy"] == 0


async def test_retryable_error_backs_off_with_attempts_from_the_log(store):
    clock = FakeClock()
    effects: Counter = Counter()
    model = RecordingModel([call("flaky", name="x"), say("worked")])
    cfg = RunnerConfig(retry_base_s=10)
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects), cfg, clock=clock).run(tid)
    assert state.status == "sleeping"
    assert state.wake_at == clock.now.replace() + (state.wake_at - clock.now)
    assert (state.wake_at - clock.now).total_seconds() == 10
    # A new runner (a restart) learns the attempt number from the log.
    clock.advance(10)
    state = await Runner(store, model, make_tools(effects), cfg, clock=clock).run(tid)
    assert state.status == "sleeping"
    assert (state.wake_at - clock.now).total_seconds() == 20
    clock.advance(20)
    state = await Runner(store, model, make_tools(effects), cfg, clock=clock).run(tid)
    assert state.status == "idle"
    assert effects == Counter({"flaky:1": 1, "flaky:2": 1, "flaky:3": 1})
    events = await store.select_events(tid)
    assert [e.attempt for e in events if e.type == "retry_scheduled"] == [1, 2]


async def test_every_attempt_of_a_call_knows_when_its_first_attempt_started(store):
    """A tool looking for what an earlier, interrupted attempt did (a dispatched run)
    looks back to the first attempt's start, however many attempts came between."""
    clock = FakeClock()
    seen: list[tuple[int, object]] = []
    reg = ToolRegistry()

    @tool(registry=reg)
    async def again(args: Args, ctx: ToolContext) -> dict:
        """Fails twice, then works."""
        seen.append((ctx.attempt, ctx.first_started_at))
        if ctx.attempt < 3:
            raise RetryableToolError("try again")
        return {"ok": True}

    model = RecordingModel([call("again", name="x"), say("done")])
    cfg = RunnerConfig(retry_base_s=1)
    tid = await start(store)
    for _ in range(3):
        await Runner(store, model, reg, cfg, clock=clock).run(tid)
        clock.advance(10)
    started = [e for e in await store.select_events(tid) if e.type == "tool_started"]
    assert [a for a, _ in seen] == [1, 2, 3]
    assert {at for _, at in seen} == {started[0].created_at}
    assert started[1].created_at > started[0].created_at  # not the latest attempt's


async def test_retry_budget_spent_gives_an_error_result(store):
    clock = FakeClock()
    effects: Counter = Counter()
    model = RecordingModel([call("flaky", name="x"), say("gave up")])
    cfg = RunnerConfig(retry_base_s=1, max_tool_attempts=2)
    runner = Runner(store, model, make_tools(effects), cfg, clock=clock)
    tid = await start(store)
    await runner.run(tid)
    clock.advance(1)
    state = await runner.run(tid)
    assert state.status == "idle"
    assert "gave up after 2 attempts" in model.last_prompt_text()


class Crash(BaseException):
    """Ends the run between tool_started and the result, as a process dying there would."""


async def test_a_call_interrupted_every_time_gives_up_naming_the_attempts_that_ran(store):
    ran: list[int] = []
    reg = ToolRegistry()

    @tool(registry=reg)
    async def fragile(args: Args, ctx: ToolContext) -> dict:
        """Dies under the runner every time."""
        ran.append(ctx.attempt)
        raise Crash

    model = RecordingModel([call("fragile", name="x"), say("gave up")])
    runner = Runner(store, model, reg, RunnerConfig(max_tool_attempts=3))
    tid = await start(store)
    for _ in range(3):
        with pytest.raises(Crash):
            await runner.run(tid)
    state = await runner.run(tid)
    assert state.status == "idle"
    assert ran == [1, 2, 3]
    assert "Tool failed: gave up after 3 attempts" in model.last_prompt_text()


async def test_a_tool_answer_with_lone_surrogates_is_stored_replaced(store):
    reg = ToolRegistry()

    @tool(registry=reg)
    async def odd(args: Args, ctx: ToolContext) -> dict:
        """Answers what a JSON decoder gave it."""
        return {"x": "lone \ud800", "k\udc00": ["\ud83d\ude00"]}

    @tool(registry=reg)
    async def odd_error(args: Args, ctx: ToolContext) -> dict:
        """Fails with what a JSON decoder gave it."""
        raise ToolError("no such host \ud800")

    model = RecordingModel([call("odd", name="x"), call("odd_error", name="y"), say("done")])
    tid = await start(store)
    state = await Runner(store, model, reg).run(tid)
    assert state.status == "idle"
    ok, failed = [e for e in await store.select_events(tid) if e.type == "tool_result"]
    assert ok.output == {"x": "lone \ufffd", "k\ufffd": ["\ufffd\ufffd"]}  # type: ignore[union-attr]
    assert failed.error == "ToolError: no such host \ufffd"  # type: ignore[union-attr]


async def test_a_tool_that_raises_gives_an_error_result_the_model_sees(store):
    model = RecordingModel([call("broken", name="x"), say("sorry")])
    tid = await start(store)
    state = await Runner(store, model, make_tools(Counter())).run(tid)
    assert state.status == "idle"
    assert "Tool failed: ValueError: disk on fire" in model.last_prompt_text()


async def test_consecutive_rejections_fail_the_thread_and_a_reply_resumes_it(store):
    model = RecordingModel(
        [call("nope", name="x"), call("lookup", wrong=1), call("nope", name="y"), say("back")]
    )
    tid = await start(store)
    runner = Runner(store, model, make_tools(Counter()), RunnerConfig(max_rejections=3))
    state = await runner.run(tid)
    assert state.status == "failed"
    events = await store.select_events(tid)
    assert [e.type for e in events].count("decision_rejected") == 3
    assert events[-1].type == "error" and "3 invalid decisions" in events[-1].message
    assert "unknown tool 'nope'" in model.last_prompt_text()
    await post_user_message(store, KEY, text="try again", user="U_ALICE", dedupe_key="m2")
    assert (await runner.run(tid)).status == "idle"


async def test_clarification_is_answered_by_the_next_reply(store):
    model = RecordingModel([ask("Which environment?"), say("staging it is")])
    tid = await start(store)
    runner = Runner(store, model, make_tools(Counter()))
    state = await runner.run(tid)
    assert state.status == "awaiting_reply"
    assert state.question.question == "Which environment?"
    reply = await post_user_message(store, KEY, text="staging", user="U_ALICE", dedupe_key="m2")
    assert reply.event.type == "clarification_answered"
    assert (await runner.run(tid)).status == "idle"
    assert "[U_ALICE] staging" in model.last_prompt_text()


async def test_wait_polls_until_done(store):
    clock = FakeClock()
    effects: Counter = Counter()
    model = RecordingModel([call("train", name="m1"), say("trained")])
    runner = Runner(store, model, make_tools(effects), clock=clock)
    tid = await start(store)
    state = await runner.run(tid)
    assert state.status == "awaiting_job"
    assert (state.wake_at - clock.now).total_seconds() == 5
    clock.advance(5)
    assert (await runner.run(tid)).status == "awaiting_job"  # first poll: not yet
    assert effects["poll"] == 1
    wake = (await store.get_thread(tid)).wake_at
    assert (wake - clock.now).total_seconds() == 5
    clock.advance(5)
    assert (await runner.run(tid)).status == "idle"
    assert effects["train"] == 1 and effects["poll"] == 2
    assert '"accuracy": 0.9' in model.last_prompt_text()


async def test_wait_times_out_and_webhook_finishes_another(store):
    clock = FakeClock()
    effects: Counter = Counter({"poll": -100})  # the poller never reports done
    model = RecordingModel([call("train", name="m1"), say("timed out")])
    runner = Runner(store, model, make_tools(effects), clock=clock)
    tid = await start(store)
    state = await runner.run(tid)
    wait_id = state.pending.wait.wait_id
    clock.advance(61)
    assert (await runner.run(tid)).status == "idle"
    assert "wait_timed_out" in await types_of(store, tid)
    refused = await finish_wait(store, tid, wait_id=wait_id, result={"late": True})
    assert refused.reason.startswith("no open wait")


async def test_webhook_finishes_a_wait(store):
    effects: Counter = Counter({"poll": -100})
    model = RecordingModel([call("train", name="m1"), say("done")])
    runner = Runner(store, model, make_tools(effects))
    tid = await start(store)
    state = await runner.run(tid)
    done = await finish_wait(
        store, tid, wait_id=state.pending.wait.wait_id, result={"accuracy": 1}, dedupe_key="h1"
    )
    assert done.event.type == "wait_finished"
    again = await finish_wait(
        store, tid, wait_id=state.pending.wait.wait_id, result={"accuracy": 1}, dedupe_key="h1"
    )
    assert again.deduplicated
    assert (await runner.run(tid)).status == "idle"


async def test_step_budget_stops_a_model_that_never_ends(store):
    model = RecordingModel([call("lookup", name=str(i)) for i in range(10)])
    tid = await start(store)
    state = await Runner(
        store, model, make_tools(Counter()), RunnerConfig(max_decisions_per_input=4)
    ).run(tid)
    assert state.status == "failed"
    assert (await store.select_events(tid))[-1].kind == "step_budget"


async def test_a_message_arriving_mid_model_call_is_seen_by_the_next_decision(db_url):
    store = await open_store(db_url)
    front = await open_store(db_url)  # another process's connection pool
    try:
        gate = asyncio.Event()
        model = RecordingModel([say("first"), say("answer with both")], gate=gate)
        tid = await start(store)
        task = asyncio.create_task(Runner(store, model, make_tools(Counter())).run(tid))
        await model.entered.wait()
        await post_user_message(front, KEY, text="also check prod", user="U_ALICE", dedupe_key="m2")
        gate.set()
        state = await task
        assert state.status == "idle"
        events = await store.select_events(tid)
        types = [e.type for e in events]
        assert types.count("user_message") == 2
        # The in-flight decision was dropped at the conflict; the next one saw the message.
        assert types.count("model_decision") == 1
        assert len(model.prompts) == 2
        assert "also check prod" in model.last_prompt_text()
    finally:
        await store.close()
        await front.close()


async def test_two_runners_on_one_thread_only_one_proceeds(db_url):
    a, b = await open_store(db_url), await open_store(db_url)
    try:
        effects: Counter = Counter()
        gate = asyncio.Event()
        model = RecordingModel([call("lookup", name="x"), say("done")], gate=gate)
        tid = await start(a)
        first = asyncio.create_task(Runner(a, model, make_tools(effects), owner="w1").run(tid))
        await model.entered.wait()
        second = await Runner(b, model, make_tools(effects), owner="w2").run(tid)
        assert second is None  # the lease is held
        gate.set()
        assert (await first).status == "idle"
        assert effects["lookup"] == 1
        events = await a.select_events(tid)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_approval_outcome_runs_the_tool_only_when_approved(store, decision):
    effects: Counter = Counter()
    model = RecordingModel([call("deploy", name="api"), say("done")])
    runner = Runner(store, model, make_tools(effects))
    tid = await start(store)
    state = await runner.run(tid)
    await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision=decision, reviewers=ReviewerRule(),
    )  # fmt: skip
    await runner.run(tid)
    assert effects["deploy"] == (1 if decision == "approve" else 0)


async def test_a_reused_tool_use_id_is_rejected(store):
    effects: Counter = Counter()
    twice = [call("lookup", _id="toolu_same", name=n) for n in ("a", "b")]
    model = RecordingModel([*twice, say("ok")])
    tid = await start(store)
    state = await Runner(store, model, make_tools(effects)).run(tid)
    assert state.status == "idle"
    assert effects["lookup"] == 1  # the second call would have shared the first's key
    assert "'toolu_same' was already used" in model.last_prompt_text()


async def test_a_runner_that_lost_its_lease_starts_nothing_new(db_url):
    a, b = await open_store(db_url), await open_store(db_url)
    try:
        effects: Counter = Counter()
        gate = asyncio.Event()
        model = RecordingModel([call("lookup", name="x"), say("done")], gate=gate)
        tid = await start(a)
        cfg = RunnerConfig(lease_ttl_s=0.3)
        first = asyncio.create_task(Runner(a, model, make_tools(effects), cfg, owner="w1").run(tid))
        await model.entered.wait()
        # w1 stalls in the model call; its lease is taken over (as after a long pause).
        await a.release_lease(tid, "w1")
        assert await b.acquire_lease(tid, "w2", 60)
        await asyncio.sleep(0.3)  # w1's next heartbeat finds the lease gone
        gate.set()
        await first
        assert effects["lookup"] == 0  # w1 recorded its decision but ran nothing
        assert (await a.get_thread(tid)).lease_owner == "w2"
    finally:
        await a.close()
        await b.close()


async def test_a_decision_records_the_tools_its_prompt_was_built_from(store):
    tools = make_tools(Counter())
    tid = await start(store, "what is <@U0BOB> doing?")
    await Runner(store, RecordingModel([say("no idea")]), tools).run(tid)
    (decision,) = [e for e in await store.select_events(tid) if e.type == "model_decision"]
    assert (decision.tool_names, decision.tools_hash) == tools_fingerprint(tools.all())
    assert decision.tool_names == tuple(tools.names())
    assert decision.projection_version == "v2"


async def test_each_step_waits_for_the_front_doors_pace(store):
    """While the serving loop has answers to give, the runner starts no step: the model
    is not asked and no tool runs until ``pace`` returns, then the run goes on."""
    effects: Counter = Counter()
    model = RecordingModel([call("lookup", name="db"), say("db found")])
    answered = asyncio.Event()
    paced = 0

    async def pace() -> None:
        nonlocal paced
        paced += 1
        await answered.wait()

    tid = await start(store)
    run = asyncio.create_task(Runner(store, model, make_tools(effects), pace=pace).run(tid))
    for _ in range(500):  # the run loads the thread first (database round trips)
        if paced:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # and, held, it goes no further
    assert paced == 1 and not run.done()
    assert model.prompts == [] and effects["lookup"] == 0
    answered.set()
    state = await run
    assert state.status == "idle" and effects["lookup"] == 1
    assert paced == 2  # before each ask (a run_now call runs in the step that chose it)
