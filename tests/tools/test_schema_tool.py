"""Tools defined by a JSON Schema: checked by jsonschema, seen by the engine as any tool."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from engine.models.base import Decision, ToolUse
from engine.policy import classify
from tools import SchemaArguments, ToolDefinitionError, ToolRegistry, schema_tool, tool

SCHEMA = {
    "type": "object",
    "properties": {"service": {"type": "string", "enum": ["api", "web"]}, "n": {"type": "integer"}},
    "required": ["service"],
    "additionalProperties": False,
}


async def _echo(args: SchemaArguments, ctx: object) -> dict:
    return args.as_dict()


def _restart(**kw: object) -> object:
    base: dict = {
        "name": "restart_service",
        "description": "Restart one service.",
        "schema": SCHEMA,
        "func": _echo,
        "source": "http",
    }
    return schema_tool(**{**base, **kw})


def test_the_model_sees_the_schema_as_written() -> None:
    tool = _restart()
    assert tool.input_schema() == SCHEMA
    assert tool.source == "http"


def test_defaults_are_the_safe_ones() -> None:
    tool = _restart()
    assert tool.policy == "approve_before_run" and tool.idempotent is False


async def test_valid_arguments_reach_the_function_as_sent() -> None:
    tool = _restart()
    args = tool.parse_arguments({"service": "api", "n": 2})
    assert await tool.run(args, None) == {"service": "api", "n": 2}


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"service": "db"}, "service: 'db' is not one of"),
        ({}, "'service' is a required property"),
        ({"service": "api", "n": "2"}, "n: '2' is not of type 'integer'"),
        ({"service": "api", "extra": 1}, "Additional properties are not allowed"),
    ],
)
def test_invalid_arguments_are_a_pydantic_error_naming_the_problem(arguments, needle) -> None:
    with pytest.raises(ValidationError) as info:
        _restart().parse_arguments(arguments)
    assert needle in str(info.value)


def test_the_engine_rejects_invalid_arguments_like_any_tool() -> None:
    registry = ToolRegistry()
    registry.register(_restart())
    decision = Decision(
        text="", tool_use=ToolUse(id="tu_1", name="restart_service", input={"service": "db"})
    )
    verdict = classify(decision, registry)
    assert verdict.kind == "reject" and "is not one of" in verdict.reason
    ok = Decision(
        text="", tool_use=ToolUse(id="tu_2", name="restart_service", input={"service": "web"})
    )
    assert classify(ok, registry).kind == "approve_before_run"


def test_definition_hash_changes_with_the_schema_or_description() -> None:
    a, b = _restart(), _restart()
    assert a.definition_hash == b.definition_hash and len(a.definition_hash) == 64
    assert _restart(description="Restart it.").definition_hash != a.definition_hash
    wider = {**SCHEMA, "properties": {**SCHEMA["properties"], "force": {"type": "boolean"}}}
    assert _restart(schema=wider).definition_hash != a.definition_hash


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (
            {"schema": {"type": "object", "properties": {"a": {"type": "nope"}}}},
            "invalid input schema",
        ),
        ({"schema": {"type": "array"}}, "must describe an object"),
        ({"name": "mcp__a__" + "x" * 60}, "invalid tool name"),
        ({"description": "  "}, "needs a description"),
    ],
)
def test_bad_definitions_are_refused_in_one_line(kw, needle) -> None:
    with pytest.raises(ToolDefinitionError, match=needle):
        _restart(**kw)


class Plain(BaseModel):
    x: int


def test_python_tools_record_their_module_and_idempotency() -> None:

    registry = ToolRegistry()

    @tool(registry=registry, idempotent=False)
    async def poke(args: Plain, ctx: object) -> int:
        """Poke."""
        return args.x

    assert poke.source == f"module:{__name__}" and poke.idempotent is False
