"""What ``opsloop.yaml`` adds to a process: its tool sources and the policy it enforces.

``load_tools_of`` is what every command that runs tools loads, short of connecting:
the tool modules (imported, configured) and the sources of the file's ``tools.mcp`` and
``tools.http`` (one :class:`McpSource` per server, one :class:`HttpActions` for every
action), built from the file's models as they are. ``open_sources`` opens them and
registers their tools, ``close_sources`` closes them, on the event loop that opened
them. ``check_loading`` is ``opsloop config check``: the same loading, and the sources
that open without connecting opened and closed again. ``policy_set`` is the
:class:`PolicySet` a runner gets: the file's rules over the effective approval defaults
(the environment laid over the file's ``approvals:``, as ``settings`` holds them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.config import Settings
from engine.config_file import ConfigFile
from engine.rules import Defaults, PolicySet
from tools import REGISTRY, load_tools
from tools.errors import ToolDefinitionError
from tools.http_actions import HttpActionLoadError, HttpActions
from tools.loader import close_tools
from tools.mcp import McpSource
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


async def close_sources(sources: Iterable[ToolSource]) -> None:
    """Close every source; one that fails is logged and the others still close."""
    for source in sources:
        try:
            await source.close()
        except Exception:
            log.warning("closing the tool source %s failed", source.name, exc_info=True)


def policy_set(settings: Settings, config: ConfigFile | None) -> PolicySet:
    """The rules of ``config`` (none without one) over the effective defaults."""
    defaults = Defaults(settings.reviewers, settings.runner.approval_ttl_s)
    if config is None:
        return PolicySet((), defaults, None)
    return PolicySet(tuple(config.policy), defaults, config.policy_hash)
