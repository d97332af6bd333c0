"""``/opsloop grants`` and the line of a call a standing grant approved (issue 17 §4):
what they say, within Slack's limits."""

from __future__ import annotations

import json

import pytest

from bot import limits
from bot.render.grants import (
    GRANTS_SHOWN,
    REVOKE_ACTION,
    grants_message,
    parse_revoke_value,
    revoke_value,
)
from bot.render.lines import granted_line
from tests.bot.render.support import LATER, REVIEWER, THREAD, all_text, grant_rows, requested


def test_a_grant_is_listed_with_its_tool_arguments_reviewer_end_and_a_revoke_button() -> None:
    [row] = grant_rows("api", "restart", 2)[1:]
    row = row._replace(reviewer=REVIEWER, link="https://x.slack.com/archives/C1/p1")
    text, blocks = grants_message([row])
    assert text == "*Standing grants live in this channel* (1)"
    listed = blocks[1]
    assert '*restart* `{"x":"api"}`' in listed["text"]["text"]
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
    assert text.startswith('🔧 *restart* `{"name":"api"}` · approved by')
    assert f"<@{REVIEWER}>'s grant until <!date^" in text
    assert limits.check_limits(blocks) == []
