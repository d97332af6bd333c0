"""The Edit modal of an approval card: a call's arguments as a form, and read back."""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel

from bot import limits
from bot.render.common import Binding, parse_binding
from bot.render.edit import (
    APPROVE_BLOCK,
    EDIT_CALLBACK,
    JSON_BLOCK,
    UNSET_OPTION,
    VALUE_ACTION,
    edit_modal,
    error_blocks,
    fields_of,
    read_edit,
)
from tests.bot.render.support import (
    CALL_ID,
    EVIL,
    HASH,
    THREAD,
    all_text,
    assert_safe,
    sdk_validate,
)
from tools import ToolContext, ToolRegistry, tool

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "environment": {"type": "string", "enum": ["staging", "production"]},
        "service": {"type": "string", "maxLength": 40, "description": "Which service"},
        "replicas": {"type": "integer"},
        "ratio": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "dry_run": {"type": "boolean"},
        "labels": {"type": "object"},
    },
    "required": ["environment", "service", "ratio"],
}
ARGS = {
    "environment": "staging",
    "service": "api",
    "replicas": 2,
    "ratio": 0.5,
    "labels": {"team": "core"},
}


def modal(schema: dict[str, Any] = SCHEMA, arguments: dict[str, Any] = ARGS) -> dict[str, Any]:
    view = edit_modal(
        thread_id=THREAD,
        tool_call_id=CALL_ID,
        arguments_hash=HASH,
        tool_name="deploy",
        schema=schema,
        arguments=arguments,
    )
    assert view is not None
    return view


def inputs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}


def text(value: str | None) -> dict[str, Any]:
    return {VALUE_ACTION: {"type": "plain_text_input", "value": value}}


def select(token: str | None) -> dict[str, Any]:
    option = (
        None if token is None else {"text": {"type": "plain_text", "text": token}, "value": token}
    )
    return {VALUE_ACTION: {"type": "static_select", "selected_option": option}}


def checked(on: bool) -> dict[str, Any]:
    chosen = [{"value": "approve"}] if on else []
    return {VALUE_ACTION: {"type": "checkboxes", "selected_options": chosen}}


def submitted(**over: Any) -> dict[str, Any]:
    """``view.state.values`` of the modal above, left as it opened unless told."""
    values = {
        "arg:environment": select('"staging"'),
        "arg:service": text("api"),
        "arg:replicas": text("2"),
        "arg:ratio": text("0.5"),
        "arg:dry_run": select(None),
        JSON_BLOCK: text('{\n  "labels": {"team": "core"}\n}'),
        APPROVE_BLOCK: checked(False),
    }
    return values | {k.replace("__", ":"): v for k, v in over.items()}


def test_the_modal_has_an_input_per_simple_argument_and_json_for_the_rest() -> None:
    view = modal()
    assert view["callback_id"] == EDIT_CALLBACK
    assert parse_binding(view["private_metadata"]) == Binding(THREAD, CALL_ID, HASH)
    assert (view["title"]["text"], view["submit"]["text"]) == ("Edit arguments", "Save")
    found = inputs(view)
    assert list(found) == [
        "arg:environment",
        "arg:service",
        "arg:replicas",
        "arg:ratio",
        "arg:dry_run",
        JSON_BLOCK,
        APPROVE_BLOCK,
    ]
    env = found["arg:environment"]["element"]
    assert env["type"] == "static_select"
    assert [o["value"] for o in env["options"]] == ['"staging"', '"production"']
    assert env["initial_option"]["value"] == '"staging"'
    assert found["arg:environment"]["optional"] is False
    service = found["arg:service"]
    assert service["element"]["initial_value"] == "api"
    assert service["element"]["max_length"] == 40
    assert service["hint"]["text"] == "Which service"
    assert found["arg:replicas"]["element"]["initial_value"] == "2"
    assert found["arg:replicas"]["optional"] is True
    assert found["arg:ratio"]["optional"] is True  # empty reads as null
    dry = found["arg:dry_run"]["element"]
    assert [o["value"] for o in dry["options"]] == ["true", "false", UNSET_OPTION]
    assert "initial_option" not in dry  # not set on the call
    assert json.loads(found[JSON_BLOCK]["element"]["initial_value"]) == {"labels": {"team": "core"}}
    assert found[APPROVE_BLOCK]["element"]["type"] == "checkboxes"
    assert limits.check_limits(view) == []
    sdk_validate(view)


def test_the_form_reads_back_the_arguments_it_showed() -> None:
    read = read_edit(SCHEMA, submitted())
    assert read.errors == {}
    assert read.arguments == ARGS
    assert read.approve is False


def test_the_form_reads_changes_types_and_the_vote() -> None:
    read = read_edit(
        SCHEMA,
        submitted(
            arg__environment=select('"production"'),
            arg__replicas=text(" 3 "),
            arg__ratio=text(""),
            arg__dry_run=select("true"),
            arguments_json=text(""),
            approve=checked(True),
        ),
    )
    assert read.errors == {}
    assert read.arguments == {
        "environment": "production",
        "service": "api",
        "replicas": 3,
        "ratio": None,  # required and nullable: an empty input is null
        "dry_run": True,
    }
    assert read.approve is True


