"""An MCP server's question to the requester, in Slack: the thread's message asking it
(:func:`question_blocks`), the modal built from the requested JSON Schema
(:func:`form_modal`), and the submitted modal read back into the answer
(:func:`read_form`).

The schema is MCP's restricted one (flat properties of primitive types): a string (with
``minLength``, ``maxLength``, ``format`` email, uri, date or date-time), a number or an
integer (``minimum``, ``maximum``), a boolean, a single choice (``enum``, titled
``oneOf``, legacy ``enumNames``) and a multiple choice (an array of such). Each property
gets one input; a choice that does not fit Slack's select (or checkboxes) is typed in
and checked. A property of another kind cannot be shown: when the form needs it, the
question offers only Decline and Cancel. Everything the server wrote (message, titles,
descriptions, choices) is escaped and cut to Slack's limits; options are bound by
their index, never by the server's values. The answer is checked against the requested
schema (jsonschema, tools/schemas.py), the defaults of the properties left out filled
in first; what is wrong is said under its input (``response_action: errors``).

Url mode: a link button to the server's page (http or https only), whose click is the
requester's accept.

Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from bot import limits
from bot.limits import (
    MAX_BUTTON_VALUE,
    MAX_CHECKBOX_OPTIONS,
    MAX_INPUT_HINT,
    MAX_INPUT_LABEL,
    MAX_OPTION_TEXT,
    MAX_SELECT_OPTIONS,
    MAX_TEXT,
    MAX_VIEW_TITLE,
    Block,
)
from bot.mrkdwn import date as slack_date
from bot.mrkdwn import escape, for_people, mention, slack_len, truncate
from bot.render.common import button, context, plain, section, tool
from bot.render.edit import read_number
from engine import events as ev
from tools.mcp.elicitation import Question, fill_defaults, question_of
from tools.schemas import SchemaProblem, compile_schema, validate

ANSWER_ACTION = "opsloop_elicit_answer"
DECLINE_ACTION = "opsloop_elicit_decline"
CANCEL_ACTION = "opsloop_elicit_cancel"
OPEN_ACTION = "opsloop_elicit_open"  # url mode: the link button, its click an accept
FORM_CALLBACK = "opsloop_elicit_form"
VALUE_ACTION = "value"
FIELD_PREFIX = "f_"
QUESTION_FIELDS = limits.MAX_VIEW_BLOCKS - 1  # the question itself comes first
MESSAGE_CHARS = 2500  # of the server's message on the question and the modal

Kind = Literal["text", "integer", "number", "boolean", "choice", "multi", "typed_choice"]
_FORMAT_HINTS = {
    "email": "an email address",
    "uri": "a URL (https://…)",
    "date": "a date: YYYY-MM-DD",
    "date-time": "a date and time: YYYY-MM-DDTHH:MM:SSZ",
}


@dataclass(frozen=True)
class Field:
    """One property's input. ``choices``: (value, title) of a choice; ``default``:
    the schema's, shown as the input's initial value."""

    name: str
    kind: Kind
    required: bool
    label: str
    hint: str = ""
    choices: tuple[tuple[Any, str], ...] = ()
    default: Any = None
    max_length: int = limits.MAX_INPUT_LENGTH
    min_length: int = 0
    format: str = ""
    multiple: bool = False  # a typed choice of several values, one per line

    @property
    def block_id(self) -> str:
        """From the name's hash: a server's name may be long or hostile."""
        return FIELD_PREFIX + hashlib.sha256(self.name.encode("utf-8", "replace")).hexdigest()[:20]


@dataclass(frozen=True)
class Form:
    """The inputs a schema gets, and whether the form can be answered in Slack (every
    required property has an input, and the schema can be checked)."""

    fields: tuple[Field, ...]
    answerable: bool


@dataclass(frozen=True)
class Read:
    """A submitted form: the content it gives (defaults filled in), or what is wrong,
    by input block."""

    content: dict[str, Any]
    errors: dict[str, str]


# --- the binding of a button or modal to one open question -----------------------------


def ask_value(thread_id: str, wait_id: str) -> str:
    value = json.dumps({"t": thread_id, "w": wait_id}, separators=(",", ":"))
    if len(value) > MAX_BUTTON_VALUE:
        raise ValueError(f"ids too long for a button value ({len(value)} characters)")
    return value


def parse_ask(value: str | None) -> tuple[str, str]:
    """(thread id, wait id) of a button's value or a modal's metadata; ``ValueError``."""
    try:
        data = json.loads(value or "")
    except ValueError as exc:
        raise ValueError("not a question binding: not JSON") from exc
    if not isinstance(data, dict) or set(data) != {"t", "w"}:
        raise ValueError("not a question binding: wrong keys")
    if not all(isinstance(data[k], str) and data[k] for k in ("t", "w")):
        raise ValueError("not a question binding: empty or non-string ids")
    return data["t"], data["w"]


# --- the question in the thread ---------------------------------------------------------


def question_blocks(
    e: ev.WaitStarted, *, requester: str | None, people: frozenset[str] = frozenset()
) -> list[Block] | None:
    """The thread's message asking ``e``'s question, with its buttons; None when ``e``
    is not a question (an ordinary wait)."""
    q = question_of(e.data)
    if q is None:
        return None
    who = f"{mention(requester)} " if requester else ""
    said = for_people(escape(q.message.strip()), people) or "_(no message)_"
    text = f"❓ {who}{tool(q.tool)} asks:\n{truncate(said, MESSAGE_CHARS)}"
    blocks: list[Block] = [section(truncate(text, MAX_TEXT))]
    by = slack_date(e.timeout_at)
    if q.kind == "classic":
        note = (
            f"The MCP session stays open while it waits: answer by {by}, after that the "
            "tool is told it was cancelled."
        )
    else:
        note = f"Answer by {by}; after that the tool is told it was cancelled."
    who_answers = f"Only {mention(requester)} can answer." if requester else ""
    value = ask_value(e.thread_id, e.wait_id)
    actions: list[dict[str, Any]] = []
    if q.mode == "url":
        link = _link(q.url)
        if link is None:
            note += " The server's link is not an http(s) URL, so it is not shown."
        else:
            # The button is the only link: the page's host is said as plain words.
            note = f"The link goes to {escape(_host(link))}. {note}"
            actions.append(button("Open the link", OPEN_ACTION, value, "primary", url=link))
    elif form_of(q.schema).answerable:
        actions.append(button("Answer", ANSWER_ACTION, value, "primary"))
    else:
        note += " This form cannot be filled in Slack: decline or cancel it."
    actions += [
        button("Decline", DECLINE_ACTION, value, None),
        button("Cancel", CANCEL_ACTION, value, None),
    ]
    blocks.append(context(" ".join(t for t in (note, who_answers) if t)))
    blocks.append({"type": "actions", "block_id": "elicitation", "elements": actions})
    return blocks


def _link(url: str | None) -> str | None:
    """``url`` when Slack may link it: http(s), no characters that end a link."""
    if not url or len(url) > limits.MAX_URL or any(c in url for c in "<>|\n\r\t "):
        return None
    parts = urlsplit(url)
    return url if parts.scheme in ("http", "https") and parts.netloc else None


def _host(url: str) -> str:
    return urlsplit(url).hostname or "?"


# --- the modal ------------------------------------------------------------------------


def form_of(schema: Mapping[str, Any]) -> Form:
    """The inputs ``schema``'s properties get, in its order."""
    properties = schema.get("properties", {})
    if schema.get("type", "object") != "object" or not isinstance(properties, Mapping):
        return Form((), False)
    listed = schema.get("required")
    required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
    fields: list[Field] = []
    answerable = _checkable(schema)
    for name, prop in properties.items():
        field = _field(str(name), prop, str(name) in required) if isinstance(prop, dict) else None
        if field is None or len(fields) >= QUESTION_FIELDS:
            answerable = answerable and str(name) not in required
            continue
        fields.append(field)
    return Form(tuple(fields), answerable)


