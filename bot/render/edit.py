"""The Edit modal of an approval card: a call's arguments as a form, and the form read back.

Each simple top-level property of the tool's JSON Schema gets an input of its own (a
string, an integer or a number a text input; an ``enum`` or a boolean a select); the
other arguments are one JSON object in a text editor. A checkbox adds the editor's own
approval ("Save and approve"). The modal's ``private_metadata`` binds it to the exact
call, as the reject modal's does; the submission is read with the same schema
(:func:`read_edit`), and what is wrong is said per input (:func:`error_blocks`), as
Slack's ``response_action: errors`` wants it.

Pure: no I/O here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bot import limits
from bot.limits import (
    MAX_ID,
    MAX_INPUT_HINT,
    MAX_INPUT_LABEL,
    MAX_OPTION_TEXT,
    MAX_OPTION_VALUE,
    MAX_SELECT_OPTIONS,
    MAX_VIEW_TITLE,
)
from bot.mrkdwn import slack_len
from bot.render.common import binding_value, plain, section, tool
from engine.edits import GENERAL, value_text

EDIT_CALLBACK = "opsloop_edit_arguments"
FIELD_PREFIX = "arg:"  # + the argument's name: one input block per simple argument
JSON_BLOCK = "arguments_json"
APPROVE_BLOCK = "approve"
VALUE_ACTION = "value"  # every input's action id
APPROVE_VALUE = "approve"
UNSET_OPTION = "(unset)"  # a select's "no value" option: not valid JSON, so never a value
MAX_INPUTS = limits.MAX_VIEW_BLOCKS - 3  # the intro, the JSON editor and the checkbox

Kind = Literal["text", "integer", "number", "choice"]


@dataclass(frozen=True)
class Field:
    """One simple argument's input: ``nullable`` (an ``anyOf`` with null) reads an empty
    input as null when the argument is required; ``choices`` are a select's values."""

    name: str
    kind: Kind
    required: bool
    nullable: bool = False
    choices: tuple[Any, ...] = ()
    max_length: int = limits.MAX_INPUT_LENGTH
    description: str = ""

    @property
    def block_id(self) -> str:
        return FIELD_PREFIX + self.name


@dataclass(frozen=True)
class Read:
    """A submitted form: the arguments it gives, the editor's vote, and what could not
    be read (by input block)."""

    arguments: dict[str, Any]
    approve: bool
    errors: dict[str, str]


def fields_of(schema: Mapping[str, Any]) -> list[Field]:
    """The inputs ``schema``'s simple top-level properties get, in its order."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []
    listed = schema.get("required")
    required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    out: list[Field] = []
    for name, prop in properties.items():
        field = _field(str(name), _resolved(prop, schema), name in required)
        if field is not None and len(out) < MAX_INPUTS:
            out.append(field)
    return out


def _resolved(prop: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """``prop``, a local ``#/$defs/…`` reference followed once (pydantic's enums)."""
    if not isinstance(prop, dict):
        return {}
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        defs = schema.get("$defs")
        target = defs.get(ref.removeprefix("#/$defs/")) if isinstance(defs, dict) else None
        if not isinstance(target, dict):
            return {}  # another kind of reference: edited as JSON
        return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


def _field(name: str, prop: dict[str, Any], required: bool) -> Field | None:
    if not name or len(FIELD_PREFIX + name) > MAX_ID:
        return None
    nullable = False
    options = prop.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        inner = next((o for o in options if o != {"type": "null"}), None)
        if not isinstance(inner, dict):
            return None
        prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **inner}
        nullable = True
    about = str(prop.get("description") or "")
    enum = prop.get("enum")
    if isinstance(enum, list):
        if _selectable(enum, required):
            return Field(name, "choice", required, nullable, tuple(enum), description=about)
        return None
    kind = prop.get("type")
    if kind == "boolean":
        return Field(name, "choice", required, nullable, (True, False), description=about)
    if kind in ("integer", "number"):
        return Field(name, kind, required, nullable, description=about)
    if kind == "string" and "const" not in prop:
        given = prop.get("maxLength")
        limit = limits.MAX_INPUT_LENGTH
        if isinstance(given, int) and not isinstance(given, bool) and given > 0:
            limit = min(given, limit)
        return Field(name, "text", required, nullable, max_length=limit, description=about)
    return None


