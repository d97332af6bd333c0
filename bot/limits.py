"""Slack's limits on Block Kit, and :func:`check_limits`, which lists violations.

The limits come from the block, element and view references
(https://docs.slack.dev/reference/block-kit/blocks). The renderers of :mod:`bot.render`
keep within them; the tests run :func:`check_limits` on every renderer with oversized
inputs.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bot.mrkdwn import slack_len

Block = dict[str, Any]

# Slack's limits, in one place (block, element and view references on docs.slack.dev).
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
MAX_TEXT = 3000  # any text object, a section's text included
MAX_FIELD_TEXT = 2000
MAX_FIELDS = 10
MAX_HEADER_TEXT = 150
MAX_CONTEXT_ELEMENTS = 10
MAX_ACTIONS_ELEMENTS = 25
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2000
MAX_URL = 3000
MAX_ID = 255  # action_id, block_id, callback_id
MAX_CONFIRM = {"title": 100, "text": 300, "confirm": 30, "deny": 30}
MAX_VIEW_TITLE = 24  # and submit, close
MAX_PRIVATE_METADATA = 3000
MAX_INPUT_LABEL = 2000
MAX_INPUT_HINT = 2000
MAX_INPUT_LENGTH = 3000  # a plain_text_input's value and initial_value
MAX_PLACEHOLDER = 150
MAX_SELECT_OPTIONS = 100  # a static_select's
MAX_CHECKBOX_OPTIONS = 10
MAX_OPTION_TEXT = 75
MAX_OPTION_VALUE = 150
MAX_FALLBACK_TEXT = 3000


def check_limits(blocks_or_view: Sequence[Block] | dict[str, Any]) -> list[str]:
    """Every violation of Slack's limits in a message's blocks or in a view (modal)."""
    problems: list[str] = []
    if isinstance(blocks_or_view, dict):
        view = blocks_or_view
        blocks = view.get("blocks") or []
        _check_view(view, problems)
        if not 0 < len(blocks) <= MAX_VIEW_BLOCKS:
            problems.append(f"view: {len(blocks)} blocks, 1 to {MAX_VIEW_BLOCKS}")
    else:
        blocks = list(blocks_or_view)
        if len(blocks) > MAX_MESSAGE_BLOCKS:
            problems.append(f"message: {len(blocks)} blocks > {MAX_MESSAGE_BLOCKS}")
    seen: set[str] = set()
    for i, block in enumerate(blocks):
        where = f"blocks[{i}]"
        block_id = block.get("block_id")
        if block_id is not None:
            _length(problems, f"{where}.block_id", block_id, MAX_ID)
            if block_id in seen:
                problems.append(f"{where}.block_id: duplicate {block_id!r}")
            seen.add(block_id)
        _check_block(block, where, problems)
    return problems


def _length(problems: list[str], where: str, text: Any, limit: int) -> None:
    if not isinstance(text, str):
        problems.append(f"{where}: not a string")
    elif not text:
        problems.append(f"{where}: empty")
    elif slack_len(text) > limit:
        problems.append(f"{where}: {slack_len(text)} characters > {limit}")


def _text(problems: list[str], where: str, obj: Any, limit: int, plain: bool = False) -> None:
    if not isinstance(obj, dict) or obj.get("type") not in ("plain_text", "mrkdwn"):
        problems.append(f"{where}: not a text object")
        return
    if plain and obj["type"] != "plain_text":
        problems.append(f"{where}: must be plain_text")
    _length(problems, f"{where}.text", obj.get("text"), limit)


def _check_block(block: Block, where: str, problems: list[str]) -> None:
    kind = block.get("type")
    if kind == "section":
        if "text" not in block and "fields" not in block:
            problems.append(f"{where}: a section needs text or fields")
        if "text" in block:
            _text(problems, f"{where}.text", block["text"], MAX_TEXT)
        fields = block.get("fields") or []
        if len(fields) > MAX_FIELDS:
            problems.append(f"{where}.fields: {len(fields)} > {MAX_FIELDS}")
        for j, field in enumerate(fields):
            _text(problems, f"{where}.fields[{j}]", field, MAX_FIELD_TEXT)
        if "accessory" in block:
            _check_element(block["accessory"], f"{where}.accessory", problems)
    elif kind == "header":
        _text(problems, f"{where}.text", block.get("text"), MAX_HEADER_TEXT, plain=True)
    elif kind == "context":
        elements = block.get("elements") or []
        if not 0 < len(elements) <= MAX_CONTEXT_ELEMENTS:
            problems.append(f"{where}.elements: {len(elements)}, 1 to {MAX_CONTEXT_ELEMENTS}")
        for j, element in enumerate(elements):
            if element.get("type") in ("plain_text", "mrkdwn"):
                _text(problems, f"{where}.elements[{j}]", element, MAX_TEXT)
    elif kind == "actions":
        elements = block.get("elements") or []
        if not 0 < len(elements) <= MAX_ACTIONS_ELEMENTS:
            problems.append(f"{where}.elements: {len(elements)}, 1 to {MAX_ACTIONS_ELEMENTS}")
        ids = [e.get("action_id") for e in elements if e.get("action_id")]
        if len(ids) != len(set(ids)):
            problems.append(f"{where}.elements: duplicate action_id")
        for j, element in enumerate(elements):
            _check_element(element, f"{where}.elements[{j}]", problems)
    elif kind == "input":
        _text(problems, f"{where}.label", block.get("label"), MAX_INPUT_LABEL, plain=True)
        if "hint" in block:
            _text(problems, f"{where}.hint", block["hint"], MAX_INPUT_HINT, plain=True)
        _check_element(block.get("element") or {}, f"{where}.element", problems)
    elif kind != "divider":
        problems.append(f"{where}: block type {kind!r} is not checked here")


def _check_element(element: dict[str, Any], where: str, problems: list[str]) -> None:
    kind = element.get("type")
    if "action_id" in element:
        _length(problems, f"{where}.action_id", element["action_id"], MAX_ID)
    if kind == "button":
        _text(problems, f"{where}.text", element.get("text"), MAX_BUTTON_TEXT, plain=True)
        if "value" in element:
            _length(problems, f"{where}.value", element["value"], MAX_BUTTON_VALUE)
        if "url" in element:
            _length(problems, f"{where}.url", element["url"], MAX_URL)
        if element.get("style") not in (None, "primary", "danger"):
            problems.append(f"{where}.style: {element.get('style')!r}")
        if "confirm" in element:
            confirm = element["confirm"]
            for key, limit in MAX_CONFIRM.items():
                plain = key != "text"
                _text(problems, f"{where}.confirm.{key}", confirm.get(key), limit, plain)
    elif kind == "plain_text_input":
        max_length = element.get("max_length")
        if max_length is not None and not 0 < max_length <= MAX_INPUT_LENGTH:
            problems.append(f"{where}.max_length: {max_length}, 1 to {MAX_INPUT_LENGTH}")
        if "placeholder" in element:
            _text(problems, f"{where}.placeholder", element["placeholder"], MAX_PLACEHOLDER)
        initial = element.get("initial_value")
        most = max_length or MAX_INPUT_LENGTH
        if initial is not None and (not isinstance(initial, str) or slack_len(initial) > most):
            problems.append(f"{where}.initial_value: not a string of at most {most} characters")
    elif kind in ("static_select", "checkboxes"):
        _check_options(element, where, problems)
    else:
        problems.append(f"{where}: element type {kind!r} is not checked here")


def _check_options(element: dict[str, Any], where: str, problems: list[str]) -> None:
    """A static_select's or checkboxes' options, and the ones it starts with."""
    select = element.get("type") == "static_select"
    options = element.get("options") or []
    most = MAX_SELECT_OPTIONS if select else MAX_CHECKBOX_OPTIONS
    if not 0 < len(options) <= most:
        problems.append(f"{where}.options: {len(options)}, 1 to {most}")
    values = []
    for j, option in enumerate(options):
        _text(problems, f"{where}.options[{j}].text", option.get("text"), MAX_OPTION_TEXT, select)
        _length(problems, f"{where}.options[{j}].value", option.get("value"), MAX_OPTION_VALUE)
        values.append(option.get("value"))
    if len(values) != len(set(values)):
        problems.append(f"{where}.options: duplicate value")
    initial = [element["initial_option"]] if "initial_option" in element else []
    initial += element.get("initial_options") or []
    if any(option not in options for option in initial):
        problems.append(f"{where}: an initial option is not one of its options")
    if "placeholder" in element:
        _text(problems, f"{where}.placeholder", element["placeholder"], MAX_PLACEHOLDER, True)


def _check_view(view: dict[str, Any], problems: list[str]) -> None:
    if view.get("type") not in ("modal", "home"):
        problems.append(f"view.type: {view.get('type')!r}")
    if view.get("type") == "modal":
        _text(problems, "view.title", view.get("title"), MAX_VIEW_TITLE, plain=True)
    for key in ("submit", "close"):
        if key in view:
            _text(problems, f"view.{key}", view[key], MAX_VIEW_TITLE, plain=True)
    if "private_metadata" in view:
        metadata = view["private_metadata"]
        if not isinstance(metadata, str) or slack_len(metadata) > MAX_PRIVATE_METADATA:
            problems.append(f"view.private_metadata: over {MAX_PRIVATE_METADATA} characters")
    if "callback_id" in view:
        _length(problems, "view.callback_id", view["callback_id"], MAX_ID)