def _checkable(schema: Mapping[str, Any]) -> bool:
    try:
        compile_schema(dict(schema))
    except SchemaProblem:
        return False
    return True


def _field(name: str, prop: dict[str, Any], required: bool) -> Field | None:
    label = str(prop.get("title") or name).strip() or name
    about = str(prop.get("description") or "").strip()
    kind, default = prop.get("type"), prop.get("default")
    common: dict[str, Any] = {
        "name": name,
        "required": required,
        "label": label,
        "default": default,
    }
    if kind == "array":
        items = prop.get("items")
        choices = _choices(items if isinstance(items, dict) else {})
        if not choices:
            return None
        if len(choices) <= MAX_CHECKBOX_OPTIONS:
            return Field(kind="multi", hint=about, choices=choices, **common)
        hint = _hint(about, "one per line", "text")
        return Field(kind="typed_choice", hint=hint, choices=choices, multiple=True, **common)
    choices = _choices(prop)
    if choices:
        one: Kind = "choice" if len(choices) <= MAX_SELECT_OPTIONS else "typed_choice"
        return Field(kind=one, hint=about, choices=choices, **common)
    if kind == "boolean":
        return Field(kind="boolean", hint=about, choices=((True, "Yes"), (False, "No")), **common)
    if kind == "integer" or kind == "number":
        return Field(kind=kind, hint=_hint(about, _range(prop), kind), **common)
    if kind == "string":
        most, least = prop.get("maxLength"), prop.get("minLength")
        fmt = prop.get("format") if prop.get("format") in _FORMAT_HINTS else ""
        return Field(
            kind="text",
            hint=_hint(about, _FORMAT_HINTS.get(str(fmt), ""), "text"),
            max_length=_bounded(most, limits.MAX_INPUT_LENGTH) or limits.MAX_INPUT_LENGTH,
            min_length=_bounded(least, limits.MAX_INPUT_LENGTH),
            format=str(fmt or ""),
            **common,
        )
    return None