def _selectable(values: list[Any], required: bool) -> bool:
    room = MAX_SELECT_OPTIONS - (0 if required else 1)  # the "(unset)" option
    scalars = all(v is None or isinstance(v, str | int | float | bool) for v in values)
    tokens = [_token(v) for v in values] if scalars else []
    return (
        scalars
        and 0 < len(values) <= room
        and len(set(tokens)) == len(tokens)
        and all(slack_len(t) <= MAX_OPTION_VALUE for t in tokens)
    )


def _token(value: Any) -> str:
    """A select option's value: the JSON of the argument's value."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- the modal ----------------------------------------------------------------------------


def edit_modal(
    *,
    thread_id: str,
    tool_call_id: str,
    arguments_hash: str,
    tool_name: str,
    schema: Mapping[str, Any],
    arguments: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The ``views.open`` modal editing ``arguments`` of the call; None when they do not
    fit in one (a JSON editor holds 3,000 characters)."""
    fields, inputs = fields_of(schema), []
    properties = schema.get("properties")
    shown: set[str] = set()
    for field in fields:
        block = _input(field, arguments)
        if block is not None:
            inputs.append(block)
            shown.add(field.name)
    rest = {k: v for k, v in arguments.items() if k not in shown}
    if rest or not fields or len(shown) < len(properties if isinstance(properties, dict) else ()):
        text = json.dumps(rest, ensure_ascii=False, indent=2) if rest else ""
        if slack_len(text) > limits.MAX_INPUT_LENGTH:
            return None
        label = "Other arguments (JSON)" if inputs else "Arguments (JSON)"
        inputs.append(_json_input(label, text))
    return {
        "type": "modal",
        "callback_id": EDIT_CALLBACK,
        "private_metadata": binding_value(thread_id, tool_call_id, arguments_hash),
        "title": plain("Edit arguments", MAX_VIEW_TITLE),
        "submit": plain("Save", MAX_VIEW_TITLE),
        "close": plain("Cancel", MAX_VIEW_TITLE),
        "blocks": [
            section(
                f"Edit the arguments of {tool(tool_name)}. Saving clears the approvals so "
                "far, and the policy decides the new arguments again: they may need more "
                "approvals, never fewer."
            ),
            *inputs,
            _approve_input(),
        ],
    }


