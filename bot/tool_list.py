"""``opsloop tools``: every tool a process would load, where it comes from, the policy it
gets by default, whether it is idempotent, and whether its MCP definition drifted.

The tools are the ones ``opsloop serve`` would load: the modules, then the sources of
the configuration file, opened and closed again here. "By default" is the decision of
the first rule without ``when`` that matches the tool's name (a conditional rule needs
arguments to decide), else the tool's own policy (``approve_before_run`` for MCP tools
and HTTP actions). ``drift``: an MCP server defines the tool differently now than when
it was loaded (or no longer lists it); tools of other sources never drift.
``server_tool``: an MCP tool's own name when its registered name is not simply
``mcp__<server>__<tool>`` (a ``.`` or ``/`` mapped to ``_``, a long name cut with a hash):
the name the server is called by.

``opsloop tools`` starts a process of its own, so its ``drift`` compares two listings of
its own. What a *running* bot offers is its ``GET /tools`` (``serving_tools``): the
tools in its registry now, each server up or down, and ``drift`` true for a tool the
server redefined while the bot ran (calls requested under the old definition were
refused; the model has been offered the new one since). Asking lists each server that
is up first, so a change the server made without saying so is found (and taken) then.
``opsloop tools --from-server URL`` prints that answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bot.configured import close_sources, load_tools_of, open_sources, policy_set
from bot.mcp_oauth import stored_oauth
from engine.config import Settings
from engine.config_file import ConfigFile
from engine.rules import PolicySet, matches
from tools import Tool, ToolError, ToolRegistry
from tools.loader import close_tools
from tools.mcp import McpLoadError, McpSource, current_definitions

ASK_TIMEOUT_S = 10.0  # GET /tools: how long one server's listing may take


@dataclass(frozen=True)
class ToolRecord:
    name: str
    source: str
    policy: str
    idempotent: bool
    drift: bool
    rule: int | None = None  # the rule that gives the default policy (None: the tool's own)
    server_tool: str | None = None  # the MCP server's own name for it, when mapped

    @property
    def shown_source(self) -> str:
        """``mcp:grafana (get.status)`` for a mapped name: what calls it there."""
        return self.source if self.server_tool is None else f"{self.source} ({self.server_tool})"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "policy": self.policy,
            "idempotent": self.idempotent,
            "drift": self.drift,
        }
        if self.server_tool is not None:
            out["server_tool"] = self.server_tool
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolRecord:
        """A record of ``GET /tools`` (``as_json`` and its ``rule``)."""
        return cls(
            name=str(data["name"]),
            source=str(data["source"]),
            policy=str(data["policy"]),
            idempotent=bool(data["idempotent"]),
            drift=bool(data["drift"]),
            rule=data.get("rule") if isinstance(data.get("rule"), int) else None,
            server_tool=data.get("server_tool"),
        )


def default_record(tool: Tool, policy: PolicySet, live: dict[str, str] | None) -> ToolRecord:
    """``tool`` as ``opsloop tools`` shows it; ``live``: its server's definitions now
    (None: not an MCP tool)."""
    index = next(
        (i for i, r in enumerate(policy.rules) if r.when is None and matches(r, tool.name)),
        None,
    )
    # Listing has no channel: a rule's channels say where, not what, so leave them out.
    rules = () if index is None else (policy.rules[index].model_copy(update={"channels": None}),)
    decision = PolicySet(rules, policy.defaults).decide(tool, {}, None)
    idempotent = tool.idempotent if decision.idempotent is None else decision.idempotent
    drift = live is not None and live.get(tool.name) != tool.definition_hash
    server = tool.source.removeprefix("mcp:")
    mapped = tool.source_name and tool.name != f"mcp__{server}__{tool.source_name}"
    return ToolRecord(
        tool.name,
        tool.source,
        decision.policy,
        idempotent,
        drift,
        index,
        server_tool=tool.source_name if mapped else None,
    )


async def list_tools(settings: Settings, config: ConfigFile | None) -> list[ToolRecord]:
    """Load every tool as ``serve`` would, describe each, close what was opened."""
    loaded = load_tools_of(settings, config)
    registry, sources, modules = loaded.tools, loaded.sources, loaded.modules
    policy = policy_set(settings, config)
    servers = [s for s in sources if isinstance(s, McpSource)]
    try:
        async with stored_oauth(settings.database_url, servers):  # serve's tokens, read
            await open_sources(sources, registry)
            live: dict[str, dict[str, str]] = {}
            for source in servers:
                try:
                    live[source.name] = await current_definitions(source)
                except ToolError as exc:
                    raise McpLoadError(
                        source.server_name, f"{source.name}: cannot list its tools again: {exc}"
                    ) from None
        return [default_record(t, policy, live.get(t.source)) for t in registry]
    finally:
        await close_sources(sources)
        await close_tools(modules)


async def serving_tools(
    registry: ToolRegistry, policy: PolicySet, servers: Sequence[McpSource]
) -> dict[str, Any]:
    """``GET /tools`` of a serving process (run on the loop its sources belong to): each
    server that is up lists its tools first (a change found is taken, as the pre-call
    check takes it), then every tool of ``registry`` as ``opsloop tools --json`` shows
    one, plus its ``rule``; and each server, up or down."""

    async def ask(server: McpSource) -> None:
        if server.up:
            try:
                async with asyncio.timeout(ASK_TIMEOUT_S):
                    await server.refresh()
            except (ToolError, TimeoutError):
                pass  # it is down now, and shown so

    await asyncio.gather(*(ask(s) for s in servers))
    redefined = {name for s in servers for name in s.redefined()}
    records = []
    for tool in registry:
        record = default_record(tool, policy, None)
        drift = tool.name in redefined
        records.append({**record.as_json(), "drift": drift, "rule": record.rule})
    return {
        "tools": records,
        "servers": [
            {
                "server": s.server_name,
                "up": s.up,
                "tools": len(s.offered),
                "redefined": s.redefined(),
                **({} if s.up else {"reason": s.down_reason}),
            }
            for s in servers
        ],
    }
