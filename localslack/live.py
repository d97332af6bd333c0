"""Live updates for the page: server-sent events, each to the people allowed to see it.

One ``GET /ui/events?user=U…`` stream per open page. A change in a channel goes to the
streams of its members (a DM to its person only); an ephemeral message, a modal and a
Home tab only to their user's streams. Events (``event: KIND`` + one JSON ``data``
line): ``hello``, ``message``, ``message_changed``, ``ephemeral``, ``view_opened``,
``view_updated``, ``view_closed``, ``home``, ``agent_status`` (a thread's loading status
or agent session changed) and ``resync`` (the page fell behind: it
reloads what it shows). A comment line every 15 s keeps idle connections open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from localslack.workspace import Workspace

log = logging.getLogger("opsloop.local.live")

KEEPALIVE_S = 15.0
QUEUE_SIZE = 1000
Item = tuple[str, dict[str, Any]] | None  # None: the stream ends


@dataclass(eq=False)
class _Stream:
    user: str
    queue: asyncio.Queue[Item] = field(default_factory=lambda: asyncio.Queue(QUEUE_SIZE))

    def put(self, item: Item) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            # Fell behind: drop what is queued and ask the page to read afresh.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(("resync", {}) if item is not None else None)


class Live:
    """The open streams. ``publish`` sends an event to the streams allowed to see it:
    ``user`` set, only that person's; ``channel`` set, only its members'."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.boot = uuid.uuid4().hex[:12]  # a new value tells a page the server restarted
        self._streams: set[_Stream] = set()
        self._closed = False

    @property
    def streams(self) -> int:
        return len(self._streams)

    def publish(
        self,
        kind: str,
        data: dict[str, Any],
        *,
        channel: str | None = None,
        user: str | None = None,
    ) -> None:
        for stream in list(self._streams):
            if user is not None and user != stream.user:
                continue
            if channel and not self.workspace.can_see(stream.user, channel):
                continue
            stream.put((kind, data))

    async def close(self) -> None:
        """End every stream (the page stops; a new one is refused while closing)."""
        self._closed = True
        for stream in list(self._streams):
            stream.put(None)

    async def handle(self, request: web.Request, user: str) -> web.StreamResponse:
        """``GET /ui/events``: the stream of ``user``'s page, until it leaves or we stop."""
        if self._closed:
            return web.json_response({"error": "the local workspace is shutting down"}, status=503)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        stream = _Stream(user)
        self._streams.add(stream)
        try:
            await response.write(_frame("hello", {"user": user, "boot": self.boot}))
            while True:
                try:
                    item = await asyncio.wait_for(stream.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keepalive\n\n")
                    continue
                if item is None:
                    break
                await response.write(_frame(*item))
        except ConnectionResetError:  # the page went away
            pass
        finally:
            self._streams.discard(stream)
        return response


def _frame(kind: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {payload}\n\n".encode()
