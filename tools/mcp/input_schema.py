"""An MCP tool's input schema as the Anthropic API takes it (pure; no I/O).

The API refuses a tool whose ``input_schema`` is not an object schema or has ``anyOf``,
``oneOf`` or ``allOf`` at its top level, and it refuses the whole request with it (every
thread fails at its first step). MCP servers send such schemas: a zod union is a
top-level ``anyOf`` of objects, and "at least one of" is often a top-level ``anyOf`` of
``required`` lists. So what the model is shown is flattened to one object schema:

* ``allOf``: every branch holds, so properties merge and ``required`` is the union;
* ``anyOf`` / ``oneOf``: one branch holds, so properties merge and ``required`` is
  what every branch requires (with what the top level requires);
* a property two branches define differently is shown as the ``anyOf`` / ``allOf`` of
  both (allowed below the top level).

Arguments are still checked against the server's own schema, so nothing the union
refuses gets through. A schema that is not about objects (a top-level ``type`` other
than ``object``, a union with a string in it) cannot be flattened: :class:`Unfit`.
"""

from __future__ import annotations

import copy
from typing import Any

COMBINATORS = ("allOf", "anyOf", "oneOf")
_MAX_REF_HOPS = 16  # a $ref chain or union nesting deeper than this is refused, not followed


class Unfit(ValueError):
    """Why a schema cannot be shown to the model (one line)."""


def fit_for_the_model(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` as the model API takes it: itself when it already fits (with ``type:
    object`` and ``properties`` added), else flattened; :class:`Unfit` when it cannot be."""
    kind = schema.get("type", "object")
    if kind != "object":
        raise Unfit(f"its input schema is of type {kind!r}, not an object")
    # Only a union is rewritten: any other schema is shown (and hashed) as the server sent it.
    flat = _flatten(schema, schema, 0) if any(w in schema for w in COMBINATORS) else dict(schema)
    flat["type"] = "object"
    flat.setdefault("properties", {})
    return flat


def _flatten(node: dict[str, Any], root: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > _MAX_REF_HOPS:
        raise Unfit("its top-level union is nested too deep (or refers to itself)")
    out = {k: copy.deepcopy(v) for k, v in node.items() if k not in COMBINATORS}
    properties: dict[str, Any] = dict(out.get("properties") or {})
    required: list[str] = list(out.get("required") or [])
    for word in COMBINATORS:
        if word not in node:
            continue
        branches = node[word]
        if not isinstance(branches, list) or not branches:
            raise Unfit(f"its top-level {word} is not a list of schemas")
        flat = [_flatten(_object(b, root, word), root, depth + 1) for b in branches]
        both = "allOf" if word == "allOf" else "anyOf"
        for branch in flat:
            for name, sub in (branch.get("properties") or {}).items():
                properties[name] = _join(properties.get(name), sub, both)
        each = [set(b.get("required") or []) for b in flat]
        needed = set.union(*each) if word == "allOf" else set.intersection(*each)
        # First-seen order, so the same schema is always shown (and hashed) the same.
        order = [n for b in flat for n in b.get("required") or []]
        required += [n for n in dict.fromkeys(order) if n in needed and n not in required]
    if properties:
        out["properties"] = properties
    if required:
        out["required"] = required
    else:
        out.pop("required", None)
    return out


def _object(branch: Any, root: dict[str, Any], word: str) -> dict[str, Any]:
    """A branch of ``word`` as an object schema (a local ``$ref`` followed)."""
    for _ in range(_MAX_REF_HOPS):
        if not (isinstance(branch, dict) and isinstance(branch.get("$ref"), str)):
            break
        branch = _resolve(branch["$ref"], root)
    if not isinstance(branch, dict) or "$ref" in branch:
        raise Unfit(f"its top-level {word} has a branch that is not an object schema")
    kind = branch.get("type", "object")
    if kind != "object":
        raise Unfit(f"its top-level {word} has a branch of type {kind!r}, not only objects")
    return branch


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    if not ref.startswith("#/"):
        raise Unfit(f"its top-level union refers outside the schema ({ref!r})")
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise Unfit(f"its top-level union refers to {ref!r}, which it does not define")
        node = node[part]
    return node


def _join(before: Any, after: Any, word: str) -> Any:
    if before is None or before == after:
        return copy.deepcopy(after)
    if isinstance(before, dict) and list(before) == [word]:
        return {word: [*before[word], copy.deepcopy(after)]}
    return {word: [before, copy.deepcopy(after)]}
