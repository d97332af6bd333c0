"""JSON Schemas from outside never reach the network, read a file, loop or freeze."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema._keywords
import jsonschema._legacy_keywords
import jsonschema._utils
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.errors import ToolDefinitionError
from tools.schema_tool import schema_tool
from tools.schemas import (
    MAX_INSTANCE_BYTES,
    MAX_INSTANCE_DEPTH,
    SchemaProblem,
    compile_schema,
    is_valid,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]

# --- watching for I/O without patching anything: audit hooks ---------------------------------

_IO_EVENTS = ("socket.", "open", "urllib.", "subprocess.", "os.system", "http.client.")
_watch = threading.local()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    seen = getattr(_watch, "seen", None)
    if seen is not None and event.startswith(_IO_EVENTS):
        seen.append((event, repr(args)[:200]))


sys.addaudithook(_audit)  # permanent by design; it records only inside `no_io()`


@contextmanager
def no_io() -> Iterator[list[tuple[str, str]]]:
    """Collect every socket, file, URL and process event raised in this block."""
    _watch.seen = []
    try:
        yield _watch.seen
    finally:
        _watch.seen = None


def test_the_watch_sees_a_file_open() -> None:
    """Guard against a watch that always passes."""
    with no_io() as seen:
        Path(__file__).read_text()
    assert any(event == "open" for event, _ in seen)


# --- references --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:9/schema.json",
        "https://example.invalid/s",
        "file:///etc/passwd",
        "other.json",
        "/etc/hostname",
    ],
)
def test_a_reference_outside_the_schema_is_refused_when_loaded(ref: str) -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": ref}}}
    with no_io() as seen, pytest.raises(SchemaProblem, match="points outside the schema"):
        compile_schema(schema)
    assert seen == []


def test_an_mcp_tool_with_a_remote_reference_is_a_one_line_load_error() -> None:
    async def run(args: Any, ctx: Any) -> dict[str, Any]:
        return {}

    schema = {"type": "object", "properties": {"x": {"$ref": "file:///etc/passwd"}}}
    with pytest.raises(ToolDefinitionError) as caught:
        schema_tool(name="t", description="d", schema=schema, func=run, source="mcp:evil")
    assert "\n" not in str(caught.value)
    assert "points outside the schema" in str(caught.value)


def test_a_reference_resolved_under_an_id_never_leaves_the_process() -> None:
    """``$id`` moves the base URI: a ``#`` ref below it names a document we do not hold,
    which is an evaluation problem, never a fetch."""
    schema = {
        "$id": "http://127.0.0.1:9/a.json",
        "properties": {"x": {"$id": "http://127.0.0.1:9/b/", "$ref": "#/nope"}},
    }
    validator = compile_schema(schema)
    with no_io() as seen, pytest.raises(SchemaProblem, match="could not be evaluated"):
        validate(validator, {"x": 1})
    assert seen == []


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
    ],
)
def test_a_reference_loop_is_refused_when_loaded(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaProblem, match="leads back to itself"):
        compile_schema(schema)


def test_a_recursive_schema_that_descends_is_accepted() -> None:
    tree = {
        "$defs": {"node": {"type": "object", "properties": {"kids": {"items": {"$ref": "#"}}}}},
        "$ref": "#/$defs/node",
    }
    validator = compile_schema(tree)
    assert is_valid(validator, {"kids": [{"kids": []}, {}]})
    assert not is_valid(validator, {"kids": [{"kids": [5]}]})


# --- patterns ----------------------------------------------------------------------------------


def test_jsonschema_matches_patterns_with_the_linear_engine() -> None:
    """If a jsonschema release moves its re.search calls, this fails before a freeze does."""
    for module in (jsonschema._keywords, jsonschema._utils, jsonschema._legacy_keywords):
        assert type(module.re).__name__ == "_LinearRe", module.__name__


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)b", "(?<!x)y", "a{2000}" * 1 + "x" * 1000])
def test_a_pattern_the_linear_engine_cannot_run_is_refused(pattern: str) -> None:
    with pytest.raises(SchemaProblem) as caught:
        compile_schema({"properties": {"x": {"pattern": pattern}}})
    assert "\n" not in str(caught.value)


def test_data_that_looks_like_a_pattern_is_not_compiled() -> None:
    compile_schema({"const": {"pattern": r"(a)\1"}, "enum": [{"pattern": "(?=x)"}]})


CATASTROPHIC = {
    "type": "object",
    "properties": {"q": {"pattern": "^(a+)+$"}},
    "patternProperties": {"^(a|aa)+$": {"type": "integer"}},
    "additionalProperties": False,
}


def test_catastrophic_patterns_finish_in_every_keyword_that_matches() -> None:
    """In a child process with a generous limit: on Python's re each case below takes
    longer than the age of the universe, on RE2 microseconds."""
    code = f"""
