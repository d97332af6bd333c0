"""The Tool type, the registry of tools, and the @tool decorator."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel

from tools._checks import args_model_of, check_description, check_name
from tools.errors import ToolDefinitionError

Policy = Literal["run_now", "approve_before_run", "wait_for_external_event"]
POLICIES: tuple[str, ...] = get_args(Policy)

PollFn = Callable[[dict, Any], Awaitable["dict | None"]]


@dataclass(eq=False)
class Tool:
    """A registered tool: metadata for the model plus the function to run.

    Calling the Tool (``await tool_obj(args, ctx)``) calls the function, so the
    decorated name stays usable as a plain coroutine function.
    """

    name: str
    description: str
    policy: Policy
    args_model: type[BaseModel]
    func: Callable[..., Awaitable[Any]]
    poll: PollFn | None = None
    # Where it comes from: "module:<module>", "mcp:<server>" or "http" (``opsloop tools``).
    source: str = ""
    # May a call interrupted between tool_started and its result simply run again?
    idempotent: bool = True
    # Hints the tool's server gave (MCP annotations); never a policy by themselves.
    annotations: dict[str, Any] = field(default_factory=dict)
    _schema: dict[str, Any] | None = field(default=None, init=False, repr=False)
    # The definition hash and the (name, description) it was computed for: every call
    # asks for it twice (recorded, then compared before the run).
    _hash: tuple[str, str, str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.source:
            self.source = f"module:{getattr(self.func, '__module__', '?')}"

    def use_schema(self, schema: dict[str, Any]) -> None:
        """Show the model ``schema`` as it is (a tool defined by a JSON Schema)."""
        self._schema = copy.deepcopy(schema)
        self._hash = None

    @property
    def definition_hash(self) -> str:
        """sha256 of (name, description, input schema): what an approval pins."""
        if self._hash is None or self._hash[:2] != (self.name, self.description):
            canon = json.dumps(
                [self.name, self.description, self._built_schema()],
                sort_keys=True,
                separators=(",", ":"),
            )
            digest = hashlib.sha256(canon.encode()).hexdigest()
            self._hash = (self.name, self.description, digest)
        return self._hash[2]

    def input_schema(self) -> dict[str, Any]:
        """JSON schema of the arguments, shaped for an Anthropic ``input_schema``; a
        copy the caller may change."""
        return copy.deepcopy(self._built_schema())

    def _built_schema(self) -> dict[str, Any]:
        # Built once: pydantic's schema generation costs about a millisecond.
        if self._schema is None:
            schema = dict(self.args_model.model_json_schema())
            schema.pop("title", None)
            schema["type"] = "object"
            schema.setdefault("properties", {})
            self._schema = schema
        return self._schema

    def parse_arguments(self, arguments: dict) -> BaseModel:
        """Validate raw model-supplied arguments (raises pydantic ValidationError)."""
        return self.args_model.model_validate(arguments)

    async def run(self, args: BaseModel, ctx: Any) -> Any:
        """Run the tool function with already-validated arguments."""
        return await self.func(args, ctx)

    def poller(self, fn: PollFn) -> PollFn:
        """Decorator: attach ``async def check(data, ctx) -> dict | None``."""
        if not callable(fn):
            raise ToolDefinitionError(f"poller for {self.name!r} must be callable")
        self.poll = fn
        return fn

    def __call__(self, args: BaseModel, ctx: Any) -> Awaitable[Any]:
        return self.func(args, ctx)

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r}, policy={self.policy!r})"


def _same_definition(a: Tool, b: Tool) -> bool:
    """True for the same function object, or the same module-level function
    re-created by a module re-import (same module and qualified name)."""
    if a.func is b.func:
        return True
    qa = getattr(a.func, "__qualname__", None)
    return (
        qa is not None
        and "<locals>" not in qa
        and qa == getattr(b.func, "__qualname__", None)
        and getattr(a.func, "__module__", None) == getattr(b.func, "__module__", None)
    )


class ToolRegistry:
    """Name -> Tool map; refuses two different tools under one name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> Tool:
        """Add ``tool``; replaces silently only a re-registration of the same function."""
        if not isinstance(tool, Tool):
            raise ToolDefinitionError(f"can only register Tool objects, got {tool!r}")
        existing = self._tools.get(tool.name)
        if existing is not None and not _same_definition(existing, tool):
            raise ToolDefinitionError(
                f"duplicate tool name {tool.name!r}: already registered by "
                f"{_where(existing)}, now again by {_where(tool)}"
            )
        self._tools[tool.name] = tool
        return tool

    def unregister(self, name: str) -> Tool | None:
        """Remove and return the tool called ``name`` (None if absent)."""
        return self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[Tool]:
        """All tools sorted by name."""
        return [self._tools[n] for n in sorted(self._tools)]

    def copy(self) -> ToolRegistry:
        """A new registry holding the same Tool objects."""
        new = ToolRegistry()
        new._tools = dict(self._tools)
        return new

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.all())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"


def _where(tool: Tool) -> str:
    mod = getattr(tool.func, "__module__", "?")
    return f"{mod}.{getattr(tool.func, '__qualname__', tool.name)}"


REGISTRY = ToolRegistry()


def tool(
    func: Callable[..., Awaitable[Any]] | None = None,
    *,
    policy: Policy = "run_now",
    name: str | None = None,
    registry: ToolRegistry | None = None,
    idempotent: bool = True,
) -> Any:
    """Declare a tool: ``@tool`` or ``@tool(policy=..., name=..., registry=...)``.

    ``idempotent=False``: a call cut off by a crash after it started is not run again
    without a person saying whether it happened.

    Returns the :class:`Tool` (registered in ``registry``, default REGISTRY).
    """
    if func is not None and not callable(func):
        raise ToolDefinitionError(
            "use @tool or @tool(policy=..., name=...); positional arguments "
            f"other than the function are not accepted (got {func!r})"
        )
    frame = sys._getframe(1)
    localns: Mapping[str, Any] | None = (
        None if frame.f_locals is frame.f_globals else dict(frame.f_locals)
    )
    del frame

    def decorate(fn: Callable[..., Awaitable[Any]]) -> Tool:
        if not callable(fn) or isinstance(fn, Tool):
            raise ToolDefinitionError(f"@tool must decorate a function, got {fn!r}")
        tool_name = check_name(name if name is not None else fn.__name__)
        if policy not in POLICIES:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: unknown policy {policy!r}; "
                f"expected one of {', '.join(POLICIES)}"
            )
        args_model = args_model_of(fn, tool_name, localns)
        description = check_description(fn, tool_name)
        obj = Tool(
            name=tool_name,
            description=description,
            policy=policy,
            args_model=args_model,
            func=fn,
            idempotent=idempotent,
        )
        (registry if registry is not None else REGISTRY).register(obj)
        return obj

    return decorate(func) if func is not None else decorate
