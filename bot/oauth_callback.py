"""``GET /oauth/callback``: where an authorization server sends an admin's browser back
after they authorized opsloop for an MCP server (``auth: {type: authorization_code}``).

The query's ``code`` is kept for the authorization that waits for its ``state``
(``mcp_oauth``; tools/mcp/auth.py); the server's next connect, on whatever replica,
takes it once and exchanges it for tokens, and this process reconnects at once
(``on_authorized``). A ``state`` no authorization waits for (made up, used already,
replaced by a newer link) is a 400, and so is a query without one, an answer that
says the admin refused (``error``), or parameters past a sane size: nothing is
stored for any of them. The page is plain text; nothing from the query is echoed but
the authorization server's error code.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime

from aiohttp import web

from engine.errors import StoreUnavailable
from engine.store import Store

log = logging.getLogger("opsloop.oauth")

PATH = "/oauth/callback"
_MAX_PARAM = 4096  # a code, a state, an issuer: far shorter
_ERROR_CODE = re.compile(r"[a-z_]{1,64}")  # RFC 6749 error codes, safe to repeat


def _page(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


def add_oauth_callback_route(
    app: web.Application, store: Store, on_authorized: Callable[[str], None]
) -> None:
    """Serve ``GET /oauth/callback``; ``on_authorized(server)`` when a code was kept."""

    async def callback(request: web.Request) -> web.Response:
        query = request.query
        if any(len(v) > _MAX_PARAM for v in query.values()):
            return _page(400, "The authorization answer is too large.")
        if "error" in query:
            said = query["error"] if _ERROR_CODE.fullmatch(query["error"]) else "an error"
            log.info("oauth callback: the authorization server answered %s", said)
            return _page(
                400, f"The authorization server answered {said}: opsloop is not authorized."
            )
        state, code = query.get("state", ""), query.get("code", "")
        if not state or not code:
            return _page(400, "The answer has no code or no state: open the link again.")
        try:
            server = await store.answer_mcp_pending(
                state, code, query.get("iss"), datetime.now(UTC)
            )
        except StoreUnavailable:
            log.warning("oauth callback: the database is unreachable")
            return _page(503, "opsloop cannot reach its database: open the link again later.")
        if server is None:
            log.info("oauth callback: no authorization waits for this state")
            return _page(
                400,
                "No authorization waits for this answer: it was used already, or a newer "
                "link replaced it (`opsloop doctor` shows the current one).",
            )
        log.info("oauth callback: authorization received server=%s", server)
        on_authorized(server)
        return _page(
            200, f"opsloop is authorized for the MCP server {server}. You can close this page."
        )

    app.router.add_get(PATH, callback)
