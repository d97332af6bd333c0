"""Run one thread through the real runner and store, approving its one call on the way."""

from __future__ import annotations

from collections.abc import Iterable

from engine import events as ev
from engine.inputs import Decider, decide_approval, post_user_message
from engine.models.scripted import Step
from engine.reviewers import ReviewerRule
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.support.fakes import RecordingModel
from tools import Tool, ToolRegistry

KEY = ThreadKey("T1", "C1", "1700000000.000100")


async def run_approved(
    store: Store, tools: Iterable[Tool], script: list[Step]
) -> tuple[list[ev.AnyEvent], RecordingModel]:
    """Ask, approve the call the model makes (by U_BOB), run to rest; the log and model."""
    registry = ToolRegistry()
    for t in tools:
        registry.register(t)
    model = RecordingModel(script)
    runner = Runner(store, model, registry)
    tid = (
        await post_user_message(store, KEY, text="go", user="U_ALICE", dedupe_key="m1")
    ).thread_id
    state = await runner.run(tid)
    assert state is not None and state.status == "awaiting_approval", state
    assert state.pending is not None
    await decide_approval(
        store,
        tid,
        tool_call_id=state.pending.tool_call_id,
        decider=Decider("U_BOB"),
        decision="approve",
        reviewers=ReviewerRule(),
    )
    state = await runner.run(tid)
    assert state is not None and state.status == "idle", state
    return await store.select_events(tid), model


def results(events: list[ev.AnyEvent]) -> list[ev.ToolResult]:
    return [e for e in events if isinstance(e, ev.ToolResult)]
