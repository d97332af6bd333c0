"""A small MCP server for ``opsloop local``: a service catalog with read and write tools.

Run as ``python -m tools.demo_mcp --state FILE`` (stdio; local mode starts it from its
own opsloop.yaml). Tools: ``list_services`` and ``get_service`` read the catalog;
``scale_service`` changes a service's replica count. With ``simulate_crash`` the change
is saved and then the server process ends before answering, once per request: the
client sees the connection go away after the call went out, so the outcome is unknown
and a person reconciles it. "Run it again" sends the same request, which then answers.
The change was made before the crash, so "It happened" is the true answer here
(``get_service`` shows it); after "It did not happen" nothing runs again, the catalog
keeps the change, and the thread's answer says whose word that was and where to look.

The catalog is a JSON file, written before a call answers (or crashes), so a server
started again after the crash sees what the crashed one did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

SERVICES = ("api", "web", "worker")
SEED: dict[str, dict[str, Any]] = {
    "api": {"owner": "platform", "replicas": 3, "tier": "critical"},
    "web": {"owner": "frontend", "replicas": 2, "tier": "standard"},
    "worker": {"owner": "data", "replicas": 1, "tier": "standard"},
}
MAX_REPLICAS = 20
_SERVICE = {"type": "string", "enum": list(SERVICES), "description": "The service, e.g. api."}

TOOLS = [
    types.Tool(
        name="list_services",
        description="List the services in the catalog with their owner and replica count.",
        input_schema={"type": "object", "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    ),
    types.Tool(
        name="get_service",
        description="Show one service of the catalog: owner, tier, replicas, last change.",
        input_schema={
            "type": "object",
            "properties": {"service": _SERVICE},
            "required": ["service"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    ),
    types.Tool(
        name="scale_service",
        description=(
            "Set the number of replicas of a service. simulate_crash (a demo switch) "
            "makes the catalog crash right after the change, before it answers."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "service": _SERVICE,
                "replicas": {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS},
                "simulate_crash": {"type": "boolean", "default": False},
            },
            "required": ["service", "replicas"],
        },
        annotations=types.ToolAnnotations(destructive_hint=False),
    ),
]


class Catalog:
    """The services and the requests that already crashed once, kept in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.services: dict[str, dict[str, Any]] = {k: dict(v) for k, v in SEED.items()}
        self.crashed: list[str] = []
        if path.exists():
            saved = json.loads(path.read_text(encoding="utf-8"))
            self.services.update(saved.get("services", {}))
            self.crashed = list(saved.get("crashed", []))

    def save(self) -> None:
        doc = {"services": self.services, "crashed": self.crashed}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)  # whole or not at all: a crash never leaves half a file


def _text(value: Any, *, error: bool = False) -> types.CallToolResult:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    structured = None if isinstance(value, str) else value
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=error,
    )


def build_server(catalog: Catalog) -> Server[Any]:
    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        service = str(args.get("service", ""))
        match params.name:
            case "list_services":
                rows = [{"service": k, **v} for k, v in sorted(catalog.services.items())]
                return _text({"services": rows})
            case "get_service" if service in catalog.services:
                return _text({"service": service, **catalog.services[service]})
            case "scale_service" if service in catalog.services:
                return scale(service, args)
            case "get_service" | "scale_service":
                return _text(f"no service {service!r} in the catalog", error=True)
        return _text(f"no tool {params.name!r}", error=True)

    def scale(service: str, args: dict[str, Any]) -> types.CallToolResult:
        replicas = args.get("replicas")
        if not isinstance(replicas, int) or not 0 <= replicas <= MAX_REPLICAS:
            return _text(f"replicas must be 0 to {MAX_REPLICAS}", error=True)
        entry = catalog.services[service]
        before = entry["replicas"]
        entry["replicas"] = replicas
        entry["changes"] = entry.get("changes", 0) + 1
        request = f"{service}:{replicas}"
        crash = bool(args.get("simulate_crash")) and request not in catalog.crashed
        if crash:
            catalog.crashed.append(request)
        catalog.save()  # the effect is durable before anyone hears of it
        if crash:
            os._exit(17)  # mid-call: the change is made, the answer never sent
        return _text({"service": service, "replicas": replicas, "was": before})

    return Server("catalog", on_list_tools=list_tools, on_call_tool=call_tool)


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.demo_mcp")
    parser.add_argument("--state", required=True, help="the catalog's JSON file")
    opts = parser.parse_args(argv)
    anyio.run(_serve_stdio, build_server(Catalog(Path(opts.state))))
    # stdin closed: skip the interpreter's slow teardown of the SDK, which the client waits out.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
