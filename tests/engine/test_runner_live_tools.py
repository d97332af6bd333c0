"""The runner with a registry that changes while threads run (issue 16 §1): an MCP server
redefined a tool. Each decision is offered the tools as they are; a call is pinned to
the definition the model was shown, so one shown the old definition is refused."""

from __future__ import annotations

from collections import Counter

from engine import events as ev
from engine.inputs import post_user_message
from engine.models.base import Decision
from engine.models.scripted import call, say
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.support.demo_tools import Args, make_tools
from tests.support.fakes import RecordingModel
from tools import Tool, ToolRegistry

KEY = ThreadKey("T1", "C1", "1700000000.000100")


def redefined(tools: ToolRegistry, name: str, description: str) -> Tool:
    """``name`` as its source defines it now: another description, a new Tool."""
    old = tools.get(name)
    assert old is not None

    async def func(args: Args, ctx: object) -> dict:
        return {"ran": description}

    new = Tool(name, description, old.policy, old.args_model, func, source="mcp:demo")
    assert not tools.replace_source("mcp:demo", [new])
    return new


def registry() -> ToolRegistry:
    tools = make_tools(Counter())
    lookup = tools.unregister("lookup")
    assert lookup is not None
    lookup.source = "mcp:demo"  # as a source's tool: replaced whole when it changes
    tools.register(lookup)
    return tools


async def test_a_call_decided_while_the_tool_changed_is_pinned_to_what_the_model_saw(
    store: Store,
):
    tools = registry()
    old = tools.get("lookup")
    assert old is not None
    changed: list[Tool] = []

    def decide_while_it_changes(prompt) -> Decision:
        # The server redefines the tool while the model is deciding on the old one.
        changed.append(redefined(tools, "lookup", "Look a name up, and tell someone."))
        return call("lookup", name="db")(prompt)

    script = [decide_while_it_changes, call("lookup", name="db"), say("found")]
    model = RecordingModel(script)
    tid = (await post_user_message(store, KEY, text="go", user="U1", dedupe_key="m1")).thread_id
    state = await Runner(store, model, tools).run(tid)
    assert state is not None and state.status == "idle", state

    events = await store.select_events(tid)
    requested = [e.definition_hash for e in events if isinstance(e, ev.ToolCallRequested)]
    assert requested == [old.definition_hash, changed[0].definition_hash]
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert not results[0].ok and "changed since it was approved" in (results[0].error or "")
    assert results[1].ok and results[1].output == {"ran": "Look a name up, and tell someone."}
    # The decision after the change is offered the new definition.
    shown = [{t["name"]: t for t in p.tools}["lookup"]["description"] for p in model.prompts]
    assert shown[1:] == ["Look a name up, and tell someone."] * 2
    assert model.prompts[0].tools_hash != model.prompts[1].tools_hash
