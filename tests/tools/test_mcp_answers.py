"""An MCP server's error answer is a refusal, not a lost connection; a streamable-HTTP
session the server forgot is replaced (issue 16 §2, §4). Real SDK servers
(tests/support/mcp_servers.py) over stdio and streamable HTTP, in both eras of the
protocol: the 2026 one has no sessions, the handshake-era one (``--legacy``, as
server-everything and TypeScript SDK servers speak it) has."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import pytest

from tests.tools.test_mcp import HttpServer, run, stdio
from tools import Tool, ToolError
from tools.mcp import McpServerConfig, McpSource
from tools.mcp.connection import _MAX_NOTED, _AnswerNotingBody, _Request

pytestmark = pytest.mark.slow

TRANSPORTS = ["stdio", "http", "http-legacy"]


@pytest.fixture(params=TRANSPORTS)
async def demo(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Tool]]:
    """The demo server's tools, over each transport."""
    server: HttpServer | None = None
    if request.param == "stdio":
        config = stdio()
    else:
        server = HttpServer(port=0, flags=("--legacy",) if request.param == "http-legacy" else ())
        server.start()
        config = McpServerConfig(url=server.url)
    src = McpSource("demo", config)
    try:
        yield {t.name.removeprefix("mcp__demo__"): t for t in await src.open()}
    finally:
        await src.close()
        if server is not None:
            server.stop()


async def holding(tools: dict[str, Tool], count: int) -> None:
    """Wait until the server has ``count`` calls of ``hold`` waiting."""
    for _ in range(3000):  # the bound only stops a hung test
        if (await run(tools["holding"], {}))["text"] == str(count):  # type: ignore[index]
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"hold never had {count} calls waiting")


@pytest.mark.parametrize(
    "code, message",
    [
        (-32000, "Bad Request: Server not initialized"),  # the TypeScript SDK's examples
        (-32001, "Request timed out on the backend"),
        (-32602, "Unknown argument"),
    ],
)
async def test_an_error_answer_is_a_refusal_and_the_calls_in_flight_go_on(demo, code, message):
    first_pid = await run(demo["pid"], {})
    held = asyncio.create_task(run(demo["hold"], {}))
    await holding(demo, 1)
    with pytest.raises(ToolError) as caught:
        await run(demo["refuse"], {"code": code, "message": message})
    # The server answered: nothing was lost, so neither "unknown" nor worth a retry.
    assert type(caught.value) is ToolError
    assert str(caught.value) == f"MCP server 'demo' refused the request: {message}"
    # The call in flight on the same session was not touched, nor the session.
    assert not held.done()
    await run(demo["release"], {})
    assert await held == {"text": "released"}
    assert await run(demo["pid"], {}) == first_pid


@pytest.mark.parametrize(
    "flags", [("--legacy",), ("--legacy", "--session-400")], ids=["404", "400-32000"]
)
async def test_a_session_the_restarted_server_forgot_is_replaced_before_the_call(flags):
    server = HttpServer(port=0, flags=flags)
    server.start()
    src = McpSource("demo", McpServerConfig(url=server.url))
    try:
        tools = {t.name.removeprefix("mcp__demo__"): t for t in await src.open()}
        assert await run(tools["bump"], {}) == {"text": "1"}
        # Restarted while opsloop idles: the old session id is unknown to the new process
        # (the Python SDK answers 404; the TypeScript SDK's README handler 400, -32000).
        server.stop()
        server.start()  # same port
        # The definition check meets the old session, drops it and lists again on a new
        # one; then the call runs, once.
        assert await run(tools["bump"], {}) == {"text": "1"}
        assert await run(tools["bump"], {}) == {"text": "2"}
    finally:
        await src.close()
        server.stop()


class Body:
    """A response body in chunks, as httpx hands it on."""

    def __init__(self, data: bytes, size: int) -> None:
        self.chunks = [data[i : i + size] for i in range(0, len(data), size)]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        pass


ERROR = json.dumps({"jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "message": "no"}})


@pytest.mark.parametrize(
    ("body", "sse", "encoding", "noted"),
    [
        (f"event: message\r\nid: 1\r\ndata: {ERROR}\r\n\r\n".encode(), True, "identity", True),
        (f"data: {'x' * _MAX_NOTED}\n\ndata: {ERROR}\n\n".encode(), True, "identity", True),
        (f"data: {ERROR}".encode(), True, "identity", False),  # the stream ended mid-event
        (gzip.compress(ERROR.encode(), mtime=0), False, "gzip", True),
        (ERROR.encode(), False, "br", False),  # unread: counted as the SDK's own, not an answer
    ],
    ids=["sse", "sse-after-a-long-event", "sse-cut", "gzip-json", "brotli"],
)
async def test_the_errors_a_server_wrote_in_a_body_are_noted_as_it_passes(
    body, sse, encoding, noted
):
    req = _Request(op=run, future=asyncio.get_running_loop().create_future())
    watched = _AnswerNotingBody(Body(body, 7), req, sse=sse, encoding=encoding)
    assert b"".join([chunk async for chunk in watched]) == body  # passed on unchanged
    assert req.answers == ({(-32000, "no")} if noted else set())