def test_what_cannot_be_read_is_said_under_its_input() -> None:
    read = read_edit(
        SCHEMA,
        submitted(
            arg__replicas=text("three"),
            arg__ratio=text("inf"),
            arg__environment=select('"moon"'),  # not an option: a forged form
            arguments_json=text("[1, 2"),
        ),
    )
    assert set(read.errors) == {"arg:replicas", "arg:ratio", "arg:environment", JSON_BLOCK}
    assert read.errors["arg:replicas"] == "Enter a whole number"
    assert read.errors[JSON_BLOCK].startswith("Not JSON")
    assert read_edit(SCHEMA, submitted(arguments_json=text("[1]"))).errors == {
        JSON_BLOCK: 'Enter a JSON object: {"name": value, …}'
    }
    twice = read_edit(SCHEMA, submitted(arguments_json=text('{"replicas": 9}')))
    assert twice.errors == {JSON_BLOCK: "replicas has an input of its own: set it there"}


def test_errors_about_arguments_go_under_their_inputs() -> None:
    values = submitted()
    errors = {"replicas": "must be at least 1", "labels": "bad", "": "general"}
    assert error_blocks(SCHEMA, values, errors) == {
        "arg:replicas": "must be at least 1",
        JSON_BLOCK: "labels: bad; general",
    }
    no_json = {k: v for k, v in values.items() if k != JSON_BLOCK}
    assert error_blocks(SCHEMA, no_json, {"": "general"}) == {"arg:environment": "general"}


def test_arguments_too_large_for_slack_open_no_modal() -> None:
    big = {"labels": {"k": "x" * 4000}}
    assert (
        edit_modal(
            thread_id=THREAD,
            tool_call_id=CALL_ID,
            arguments_hash=HASH,
            tool_name="deploy",
            schema=SCHEMA,
            arguments=big,
        )
        is None
    )
    # A string too long for its input is edited in the JSON editor instead.
    view = modal(arguments={"service": "s" * 41})
    assert "arg:service" not in inputs(view)
    assert json.loads(inputs(view)[JSON_BLOCK]["element"]["initial_value"]) == {"service": "s" * 41}
    assert limits.check_limits(view) == []


def test_a_schema_without_simple_properties_is_one_json_editor() -> None:
    view = modal({"type": "object"}, {"anything": [1, {"x": EVIL}]})
    assert list(inputs(view)) == [JSON_BLOCK, APPROVE_BLOCK]
    assert inputs(view)[JSON_BLOCK]["label"]["text"] == "Arguments (JSON)"
    # The value is the editor's text, as it is; what Slack renders is escaped.
    assert EVIL in inputs(view)[JSON_BLOCK]["element"]["initial_value"]
    assert_safe(all_text(view["blocks"]))
    assert read_edit({"type": "object"}, {JSON_BLOCK: text('{"a": 1}')}).arguments == {"a": 1}


class Stage(enum.StrEnum):
    staging = "staging"
    production = "production"


class ShipArgs(BaseModel):
    stage: Stage
    note: str | None = None
    count: int = 1


def test_a_pydantic_tools_enums_and_optionals_get_inputs() -> None:
    registry = ToolRegistry()

    @tool(policy="approve_before_run", registry=registry)
    async def ship(args: ShipArgs, ctx: ToolContext) -> dict:
        """Ship it."""
        return {}

    schema = ship.input_schema()
    kinds = {f.name: (f.kind, f.required, f.nullable) for f in fields_of(schema)}
    assert kinds == {
        "stage": ("choice", True, False),
        "note": ("text", False, True),
        "count": ("integer", False, False),
    }
    view = modal(schema, {"stage": "staging", "note": None, "count": 1})
    assert limits.check_limits(view) == []
    read = read_edit(schema, {"arg:stage": select('"production"'), "arg:note": text("")})
    assert read.arguments == {"stage": "production"}  # an empty optional is left out


def test_odd_schemas_give_json_not_errors() -> None:
    odd: dict[str, Any] = {
        "type": "object",
        "properties": {
            "any": True,  # a boolean schema
            "either": {"anyOf": [True, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/Missing"},
            "far": {"$ref": "https://example.com/schema"},
            "many": {"type": ["string", "null"]},
            "sized": {"type": "string", "maxLength": True},
            "huge": {"enum": list(range(200))},
            "mixed": {"enum": [{"a": 1}, "b"]},
            "x" * 300: {"type": "string"},  # too long for a block id
        },
        "required": "sized",  # not a list
        "$defs": [],
    }
    assert [(f.name, f.max_length) for f in fields_of(odd)] == [("sized", 3000)]
    view = modal(odd, {"any": 1, "huge": 7})
    assert list(inputs(view)) == ["arg:sized", JSON_BLOCK, APPROVE_BLOCK]
    assert limits.check_limits(view) == []
