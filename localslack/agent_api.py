"""The Web API methods of Slack's agent surfaces, answered as Slack answers them.

- ``assistant.threads.setStatus``: the loading status under a thread ("" clears it; up
  to 10 ``loading_messages``); it goes after two minutes of Slack's clock, or when the
  app posts in the thread.
- ``chat.startStream`` / ``chat.appendStream`` / ``chat.stopStream``: a streamed message
  (:mod:`localslack.streams`). Outside a DM a stream needs its ``recipient_user_id`` and
  ``recipient_team_id``. A stream stopped, ended by Slack (``Workspace.stream_ttl_s``
  after it started) or stopped with the session's stop button takes nothing more
  (``message_not_in_streaming_state``; ``stopped_by_user``). A channel in
  ``Workspace.streams_refused`` refuses streams with the error given there.
- ``agents.sessions.setStatus``: the thread's agent session (``not_authorized`` where
  the app is not declared an agent: ``Workspace.agent_view`` off).

https://docs.slack.dev/reference/methods/chat.startStream (and its siblings). Error codes
Slack documents are used as documented; ``stopped_by_user`` and ``streaming_state_conflict``
(chat.update of a message still streaming, :mod:`localslack.web_api`) are what the live
API answers, as reported by those who measured it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localslack import streams as st
from localslack.api_checks import ApiError, check_blocks, required
from localslack.identity import bot_message
from localslack.workspace import Workspace, ts_key

MAX_LOADING_MESSAGES = 10
SESSION_STATUSES = ("processing", "suspended", "active", "closed")

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class AgentApi:
    """The agent surfaces' methods over ``workspace`` (``handlers`` by method name)."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    @property
    def handlers(self) -> dict[str, Handler]:
        return {
            "assistant.threads.setStatus": self.set_thread_status,
            "chat.startStream": self.start_stream,
            "chat.appendStream": self.append_stream,
            "chat.stopStream": self.stop_stream,
            "agents.sessions.setStatus": self.set_session_status,
        }

    # --- the loading status and the agent session ----------------------------------------

    def set_thread_status(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(p, "channel_id")
        thread_ts = _thread_ts(p.get("thread_ts"))
        status = p.get("status")
        if not isinstance(status, str):
            raise ApiError("invalid_arguments")
        loading = p.get("loading_messages") or []
        if (
            not isinstance(loading, list)
            or len(loading) > MAX_LOADING_MESSAGES
            or not all(isinstance(m, str) for m in loading)
        ):
            raise ApiError("invalid_arguments")
        self.workspace.set_status(channel, thread_ts, status, loading)
        return {}

    def set_session_status(self, p: dict[str, Any]) -> dict[str, Any]:
        if not self.workspace.agent_view:
            raise ApiError("not_authorized")
        channel = self._channel(p, "channel_id")
        thread_ts = _thread_ts(p["thread_ts"]) if p.get("thread_ts") is not None else None
        status = p.get("status")
        if status not in SESSION_STATUSES:
            raise ApiError("invalid_arguments")
        title = p.get("title")
        if title is not None and not isinstance(title, str):
            raise ApiError("invalid_arguments")
        initiator = p.get("initiator_user_id")
        self.workspace.set_session(
            channel, thread_ts, status=status, title=title, initiator_user_id=initiator
        )
        return {}

    # --- streams -------------------------------------------------------------------------

    def start_stream(self, p: dict[str, Any]) -> dict[str, Any]:
        ws = self.workspace
        channel = self._channel(p, "channel")
        thread_ts = _thread_ts(p.get("thread_ts"))
        recipient = {k: p.get(k) for k in ("recipient_user_id", "recipient_team_id")}
        if not self._is_dm(channel):  # the person the stream is for, in a channel
            for key, value in recipient.items():
                if not value or not isinstance(value, str):
                    raise ApiError(f"missing_{key}")
        mode = p.get("task_display_mode") or st.DEFAULT_MODE
        if mode not in st.DISPLAY_MODES:
            raise ApiError("invalid_arguments")
        text, chunks = self._content(p)
        if channel in ws.streams_refused:
            raise ApiError(ws.streams_refused[channel])
        message = bot_message(ws.identity, ws.next_ts())
        message["thread_ts"] = thread_ts
        stream = st.new_stream(
            channel=channel,
            ts=message["ts"],
            thread_ts=thread_ts,
            mode=mode,
            started_at=ws.clock(),
            **recipient,
        )
        st.append_text(stream, text or "")
        st.apply_chunks(stream, chunks)
        ws.add_stream(channel, message, stream)
        return {"channel": channel, "ts": message["ts"]}

    def append_stream(self, p: dict[str, Any]) -> dict[str, Any]:
        stream = self._open_stream(p)
        text, chunks = self._content(p)
        if text is None and not chunks:
            raise ApiError("invalid_arguments")
        st.append_text(stream, text or "")
        st.apply_chunks(stream, chunks)
        self.workspace.stream_changed(stream)
        return {"channel": stream["channel"], "ts": stream["ts"]}

    def stop_stream(self, p: dict[str, Any]) -> dict[str, Any]:
        ws = self.workspace
        stream = self._open_stream(p)
        text, chunks = self._content(p)
        blocks = p.get("blocks")
        check_blocks(blocks)
        metadata = p.get("metadata")
        if metadata is not None and not _is_metadata(metadata):
            raise ApiError("invalid_metadata_format")
        session_status = p.get("session_status")
        if session_status is not None and session_status not in SESSION_STATUSES:
            raise ApiError("invalid_arguments")
        st.append_text(stream, text or "")
        st.apply_chunks(stream, chunks)
        stream["closing"] = list(blocks or [])
        st.end(stream, "stopped", ws.clock())
        message = ws.find(stream["channel"], stream["ts"])
        if message is not None and metadata:
            message["metadata"] = metadata
        ws.stream_changed(stream)
        if session_status and ws.agent_view:
            ws.set_session(stream["channel"], stream["thread_ts"], status=session_status)
        return {"channel": stream["channel"], "ts": stream["ts"]}

    # --- checks --------------------------------------------------------------------------

    def _channel(self, p: dict[str, Any], key: str) -> str:
        channel = required(p, key, "channel_not_found")
        if self.workspace.channel(channel) is None:
            raise ApiError("channel_not_found")
        return channel

    def _is_dm(self, channel_id: str) -> bool:
        channel = self.workspace.channel(channel_id)
        if channel is not None and channel.is_im:
            return True
        # In the tests' open world any id is a channel: a D… id is a DM, as in Slack.
        return self.workspace.open_world and channel_id.startswith("D")

    def _open_stream(self, p: dict[str, Any]) -> dict[str, Any]:
        """The open stream ``p`` names, or Slack's refusal."""
        channel = self._channel(p, "channel")
        ts = p.get("ts")
        stream = self.workspace.stream(channel, ts)
        if stream is None:
            message = self.workspace.find(channel, ts)
            if message is None:
                raise ApiError("message_not_found")
            if message.get("bot_id") != self.workspace.identity.bot_id:
                raise ApiError("message_not_owned_by_app")
            raise ApiError("message_not_in_streaming_state")
        if stream["state"] == "stopped_by_user":
            raise ApiError("stopped_by_user")
        if not st.is_open(stream):
            raise ApiError("message_not_in_streaming_state")
        return stream

    @staticmethod
    def _content(p: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
        """``markdown_text`` and ``chunks``, checked whole before anything changes."""
        try:
            text = st.check_markdown(p.get("markdown_text"))
            chunks = st.check_chunks(p.get("chunks"))
        except st.StreamError as exc:
            raise ApiError(exc.error) from None
        for chunk in chunks:
            if chunk["type"] == "blocks":
                check_blocks(chunk["blocks"])
        return text, chunks


def _thread_ts(value: Any) -> str:
    if not isinstance(value, str):
        raise ApiError("invalid_thread_ts")
    try:
        ts_key(value)
    except ValueError:
        raise ApiError("invalid_thread_ts") from None
    return value


def _is_metadata(metadata: Any) -> bool:
    """Slack's message metadata: ``event_type`` and an ``event_payload`` object."""
    return (
        isinstance(metadata, dict)
        and isinstance(metadata.get("event_type"), str)
        and isinstance(metadata.get("event_payload"), dict)
    )
