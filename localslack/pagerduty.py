"""A fake PagerDuty REST API v2: an aiohttp app on an ephemeral 127.0.0.1 port, or
mounted on another app's (:meth:`FakePagerDuty.mount`: ``opsloop local`` serves it under
``/pagerduty`` beside the page, and its opsloop.yaml points ``api_url`` there).

It speaks the wire format of https://developer.pagerduty.com/api-reference (the
endpoints opsloop uses: ``GET /oncalls``, ``GET /users/{id}``, ``GET /incidents``,
``GET|PUT /incidents/{id}``, ``GET|POST /incidents/{id}/notes``), so the real client,
pointed at it through ``integrations.pagerduty.api_url``, does its real requests::

    async with FakePagerDuty() as pd:
        pd.add_user("PALICE1", "Alice", "alice@acme.example")
        pd.put_on_call(["PALICE1"], schedule="PSCHED1")
        ...  # PagerDutyConfig(token=TOKEN, api_url=pd.url, from_email=...)
        [call] = await pd.wait_for("GET", "/oncalls")

Checked as PagerDuty checks them: ``Authorization: Token token=…`` (401 otherwise), the
v2 ``Accept``, and on writes a ``From`` header naming a user's email (400 otherwise).
Every request is recorded (``calls``); ``fail`` answers the next requests of a route
with an error status, ``hold`` does what a request asks but keeps its answer (a
client that gave up never learns it succeeded).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from localslack.loopback import serve

TOKEN = "u+fake-pagerduty-token"
FROM_EMAIL = "ops-bot@acme.example"
ACCEPT = "application/vnd.pagerduty+json;version=2"
STATUSES = ("triggered", "acknowledged", "resolved")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: Any = None


@dataclass
class OnCall:
    """One on-call: ``user`` at ``level`` of ``escalation_policy``, through ``schedule``
    (None: the user is a direct target of the level)."""

    user: str
    escalation_policy: str
    level: int = 1
    schedule: str | None = None


@dataclass
class Incident:
    id: str
    title: str
    status: str = "triggered"
    service: str = "PSVC0001"
    urgency: str = "high"
    number: int = 1
    created_at: str = ""
    notes: list[dict[str, Any]] = field(default_factory=list)
    resolution: str | None = None


class FakePagerDuty:
    """One PagerDuty account, in memory."""

    def __init__(self, *, token: str = TOKEN, clock: datetime | None = None) -> None:
        """``clock``: the account's time, which its records show (fixed by default, so
        tests see the same answers)."""
        self.token = token
        self.users: dict[str, dict[str, Any]] = {}
        self.oncalls: list[OnCall] = []
        self.incidents: dict[str, Incident] = {}
        self.calls: list[Call] = []
        self.url = ""
        self._prefix = ""  # where it is mounted: recorded paths are the API's own
        self._failures: dict[tuple[str, str], list[int]] = {}
        self._holds: dict[tuple[str, str], asyncio.Event] = {}
        self._cond = asyncio.Condition()  # bound to the loop that first waits on it
        self._runner: web.AppRunner | None = None
        self._clock = clock or datetime(2025, 1, 6, 9, 0, tzinfo=UTC)

    # --- the account, as tests set it ------------------------------------------------------

    def add_user(self, user_id: str, name: str, email: str) -> dict[str, Any]:
        self.users[user_id] = {
            "id": user_id,
            "type": "user",
            "name": name,
            "summary": name,
            "email": email,
            "time_zone": "Europe/Paris",
            "self": f"{self.url}/users/{user_id}",
            "html_url": f"https://acme.pagerduty.com/users/{user_id}",
        }
        return self.users[user_id]

    def put_on_call(
        self,
        users: list[str],
        *,
        schedule: str | None = None,
        escalation_policy: str = "PEPOL0001",
        level: int = 1,
    ) -> None:
        """``users`` are on call now for ``schedule`` (at ``level`` of
        ``escalation_policy``), replacing whoever was: a hand-over."""

        def replaced(o: OnCall) -> bool:
            if schedule is not None:
                return o.schedule == schedule
            same_level = (o.escalation_policy, o.level) == (escalation_policy, level)
            return o.schedule is None and same_level

        self.oncalls = [o for o in self.oncalls if not replaced(o)]
        self.oncalls += [OnCall(u, escalation_policy, level, schedule) for u in users]

    def add_incident(self, incident_id: str, title: str, **fields: Any) -> Incident:
        self._clock += timedelta(minutes=1)
        number = len(self.incidents) + 1
        incident = Incident(
            incident_id, title, number=number, created_at=_iso(self._clock), **fields
        )
        self.incidents[incident_id] = incident
        return incident

    # --- controls ------------------------------------------------------------------------

    def fail(self, method: str, path: str, status: int = 503, *, times: int = 1) -> None:
        """Answer the next ``times`` requests of ``method path`` with ``status``."""
        self._failures.setdefault((method, path), []).extend([status] * times)

    def hold(self, method: str, path: str) -> asyncio.Event:
        """Do what ``method path`` asks but keep the answer until the event is set."""
        return self._holds.setdefault((method, path), asyncio.Event())

    def calls_to(self, method: str, path: str) -> list[Call]:
        return [c for c in self.calls if (c.method, c.path) == (method, path)]

    async def wait_for(
        self,
        method: str,
        path: str,
        count: int = 1,
        timeout: float = 5,  # noqa: ASYNC109 - a test helper's deadline, as asyncio.wait_for
    ) -> list[Call]:
        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: len(self.calls_to(method, path)) >= count)
        except TimeoutError:
            seen = [f"{c.method} {c.path}" for c in self.calls]
            raise TimeoutError(f"{method} {path} not called {count} times; calls: {seen}") from None
        return self.calls_to(method, path)

    # --- lifecycle -----------------------------------------------------------------------

    def web_app(self) -> web.Application:
        """The API as an aiohttp app: its own server's, or mounted (:meth:`mount`)."""
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/oncalls", self._oncalls)
        app.router.add_get("/users/{id}", self._user)
        app.router.add_get("/incidents", self._incidents)
        app.router.add_get("/incidents/{id}", self._incident)
        app.router.add_put("/incidents/{id}", self._update)
        app.router.add_get("/incidents/{id}/notes", self._notes)
        app.router.add_post("/incidents/{id}/notes", self._add_note)
        return app

    def mount(self, app: web.Application, prefix: str, url: str) -> None:
        """Serve the API under ``prefix`` of ``app``, which is reached at ``url``."""
        app.add_subapp(prefix, self.web_app())
        self._prefix = prefix.rstrip("/")
        self.url = url.rstrip("/")

    async def __aenter__(self) -> FakePagerDuty:
        self._runner, port = await serve(self.web_app())
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def close(self) -> None:
        """Answer what is held."""
        for gate in self._holds.values():
            gate.set()

    # --- the wire ------------------------------------------------------------------------

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource
        path = route.canonical if route is not None else request.path
        path = path.removeprefix(self._prefix)
        try:
            body = await request.json() if request.can_read_body else None
        except ValueError:
            return _error(400, "Invalid Input Provided", 2001, "The body is not JSON")
        headers = dict(request.headers)
        self.calls.append(Call(request.method, path, list(request.query.items()), headers, body))
        async with self._cond:
            self._cond.notify_all()
        if headers.get("Authorization") != f"Token token={self.token}":
            return _error(401, "Unauthorized", 2006)
        if headers.get("Accept") != ACCEPT:
            return _error(406, "Not Acceptable: use the v2 Accept header", 2001)
        key = (request.method, path)
        if self._failures.get(key):
            status = self._failures[key].pop(0)
            return _error(status, "Internal Server Error" if status >= 500 else "Refused", 2001)
        if request.method in ("POST", "PUT") and not self._known_email(headers.get("From")):
            return _error(400, "Invalid Input Provided", 2001, "Requester User Not Found")
        response = await handler(request)
        if key in self._holds:
            await self._holds[key].wait()
        return response

    def _known_email(self, email: str | None) -> bool:
        return email is not None and any(u["email"] == email for u in self.users.values())

    async def _oncalls(self, request: web.Request) -> web.Response:
        q = request.query
        schedules = q.getall("schedule_ids[]", [])
        policies = q.getall("escalation_policy_ids[]", [])
        users = "users" in q.getall("include[]", [])
        found = [
            o
            for o in self.oncalls
            if (not schedules or o.schedule in schedules)
            and (not policies or o.escalation_policy in policies)
        ]
        limit, offset = int(q.get("limit", "25")), int(q.get("offset", "0"))
        page = found[offset : offset + limit]
        return web.json_response(
            {
                "oncalls": [self._oncall(o, users) for o in page],
                "limit": limit,
                "offset": offset,
                "more": offset + limit < len(found),
                "total": None,
            }
        )

    def _oncall(self, o: OnCall, users: bool) -> dict[str, Any]:
        user = self.users[o.user]
        return {
            "user": dict(user) if users else _reference(user, "user_reference"),
            "schedule": _schedule(o.schedule) if o.schedule else None,
            "escalation_policy": {
                "id": o.escalation_policy,
                "type": "escalation_policy_reference",
                "summary": f"Policy {o.escalation_policy}",
            },
            "escalation_level": o.level,
            "start": _iso(self._clock - timedelta(hours=8)),
            "end": _iso(self._clock + timedelta(hours=16)),
        }

    async def _user(self, request: web.Request) -> web.Response:
        user = self.users.get(request.match_info["id"])
        if user is None:
            return _error(404, "Not Found", 2100)
        return web.json_response({"user": user})

    async def _incidents(self, request: web.Request) -> web.Response:
        q = request.query
        statuses = q.getall("statuses[]", []) or list(STATUSES)
        services = q.getall("service_ids[]", [])
        limit = int(q.get("limit", "25"))
        found = [
            i
            for i in sorted(self.incidents.values(), key=lambda i: i.created_at, reverse=True)
            if i.status in statuses and (not services or i.service in services)
        ]
        return web.json_response(
            {
                "incidents": [self._incident_json(i) for i in found[:limit]],
                "limit": limit,
                "offset": 0,
                "more": len(found) > limit,
                "total": None,
            }
        )

    def _incident_json(self, i: Incident) -> dict[str, Any]:
        return {
            "id": i.id,
            "type": "incident",
            "incident_number": i.number,
            "title": i.title,
            "summary": f"[#{i.number}] {i.title}",
            "status": i.status,
            "urgency": i.urgency,
            "created_at": i.created_at,
            "service": {"id": i.service, "type": "service_reference", "summary": "API"},
            "assignments": [
                {"assignee": _reference(u, "user_reference")} for u in list(self.users.values())[:1]
            ],
            "html_url": f"https://acme.pagerduty.com/incidents/{i.id}",
        }

    def _find(self, request: web.Request) -> Incident | None:
        return self.incidents.get(request.match_info["id"])

    async def _incident(self, request: web.Request) -> web.Response:
        if (incident := self._find(request)) is None:
            return _error(404, "Not Found", 2100)
        return web.json_response({"incident": self._incident_json(incident)})

    async def _update(self, request: web.Request) -> web.Response:
        if (incident := self._find(request)) is None:
            return _error(404, "Not Found", 2100)
        body = await request.json()
        change = body.get("incident") if isinstance(body, dict) else None
        if not isinstance(change, dict) or change.get("type") not in (
            "incident",
            "incident_reference",
        ):
            return _error(400, "Invalid Input Provided", 2001, "Incident type is required")
        status = change.get("status")
        if status not in ("acknowledged", "resolved"):
            return _error(400, "Invalid Input Provided", 2001, "Status is invalid")
        if incident.status == "resolved":  # as PagerDuty: a resolved incident stays so
            return _error(400, "Arguments Caused Error", 2001, "Incident Already Resolved")
        incident.status = status
        if status == "resolved" and change.get("resolution"):
            incident.resolution = str(change["resolution"])
        return web.json_response({"incident": self._incident_json(incident)})

    async def _notes(self, request: web.Request) -> web.Response:
        if (incident := self._find(request)) is None:
            return _error(404, "Not Found", 2100)
        return web.json_response({"notes": incident.notes})

    async def _add_note(self, request: web.Request) -> web.Response:
        if (incident := self._find(request)) is None:
            return _error(404, "Not Found", 2100)
        body = await request.json()
        note = body.get("note") if isinstance(body, dict) else None
        content = note.get("content") if isinstance(note, dict) else None
        if not isinstance(content, str) or not content:
            return _error(400, "Invalid Input Provided", 2001, "Content is required")
        author = next(u for u in self.users.values() if u["email"] == request.headers["From"])
        self._clock += timedelta(seconds=1)
        added = {
            "id": f"PNOTE{len(incident.notes) + 1:04d}{incident.id}",
            "user": _reference(author, "user_reference"),
            "channel": {"summary": "The PagerDuty REST API"},
            "content": content,
            "created_at": _iso(self._clock),
        }
        incident.notes.append(added)
        return web.json_response({"note": added}, status=201)


def _schedule(schedule_id: str) -> dict[str, Any]:
    return {"id": schedule_id, "type": "schedule_reference", "summary": f"Schedule {schedule_id}"}


def _reference(user: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"id": user["id"], "type": kind, "summary": user["name"], "html_url": user["html_url"]}


def _error(status: int, message: str, code: int, *errors: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "code": code, "errors": list(errors)}}, status=status
    )


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
