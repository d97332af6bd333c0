"""The page's JSON API: read the workspace, act in it as one of its people, read a trace.

Everything a person does becomes what Slack would send the app (:mod:`localslack.app_link`):
a message is stored, then its events are delivered; a click is a signed
``block_actions``; the stop button of a thread's agent session an ``agent_session_stopped``
event; a modal's submit a ``view_submission`` whose answer the page shows
(``response_action: errors`` keeps the modal open with them).

    GET  /                                   the page (static/index.html)
    GET  /static/{app.js,style.css,...}      its script and style
    GET  /ui/workspace?user=U                team, bot, people, channels, model, suggestions
    GET  /ui/channels/{C}/messages?user=U    top-level messages (with thread summaries)
    GET  /ui/channels/{C}/threads/{ts}?user=U  a thread: root, replies, the user's ephemerals
    POST /ui/messages     {user, channel, text, thread_ts?}   write (or run /opsloop …)
    POST /ui/actions      {user, channel, message_ts, action_id, block_id?, value?}
                                             click a button (``value``: which of a
                                             feedback_buttons element's two)
    POST /ui/agent/stop   {user, channel, thread_ts}  the agent session's stop button
    GET  /ui/views?user=U                    the user's open modals
    POST /ui/views/{id}/submit {user, values: {block_id: {action_id: text}}}
    POST /ui/views/{id}/close  {user}
    GET  /ui/home?user=U | POST /ui/home {user}   the App Home tab (POST opens it)
    GET  /ui/events?user=U                   server-sent events (:mod:`localslack.live`)
    GET  /ui/trace?channel=C&ts=TS           the thread's log: ``events`` as ``opsloop trace
                                             --json`` has them, a ``summaries`` line each
    GET  /ui/replay?channel=C&ts=TS&seq=N    a decision's request, as ``opsloop replay --json``
    POST /ui/alerts       {user}             fire an alert: a signed ``POST /alerts/generic``

Bad input is a 4xx with ``{"error": "one line"}``. Requests must name this server in
``Host`` (no DNS rebinding) and writes must be JSON from this origin (no cross-site
form posts): a page elsewhere in the browser can neither read nor act here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from engine.errors import StoreUnavailable, ThreadNotFound
from engine.store import Store, ThreadKey
from engine.trace import summarize, thread_record, trace_record, usage_totals
from localslack import slack_requests as sr
from localslack.app_link import AppLink
from localslack.identity import Person
from localslack.integrations import LocalIntegrations
from localslack.live import Live
from localslack.page_input import (
    BadRequest,
    Click,
    PostMessage,
    StopAgent,
    Submit,
    UserOnly,
    feedback_button,
    find_element,
    group_handle,
    parse,
    person_text,
    view_state,
)
from localslack.workspace import Change, Workspace

log = logging.getLogger("opsloop.local.ui")

STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {"app.js", "style.css", "mrkdwn.js", "markdown.js", "blocks.js", "favicon.svg"}
MAX_TEXT = 40_000  # Slack's limit on a message's text
LIST_LIMIT = 200
COMMANDS = ("/opsloop",)
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class ModelInfo:
    """Which model decides, for the page: ``claude`` (its model id) or ``offline``."""

    kind: Literal["claude", "offline", "other"]
    name: str
    suggestions: tuple[tuple[str, str], ...] = ()


# --- the API ---------------------------------------------------------------------------


@dataclass
class LocalUi:
    """The page and its API over ``workspace``; ``link`` reaches the app, ``store`` the
    threads' logs, ``save`` persists the workspace."""

    workspace: Workspace
    link: AppLink
    people: tuple[Person, ...]
    model: ModelInfo
    save: Callable[[], Awaitable[None]]
    store: Store | None = None
    tools: Callable[[], Iterable[Any]] = lambda: ()
    hosts: frozenset[str] | None = None  # Host headers accepted; None: any
    base_url: str = ""
    alerts: LocalIntegrations | None = None  # fires the page's alerts
    closing: bool = False
    live: Live = field(init=False)

    def __post_init__(self) -> None:
        self.live = Live(self.workspace)
        self._stop_listening = self.workspace.listen(self._changed)

    def _changed(self, change: Change) -> None:
        """Tell the pages: a channel's members, or only ``change.user``."""
        channel = change.channel
        if change.kind in ("message", "message_changed", "stream_changed"):
            message = change.data if change.kind == "message" else change.data["message"]
            data = {"channel": channel, "message": self.shown(channel, message)}
            kind = "message" if change.kind == "message" else "message_changed"
            self.live.publish(kind, data, channel=channel)
        elif change.kind == "agent_status":
            data = {"channel": channel, "thread_ts": change.data["thread_ts"]}
            self.live.publish("agent_status", data, channel=channel)
        elif change.kind == "ephemeral":
            data = {"channel": channel, "message": self.ephemeral(change.data)}
            self.live.publish("ephemeral", data, channel=channel, user=change.user)
        elif change.kind == "view_closed":
            self.live.publish("view_closed", {"id": change.data["id"]}, user=change.user)
        else:  # view_opened, view_updated, home
            self.live.publish(change.kind, {"view": change.data}, user=change.user)

    def add_routes(self, app: web.Application) -> None:
        get, post = app.router.add_get, app.router.add_post
        get("/", self._guard(self.index))
        get("/static/{name}", self._guard(self.static))
        get("/ui/workspace", self._guard(self.info))
        get("/ui/channels/{channel}/messages", self._guard(self.channel_messages))
        get("/ui/channels/{channel}/threads/{ts}", self._guard(self.thread))
        post("/ui/messages", self._guard(self.post_message))
        post("/ui/actions", self._guard(self.click))
        get("/ui/views", self._guard(self.open_views))
        post("/ui/views/{view_id}/submit", self._guard(self.submit))
        post("/ui/views/{view_id}/close", self._guard(self.close_view))
        get("/ui/home", self._guard(self.home))
        post("/ui/home", self._guard(self.open_home))
        get("/ui/events", self._guard(self.events))
        get("/ui/trace", self._guard(self.trace))
        get("/ui/replay", self._guard(self.replay))
        post("/ui/alerts", self._guard(self.fire_alert))
        post("/ui/agent/stop", self._guard(self.stop_agent))
        app.middlewares.append(_json_errors)

    async def close(self) -> None:
        self.closing = True
        self._stop_listening()
        await self.live.close()

    # --- guards and helpers -----------------------------------------------------------

    def _guard(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                self._check_origin(request)
                if self.closing and request.path.startswith("/ui/"):
                    raise BadRequest("the local workspace is shutting down", 503)
                return await handler(request)
            except BadRequest as exc:
                return _error(str(exc), exc.status)
            except StoreUnavailable as exc:
                return _error(f"the database is not answering: {exc}", 503)
            except Exception:  # a bug: logged with its traceback, answered in one line
                log.exception("%s %s failed", request.method, request.path)
                return _error("internal error (see the server's log)", 500)

        return guarded

    def _check_origin(self, request: web.Request) -> None:
        if self.hosts is not None and request.host.lower() not in self.hosts:
            raise BadRequest(f"unexpected Host {request.host!r}: open {self.base_url}", 421)
        if request.method == "POST":
            origin = request.headers.get("Origin")
            if origin and self.base_url and origin.rstrip("/") != self._origin(request):
                raise BadRequest("cross-origin requests are refused", 403)
            if request.content_type != "application/json":
                raise BadRequest("send JSON (Content-Type: application/json)", 415)

    @staticmethod
    def _origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _user(self, user: str | None) -> str:
        if not user:
            raise BadRequest("say who you are: ?user=U…")
        if user not in self.workspace.users:
            raise BadRequest(f"unknown user {user!r}")
        return user

    def _channel(self, user: str, channel: str) -> Any:
        found = self.workspace.channels.get(channel)
        if found is None or not self.workspace.can_see(user, channel):
            raise BadRequest(f"no channel {channel!r} for {user}", 404)
        return found

    def ephemeral(self, record: dict[str, Any]) -> dict[str, Any]:
        """An ephemeral message (from the bot) as the page shows it."""
        identity = self.workspace.identity
        return {
            "type": "message",
            "ephemeral": True,
            "ts": record["message_ts"],
            "text": record.get("text") or "",
            "blocks": record.get("blocks") or None,
            "thread_ts": record.get("thread_ts") or None,
            "user": identity.bot_user_id,
            "bot_id": identity.bot_id,
            "channel": record["channel"],
        }

    def shown(self, channel: str | None, message: dict[str, Any]) -> dict[str, Any]:
        """A message as the page shows it: a thread root with its reply summary; a
        streamed message with its ``stream`` (``state``, display ``mode``, and while open
        the seconds until Slack ends it, ``expires_in``)."""
        if channel is None:
            return message
        ws = self.workspace
        stream = ws.stream(channel, message["ts"])
        if stream is not None:
            shown = {"state": stream["state"], "mode": stream["mode"]}
            if stream["state"] == "streaming":  # when the page looks again: Slack ends it
                shown["expires_in"] = stream["started_at"] + ws.stream_ttl_s - ws.clock()
            message = {**message, "stream": shown}
        if message.get("thread_ts", message["ts"]) != message["ts"]:
            return message
        return {**message, **self.workspace.replies_summary(channel, message)}

    def agent(self, channel: str, thread_ts: str) -> dict[str, Any]:
        """What shows under the thread: the loading status (with the seconds it has
        left, ``expires_in``) and the agent session."""
        ws = self.workspace
        status = ws.status_of(channel, thread_ts)
        session = ws.session_of(channel, thread_ts)
        return {
            "status": status
            and {
                "status": status["status"],
                "loading_messages": status["loading_messages"],
                "expires_in": status["at"] + ws.status_ttl_s - ws.clock(),
            },
            "session": session and {"status": session.get("status"), "title": session.get("title")},
        }

    # --- the page ---------------------------------------------------------------------

    async def index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers=SECURITY_HEADERS)

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC_FILES or not (STATIC_DIR / name).is_file():
            raise BadRequest(f"no file {name!r}", 404)
        return web.FileResponse(STATIC_DIR / name, headers=SECURITY_HEADERS)

    async def info(self, request: web.Request) -> web.Response:
        user = request.query.get("user")
        ws, identity = self.workspace, self.workspace.identity
        channels = [c.record() for c in ws.channels.values() if not user or ws.can_see(user, c.id)]
        return web.json_response(
            {
                "team": {
                    "id": identity.team_id,
                    "name": identity.team_name,
                    "domain": identity.team_domain,
                    "url": identity.url,
                },
                "bot": {"id": identity.bot_user_id, "name": identity.bot_name},
                "users": [
                    {
                        "id": p.id,
                        "name": p.name,
                        "real_name": p.real_name,
                        "role": p.role,
                        "color": p.color,
                    }
                    for p in self.people
                ],
                "channels": channels,
                "usergroups": [
                    {"id": gid, "handle": group_handle(gid), "users": members}
                    for gid, members in ws.usergroups.items()
                ],
                "model": {
                    "kind": self.model.kind,
                    "name": self.model.name,
                    "suggestions": [
                        {"phrase": phrase, "does": does} for phrase, does in self.model.suggestions
                    ],
                },
                "alerts": self._alerts_info(),
                "boot": self.live.boot,
            }
        )

    def _alerts_info(self) -> dict[str, str] | None:
        """Where a fired alert opens its thread; None: the page has no alert to fire."""
        channel = self.alerts.alert_channel if self.alerts is not None else None
        return {"channel": channel} if channel else None

    async def channel_messages(self, request: web.Request) -> web.Response:
        user = self._user(request.query.get("user"))
        channel = self._channel(user, request.match_info["channel"])
        messages = self.workspace.messages.get(channel.id, [])
        top = [m for m in messages if m.get("thread_ts", m["ts"]) == m["ts"]][-LIST_LIMIT:]
        mine = [
            self.ephemeral(e)
            for e in self.workspace.ephemerals_for(user, channel.id)
            if not e.get("thread_ts")
        ]
        return web.json_response(
            {
                "channel": channel.record(),
                "messages": [self.shown(channel.id, m) for m in top],
                "ephemerals": mine,
            }
        )

    async def thread(self, request: web.Request) -> web.Response:
        user = self._user(request.query.get("user"))
        channel = self._channel(user, request.match_info["channel"])
        ts = request.match_info["ts"]
        root = self.workspace.find(channel.id, ts)
        if root is None or root.get("thread_ts", ts) != ts:
            raise BadRequest(f"no thread {ts!r} in {channel.id}", 404)
        thread = self.workspace.thread(channel.id, ts)
        mine = [
            self.ephemeral(e)
            for e in self.workspace.ephemerals_for(user, channel.id)
            if e.get("thread_ts") == ts
        ]
        return web.json_response(
            {
                "channel": channel.record(),
                "root": self.shown(channel.id, thread[0]),
                "replies": [self.shown(channel.id, m) for m in thread[1:]],
                "agent": self.agent(channel.id, ts),
                "ephemerals": mine,
            }
        )

    # --- writing ----------------------------------------------------------------------

    async def post_message(self, request: web.Request) -> web.Response:
        body = await parse(request, PostMessage)
        user = self._user(body.user)
        channel = self._channel(user, body.channel)
        if len(body.text) > MAX_TEXT:
            raise BadRequest(f"a message holds at most {MAX_TEXT} characters")
        if not body.text.strip():
            raise BadRequest("write something first")
        if body.text.startswith("/"):
            return await self._command(user, channel, body.text, body.thread_ts)
        message: dict[str, Any] = {
            "type": "message",
            "user": user,
            "text": person_text(body.text, self.workspace, self.people),
            "ts": self.workspace.next_ts(),
            "team": self.workspace.identity.team_id,
            "client_msg_id": str(uuid.uuid4()),
        }
        message["blocks"] = sr.rich_text(message["text"])
        if body.thread_ts:
            root = self.workspace.find(channel.id, body.thread_ts)
            if root is None or root.get("thread_ts", root["ts"]) != root["ts"]:
                raise BadRequest(f"no thread {body.thread_ts!r} in {channel.id}", 404)
            message["thread_ts"] = root["ts"]
            message["parent_user_id"] = root.get("user", "")
        self.workspace.add_message(channel.id, message)  # its events go to the outbox
        await self.save()
        return web.json_response({"channel": channel.id, "message": message}, status=201)

    async def _command(
        self, user: str, channel: Any, text: str, thread_ts: str | None
    ) -> web.Response:
        command, _, rest = text.partition(" ")
        if command not in COMMANDS:
            raise BadRequest(f"{command} is not a command here (try /opsloop help)")
        person = self.workspace.users[user]
        fields = sr.slash_command_payload(
            self.workspace.identity,
            user=user,
            text=rest.strip(),
            channel=channel.id,
            command=command,
            user_name=person["name"],
            channel_name=channel.name,
            trigger_id=self.workspace.issue_trigger(user),
            response_url=f"{self.base_url}ui/response/{uuid.uuid4().hex}",
        )
        answer = await self.link.command(fields)
        if not answer.ok:
            return web.json_response(
                {"ok": False, "error": f"/opsloop failed: the app answered {answer.why()}"}
            )
        reply = answer.json() or {}
        if reply.get("text") or reply.get("blocks"):
            self.workspace.add_ephemeral(
                {
                    "channel": channel.id,
                    "user": user,
                    "text": str(reply.get("text") or ""),
                    "blocks": reply.get("blocks"),
                    "thread_ts": thread_ts,
                    "message_ts": self.workspace.next_ts(),
                }
            )
        return web.json_response({"ok": True, "command": command})

    async def click(self, request: web.Request) -> web.Response:
        body = await parse(request, Click)
        user = self._user(body.user)
        channel = self._channel(user, body.channel)
        message = self.workspace.find(channel.id, body.message_ts)
        if message is None:
            raise BadRequest(f"no message {body.message_ts!r} in {channel.id}", 404)
        found = find_element(message.get("blocks") or [], body.action_id, body.block_id)
        if found is None:
            raise BadRequest(f"no button {body.action_id!r} on that message", 404)
        block_id, element = found
        hidden = ("metadata", "stream")  # what Slack does not put in a click's message
        shown = {k: v for k, v in self.shown(channel.id, message).items() if k not in hidden}
        common: dict[str, Any] = {
            "user": user,
            "action_id": body.action_id,
            "channel": channel.id,
            "message_ts": message["ts"],
            "trigger_id": self.workspace.issue_trigger(user),
            "block_id": block_id,
            "thread_ts": message.get("thread_ts"),
            "message": shown,
            "user_name": self.workspace.users[user]["name"],
            "channel_name": channel.name,
            "response_url": f"{self.base_url}ui/response/{uuid.uuid4().hex}",
        }
        identity = self.workspace.identity
        if element.get("type") == "feedback_buttons":
            button = feedback_button(element, body.value)
            text = str((button.get("text") or {}).get("text") or "")
            value = str(button.get("value") or "")
            payload = sr.feedback_buttons_payload(identity, value=value, text=text, **common)
        else:
            text = str((element.get("text") or {}).get("text") or "")
            value = str(element.get("value") or "")
            style = element.get("style")
            payload = sr.block_actions_payload(
                identity, value=value, text=text, style=style, **common
            )
        answer = await self.link.interaction(payload)
        result: dict[str, Any] = {"ok": answer.ok, "status": answer.status}
        if not answer.ok:
            result["error"] = f"the app did not take the click ({answer.why()})"
        return web.json_response(result)

    async def stop_agent(self, request: web.Request) -> web.Response:
        """The stop button of a thread's agent session (shown while it is processing):
        Slack stops the app's streams in the thread and tells the app who pressed it."""
        body = await parse(request, StopAgent)
        user = self._user(body.user)
        channel = self._channel(user, body.channel)
        session = self.workspace.session_of(channel.id, body.thread_ts)
        if session is None or session.get("status") != "processing":
            raise BadRequest("nothing to stop: the thread's agent is not working", 409)
        stopped = self.workspace.stop_by_user(channel.id, body.thread_ts)
        event = sr.agent_session_stopped_event(
            self.workspace.identity,
            user=user,
            channel=channel.id,
            thread_ts=body.thread_ts,
            streaming_message_ts=stopped,
        )
        self.link.send_events([event])
        await self.save()
        return web.json_response({"ok": True, "stopped": stopped}, status=202)

    async def open_views(self, request: web.Request) -> web.Response:
        user = self._user(request.query.get("user"))
        return web.json_response({"views": self.workspace.open_views_of(user)})

    def _open_view(self, user: str, view_id: str) -> dict[str, Any]:
        record = self.workspace.open_view_record(view_id)
        if record is None or record["user"] != user:
            raise BadRequest(f"no open modal {view_id!r} for {user}", 404)
        return record["view"]

    async def submit(self, request: web.Request) -> web.Response:
        body = await parse(request, Submit)
        user = self._user(body.user)
        view = self._open_view(user, request.match_info["view_id"])
        values, errors = view_state(view, body.values)
        if errors:  # Slack's client checks these before anything is sent
            return web.json_response({"ok": False, "errors": errors})
        submitted = {**view, "state": {"values": values}}
        payload = sr.view_submission(
            self.workspace.identity,
            user=user,
            view=submitted,
            trigger_id=self.workspace.issue_trigger(user),
            user_name=self.workspace.users[user]["name"],
        )
        answer = await self.link.interaction(payload)
        if not answer.ok:
            error = f"the app did not take it ({answer.why()}); try again"
            return web.json_response({"ok": False, "error": error})
        reply = answer.json() or {}
        action = reply.get("response_action")
        if action == "errors" and isinstance(reply.get("errors"), dict):
            errors = {str(k): str(v) for k, v in reply["errors"].items()}
            return web.json_response({"ok": False, "errors": errors})
        if action in ("update", "push") and isinstance(reply.get("view"), dict):
            updated = {**view, **reply["view"], "state": {"values": {}}}
            self.workspace.update_view(view["id"], updated)
            return web.json_response({"ok": True, "view": updated})
        self.workspace.close_view(view["id"])  # no answer, or "clear": the modal closes
        return web.json_response({"ok": True, "closed": True})

    async def close_view(self, request: web.Request) -> web.Response:
        body = await parse(request, UserOnly)
        user = self._user(body.user)
        view = self._open_view(user, request.match_info["view_id"])
        self.workspace.close_view(view["id"])
        if view.get("notify_on_close"):
            payload = sr.view_closed(self.workspace.identity, user=user, view=view)
            await self.link.interaction(payload)
        return web.json_response({"ok": True, "closed": True})

    async def home(self, request: web.Request) -> web.Response:
        user = self._user(request.query.get("user"))
        return web.json_response({"view": self.workspace.home_views.get(user)})

    async def open_home(self, request: web.Request) -> web.Response:
        body = await parse(request, UserOnly)
        user = self._user(body.user)
        im = self.workspace.im_of(user)
        event = sr.app_home_opened_event(
            self.workspace.identity, user=user, channel=im.id if im else "D0HOME"
        )
        self.link.send_events([event])
        return web.json_response({"ok": True}, status=202)

    async def fire_alert(self, request: web.Request) -> web.Response:
        """What a monitoring system does: one new alert, signed, to the app's route."""
        body = await parse(request, UserOnly)
        user = self._user(body.user)
        if self.alerts is None or self.alerts.alert_channel is None:
            raise BadRequest("the configuration has no alerts.generic: no alert to fire", 409)
        sent = await self.alerts.fire_alert(self.workspace.users[user]["name"])
        result: dict[str, Any] = {
            "ok": sent.ok,
            "status": sent.status,
            "channel": self.alerts.alert_channel,
        }
        if not sent.ok:
            why = sent.answer.get("error") or f"HTTP {sent.status}"
            result["error"] = f"the app did not take the alert: {why}"
        return web.json_response(result)

    async def events(self, request: web.Request) -> web.StreamResponse:
        user = self._user(request.query.get("user"))
        return await self.live.handle(request, user)

    # --- the thread's log -------------------------------------------------------------

    async def _thread_info(self, request: web.Request) -> Any:
        if self.store is None:
            raise BadRequest("no event store in this workspace", 503)
        channel, ts = request.query.get("channel", ""), request.query.get("ts", "")
        if not channel or not ts:
            raise BadRequest("say which thread: ?channel=C…&ts=…")
        key = ThreadKey(self.workspace.identity.team_id, channel, ts)
        thread_id = await self.store.find_thread(key)
        if thread_id is None:
            raise BadRequest(f"no agent thread at {channel}/{ts} (yet)", 404)
        return await self.store.get_thread(thread_id)

    async def trace(self, request: web.Request) -> web.Response:
        info = await self._thread_info(request)
        events = await self.store.select_events(info.id)  # type: ignore[union-attr]
        return web.json_response(
            {
                "thread": thread_record(info),  # type: ignore[arg-type]
                "events": [trace_record(e) for e in events],
                "summaries": [summarize(e) for e in events],
                "usage": usage_totals(events),
            }
        )

    async def replay(self, request: web.Request) -> web.Response:
        from engine.replay import replay

        info = await self._thread_info(request)
        raw_seq = request.query.get("seq")
        try:
            seq = int(raw_seq) if raw_seq else None
        except ValueError:
            raise BadRequest(f"seq must be a number, not {raw_seq!r}") from None
        events = await self.store.select_events(info.id)  # type: ignore[union-attr]
        try:
            result = replay(events, list(self.tools()), seq)
        except ThreadNotFound as exc:
            raise BadRequest(str(exc), 404) from None
        return web.json_response(
            {
                "thread_id": info.id,
                "seq": result.decision.seq,
                "matches": result.matches,
                "verdict": result.verdict(),
                "request": result.prompt.body(),
            }
        )


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": " ".join(message.split())}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Under ``/ui/``, aiohttp's own 404 and 405 are one-line JSON too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/ui/"):
            raise
        return _error(exc.reason, exc.status)
