"""One way for this package's fake services to listen on their own (the tests' way, where
local mode mounts them on the page's port instead): an ephemeral port on 127.0.0.1."""

from __future__ import annotations

from typing import Any

from aiohttp import web


async def serve(app: web.Application, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """Start ``app`` on a free 127.0.0.1 port; returns its runner (the caller's to
    ``cleanup()``) and the port."""
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]
