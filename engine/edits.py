"""A reviewer's edit of a call's arguments before approval: what changed, what the
policy then needs, and which argument a validation error is about.

An edit never lowers what the call needed: the rules are applied again to the new
arguments and the stricter of the two reviewer rules stands (:func:`after_edit`). The
front door (``engine.inputs.edit_call``) records the result on ``approval_edited``; the
card and the model's tool result describe the edit with :func:`changes`.

Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import ValidationError

from engine.reviewers import ReviewerRule

VALUE_CHARS = 200  # of one value, in a description of a change
GENERAL = ""  # the key of an error that is about no one argument


class _Unset:
    """The side of a change where the key is missing."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
UNSET_TEXT = "(unset)"  # how people and the model read it


class Change(NamedTuple):
    """One top-level argument that differs; ``before`` / ``after`` is :data:`UNSET`
    (never a value) when the key is missing on that side."""

    name: str
    before: Any
    after: Any


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """The top-level arguments that differ, the original keys first (in their order),
    then the added ones."""
    names = [*before, *(k for k in after if k not in before)]
    out = []
    for name in names:
        old, new = before.get(name, UNSET), after.get(name, UNSET)
        if old is UNSET or new is UNSET or _canon(old) != _canon(new):
            out.append(Change(name, old, new))
    return out


def value_text(value: Any, limit: int = VALUE_CHARS) -> str:
    """A value as people read it: a string bare, anything else as compact JSON; cut."""
    if value is UNSET:
        return UNSET_TEXT
    text = value if isinstance(value, str) else _canon(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(found: Sequence[Change], limit: int = VALUE_CHARS) -> str:
    """ "environment: staging → production; replicas: 2 → 3"."""
    return "; ".join(
        f"{c.name}: {value_text(c.before, limit)} → {value_text(c.after, limit)}" for c in found
    )


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def after_edit(old: ReviewerRule, new: ReviewerRule) -> ReviewerRule:
    """Who may decide an edited call: the rule for its new arguments (``new``) when it
    is at least as strict as the one it had (``old``) in every part; otherwise part by
    part. The higher quorum; self-approval only if both allow it; and ``new``'s
    approvers unless they are plainly wider than ``old``'s (a superset, or anyone), in
    which case ``old``'s, which ``new`` admits too. Approvers that are neither wider nor
    narrower are ``new``'s: the rule for what will run always holds (a staging call that
    developers approve, edited into a production one, needs production's approvers)."""
    if not new.widens(old):
        return new
    wider = ReviewerRule(new.approvers).compared_to(ReviewerRule(old.approvers)) == {"looser"}
    return ReviewerRule(
        approvers=old.approvers if wider else new.approvers,
        quorum=max(old.quorum, new.quorum),
        allow_self=old.allow_self and new.allow_self,
        rule=old.rule if wider else new.rule,
    )


def field_errors(exc: ValidationError) -> dict[str, str]:
    """A tool's validation errors by the top-level argument they are about
    (:data:`GENERAL` for the others), the first per argument."""
    found: dict[str, str] = {}
    for err in exc.errors():
        loc, msg = err["loc"], str(err["msg"])
        if loc and isinstance(loc[0], str):
            found.setdefault(loc[0], msg)
            continue
        # A tool defined by a JSON Schema says "path: message; …" (tools.schema_tool).
        for part in msg.removeprefix("Value error, ").split("; "):
            where, sep, what = part.partition(": ")
            name = where.split(".")[0] if sep and where != "(input)" else GENERAL
            found.setdefault(name, what if name else part)
    return found
