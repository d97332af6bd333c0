"""An MCP server's question in Slack: the thread's message with its buttons, the modal
built from the requested schema (every kind MCP allows, within Slack's limits, hostile
text escaped), and the submission read back, checked, with the defaults filled in."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from bot import limits
from bot.render import lines
from bot.render.elicitation import (
    ANSWER_ACTION,
    CANCEL_ACTION,
    DECLINE_ACTION,
    FORM_CALLBACK,
    OPEN_ACTION,
    form_modal,
    form_of,
    parse_ask,
    question_blocks,
    read_form,
)
from engine import events as ev
from tests.bot.render.support import (
    EVIL,
    LATER,
    NOW,
    REQUESTER,
    THREAD,
    WEIRD,
    assert_safe,
    sdk_validate,
    text_objects,
)
from tests.support.mcp_servers import ASK_SCHEMA
from tools.mcp.elicitation import Question, fill_defaults, question_of

WAIT = f"{THREAD}.0123456789abcdef"

# Every kind of property MCP's restricted schema allows.
EVERY_KIND: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2, "maxLength": 20},
        "email": {"type": "string", "format": "email"},
        "site": {"type": "string", "format": "uri"},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "count": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "ok": {"type": "boolean", "default": True},
        "color": {"type": "string", "enum": ["red", "green"]},
        "legacy": {"type": "string", "enum": ["a", "b"], "enumNames": ["Alpha", "Beta"]},
        "env": {
            "type": "string",
            "oneOf": [{"const": "stg", "title": "Staging"}, {"const": "prd", "title": "Prod"}],
        },
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["x", "y", "z"]},
            "minItems": 1,
            "default": ["x"],
        },
        "zone": {"type": "string", "enum": [f"z{i}" for i in range(150)]},
    },
    "required": ["name", "env"],
}


def question(schema: dict[str, Any] | None = None, **kw: Any) -> Question:
    fields = {
        "kind": "input_required",
        "mode": "form",
        "message": "Which deploy?",
        "server": "demo",
        "tool": "mcp__demo__ask",
        "schema": EVERY_KIND if schema is None else schema,
        "request_state": "s1",
    }
    return Question(**{**fields, **kw})


def wait_started(q: Question) -> ev.WaitStarted:
    return ev.WaitStarted(
        thread_id=THREAD,
        tool_call_id="toolu_1",
        wait_id=WAIT,
        description="an answer to the question mcp__demo__ask asked",
        data=q.data(),
        wake_at=LATER,
        timeout_at=LATER,
        resumes=True,
    )


def buttons(blocks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["action_id"]: e for b in blocks if b["type"] == "actions" for e in b["elements"]}


def inputs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The modal's input blocks by their label."""
    return {b["label"]["text"]: b for b in view["blocks"] if b["type"] == "input"}


def submitted(view: dict[str, Any], by_label: dict[str, Any]) -> dict[str, Any]:
    """``view.state.values`` as Slack sends them: a text, an option index, or a list of
    option indexes, by input label."""
    values: dict[str, Any] = {}
    for label, block in inputs(view).items():
        element, given = block["element"], by_label.get(label)
        if element["type"] == "plain_text_input":
            state: dict[str, Any] = {"type": "plain_text_input", "value": given}
        elif element["type"] == "static_select":
            chosen = next((o for o in element["options"] if o["value"] == given), None)
            state = {"type": "static_select", "selected_option": chosen}
        else:
            ticked = [o for o in element["options"] if o["value"] in (given or [])]
            state = {"type": "checkboxes", "selected_options": ticked}
        values[block["block_id"]] = {"value": state}
    return values


# --- the question ------------------------------------------------------------------------


def test_the_question_pings_the_requester_with_answer_decline_and_cancel() -> None:
    blocks = question_blocks(wait_started(question()), requester=REQUESTER)
    assert blocks is not None and limits.check_limits(blocks) == []
    sdk_validate(blocks)
    text = json.dumps(blocks)
    assert f"<@{REQUESTER}>" in text and "Which deploy?" in text and "<!date^" in text
    assert "Only <@" in text
    found = buttons(blocks)
    assert list(found) == [ANSWER_ACTION, DECLINE_ACTION, CANCEL_ACTION]
    assert {parse_ask(b["value"]) for b in found.values()} == {(THREAD, WAIT)}
    # The line renderer shows a question with its buttons, any other wait as before.
    assert lines.event_line(wait_started(question()), requester=REQUESTER) == blocks


