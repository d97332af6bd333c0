"""Keeping a serving MCP server's tools in the registry, whatever the server does.

``opsloop serve`` connects every server at once (``McpSource.connect``, bounded by the
connect time) and never stops for one: a server that cannot start (a missing command,
one that exits, one that never answers ``initialize``) is one warning line, its tools
are not offered, and this keeper tries again in the background, after 1 s, then 2, 4…
up to 60 s between tries. The first listing that works offers its tools: the next
decision of every thread sees them.

While the server is up, the keeper waits for a reason to list again: the server said
its tools changed (``notifications/tools/list_changed``, or an event on the listen
stream), or its session ended (it exited, restarted, maybe upgraded: reconnecting also
keeps the change notifications coming). Sessions that keep ending are reconnected with
the same backoff, reset once one has lasted a minute. ``up`` and the reason it is down
come from the connection (``McpConnection.up``): ``/metrics`` and ``GET /tools`` read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from tools.errors import ToolError

if TYPE_CHECKING:
    import mcp_types as types

    from tools.mcp.connection import McpConnection
    from tools.mcp.source import McpSource

log = logging.getLogger("tools.mcp.source")  # the source's lines: one logger to filter

BACKOFF_S = (1.0, 60.0)  # the first wait before trying again, and the longest
sleep = asyncio.sleep  # how a backoff waits (a test counts the waits)


class Keeper:
    """The background side of one serving :class:`McpSource`."""

    def __init__(self, source: McpSource, conn: McpConnection) -> None:
        self.source = source
        self._conn = conn
        self._listed: list[types.Tool] | None = None  # the startup listing, until start
        self._reason = ""  # why the startup listing failed
        self._stale = asyncio.Event()  # a reason to list again
        self._ended = False  # ... and it is that a session ended
        self._task: asyncio.Task[None] | None = None
        conn.on_tools_changed = self._changed  # before the first session: it listens
        conn.on_session_ended = self._session_ended

    def _changed(self) -> None:
        self._stale.set()

    def _session_ended(self) -> None:
        self._ended = True
        self._stale.set()

    async def connect(self) -> None:
        """The startup listing, or why there is none (never raised)."""
        source = self.source
        try:
            async with asyncio.timeout(source.connect_timeout_s * 2):
                self._listed = await source._list()
        except (ToolError, TimeoutError) as exc:
            self._reason = self._why(exc)

    def start(self) -> None:
        """Offer the startup listing (or say the server is down), then keep at it."""
        source, up = self.source, self._listed is not None
        if self._listed is not None:
            source._apply(self._listed)
            self._listed = None
        else:
            log.warning(
                "mcp server down server=%s reason=%s; serving without its tools, "
                "retrying in the background",
                source.server_name,
                self._reason,
            )
        self._task = asyncio.create_task(self._keep(up), name=f"mcp-keeper:{source.server_name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _keep(self, up: bool) -> None:
        loop = asyncio.get_running_loop()
        delay, since = BACKOFF_S[0], loop.time()
        while True:
            if up:
                await self._stale.wait()
                if self._ended:  # reconnect, but not in a tight loop
                    if loop.time() - since >= BACKOFF_S[1]:
                        delay = BACKOFF_S[0]
                    delay = await _backoff(delay)
            else:
                delay = await _backoff(delay)
            self._stale.clear()
            self._ended = False
            try:
                await self.source.refresh()
            except Exception as exc:  # ToolError, a timeout; a bug is logged, never fatal
                expected, why = isinstance(exc, ToolError | TimeoutError), self._why(exc)
                if up or not expected:  # one line when it goes down, not one per try
                    log.warning(
                        "mcp server down server=%s reason=%s; retrying in the background",
                        self.source.server_name,
                        why,
                        exc_info=not expected,
                    )
                up = False
                continue
            if not up:
                log.info(
                    "mcp server up server=%s tools=%d",
                    self.source.server_name,
                    len(self.source.offered),
                )
                delay = BACKOFF_S[0]
            up, since = True, loop.time()

    def _why(self, exc: BaseException) -> str:
        """One line on why listing failed; the server is marked down for it."""
        source = self.source
        if isinstance(exc, TimeoutError):
            why = f"no answer within {source.connect_timeout_s * 2:g}s"
        else:
            text = " ".join(str(exc).split()) or type(exc).__name__
            why = source.server.redact(text.removeprefix(f"MCP server {source.server_name!r}: "))
        self._conn.mark_down(why)
        return why


async def _backoff(delay: float) -> float:
    await sleep(delay)
    return min(delay * 2, BACKOFF_S[1])
