"""An MCP server behind OAuth, and its authorization server, for tests/tools/test_mcp_oauth.py.

Run as a script (prints "PORT <n>" first)::

    python tests/support/oauth_servers.py [--port N] [--expires S] [--scope S] [--no-dcr]

One origin serves both: the MCP server (the SDK's low-level ``Server`` over streamable
HTTP, at ``/mcp``) answers a request without a token it issued with 401 and a
``WWW-Authenticate`` naming its protected resource metadata (RFC 9728), and the
authorization server (RFC 8414 metadata, ``/token``, ``/authorize``, ``/register``)
issues them:

* ``client_credentials`` for :data:`CC_ID` / :data:`CC_SECRET` (Basic or post);
* ``authorization_code`` with PKCE (S256) for :data:`PRE_ID` / :data:`PRE_SECRET`, or
  a client ``/register`` made; ``/authorize`` approves at once (the admin said yes) and
  redirects to the client's ``redirect_uri`` with ``code``, ``state`` and ``iss``;
* ``refresh_token``, rotating the refresh token (the old one is refused after).

Access tokens live ``--expires`` seconds. ``GET /stats`` counts what was asked (token
requests by grant, registrations, authorizations) and which token each MCP request
carried; ``POST /revoke`` forgets every access token (the next request is a 401), and
with ``?refresh`` every refresh token too.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import secrets
import socket
import time
from collections import Counter
from typing import Any
from urllib.parse import urlencode

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

CC_ID, CC_SECRET = "opsloop-cc", "cc-s3cret-value"
PRE_ID, PRE_SECRET = "opsloop-pre", "pre-s3cret-value"

stats: Counter[str] = Counter()
tokens: dict[str, float] = {}  # access token -> expiry (time.time())
refresh: dict[str, str] = {}  # refresh token -> client id
codes: dict[str, dict[str, str]] = {}  # code -> what /authorize was asked
clients: dict[str, dict[str, Any]] = {
    PRE_ID: {"client_secret": PRE_SECRET},
    CC_ID: {"client_secret": CC_SECRET},
}
options: dict[str, Any] = {"expires": 3600, "scope": "mcp:read", "dcr": True}


def _origin(request: Request) -> str:
    return f"http://{request.headers['host']}"


def _token(client: str) -> dict[str, Any]:
    access = f"at-{secrets.token_hex(8)}"
    tokens[access] = time.time() + options["expires"]
    stats["issued"] += 1
    answer = {"access_token": access, "token_type": "Bearer", "expires_in": options["expires"]}
    if client != CC_ID:
        fresh = f"rt-{secrets.token_hex(8)}"
        refresh[fresh] = client
        answer["refresh_token"] = fresh
    return answer


def _client(request: Request, form: Any) -> tuple[str | None, str | None]:
    basic = request.headers.get("authorization", "")
    if basic.startswith("Basic "):
        ident, _, secret = base64.b64decode(basic[6:]).decode().partition(":")
        return ident, secret
    return form.get("client_id"), form.get("client_secret")


def _refused(error: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": error}, status_code=status)


async def token(request: Request) -> Response:
    form = await request.form()
    grant = str(form.get("grant_type"))
    stats[f"token:{grant}"] += 1
    ident, secret = _client(request, form)
    known = clients.get(str(ident))
    if known is None or known.get("client_secret") not in (None, secret):
        return _refused("invalid_client", 401)
    if grant == "client_credentials":
        return JSONResponse(_token(str(ident)))
    if grant == "authorization_code":
        asked = codes.pop(str(form.get("code")), None)
        verifier = str(form.get("code_verifier", ""))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        if (
            asked is None
            or asked["client_id"] != ident
            or asked["redirect_uri"] != form.get("redirect_uri")
            or asked["code_challenge"] != challenge.decode().rstrip("=")
        ):
            return _refused("invalid_grant")
        return JSONResponse(_token(str(ident)))
    if grant == "refresh_token":
        if refresh.pop(str(form.get("refresh_token")), None) != ident:
            return _refused("invalid_grant")
        return JSONResponse(_token(str(ident)))
    return _refused("unsupported_grant_type")


async def authorize(request: Request) -> Response:
    asked = dict(request.query_params)
    stats["authorize"] += 1
    if asked.get("client_id") not in clients or asked.get("code_challenge_method") != "S256":
        return _refused("invalid_request")
    code = f"code-{secrets.token_hex(8)}"
    codes[code] = asked
    back = {"code": code, "state": asked.get("state", ""), "iss": _origin(request)}
    return RedirectResponse(f"{asked['redirect_uri']}?{urlencode(back)}", status_code=302)


async def register(request: Request) -> Response:
    if not options["dcr"]:
        return _refused("registration_not_supported", 404)
    stats["register"] += 1
    body = await request.json()
    ident = f"dyn-{len(clients)}"
    clients[ident] = {"client_secret": None}
    return JSONResponse({**body, "client_id": ident}, status_code=201)


async def as_metadata(request: Request) -> Response:
    origin = _origin(request)
    return JSONResponse(
        {
            "issuer": origin,
            "authorization_endpoint": f"{origin}/authorize",
            "token_endpoint": f"{origin}/token",
            **({"registration_endpoint": f"{origin}/register"} if options["dcr"] else {}),
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": [
                "client_secret_basic",
                "client_secret_post",
                "none",
            ],
            "authorization_response_iss_parameter_supported": True,
        }
    )


async def pr_metadata(request: Request) -> Response:
    origin = _origin(request)
    return JSONResponse(
        {
            "resource": f"{origin}/mcp",
            "authorization_servers": [origin],
            "scopes_supported": [options["scope"]],
        }
    )


async def get_stats(request: Request) -> Response:
    return JSONResponse(dict(stats))


async def revoke(request: Request) -> Response:
    tokens.clear()
    if "refresh" in request.query_params:
        refresh.clear()
    return JSONResponse({"revoked": True})


def _guarded(app: Any) -> Any:
    """``/mcp`` only with a live token this server issued; 401 with the challenge else."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = dict(scope.get("headers") or [])
            bearer = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
            if tokens.get(bearer, 0) < time.time():
                stats["401"] += 1
                host = headers[b"host"].decode()
                meta = f"http://{host}/.well-known/oauth-protected-resource/mcp"
                challenge = f'Bearer resource_metadata="{meta}"'
                out = [(b"www-authenticate", challenge.encode()), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 401, "headers": out})
                await send({"type": "http.response.body", "body": b""})
                return
            stats[f"mcp:{bearer}"] += 1
        await app(scope, receive, send)

    return wrapped


def build_mcp() -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {}}
        return types.ListToolsResult(
            tools=[types.Tool(name="ping", description="Answer pong.", input_schema=schema)]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="pong")])

    return Server("guarded", on_list_tools=list_tools, on_call_tool=call_tool)


def build_app() -> Any:
    routes = [
        Route("/.well-known/oauth-authorization-server", as_metadata),
        Route("/.well-known/oauth-protected-resource/mcp", pr_metadata),
        Route("/token", token, methods=["POST"]),
        Route("/authorize", authorize),
        Route("/register", register, methods=["POST"]),
        Route("/stats", get_stats),
        Route("/revoke", revoke, methods=["POST"]),
    ]
    return _guarded(
        build_mcp().streamable_http_app(host="127.0.0.1", custom_starlette_routes=routes)
    )


async def serve(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(build_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--expires", type=int, default=3600)
    parser.add_argument("--scope", default="mcp:read")
    parser.add_argument("--no-dcr", action="store_true")
    opts = parser.parse_args()
    options.update(expires=opts.expires, scope=opts.scope, dcr=not opts.no_dcr)
    anyio.run(serve, opts.port)


if __name__ == "__main__":
    main()
