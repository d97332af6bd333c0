from __future__ import annotations

from pydantic import BaseModel

from engine.inputs import decide_approval, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.policy import ApproverPolicy
from engine.runner import Runner
from engine.store import ThreadKey
from tools import ToolContext, ToolRegistry, tool


class Q(BaseModel):
    q: str


async def test_scripted_thread_reaches_final_answer(store):
    reg = ToolRegistry()
    seen: list[str] = []

    @tool(registry=reg)
    async def lookup(args: Q, ctx: ToolContext) -> dict:
        """Look something up."""
        seen.append(ctx.idempotency_key)
        return {"answer": args.q.upper()}

    @tool(policy="approve_before_run", registry=reg)
    async def deploy(args: Q, ctx: ToolContext) -> dict:
        """Deploy."""
        seen.append("deploy:" + ctx.idempotency_key)
        return {"deployed": args.q}

    model = ScriptedModel([call("lookup", q="x"), call("deploy", q="api"), say("done")])
    runner = Runner(store, model, reg)
    posted = await post_user_message(
        store, ThreadKey("T", "C", "1.0"), text="go", user="U1", dedupe_key="e1"
    )
    state = await runner.run(posted.thread_id)
    assert state.status == "awaiting_approval"
    res = await decide_approval(
        store,
        posted.thread_id,
        tool_call_id=state.pending.tool_call_id,
        reviewer="U2",
        decision="approve",
        policy=ApproverPolicy(),
    )
    assert res.event.type == "approval_granted"
    state = await runner.run(posted.thread_id)
    assert state.status == "idle"
    assert len(seen) == 2
    types = [e.type for e in await store.select_events(posted.thread_id)]
    assert types.count("final_answer") == 1
