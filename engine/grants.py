"""Standing grants: what one "Approve for 1 h" click lets through later (pure).

A grant (``grant_created``) names a tool, a JSON Schema the arguments must satisfy (by
default the exact arguments approved) and an ``until``. A later call in the same thread
is approved by it at once when the tool is the same, the arguments satisfy the schema,
``until`` is still ahead, and the call's own rule allows grants (``max_grant`` set) with
quorum 1: a grant never stands in for two people, nor for another tool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from engine.state import Grant, ThreadState
from tools.schemas import SchemaProblem, compile_schema, is_valid

GRANT_FOR_S = 3600.0  # "Approve for 1 h", shortened to the rule's max_grant


def new_grant_id() -> str:
    return "grant_" + os.urandom(8).hex()


def grant_seconds(max_grant_s: float) -> float:
    """How long a grant created now lasts: an hour, or the rule's max_grant if shorter."""
    return min(GRANT_FOR_S, max_grant_s)


def exact_schema(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema that these arguments, and no others, satisfy."""
    return {
        "type": "object",
        "properties": {k: {"const": v} for k, v in arguments.items()},
        "required": sorted(arguments),
        "additionalProperties": False,
    }


def exact_arguments(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The arguments an :func:`exact_schema` matches (None: some other schema)."""
    props = schema.get("properties")
    if not isinstance(props, dict) or schema != exact_schema(
        {k: v.get("const") for k, v in props.items() if isinstance(v, dict)}
    ):
        return None
    return {k: v["const"] for k, v in props.items()}


def covers(grant: Grant, tool: str, arguments: Mapping[str, Any], now: datetime) -> bool:
    """Does the live ``grant`` cover a call of ``tool`` with ``arguments`` at ``now``?"""
    if grant.tool != tool or not grant.live(now):
        return False
    try:
        return is_valid(compile_schema(grant.arguments_schema), dict(arguments))
    except SchemaProblem:
        return False  # a schema that cannot be evaluated covers nothing


def covering_grant(
    state: ThreadState,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    max_grant_s: float | None,
    quorum: int,
    now: datetime,
) -> Grant | None:
    """The thread's live grant that approves this call now (the one lasting longest),
    or None; none ever when the call's rule allows no grants or needs more than one
    vote."""
    if max_grant_s is None or quorum != 1:
        return None
    found = [g for g in state.grants.values() if covers(g, tool, arguments, now)]
    return max(found, key=lambda g: g.until, default=None)
