"""JSON Schemas that come from outside (MCP servers, ``opsloop.yaml``), made safe to run.

A schema is data a third party wrote, and its checks run against arguments a model
chose, so evaluating one must never reach the network, read a file, loop or freeze the
process. :func:`compile_schema` is the one way opsloop builds a validator:

- ``$ref`` / ``$dynamicRef`` must point inside the schema (``#…``), and the validator
  gets an explicit empty ``referencing.Registry`` with nothing to retrieve: jsonschema's
  default would fetch ``http://`` and read ``file://`` references with ``urllib``.
- references that go round in a circle without reading anything of the instance
  (``{"$ref": "#"}``) are refused at load instead of recursing at every call.
- ``pattern`` and ``patternProperties`` run on RE2 (``google-re2``), whose matching is
  linear in the input: Python's ``re`` backtracks (``^(a+)+$`` takes seconds at 28
  characters) while holding the GIL, freezing every thread of the process. A pattern RE2
  cannot run (backreferences, lookarounds) is refused at load.

:func:`validate` bounds the instance's size and depth before matching, and turns any
failure of evaluation into :class:`SchemaProblem` instead of letting it escape.

Pure: no I/O here.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema._keywords
import jsonschema._legacy_keywords
import jsonschema._utils
import re2
import referencing
from jsonschema.exceptions import SchemaError

MAX_INSTANCE_BYTES = 256 * 1024  # a tool call's arguments as JSON; a model writes far less
MAX_INSTANCE_DEPTH = 32
MAX_PATTERN_CHARS = 1000
_DEFAULT_DRAFT = jsonschema.Draft202012Validator
# Values that hold data, not subschemas: a "pattern" key inside them is not a keyword.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords that apply a subschema to the same instance (no descent into it): a cycle
# through only these and references never ends.
_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas")
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is our one-line error, not RE2's log


class SchemaProblem(ValueError):
    """A schema that cannot be used, or an instance it cannot evaluate; one line."""


# --- patterns -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2048)
def linear_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2; :class:`SchemaProblem` if RE2 cannot run it."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise SchemaProblem(f"pattern is over {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise SchemaProblem(
            f"pattern {_short(pattern, 60)!r} cannot be run by the linear-time regex engine "
            f"(RE2: {reason}; backreferences and lookarounds are not supported)"
        ) from None


class _LinearRe:
    """Stands in for the ``re`` module inside jsonschema, whose only matching call is
    ``re.search`` (``pattern``, ``patternProperties`` and the additional/unevaluated
    property checks that read ``patternProperties``): it searches with RE2."""

    @staticmethod
    def search(pattern: str, string: str, flags: int = 0) -> Any:
        return linear_pattern(pattern).search(string)

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


# jsonschema has no hook for its regex engine (a format checker covers only "format"),
# and four keywords in three modules call re.search: replace the module each one sees.
# tests/tools/test_schemas.py fails if a jsonschema release moves the call elsewhere.
for _module in (jsonschema._keywords, jsonschema._utils, jsonschema._legacy_keywords):
    _module.re = _LinearRe()  # type: ignore[attr-defined]


# --- building a validator ---------------------------------------------------------------------


def compile_schema(schema: dict[str, Any]) -> Any:
    """A validator for ``schema`` that resolves references only inside it and matches
    patterns in linear time; :class:`SchemaProblem` (one line) for a schema it refuses."""
    if not isinstance(schema, dict):
        raise SchemaProblem("must be a JSON Schema object")
    try:
        cls = jsonschema.validators.validator_for(schema, default=_DEFAULT_DRAFT)
        cls.check_schema(schema)
    except SchemaError as exc:
        raise SchemaProblem(f"is not a valid JSON Schema: {_short(exc.message)}") from None
    except RecursionError:
        raise SchemaProblem("is nested too deeply") from None
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise SchemaProblem(
                f"$ref {_short(ref, 80)!r} points outside the schema; only #/… refs are read"
            )
    for pattern in _patterns(schema):
        linear_pattern(pattern)
    if (loop := _ref_loop(schema)) is not None:
        raise SchemaProblem(f"$ref {loop!r} leads back to itself without end")
    return cls(schema, registry=referencing.Registry())


def validate(validator: Any, instance: Any) -> list[Any]:
    """The validation errors of ``instance`` (a list of jsonschema ``ValidationError``),
    sorted by where they are; :class:`SchemaProblem` if the instance is too large or the
    schema cannot be evaluated for it."""
    if (why := instance_too_large(instance)) is not None:
        raise SchemaProblem(why)
    try:
        return sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    except SchemaProblem:
        raise
    except RecursionError:
        raise SchemaProblem("the schema could not be evaluated (it recurses too deeply)") from None
    except referencing.exceptions.Unresolvable as exc:
        what = _short(str(exc).removeprefix("Unresolvable: "), 80)
        raise SchemaProblem(
            f"the schema could not be evaluated: {what} cannot be resolved"
        ) from None
    except Exception as exc:  # a keyword that raised: a schema we cannot run, not a bug of ours
        raise SchemaProblem(f"the schema could not be evaluated ({_short(str(exc), 80)})") from None


def is_valid(validator: Any, instance: Any) -> bool:
    """Does ``instance`` satisfy the schema? Raises :class:`SchemaProblem` as ``validate``."""
    return not validate(validator, instance)


def instance_too_large(instance: Any) -> str | None:
    """Why ``instance`` is too large to evaluate (size as JSON, or depth), or None."""
    if _depth_over(instance, MAX_INSTANCE_DEPTH):
        return f"the arguments are nested more than {MAX_INSTANCE_DEPTH} levels deep"
    try:
        size = len(json.dumps(instance, ensure_ascii=False, default=str).encode("utf-8", "replace"))
    except (ValueError, TypeError):
        return "the arguments are not JSON"
    if size > MAX_INSTANCE_BYTES:
        return f"the arguments are {size:,} bytes as JSON; at most {MAX_INSTANCE_BYTES:,} are read"
    return None


def _depth_over(node: Any, limit: int) -> bool:
    """Iterative, so a deep instance cannot exhaust the stack while being measured."""
    stack = [(node, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    return False


# --- walking a schema -------------------------------------------------------------------------


def _subschemas(node: Any) -> Iterator[Any]:
    """Every dict below ``node`` that may be a schema (skipping data such as ``const``)."""
    stack = [node]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            yield value
            stack.extend(v for k, v in value.items() if k not in _DATA_KEYWORDS)
        elif isinstance(value, list):
            stack.extend(value)


def _refs(schema: Any) -> list[str]:
    return [
        s[k]
        for s in _subschemas(schema)
        for k in ("$ref", "$dynamicRef")
        if isinstance(s.get(k), str)
    ]


def _patterns(schema: Any) -> list[str]:
    found: list[str] = []
    for sub in _subschemas(schema):
        if isinstance(sub.get("pattern"), str):
            found.append(sub["pattern"])
        if isinstance(sub.get("patternProperties"), dict):
            found.extend(sub["patternProperties"])
    return found


def _ref_loop(schema: dict[str, Any]) -> str | None:
    """A ``#/…`` reference from which references and in-place keywords lead back to a
    subschema already on the way: evaluating it recurses without end, whatever the
    instance. A depth-first search over those edges, iterative and linear in the schema."""
    visiting, done = 1, 2
    state: dict[int, int] = {}
    for start in _subschemas(schema):
        if id(start) in state:
            continue
        state[id(start)] = visiting
        path = [(start, iter(_in_place(schema, start)))]
        while path:
            node, nexts = path[-1]
            following = next(nexts, None)
            if following is None:
                state[id(node)] = done
                path.pop()
            elif state.get(id(following)) == visiting:
                refs = [n["$ref"] for n, _ in path if isinstance(n.get("$ref"), str)]
                return refs[-1] if refs else "#"
            elif id(following) not in state:
                state[id(following)] = visiting
                path.append((following, iter(_in_place(schema, following))))
    return None


def _in_place(root: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The subschemas evaluated against the same instance as ``node``."""
    found: list[Any] = []
    if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        found.append(_pointer(root, node["$ref"]))
    for key in _IN_PLACE:
        value = node.get(key)
        if isinstance(value, list):
            found.extend(value)
        elif isinstance(value, dict):
            found.extend(value.values() if key == "dependentSchemas" else [value])
    return [n for n in found if isinstance(n, dict)]


def _pointer(root: dict[str, Any], ref: str) -> Any:
    """The subschema a ``#/a/b`` reference names (None for an anchor or a bad pointer)."""
    path = ref[1:]
    if path and not path.startswith("/"):
        return None  # "#anchor": not followed here; evaluation still bounds it
    node: Any = root
    for part in path.split("/")[1:] if path else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _short(text: str, limit: int = 160) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"
