"""``/opsloop grants``, the line of a call a standing grant approved, the "Approve for
1 h" modal and the card a grant closed (issue 17 §4): what they say and read back,
within Slack's limits."""

from __future__ import annotations

import json

import pytest

from bot import limits
from bot.render.approval import decided_card
from bot.render.grants import (
    EXACT_BLOCK,
    GRANT_CALLBACK,
    GRANTS_SHOWN,
    REVOKE_ACTION,
    SCOPE_BLOCK,
    SPAN_BLOCK,
    grant_modal,
    grants_message,
    parse_revoke_value,
    read_grant,
    revoke_value,
)
from bot.render.lines import granted_line
from engine import events as ev
from engine.grants import ANY, GrantAsk, grant_terms
from tests.bot.render.support import (
    EVIL,
    LATER,
    REVIEWER,
    THREAD,
    all_text,
    card_inputs,
    grant_rows,
    requested,
)


def test_a_grant_is_listed_with_its_tool_arguments_reviewer_end_and_a_revoke_button() -> None:
    [row] = grant_rows("api", "restart", 2)[1:]
    row = row._replace(reviewer=REVIEWER, link="https://x.slack.com/archives/C1/p1")
    text, blocks = grants_message([row])
    assert text == "*Standing grants live in this channel* (1)"
    listed = blocks[1]
    assert "*restart* x: `api`" in listed["text"]["text"]
    assert f"by <@{REVIEWER}> until <!date^" in listed["text"]["text"]
    assert "<https://x.slack.com/archives/C1/p1|open thread>" in listed["text"]["text"]
    revoke = listed["accessory"]
    assert (revoke["action_id"], revoke["style"], revoke["text"]["text"]) == (
        REVOKE_ACTION,
        "danger",
        "Revoke",
    )
    assert revoke["confirm"]["confirm"]["text"] == "Revoke"
    assert parse_revoke_value(revoke["value"]) == (THREAD, "grant_0001")
    assert limits.check_limits(blocks) == []


def test_a_link_that_is_not_a_permalink_is_not_linked() -> None:
    [row] = grant_rows("api", "restart", 1)
    _, blocks = grants_message([row._replace(link="javascript:alert(1)|x")])
    assert "javascript" not in json.dumps(blocks) and f"`{THREAD}`" in all_text(blocks)


def test_many_grants_are_cut_within_slacks_limits() -> None:
    _, blocks = grants_message(grant_rows(n=GRANTS_SHOWN + 7))
    assert len(blocks) == GRANTS_SHOWN + 2 and "and 7 more" in all_text(blocks)
    assert limits.check_limits(blocks) == []


def test_no_live_grants() -> None:
    text, blocks = grants_message([])
    assert text == "No standing grants are live in this channel." and len(blocks) == 1


@pytest.mark.parametrize("value", ["", "thr_1", " grant_1", "thr_1 a b"])
def test_a_forged_revoke_value_is_refused(value: str) -> None:
    with pytest.raises(ValueError):
        parse_revoke_value(value)


def test_revoke_value_round_trips() -> None:
    assert parse_revoke_value(revoke_value(THREAD, "grant_1")) == (THREAD, "grant_1")


def test_the_line_of_a_call_a_grant_approved_says_whose_grant_and_until_when() -> None:
    blocks = granted_line(requested("restart", {"name": "api"}), REVIEWER, LATER)
    text = all_text(blocks)
    assert text.startswith("🔧 *Restart* · name: api · approved by")
    assert f"<@{REVIEWER}>'s grant until <!date^" in text
    assert limits.check_limits(blocks) == []


# --- the "Approve for 1 h" modal and the card it closes -------------------------------------


def modal(arguments: dict | None = None, max_grant_s: float = 8 * 3600) -> dict:
    return grant_modal(
        thread_id=THREAD,
        tool_call_id="toolu_1",
        arguments_hash="h" * 32,
        tool_name="deploy",
        arguments={"service": "api", "environment": "staging"} if arguments is None else arguments,
        max_grant_s=max_grant_s,
    )


def inputs(view: dict) -> dict[str, dict]:
    return {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}


def as_sent(view: dict, **picked: object) -> dict:
    """``state.values`` as Slack sends the modal: as it opened, but for ``picked``."""
    values = {}
    for block_id, element in inputs(view).items():
        if element["type"] == "static_select":
            value = picked.get(block_id, element["initial_option"]["value"])
            state = {"type": "static_select", "selected_option": {"value": value}}
        else:
            ticked = picked.get(block_id, [o["value"] for o in element["initial_options"]])
            state = {"type": "checkboxes", "selected_options": [{"value": v} for v in ticked]}
        values[block_id] = {element["action_id"]: state}
    return values


