"""What ``opsloop.yaml`` adds to a process: its tool sources and the policy it enforces.

``tool_sources`` turns the file's ``tools.mcp`` and ``tools.http`` into sources (one
:class:`McpSource` per server, one :class:`HttpActions` for every action);
``open_sources`` opens them and registers their tools, ``close_sources`` closes them, on
the event loop that opened them. ``policy_set`` is the :class:`PolicySet` a runner gets:
the file's rules over the effective approval defaults (the environment laid over the
file's ``approvals:``, as ``settings`` holds them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from engine.config import Settings
from engine.config_file import ConfigFile, HttpActionConfig, McpServerConfig
from engine.rules import Defaults, PolicySet
from tools.errors import ToolDefinitionError
from tools.http_actions import HttpAction, HttpActionLoadError, HttpActions
from tools.mcp import McpServer, McpSource
from tools.registry import ToolRegistry
from tools.sources import ToolSource

log = logging.getLogger("opsloop.sources")

HTTP_TIMEOUT_S = 30.0


def mcp_server(name: str, config: McpServerConfig) -> McpServer:
    return McpServer(
        name=name,
        url=config.url,
        headers=config.plain_headers(),
        command=config.command,
        args=tuple(config.args),
        env=config.plain_env(),
        tools=tuple(config.tools) if config.tools is not None else None,
    )


def http_action(name: str, config: HttpActionConfig) -> HttpAction:
    return HttpAction(
        name=name,
        description=config.description,
        method=config.method,
        url=config.url,
        arguments=config.arguments,
        headers=config.plain_headers(),
        body=config.body,
        idempotency_header=config.idempotency_header,
        timeout_s=config.timeout or HTTP_TIMEOUT_S,
    )


def tool_sources(config: ConfigFile | None) -> list[ToolSource]:
    """The sources the file names, MCP servers first; none without a file."""
    if config is None:
        return []
    sources: list[ToolSource] = [
        McpSource(mcp_server(name, server)) for name, server in config.tools.mcp.items()
    ]
    if config.tools.http:
        actions = [http_action(name, a) for name, a in config.tools.http.items()]
        sources.append(HttpActions(actions, config.tools.http_allow_hosts))
    return sources


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
                    raise HttpActionLoadError(source.name, str(exc)) from None  # one line
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
    defaults = Defaults(
        approvers=settings.approvers.approvers,
        allow_self=settings.approvers.allow_self,
        expires_in_s=settings.runner.approval_ttl_s,
    )
    if config is None:
        return PolicySet((), defaults, None)
    return PolicySet(tuple(config.policy), defaults, config.policy_hash)
