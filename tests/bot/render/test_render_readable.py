"""A tool's title and its result as text people read (issue 15 §7)."""

from __future__ import annotations

import json

import pytest

from bot.render.readable import (
    MAX_ITEMS,
    MAX_LINES,
    arguments_text,
    content,
    inline,
    result_lines,
    result_text,
    same_words,
    tool_title,
)


@pytest.mark.parametrize(
    ("name", "title"),
    [
        ("mcp__catalog__scale_service", "Scale service"),
        ("mcp__my_srv__list_services", "List services"),
        ("check_health", "Check health"),
        ("deploy", "Deploy"),
        ("restart-service", "Restart service"),
        ("listServices", "List services"),
        ("get_API_key", "Get API key"),
        ("___", "___"),
    ],
)
def test_a_tool_without_a_title_is_called_by_its_name_as_words(name: str, title: str) -> None:
    assert tool_title(name) == title


def test_a_given_title_wins_on_one_line() -> None:
    assert tool_title("mcp__catalog__scale_service", "Scale a\nservice ") == "Scale a service"
    assert tool_title("deploy", "  ") == "Deploy"


def test_same_words_tells_a_name_spelled_as_words_from_a_title_of_its_own() -> None:
    assert same_words("check_health", "Check health")
    assert not same_words("mcp__catalog__scale_service", "Scale service")
    assert not same_words("deploy", "Ship it")


def test_mcp_text_is_unwrapped_and_the_json_in_it_parsed() -> None:
    doc = {"services": [{"service": "api", "replicas": 3}]}
    assert content({"text": json.dumps(doc)}) == (doc, [])
    # Structured content is the same data already parsed: it wins over the text.
    assert content({"text": "ignored", "structured": {"a": 1}}) == ({"a": 1}, [])
    assert content({"text": "plain words"}) == ("plain words", [])
    assert content({"text": "{not json"}) == ("{not json", [])
    assert content('["a", "b"]') == (["a", "b"], [])


def test_a_dict_that_is_not_mcp_shaped_is_kept() -> None:
    value = {"text": "hi", "status": "ok"}
    assert content(value) == (value, [])


def test_a_small_object_is_key_value_lines() -> None:
    out = {"service": "api", "healthy": True, "latency_ms": 12.5, "owner": None}
    assert result_lines(out) == ["service: api", "healthy: yes", "latency_ms: 12.5", "owner: none"]


def test_nested_objects_and_lists_read_on_their_line() -> None:
    out = {"checks": {"db": "ok", "cache": {"hit": 0.9}}, "tags": ["a", "b"], "none": []}
    assert result_lines(out) == [
        "checks: (db: ok, cache: (hit: 0.9))",
        "tags: a, b",
        "none: none",
    ]


def test_rows_are_bullets_and_a_long_list_says_how_many_more() -> None:
    rows = [{"service": f"s{i}", "replicas": i} for i in range(MAX_ITEMS + 3)]
    lines = result_lines({"services": rows}, max_lines=20)
    assert lines[:2] == ["services:", "• service: s0, replicas: 0"]
    assert lines[-1] == "and 3 more"
    assert len(lines) == 1 + MAX_ITEMS + 1
    assert inline(list(range(20))) == "0, 1, 2, 3, 4 and 15 more"


def test_a_result_has_at_most_max_lines() -> None:
    out = {f"k{i}": i for i in range(50)}
    lines = result_lines(out)
    assert len(lines) == MAX_LINES and lines[-1] == "…"
    text = result_text("line\n" * 100)
    assert text.count("\n") == MAX_LINES - 1


def test_deep_values_are_cut_compact_json() -> None:
    deep = {"a": {"b": {"c": {"d": {"e": "x" * 500}}}}}
    [line] = result_lines(deep)
    assert line.startswith("a: (b: (c: (d: {") and line.endswith("…)))")
    assert len(line) < 200


def test_nothing_shows_nothing() -> None:
    for value in (None, {}, "", {"text": ""}):
        assert result_text(value) == ""


def test_attachments_are_summarised_never_inlined() -> None:
    out = {
        "text": "the chart",
        "attachments": [{"type": "image", "mime_type": "image/png", "bytes": 12_345}],
    }
    assert result_lines(out) == ["the chart", "1 attachment: image (image/png, 12 kB)"]


def test_arguments_are_one_line() -> None:
    args = {"service": "api", "replicas": 6, "simulate_crash": True, "note": "a\nb"}
    assert arguments_text(args) == "service: api, replicas: 6, simulate_crash: yes, note: a b"
    assert arguments_text({}) == ""
    assert arguments_text({"spec": {"env": "prod"}}) == "spec: (env: prod)"


def test_text_is_plain_not_escaped() -> None:
    # The renderers escape; escaping here too would show "&amp;lt;".
    assert result_text({"text": "<!channel> & co"}) == "<!channel> & co"
