"""MCP servers as tool sources, against a real SDK server over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.models.scripted import call, say
from tests.support.approved import results, run_approved
from tests.support.mcp_servers import LONG_NAME, PNG
from tools import RetryableToolError, Tool, ToolContext, ToolError, ToolLoadError
from tools.errors import OutcomeUnknown
from tools.mcp import (
    DefinitionChanged,
    McpLoadError,
    McpServerConfig,
    McpSource,
    McpUnavailable,
    current_definitions,
    definition_hash,
)
from tools.mcp.config import registered_name
from tools.output import MAX_RESULT_BYTES

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parents[1] / "support" / "mcp_servers.py")
ALL = [
    "echo",
    "add",
    "fail",
    "crash",
    "crash_on_list",
    "pid",
    "picture",
    "bump",
    "sleep",
    "redefine",
    "unreadable",
    "big",
    "refuse",
    "get_env",
    "header",
    "hold",
    "holding",
    "release",
]


def stdio(*flags: str, **kw: object) -> McpServerConfig:
    return McpServerConfig(command=sys.executable, args=[SCRIPT, "stdio", *flags], **kw)  # type: ignore[arg-type]


@dataclass
class HttpServer:
    port: int
    proc: subprocess.Popen[str] | None = None
    flags: tuple[str, ...] = ()  # of tests/support/mcp_servers.py

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SCRIPT, "http", "--port", str(self.port), *self.flags],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline().split()[1])
        self.proc.stdout.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer(port=0)
    server.start()
    yield server
    server.stop()


def ctx(definition_hash: str | None = None) -> ToolContext:
    return ToolContext("t1", "c1", "k1", 1, definition_hash=definition_hash)


async def run(tool: Tool, args: dict, context: ToolContext | None = None) -> object:
    return await tool.run(tool.parse_arguments(args), context or ctx())


def server_children() -> list[int]:
    """Our child processes that run the test server."""
    me, found = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
        state = next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))
        if ppid == me and b"mcp_servers.py\x00stdio" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
async def source() -> AsyncIterator[McpSource]:
    src = McpSource("demo", stdio())
    yield src
    await src.close()


async def opened(src: McpSource) -> dict[str, Tool]:
    return {t.name.removeprefix("mcp__demo__"): t for t in await src.open()}


async def test_stdio_lists_every_page_and_calls_a_tool(source):
    tools = await opened(source)
    assert sorted(tools) == sorted(ALL)  # 18 tools arrive in pages of 2
    echo = tools["echo"]
    assert echo.name == "mcp__demo__echo"
    assert echo.source == "mcp:demo"
    assert echo.policy == "approve_before_run"
    assert echo.idempotent is False
    assert echo.annotations == {"readOnlyHint": True, "idempotentHint": True}
    assert echo.description == "Echo the text back."
    assert echo.input_schema()["required"] == ["text"]
    assert await run(echo, {"text": "hi"}) == {"text": "echo: hi"}


async def test_http_lists_and_calls_a_tool(http_server):
    src = McpSource("demo", McpServerConfig(url=http_server.url, headers={"X-Token": "s3cret"}))
    try:
        tools = await opened(src)
        assert sorted(tools) == sorted(ALL)
        assert await run(tools["add"], {"a": 2, "b": 3}) == {"text": "5", "structured": {"sum": 5}}
    finally:
        await src.close()


async def test_arguments_are_checked_against_the_servers_schema(source):
    tools = await opened(source)
    with pytest.raises(ValueError, match="'text' is a required property"):
        tools["echo"].parse_arguments({})


async def test_images_and_text_resources_are_kept_for_the_model_beside_their_summaries(source):
    tools = await opened(source)
    assert await run(tools["picture"], {}) == {
        "text": "a chart",
        "attachments": [
            # A PNG: its base64 is kept, for an image block (engine/context.py).
            {"type": "image", "mime_type": "image/png", "bytes": 69, "data": PNG},
            # A media type the Anthropic API does not take: the summary only.
            {
                "type": "image",
                "mime_type": "image/tiff",
                "bytes": 3,
                "not_shown": "a media type the model does not take",
            },
            # An embedded text resource: its text, inline.
            {
                "type": "resource",
                "uri": "file:///report.txt",
                "mime_type": "text/plain",
                "bytes": 6,
                "text": "report",
            },
        ],
    }


async def test_an_error_result_is_a_tool_error_with_the_servers_text(source):
    tools = await opened(source)
    with pytest.raises(ToolError) as caught:
        await run(tools["fail"], {"message": "disk full on node-3"})
    assert str(caught.value) == "disk full on node-3"
    assert not isinstance(caught.value, RetryableToolError)


UNREADABLE = (
    "MCP server 'demo' sent a message that could not be read "
    "(Invalid JSON: unexpected end of hex escape at line 1 column "
)


async def test_an_answer_the_sdk_cannot_parse_fails_the_call_at_once_over_stdio(source):
    tools = await opened(source)
    # The SDK drops the unparsable line; without our handler the call waits forever
    # (no call timeout here): the guard below only stops a hung test.
    async with asyncio.timeout(120):
        with pytest.raises(ToolError) as caught:
            await run(tools["unreadable"], {})
    assert type(caught.value) is ToolError  # a server error: not retried, not "unknown"
    assert str(caught.value).startswith(UNREADABLE)
    assert await run(tools["echo"], {"text": "still here"}) == {"text": "echo: still here"}


async def test_an_answer_the_sdk_cannot_parse_fails_the_call_over_http(http_server):
    src = McpSource("demo", McpServerConfig(url=http_server.url))
    try:
        tools = await opened(src)
        with pytest.raises(ToolError) as caught:
            await run(tools["unreadable"], {})
        assert type(caught.value) is ToolError
        assert str(caught.value).startswith(UNREADABLE)
        assert await run(tools["echo"], {"text": "x"}) == {"text": "echo: x"}
    finally:
        await src.close()


async def test_a_result_over_the_bound_is_stored_cut_with_its_size_and_digest(store, source):
    size = 3 * MAX_RESULT_BYTES
    big = (await opened(source))["big"]
    events, model = await run_approved(store, [big], [call(big.name, size=size), say("ok")])
    [result] = results(events)
    full = json.dumps({"text": "x" * size}, separators=(",", ":")).encode()
    assert result.ok and result.output["bytes"] == len(full)
    assert result.output["sha256"] == hashlib.sha256(full).hexdigest()
    stored = json.dumps(result.output, ensure_ascii=False).encode()
    assert len(stored) <= MAX_RESULT_BYTES
    note = f"[cut: {len(full):,} bytes, sha256 {result.output['sha256']}; showing the first "
    assert result.output["cut"].startswith(note)
    assert note in model.last_prompt_text()  # what the model was shown of the result


async def test_the_allowlist_keeps_only_the_named_tools():
    src = McpSource("demo", stdio(tools=["echo", "bump"]))
    try:
        assert sorted(t.name for t in await src.open()) == ["mcp__demo__bump", "mcp__demo__echo"]
        assert sorted(await current_definitions(src)) == ["mcp__demo__bump", "mcp__demo__echo"]
    finally:
        await src.close()


async def test_an_allowlisted_tool_the_server_lacks_stops_startup_with_one_line():
    src = McpSource("demo", stdio(tools=["echo", "pods_list"]))
    with pytest.raises(ToolLoadError) as caught:
        await src.open()
    message = str(caught.value)
    assert "\n" not in message
    assert "'demo'" in message and "'pods_list'" in message
    assert server_children() == []


async def test_a_name_too_long_for_anthropic_is_cut_with_a_hash_and_called_by_its_own():
    # Issue 16 §6: it stopped startup. Now cut to 64 with a digest of the server's name.
    src = McpSource("demo", stdio("--long-name"))
    try:
        tools = {t.source_name: t for t in await src.open()}
        long = tools[LONG_NAME]
        digest = hashlib.sha256(LONG_NAME.encode()).hexdigest()[:8]
        assert long.name == f"mcp__demo__{LONG_NAME}"[:55] + "_" + digest
        assert len(long.name) == 64
        assert await run(long, {}) == {"text": f"{LONG_NAME}: {{}}"}  # called by its own
        assert (await current_definitions(src))[long.name] == long.definition_hash
    finally:
        await src.close()


async def test_an_unreachable_server_stops_startup_with_one_line_and_no_secret():
    # The token came from ${KUBE_TOKEN}: a secret, wherever it shows up.
    server = McpServerConfig.model_validate(
        {"command": "/nonexistent/bin/s3cret-kube", "env": {"TOKEN": "s3cret-kube"}},
        context={"substituted": {"s3cret-kube": "${KUBE_TOKEN}"}},
    )
    src = McpSource("kube", server)
    with pytest.raises(McpLoadError) as caught:
        await src.open()
    message = str(caught.value)
    assert message.startswith("MCP server 'kube' unreachable at startup:")
    assert "\n" not in message and "s3cret" not in message


async def test_an_http_server_that_is_down_at_startup_stops_startup(http_server):
    url = http_server.url
    http_server.stop()
    src = McpSource("grafana", McpServerConfig(url=url, headers={"Authorization": "Bearer s3cret"}))
    with pytest.raises(McpLoadError, match=r"^MCP server 'grafana' unreachable at startup: ") as c:
        await src.open()
    assert "s3cret" not in str(c.value)


async def test_a_crash_in_the_middle_of_a_call_is_outcome_unknown_and_the_next_call_reconnects(
    source,
):
    tools = await opened(source)
    first_pid = (await run(tools["pid"], {}))["text"]  # type: ignore[index]
    with pytest.raises(OutcomeUnknown) as caught:
        await run(tools["crash"], {})
    message = str(caught.value)
    assert message.startswith("MCP server 'demo' went away during the call (")
    assert message.endswith("; whether crash ran is unknown")
    assert "\n" not in message
    second_pid = (await run(tools["pid"], {}))["text"]  # type: ignore[index]
    assert second_pid != first_pid
    assert [int(second_pid)] == server_children()


async def test_a_server_lost_at_the_definition_check_is_retryable_the_call_was_not_sent(source):
    tools = await opened(source)
    await run(tools["crash_on_list"], {})  # the next tools/list ends the process unanswered
    with pytest.raises(McpUnavailable, match="'demo'") as caught:
        await run(tools["bump"], {})
    assert not isinstance(caught.value, OutcomeUnknown)
    # The next call reconnects to a new process, where bump runs for the first time.
    assert await run(tools["bump"], {}) == {"text": "1"}


async def test_a_call_not_answered_in_time_is_outcome_unknown():
    src = McpSource("demo", stdio(), call_timeout_s=0.5)
    try:
        tools = await opened(src)
        with pytest.raises(OutcomeUnknown) as caught:
            await run(tools["sleep"], {"seconds": 30})
        message = str(caught.value)
        assert message.startswith("MCP server 'demo' did not answer the call in time (")
        assert message.endswith("; whether sleep ran is unknown")
        assert await run(tools["echo"], {"text": "x"}) == {"text": "echo: x"}
    finally:
        await src.close()


async def test_an_http_server_dying_mid_call_is_outcome_unknown_with_no_secret(http_server):
    src = McpSource("demo", McpServerConfig(url=http_server.url, headers={"X-Token": "s3cret"}))
    try:
        tools = await opened(src)
        with pytest.raises(OutcomeUnknown, match=r"^MCP server 'demo' went away during") as c:
            await run(tools["crash"], {})
        assert "s3cret" not in str(c.value) and "\n" not in str(c.value)
        http_server.stop()
        http_server.start()  # same port
        assert await run(tools["echo"], {"text": "d"}) == {"text": "echo: d"}
    finally:
        await src.close()


async def test_an_http_server_going_down_between_calls_is_retryable_and_the_next_call_reconnects(
    http_server,
):
    src = McpSource("demo", McpServerConfig(url=http_server.url))
    try:
        tools = await opened(src)
        assert await run(tools["echo"], {"text": "a"}) == {"text": "echo: a"}
        http_server.stop()
        # Down before the call: the definition check fails, the call is never sent.
        with pytest.raises(McpUnavailable, match="'demo'"):
            await run(tools["echo"], {"text": "b"})
        with pytest.raises(McpUnavailable):  # still down: reconnecting fails, retryably
            await run(tools["echo"], {"text": "c"})
        http_server.start()  # same port
        assert await run(tools["echo"], {"text": "d"}) == {"text": "echo: d"}
    finally:
        await src.close()


async def test_a_definition_changed_after_approval_is_not_run(source):
    tools = await opened(source)
    bump = tools["bump"]
    approved = bump.definition_hash  # what tool_call_requested records
    await run(tools["redefine"], {"tool": "bump", "description": "Delete every pod."})
    with pytest.raises(DefinitionChanged, match="description changed") as caught:
        await run(bump, {}, ctx(approved))
    assert "mcp__demo__bump" in str(caught.value)
    with pytest.raises(DefinitionChanged):  # no pinned hash: pinned to what was loaded
        await run(bump, {}, ctx(None))
    drifted = (await current_definitions(source))["mcp__demo__bump"]
    assert drifted != approved
    # A call approved under the new definition runs, and it is the first one that did.
    assert await run(bump, {}, ctx(drifted)) == {"text": "1"}


async def test_a_tool_removed_after_approval_is_not_run(source):
    tools = await opened(source)
    await run(tools["redefine"], {"tool": "echo", "description": ""})
    with pytest.raises(DefinitionChanged, match="no longer offered"):
        await run(tools["echo"], {"text": "x"}, ctx(tools["echo"].definition_hash))
    assert "mcp__demo__echo" not in await current_definitions(source)


async def test_definition_hashes_agree_with_the_tools(source):
    tools = await opened(source)
    assert await current_definitions(source) == {t.name: t.definition_hash for t in tools.values()}
    echo = tools["echo"]
    assert definition_hash(echo.name, echo.description, echo.input_schema()) == (
        echo.definition_hash
    )


async def test_calls_share_one_session_and_a_cancelled_call_does_not_break_it(source):
    tools = await opened(source)
    pids = await asyncio.gather(*(run(tools["pid"], {}) for _ in range(5)))
    assert len({p["text"] for p in pids}) == 1  # type: ignore[index]
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await run(tools["sleep"], {"seconds": 30})
    assert await run(tools["pid"], {}) == pids[0]


async def test_close_ends_the_subprocess_and_is_safe_twice():
    src = McpSource("demo", stdio())
    tools = await opened(src)
    pid = int((await run(tools["pid"], {}))["text"])  # type: ignore[index]
    assert server_children() == [pid]
    await src.close()
    await src.close()
    assert server_children() == []
    with pytest.raises(RetryableToolError, match="closed"):
        await run(tools["pid"], {})


def test_the_config_keeps_secrets_out_of_its_repr_and_needs_one_transport():
    server = McpServerConfig(url="http://x/mcp", headers={"Authorization": "Bearer s3cret"})
    assert "s3cret" not in repr(server)
    assert server.redact("got Bearer s3cret back") == "got *** back"
    with pytest.raises(ValueError, match="give either url or command, not both"):
        McpServerConfig(url="http://x/mcp", command="srv")


@pytest.mark.parametrize("name", ["bad name", "", "s" * 41])
def test_a_source_refuses_a_bad_server_name_in_one_line(name):
    # The rule the file's reader applies (tools.mcp.config.server_name); never a bare
    # ValueError and a traceback.
    with pytest.raises(McpLoadError) as caught:
        McpSource(name, McpServerConfig(command="srv"))
    assert str(caught.value).startswith(f"tools.mcp.{name}: a server name is 1-40 letters")


def test_a_server_name_of_40_leaves_a_long_tool_8_characters_of_its_name():
    assert McpSource("s" * 40, McpServerConfig(command="srv")).name == "mcp:" + "s" * 40
    name = registered_name("s" * 40, "trigger-long-running-operation")
    assert len(name) == 64 and name.startswith(f"mcp__{'s' * 40}__trigger-_")
