"""The Bolt app: Slack's events, clicks, modal submissions and ``/opsloop``, as engine inputs.

The listeners (:mod:`bot.listeners`) translate, nothing more: each reads its payload,
makes one front-door call of :mod:`engine.inputs` (deduplicated on the delivery), then
acknowledges. ``process_before_response=True`` makes Bolt send its HTTP answer only
after the listener returns, so an input Slack sees acknowledged is stored: if the
database is down the listener raises, Bolt answers 500 and Slack delivers again later,
where the dedupe key makes the retry count once. Anything slow (the model, tools,
posting to Slack) happens elsewhere: the worker, woken with ``kick(thread_id)``, or a
background task here for an ephemeral note, a modal or the Home tab.

Every delivery gets a 2xx unless storing it failed: events the bot ignores (edits,
bots, chatter, shortcuts, options requests) are acknowledged on purpose, since an
unmatched request is answered 404 and Slack retries those.

Serving over HTTP: route ``POST /slack/events`` to :func:`handle_slack_request` (it
checks the signature on the raw bytes and the body's shape before Bolt, which would
answer a malformed one 500) and call :func:`drain` on shutdown. Over Socket Mode, hand
the app to ``AsyncSocketModeHandler`` as it is.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot import signing
from bot.hooks import BodyTooLarge, read_body
from bot.listeners import register
from bot.listeners.deps import Background, Deps, Identity, Kick, SlackUnavailable
from bot.names import Names
from bot.refusals import INVALID_BUTTON
from bot.reviewers import Reviewers
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.store import Store
from tools import ToolRegistry

__all__ = ["INVALID_BUTTON", "SlackUnavailable", "build_app", "drain", "handle_slack_request"]

log = logging.getLogger("opsloop.bot")

DRAIN_TIMEOUT_S = 5.0
MAX_BODY = 1_000_000  # Slack's payloads are far smaller; a bigger one is not Slack's
# Events that Bolt does not authorise with auth.test (the app is being removed).
_NO_AUTH_EVENTS = frozenset({"app_uninstalled", "tokens_revoked", "team_access_revoked"})


@dataclass(frozen=True)
class _Door:
    """What :func:`handle_slack_request` and :func:`drain` need of an app we built."""

    signing_secret: str
    background: Background


_DOORS: weakref.WeakKeyDictionary[AsyncApp, _Door] = weakref.WeakKeyDictionary()


async def drain(app: AsyncApp, timeout: float = DRAIN_TIMEOUT_S) -> None:  # noqa: ASYNC109
    """Wait for ``app``'s background Slack calls (ephemerals, modals, Home) to finish."""
    door = _DOORS.get(app)
    if door is None or not door.background.tasks:
        return
    _done, pending = await asyncio.wait(set(door.background.tasks), timeout=timeout)
    for task in pending:
        task.cancel()


async def handle_slack_request(
    app: AsyncApp,
    request: web.Request,
    answering: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> web.Response:
    """``POST /slack/events`` for aiohttp: events, interactivity and slash commands.

    In order, each refusal one log line: the whole body up to ``MAX_BODY`` (413), its
    signature on the raw bytes (401: missing, repeated, malformed, stale or wrong), its
    shape as Bolt reads it (400: not UTF-8, not a JSON object, fields of the wrong
    type). Then Bolt's answer: 2xx, or 500 when storing failed (Slack retries).
    ``answering`` brackets all but the reading of the body, so a sender that trickles its
    body does not hold back what waits for answers to finish (the worker).
    """
    try:
        raw = await read_body(request, MAX_BODY)
    except BodyTooLarge:
        log.info("refused a Slack request: body over %d bytes", MAX_BODY)
        return web.json_response({"error": "body too large"}, status=413)
    with answering():
        return await _answer(app, request, raw)


async def _answer(app: AsyncApp, request: web.Request, raw: bytes) -> web.Response:
    door = _DOORS[app]
    why = signing.check(
        door.signing_secret,
        request.headers,
        raw,
        timestamp_header=p.TIMESTAMP_HEADER,
        signature_header=p.SIGNATURE_HEADER,
    )
    if why is not None:
        log.info("refused a Slack request: %s", why)
        return web.json_response({"error": why}, status=401)
    try:
        p.parse_request(raw, request.content_type)
    except p.MalformedRequest as exc:
        log.info("refused a signed Slack request: %s", exc)
        return web.json_response({"error": "malformed body"}, status=400)
    # One value per header: Bolt keeps the last of repeated ones, we checked the first.
    headers: dict[str, str | Sequence[str]] = {
        name.lower(): value for name, value in reversed(list(request.headers.items()))
    }
    bolt_request = AsyncBoltRequest(
        body=raw.decode("utf-8"), query=request.query_string, headers=headers
    )
    response = await app.async_dispatch(bolt_request)
    return await to_aiohttp_response(response)


def build_app(
    *,
    store: Store,
    token: str,
    signing_secret: str,
    client: AsyncWebClient | None = None,
    reviewers: ReviewerRule,
    kick: Kick,
    groups: Reviewers | None = None,
    tools: ToolRegistry | None = None,
    policy: PolicySet | None = None,
) -> AsyncApp:
    """The Bolt app for ``store``. ``client`` (its token wins over ``token``) is the Web
    API client, pointing at ``SLACK_API_URL``; ``kick(thread_id)`` wakes the worker;
    ``groups`` resolves user-group approvers (made from the client if None). ``tools``
    and ``policy`` are the runner's: an edit of a call's arguments is checked against
    the tool's schema and decided again by the rules (no tools: nothing can be edited)."""
    identity = Identity()

    async def check_identity(body: dict[str, Any], client: AsyncWebClient, next_: Any) -> Any:
        event = body.get("event")
        event_type = event.get("type") if isinstance(event, dict) else None
        if body.get("type") not in ("url_verification", "ssl_check") and (
            event_type not in _NO_AUTH_EVENTS
        ):
            await identity.ensure(client)
        return await next_()

    if client is not None and not client.token:
        client.token = token
    app = AsyncApp(
        token=None if client is not None else token,
        signing_secret=signing_secret,
        client=client,
        process_before_response=True,
        before_authorize=check_identity,
    )
    if groups is None:  # a call's own rule may name groups, whatever the process's are
        groups = Reviewers(app.client)
    background = Background()
    _DOORS[app] = _Door(signing_secret, background)
    names = Names(app.client)
    register(app, Deps(store, reviewers, kick, groups, names, background, identity, tools, policy))
    return app
