"""An MCP server that asks the requester mid-call (elicitation) and reports progress, as
the runner meets it: real SDK servers over stdio and streamable HTTP, in both eras (a
classic ``elicitation/create`` on a handshake-era session, an ``InputRequiredResult``
on a 2026-07-28 one).

The question is a durable wait (``wait_started`` with the request, its schema, mode,
kind and ``request_state``); its answer (``wait_finished``) reaches the server, and so
does a decline, and an expiry as a cancel; an ``InputRequiredResult`` is answered by
a new runner on a fresh connection after a restart, on SQLite and PostgreSQL, while a
classic question whose session is gone leaves the call's outcome unknown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from engine import events as ev
from engine.config_file import PolicyRule
from engine.events import utcnow
from engine.inputs import finish_wait, post_user_message
from engine.models.scripted import ScriptedModel, call, say
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey, open_store
from tests.support.fakes import FakeClock
from tests.support.mcp_servers import ASK_SCHEMA, ASK_URL
from tests.tools.test_mcp import HttpServer, stdio
from tools import ToolRegistry
from tools.mcp import McpServerConfig, McpSource
from tools.mcp.progress import ProgressHub

pytestmark = pytest.mark.slow

RUN_NOW = PolicySet((PolicyRule.model_validate({"tool": "mcp__*", "policy": "run_now"}),))
ANSWER = {"name": "bob", "env": "stg", "count": 3, "ok": False}
ERAS = ["stdio-classic", "stdio-input", "http-classic", "http-input"]


@pytest.fixture
async def lite(sqlite_url: str) -> AsyncIterator[Store]:
    s = await open_store(sqlite_url)
    yield s
    await s.close()


@pytest.fixture
def servers() -> Iterator[list[HttpServer]]:
    started: list[HttpServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def config(request: pytest.FixtureRequest, servers: list[HttpServer]) -> Any:
    """``config(era)``: where a server of that era (``<transport>-<classic|input>``) is."""

    def make(era: str) -> McpServerConfig:
        transport, kind = era.split("-")
        flags = ("--ask", "--legacy") if kind == "classic" else ("--ask",)
        if transport == "stdio":
            return stdio(*flags)
        server = HttpServer(port=0, flags=flags)
        server.start()
        servers.append(server)
        return McpServerConfig(url=server.url)

    return make


class Asked:
    """A thread whose one call (``mcp__demo__<tool>``) asks, run by a runner."""

    def __init__(self, store: Store, server: McpServerConfig, tool: str = "ask") -> None:
        self.store, self.server, self.tool = store, server, tool
        self.clock = FakeClock(utcnow())
        self.sources: list[McpSource] = []
        self.tid = ""

    async def runner(self) -> Runner:
        """A runner on a fresh source: a new connection, as after a restart."""
        source = McpSource("demo", self.server)
        self.sources.append(source)
        registry = ToolRegistry()
        for tool in await source.open():
            registry.register(tool)
        model = ScriptedModel([call(f"mcp__demo__{self.tool}"), say("done")])
        return Runner(self.store, model, registry, policy=RUN_NOW, clock=self.clock)

    async def start(self) -> ev.WaitStarted:
        runner = await self.runner()
        key = ThreadKey("T1", "C1", f"1700000000.{len(self.sources):06d}")
        posted = await post_user_message(self.store, key, text="go", user="U_ALICE")
        self.tid = posted.thread_id
        state = await runner.run(self.tid)
        assert state is not None and state.status == "awaiting_job", state
        return (await self.waits())[-1]

    async def waits(self) -> list[ev.WaitStarted]:
        return [e for e in await self.events() if isinstance(e, ev.WaitStarted)]

    async def answer(self, wait: ev.WaitStarted, result: dict[str, Any]) -> None:
        done = await finish_wait(
            self.store, self.tid, wait_id=wait.wait_id, result=result, actor="U_ALICE"
        )
        assert isinstance(done.event, ev.WaitFinished) and done.event.resumes  # type: ignore[union-attr]

    async def events(self) -> list[ev.AnyEvent]:
        return list(await self.store.select_events(self.tid))

    async def received(self) -> dict[str, Any]:
        """What the server says it received (its result's structured content)."""
        [done] = [e for e in await self.events() if isinstance(e, ev.ToolResult)]
        assert done.ok, done.error
        return done.output["structured"]

    async def close(self) -> None:
        for source in self.sources:
            await source.close()


@pytest.fixture
async def asked_threads() -> AsyncIterator[list[Asked]]:
    made: list[Asked] = []
    yield made
    for thread in made:
        await thread.close()


def question(wait: ev.WaitStarted) -> dict[str, Any]:
    return wait.data["elicitation"]


@pytest.mark.parametrize("era", ERAS)
async def test_a_question_is_a_durable_wait_and_the_answer_reaches_the_server(
    era: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(era))
    asked_threads.append(t)
    wait = await t.start()
    asked = question(wait)
    classic = era.endswith("classic")
    assert wait.resumes and wait.tool_call_id
    assert asked["kind"] == ("classic" if classic else "input_required")
    assert (asked["mode"], asked["message"], asked["schema"]) == (
        "form",
        "Which deploy?",
        ASK_SCHEMA,
    )
    assert asked["request_state"] == (None if classic else "ask:1")
    # In-session: bounded by the session held open; input required: nothing is held.
    assert (wait.timeout_at - t.clock()).total_seconds() == (600 if classic else 86400)
    await t.answer(wait, {"action": "accept", "content": ANSWER})
    state = await (await _same_runner(t)).run(t.tid)
    assert state is not None and state.status == "idle", state
    assert await t.received() == {"form": {"action": "accept", "content": ANSWER}}
    types = [e.type for e in await t.events()]
    assert types.count("tool_started") == 2 and types.count("wait_finished") == 1


async def _same_runner(t: Asked) -> Runner:
    """A runner on the source that asked (its session holds the classic question)."""
    source = t.sources[-1]
    registry = ToolRegistry()
    for tool in source.offered:
        registry.register(tool)
    model = ScriptedModel([say("done")])
    return Runner(t.store, model, registry, policy=RUN_NOW, clock=t.clock)


@pytest.mark.parametrize("era", ERAS)
async def test_decline_is_answered_to_the_server_as_decline(
    era: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(era))
    asked_threads.append(t)
    wait = await t.start()
    await t.answer(wait, {"action": "decline"})
    await (await _same_runner(t)).run(t.tid)
    assert await t.received() == {"form": {"action": "decline"}}


@pytest.mark.parametrize("era", ERAS)
async def test_expiry_is_a_wait_timed_out_and_the_server_is_told_cancel(
    era: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(era))
    asked_threads.append(t)
    wait = await t.start()
    t.clock.advance((wait.timeout_at - t.clock()).total_seconds())
    state = await (await _same_runner(t)).run(t.tid)
    assert state is not None and state.status == "idle", state
    [expired] = [e for e in await t.events() if isinstance(e, ev.WaitTimedOut)]
    assert expired.resumes and expired.wait_id == wait.wait_id
    assert await t.received() == {"form": {"action": "cancel"}}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_input_required_call_resumes_after_a_restart_with_its_request_state(
    transport: str, store: Store, config: Any, asked_threads: list[Asked]
) -> None:
    """The process that asked is gone: a new runner on a new connection (a new server
    process over stdio, a new session over HTTP) sends the call again with the answer
    and the echoed state (the server refuses any other state)."""
    t = Asked(store, config(f"{transport}-input"))
    asked_threads.append(t)
    wait = await t.start()
    await t.sources[0].close()
    await t.answer(wait, {"action": "accept", "content": ANSWER})
    state = await (await t.runner()).run(t.tid)
    assert state is not None and state.status == "idle", state
    assert await t.received() == {"form": {"action": "accept", "content": ANSWER}}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_classic_question_whose_session_is_gone_leaves_the_outcome_unknown(
    transport: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(f"{transport}-classic"))
    asked_threads.append(t)
    wait = await t.start()
    await t.sources[0].close()
    await t.answer(wait, {"action": "accept", "content": ANSWER})
    state = await (await t.runner()).run(t.tid)
    assert state is not None and state.status == "awaiting_reconcile", state
    [unknown] = [e for e in await t.events() if isinstance(e, ev.ToolOutcomeUnknown)]
    assert "session that is gone" in unknown.error


@pytest.mark.parametrize("era", ["stdio-input", "http-classic"])
async def test_two_questions_are_asked_one_after_the_other(
    era: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(era), tool="ask_twice")
    asked_threads.append(t)
    first = await t.start()
    await t.answer(first, {"action": "accept", "content": ANSWER})
    runner = await _same_runner(t)
    state = await runner.run(t.tid)
    assert state is not None and state.status == "awaiting_job"
    second = (await t.waits())[-1]
    assert second.wait_id != first.wait_id and question(second)["message"] == "Why?"
    await t.answer(second, {"action": "accept", "content": {"why": "release"}})
    await runner.run(t.tid)
    assert await t.received() == {
        "first": {"action": "accept", "content": ANSWER},
        "second": {"action": "accept", "content": {"why": "release"}},
    }


@pytest.mark.parametrize("era", ["stdio-classic", "http-input"])
async def test_a_url_mode_question_names_its_page_and_an_accept_reaches_the_server(
    era: str, lite: Store, config: Any, asked_threads: list[Asked]
) -> None:
    t = Asked(lite, config(era), tool="ask_url")
    asked_threads.append(t)
    wait = await t.start()
    assert (question(wait)["mode"], question(wait)["url"]) == ("url", ASK_URL)
    await t.answer(wait, {"action": "accept"})
    await (await _same_runner(t)).run(t.tid)
    assert await t.received() == {"login": {"action": "accept"}}


@pytest.mark.parametrize("era", ["stdio-input", "http-classic"])
async def test_progress_reaches_the_hook_with_the_thread_and_the_call(
    era: str, lite: Store, config: Any
) -> None:
    hub = ProgressHub(every_s=3600)  # the first is passed on at once, the rest held
    heard: list[tuple[Any, ...]] = []
    got = asyncio.Event()

    def hook(*args: Any) -> None:
        heard.append(args)
        got.set()

    hub.listen(hook)
    source = McpSource("demo", config(era), progress=hub)
    try:
        registry = ToolRegistry()
        for tool in await source.open():
            registry.register(tool)
        model = ScriptedModel([call("mcp__demo__progress"), say("done")])
        runner = Runner(lite, model, registry, policy=RUN_NOW)
        key = ThreadKey("T1", "C1", "1700000000.000900")
        tid = (await post_user_message(lite, key, text="go", user="U_ALICE")).thread_id
        await runner.run(tid)
        await asyncio.wait_for(got.wait(), 30)
    finally:
        await source.close()
    [started] = [e for e in await lite.select_events(tid) if isinstance(e, ev.ToolStarted)]
    assert heard[0] == (tid, started.tool_call_id, 1.0, 3.0, "step 1 of 3")
    assert {h[:2] for h in heard} == {(tid, started.tool_call_id)}
    types = {e.type for e in await lite.select_events(tid)}
    assert "tool_result" in types and not any("progress" in t for t in types)
    assert json.dumps(heard)  # plain values, ready for a front door
