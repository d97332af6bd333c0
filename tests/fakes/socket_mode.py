"""A fake Slack Socket Mode endpoint: ``apps.connections.open`` and the WebSocket.

Slack's Socket Mode: the app calls ``apps.connections.open`` with its app-level token
(``xapp-…``) and gets a ``wss://`` URL; Slack sends ``{"type": "hello"}`` and then
envelopes ``{"envelope_id", "type": "events_api" | "interactive" | "slash_commands",
"payload", "accepts_response_payload"}``; the app answers each with
``{"envelope_id", "payload"?}`` within 3 seconds. Here the URL is ``ws://127.0.0.1``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.servers import serve


class FakeSocketMode:
    def __init__(self, app_token: str = "xapp-1-test") -> None:
        self.app_token = app_token
        self.url = ""  # the Web API base for apps.connections.open
        self.connections = 0
        self.acks: dict[str, dict[str, Any]] = {}
        self._ws: web.WebSocketResponse | None = None
        self._connected = asyncio.Event()
        self._acked: dict[str, asyncio.Event] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._port = 0

    async def __aenter__(self) -> FakeSocketMode:
        app = web.Application()
        app.router.add_route("*", "/api/apps.connections.open", self._open)
        app.router.add_get("/link", self._link)
        self._runner, self._port = await serve(app)
        self.url = f"http://127.0.0.1:{self._port}/api/"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def ws_url(self) -> str:
        """What ``apps.connections.open`` answers (FakeSlack.socket_url takes it)."""
        return f"ws://127.0.0.1:{self._port}/link?ticket=t{next(self._ids)}"

    async def _open(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("Bearer ").strip() != self.app_token:
            return web.json_response({"ok": False, "error": "invalid_auth"})
        url = f"ws://127.0.0.1:{self._port}/link?ticket=t{next(self._ids)}"
        return web.json_response({"ok": True, "url": url})

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._ws = ws
        self.connections += 1
        await ws.send_json({"type": "hello", "num_connections": 1, "debug_info": {}})
        self._connected.set()
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            ack = json.loads(msg.data)
            envelope_id = ack.get("envelope_id")
            if envelope_id in self._acked:
                self.acks[envelope_id] = ack
                self._acked[envelope_id].set()
        return ws

    async def wait_connected(self, within: float = 10) -> None:
        async with asyncio.timeout(within):
            await self._connected.wait()

    async def send(self, kind: str, payload: dict[str, Any], within: float = 5) -> dict:
        """Send one envelope and wait for the app's acknowledgement of it."""
        assert self._ws is not None, "nobody is connected"
        envelope_id = f"env-{next(self._ids)}"
        self._acked[envelope_id] = asyncio.Event()
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "payload": payload,
            "accepts_response_payload": kind != "events_api",
            "retry_attempt": 0,
            "retry_reason": "",
        }
        await self._ws.send_json(envelope)
        async with asyncio.timeout(within):
            await self._acked[envelope_id].wait()
        return self.acks[envelope_id]
