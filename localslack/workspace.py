"""One Slack workspace's state: its people, channels and messages, open modals, Home tabs.

The Web API (:mod:`localslack.web_api`) reads and changes it as Slack would; ``opsloop
local``'s page reads it and hears of every change (:class:`Change`, passed to each
listener synchronously, in order). What must survive a restart (messages, Home tabs,
events not yet delivered) is in :meth:`Workspace.snapshot`; ephemeral messages and
modals are not, as in Slack, where neither outlives the client showing it.

``open_world``: any channel id is a channel the bot is in and any well-formed user id is
a person (the tests' fake Slack); otherwise only the roster's exist.

No I/O here.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from localslack import streams as st
from localslack.identity import Channel, Identity, bot_record, user_record

log = logging.getLogger("opsloop.local.workspace")

SNAPSHOT_VERSION = 1
MAX_EPHEMERALS = 1000
TRIGGER_TTL_S = 3.0  # a trigger_id expires 3 s after the click (Slack's rule)
# Slack ends a stream about five minutes after it started, whatever was appended since
# (https://github.com/slackapi/python-slack-sdk/issues/1859).
STREAM_TTL_S = 300.0
# assistant.threads.setStatus: "A two minute timeout applies, which will cause the status
# to be removed if no message has been sent" (and a message sent in the thread ends it).
STATUS_TTL_S = 120.0
_USER_ID = re.compile(r"^[UW][A-Z0-9]+$")
_TS = re.compile(r"^([0-9]{1,12})\.([0-9]{1,6})$")

ChangeKind = Literal[
    "message",  # a new message in a channel
    "message_changed",  # a message updated in place
    "ephemeral",  # a message only ``user`` sees
    "view_opened",  # a modal opened in ``user``'s client
    "view_updated",
    "view_closed",
    "home",  # ``user``'s App Home tab was published
    "stream_changed",  # a streamed message grew or ended (no event to the app)
    "agent_status",  # a thread's loading status or agent session changed
]


@dataclass(frozen=True)
class Change:
    """What just changed. ``user`` set: only that person's client may show it."""

    kind: ChangeKind
    data: dict[str, Any]
    channel: str | None = None
    user: str | None = None


Listener = Callable[[Change], None]


