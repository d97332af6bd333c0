"""engine.replay: a decision's prompt recomputed from the log, and why it differs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from engine import events as ev
from engine.context import Prompt, project
from engine.replay import replay, replay_all, tools_for, tools_seen
from tests.support.logs import REQUESTER, answered, stamp, user
from tools import ToolContext, ToolRegistry, tool


class SearchArgs(BaseModel):
    query: str


HERE = ToolRegistry()
MORE = ToolRegistry()


@tool(registry=HERE)
async def lookup(args: SearchArgs, ctx: ToolContext) -> dict:
    """Look something up."""
    return {}


@tool(registry=MORE)
async def page_oncall(args: SearchArgs, ctx: ToolContext) -> dict:
    """Page whoever is on call."""
    return {}


SLACK = {"kind": "slack", "names": {"U0BOB": "bob"}}


def made(prompt: Prompt, *, fingerprint: bool = True, **kw: Any) -> ev.ModelDecision:
    """The decision a runner records for ``prompt`` (old logs: without the fingerprint)."""
    extra = {"tool_names": prompt.tool_names, "tools_hash": prompt.tools_hash}
    return ev.ModelDecision(
        actor="model",
        text="ok",
        prompt_hash=prompt.hash,
        projection_version=prompt.version,
        **(extra if fingerprint else {}),
        **kw,
    )


def thread(tools: list[Any], version: str | None = None, **kw: Any) -> list[Any]:
    first = stamp([user("ask <@U0BOB> &amp; go", source=SLACK)])
    prompt = project(first, tools, version) if version else project(first, tools)
    return stamp([first[0], made(prompt, **kw), ev.FinalAnswer(actor="model", text="ok")])


def test_a_decision_replays_with_the_tools_it_was_offered() -> None:
    both = [*HERE.all(), *MORE.all()]
    log = thread(HERE.all())
    assert tools_seen(log) == {"lookup"}
    assert [t.name for t in tools_for(log[1], both)] == ["lookup"]
    assert replay(log, both).matches  # this process has more tools than it was offered


def test_a_decision_made_with_projection_v1_still_matches() -> None:
    log = thread(HERE.all(), version="v1")
    done = replay(log, HERE.all())
    assert done.matches, done.verdict()
    assert done.prompt.messages[0]["content"][0]["text"] == f"[{REQUESTER}] ask <@U0BOB> &amp; go"
    assert done.verdict().startswith("seq 2: ok (projection v1")


def test_tools_not_loaded_here_are_named_and_are_not_a_mismatch() -> None:
    log = thread([*HERE.all(), *MORE.all()])
    done = replay(log, HERE.all())
    assert (done.matches, done.mismatch, done.missing) == (False, False, ("page_oncall",))
    assert done.verdict().startswith("seq 2: tools not loaded here: page_oncall (")
    assert "MISMATCH" not in done.verdict()


def test_changed_tool_definitions_are_named() -> None:
    log = thread(HERE.all())
    changed = ToolRegistry()

    @tool(registry=changed)
    async def lookup(args: SearchArgs, ctx: ToolContext) -> dict:
        """Look something up, faster."""
        return {}

    verdict = replay(log, changed.all()).verdict()
    assert "MISMATCH" in verdict and "the tools' definitions differ (same names" in verdict


def test_an_edited_log_is_told_apart_from_changed_tools() -> None:
    log = thread(HERE.all())
    edited = [log[0].model_copy(update={"text": "something else"}), *log[1:]]
    verdict = replay(edited, HERE.all()).verdict()
    assert "MISMATCH" in verdict and "the events before seq 2 were changed" in verdict


def test_an_old_decision_without_a_fingerprint_says_so() -> None:
    log = thread([*HERE.all(), *MORE.all()], fingerprint=False)
    (done,) = replay_all(log, HERE.all())
    assert not done.matches
    assert "predates tool fingerprints" in done.verdict()
    assert replay(log, [*HERE.all(), *MORE.all()]).matches  # with the same tools: ok


def test_tools_seen_counts_calls_in_old_logs() -> None:
    old = stamp([user(), ev.ModelDecision(tool_name="deploy", tool_call_id="t1"), *answered()])
    assert tools_seen(old) == {"deploy"}
