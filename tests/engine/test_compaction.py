"""Compaction keeps long threads within the prompt budget, reproducibly."""

from __future__ import annotations

from pydantic import BaseModel

from engine import events as ev
from engine.compaction import MAX_SUMMARY_CHARS, Digest
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.scripted import call, say
from engine.replay import replay_all
from engine.reviewers import ReviewerRule
from engine.runner import Runner, RunnerConfig
from engine.store import ThreadKey
from tests.support.fakes import RecordingModel
from tools import ToolContext, ToolRegistry, tool

KEY = ThreadKey("T1", "C1", "1700000000.000200")


class Page(BaseModel):
    n: int


def bulky_tools() -> ToolRegistry:
    reg = ToolRegistry()

    @tool(registry=reg)
    async def read_page(args: Page, ctx: ToolContext) -> dict:
        """Read one page of a long log."""
        return {"page": args.n, "lines": [f"line {i} of page {args.n}" for i in range(60)]}

    @tool(policy="approve_before_run", registry=reg)
    async def restart(args: Page, ctx: ToolContext) -> dict:
        """Restart a shard."""
        return {"restarted": args.n}

    return reg


async def test_a_long_thread_is_compacted_within_budget_and_replays(store):
    budget = 2000
    script = [call("read_page", n=i) for i in range(12)]
    script += [call("restart", n=3, _text="shard 3 looks stuck"), say("restarted shard 3")]
    model = RecordingModel(script)
    tools = bulky_tools()
    runner = Runner(store, model, tools, RunnerConfig(context_budget_tokens=budget))
    posted = await post_user_message(
        store, KEY, text="find out why shard 3 is slow", user="U_ALICE", dedupe_key="e1"
    )
    tid = posted.thread_id
    state = await runner.run(tid)
    assert state.status == "awaiting_approval"
    reject = await decide_approval(
        store, tid, tool_call_id=state.pending.tool_call_id, decider=Decider("U_BOB"),
        decision="reject", reason="not during the sale", reviewers=ReviewerRule(),
    )  # fmt: skip
    assert reject.event.type == "approval_rejected"
    # A new runner (a restart) resumes from the latest compaction.
    state = await Runner(store, model, tools, RunnerConfig(context_budget_tokens=budget)).run(tid)
    assert state.status == "idle"

    events = await store.select_events(tid)
    compactions = [e for e in events if isinstance(e, ev.ContextCompacted)]
    assert len(compactions) >= 2
    assert all(p.estimated_tokens <= budget for p in model.prompts)
    last = model.prompts[-1]
    summary = last.messages[0]["content"][0]["text"]
    assert summary == compactions[-1].summary
    assert "find out why shard 3 is slow" in summary  # the task always stays
    assert "not during the sale" in model.last_prompt_text()  # so does the constraint
    # Every stored decision's prompt is recomputed byte for byte from the log.
    results = replay_all(events, list(tools))
    assert len(results) == 14 and all(r.matches for r in results)
    assert [r.prompt.hash for r in results] == [p.hash for p in model.prompts]


def test_a_summary_keeps_people_and_drops_old_steps_within_its_cap():
    digest = Digest()
    digest.add(ev.UserMessage(seq=1, actor="U1", text="the task"))
    for seq in range(2, 400):
        digest.add(
            ev.ToolResult(seq=seq, tool_call_id=f"c{seq}", attempt=1, ok=True, output="x" * 90)
        )
    digest.add(ev.UserMessage(seq=400, actor="U2", text="careful with prod"))
    text = digest.summary(400)
    assert len(text) <= MAX_SUMMARY_CHARS
    assert "Task: [U1] the task" in text
    assert "careful with prod" in text
    assert "earlier steps omitted" in text
    assert "seq 399" in text  # the newest steps are the ones kept


def test_a_person_s_word_on_an_unknown_outcome_survives_a_summary():
    """Whether the effect happened is a person's word; a compaction must keep it."""
    digest = Digest()
    digest.add(ev.UserMessage(seq=1, actor="U1", text="restart shard 3"))
    digest.add(
        ev.ReconcileDecided(
            seq=2,
            actor="U2",
            tool_call_id="c2",
            decision="happened",
            reviewer="U2",
            note="the shard came back at 10:02",
        )
    )
    for seq in range(3, 400):
        digest.add(
            ev.ToolResult(seq=seq, tool_call_id=f"c{seq}", attempt=1, ok=True, output="x" * 90)
        )
    text = digest.summary(400)
    assert "c2: it happened (by U2)" in text
    assert "the shard came back at 10:02" in text
