"""An MCP server's configured secrets never reach what is stored, shown or posted, and
logs mask secrets rather than every env value (issue 16 §5). A real SDK server
(tests/support/mcp_servers.py) that echoes its environment and request headers, as
server-everything's ``get-env`` does, configured through opsloop.yaml's own reader."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from bot.cli import secrets_of
from bot.doctor import scrub
from engine.config import load_settings
from engine.config_file import parse_config
from engine.models.scripted import call, say
from tests.support.approved import results, run_approved
from tests.tools.test_mcp import SCRIPT, HttpServer, run
from tools import Tool, ToolError
from tools.mcp import McpSource

pytestmark = pytest.mark.slow

TOKEN = "ghp-s3cret-token-value"
ENV = {"GH_TOKEN": TOKEN}


def stdio_config(extra_env: str = "") -> str:
    return f"""
tools:
  mcp:
    demo:
      command: {sys.executable}
      args: [{SCRIPT}, stdio]
      env: {{TOKEN: "${{GH_TOKEN}}", TZ_MODE: time{extra_env}}}
"""


async def opened(src: McpSource) -> dict[str, Tool]:
    return {t.source_name: t for t in await src.open()}


async def test_a_secret_the_server_echoes_is_redacted_in_text_structure_and_attachments():
    server = parse_config(stdio_config(), ENV).tools.mcp["demo"]
    src = McpSource("demo", server)
    try:
        tools = await opened(src)
        assert await run(tools["get_env"], {"name": "TOKEN"}) == {
            "text": "TOKEN=***",
            "structured": {"value": "***"},
            "attachments": [{"type": "resource_link", "uri": "env:///TOKEN?***", "name": "***"}],
        }
        # A value written in the file is no secret: shown as it is.
        assert (await run(tools["get_env"], {"name": "TZ_MODE"}))["text"] == "TZ_MODE=time"  # type: ignore[index]
        # An error result quoting the token.
        with pytest.raises(ToolError) as caught:
            await run(tools["fail"], {"message": f"token {TOKEN} expired"})
        assert str(caught.value) == "token *** expired"
    finally:
        await src.close()


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer(port=0)
    server.start()
    yield server
    server.stop()


async def test_a_header_the_server_quotes_is_redacted(http_server):
    text = f"""
tools:
  mcp:
    demo:
      url: {http_server.url}
      headers: {{Authorization: "Bearer ${{GH_TOKEN}}", X-Team: ops-platform}}
"""
    src = McpSource("demo", parse_config(text, ENV).tools.mcp["demo"])
    try:
        tools = await opened(src)
        for name in ("authorization", "x-team"):  # every header value is a secret
            with pytest.raises(ToolError) as caught:
                await run(tools["header"], {"name": name})
            assert str(caught.value) == "***"
    finally:
        await src.close()


async def test_what_is_stored_holds_no_secret(store):
    src = McpSource("demo", parse_config(stdio_config(), ENV).tools.mcp["demo"])
    try:
        get_env = (await opened(src))["get_env"]
        script = [call(get_env.name, name="TOKEN"), say("done")]
        events, model = await run_approved(store, [get_env], script)
        [result] = results(events)
        assert result.ok and result.output == {
            "text": "TOKEN=***",
            "structured": {"value": "***"},
            "attachments": [{"type": "resource_link", "uri": "env:///TOKEN?***", "name": "***"}],
        }
        stored = json.dumps([e.model_dump(mode="json") for e in events])
        assert TOKEN not in stored and TOKEN not in model.last_prompt_text()
    finally:
        await src.close()


def test_logs_mask_the_secrets_not_every_env_value():
    config = parse_config(stdio_config(extra_env=", KUBE_CONTEXT: prod-eu"), ENV)
    secrets = secrets_of(load_settings({}), config)
    assert TOKEN in secrets
    assert "time" not in secrets and "prod-eu" not in secrets
    # doctor's line for a server keyed `time` (its env has TZ_MODE: time) stays readable.
    assert scrub("mcp time  reachable (stdio)", secrets) == "mcp time  reachable (stdio)"
    assert scrub(f"token {TOKEN}", secrets) == "token ***"


def test_a_value_put_in_by_a_variable_is_a_secret_wherever_it_is():
    text = """
tools:
  mcp:
    kube:
      command: kubectl-mcp
      args: ["--token=${GH_TOKEN}", --read-only]
      env: {KUBECONFIG: /etc/kube/config}
"""
    server = parse_config(text, ENV).tools.mcp["kube"]
    assert server.secrets() == [TOKEN]
    assert server.redact(f"exec kubectl-mcp --token={TOKEN}") == "exec kubectl-mcp --token=***"
    assert server.redact("KUBECONFIG=/etc/kube/config") == "KUBECONFIG=/etc/kube/config"