def _input(field: Field, arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """The input block of ``field`` holding its current value; None when it cannot."""
    current = arguments.get(field.name)
    block: dict[str, Any] = {
        "type": "input",
        "block_id": field.block_id,
        "optional": not field.required or field.nullable,
        "label": plain(field.name, MAX_INPUT_LABEL),
    }
    if field.description.strip():
        block["hint"] = plain(field.description, MAX_INPUT_HINT)
    if field.kind == "choice":
        options = [_option(v) for v in field.choices]
        if not field.required:
            options.append({"text": plain(UNSET_OPTION, MAX_OPTION_TEXT), "value": UNSET_OPTION})
        element: dict[str, Any] = {
            "type": "static_select",
            "action_id": VALUE_ACTION,
            "options": options,
        }
        if field.name in arguments:
            chosen = next((o for o in options if o["value"] == _token(current)), None)
            if chosen is None:
                return None  # a value the schema does not list: edit it as JSON
            element["initial_option"] = chosen
        block["element"] = element
        return block
    element = {
        "type": "plain_text_input",
        "action_id": VALUE_ACTION,
        "max_length": field.max_length,
    }
    if field.name in arguments and current is not None:
        expected = str if field.kind == "text" else int | float
        if not isinstance(current, expected) or isinstance(current, bool):
            return None  # not what its input reads back: edit it as JSON
        text = current if isinstance(current, str) else _token(current)
        if not text or slack_len(text) > field.max_length:
            return None  # an empty input reads as no value; a long one does not fit
        element["initial_value"] = text
        element["multiline"] = "\n" in text
    block["element"] = element
    return block


def _option(value: Any) -> dict[str, Any]:
    return {
        "text": plain(value_text(value, MAX_OPTION_TEXT), MAX_OPTION_TEXT),
        "value": _token(value),
    }


def _json_input(label: str, text: str) -> dict[str, Any]:
    element: dict[str, Any] = {
        "type": "plain_text_input",
        "action_id": VALUE_ACTION,
        "multiline": True,
        "max_length": limits.MAX_INPUT_LENGTH,
    }
    if text:
        element["initial_value"] = text
    return {
        "type": "input",
        "block_id": JSON_BLOCK,
        "optional": True,
        "label": plain(label, MAX_INPUT_LABEL),
        "hint": plain("A JSON object; the inputs above set the others.", MAX_INPUT_HINT),
        "element": element,
    }


def _approve_input() -> dict[str, Any]:
    return {
        "type": "input",
        "block_id": APPROVE_BLOCK,
        "optional": True,
        "label": plain("Approve", MAX_INPUT_LABEL),
        "element": {
            "type": "checkboxes",
            "action_id": VALUE_ACTION,
            "options": [
                {
                    "text": plain("Save and approve (one vote: mine)", MAX_OPTION_TEXT),
                    "value": APPROVE_VALUE,
                }
            ],
        },
    }


# --- the submission -----------------------------------------------------------------------


def read_edit(schema: Mapping[str, Any], values: Mapping[str, Any]) -> Read:
    """The arguments a submitted form gives (``values``: its ``view.state.values``).

    Read with the inputs ``schema`` gives, those the modal showed (an input the modal
    left out, its value in the JSON editor, is not in ``values``); an argument left
    empty is left out, or null where the schema allows null and requires it."""
    arguments: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if JSON_BLOCK in values:
        text = _state(values, JSON_BLOCK).get("value") or ""
        try:
            parsed = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            errors[JSON_BLOCK] = f"Not JSON: {exc}"
        else:
            if isinstance(parsed, dict):
                arguments.update(parsed)
            else:
                errors[JSON_BLOCK] = 'Enter a JSON object: {"name": value, …}'
    for field in fields_of(schema):
        if field.block_id not in values:
            continue
        if field.name in arguments:
            errors[JSON_BLOCK] = f"{field.name} has an input of its own: set it there"
        try:
            value = _value(field, _state(values, field.block_id))
        except ValueError as exc:
            errors[field.block_id] = str(exc)
            continue
        arguments.pop(field.name, None)
        if value is not _LEFT_OUT:
            arguments[field.name] = value
    chosen = _state(values, APPROVE_BLOCK).get("selected_options") or []
    approve = any(isinstance(o, dict) and o.get("value") == APPROVE_VALUE for o in chosen)
    return Read(arguments, approve, errors)


_LEFT_OUT: Any = object()


def _state(values: Mapping[str, Any], block_id: str) -> dict[str, Any]:
    block = values.get(block_id)
    state = block.get(VALUE_ACTION) if isinstance(block, dict) else None
    return state if isinstance(state, dict) else {}


def _value(field: Field, state: dict[str, Any]) -> Any:
    if field.kind == "choice":
        option = state.get("selected_option")
        token = option.get("value") if isinstance(option, dict) else None
        if token is None or token == UNSET_OPTION:
            return _empty(field)
        try:
            value = json.loads(token)
        except ValueError:
            raise ValueError("Choose one of the options") from None
        if _token(value) not in {_token(c) for c in field.choices}:
            raise ValueError("Choose one of the options")
        return value
    text = state.get("value")
    if not isinstance(text, str) or (text == "" if field.kind == "text" else not text.strip()):
        return _empty(field)
    if field.kind == "text":
        return text
    return read_number(text.strip(), field.kind)


def _empty(field: Field) -> Any:
    return None if field.nullable and field.required else _LEFT_OUT


def read_number(text: str, kind: str) -> int | float:
    """A number typed into a form input (``kind`` integer or number); ValueError says
    what to type instead."""
    try:
        return int(text)
    except ValueError:
        if kind == "integer":
            raise ValueError("Enter a whole number") from None
    try:
        number = float(text)
    except ValueError:
        raise ValueError("Enter a number") from None
    if not math.isfinite(number):
        raise ValueError("Enter a finite number")
    return number


def error_blocks(
    schema: Mapping[str, Any], values: Mapping[str, Any], errors: Mapping[str, str]
) -> dict[str, str]:
    """Errors about arguments (``engine.edits.GENERAL`` for the others) under the
    inputs that show them: an argument's own, else the JSON editor, else the first."""
    shown = {f.name: f.block_id for f in fields_of(schema) if f.block_id in values}
    first = next(iter(shown.values()), APPROVE_BLOCK)
    fallback = JSON_BLOCK if JSON_BLOCK in values else first
    out: dict[str, str] = {}
    for name, message in errors.items():
        block = shown.get(name, fallback)
        text = message if name in shown or name == GENERAL else f"{name}: {message}"
        out[block] = f"{out[block]}; {text}" if block in out else text
    return out
