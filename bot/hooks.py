"""``POST /hooks/{wait_id}``: an external job reports that a thread's wait is over.

The body is the job's result (a JSON object). The sender signs it and the wait id with
the secret in ``OPSLOOP_WEBHOOK_SECRET`` (DESIGN.md, "Job webhooks"):

    X-Opsloop-Request-Timestamp: <unix seconds>
    X-Opsloop-Signature: v1=<hex HMAC-SHA256 of "v1:<timestamp>:<wait_id>:<body>">

A missing, malformed, repeated, stale (over 5 minutes) or wrong signature is 401 and
nothing changes, and so is the old ``v0=`` (it did not bind the wait id: one job's
signed result could finish another thread's wait); the whole body is read first (it may
arrive in pieces), up to ``MAX_BODY`` (else 413). A delivery repeated with the same
signature is stored once.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable

from aiohttp import web

from bot import signing
from engine.errors import ThreadNotFound
from engine.inputs import Accepted, finish_wait, thread_of_wait
from engine.store import Store

log = logging.getLogger("opsloop.hooks")

MAX_SKEW_S = signing.MAX_SKEW_S
MAX_BODY = 1_000_000
TIMESTAMP_HEADER = "X-Opsloop-Request-Timestamp"
SIGNATURE_HEADER = "X-Opsloop-Signature"
VERSION = "v1"
V0_REFUSED = (
    "v0 signatures are no longer accepted: sign v1:<timestamp>:<wait_id>:<body> "
    "and send X-Opsloop-Signature: v1=<hex>"
)


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, however it arrives (chunked, in pieces); ``BodyTooLarge`` past
    ``limit`` bytes, without reading further."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def signature(secret: str, timestamp: str, wait_id: str, body: bytes) -> str:
    """``X-Opsloop-Signature`` of ``body`` for the wait ``wait_id``, sent at ``timestamp``."""
    return signing.signature(secret, timestamp, body, version=VERSION, bound=(wait_id,))


def check_signature(
    secret: str, headers: signing.Headers, wait_id: str, body: bytes, now: float | None = None
) -> str | None:
    """None if the request for ``wait_id`` is signed with ``secret``; otherwise why not."""
    with contextlib.suppress(ValueError):  # a repeated header: signing.check says so
        if (signing.one_header(headers, SIGNATURE_HEADER) or "").startswith("v0="):
            return V0_REFUSED  # said outright: a sender still on v0 must know to move
    return signing.check(
        secret,
        headers,
        body,
        timestamp_header=TIMESTAMP_HEADER,
        signature_header=SIGNATURE_HEADER,
        now=now,
        version=VERSION,
        bound=(wait_id,),
    )


def add_hook_route(
    app: web.Application, store: Store, secret: str | None, kick: Callable[[str], None]
) -> None:
    """Serve ``POST /hooks/{wait_id}``; without a secret every request is refused."""

    async def hook(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, MAX_BODY)
        except BodyTooLarge:
            log.info("hook refused: body over %d bytes", MAX_BODY)
            return web.json_response({"error": "body too large"}, status=413)
        wait_id = request.match_info["wait_id"]
        why = "webhooks are disabled: OPSLOOP_WEBHOOK_SECRET is not set"
        if secret:
            why = check_signature(secret, request.headers, wait_id, body) or ""
        if why:
            log.info("hook refused: %s", why)
            return web.json_response({"error": why}, status=401)
        try:
            result = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, too deep
            log.info("hook refused: the body is not JSON")
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(result, dict):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        try:
            thread_id = thread_of_wait(wait_id)
            done = await finish_wait(
                store,
                thread_id,
                wait_id=wait_id,
                result=result,
                actor="webhook",
                # Unique across threads although the store dedupes per thread: a v1
                # signature verifies for one wait id only, so for one thread only.
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
