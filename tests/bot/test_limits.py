"""Slack's limits on Block Kit: ``check_limits`` names each violation."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from bot import limits
from tests.bot.render.support import RENDERERS


def button(**kw: Any) -> dict[str, Any]:
    return {
        "type": "button",
        "text": {"type": "plain_text", "text": kw.pop("text", "ok")},
        "action_id": kw.pop("action_id", "a"),
        **kw,
    }


def option(value: str, text: str | None = None) -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": text or value}, "value": value}


def select(n: int, *, value: str | None = None, text: str | None = None) -> dict[str, Any]:
    options = [option(value or f"v{i}", text) for i in range(n)]
    return {"type": "static_select", "action_id": "s", "options": options}


def modal_input(element: dict[str, Any], hint: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "input",
        "label": {"type": "plain_text", "text": "l"},
        "element": element,
    }
    if hint is not None:
        block["hint"] = {"type": "plain_text", "text": hint}
    return {"type": "modal", "title": {"type": "plain_text", "text": "t"}, "blocks": [block]}


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


@pytest.mark.parametrize(
    ("rendering", "problem"),
    [
        ([section("x")] * 51, "message: 51 blocks > 50"),
        ([section("x" * 3001)], "blocks[0].text.text: 3001 characters > 3000"),
        ([section("")], "blocks[0].text.text: empty"),
        (
            [{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}],
            "blocks[0].text.text: 151 characters > 150",
        ),
        (
            [{"type": "header", "text": {"type": "mrkdwn", "text": "h"}}],
            "blocks[0].text: must be plain_text",
        ),
        (
            [{"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 11}],
            "blocks[0].elements: 11, 1 to 10",
        ),
        (
            [{"type": "actions", "elements": [button(action_id=f"a{i}") for i in range(26)]}],
            "blocks[0].elements: 26, 1 to 25",
        ),
        (
            [{"type": "actions", "elements": [button(), button()]}],
            "blocks[0].elements: duplicate action_id",
        ),
        (
            [{"type": "actions", "elements": [button(text="b" * 76)]}],
            "blocks[0].elements[0].text.text: 76 characters > 75",
        ),
        (
            [{"type": "actions", "elements": [button(value="v" * 2001)]}],
            "blocks[0].elements[0].value: 2001 characters > 2000",
        ),
        (
            [{"type": "actions", "elements": [button(action_id="a" * 256)]}],
            "blocks[0].elements[0].action_id: 256 characters > 255",
        ),
        (
            [{"type": "actions", "elements": [button(style="green")]}],
            "blocks[0].elements[0].style: 'green'",
        ),
        ([section("x") | {"block_id": "b" * 256}], "blocks[0].block_id: 256 characters > 255"),
        (
            [section("x") | {"block_id": "b"}, section("y") | {"block_id": "b"}],
            "blocks[1].block_id: duplicate 'b'",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t" * 25},
                "blocks": [section("x")],
            },
            "view.title.text: 25 characters > 24",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t"},
                "blocks": [section("x")] * 101,
            },
            "view: 101 blocks, 1 to 100",
        ),
        (
            {
                "type": "modal",
                "title": {"type": "plain_text", "text": "t"},
                "blocks": [
                    {
                        "type": "input",
                        "label": {"type": "plain_text", "text": "l"},
                        "element": {
                            "type": "plain_text_input",
                            "action_id": "r",
                            "max_length": 3001,
                        },
                    }
                ],
            },
            "blocks[0].element.max_length: 3001, 1 to 3000",
        ),
        ([{"type": "video"}], "blocks[0]: block type 'video' is not checked here"),
        (modal_input(select(101)), "blocks[0].element.options: 101, 1 to 100"),
        (
            modal_input(select(2, value="v" * 151)),
            "blocks[0].element.options[0].value: 151 characters > 150",
        ),
        (
            modal_input(select(2, text="t" * 76)),
            "blocks[0].element.options[0].text.text: 76 characters > 75",
        ),
        (modal_input(select(2, value="same")), "blocks[0].element.options: duplicate value"),
        (
            modal_input(select(2) | {"initial_option": option("gone")}),
            "blocks[0].element: an initial option is not one of its options",
        ),
        (
            modal_input({"type": "checkboxes", "action_id": "c", "options": [option("o")] * 11}),
            "blocks[0].element.options: 11, 1 to 10",
        ),
        (
            modal_input(
                {
                    "type": "plain_text_input",
                    "action_id": "v",
                    "max_length": 5,
                    "initial_value": "123456",
                }
            ),
            "blocks[0].element.initial_value: not a string of at most 5 characters",
        ),
        (
            modal_input({"type": "plain_text_input", "action_id": "v"}, hint="h" * 2001),
            "blocks[0].hint.text: 2001 characters > 2000",
        ),
    ],
)
def test_check_limits_names_each_violation(rendering: Any, problem: str) -> None:
    assert problem in limits.check_limits(rendering)


def test_the_limits_live_in_bot_limits_and_the_moved_names_are_gone_from_the_renderers() -> None:
    names = [n for n in dir(limits) if n.startswith("MAX_")]
    assert len(names) == 24
    moved = {
        "MAX_ACTIONS_ELEMENTS",
        "MAX_FIELDS",
        "MAX_INPUT_LENGTH",
        "MAX_PRIVATE_METADATA",
        "MAX_URL",
        "MAX_VIEW_BLOCKS",
    }
    assert moved <= set(names)
    for name in RENDERERS:
        assert not [n for n in moved if hasattr(importlib.import_module(name), n)], name


def test_check_limits_counts_astral_characters_twice() -> None:
    assert limits.check_limits([section("𝕏" * 1500)]) == []
    assert limits.check_limits([section("𝕏" * 1501)]) == [
        "blocks[0].text.text: 3002 characters > 3000"
    ]