class TriggerError(Exception):
    """A trigger_id that cannot open a modal (``error`` is Slack's error code)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def ts_key(ts: str) -> tuple[int, int]:
    """A message ts as a sortable pair; ``ValueError`` if it is not one."""
    match = _TS.match(ts)
    if match is None:
        raise ValueError(f"not a message ts: {ts!r}")
    return int(match.group(1)), int(match.group(2).ljust(6, "0"))


class Workspace:
    """The state of one workspace with one app. Not thread-safe: one event loop uses it."""

    def __init__(
        self,
        identity: Identity,
        *,
        people: Iterable[dict[str, Any]] = (),
        channels: Iterable[Channel] = (),
        usergroups: dict[str, list[str]] | None = None,
        open_world: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.identity = identity
        self.open_world = open_world
        self.clock = clock
        self.users: dict[str, dict[str, Any]] = {u["id"]: u for u in people}
        self.channels: dict[str, Channel] = {c.id: c for c in channels}
        self.usergroups: dict[str, list[str]] = dict(usergroups or {})
        # channel -> messages in ts order (what conversations.replies reads)
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []  # every modal opened: trigger, view, user
        self.home_views: dict[str, dict[str, Any]] = {}  # user -> their published Home tab
        # Events stored with the message that caused them, until the app has them.
        self.outbox: dict[str, dict[str, Any]] = {}
        self.version = 0  # counts changes worth saving
        self._last_us = 0
        self._views = 0
        self._triggers: dict[str, tuple[str, float]] = {}  # trigger -> (user, issued at)
        self._triggers_used: set[str] = set()
        self._listeners: list[Listener] = []
        # The agent surfaces (localslack.agent_api). Settings first: tests shorten the
        # timeouts or advance the clock; agent_view off is an app not declared an agent.
        self.stream_ttl_s = STREAM_TTL_S
        self.status_ttl_s = STATUS_TTL_S
        self.agent_view = True
        self.streams_refused: dict[str, str] = {}  # channel -> chat.startStream's error
        self.streams: dict[str, dict[str, Any]] = {}  # "channel/ts" -> stream (streams.py)
        self.statuses: dict[str, dict[str, Any]] = {}  # "channel/thread_ts" -> loading status
        self.sessions: dict[str, dict[str, Any]] = {}  # "channel/thread_ts" -> agent session

    # --- listeners ----------------------------------------------------------------------

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with every change from now on; returns how to stop."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def _tell(self, change: Change) -> None:
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # one bad listener must not stop the Web API's answer
                log.exception("workspace listener failed kind=%s", change.kind)

    def touch(self) -> None:
        """Note a change that the next save must include."""
        self.version += 1

    # --- who and where ------------------------------------------------------------------

    def user(self, user_id: str) -> dict[str, Any] | None:
        """The user object of ``user_id`` (the bot included), or None."""
        if user_id in self.users:
            return self.users[user_id]
        if user_id == self.identity.bot_user_id:
            return bot_record(self.identity)
        if self.open_world and _USER_ID.match(user_id):
            return user_record(self.identity, user_id, user_id.lower())
        return None

    def channel(self, channel_id: str) -> Channel | None:
        if channel_id in self.channels:
            return self.channels[channel_id]
        if self.open_world and channel_id:
            return Channel(channel_id, channel_id.lower())
        return None

    def can_see(self, user: str, channel_id: str) -> bool:
        """Whether ``user`` is in ``channel_id`` (everyone is in every public channel)."""
        channel = self.channel(channel_id)
        return channel is not None and (not channel.is_im or channel.user == user)

    def im_of(self, user: str) -> Channel | None:
        return next((c for c in self.channels.values() if c.is_im and c.user == user), None)

    # --- messages -----------------------------------------------------------------------

    def next_ts(self) -> str:
        """A message ts from the clock, later than every one given or stored before."""
        now_us = int(self.clock() * 1_000_000)
        self._last_us = max(now_us, self._last_us + 1)
        return f"{self._last_us // 1_000_000}.{self._last_us % 1_000_000:06d}"

    def _note_ts(self, ts: str) -> None:
        try:
            seconds, micros = ts_key(ts)
        except ValueError:
            return
        self._last_us = max(self._last_us, seconds * 1_000_000 + micros)

    def add_message(self, channel: str, message: dict[str, Any]) -> dict[str, Any]:
        """Store a new message (its ``ts`` set) and tell the listeners."""
        self._note_ts(message["ts"])
        if message.get("bot_id") == self.identity.bot_id and message.get("thread_ts"):
            self.clear_status(channel, message["thread_ts"])  # the app answered
        messages = self.messages.setdefault(channel, [])
        messages.append(message)
        messages.sort(key=lambda m: _sort_key(m["ts"]))
        self.touch()
        self._tell(Change("message", message, channel=channel))
        return message

    def find(self, channel: str, ts: Any) -> dict[str, Any] | None:
        return next((m for m in self.messages.get(channel, []) if m["ts"] == ts), None)

    def changed(self, channel: str, message: dict[str, Any], previous: dict[str, Any]) -> None:
        """``message`` (stored) was changed in place from ``previous``."""
        self.touch()
        self._tell(Change("message_changed", {"message": message, "previous": previous}, channel))

    def thread(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The root message ``ts`` and its replies, in order."""
        return [
            m for m in self.messages.get(channel, []) if m["ts"] == ts or m.get("thread_ts") == ts
        ]

    def replies_summary(self, channel: str, root: dict[str, Any]) -> dict[str, Any]:
        """The thread fields Slack adds to a root message that has replies."""
        replies = [m for m in self.thread(channel, root["ts"]) if m["ts"] != root["ts"]]
        if not replies:
            return {}
        return {
            "thread_ts": root["ts"],
            "reply_count": len(replies),
            "reply_users": sorted({r.get("user", "") for r in replies}),
            "latest_reply": replies[-1]["ts"],
        }

    def add_ephemeral(self, record: dict[str, Any]) -> None:
        """A message only ``record["user"]`` sees, until their client forgets it (here:
        a restart, or once ``MAX_EPHEMERALS`` newer ones came)."""
        self.ephemerals.append(record)
        del self.ephemerals[:-MAX_EPHEMERALS]
        self._tell(Change("ephemeral", record, channel=record.get("channel"), user=record["user"]))

    def ephemerals_for(self, user: str, channel: str) -> list[dict[str, Any]]:
        return [e for e in self.ephemerals if e["user"] == user and e["channel"] == channel]

    # --- the agent surfaces: streams, loading statuses, agent sessions -------------------

    def add_stream(self, channel: str, message: dict[str, Any], stream: dict[str, Any]) -> None:
        """A streamed message starts: stored like a post (the app hears of it too)."""
        self.streams[f"{channel}/{message['ts']}"] = stream
        message["text"], message["blocks"] = st.show(stream)
        self.add_message(channel, message)

    def stream(self, channel: str, ts: Any) -> dict[str, Any] | None:
        """The stream of the message ``ts``, ended first if Slack's time for it is up."""
        stream = self.streams.get(f"{channel}/{ts}")
        if stream is not None and st.is_open(stream):
            at = stream["started_at"] + self.stream_ttl_s
            if self.clock() >= at:
                st.end(stream, "expired", at)
                self.stream_changed(stream)
        return stream

    def stream_changed(self, stream: dict[str, Any]) -> None:
        """Show ``stream`` as it now is in its message (the page hears; the app does not)."""
        message = self.find(stream["channel"], stream["ts"])
        if message is None:
            return
        message["text"], message["blocks"] = st.show(stream)
        self.touch()
        self._tell(Change("stream_changed", {"message": message}, channel=stream["channel"]))

    def streams_in(self, channel: str, thread_ts: str) -> list[dict[str, Any]]:
        found = (self.stream(channel, m["ts"]) for m in self.thread(channel, thread_ts))
        return [s for s in found if s is not None]

    def stop_by_user(self, channel: str, thread_ts: str) -> list[str]:
        """The stop button of the thread's agent session: Slack stops the app's open
        streams there and names them in ``agent_session_stopped``; the session's status
        stays as it was (the app moves it on)."""
        stopped = [s for s in self.streams_in(channel, thread_ts) if st.is_open(s)]
        for stream in stopped:
            st.end(stream, "stopped_by_user", self.clock())
            self.stream_changed(stream)
        return [s["ts"] for s in stopped]

    def set_status(self, channel: str, thread_ts: str, status: str, loading: list[str]) -> None:
        """The thread's loading status ("" clears it)."""
        key = f"{channel}/{thread_ts}"
        if status:
            self.statuses[key] = {"status": status, "loading_messages": loading, "at": self.clock()}
        elif self.statuses.pop(key, None) is None:
            return
        self._tell(Change("agent_status", {"thread_ts": thread_ts}, channel=channel))

    def clear_status(self, channel: str, thread_ts: str) -> None:
        self.set_status(channel, thread_ts, "", [])

    def status_of(self, channel: str, thread_ts: str) -> dict[str, Any] | None:
        """The loading status shown under the thread now (None once its time is up)."""
        status = self.statuses.get(f"{channel}/{thread_ts}")
        if status is None or self.clock() - status["at"] >= self.status_ttl_s:
            return None
        return status

    def set_session(self, channel: str, thread_ts: str | None, **fields: Any) -> None:
        """Create or update the agent session of the thread (of the DM: ``thread_ts``
        None); fields given as None are left as they were."""
        key = f"{channel}/{thread_ts or ''}"
        session = self.sessions.setdefault(key, {"channel": channel, "thread_ts": thread_ts})
        session.update({k: v for k, v in fields.items() if v is not None})
        session["at"] = self.clock()
        self.touch()
        self._tell(Change("agent_status", {"thread_ts": thread_ts}, channel=channel))

    def session_of(self, channel: str, thread_ts: str | None) -> dict[str, Any] | None:
        return self.sessions.get(f"{channel}/{thread_ts or ''}")

    # --- modals and Home ----------------------------------------------------------------

    def issue_trigger(self, user: str) -> str:
        """A trigger_id for something ``user`` just did (a click, a command)."""
        now = time.monotonic()
        self._triggers = {t: v for t, v in self._triggers.items() if now - v[1] < 60}
        trigger = f"{int(self.clock())}.{secrets.randbelow(10**12)}.{secrets.token_hex(16)}"
        self._triggers[trigger] = (user, now)
        return trigger

    def exchange_trigger(self, trigger: str) -> str | None:
        """Use ``trigger`` once; the user it was issued to (None in an open world, where
        any trigger works once). ``TriggerError`` with Slack's code otherwise."""
        if trigger in self._triggers_used:
            raise TriggerError("exchanged_trigger_id")
        issued = self._triggers.get(trigger)
        if issued is None and not self.open_world:
            raise TriggerError("invalid_trigger_id")
        if issued is not None and time.monotonic() - issued[1] > TRIGGER_TTL_S:
            raise TriggerError("expired_trigger_id")
        self._triggers_used.add(trigger)
        return issued[0] if issued else None

    def next_view_id(self) -> str:
        self._views += 1
        return f"V0{self._views:04d}{secrets.token_hex(3).upper()}"

    def open_view(self, trigger: str, view: dict[str, Any], user: str | None) -> None:
        self.views.append({"trigger_id": trigger, "view": view, "user": user, "open": True})
        if user:
            self._tell(Change("view_opened", view, user=user))

    def open_view_record(self, view_id: str) -> dict[str, Any] | None:
        return next((v for v in self.views if v["view"]["id"] == view_id and v["open"]), None)

    def update_view(self, view_id: str, view: dict[str, Any]) -> None:
        record = self.open_view_record(view_id)
        if record is None:
            return
        record["view"] = view
        if record["user"]:
            self._tell(Change("view_updated", view, user=record["user"]))

    def close_view(self, view_id: str) -> None:
        record = self.open_view_record(view_id)
        if record is None:
            return
        record["open"] = False
        if record["user"]:
            self._tell(Change("view_closed", {"id": view_id}, user=record["user"]))

    def open_views_of(self, user: str) -> list[dict[str, Any]]:
        return [v["view"] for v in self.views if v["open"] and v["user"] == user]

    def publish_home(self, user: str, view: dict[str, Any]) -> None:
        self.home_views[user] = view
        self.touch()
        self._tell(Change("home", view, user=user))

    # --- saving -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What survives a restart, as JSON-ready data."""
        return {
            "version": SNAPSHOT_VERSION,
            "team_id": self.identity.team_id,
            "last_ts": self._last_us,
            "messages": self.messages,
            "home_views": self.home_views,
            "outbox": self.outbox,
            "streams": self.streams,
            "sessions": self.sessions,
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Load a :meth:`snapshot` (``ValueError`` if it is not one)."""
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
            raise ValueError("not a saved workspace (or one of another version)")
        messages = data.get("messages") or {}
        if not isinstance(messages, dict) or not all(
            isinstance(v, list) and all(isinstance(m, dict) and "ts" in m for m in v)
            for v in messages.values()
        ):
            raise ValueError("the saved messages are malformed")
        self.messages = {
            c: sorted(v, key=lambda m: _sort_key(m["ts"])) for c, v in messages.items()
        }
        self.home_views = dict(data.get("home_views") or {})
        self.outbox = dict(data.get("outbox") or {})
        streams = data.get("streams") or {}
        if not isinstance(streams, dict) or not all(
            isinstance(v, dict) and _STREAM_KEYS <= v.keys() for v in streams.values()
        ):
            raise ValueError("the saved streams are malformed")
        self.streams = dict(streams)
        self.sessions = dict(data.get("sessions") or {})
        self._last_us = max(self._last_us, int(data.get("last_ts") or 0))


_STREAM_KEYS = frozenset(st.new_stream(channel="", ts="", thread_ts="", mode="", started_at=0))


def _sort_key(ts: str) -> tuple[int, int]:
    try:
        return ts_key(ts)
    except ValueError:
        return (0, 0)
