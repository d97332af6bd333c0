"""What ``opsloop.yaml`` adds to a process: its tool sources and the policy it enforces.

``load_tools_of`` is what every command that runs tools loads, short of connecting:
the tool modules (imported, configured) and the sources of the file's ``tools.mcp`` and
``tools.http`` (one :class:`McpSource` per server, one :class:`HttpActions` for every
action), built from the file's models as they are. ``open_sources`` opens them and
registers their tools, ``close_sources`` closes them, on the event loop that opened
them. ``open_serving`` is how ``serve`` opens them: all at once, and an MCP server that
cannot start is served without (one warning line) and kept trying in the background.
``check_loading`` is ``opsloop config check``: the same loading, and the sources that
open without connecting opened and closed again. ``policy_set`` is the
:class:`PolicySet` a runner gets: the file's rules over the effective approval defaults
(the environment laid over the file's ``approvals:``, as ``settings`` holds them).
``open_each`` opens what opens and names what does not (``opsloop replay``), and
``unmatched_rules`` finds the rules whose glob matches no loaded tool (``config check``,
``tools`` and ``doctor`` warn of them).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.config import Settings
from engine.config_file import ConfigFile, PolicyRule
from engine.rules import Defaults, PolicySet, matches
from tools import REGISTRY, ToolLoadError, load_tools
from tools.errors import ToolDefinitionError
from tools.http_actions import HttpActionLoadError, HttpActions
from tools.integrations.github import GitHubSource
from tools.integrations.pagerduty import PagerDutySource
from tools.loader import close_tools
from tools.mcp import McpSource
from tools.mcp.config import registered_name
from tools.registry import ToolRegistry
from tools.sources import ToolSource

log = logging.getLogger("opsloop.sources")


def tool_sources(config: ConfigFile | None) -> list[ToolSource]:
    """The sources the file names, MCP servers first; none without a file."""
    if config is None:
        return []
    sources: list[ToolSource] = [
        McpSource(name, server) for name, server in config.tools.mcp.items()
    ]
    if config.tools.http:
        sources.append(HttpActions(config.tools.http, config.tools.http_allow_hosts))
    if config.integrations.github is not None:
        sources.append(GitHubSource(config.integrations.github))
    if config.integrations.pagerduty is not None:
        sources.append(PagerDutySource(config.integrations.pagerduty))
    return sources


@dataclass(frozen=True)
class LoadedTools:
    """What a process loads for its tools before it connects anything."""

    modules: list[str]  # imported, in order (``close_tools`` takes them at shutdown)
    tools: ToolRegistry  # the modules' tools; the sources' join them when opened
    sources: list[ToolSource]


def load_tools_of(settings: Settings, config: ConfigFile | None) -> LoadedTools:
    """Import and configure the tool modules and build the file's sources: what
    ``serve``, ``opsloop tools`` and ``config check`` all load. ``ToolLoadError``
    (one line) for a module that cannot be imported."""
    modules = load_tools(settings.tool.modules, settings=settings.tool)
    return LoadedTools(modules, REGISTRY.copy(), tool_sources(config))


async def check_loading(settings: Settings, config: ConfigFile | None) -> LoadedTools:
    """``opsloop config check``: what ``serve`` loads, short of connecting to MCP
    servers. The modules are imported and the HTTP actions registered beside their
    tools (a name taken twice is refused here as at startup), then closed again."""
    loaded = load_tools_of(settings, config)
    offline = [s for s in loaded.sources if not isinstance(s, McpSource)]
    try:
        await open_sources(offline, loaded.tools)
    finally:
        await close_sources(offline)
        await close_tools(loaded.modules)
    return loaded


async def open_sources(sources: Sequence[ToolSource], registry: ToolRegistry) -> None:
    """Open each source and register its tools in ``registry``. A source that cannot
    start (or a tool name taken twice) is one ``ToolLoadError``; the sources opened
    so far are closed again."""
    opened: list[ToolSource] = []
    try:
        for source in sources:
            opened.append(source)
            for tool in await source.open():
                try:
                    registry.register(tool)
                except ToolDefinitionError as exc:
                    raise HttpActionLoadError(source.key, str(exc)) from None  # one line
    except BaseException:
        await close_sources(opened)
        raise


async def open_serving(sources: Sequence[ToolSource], registry: ToolRegistry) -> None:
    """``serve``: open every source at once and register its tools. An MCP server that
    cannot start does not stop startup: it is one warning line, its tools are not
    offered, and it is kept trying in the background (``McpSource.serve``). Every other
    source that cannot start is one ``ToolLoadError``, and what was opened is closed."""
    servers = [s for s in sources if isinstance(s, McpSource)]
    others = [s for s in sources if not isinstance(s, McpSource)]
    try:
        # Each server's connect is bounded by its own connect time, and never raises; all
        # of them finish before a failure of another source is raised (and all closed).
        opened = await asyncio.gather(
            open_sources(others, registry), *(s.connect() for s in servers), return_exceptions=True
        )
        for result in opened:
            if isinstance(result, BaseException):
                raise result
        for server in servers:  # in the file's order: a name two of them give goes to the first
            server.serve(registry)
    except BaseException:
        await close_sources(sources)
        raise


def mcp_servers(sources: Iterable[ToolSource]) -> list[McpSource]:
    """The MCP servers among ``sources`` (what ``/metrics`` and ``GET /tools`` report)."""
    return [s for s in sources if isinstance(s, McpSource)]


async def open_each(sources: Sequence[ToolSource], registry: ToolRegistry) -> list[str]:
    """Open every source that opens and register its tools; one line for each that
    cannot (its tools are then not loaded here). ``opsloop replay``: one server that is
    down says which decisions cannot be checked, instead of stopping the rest."""
    failed = []
    for source in sources:
        try:
            await open_sources([source], registry)
        except ToolLoadError as exc:
            failed.append(str(exc))
    return failed


def may_provide(source: ToolSource, names: Iterable[str]) -> bool:
    """Could ``source`` register one of ``names``? (Which sources a replay must open.)"""
    wanted = set(names)
    if isinstance(source, McpSource):
        prefix = f"mcp__{source.server_name}__"
        return any(n.startswith(prefix) for n in wanted)
    if isinstance(source, HttpActions):
        return not wanted.isdisjoint(source.actions)
    return True


async def close_sources(sources: Iterable[ToolSource]) -> None:
    """Close every source; one that fails is logged and the others still close."""
    for source in sources:
        try:
            await source.close()
        except Exception:
            log.warning("closing the tool source %s failed", source.name, exc_info=True)


# --- rules that match nothing -------------------------------------------------------------


@dataclass(frozen=True)
class UnmatchedRule:
    """A rule whose ``tool`` glob matches no tool the process loads: it decides nothing
    (a ``reject`` of a misspelt name guards nothing)."""

    index: int  # 0-based, as in ``policy[i]``
    rule: PolicyRule

    def line(self, name: str = "") -> str:
        where = f"{name}: " if name else ""
        return (
            f"{where}policy[{self.index}].tool (rule {self.index + 1}): {self.rule.tool!r} "
            f"matches no tool, so this {self.rule.policy} rule decides nothing"
        )


_WILDCARD = re.compile(r"[*?\[]")


def _may_match_server(glob: str, server: str) -> bool:
    """Could ``glob`` match a tool of the MCP server ``server`` whose tools are not known?
    (Its literal start and ``mcp__<server>__`` agree as far as both go.)"""
    literal = glob[: m.start()] if (m := _WILDCARD.search(glob)) else glob
    prefix = f"mcp__{server}__"
    return literal.startswith(prefix) or prefix.startswith(literal)


def unmatched_rules(
    rules: Sequence[PolicyRule], names: Iterable[str], unknown_servers: Iterable[str] = ()
) -> list[UnmatchedRule]:
    """The rules whose glob matches none of ``names`` (the tools loaded). A rule that may
    match a tool of an MCP server in ``unknown_servers`` (not connected, or with no
    ``tools`` allowlist, so its tools are not known here) is not counted."""
    known, servers = list(names), list(unknown_servers)
    return [
        UnmatchedRule(index, rule)
        for index, rule in enumerate(rules)
        if not any(matches(rule, n) for n in known)
        and not any(_may_match_server(rule.tool, s) for s in servers)
    ]


def known_without_connecting(config: ConfigFile) -> tuple[list[str], list[str]]:
    """What ``config`` says of its MCP servers' tools without connecting: the names an
    allowlist gives (``mcp__<server>__<tool>``), and the servers without one."""
    names, unknown = [], []
    for key, server in config.tools.mcp.items():
        if server.tools:
            names += [registered_name(key, t) for t in server.tools]
        else:
            unknown.append(key)
    return names, unknown


def policy_set(settings: Settings, config: ConfigFile | None) -> PolicySet:
    """The rules of ``config`` (none without one) over the effective defaults."""
    defaults = Defaults(settings.reviewers, settings.runner.approval_ttl_s)
    if config is None:
        return PolicySet((), defaults, None)
    return PolicySet(tuple(config.policy), defaults, config.policy_hash)
