"""PagerDuty's tools (``integrations.pagerduty``): who is on call, the incidents, and
what a responder does to one (a note, acknowledge, resolve).

Reading is ``run_now``; writing waits for an approval by default (a rule may change
either). Every tool is idempotent, so a call cut off by a crash simply runs again:

- acknowledging or resolving reads the incident first and changes nothing when it is
  already there (resolved counts as acknowledged); a refusal that races another
  responder is read again and is no error when the incident got there anyway;
- a note ends with a marker holding the call's idempotency key, and the incident's
  notes are searched for it before one is added: a retry after a lost answer finds the
  note it added instead of adding a second.

PagerDuty being unreachable (or 429, 5xx) is a retryable error; a refusal (a bad id, a
token without the scope) is an error the model reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tools.context import ToolContext
from tools.errors import RetryableToolError, ToolError
from tools.integrations.config import PagerDutyConfig
from tools.integrations.pagerduty_client import (
    PagerDutyClient,
    PagerDutyError,
    PagerDutyRefused,
    PagerDutyUnavailable,
)
from tools.registry import Policy, Tool

PagerDutyId = Annotated[str, Field(pattern=r"^[A-Za-z0-9]{1,64}$")]
Status = Literal["triggered", "acknowledged", "resolved"]
_OPEN: tuple[Status, ...] = ("triggered", "acknowledged")
MAX_NOTE = 10_000  # characters of a note's text (PagerDuty keeps 25,000 with the marker)
_DONE: dict[str, frozenset[str]] = {  # statuses at which a change is already made
    "acknowledged": frozenset({"acknowledged", "resolved"}),
    "resolved": frozenset({"resolved"}),
}


def note_marker(idempotency_key: str) -> str:
    """The line a note ends with: which call added it (searched before adding)."""
    return f"[opsloop call {idempotency_key}]"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OnCallArgs(_Args):
    schedule_id: PagerDutyId | None = Field(
        None, description="A schedule's id (P…); with neither id, every on-call now."
    )
    escalation_policy_id: PagerDutyId | None = Field(None, description="An escalation policy's id.")


class IncidentsArgs(_Args):
    incident_id: PagerDutyId | None = Field(
        None, description="One incident (its notes too); the other filters are then ignored."
    )
    statuses: list[Status] = Field(default_factory=lambda: list(_OPEN))
    service_ids: list[PagerDutyId] = Field(default_factory=list, max_length=20)
    limit: int = Field(25, ge=1, le=100)


class NoteArgs(_Args):
    incident_id: PagerDutyId
    content: str = Field(min_length=1, max_length=MAX_NOTE)


class IncidentArgs(_Args):
    incident_id: PagerDutyId


class ResolveArgs(IncidentArgs):
    resolution: str | None = Field(
        None, max_length=MAX_NOTE, description="Why it is resolved (kept on the incident)."
    )


class PagerDutySource:
    """The PagerDuty tools of ``integrations.pagerduty`` (a :class:`ToolSource`).

    Opening connects nothing (``opsloop config check`` opens it offline): the first call
    does. ``client``: for tests, one talking to a fake."""

    name = "pagerduty"
    key = "integrations.pagerduty"

    def __init__(self, config: PagerDutyConfig, *, client: PagerDutyClient | None = None) -> None:
        self.config = config
        self._given = client
        self._client: PagerDutyClient | None = client

    def __repr__(self) -> str:
        return f"PagerDutySource({self.config.api_url!r})"

    async def open(self) -> list[Tool]:
        if self._client is None:
            self._client = PagerDutyClient(self.config)
        return [
            self._tool("pagerduty_oncall", OnCallArgs, self._oncall, "run_now"),
            self._tool("pagerduty_incidents", IncidentsArgs, self._incidents, "run_now"),
            self._tool("pagerduty_add_note", NoteArgs, self._add_note),
            self._tool("pagerduty_acknowledge", IncidentArgs, self._acknowledge),
            self._tool("pagerduty_resolve", ResolveArgs, self._resolve),
        ]

    async def close(self) -> None:
        client = self._client
        self._client = self._given
        if client is not None and client is not self._given:
            await client.close()

    def _tool(
        self,
        name: str,
        args: type[_Args],
        func: Callable[[Any, ToolContext], Awaitable[dict[str, Any]]],
        policy: Policy = "approve_before_run",
    ) -> Tool:
        async def call(arguments: Any, ctx: ToolContext) -> dict[str, Any]:
            try:
                return await func(arguments, ctx)
            except PagerDutyUnavailable as exc:
                raise RetryableToolError(str(exc), retry_after=exc.retry_after) from None
            except PagerDutyError as exc:
                raise ToolError(str(exc)) from None

        return Tool(
            name=name,
            description=_DESCRIPTIONS[name],
            policy=policy,
            args_model=args,
            func=call,
            source="pagerduty",
            idempotent=True,
        )

    @property
    def client(self) -> PagerDutyClient:
        if self._client is None:
            raise RuntimeError("PagerDutySource is not open")
        return self._client

    # --- reading --------------------------------------------------------------------------

    async def _oncall(self, args: OnCallArgs, ctx: ToolContext) -> dict[str, Any]:
        oncalls, more = await self.client.oncalls(
            schedule_ids=[args.schedule_id] if args.schedule_id else [],
            escalation_policy_ids=[args.escalation_policy_id] if args.escalation_policy_id else [],
        )
        return {"oncalls": [_oncall(o) for o in oncalls], "more": more}

    async def _incidents(self, args: IncidentsArgs, ctx: ToolContext) -> dict[str, Any]:
        if args.incident_id:
            incident = await self.client.incident(args.incident_id)
            notes = await self.client.notes(args.incident_id)
            return {"incident": _incident(incident), "notes": [_note(n) for n in notes]}
        incidents, more = await self.client.incidents(
            statuses=args.statuses, service_ids=args.service_ids, limit=args.limit
        )
        return {"incidents": [_incident(i) for i in incidents], "more": more}

    # --- writing (idempotent) -------------------------------------------------------------

    async def _add_note(self, args: NoteArgs, ctx: ToolContext) -> dict[str, Any]:
        marker = note_marker(ctx.idempotency_key)
        for note in await self.client.notes(args.incident_id):
            if marker in str(note.get("content") or ""):
                return {"incident_id": args.incident_id, "note_id": note.get("id"), "added": False}
        note = await self.client.add_note(args.incident_id, f"{args.content}\n\n{marker}")
        return {"incident_id": args.incident_id, "note_id": note.get("id"), "added": True}

    async def _acknowledge(self, args: IncidentArgs, ctx: ToolContext) -> dict[str, Any]:
        return await self._set(args.incident_id, "acknowledged")

    async def _resolve(self, args: ResolveArgs, ctx: ToolContext) -> dict[str, Any]:
        return await self._set(args.incident_id, "resolved", args.resolution)

    async def _set(
        self, incident_id: str, status: str, resolution: str | None = None
    ) -> dict[str, Any]:
        """Bring the incident to ``status`` unless it is there (or past it) already."""
        done = _DONE[status]
        before = await self.client.incident(incident_id)
        if before.get("status") in done:
            return _changed(incident_id, before, changed=False)
        try:
            after = await self.client.set_status(incident_id, status, resolution=resolution)
        except PagerDutyRefused:
            # Another responder may have got there between the read and the write.
            again = await self.client.incident(incident_id)
            if again.get("status") in done:
                return _changed(incident_id, again, changed=False)
            raise
        return _changed(incident_id, after, changed=True)


# --- what the model reads ----------------------------------------------------------------


def _ref(ref: Any) -> dict[str, Any] | None:
    """A PagerDuty reference as ``{"id", "name"}`` (None for a missing one)."""
    if not isinstance(ref, dict):
        return None
    return {"id": ref.get("id"), "name": ref.get("summary") or ref.get("name")}


def _oncall(o: dict[str, Any]) -> dict[str, Any]:
    user = o.get("user")
    user = user if isinstance(user, dict) else {}
    return {
        "user": user.get("name") or user.get("summary"),
        "email": user.get("email"),
        "user_id": user.get("id"),
        "schedule": _ref(o.get("schedule")),
        "escalation_policy": _ref(o.get("escalation_policy")),
        "level": o.get("escalation_level"),
        "until": o.get("end"),
    }


def _incident(i: dict[str, Any]) -> dict[str, Any]:
    assignees = [_ref(a.get("assignee")) for a in i.get("assignments") or () if isinstance(a, dict)]
    return {
        "id": i.get("id"),
        "number": i.get("incident_number"),
        "title": i.get("title") or i.get("summary"),
        "status": i.get("status"),
        "urgency": i.get("urgency"),
        "service": _ref(i.get("service")),
        "created_at": i.get("created_at"),
        "assigned_to": [a["name"] for a in assignees if a is not None],
        "url": i.get("html_url"),
    }


def _note(n: dict[str, Any]) -> dict[str, Any]:
    user = _ref(n.get("user"))
    return {
        "id": n.get("id"),
        "by": user["name"] if user else None,
        "at": n.get("created_at"),
        "content": n.get("content"),
    }


def _changed(incident_id: str, incident: dict[str, Any], *, changed: bool) -> dict[str, Any]:
    return {
        "incident_id": incident_id,
        "status": incident.get("status"),
        "changed": changed,
        "url": incident.get("html_url"),
    }


_DESCRIPTIONS = {
    "pagerduty_oncall": (
        "Who is on call in PagerDuty now: for a schedule, an escalation policy, or everyone. "
        "Each entry names the user, their email, the schedule and escalation level, and "
        "until when."
    ),
    "pagerduty_incidents": (
        "PagerDuty incidents, newest first (by default the open ones: triggered and "
        "acknowledged), optionally of some services; or one incident with its notes."
    ),
    "pagerduty_add_note": (
        "Add a note to a PagerDuty incident (what was found, what was done). A retry of the "
        "same call never adds it twice."
    ),
    "pagerduty_acknowledge": (
        "Acknowledge a PagerDuty incident (stops its escalation). Harmless if it is already "
        "acknowledged or resolved."
    ),
    "pagerduty_resolve": (
        "Resolve a PagerDuty incident, with an optional resolution note. Harmless if it is "
        "already resolved."
    ),
}
