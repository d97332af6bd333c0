"""opsloop tools: declare tools with @tool, load them, and look them up.

Importing this package does not import the built-in tools; ``load_tools`` does.
"""

from __future__ import annotations

from tools.context import ToolContext
from tools.errors import (
    RetryableToolError,
    ToolDefinitionError,
    ToolError,
    ToolLoadError,
)
from tools.loader import load_tools
from tools.registry import REGISTRY, Policy, Tool, ToolRegistry, tool
from tools.schema_tool import SchemaArguments, schema_tool
from tools.wait import WaitFor

__all__ = [
    "REGISTRY",
    "Policy",
    "RetryableToolError",
    "SchemaArguments",
    "Tool",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolLoadError",
    "ToolRegistry",
    "WaitFor",
    "load_tools",
    "schema_tool",
    "tool",
]