def _choices(prop: Mapping[str, Any]) -> tuple[tuple[Any, str], ...]:
    """(value, title) of a single choice: ``enum`` (titled by ``enumNames``) or a
    ``oneOf`` / ``anyOf`` of ``{"const", "title"}``."""
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        names = prop.get("enumNames")
        titles = names if isinstance(names, list) and len(names) == len(enum) else enum
        return tuple((v, str(t)) for v, t in zip(enum, titles, strict=True))
    for key in ("oneOf", "anyOf"):
        options = prop.get(key)
        if isinstance(options, list) and options:
            if not all(isinstance(o, dict) and "const" in o for o in options):
                return ()
            return tuple((o["const"], str(o.get("title") or o["const"])) for o in options)
    return ()


def _bounded(value: Any, most: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value:
        return min(value, most)
    return 0


def _range(prop: Mapping[str, Any]) -> str:
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        return f"from {low} to {high}"
    if low is not None:
        return f"at least {low}"
    return f"at most {high}" if high is not None else ""


def _hint(about: str, rule: str, kind: str) -> str:
    what = {"integer": "a whole number", "number": "a number"}.get(kind, "")
    said = "; ".join(t for t in (what + (" " if what and rule else "") + rule, about) if t)
    return said[:1].upper() + said[1:] if said else ""


def form_modal(thread_id: str, wait_id: str, q: Question) -> dict[str, Any] | None:
    """The ``views.open`` modal answering ``q``; None when it cannot be answered here."""
    form = form_of(q.schema)
    if q.mode != "form" or not form.answerable:
        return None
    intro = f"{tool(q.tool)} asks:\n{truncate(escape(q.message.strip()), MESSAGE_CHARS)}"
    blocks: list[Block] = [section(truncate(intro, MAX_TEXT))]
    blocks += [_input(f) for f in form.fields]
    if not form.fields:
        blocks.append(context("Nothing to fill in: Send answers yes."))
    return {
        "type": "modal",
        "callback_id": FORM_CALLBACK,
        "private_metadata": ask_value(thread_id, wait_id),
        "title": plain("Answer", MAX_VIEW_TITLE),
        "submit": plain("Send", MAX_VIEW_TITLE),
        "close": plain("Close", MAX_VIEW_TITLE),
        "blocks": blocks,
    }


def _input(field: Field) -> Block:
    block: Block = {
        "type": "input",
        "block_id": field.block_id,
        "optional": not field.required,
        "label": plain(field.label, MAX_INPUT_LABEL),
    }
    if field.hint:
        block["hint"] = plain(field.hint, MAX_INPUT_HINT)
    if field.kind in ("choice", "boolean", "multi"):
        options = [
            {"text": plain(title, MAX_OPTION_TEXT), "value": str(i)}
            for i, (_, title) in enumerate(field.choices)
        ]
        chosen = [options[i] for i, (v, _) in enumerate(field.choices) if _is_default(field, v)]
        many = field.kind == "multi"
        element: dict[str, Any] = {
            "type": "checkboxes" if many else "static_select",
            "action_id": VALUE_ACTION,
            "options": options,
        }
        if chosen:
            element["initial_options" if many else "initial_option"] = chosen if many else chosen[0]
        block["element"] = element
        return block
    element = {"type": "plain_text_input", "action_id": VALUE_ACTION}
    if field.kind == "text":
        element["max_length"] = field.max_length
        if field.min_length and field.min_length <= field.max_length:
            element["min_length"] = field.min_length
    initial = _initial_text(field)
    if initial:
        element["initial_value"] = initial
    element["multiline"] = field.multiple or "\n" in initial
    block["element"] = element
    return block


def _is_default(field: Field, value: Any) -> bool:
    if isinstance(field.default, list):
        return any(_same(value, d) for d in field.default)
    return field.default is not None and _same(value, field.default)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _initial_text(field: Field) -> str:
    default = field.default
    if isinstance(default, list):
        text = "\n".join(str(v) for v in default)
    elif isinstance(default, str | int | float) and not isinstance(default, bool):
        text = str(default)
    else:
        return ""
    most = field.max_length if field.kind == "text" else limits.MAX_INPUT_LENGTH
    return text if slack_len(text) <= most else ""


# --- the submission ---------------------------------------------------------------------


def read_form(schema: Mapping[str, Any], values: Mapping[str, Any]) -> Read:
    """The content a submitted form gives (``values``: its ``view.state.values``): each
    input read as its property's type, the defaults of those left empty filled in, then
    checked against ``schema``."""
    form = form_of(schema)
    content: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for field in form.fields:
        try:
            value = _value(field, _state(values, field.block_id))
        except ValueError as exc:
            errors[field.block_id] = str(exc)
            continue
        if value is not _LEFT_OUT:
            content[field.name] = value
    content = fill_defaults(schema, content)
    for field in form.fields:
        if field.required and field.name not in content and field.block_id not in errors:
            errors[field.block_id] = "Required"
    if errors:
        return Read(content, errors)
    return Read(content, _schema_errors(schema, content, form))


_LEFT_OUT: Any = object()


def _state(values: Mapping[str, Any], block_id: str) -> dict[str, Any]:
    block = values.get(block_id)
    state = block.get(VALUE_ACTION) if isinstance(block, dict) else None
    return state if isinstance(state, dict) else {}


def _value(field: Field, state: dict[str, Any]) -> Any:
    if field.kind in ("choice", "boolean"):
        option = state.get("selected_option")
        return _chosen(field, option) if isinstance(option, dict) else _LEFT_OUT
    if field.kind == "multi":
        options = state.get("selected_options")
        if not isinstance(options, list) or not options:
            return _LEFT_OUT
        return [_chosen(field, o) for o in options if isinstance(o, dict)]
    text = state.get("value")
    if not isinstance(text, str) or not text.strip():
        return _LEFT_OUT
    if field.kind == "typed_choice":
        return _typed_choice(field, text)
    if field.kind == "text":
        _check_format(field.format, text.strip())
        return text
    return read_number(text.strip(), field.kind)


def _chosen(field: Field, option: dict[str, Any]) -> Any:
    index = option.get("value")
    if not (isinstance(index, str) and index.isdigit() and int(index) < len(field.choices)):
        raise ValueError("Choose one of the options")
    return field.choices[int(index)][0]


def _typed_choice(field: Field, text: str) -> Any:
    by_text = {str(v): v for v, _ in field.choices} | {t: v for v, t in field.choices}
    typed = [line.strip() for line in text.splitlines() if line.strip()]
    unknown = [t for t in typed if t not in by_text]
    if unknown:
        raise ValueError(f"Not one of the choices: {unknown[0][:100]}")
    chosen = [by_text[t] for t in typed]
    if field.multiple:
        return chosen
    if len(chosen) != 1:
        raise ValueError("Enter one of the choices")
    return chosen[0]


_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _check_format(fmt: str, text: str) -> None:
    if fmt == "email" and not _EMAIL.match(text):
        raise ValueError("Enter an email address")
    if fmt == "uri":
        parts = urlsplit(text)
        if not parts.scheme or not (parts.netloc or parts.path):
            raise ValueError("Enter a URL, such as https://example.com")
    if fmt == "date":
        try:
            date.fromisoformat(text)
        except ValueError:
            raise ValueError("Enter a date: YYYY-MM-DD") from None
        if len(text) != 10:
            raise ValueError("Enter a date: YYYY-MM-DD")
    if fmt == "date-time":
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError("Enter a date and time: YYYY-MM-DDTHH:MM:SSZ") from None
        if when.tzinfo is None:
            raise ValueError("Give the time zone too, such as Z or +02:00")


def _schema_errors(
    schema: Mapping[str, Any], content: dict[str, Any], form: Form
) -> dict[str, str]:
    """What the schema says is wrong with ``content``, under the input of the property
    it is about (else the first input)."""
    blocks = {f.name: f.block_id for f in form.fields}
    first = next(iter(blocks.values()), None)
    try:
        found = validate(compile_schema(dict(schema)), content)
    except SchemaProblem as exc:
        return {first: str(exc)[:300]} if first else {}
    errors: dict[str, str] = {}
    for error in found:
        name = str(error.path[0]) if error.path else ""
        block = blocks.get(name, first)
        if block is None:
            continue
        text = _said(error.message)
        errors[block] = f"{errors[block]}; {text}" if block in errors else text
    return errors


def _said(message: str) -> str:
    """jsonschema's message, without quoting a whole long value."""
    return message if len(message) <= 200 else message[:199] + "…"
