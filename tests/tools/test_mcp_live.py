"""Live MCP definitions in a serving process (issue 16 §1, §9), against real SDK servers.

A server down at startup is served without and its tools join when it comes up; a
changed definition (announced, or seen by the pre-call check) replaces its tool in the
registry, so the next decision is offered it, while a call requested under the old one
is still refused.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from engine import events as ev
from engine.config_file import PolicyRule
from engine.inputs import post_user_message
from engine.models.scripted import call, say
from engine.rules import PolicySet
from engine.runner import Runner
from engine.store import Store, ThreadKey
from tests.support.fakes import RecordingModel
from tests.tools.test_mcp import HttpServer, ctx, run, stdio
from tools import Tool, ToolRegistry
from tools.errors import ToolError
from tools.mcp import DefinitionChanged, McpServerConfig, McpSource, keeper

pytestmark = pytest.mark.slow

ECHO = "mcp__demo__echo"
RUN_NOW = PolicySet((PolicyRule.model_validate({"tool": "mcp__*", "policy": "run_now"}),))


class Watched(ToolRegistry):
    """A registry that says when it changes (a source's keeper changes it in a task of
    its own), so a test waits for that instead of the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def _swap(self, tools: dict[str, Tool]) -> None:
        super()._swap(tools)
        self.changed.set()

    async def until(self, check: Callable[[], bool], within: float = 30) -> None:
        async with asyncio.timeout(within):
            while not check():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper, "BACKOFF_S", (0.05, 0.2))


@pytest.fixture
async def serving() -> AsyncIterator[Callable[..., object]]:
    """``serve(name, config, registry)``: a source connected and serving, closed after."""
    opened: list[McpSource] = []

    async def serve(
        name: str, server: McpServerConfig, registry: ToolRegistry, **kw: float
    ) -> McpSource:
        source = McpSource(name, server, **kw)
        opened.append(source)
        await source.connect()
        source.serve(registry)
        return source

    yield serve
    for source in opened:
        await source.close()


