"""Standing grants: what one "Approve for 1 h" click lets through later (pure).

A grant (``grant_created``) names a tool, a JSON Schema the arguments must satisfy (by
default the exact arguments approved), a scope (its thread, or its thread's channel)
and an ``until``. A later call in scope is approved by it at once when the tool is the
same, the arguments satisfy the schema, ``until`` is still ahead, the call's own rule
allows grants (``max_grant`` set) with quorum 1, and the grant's reviewer could have
approved that call themselves: a grant never stands in for two people, for another
tool, or for someone its reviewer may not speak for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from engine.events import GrantCreated, GrantRevoked, GrantUse, ToolCallRequested
from engine.reviewers import ReviewerRule
from engine.state import Grant, ThreadState
from tools.schemas import SchemaProblem, compile_schema, is_valid

GRANT_FOR_S = 3600.0  # "Approve for 1 h", shortened to the rule's max_grant
# The longest grant: a standing approval is for an incident, not for a quarter (and
# channel grants are looked up among the last day's grant events only).
GRANT_LONGEST_S = 86400.0
SPANS_S = (900.0, 3600.0, 4 * 3600.0, 8 * 3600.0, GRANT_LONGEST_S)  # the modal's choices

Scope = Literal["thread", "channel"]


def new_grant_id() -> str:
    return "grant_" + os.urandom(8).hex()


def grant_seconds(max_grant_s: float) -> float:
    """How long a one-click grant lasts: an hour, or the rule's max_grant if shorter."""
    return min(GRANT_FOR_S, max_grant_s, GRANT_LONGEST_S)


def spans(max_grant_s: float) -> list[float]:
    """The spans a reviewer may choose for a grant under ``max_grant``, shortest first."""
    longest = min(max_grant_s, GRANT_LONGEST_S)
    return sorted({*(s for s in SPANS_S if s <= longest), longest})


@dataclass(frozen=True)
class GrantAsk:
    """What a reviewer asks for with their vote: a grant of ``seconds`` (None: an hour,
    or the rule's ``max_grant`` if shorter) in ``scope``, matching the call's arguments
    named in ``exact`` exactly and any value of the others (None: all of them exactly).
    ``GrantAsk()`` is the card's one-click "Approve for 1 h"."""

    seconds: float | None = None
    scope: Scope = "thread"
    exact: frozenset[str] | None = None

    def problem(self, max_grant_s: float, arguments: Mapping[str, Any]) -> str | None:
        """Why this cannot be granted on a call with ``arguments`` under ``max_grant``."""
        longest = min(max_grant_s, GRANT_LONGEST_S)
        if self.seconds is not None and not 0 < self.seconds <= longest:
            return "that is longer than this call's rule allows a grant to last"
        if self.exact is not None and not self.exact <= set(arguments):
            return "that names an argument the call does not have"
        return None

    def until(self, now: datetime, max_grant_s: float) -> datetime:
        seconds = grant_seconds(max_grant_s) if self.seconds is None else self.seconds
        return now + timedelta(seconds=seconds)

    def schema(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if self.exact is None:
            return exact_schema(arguments)
        return narrowed_schema(arguments, self.exact)


def exact_schema(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON Schema that these arguments, and no others, satisfy."""
    return {
        "type": "object",
        "properties": {k: {"const": v} for k, v in arguments.items()},
        "required": sorted(arguments),
        "additionalProperties": False,
    }


def narrowed_schema(arguments: Mapping[str, Any], exact: frozenset[str]) -> dict[str, Any]:
    """A JSON Schema for calls with the arguments in ``exact`` as here, any value (or
    none) of the call's other arguments, and no argument it did not have."""
    return {
        "type": "object",
        "properties": {k: {"const": v} if k in exact else {} for k, v in arguments.items()},
        "required": sorted(exact),
        "additionalProperties": False,
    }


def grant_terms(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a grant's schema asks, argument by argument: its exact value, or ``ANY``
    (None: a schema opsloop did not make, shown as "custom")."""
    props = schema.get("properties")
    if not isinstance(props, dict) or schema.get("additionalProperties") is not False:
        return None
    terms: dict[str, Any] = {}
    for name, term in props.items():
        if term == {}:
            terms[name] = ANY
        elif isinstance(term, dict) and set(term) == {"const"}:
            terms[name] = term["const"]
        else:
            return None
    return terms


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()  # an argument a grant lets take any value


def stands_in(grant: Grant, reviewers: ReviewerRule | None, requester: str | None) -> bool:
    """May the grant's reviewer approve a call under ``reviewers`` asked by ``requester``?

    A grant is its reviewer's vote given ahead: it covers a call only where that vote
    would count. Groups and on-call schedules cannot be looked up here (pure), so a
    reviewer who is not named directly counts only under the very approvers list they
    were checked against when the grant was made.
    """
    rule = reviewers or ReviewerRule()
    if grant.reviewer == requester and not rule.allow_self:
        return False
    if not rule.approvers or grant.reviewer in rule.approvers:
        return True
    return grant.approvers is not None and frozenset(grant.approvers) == rule.approvers


def covers(grant: Grant, tool: str, arguments: Mapping[str, Any], now: datetime) -> bool:
    """Does the live ``grant`` cover a call of ``tool`` with ``arguments`` at ``now``?"""
    if grant.tool != tool or not grant.live(now):
        return False
    try:
        return is_valid(compile_schema(grant.arguments_schema), dict(arguments))
    except SchemaProblem:
        return False  # a schema that cannot be evaluated covers nothing


@dataclass(frozen=True)
class Found:
    """A grant that covers a call, and the thread whose log holds it."""

    grant: Grant
    thread_id: str

    def use(self) -> GrantUse:
        g = self.grant
        return GrantUse(
            grant_id=g.grant_id,
            tool=g.tool,
            reviewer=g.reviewer,
            until=g.until,
            thread_id=self.thread_id,
        )


def covering_grant(
    grants: Iterable[Found],
    call: ToolCallRequested,
    *,
    requester: str | None,
    now: datetime,
) -> Found | None:
    """The live grant that approves ``call`` now (the one lasting longest), or None;
    none ever when the call's rule allows no grants or needs more than one vote."""
    if call.max_grant_s is None or call.quorum != 1:
        return None
    found = [
        f
        for f in grants
        if covers(f.grant, call.intent, call.arguments, now)
        and stands_in(f.grant, call.reviewers, requester)
    ]
    return max(found, key=lambda f: f.grant.until, default=None)


def thread_grants(state: ThreadState) -> list[Found]:
    return [Found(g, state.thread_id) for g in state.grants.values()]


def channel_grants(
    logged: Iterable[tuple[str, GrantCreated | GrantRevoked]], *, besides: str
) -> list[Found]:
    """The channel-wide grants among other threads' grant events (``Store.grant_events``
    of a channel, in log order), less those revoked; ``besides``: the asking thread,
    whose own grants its state holds."""
    made: dict[str, Found] = {}
    for thread_id, e in logged:
        if thread_id == besides:
            continue
        if isinstance(e, GrantCreated) and e.scope == "channel":
            made[e.grant_id] = Found(Grant.created(e), thread_id)
        elif isinstance(e, GrantRevoked):
            made.pop(e.grant_id, None)
    return list(made.values())
