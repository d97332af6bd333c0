"""A real MCP server (the SDK's low-level ``Server``) for tests/tools/test_mcp.py.

Run as a script::

    python tests/support/mcp_servers.py stdio [--long-name]
    python tests/support/mcp_servers.py http  [--long-name] [--port N]   # prints "PORT <n>" first

The low-level server (not ``MCPServer``) because the tests need what a decorator hides:
a ``tools/list`` split into pages, and a definition that changes while the server runs
(``redefine``), which is what a pinned approval must catch.

``unreadable`` answers with a lone surrogate escape (``\\ud800``): valid JSON that the
SDK cannot serialise, so the server writes :data:`LONE` and its output is rewritten on
the wire (stdout, or the HTTP response body) to the escape of the same length.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

PAGE_SIZE = 2  # small, so that the client has to follow next_cursor
LONG_NAME = "x" * 60  # mcp__demo__ + 60 characters > Anthropic's 64
LONE = "@LONE@"  # becomes \ud800 on the wire: both are 6 bytes, so lengths still hold

_descriptions = {
    "echo": "Echo the text back.",
    "add": "Add two integers.",
    "fail": "Report an error with the given message.",
    "crash": "End the server process in the middle of the call.",
    "crash_on_list": "End the server process at the next tools/list, before answering it.",
    "pid": "The server's process id.",
    "picture": "A result with an image and an embedded resource.",
    "bump": "Count one more call and return the count (a side effect to count).",
    "sleep": "Sleep for the given number of seconds.",
    "redefine": "Change the description of a tool; an empty description removes it.",
    "unreadable": "Answer with a lone surrogate escape, which the SDK cannot parse.",
    "big": "Answer with a text of the given number of bytes.",
    LONG_NAME: "A tool whose prefixed name is too long.",
}
_schemas: dict[str, dict[str, Any]] = {
    "echo": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "add": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    "fail": {"type": "object", "properties": {"message": {"type": "string"}}},
    "sleep": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    "big": {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]},
    "redefine": {
        "type": "object",
        "properties": {"tool": {"type": "string"}, "description": {"type": "string"}},
        "required": ["tool", "description"],
    },
}
_annotations = {
    "echo": types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    "crash": types.ToolAnnotations(destructive_hint=True),
}


_removed: set[str] = set()
_calls = {"bump": 0}
_crash_on_list = {"armed": False}


def _tool_names(long_name: bool) -> list[str]:
    return [n for n in _descriptions if (long_name or n != LONG_NAME) and n not in _removed]


def _text(text: str) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=text)]


def build_server(*, long_name: bool = False) -> Server[Any]:
    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if _crash_on_list["armed"]:
            os._exit(4)
        names = _tool_names(long_name)
        start = int(params.cursor) if params is not None and params.cursor else 0
        page = names[start : start + PAGE_SIZE]
        tools = [
            types.Tool(
                name=n,
                description=_descriptions[n],
                input_schema=_schemas.get(n, {"type": "object", "properties": {}}),
                annotations=_annotations.get(n),
            )
            for n in page
        ]
        more = start + PAGE_SIZE < len(names)
        return types.ListToolsResult(
            tools=tools, next_cursor=str(start + PAGE_SIZE) if more else None
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        match params.name:
            case "echo":
                return types.CallToolResult(content=_text(f"echo: {args['text']}"))
            case "add":
                total = args["a"] + args["b"]
                return types.CallToolResult(
                    content=_text(str(total)), structured_content={"sum": total}
                )
            case "fail":
                return types.CallToolResult(
                    content=_text(args.get("message", "failed")), is_error=True
                )
            case "crash":
                os._exit(3)
            case "crash_on_list":
                _crash_on_list["armed"] = True
                return types.CallToolResult(content=_text("armed"))
            case "pid":
                return types.CallToolResult(content=_text(str(os.getpid())))
            case "picture":
                return types.CallToolResult(
                    content=[
                        types.TextContent(type="text", text="a chart"),
                        types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
                        types.EmbeddedResource(
                            type="resource",
                            resource=types.TextResourceContents(
                                uri="file:///report.txt", mime_type="text/plain", text="report"
                            ),
                        ),
                    ]
                )
            case "bump":
                _calls["bump"] += 1
                return types.CallToolResult(content=_text(str(_calls["bump"])))
            case "sleep":
                await anyio.sleep(float(args.get("seconds", 0)))
                return types.CallToolResult(content=_text("slept"))
            case "redefine":
                if args["description"]:
                    _descriptions[args["tool"]] = args["description"]
                else:
                    _removed.add(args["tool"])
                return types.CallToolResult(content=_text("redefined"))
            case "unreadable":
                return types.CallToolResult(content=_text(f"lone {LONE}"))
            case "big":
                return types.CallToolResult(content=_text("x" * int(args["size"])))
        return types.CallToolResult(content=_text(f"no tool {params.name}"), is_error=True)

    return Server("demo", on_list_tools=list_tools, on_call_tool=call_tool)


class _Unreadable:
    """A text stream writing :data:`LONE` as a lone surrogate escape."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        return self.out.write(text.replace(LONE, "\\ud800"))

    def flush(self) -> None:
        self.out.flush()


def _unreadable_bodies(app: Any) -> Any:
    """ASGI middleware writing :data:`LONE` in response bodies as a lone surrogate escape."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def rewriting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"").replace(LONE.encode(), b"\\ud800")
                message = {**message, "body": body}
            await send(message)

        await app(scope, receive, rewriting)

    return wrapped


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    stdout = anyio.wrap_file(_Unreadable(sys.stdout))
    async with stdio_server(stdout=stdout) as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(server: Server[Any], port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn leaves Nagle on for a socket it is handed: a keep-alive response would
    # then wait out the client's delayed ACK, about 40 ms a request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)  # before "PORT": a client connecting right away waits in the backlog
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    app = _unreadable_bodies(server.streamable_http_app(host="127.0.0.1"))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--long-name", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    opts = parser.parse_args()
    server = build_server(long_name=opts.long_name)
    if opts.transport == "stdio":
        anyio.run(_serve_stdio, server)
    else:
        anyio.run(_serve_http, server, opts.port)
    # The session is over (stdin closed): skip the interpreter's teardown of the SDK's
    # imports, over a second on a loaded machine, which the client would wait out.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