@pytest.fixture
def http_live() -> Iterator[HttpServer]:
    """A handshake-era HTTP server: it says list_changed as a notification."""
    server = HttpServer(port=0, flags=("--live", "--legacy"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["stdio", "http"])
def live_server(request: pytest.FixtureRequest) -> McpServerConfig:
    """A server with ``change``: over stdio it speaks 2026-07-28 (a listen stream), over
    HTTP the handshake era (a notification)."""
    if request.param == "stdio":
        return stdio("--live")
    return McpServerConfig(url=request.getfixturevalue("http_live").url)


# --- §9: a server that is down -------------------------------------------------------------


async def test_a_server_that_never_answers_is_served_without_in_one_warning_line(serving, caplog):
    caplog.set_level(logging.WARNING, logger="tools.mcp")
    registry = Watched()
    hung = McpServerConfig(command="sleep", args=["600"])  # never answers initialize
    source = await serving("hung", hung, registry, connect_timeout_s=0.5)
    assert len(registry) == 0 and not source.up
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("mcp server down server=hung reason=")
    assert line.endswith("; serving without its tools, retrying in the background")
    assert "\n" not in line


@pytest.mark.parametrize(
    "command", [["/nonexistent/bin/mcp-server"], [sys.executable, "-c", "import sys; sys.exit(3)"]]
)
async def test_a_server_down_at_startup_offers_its_tools_once_it_comes_up(
    serving, quick_backoff, tmp_path: Path, command: list[str]
):
    """A missing command, or a server that exits: retried in the background; the first
    listing that works offers its tools (here, once the test lets the server start)."""
    registry = Watched()
    down = McpServerConfig(command=command[0], args=command[1:])
    await serving("gone", down, registry)
    gate = tmp_path / "up"
    late = await serving("demo", stdio("--unless", str(gate)), registry)
    assert registry.names() == [] and not late.up
    gate.touch()
    await registry.until(lambda: ECHO in registry)
    assert late.up and registry.get(ECHO).source == "mcp:demo"  # type: ignore[union-attr]
    assert await run(registry.get(ECHO), {"text": "hi"}) == {"text": "echo: hi"}  # type: ignore[arg-type]


async def test_retries_back_off_from_1_s_doubling_to_60_s(monkeypatch: pytest.MonkeyPatch):
    waited: list[float] = []
    enough = asyncio.Event()

    async def sleep(delay: float) -> None:
        waited.append(delay)
        if len(waited) == 9:
            enough.set()
            await asyncio.Event().wait()  # stay here until stopped

    monkeypatch.setattr(keeper, "sleep", sleep)
    source = McpSource("gone", McpServerConfig(command="/nonexistent/bin/mcp-server"))
    try:
        await source.connect()
        source.serve(Watched())
        await asyncio.wait_for(enough.wait(), 30)
    finally:
        await source.close()
    assert waited == [1, 2, 4, 8, 16, 32, 60, 60, 60]


async def test_the_first_good_listing_is_offered_to_the_next_decision(
    serving, quick_backoff, store: Store, tmp_path: Path
):
    registry = Watched()
    gate = tmp_path / "up"
    await serving("demo", stdio("--unless", str(gate)), registry)
    model = RecordingModel([say("no tools yet"), say("now I see them")])
    runner = Runner(store, model, registry, policy=RUN_NOW)
    key = ThreadKey("T1", "C1", "1700000000.000100")
    tid = (await post_user_message(store, key, text="a", user="U1", dedupe_key="m1")).thread_id
    await runner.run(tid)
    gate.touch()
    await registry.until(lambda: ECHO in registry)
    await post_user_message(store, key, text="b", user="U1", dedupe_key="m2")
    await runner.run(tid)
    first, second = (set(p.tool_names) for p in model.prompts)
    assert ECHO not in first and ECHO in second


# --- §1: definitions that change ------------------------------------------------------------


async def test_a_silent_change_seen_before_a_call_is_offered_from_then_on(serving, store: Store):
    """The server redefines echo without a word. The call requested under the old
    definition is refused (the pinning promise); the model is then shown the new one,
    and the call it makes under it runs."""
    registry = Watched()
    await serving("demo", stdio(), registry)
    old = registry.get(ECHO)
    assert old is not None
    redefine = registry.get("mcp__demo__redefine")
    assert redefine is not None
    await run(redefine, {"tool": "echo", "description": "Echo the text, louder."})
    assert registry.get(ECHO) is old  # nothing said: nothing known yet

    model = RecordingModel(
        [call(ECHO, text="a"), call(ECHO, text="b"), say("done")]  # the second, after the refusal
    )
    runner = Runner(store, model, registry, policy=RUN_NOW)
    key = ThreadKey("T1", "C1", "1700000000.000200")
    tid = (await post_user_message(store, key, text="go", user="U1", dedupe_key="m1")).thread_id
    state = await runner.run(tid)
    assert state is not None and state.status == "idle", state

    results = [e for e in await store.select_events(tid) if isinstance(e, ev.ToolResult)]
    assert [r.ok for r in results] == [False, True]
    assert "changed since the call was approved" in (results[0].error or "")
    assert "it was not run" in (results[0].error or "")
    new = registry.get(ECHO)
    assert new is not None and new is not old and new.description == "Echo the text, louder."
    shown = [{t["name"]: t for t in p.tools}[ECHO]["description"] for p in model.prompts]
    assert shown == ["Echo the text back.", "Echo the text, louder.", "Echo the text, louder."]
    requested = [e for e in await store.select_events(tid) if isinstance(e, ev.ToolCallRequested)]
    assert [r.definition_hash for r in requested] == [old.definition_hash, new.definition_hash]


async def test_an_announced_change_replaces_the_tool_and_adds_new_ones(
    serving, live_server: McpServerConfig
):
    """``change`` redefines echo, adds a tool, and says so: on a 2026-07-28 stdio session
    as a listen-stream event, on a handshake-era HTTP session as
    notifications/tools/list_changed. The registry follows without any call."""
    registry = Watched()
    source = await serving("demo", live_server, registry)
    old: Tool = registry.get(ECHO)  # type: ignore[assignment]
    change: Tool = registry.get("mcp__demo__change")  # type: ignore[assignment]
    version = registry.version
    await run(change, {"tool": "echo", "description": "Echo, and keep a copy."})
    await run(change, {"tool": "fresh", "description": "A tool added while serving."})
    await registry.until(lambda: "mcp__demo__fresh" in registry)
    new: Tool = registry.get(ECHO)  # type: ignore[assignment]
    assert registry.version > version
    assert new.description == "Echo, and keep a copy."
    assert source.redefined() == [ECHO]
    # Requested under the old definition: refused, however the registry changed since.
    with pytest.raises(DefinitionChanged, match="description changed"):
        await run(old, {"text": "x"}, ctx(old.definition_hash))
    assert await run(new, {"text": "y"}, ctx(new.definition_hash)) == {"text": "echo: y"}


async def test_a_tool_the_server_removes_leaves_the_registry(serving):
    registry = Watched()
    await serving("demo", stdio("--live"), registry)
    change: Tool = registry.get("mcp__demo__change")  # type: ignore[assignment]
    await run(change, {"tool": "add", "description": ""})
    await registry.until(lambda: "mcp__demo__add" not in registry)
    assert ECHO in registry


async def test_a_change_is_not_taken_from_a_server_that_cannot_list(serving):
    """A refresh that fails leaves the tools as they were, and says why."""
    registry = Watched()
    source = await serving("demo", stdio(), registry)
    crash_on_list: Tool = registry.get("mcp__demo__crash_on_list")  # type: ignore[assignment]
    await run(crash_on_list, {})
    with pytest.raises(ToolError):
        await source.refresh()
    assert ECHO in registry
