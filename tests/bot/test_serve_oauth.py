"""An MCP server behind OAuth as `opsloop serve` runs it (issue 16 §10): it starts
without the server while an admin has yet to authorize opsloop, keeps the link in its
database, and takes the authorization server's redirect on ``GET /oauth/callback``,
after which the server's tools are offered at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx2
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bot.runtime import start_runtime, web_app
from engine.config_file import parse_config
from tests.bot.test_cli import _free_port
from tests.bot.test_runtime import settings_for
from tests.fakes.slack import SIGNING_SECRET, TOKEN
from tests.support.oauth_servers import PRE_ID, PRE_SECRET
from tests.tools.test_mcp_oauth import start
from tools.mcp import keeper

pytestmark = pytest.mark.slow


async def _never(delay: float) -> None:
    await asyncio.get_running_loop().create_future()


async def test_serve_waits_for_the_admin_then_takes_the_callback_and_offers_the_tools(
    db_url, fakes, tmp_path: Path, caplog, monkeypatch
) -> None:
    # The keeper's backoff never ends here: only the callback brings the server up.
    monkeypatch.setattr(keeper, "sleep", _never)
    oauth = start()
    port = _free_port()
    config = parse_config(
        f"""
tools:
  mcp:
    tickets:
      url: {oauth.url}
      auth:
        type: authorization_code
        redirect_url: http://127.0.0.1:{port}/oauth/callback
        client_id: {PRE_ID}
        client_secret: ${{TICKETS_SECRET}}
""",
        {"TICKETS_SECRET": PRE_SECRET},
    )
    settings = settings_for(db_url, fakes, tmp_path)
    try:
        rt = await start_runtime(
            settings, token=TOKEN, signing_secret=SIGNING_SECRET, config=config
        )
        try:
            [server] = rt.mcp_servers
            assert not server.up and "mcp__tickets__ping" not in rt.tools.names()
            assert "not authorized: an admin must authorize opsloop first" in server.down_reason
            row = await rt.store.select_mcp_oauth("tickets")
            assert row is not None and row.pending_url is not None
            async with TestClient(TestServer(web_app(rt), port=port)) as client:
                assert (await client.get("/healthz")).status == 200  # about the database
                junk = await client.get("/oauth/callback?state=made-up&code=x")
                assert junk.status == 400
                async with httpx2.AsyncClient() as browser:  # the admin opens the link
                    approved = await browser.get(row.pending_url)
                    back = await browser.get(approved.headers["location"])
                assert back.status_code == 200
                deadline = time.monotonic() + 30
                while "mcp__tickets__ping" not in rt.tools.names():
                    assert time.monotonic() < deadline, server.down_reason
                    await asyncio.sleep(0.05)
                assert server.up
            stored = await rt.store.select_mcp_oauth("tickets")
            assert stored is not None and stored.tokens is not None
            assert stored.pending_url is None
        finally:
            await rt.close(5)
    finally:
        oauth.proc.kill()
        oauth.proc.wait()
    assert PRE_SECRET not in caplog.text
    assert "Traceback" not in caplog.text
