"""Where tools come from besides ``@tool`` modules: MCP servers and HTTP actions.

A source is opened once at startup (connect, discover, build :class:`Tool` objects) and
closed once at shutdown; the process that opened it owns its connections. Sources
declare their own shutdown, so the runtime keeps no table of what to close.
"""

from __future__ import annotations

from typing import Protocol

from tools.registry import Tool


class ToolSource(Protocol):
    """Tools from one place (an MCP server, the HTTP actions of a config file)."""

    name: str  # for logs and errors: "mcp:grafana", "http"
    key: str  # where opsloop.yaml configures it: "tools.mcp.grafana", "tools.http"

    async def open(self) -> list[Tool]:
        """Connect and return the tools; one-line ``ToolLoadError`` when it cannot."""
        ...

    async def close(self) -> None:
        """Release connections and subprocesses; safe to call twice."""
        ...
