"""A real MCP server (the SDK's low-level ``Server``) for tests/tools/test_mcp.py.

Run as a script::

    python tests/support/mcp_servers.py stdio [--long-name] [--odd-names] [--unions] [--live]
    python tests/support/mcp_servers.py http  [...] [--port N] [--legacy [--session-400] [--tasks]]
    # (http prints "PORT <n>" first)

The low-level server (not ``MCPServer``) because the tests need what a decorator hides:
a ``tools/list`` split into pages, and a definition that changes while the server runs
(``redefine``), which is what a pinned approval must catch.

``unreadable`` answers with a lone surrogate escape (``\\ud800``): valid JSON that the
SDK cannot serialise, so the server writes :data:`LONE` and its output is rewritten on
the wire (stdout, or the HTTP response body) to the escape of the same length.

``refuse`` answers with a JSON-RPC error (not a tool result) of the code asked for:
-32000 and -32001 are what TypeScript SDK servers answer, and the codes the SDK also
uses for its own "connection closed" and "request timeout". ``get_env`` and ``header``
echo what the client configured (an env value, a request header), as a server that
quotes a token does. ``--odd-names`` adds tool names Anthropic does not take as they are
(``.``, ``/``, two that map to one name); ``--unions`` adds input schemas with a
top-level ``anyOf`` / ``oneOf`` / ``allOf``; ``--tasks`` adds a tool whose
``execution.taskSupport`` is "required" and one where it is "optional" (the field is
in the 2025-11-25 protocol only, so it shows with ``--legacy``). ``--legacy`` speaks only
the handshake-era protocol (no ``server/discover``), whose streamable HTTP has sessions, as
server-everything and TypeScript SDK servers do. ``--session-400`` answers a request on a
session this process does not know as the TypeScript SDK's README handler does (400,
-32000), instead of the Python SDK's 404.

``--live`` adds ``change``, which redefines a tool as ``redefine`` does (a new name adds
a tool) and then says so: ``notifications/tools/list_changed`` on a handshake-era
session, a ``ToolsListChanged`` event to the ``subscriptions/listen`` streams on a
2026-07-28 one (served under this flag only). ``--unless FILE`` exits at once, before
the handshake, while FILE does not exist: a server that is down until the test says.
``--mark FILE --await OTHER`` creates FILE, then answers nothing until OTHER exists: two
servers that each await the other's mark come up only when they are started together.
``--401-if FILE`` (http) answers every request with 401 and a ``WWW-Authenticate``
challenge while FILE exists: a server whose token stopped being accepted.

``--ask`` adds tools that ask the user in the middle of the call (elicitation):
``ask`` (a form of :data:`ASK_SCHEMA`), ``ask_url`` (url mode), ``ask_twice`` (two
questions) and ``progress`` (reports its progress, then answers). On a handshake-era
session (``--legacy``) they ask with ``elicitation/create`` requests while the call is
in flight; on a 2026-07-28 one they answer ``InputRequiredResult`` and finish when the
call comes again with the answers and the ``request_state`` (``ask:<round>``) echoed.
Either way the result's text is the JSON of what the server received.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from functools import partial
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

PAGE_SIZE = 2  # small, so that the client has to follow next_cursor
LONG_NAME = "x" * 60  # mcp__demo__ + 60 characters > Anthropic's 64
# A 1x1 PNG (69 bytes): what the model API takes as an image.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
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
    "refuse": "Answer with a JSON-RPC error of the given code and message.",
    "get_env": "The value of one of the server's environment variables.",
    "header": "The value of one header of the HTTP request that made this call.",
    "hold": "Wait until release is called.",
    "holding": "How many calls of hold are waiting.",
    "release": "End every hold.",
    LONG_NAME: "A tool whose prefixed name is too long.",
}
ODD_NAMES = {
    "files/read": "Read a file (a name with a slash).",
    "get.status": "The status (a name with a dot).",
    "get_status": "The status, again: get.status maps onto this name.",
    "a.b": "One of two names that map to one.",
    "a/b": "The other of two names that map to one.",
}
# The SDK (client and server) takes only an input schema of type object, so each says so
# beside its top-level union, as the TypeScript SDK's servers send them.
UNIONS: dict[str, dict[str, Any]] = {
    # A union of two objects, as zod emits z.union([z.object(...), z.object(...)]).
    "find": {
        "type": "object",
        "anyOf": [
            {
                "type": "object",
                "properties": {"id": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["id"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"query": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["query", "verbose"],
                "additionalProperties": False,
            },
        ],
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
    # An object with "at least one of" as a top-level anyOf of required lists.
    "update": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "title": {"type": "string"}},
        "required": ["id"],
        "oneOf": [{"required": ["title"]}, {"required": ["id"]}],
    },
    "merged": {
        "type": "object",
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]},
        ],
    },
    # One branch is not an object: nothing to flatten.
    "scalar": {
        "type": "object",
        "anyOf": [{"type": "string"}, {"type": "object", "properties": {}}],
    },
}
ASK = {
    "ask": "Ask the user for a name, a count, a flag and an environment.",
    "ask_url": "Send the user to a page (url mode), then say whether they went.",
    "ask_twice": "Ask the user two questions.",
    "progress": "Report progress three times, then answer.",
}
ASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2, "maxLength": 20},
        "count": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
        "ok": {"type": "boolean", "title": "Proceed?", "default": True},
        "env": {
            "type": "string",
            "oneOf": [{"const": "stg", "title": "Staging"}, {"const": "prd", "title": "Prod"}],
        },
    },
    "required": ["name", "env"],
}
ASK_URL = "https://auth.example/consent?session=s1"
TASKS = {
    "long_report": "Build a report, only as an MCP task (taskSupport required).",
    "quick_report": "Build a report, as a task or not (taskSupport optional).",
}
_executions = {
    "long_report": types.ToolExecution(task_support="required"),
    "quick_report": types.ToolExecution(task_support="optional"),
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
    "refuse": {
        "type": "object",
        "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
        "required": ["code", "message"],
    },
    "get_env": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "header": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    **UNIONS,
}
_annotations = {
    "echo": types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    "crash": types.ToolAnnotations(destructive_hint=True),
}


_removed: set[str] = set()
_bus = InMemorySubscriptionBus()  # what subscriptions/listen streams hear (--live)
_held: list[anyio.Event] = []
_calls = {"bump": 0}
_crash_on_list = {"armed": False}


def _tool_names(long_name: bool) -> list[str]:
    return [n for n in _descriptions if (long_name or n != LONG_NAME) and n not in _removed]


def _describe(*, odd_names: bool, unions: bool, tasks: bool = False) -> None:
    if tasks:
        _descriptions.update(TASKS)
    if odd_names:
        _descriptions.update(ODD_NAMES)
    if unions:
        _descriptions.update({n: f"A tool whose input schema is a union ({n})." for n in UNIONS})


def _text(text: str) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=text)]


def build_server(
    *,
    long_name: bool = False,
    odd_names: bool = False,
    unions: bool = False,
    legacy: bool = False,
    live: bool = False,
    tasks: bool = False,
    ask: bool = False,
) -> Server[Any]:
    _describe(odd_names=odd_names, unions=unions, tasks=tasks)
    if ask:
        _descriptions.update(ASK)
    if live:
        _descriptions["change"] = "Change the description of a tool, and say so to the client."
        _schemas["change"] = _schemas["redefine"]

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
                execution=_executions.get(n),
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
                        types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                        types.ImageContent(type="image", data="AAAA", mime_type="image/tiff"),
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
            case "redefine" | "change":
                if args["description"]:
                    _descriptions[args["tool"]] = args["description"]
                    _removed.discard(args["tool"])
                else:
                    _removed.add(args["tool"])
                if params.name == "change":
                    await _tell_changed(ctx)
                return types.CallToolResult(content=_text("redefined"))
            case "unreadable":
                return types.CallToolResult(content=_text(f"lone {LONE}"))
            case "big":
                return types.CallToolResult(content=_text("x" * int(args["size"])))
            case "refuse":
                raise MCPError(code=int(args["code"]), message=str(args["message"]))
            case "get_env":
                value = os.environ.get(args["name"], "")
                return types.CallToolResult(
                    content=[
                        *_text(f"{args['name']}={value}"),
                        types.ResourceLink(
                            type="resource_link", uri=f"env:///{args['name']}?{value}", name=value
                        ),
                    ],
                    structured_content={"value": value},
                )
            case "hold":
                _held.append(event := anyio.Event())
                await event.wait()
                return types.CallToolResult(content=_text("released"))
            case "holding":
                return types.CallToolResult(content=_text(str(len(_held))))
            case "release":
                for event in _held:
                    event.set()
                _held.clear()
                return types.CallToolResult(content=_text("released all"))
            case "header":
                request = getattr(ctx, "request", None)
                value = request.headers.get(args["name"], "") if request is not None else ""
                return types.CallToolResult(content=_text(value), is_error=True)
        if params.name in ASK:
            return await _ask(ctx, params)
        if params.name in {**ODD_NAMES, **UNIONS, **TASKS} or params.name == LONG_NAME:
            return types.CallToolResult(content=_text(f"{params.name}: {args}"))
        return types.CallToolResult(content=_text(f"no tool {params.name}"), is_error=True)

    listen = ListenHandler(_bus) if live else None
    server = Server(
        "demo", on_list_tools=list_tools, on_call_tool=call_tool, on_subscriptions_listen=listen
    )
    if legacy:

        async def no_discover(ctx: Any, params: types.RequestParams) -> types.DiscoverResult:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found")

        server.add_request_handler("server/discover", types.RequestParams, no_discover)
    return server


def _questions(name: str) -> dict[str, types.ElicitRequestParams]:
    if name == "ask_url":
        url = types.ElicitRequestURLParams(message="Sign in", url=ASK_URL, elicitation_id="e1")
        return {"login": url}
    form = types.ElicitRequestFormParams(message="Which deploy?", requested_schema=ASK_SCHEMA)
    if name == "ask_twice":
        other = {"type": "object", "properties": {"why": {"type": "string"}}}
        second = types.ElicitRequestFormParams(message="Why?", requested_schema=other)
        return {"first": form, "second": second}
    return {"form": form}


async def _ask(ctx: Any, params: types.CallToolRequestParams) -> Any:
    """The --ask tools: see the module docstring."""
    if params.name == "progress":
        for step in (1, 2, 3):
            await ctx.session.report_progress(step, 3, f"step {step} of 3")
        return types.CallToolResult(content=_text("progressed"))
    questions = _questions(params.name)
    received: dict[str, Any] = {}
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:  # in-session, one by one
        for key, asked in questions.items():
            if isinstance(asked, types.ElicitRequestURLParams):
                got = await ctx.session.elicit_url(
                    asked.message, asked.url, "e1", related_request_id=ctx.request_id
                )
            else:
                got = await ctx.session.elicit_form(
                    asked.message, asked.requested_schema, related_request_id=ctx.request_id
                )
            received[key] = got.model_dump(mode="json", exclude_none=True)
    elif params.input_responses is None:
        return types.InputRequiredResult(
            input_requests={k: types.ElicitRequest(params=q) for k, q in questions.items()},
            request_state="ask:1",
        )
    else:
        if params.request_state != "ask:1":
            raise MCPError(code=types.INVALID_PARAMS, message="unknown request_state")
        for key in questions:
            got = params.input_responses.get(key)
            received[key] = got.model_dump(mode="json", exclude_none=True) if got else None
    return types.CallToolResult(
        content=_text(json.dumps(received, sort_keys=True)), structured_content=received
    )


async def _tell_changed(ctx: Any) -> None:
    """The tool list changed: as the era of the session says it."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await _bus.publish(ToolsListChanged())
    else:
        await ctx.session.send_tool_list_changed()


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


