"""MCP servers as tool sources (the official ``mcp`` SDK, v2): ``tools.mcp`` of opsloop.yaml."""

from __future__ import annotations

from tools.mcp.config import McpServer
from tools.mcp.errors import DefinitionChanged, McpLoadError, McpUnavailable
from tools.mcp.source import McpSource, current_definitions, definition_hash

__all__ = [
    "DefinitionChanged",
    "McpLoadError",
    "McpServer",
    "McpSource",
    "McpUnavailable",
    "current_definitions",
    "definition_hash",
]
