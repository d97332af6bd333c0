"""Slack's streamed messages (``chat.startStream`` / ``appendStream`` / ``stopStream``):
their chunks checked as Slack checks them, their state, and how they show.

A stream is JSON-ready data (saved with the workspace): where it is, its display mode
(``plan`` shows every task together above the text, ``timeline`` in the order they
came), the plan's title, its tasks by id (a ``task_update`` with a known id updates that
task in place: its title, status and sources are replaced, but its ``details`` and
``output`` named again are appended to what the task shows, as some report Slack does:
the stricter of the two readings, so a client that sends them twice is seen to), the
markdown text so far, and ``state``:

- ``streaming``: open; appends are taken;
- ``stopped``: ``chat.stopStream`` ended it (its closing ``blocks`` shown at the bottom);
- ``expired``: Slack ended it, about five minutes after it started, stopped or not
  (https://github.com/slackapi/python-slack-sdk/issues/1859: appends do not extend it);
- ``stopped_by_user``: someone pressed the agent session's stop button.

The message shows the stream as blocks (:func:`show`): a ``plan`` block of ``task_card``
blocks, ``markdown`` blocks for the text, the ``blocks`` chunks, then the closing blocks.

Pure: no I/O here.
"""

from __future__ import annotations

from typing import Any, Literal

MAX_MARKDOWN = 12_000  # characters per markdown_text argument or chunk (msg_too_long)
TASK_STATUSES = ("pending", "in_progress", "complete", "error")
DISPLAY_MODES = ("plan", "timeline")
DEFAULT_MODE = "timeline"  # Slack's default task_display_mode
CHUNK_TYPES = ("markdown_text", "task_update", "plan_update", "blocks")
APPENDED = ("details", "output")  # a task's fields a task_update adds to, not replaces
StreamState = Literal["streaming", "stopped", "expired", "stopped_by_user"]


class StreamError(Exception):
    """A refused chunk or argument: ``error`` is Slack's error code."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


# --- checks --------------------------------------------------------------------------------


def check_markdown(text: Any) -> str | None:
    """A ``markdown_text`` argument: None when absent; ``msg_too_long`` past 12,000."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise StreamError("invalid_arguments")
    if len(text) > MAX_MARKDOWN:
        raise StreamError("msg_too_long")
    return text


def check_chunks(chunks: Any) -> list[dict[str, Any]]:
    """The ``chunks`` argument, each one of Slack's four types with its fields
    (``invalid_chunks`` otherwise; ``msg_too_long`` for a markdown chunk past 12,000)."""
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise StreamError("invalid_chunks")
    for chunk in chunks:
        _check_chunk(chunk)
    return chunks


def _check_chunk(chunk: Any) -> None:
    if not isinstance(chunk, dict) or chunk.get("type") not in CHUNK_TYPES:
        raise StreamError("invalid_chunks")
    kind = chunk["type"]
    if kind == "markdown_text":
        if not isinstance(chunk.get("text"), str):
            raise StreamError("invalid_chunks")
        check_markdown(chunk["text"])
    elif kind == "plan_update":
        _need_text(chunk, "title")
    elif kind == "task_update":
        _need_text(chunk, "id")
        _need_text(chunk, "title")
        if chunk.get("status") not in TASK_STATUSES:
            raise StreamError("invalid_chunks")
        for key in ("details", "output"):
            if chunk.get(key) is not None and not isinstance(chunk[key], str):
                raise StreamError("invalid_chunks")
        _check_sources(chunk.get("sources"))
    elif not isinstance(chunk.get("blocks"), list) or not chunk["blocks"]:
        raise StreamError("invalid_chunks")


def _need_text(chunk: dict[str, Any], key: str) -> None:
    if not isinstance(chunk.get(key), str) or not chunk[key].strip():
        raise StreamError("invalid_chunks")


def _check_sources(sources: Any) -> None:
    """URL source elements: ``{"type": "url", "url": ..., "text": ...}`` (Slack rejects a
    source without text)."""
    if sources is None:
        return
    if not isinstance(sources, list):
        raise StreamError("invalid_chunks")
    for source in sources:
        if not isinstance(source, dict) or source.get("type") != "url":
            raise StreamError("invalid_chunks")
        if not all(isinstance(source.get(k), str) and source[k] for k in ("url", "text")):
            raise StreamError("invalid_chunks")


