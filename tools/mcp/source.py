"""The tools of one MCP server as ``mcp__<server>__<tool>`` Tools (a ToolSource).

Every call re-reads the server's definition of its tool (a fresh ``tools/list``, no
reliance on change notifications) and refuses to run when it no longer hashes to the
definition the call was approved under (``ToolContext.definition_hash``): a server
that swaps a tool's description or schema after approval does not get the call.

A failure of that check, or of connecting, is ``McpUnavailable`` (retryable: nothing
ran); a failure once the ``tools/call`` went out is ``OutcomeUnknown`` (see connection.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp import Client

from tools._checks import NAME_RE
from tools.errors import ToolDefinitionError, ToolError
from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig, server_name
from tools.mcp.connection import McpConnection
from tools.mcp.errors import DefinitionChanged, McpLoadError, McpUnavailable
from tools.mcp.results import tool_output
from tools.registry import Tool
from tools.schema_tool import SchemaArguments, schema_tool

_MAX_PAGES = 100  # a paginator that never ends cannot hang startup or a call


@dataclass(frozen=True)
class _Definition:
    """What the model is shown of one server tool, and its hash."""

    remote: str
    name: str
    description: str
    schema: dict[str, Any]
    annotations: dict[str, Any]

    @property
    def hash(self) -> str:
        return definition_hash(self.name, self.description, self.schema)


class McpSource:
    """One MCP server's (allowlisted) tools; one session per process, reconnecting."""

    def __init__(
        self,
        name: str,
        server: McpServerConfig,
        *,
        call_timeout_s: float | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        """``name``: the server's key under ``tools.mcp``. ``call_timeout_s``: how long a
        call waits for its answer (None: no limit of its own); past it the outcome is
        unknown, so keep it below the engine's tool timeout. ``connect_timeout_s``: how
        long connecting may take."""
        try:
            self.server_name = server_name(name)
        except ValueError as exc:
            raise McpLoadError(str(name), f"tools.mcp.{name}: {exc}") from None
        self.server = server
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.name = f"mcp:{name}"
        self.key = f"tools.mcp.{name}"
        self._conn = McpConnection(name, server, connect_timeout_s=connect_timeout_s)
        self._loaded: dict[str, _Definition] = {}  # by the server's tool name

    async def open(self) -> list[Tool]:
        """Connect, list every page, build the Tools; one-line McpLoadError otherwise."""
        try:
            async with asyncio.timeout(self.connect_timeout_s * 2):
                listed = await self._list()
            tools = self._build(listed)
        except BaseException as exc:
            await self._conn.close()
            if isinstance(exc, McpLoadError):
                raise
            if isinstance(exc, McpUnavailable | TimeoutError):
                raise self._load_error(f"unreachable at startup: {self._detail(exc)}") from exc
            if isinstance(exc, ToolError):
                raise self._load_error(f"cannot list its tools: {self._detail(exc)}") from exc
            raise
        return tools

    async def close(self) -> None:
        await self._conn.close()

    async def current_definitions(self) -> dict[str, str]:
        """``{registered name: definition hash}`` as the server defines its tools now."""
        return {
            d.name: d.hash for d in map(self._definition, await self._list()) if self._wanted(d)
        }

    def _build(self, listed: list[types.Tool]) -> list[Tool]:
        by_name = {t.name: t for t in listed}
        if self.server.tools is not None:
            missing = [n for n in self.server.tools if n not in by_name]
            if missing:
                names = ", ".join(repr(n) for n in missing)
                raise self._load_error(f"has no tool {names} (named in its tools allowlist)")
        tools = []
        for remote in by_name.values():
            definition = self._definition(remote)
            if not self._wanted(definition):
                continue
            if not NAME_RE.fullmatch(definition.name):
                raise self._load_error(
                    f"tool {remote.name!r} gives the name {definition.name!r}, which breaks "
                    "Anthropic's rule (1-64 characters of a-z A-Z 0-9 _ -)"
                )
            tools.append(self._tool(definition))
            self._loaded[remote.name] = definition
        return tools

    def _tool(self, d: _Definition) -> Tool:
        remote = d.remote

        async def call_mcp_tool(args: SchemaArguments, ctx: Any) -> dict[str, Any]:
            return await self._call(remote, args.as_dict(), ctx)

        try:
            return schema_tool(
                name=d.name,
                description=d.description,
                schema=d.schema,
                func=call_mcp_tool,
                policy="approve_before_run",
                source=self.name,
                idempotent=False,
                annotations=d.annotations,
            )
        except ToolDefinitionError as exc:
            raise self._load_error(f"tool {remote!r}: {exc}") from exc

    async def _call(self, remote: str, arguments: dict[str, Any], ctx: Any) -> dict[str, Any]:
        loaded = self._loaded[remote]
        pinned = getattr(ctx, "definition_hash", None) or loaded.hash
        current = next((t for t in await self._list(until=remote) if t.name == remote), None)
        if current is None:
            raise DefinitionChanged(
                f"{loaded.name} is no longer offered by MCP server {self.server_name!r} "
                "since the call was approved; it was not run"
            )
        now = self._definition(current)
        if now.hash != pinned:
            raise DefinitionChanged(
                f"the definition of {loaded.name} changed since the call was approved "
                f"({_what_changed(loaded, now, pinned)}); it was not run"
            )

        async def call(client: Client) -> types.CallToolResult:
            return await client.call_tool(
                remote, arguments, read_timeout_seconds=self.call_timeout_s
            )

        return tool_output(await self._conn.request(call, call=remote))

    async def _list(self, *, until: str | None = None) -> list[types.Tool]:
        """A fresh ``tools/list``, page after page (up to the page naming ``until``)."""

        async def walk(client: Client) -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor: str | None = None
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or any(t.name == until for t in page.tools):
                    break
            return tools

        return await self._conn.request(walk)

    def _definition(self, remote: types.Tool) -> _Definition:
        description = (remote.description or remote.title or "").strip()
        hints = (
            remote.annotations.model_dump(by_alias=True, exclude_none=True)
            if remote.annotations
            else {}
        )
        return _Definition(
            remote=remote.name,
            name=f"mcp__{self.server_name}__{remote.name}",
            description=description or f"Tool {remote.name} of the MCP server {self.server_name}.",
            schema=object_schema(remote.input_schema),
            annotations={k: v for k, v in hints.items() if k.endswith("Hint")},
        )

    def _wanted(self, d: _Definition) -> bool:
        return self.server.tools is None or d.remote in self.server.tools

    def _load_error(self, text: str) -> McpLoadError:
        return McpLoadError(
            self.server_name, self.server.redact(f"MCP server {self.server_name!r} {text}")
        )

    def _detail(self, exc: BaseException) -> str:
        text = str(exc) or type(exc).__name__
        return text.removeprefix(f"MCP server {self.server_name!r}: ")


async def current_definitions(source: McpSource) -> dict[str, str]:
    """For ``opsloop tools``: the hashes the server's tools have now.

    A tool whose hash differs from its ``Tool.definition_hash`` has drifted; a name
    missing from the answer was removed by the server.
    """
    return await source.current_definitions()


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as ``schema_tool`` shows it to the model (so hashes agree)."""
    out = dict(schema)
    out["type"] = "object"
    out.setdefault("properties", {})
    return out


def definition_hash(name: str, description: str, schema: dict[str, Any]) -> str:
    """Tool.definition_hash of a tool with this definition, without building its validator."""
    probe = Tool(
        name=name,
        description=description.strip(),
        policy="approve_before_run",
        args_model=SchemaArguments,
        func=_never_called,
        source="mcp",
    )
    probe.use_schema(object_schema(schema))
    return probe.definition_hash


async def _never_called(args: SchemaArguments, ctx: Any) -> None:
    raise AssertionError("a definition probe is never run")


def _what_changed(loaded: _Definition, now: _Definition, pinned: str) -> str:
    if pinned != loaded.hash:
        return "it no longer matches the approved definition"
    parts = [
        label
        for label, before, after in (
            ("description", loaded.description, now.description),
            ("input schema", loaded.schema, now.schema),
        )
        if before != after
    ]
    return " and ".join(parts) + " changed" if parts else "its definition changed"
