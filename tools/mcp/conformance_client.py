"""opsloop's MCP client as the MCP conformance suite's client under test.

``npx @modelcontextprotocol/conformance client --command "python -m
tools.mcp.conformance_client" --scenario <name>`` starts a scenario's server and runs
this with its URL as the last argument, the scenario in ``MCP_CONFORMANCE_SCENARIO``
and what the scenario gives a client (pre-registered credentials) in
``MCP_CONFORMANCE_CONTEXT``. Everything runs through opsloop's own code, as ``serve``
runs it: :class:`~tools.mcp.source.McpSource` (its connection, transports, OAuth and
elicitation), configured as a team would configure the server in opsloop.yaml.

What a person does in serve is done here by rule: the admin who opens the
authorization link (the scenario's authorization server approves at once; its redirect
is handed on as serve's ``GET /oauth/callback`` hands it on), and the requester who
answers a question in the middle of a call (accepting the schema's defaults,
``tools.mcp.elicitation.fill_defaults``). Each tool is called with arguments made from
its schema. Exit status 1 (one line on stderr) when the client fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2

from tools.context import ToolContext, WaitAnswer
from tools.errors import ToolError
from tools.mcp.auth import MemoryRecords, pending_link
from tools.mcp.config import McpServerConfig
from tools.mcp.elicitation import fill_defaults, question_of
from tools.mcp.errors import McpNotAuthorized
from tools.mcp.source import McpSource
from tools.registry import Tool
from tools.wait import WaitFor

NAME = "conformance"
# Where the authorization server sends the admin back: never reached (the redirect is
# read, as the browser would follow it to serve's callback).
REDIRECT_URL = "http://127.0.0.1:3000/oauth/callback"
# The client id document the CIMD scenario expects.
CIMD_URL = "https://conformance-test.local/client-metadata.json"
_TRIES = 3  # authorizations in a row (a step-up asks a second one)
_ROUNDS = 5  # questions one call may ask


def auth_for(scenario: str, context: dict[str, Any]) -> dict[str, Any] | None:
    """The ``auth:`` a team would write for the scenario's server."""
    if not scenario.startswith("auth/"):
        return None
    client = {k: context[k] for k in ("client_id", "client_secret") if context.get(k)}
    if scenario.startswith("auth/client-credentials"):
        if context.get("private_key_pem"):
            client["private_key"] = context["private_key_pem"]
            client["signing_algorithm"] = context.get("signing_algorithm", "RS256")
        return {"type": "client_credentials", **client}
    auth: dict[str, Any] = {"type": "authorization_code", "redirect_url": REDIRECT_URL, **client}
    if scenario == "auth/basic-cimd":
        auth["client_metadata_url"] = CIMD_URL
    return auth


def arguments_for(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments a tool's schema takes: a small number, a word, true."""
    made: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        made[name] = {"integer": 1, "number": 1, "boolean": True}.get(str(kind), "test")
    return made


async def admin_authorizes(records: MemoryRecords, link: str) -> None:
    """The admin opens ``link``; the authorization server's redirect (to serve's
    ``GET /oauth/callback``) brings the code to the waiting authorization."""
    async with httpx2.AsyncClient() as browser:
        approved = await browser.get(link)
    location = approved.headers.get("location")
    if approved.status_code not in (301, 302, 303, 307, 308) or not location:
        raise ToolError(f"the authorization server answered {approved.status_code}, no redirect")
    query = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
    if "code" not in query or "state" not in query:
        raise ToolError(f"the authorization was refused: {query.get('error', 'no code')}")
    now = datetime.now(UTC)
    if (
        await records.answer_mcp_pending(query["state"], query["code"], query.get("iss"), now)
        is None
    ):
        raise ToolError("no authorization waits for the answer")


class Client:
    """One scenario's server, as one ``tools.mcp`` entry of opsloop.yaml."""

    def __init__(self, url: str, scenario: str, context: dict[str, Any]) -> None:
        auth = auth_for(scenario, context)
        self.server = McpServerConfig.model_validate(
            {"url": url, **({"auth": auth} if auth else {})}
        )
        self.records = MemoryRecords()
        self.source = McpSource(NAME, self.server, oauth=self.records)

    async def authorized(self, work: Any) -> Any:
        """``await work()``, after an admin's authorization whenever it asks for one."""
        for _ in range(_TRIES):
            try:
                return await work()
            except McpNotAuthorized:
                link = await pending_link(self.records, NAME, self.server)
                if link is None:
                    raise
                await admin_authorizes(self.records, link)
        return await work()

    async def tools(self) -> list[Tool]:
        await self.authorized(self.source.refresh)  # as serve's keeper lists them
        return self.source.offered

    async def call(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        """Run ``tool`` as the engine runs a call: a question it asks is answered with
        its schema's defaults, and the call goes on."""
        ctx = ToolContext("conformance", tool.name, f"conformance:{tool.name}", 1)
        for _ in range(_ROUNDS):
            out = await self.authorized(partial(tool.run, tool.parse_arguments(arguments), ctx))
            asked = question_of(out.data) if isinstance(out, WaitFor) else None
            if asked is None:
                return out
            answer = {"action": "accept", "content": fill_defaults(asked.schema, {})}
            ctx = replace(ctx, answer=WaitAnswer(data=out.data, result=answer))
        raise ToolError(f"{tool.name} asked more than {_ROUNDS} questions")

    async def run(self, scenario: str) -> None:
        tools = await self.tools()
        if scenario == "initialize":
            return
        for tool in tools:
            try:
                out = await self.call(tool, arguments_for(tool.input_schema()))
                print(f"{tool.source_name}: {json.dumps(out, default=str)[:500]}", file=sys.stderr)
            except ToolError as exc:  # a tool meant to fail fails; the suite judges
                print(f"{tool.source_name}: {exc}", file=sys.stderr)

    async def close(self) -> None:
        await self.source.close()


async def main(url: str) -> int:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    client = Client(url, scenario, context)
    try:
        await client.run(scenario)
    except ToolError as exc:
        print(f"conformance client: {exc}", file=sys.stderr)
        return 1
    finally:
        await client.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tools.mcp.conformance_client <server url>")
    sys.exit(asyncio.run(main(sys.argv[-1])))