def test_the_modal_starts_at_the_one_click_grant_within_slacks_limits() -> None:
    view = modal()
    assert view["callback_id"] == GRANT_CALLBACK and view["submit"]["text"] == "Approve"
    found = inputs(view)
    assert found[SPAN_BLOCK]["initial_option"]["value"] == "3600"
    assert [o["value"] for o in found[SPAN_BLOCK]["options"]] == [
        "900",
        "3600",
        "14400",
        "28800",
    ]
    assert found[SCOPE_BLOCK]["initial_option"]["value"] == "thread"
    assert [o["value"] for o in found[EXACT_BLOCK]["initial_options"]] == [
        "service",
        "environment",
    ]
    assert limits.check_limits(view) == []
    assert read_grant(as_sent(view), {"service": "api", "environment": "staging"}, 8 * 3600) == (
        GrantAsk(seconds=3600, scope="thread", exact=frozenset({"service", "environment"}))
    )


def test_the_spans_end_at_a_shorter_max_grant() -> None:
    found = inputs(modal(max_grant_s=1200))
    assert [o["value"] for o in found[SPAN_BLOCK]["options"]] == ["900", "1200"]
    assert found[SPAN_BLOCK]["initial_option"]["value"] == "1200"


def test_a_reviewer_may_let_arguments_vary_and_grant_the_channel() -> None:
    args = {"service": "api", "environment": "staging"}
    sent = as_sent(modal(), **{SCOPE_BLOCK: "channel", EXACT_BLOCK: ["environment"]})
    asked = read_grant(sent, args, 8 * 3600)
    assert asked == GrantAsk(seconds=3600, scope="channel", exact=frozenset({"environment"}))
    assert isinstance(asked, GrantAsk)
    assert grant_terms(asked.schema(args)) == {"service": ANY, "environment": "staging"}


@pytest.mark.parametrize(
    ("picked", "block"),
    [({SPAN_BLOCK: "999999"}, SPAN_BLOCK), ({SCOPE_BLOCK: "workspace"}, SCOPE_BLOCK)],
)
def test_a_forged_choice_is_an_error_under_its_input(picked: dict, block: str) -> None:
    errors = read_grant(as_sent(modal(), **picked), {"service": "api"}, 8 * 3600)
    assert isinstance(errors, dict) and list(errors) == [block]


def test_hostile_argument_names_and_values_are_escaped_and_many_stay_exact() -> None:
    args = {f"{EVIL}{i}": EVIL for i in range(14)}
    view = modal(args)
    assert limits.check_limits(view) == []
    options = inputs(view)[EXACT_BLOCK]["options"]
    shown = json.dumps([o["text"] for o in options]) + all_text(view["blocks"])
    assert "<!channel>" not in shown and "<@U999>" not in shown  # values are not shown
    assert len(options) == limits.MAX_CHECKBOX_OPTIONS
    assert "Other arguments must stay exactly as they are." in all_text(view["blocks"])
    asked = read_grant(as_sent(view, **{EXACT_BLOCK: []}), args, 8 * 3600)
    assert isinstance(asked, GrantAsk) and asked.exact == frozenset(list(args)[10:])


def test_a_call_without_arguments_has_no_checkboxes() -> None:
    view = modal({})
    assert EXACT_BLOCK not in inputs(view)
    assert read_grant(as_sent(view), {}, 3600) == GrantAsk(3600, "thread", frozenset())


@pytest.mark.parametrize(
    ("exact", "scope", "said"),
    [
        (None, "thread", "with these exact arguments in this thread until <!date^"),
        (frozenset({"environment"}), "channel", "with any `service` and the rest as now in any"),
    ],
)
def test_the_card_a_grant_closed_says_what_it_lets_through(exact, scope, said) -> None:
    args = {"service": "api", "environment": "staging"}
    ask = GrantAsk(scope=scope, exact=exact)
    created = ev.GrantCreated(
        thread_id=THREAD,
        actor=REVIEWER,
        grant_id="grant_1",
        tool="deploy",
        arguments_schema=ask.schema(args),
        scope=scope,
        until=LATER,
        reviewer=REVIEWER,
    )
    blocks = decided_card(**card_inputs(), outcome="approved", by=REVIEWER, at=LATER, grant=created)
    text = all_text(blocks)
    assert f"<@{REVIEWER}> also granted calls of *deploy* {said}" in text
    assert limits.check_limits(blocks) == []


def test_a_channel_grant_that_lets_an_argument_vary_is_listed_so() -> None:
    [row] = grant_rows("api", "restart", 1)
    schema = GrantAsk(exact=frozenset()).schema({"name": "api"})
    _, blocks = grants_message([row._replace(schema=schema, scope="channel")])
    assert "name: _any_" in all_text(blocks) and "whole channel" in all_text(blocks)
