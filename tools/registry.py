"""The Tool type, the registry of tools, and the @tool decorator."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
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
    # Its own name where it comes from (an MCP server's, which ``name`` maps to the model
    # API's alphabet): what calls it there, and what messages name. "" for @tool.
    source_name: str = ""
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
    """Name -> Tool map; refuses two different tools under one name.

    A serving process's registry grows and changes while it runs (an MCP server that
    comes up late, or redefines its tools), on the worker's loop, while the listeners
    read it on another thread. So every change builds a new map and swaps it in whole
    (copy on write): a reader works on the one map it took, never on one being changed.
    ``version`` counts the changes, so a reader can tell cheaply that it should look again.
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self.version = 0

    def _swap(self, tools: dict[str, Tool]) -> None:
        self._tools = tools
        self.version += 1

    def register(self, tool: Tool) -> Tool:
        """Add ``tool``; replaces silently only a re-registration of the same function."""
        if not isinstance(tool, Tool):
            raise ToolDefinitionError(f"can only register Tool objects, got {tool!r}")
        existing = self._tools.get(tool.name)
        if existing is not None and not _same_definition(existing, tool):
            raise ToolDefinitionError(_duplicate(existing, tool))
        self._swap({**self._tools, tool.name: tool})
        return tool

    def replace_source(self, source: str, tools: Iterable[Tool]) -> list[tuple[Tool, str]]:
        """Make ``tools`` all the tools of ``source`` (its others are removed), in one
        swap. A name another source holds stays theirs: each such tool is left out and
        returned with why (one line naming both)."""
        current = self._tools
        new = {name: t for name, t in current.items() if t.source != source}
        refused = []
        for tool in tools:
            holder = new.get(tool.name)
            if holder is not None:
                refused.append((tool, _duplicate(holder, tool)))
                continue
            new[tool.name] = tool
        if new != current:
            self._swap(new)
        return refused

    def unregister(self, name: str) -> Tool | None:
        """Remove and return the tool called ``name`` (None if absent)."""
        tools = dict(self._tools)
        found = tools.pop(name, None)
        if found is not None:
            self._swap(tools)
        return found

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[Tool]:
        """All tools sorted by name."""
        tools = self._tools  # one map, whatever is swapped in meanwhile
        return [tools[n] for n in sorted(tools)]

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


def _duplicate(existing: Tool, tool: Tool) -> str:
    return (
        f"duplicate tool name {tool.name!r}: already registered by "
        f"{_where(existing)}, now again by {_where(tool)}"
    )


def _where(tool: Tool) -> str:
    if tool.source_name:  # defined from data: a function of ours would name nobody's tool
        return f"{tool.source} (its tool {tool.source_name!r})"
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