# --- state ---------------------------------------------------------------------------------


def new_stream(
    *,
    channel: str,
    ts: str,
    thread_ts: str,
    mode: str,
    started_at: float,
    recipient_user_id: str | None = None,
    recipient_team_id: str | None = None,
) -> dict[str, Any]:
    return {
        "channel": channel,
        "ts": ts,
        "thread_ts": thread_ts,
        "mode": mode,
        "state": "streaming",
        "started_at": started_at,
        "ended_at": None,
        "recipient_user_id": recipient_user_id,
        "recipient_team_id": recipient_team_id,
        "title": None,
        "tasks": {},  # id -> task, in the order they first came
        "parts": [],  # what shows, in order: {"text": ...}, {"task": id}, {"blocks": [...]}
        "text": "",
        "closing": [],  # the blocks chat.stopStream put at the bottom
    }


def is_open(stream: dict[str, Any]) -> bool:
    return stream["state"] == "streaming"


def append_text(stream: dict[str, Any], text: str) -> None:
    if not text:
        return
    stream["text"] += text
    parts = stream["parts"]
    if parts and "text" in parts[-1]:
        parts[-1]["text"] += text
    else:
        parts.append({"text": text})


def apply_chunks(stream: dict[str, Any], chunks: list[dict[str, Any]]) -> None:
    """Apply checked ``chunks`` in order."""
    for chunk in chunks:
        kind = chunk["type"]
        if kind == "markdown_text":
            append_text(stream, chunk["text"])
        elif kind == "plan_update":
            stream["title"] = chunk["title"]
        elif kind == "task_update":
            _update_task(stream, chunk)
        else:
            stream["parts"].append({"blocks": chunk["blocks"]})


def _update_task(stream: dict[str, Any], chunk: dict[str, Any]) -> None:
    """A new id adds a task; a known one is updated in place: the title, status and
    sources the chunk names replace what was there, its details and output are added
    to what was there; what it leaves out stays."""
    tasks = stream["tasks"]
    task = tasks.get(chunk["id"])
    if task is None:
        task = tasks[chunk["id"]] = {"id": chunk["id"]}
        stream["parts"].append({"task": chunk["id"]})
    for key in ("title", "status", "sources"):
        if chunk.get(key) is not None:
            task[key] = chunk[key]
    for key in APPENDED:
        if chunk.get(key) is not None:
            task[key] = task.get(key, "") + chunk[key]


def end(stream: dict[str, Any], state: StreamState, at: float) -> None:
    if is_open(stream):
        stream["state"] = state
        stream["ended_at"] = at


# --- how it shows --------------------------------------------------------------------------


def show(stream: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The message's ``text`` and ``blocks`` for ``stream`` as it is now."""
    tasks = stream["tasks"]
    blocks: list[dict[str, Any]] = []
    if stream["mode"] == "plan":
        if stream["title"] or tasks:
            blocks.append(
                {
                    "type": "plan",
                    "block_id": "stream-plan",
                    "title": stream["title"] or "",
                    "tasks": [task_card(t) for t in tasks.values()],
                }
            )
    elif stream["title"]:
        blocks.append(
            {
                "type": "header",
                "block_id": "stream-title",
                "text": {"type": "plain_text", "text": stream["title"]},
            }
        )
    for i, part in enumerate(stream["parts"]):
        if "text" in part:
            blocks.append(
                {"type": "markdown", "block_id": f"stream-text-{i}", "text": part["text"]}
            )
        elif "blocks" in part:
            blocks.extend(part["blocks"])
        elif stream["mode"] == "timeline":
            blocks.append(task_card(tasks[part["task"]]))
    blocks.extend(stream["closing"])
    return stream["text"], blocks


def task_card(task: dict[str, Any]) -> dict[str, Any]:
    """A task as Block Kit's ``task_card`` (details and output as ``rich_text``)."""
    card: dict[str, Any] = {
        "type": "task_card",
        "block_id": f"task-{task['id']}"[:255],
        "task_id": task["id"],
        "title": task.get("title", ""),
        "status": task.get("status", "pending"),
    }
    for key in ("details", "output"):
        if task.get(key):
            card[key] = _rich_text(task[key])
    if task.get("sources"):
        card["sources"] = task["sources"]
    return card


def _rich_text(text: str) -> dict[str, Any]:
    return {
        "type": "rich_text",
        "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
    }
