"""What an MCP tool call costs over a Python tool call, warm, through the Tool.

    .venv/bin/python bench/mcp_call.py            # 200 measured calls per kind
    .venv/bin/python bench/mcp_call.py --quick    # 30

Three tools answer the same ``echo`` call: a plain ``@tool``, the test MCP server
(tests/support/mcp_servers.py) over stdio, and the same server over streamable HTTP on
127.0.0.1. Each MCP call includes what every real call does: the fresh ``tools/list``
that re-checks the tool's definition, then ``tools/call``. stdout gets one JSON line;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import Tool, ToolContext, ToolRegistry, tool  # noqa: E402
from tools.mcp import McpServerConfig, McpSource  # noqa: E402

SERVER = str(ROOT / "tests" / "support" / "mcp_servers.py")
CTX = ToolContext("bench", "c1", "k1", 1)


class EchoArgs(BaseModel):
    text: str


@tool(registry=ToolRegistry())
async def echo(args: EchoArgs, ctx: ToolContext) -> dict:
    """Echo the text back."""
    return {"text": f"echo: {args.text}"}


async def median_us(t: Tool, calls: int) -> float:
    args = t.parse_arguments({"text": "hi"})
    for _ in range(max(5, calls // 10)):  # warm: session up, caches filled
        await t.run(args, CTX)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await t.run(args, CTX)
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


async def mcp_median_us(server: McpServerConfig, calls: int) -> float:
    source = McpSource("demo", server)
    try:
        tools = {t.name: t for t in await source.open()}
        return await median_us(tools["mcp__demo__echo"], calls)
    finally:
        await source.close()


async def main(calls: int) -> dict:
    python_us = await median_us(echo, calls * 10)
    print(f"python tool: {python_us:.1f} us", file=sys.stderr)
    stdio = McpServerConfig(command=sys.executable, args=[SERVER, "stdio"])
    stdio_us = await mcp_median_us(stdio, calls)
    print(f"mcp stdio: {stdio_us:.1f} us", file=sys.stderr)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, SERVER, "http", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        port = int((await proc.stdout.readline()).split()[1])
        http = McpServerConfig(url=f"http://127.0.0.1:{port}/mcp")
        http_us = await mcp_median_us(http, calls)
    finally:
        proc.kill()
        await proc.wait()
    print(f"mcp http: {http_us:.1f} us", file=sys.stderr)
    return {
        "bench": "mcp_call",
        "calls": calls,
        "python_tool_median_us": round(python_us, 1),
        "mcp_stdio_median_us": round(stdio_us, 1),
        "mcp_http_median_us": round(http_us, 1),
        "ratio_stdio_to_python": round(stdio_us / python_us, 1),
        "ratio_http_to_python": round(http_us / python_us, 1),
        "ratio_http_to_stdio": round(http_us / stdio_us, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 calls per kind")
    opts = parser.parse_args()
    print(json.dumps(asyncio.run(main(30 if opts.quick else 200))))