def test_a_classic_question_says_the_session_stays_open_until_its_deadline() -> None:
    blocks = question_blocks(wait_started(question(kind="classic", ask_id="a1")), requester=None)
    assert blocks is not None
    text = " ".join(text_objects(blocks))
    assert "The MCP session stays open while it waits" in text and "Only" not in text


def test_an_ordinary_wait_is_no_question() -> None:
    plain_wait = wait_started(question()).model_copy(update={"data": {"run": 1}})
    assert question_blocks(plain_wait, requester=REQUESTER) is None
    assert question_of({"elicitation": {"kind": "other"}}) is None


def test_url_mode_is_a_link_button_to_an_http_page_only() -> None:
    q = question(mode="url", schema={}, url="https://auth.example/consent?s=1")
    blocks = question_blocks(wait_started(q), requester=REQUESTER)
    assert blocks is not None
    found = buttons(blocks)
    assert found[OPEN_ACTION]["url"] == "https://auth.example/consent?s=1"
    assert ANSWER_ACTION not in found and "auth.example" in json.dumps(blocks)
    for bad in ("javascript:alert(1)", "https://x.example/<!channel>", "file:///etc/passwd"):
        blocks = question_blocks(wait_started(question(mode="url", url=bad)), requester=None)
        assert blocks is not None and OPEN_ACTION not in buttons(blocks)
        assert "not an http(s) URL" in json.dumps(blocks)


def test_a_form_slack_cannot_show_offers_only_decline_and_cancel() -> None:
    nested = {
        "type": "object",
        "properties": {"where": {"type": "object", "properties": {"x": {"type": "string"}}}},
        "required": ["where"],
    }
    q = question(nested)
    blocks = question_blocks(wait_started(q), requester=REQUESTER)
    assert blocks is not None and ANSWER_ACTION not in buttons(blocks)
    assert form_modal(THREAD, WAIT, q) is None
    # Not required, it is only left out.
    assert form_of({**nested, "required": []}).answerable


@pytest.mark.parametrize("text", [EVIL, WEIRD * 300, "<" * 5000, ""])
def test_hostile_or_huge_server_text_is_escaped_and_within_limits(text: str) -> None:
    schema = {
        "type": "object",
        "properties": {
            f"p{i}{text[:100]}": {
                "type": "string",
                "title": text,
                "description": text,
                **({"enum": [text[:10] + str(j) for j in range(3)]} if i % 2 else {}),
                "default": text,
            }
            for i in range(120)  # more than a modal holds
        },
    }
    q = question(schema, message=text, tool=text[:200] or "t")
    renderings = [
        question_blocks(wait_started(q), requester=REQUESTER),
        question_blocks(wait_started(question(mode="url", message=text)), requester=None),
        form_modal(THREAD, WAIT, q),
    ]
    for rendering in renderings:
        assert rendering is not None
        assert limits.check_limits(rendering) == []
        sdk_validate(rendering)
        for shown in text_objects(rendering):
            assert_safe(shown)
        # Only an input's own value (a default the person may edit) holds it as it is.
        dumped = json.dumps(rendering).replace(json.dumps(text)[1:-1], "")
        assert "<!channel>" not in dumped and "<@U999>" not in dumped


# --- the modal ---------------------------------------------------------------------------


def test_the_modal_has_one_input_per_property_as_slack_takes_it() -> None:
    view = form_modal(THREAD, WAIT, question())
    assert view is not None and limits.check_limits(view) == []
    sdk_validate(view)
    assert view["callback_id"] == FORM_CALLBACK
    assert parse_ask(view["private_metadata"]) == (THREAD, WAIT)
    got = inputs(view)
    assert got["Name"]["element"]["max_length"] == 20 and got["Name"]["element"]["min_length"] == 2
    assert not got["Name"]["optional"] and not got["env"]["optional"] and got["color"]["optional"]
    assert "email address" in got["email"]["hint"]["text"]
    assert "YYYY-MM-DD" in got["day"]["hint"]["text"]
    assert got["count"]["element"]["initial_value"] == "2"
    assert got["count"]["hint"]["text"] == "A whole number from 1 to 5"
    ok = got["ok"]["element"]
    assert ok["type"] == "static_select" and ok["initial_option"]["text"]["text"] == "Yes"
    env = got["env"]["element"]
    assert [o["text"]["text"] for o in env["options"]] == ["Staging", "Prod"]
    assert [o["text"]["text"] for o in got["legacy"]["element"]["options"]] == ["Alpha", "Beta"]
    tags = got["tags"]["element"]
    assert tags["type"] == "checkboxes" and [o["value"] for o in tags["initial_options"]] == ["0"]
    assert got["zone"]["element"]["type"] == "plain_text_input"  # 150 choices: typed


