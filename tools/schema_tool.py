"""Tools defined by a JSON Schema instead of a pydantic model: MCP tools, HTTP actions.

Their arguments are checked with ``jsonschema`` (the schema is the server's or the
config file's, not ours to translate), wrapped in a pydantic model so that the engine
validates every tool through the same ``parse_arguments`` path and sees one error type
(``pydantic.ValidationError``) whatever defined the tool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model, model_validator

from tools._checks import check_name
from tools.errors import ToolDefinitionError
from tools.registry import Policy, Tool
from tools.schemas import SchemaProblem, compile_schema, validate

_MAX_ERRORS = 3


class SchemaArguments(BaseModel):
    """Arguments validated against a JSON Schema; ``as_dict()`` gives them back as sent."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _arguments_model(name: str, schema: dict[str, Any]) -> type[SchemaArguments]:
    try:
        validator = compile_schema(schema)
    except SchemaProblem as exc:
        raise ToolDefinitionError(f"tool {name!r}: invalid input schema: {exc}") from None

    def check(cls: type[SchemaArguments], data: Any) -> Any:
        try:
            problems = validate(validator, data)
        except SchemaProblem as exc:
            raise ValueError(str(exc)) from None  # pydantic makes it a ValidationError
        if problems:
            parts = []
            for err in problems[:_MAX_ERRORS]:
                where = ".".join(str(p) for p in err.absolute_path) or "(input)"
                parts.append(f"{where}: {err.message}")
            raise ValueError("; ".join(parts))
        return data

    validators: dict[str, Any] = {"_schema": model_validator(mode="before")(check)}
    return create_model(  # type: ignore[no-any-return]
        f"{name}_arguments", __base__=SchemaArguments, __validators__=validators
    )


def schema_tool(
    *,
    name: str,
    description: str,
    schema: Mapping[str, Any],
    func: Callable[[SchemaArguments, Any], Awaitable[Any]],
    policy: Policy = "approve_before_run",
    source: str,
    idempotent: bool = False,
    annotations: Mapping[str, Any] | None = None,
    checks: Mapping[str, Any] | None = None,
    source_name: str = "",
) -> Tool:
    """A :class:`Tool` whose arguments are checked against ``schema``.

    ``func(args, ctx)`` receives :class:`SchemaArguments` (``args.as_dict()``).
    Defaults are the safe ones of DESIGN.md: approval before running, non-idempotent.
    ``checks``: the schema arguments are checked against instead, when the model is
    shown a simpler one (an MCP server's union, flattened for the model API).
    ``source_name``: the tool's own name at its source (``Tool.source_name``).
    """
    check_name(name)
    if not description.strip():
        raise ToolDefinitionError(f"tool {name!r} needs a description: the model reads it")
    input_schema = dict(schema)
    if input_schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool {name!r}: the input schema must describe an object")
    input_schema["type"] = "object"
    input_schema.setdefault("properties", {})
    tool = Tool(
        name=name,
        description=description.strip(),
        policy=policy,
        args_model=_arguments_model(name, dict(checks) if checks is not None else input_schema),
        func=func,
        source=source,
        idempotent=idempotent,
        annotations=dict(annotations or {}),
        source_name=source_name,
    )
    tool.use_schema(input_schema)
    return tool
