"""A 401 from an HTTP MCP server is reported as what it is (issue 16 §10, the message;
no OAuth yet): "401: this server needs authorization (WWW-Authenticate: …)" in the load
error, in ``doctor`` and in a call's error, never "unreachable"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from bot.doctor import CheckFailed, check_mcp
from tests.support.mcp_servers import CHALLENGE
from tests.tools.test_mcp import HttpServer, run
from tools.mcp import McpLoadError, McpServerConfig, McpSource
from tools.mcp.errors import McpUnauthorized

pytestmark = pytest.mark.slow

BEARER = 'Bearer resource_metadata="https://mcp.example/.well-known/oauth-protected-resource"'
NEEDS = f"401: this server needs authorization (WWW-Authenticate: {BEARER})"


@pytest.fixture
async def guarded() -> AsyncIterator[McpServerConfig]:
    """An HTTP endpoint answering every request 401 with a WWW-Authenticate challenge."""

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=401, headers={"WWW-Authenticate": BEARER})

    app = web.Application()
    app.router.add_route("*", "/mcp", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield McpServerConfig(url=f"http://127.0.0.1:{port}/mcp")
    await runner.cleanup()


async def test_a_401_at_load_says_the_server_needs_authorization(guarded):
    src = McpSource("guarded", guarded)
    with pytest.raises(McpLoadError) as caught:
        await src.open()
    assert str(caught.value) == f"MCP server 'guarded' answered {NEEDS}"
    assert "unreachable" not in str(caught.value)


async def test_doctor_says_the_server_needs_authorization(guarded):
    with pytest.raises(CheckFailed) as caught:
        await check_mcp("guarded", guarded)
    assert str(caught.value) == f"MCP server 'guarded' answered {NEEDS}"


@pytest.mark.parametrize("legacy", [False, True], ids=["2026", "handshake-era"])
async def test_a_call_refused_with_401_says_so_and_was_not_run(tmp_path: Path, legacy: bool):
    gate = tmp_path / "refuse"
    flags = ("--401-if", str(gate), *(("--legacy",) if legacy else ()))
    server = HttpServer(port=0, flags=flags)
    server.start()
    src = McpSource("demo", McpServerConfig(url=server.url))
    try:
        tools = {t.source_name: t for t in await src.open()}
        gate.touch()  # the server stops accepting us (a revoked token, say)
        with pytest.raises(McpUnauthorized) as caught:  # retryable, not an unknown outcome
            await run(tools["bump"], {})
        assert str(caught.value) == (
            f"MCP server 'demo': 401: this server needs authorization "
            f"(WWW-Authenticate: {CHALLENGE})"
        )
        assert src.down_reason == str(caught.value)
        gate.unlink()  # accepted again: the next call reconnects and runs
        assert await run(tools["bump"], {}) == {"text": "1"}
    finally:
        await src.close()
        server.stop()
