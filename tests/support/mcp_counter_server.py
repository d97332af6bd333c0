"""A stdio MCP server whose one tool has an effect counted outside every process.

Run as ``python tests/support/mcp_counter_server.py DIR [--hold SECONDS]``. The tool
``restart`` adds one to the counter file ``DIR/mcp_counter`` (fsynced, under a lock),
then holds the call open for SECONDS before answering: the window in which the crash
matrix SIGKILLs the process that called it. Each server appends its pid to
``DIR/mcp_server.pids`` so the test can check that none outlives its client.

The client spawns its servers in a session of their own, so a SIGKILLed client's
process group does not include us: we exit as soon as our parent is gone.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

COUNTER = "mcp_counter"
PIDS = "mcp_server.pids"
_SCHEMA = {
    "type": "object",
    "properties": {"service": {"type": "string"}},
    "required": ["service"],
}


def bump(path: Path) -> int:
    """One more effect on the counter file; the count after it."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        count = int(f.read().strip() or "0") + 1
        f.seek(0)
        f.truncate()
        f.write(f"{count}\n")
        f.flush()
        os.fsync(f.fileno())
    return count


def count(directory: Path) -> int:
    path = directory / COUNTER
    return int(path.read_text().strip() or "0") if path.exists() else 0


def build_server(directory: Path, hold_s: float) -> Server[Any]:
    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tool = types.Tool(
            name="restart",
            description="Restart a service (not idempotent: every call restarts it again).",
            input_schema=_SCHEMA,
        )
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != "restart":
            text = types.TextContent(type="text", text=f"no tool {params.name}")
            return types.CallToolResult(content=[text], is_error=True)
        n = bump(directory / COUNTER)
        await anyio.sleep(hold_s)  # the effect is made; the answer is not sent yet
        service = (params.arguments or {}).get("service", "")
        text = types.TextContent(type="text", text=f"restarted {service} (restart #{n})")
        return types.CallToolResult(content=[text])

    return Server("counter", on_list_tools=list_tools, on_call_tool=call_tool)


def _exit_with_parent() -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.05)
    os._exit(0)


async def _serve(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--hold", type=float, default=0.0)
    opts = parser.parse_args()
    with open(opts.directory / PIDS, "a") as f:
        f.write(f"{os.getpid()}\n")
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    anyio.run(_serve, build_server(opts.directory, opts.hold))
    sys.stdout.flush()
    os._exit(0)  # skip the SDK's slow interpreter teardown, as mcp_servers.py does


if __name__ == "__main__":
    main()
