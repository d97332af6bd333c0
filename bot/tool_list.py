"""``opsloop tools``: every tool a process would load, where it comes from, the policy it
gets by default, whether it is idempotent, and whether its MCP definition drifted.

The tools are the ones ``opsloop serve`` would load: the modules, then the sources of
the configuration file, opened and closed again here. "By default" is the decision of
the first rule without ``when`` that matches the tool's name (a conditional rule needs
arguments to decide), else the tool's own policy (``approve_before_run`` for MCP tools
and HTTP actions). ``drift``: an MCP server defines the tool differently now than when
it was loaded (or no longer lists it); tools of other sources never drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.configured import close_sources, load_tools_of, open_sources, policy_set
from engine.config import Settings
from engine.config_file import ConfigFile
from engine.rules import PolicySet, matches
from tools import Tool, ToolError
from tools.loader import close_tools
from tools.mcp import McpLoadError, McpSource, current_definitions


@dataclass(frozen=True)
class ToolRecord:
    name: str
    source: str
    policy: str
    idempotent: bool
    drift: bool
    rule: int | None = None  # the rule that gives the default policy (None: the tool's own)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "policy": self.policy,
            "idempotent": self.idempotent,
            "drift": self.drift,
        }


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
    return ToolRecord(tool.name, tool.source, decision.policy, idempotent, drift, index)


async def list_tools(settings: Settings, config: ConfigFile | None) -> list[ToolRecord]:
    """Load every tool as ``serve`` would, describe each, close what was opened."""
    loaded = load_tools_of(settings, config)
    registry, sources, modules = loaded.tools, loaded.sources, loaded.modules
    policy = policy_set(settings, config)
    try:
        await open_sources(sources, registry)
        live: dict[str, dict[str, str]] = {}
        for source in sources:
            if isinstance(source, McpSource):
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
