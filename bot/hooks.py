"""``POST /hooks/{wait_id}``: an external job reports that a thread's wait is over.

The body is the job's result (a JSON object). The sender signs it like Slack signs its
requests, with the secret in ``OPSLOOP_WEBHOOK_SECRET``:

    X-Opsloop-Request-Timestamp: <unix seconds>
    X-Opsloop-Signature: v0=<hex HMAC-SHA256 of "v0:<timestamp>:<body>">

A missing, stale (over 5 minutes) or wrong signature is 401 and nothing changes. A
delivery repeated with the same signature is stored once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable

from aiohttp import web

from engine.errors import ThreadNotFound
from engine.inputs import Accepted, finish_wait, thread_of_wait
from engine.store import Store

log = logging.getLogger("opsloop.hooks")

MAX_SKEW_S = 300
MAX_BODY = 1_000_000
TIMESTAMP_HEADER = "X-Opsloop-Request-Timestamp"
SIGNATURE_HEADER = "X-Opsloop-Signature"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def check_signature(
    secret: str, headers: dict[str, str] | object, body: bytes, now: float | None = None
) -> str | None:
    """None if the request is signed with ``secret``; otherwise why not."""
    get = getattr(headers, "get")  # noqa: B009 - a Mapping or aiohttp's CIMultiDict
    stamp, given = get(TIMESTAMP_HEADER), get(SIGNATURE_HEADER)
    if not stamp or not given:
        return "missing signature headers"
    try:
        age = abs((now or time.time()) - int(stamp))
    except ValueError:
        return "malformed timestamp"
    if age > MAX_SKEW_S:
        return "stale timestamp"
    if not hmac.compare_digest(signature(secret, stamp, body), given):
        return "bad signature"
    return None


def add_hook_route(
    app: web.Application, store: Store, secret: str | None, kick: Callable[[str], None]
) -> None:
    """Serve ``POST /hooks/{wait_id}``; without a secret every request is refused."""

    async def hook(request: web.Request) -> web.Response:
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return web.json_response({"error": "body too large"}, status=413)
        why = "webhooks are disabled: OPSLOOP_WEBHOOK_SECRET is not set"
        if secret:
            why = check_signature(secret, request.headers, body) or ""
        if why:
            return web.json_response({"error": why}, status=401)
        try:
            result = json.loads(body or b"{}")
        except ValueError:
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(result, dict):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        wait_id = request.match_info["wait_id"]
        try:
            thread_id = thread_of_wait(wait_id)
            done = await finish_wait(
                store,
                thread_id,
                wait_id=wait_id,
                result=result,
                actor="webhook",
                dedupe_key=f"hook:{request.headers[SIGNATURE_HEADER]}",
            )
        except ThreadNotFound:
            return web.json_response({"error": f"no wait {wait_id!r}"}, status=404)
        if not isinstance(done, Accepted):
            return web.json_response({"error": done.reason}, status=409)
        if not done.deduplicated:
            kick(thread_id)
        return web.json_response({"ok": True, "thread_id": thread_id})

    app.router.add_post("/hooks/{wait_id}", hook)