# --- the submission ----------------------------------------------------------------------


def test_a_filled_form_reads_back_typed_with_defaults_filled_in() -> None:
    view = form_modal(THREAD, WAIT, question())
    assert view is not None
    values = submitted(
        view,
        {
            "Name": "bob",
            "env": "1",
            "ratio": "0.5",
            "at": "2026-05-01T14:30:00Z",
            "zone": "z42",
            "tags": ["1", "2"],
        },
    )
    read = read_form(EVERY_KIND, values)
    assert read.errors == {}
    assert read.content == {
        "name": "bob",
        "env": "prd",
        "ratio": 0.5,
        "at": "2026-05-01T14:30:00Z",
        "zone": "z42",
        "tags": ["y", "z"],
        "count": 2,  # left as it opened: its default
        "ok": True,
    }


def test_omitted_fields_get_their_schema_defaults_sep1034() -> None:
    """The conformance scenario elicitation-sep1034-client-defaults: accepting a form
    applies the defaults of what was left out."""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive"], "default": "active"},
            "verified": {"type": "boolean", "default": True},
        },
    }
    assert fill_defaults(schema, {"age": 41}) == {
        "name": "John Doe",
        "age": 41,
        "score": 95.5,
        "status": "active",
        "verified": True,
    }
    view = form_modal(THREAD, WAIT, question(schema))
    assert view is not None
    empty = {
        b["block_id"]: {"value": {"type": "plain_text_input", "value": None}}
        for b in view["blocks"]
        if b["type"] == "input"
    }
    assert read_form(schema, empty).content["name"] == "John Doe"


def test_what_is_wrong_is_said_under_its_input_and_nothing_is_read() -> None:
    view = form_modal(THREAD, WAIT, question())
    assert view is not None
    by_label = {
        "Name": "b",  # shorter than minLength
        "email": "not-an-email",
        "day": "2026-13-45",
        "at": "2026-05-01T14:30:00",  # no time zone
        "count": "9",  # above maximum
        "ratio": "lots",
        "zone": "nowhere",
    }
    read = read_form(EVERY_KIND, submitted(view, by_label))
    blocks = {label: b["block_id"] for label, b in inputs(view).items()}
    assert set(read.errors) == {blocks[k] for k in ("email", "day", "at", "ratio", "zone", "env")}
    assert read.errors[blocks["env"]] == "Required"
    # Once those are right, the schema's own checks speak, under their inputs.
    fixed = {**by_label, "email": "a@b.example", "day": "2026-05-01", "at": "2026-05-01T14:30:00Z"}
    fixed |= {"ratio": "0.5", "zone": "z1", "env": "0"}
    read = read_form(EVERY_KIND, submitted(view, fixed))
    assert set(read.errors) == {blocks["Name"], blocks["count"]}
    assert "short" in read.errors[blocks["Name"]] and "5" in read.errors[blocks["count"]]


def test_a_forged_option_is_refused() -> None:
    view = form_modal(THREAD, WAIT, question(ASK_SCHEMA))
    assert view is not None
    values = submitted(view, {"Name": "bob", "env": "0"})
    env_block = inputs(view)["env"]["block_id"]
    values[env_block]["value"]["selected_option"] = {"value": "7", "text": {"text": "x"}}
    assert read_form(ASK_SCHEMA, values).errors == {env_block: "Choose one of the options"}


def test_an_empty_form_is_a_plain_yes() -> None:
    q = question({"type": "object", "properties": {}})
    view = form_modal(THREAD, WAIT, q)
    assert view is not None and limits.check_limits(view) == []
    assert (
        read_form(q.schema, {}) == read_form(q.schema, {}) and read_form(q.schema, {}).errors == {}
    )


def test_the_deadline_shown_is_the_waits() -> None:
    e = wait_started(question()).model_copy(update={"timeout_at": NOW + timedelta(minutes=10)})
    blocks = question_blocks(e, requester=REQUESTER)
    assert blocks is not None and "<!date^" + str(int(e.timeout_at.timestamp())) in json.dumps(
        blocks
    )