from tools.schemas import compile_schema, validate
schema = {CATASTROPHIC!r}
v = compile_schema(schema)
errors = validate(v, {{"q": "a" * 100_000 + "!", "a" * 60 + "!": 1}})
assert len(errors) == 2, errors
u = compile_schema({{"patternProperties": {{"^(a+)+$": {{}}}}, "unevaluatedProperties": False}})
assert len(validate(u, {{"a" * 60 + "!": 1}})) == 1
print("done")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "done", out.stderr[-2000:]


# --- sizes -------------------------------------------------------------------------------------


def test_instances_too_deep_or_too_large_are_refused_before_matching() -> None:
    validator = compile_schema(CATASTROPHIC)
    deep: Any = "x"
    for _ in range(MAX_INSTANCE_DEPTH + 1):
        deep = [deep]
    with pytest.raises(SchemaProblem, match="nested more than"):
        validate(validator, {"q": deep})
    with pytest.raises(SchemaProblem, match="bytes as JSON"):
        validate(validator, {"q": "a" * (MAX_INSTANCE_BYTES + 1)})
    very_deep: Any = 1
    for _ in range(100_000):
        very_deep = {"a": very_deep}
    with pytest.raises(SchemaProblem, match="nested more than"):
        validate(validator, very_deep)


# --- fuzz: generated schemas and arguments ------------------------------------------------------

REFS = st.sampled_from(
    ["#", "#/$defs/a", "#/$defs/b", "#/nope", "http://127.0.0.1:9/x", "file:///etc/passwd"]
)
PATTERNS = st.sampled_from(["^(a+)+$", "(a|aa)+$", r"(a)\1", "(?=a)", "^[a-z]*$", "x{3,}", "("])
LEAF = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "object", "array", "integer"])}),
    st.fixed_dictionaries({"pattern": PATTERNS}),
    st.fixed_dictionaries({"$ref": REFS}),
    st.fixed_dictionaries({"minLength": st.integers(0, 3)}),
    st.just({}),
)


def _grow(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.fixed_dictionaries({"properties": st.dictionaries(st.text(max_size=3), children)}),
        st.fixed_dictionaries({"items": children}),
        st.fixed_dictionaries({"allOf": st.lists(children, max_size=3)}),
        st.fixed_dictionaries({"not": children}),
        st.fixed_dictionaries({"$defs": st.fixed_dictionaries({"a": children, "b": children})}),
        st.fixed_dictionaries(
            {
                "patternProperties": st.dictionaries(PATTERNS, children, max_size=2),
                "additionalProperties": st.booleans(),
            }
        ),
        st.fixed_dictionaries(
            {"unevaluatedProperties": st.booleans(), "anyOf": st.lists(children)}
        ),
    )


SCHEMAS = st.recursive(LEAF, _grow, max_leaves=12)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet="a!x(", max_size=40)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text("ax!", max_size=5), c)),
    max_leaves=20,
)


@settings(
    max_examples=300,
    deadline=None,  # a loaded CI machine must not fail this; the child test bounds time
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(schema=SCHEMAS, instance=JSON)
def test_any_schema_and_arguments_are_a_verdict_or_one_problem_without_io(
    schema: dict[str, Any], instance: Any
) -> None:
    with no_io() as seen:
        try:
            validator = compile_schema(schema)
            validate(validator, instance)
        except SchemaProblem as exc:
            assert "\n" not in str(exc)
    assert seen == []
