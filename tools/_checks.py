"""Decoration-time checks for @tool: signature, annotation, name, docstring."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from tools.errors import ToolDefinitionError

NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
RESERVED_NAMES = frozenset({"request_clarification"})

_POSITIONAL = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
)


def check_name(name: object) -> str:
    """Enforce Anthropic's tool-name rule and the engine's reserved names."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ToolDefinitionError(f"invalid tool name {name!r}: must match ^[a-zA-Z0-9_-]{{1,64}}$")
    if name in RESERVED_NAMES:
        raise ToolDefinitionError(f"tool name {name!r} is reserved for the engine's control tool")
    return name


def check_description(func: Callable[..., Any], name: str) -> str:
    """The cleaned docstring is the description the model sees; it must exist."""
    doc = inspect.getdoc(func)
    if not doc or not doc.strip():
        raise ToolDefinitionError(
            f"tool {name!r} needs a docstring: it is the description the model sees"
        )
    return doc.strip()


def args_model_of(
    func: Callable[..., Any], name: str, localns: Mapping[str, Any] | None
) -> type[BaseModel]:
    """Check ``async def f(args: SomeModel, ctx)`` and return SomeModel."""
    if not inspect.iscoroutinefunction(func):
        raise ToolDefinitionError(f"tool {name!r} must be defined with 'async def'")
    params = list(inspect.signature(func).parameters.values())
    if len(params) != 2 or any(p.kind not in _POSITIONAL for p in params):
        raise ToolDefinitionError(
            f"tool {name!r} must take exactly two positional parameters "
            f"(args: <pydantic model>, ctx: ToolContext), got {len(params)}"
        )
    first = params[0]
    if first.annotation is inspect.Parameter.empty:
        raise ToolDefinitionError(
            f"tool {name!r}: parameter {first.name!r} must be annotated "
            "with a pydantic BaseModel subclass"
        )
    model = _resolve(func, first, name, localns)
    if not (isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel):
        raise ToolDefinitionError(
            f"tool {name!r}: parameter {first.name!r} is annotated with {model!r}, "
            "expected a pydantic BaseModel subclass"
        )
    return model


def _resolve(
    func: Callable[..., Any],
    param: inspect.Parameter,
    name: str,
    localns: Mapping[str, Any] | None,
) -> Any:
    """Resolve the (possibly string) annotation of ``param``.

    Tries ``typing.get_type_hints`` first; if another annotation is unresolvable
    (e.g. a TYPE_CHECKING-only import for ctx), evaluates just this one.
    """
    try:
        hints = typing.get_type_hints(func, localns=dict(localns or {}))
        if param.name in hints:
            return hints[param.name]
    except Exception:  # fall back to evaluating just this annotation
        pass
    ann = param.annotation
    if not isinstance(ann, str):
        return ann
    try:
        return eval(ann, getattr(func, "__globals__", {}), dict(localns or {}))
    except Exception as exc:
        raise ToolDefinitionError(
            f"tool {name!r}: cannot resolve annotation {ann!r} of parameter "
            f"{param.name!r}: {type(exc).__name__}: {exc}"
        ) from exc