async def _serve_stdio(server: Server[Any], legacy: bool = False) -> None:
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    stdout = anyio.wrap_file(_Unreadable(sys.stdout))
    options = server.create_initialization_options()
    async with stdio_server(stdout=stdout) as (read_stream, write_stream):
        if not legacy:
            await server.run(read_stream, write_stream, options)
            return
        # Handshake era only (Server.run would serve whichever era the client opens).
        async with server.lifespan(server) as state:
            await serve_loop(
                server, read_stream, write_stream, lifespan_state=state, init_options=options
            )


def _ts_session_errors(app: Any) -> Any:
    """ASGI middleware answering a request on a session this process never opened as
    the TypeScript SDK's README handler does: 400 with JSON-RPC error -32000."""
    opened: set[str] = set()

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        asked = headers.get(b"mcp-session-id")
        if scope["type"] == "http" and asked is not None and asked not in opened:
            body = (
                b'{"jsonrpc":"2.0","error":{"code":-32000,'
                b'"message":"Bad Request: No valid session ID provided"},"id":null}'
            )
            start = {"type": "http.response.start", "status": 400}
            await send({**start, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return

        async def noting(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", []):
                    if name.lower() == b"mcp-session-id":
                        opened.add(value)
            await send(message)

        await app(scope, receive, noting)

    return wrapped


CHALLENGE = 'Bearer resource_metadata="https://auth.example/.well-known/oauth-protected-resource"'


def _unauthorized_if(app: Any, path: str) -> Any:
    """ASGI middleware answering 401 (with :data:`CHALLENGE`) while ``path`` exists."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        # A stat per request, on a test server: not worth a thread.
        if scope["type"] == "http" and os.path.exists(path):  # noqa: ASYNC240
            headers = [(b"www-authenticate", CHALLENGE.encode()), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return wrapped


async def _serve_http(
    server: Server[Any], port: int, *, session_400: bool = False, unauthorized_if: str = ""
) -> None:
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
    if session_400:
        app = _ts_session_errors(app)
    if unauthorized_if:
        app = _unauthorized_if(app, unauthorized_if)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--long-name", action="store_true")
    parser.add_argument("--odd-names", action="store_true")
    parser.add_argument("--unions", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--session-400", action="store_true")
    parser.add_argument("--live", action="store_true")
    parser.add_argument("--tasks", action="store_true")
    parser.add_argument("--ask", action="store_true")
    parser.add_argument("--unless", metavar="FILE")
    parser.add_argument("--mark", metavar="FILE")
    parser.add_argument("--await", dest="awaited", metavar="FILE")
    parser.add_argument("--401-if", dest="unauthorized_if", metavar="FILE", default="")
    opts = parser.parse_args()
    if opts.unless and not os.path.exists(opts.unless):
        sys.exit(1)
    if opts.mark:
        open(opts.mark, "w").close()
    while opts.awaited and not os.path.exists(opts.awaited):
        time.sleep(0.02)  # before the handshake: the client waits for its answer
    server = build_server(
        long_name=opts.long_name,
        odd_names=opts.odd_names,
        unions=opts.unions,
        legacy=opts.legacy,
        live=opts.live,
        tasks=opts.tasks,
        ask=opts.ask,
    )
    if opts.transport == "stdio":
        anyio.run(_serve_stdio, server, opts.legacy)
    else:
        serve = partial(
            _serve_http,
            server,
            opts.port,
            session_400=opts.session_400,
            unauthorized_if=opts.unauthorized_if,
        )
        anyio.run(serve)
    # The session is over (stdin closed): skip the interpreter's teardown of the SDK's
    # imports, over a second on a loaded machine, which the client would wait out.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
