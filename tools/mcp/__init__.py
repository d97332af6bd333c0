"""MCP servers as tool sources (the official ``mcp`` SDK, v2): ``tools.mcp`` of opsloop.yaml.

The configuration model loads at once; the source (and with it the MCP SDK) only when
it is first asked for, so reading opsloop.yaml does not import the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig, server_name
from tools.mcp.errors import DefinitionChanged, McpLoadError, McpUnavailable

if TYPE_CHECKING:
    from tools.mcp.source import McpSource, current_definitions, definition_hash

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DefinitionChanged",
    "McpLoadError",
    "McpServerConfig",
    "McpSource",
    "McpUnavailable",
    "current_definitions",
    "definition_hash",
    "server_name",
]
_FROM_SOURCE = ("McpSource", "current_definitions", "definition_hash")


def __getattr__(name: str) -> Any:
    if name in _FROM_SOURCE:
        from tools.mcp import source

        return getattr(source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
