"""``POST /alerts/{alertmanager|pagerduty|generic}``: an alert opens a thread in Slack.

Each source of ``alerts:`` in ``opsloop.yaml`` names its channel and the instruction the
model gets; a source that is not configured answers 404. What each source sends is
authenticated on the raw body before anything is parsed, its own way:

* Alertmanager: ``Authorization: Bearer <alerts.alertmanager.token>`` (its webhook
  config's ``http_config.authorization``), compared in constant time;
* PagerDuty (v3 webhooks): ``X-PagerDuty-Signature: v1=<hex HMAC-SHA256 of the body,
  key integrations.pagerduty.webhook_secret>``, possibly several signatures separated by
  commas while PagerDuty rotates the secret (any one that matches will do);
* generic: signed as ``/hooks`` are (``X-Opsloop-Request-Timestamp`` within 5 minutes,
  ``X-Opsloop-Signature: v1=<hex HMAC-SHA256 of "v1:<timestamp>:alerts/generic:<body>">``,
  key ``alerts.generic.secret``); the route is signed in, so a signature made for a
  wait's hook never passes here.

Then the body is parsed (``engine.alerts``) and each alert is handed to
``engine.inputs.receive_alert``: a firing alert opens a thread, or appends to the one
open for its fingerprint; a resolution appends to it. Answers: 200 with what became of
each alert; 401 unauthenticated, 413 over ``MAX_BODY``, 400 for a body its source would
not send (nothing stored for any of them, nor for a whole body when one of its alerts
is malformed); 503 (with ``Retry-After``) when the database or Slack's ``auth.test``
cannot be reached, so the sender retries; never a 500 for anything a sender does.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot import signing
from bot.hooks import MAX_BODY, SIGNATURE_HEADER, TIMESTAMP_HEADER, BodyTooLarge, read_body
from engine.alerts import SOURCES, AlertProblem, SourceName, parse
from engine.config_file import ConfigFile
from engine.errors import StoreUnavailable
from engine.inputs import Accepted, receive_alert
from engine.store import Store

log = logging.getLogger("opsloop.alerts")

PAGERDUTY_HEADER = "X-PagerDuty-Signature"
GENERIC_BOUND = "alerts/generic"  # signed in: no wait id has a "/"
RETRY_AFTER_S = 30
_HEX = re.compile(r"[0-9a-f]{64}")

# Why a request is not authentic (None: it is), from its headers and raw body.
Check = Callable[[signing.Headers, bytes], str | None]
# The Slack team the bot's threads live in (``auth.test``); raises when Slack cannot say.
TeamOf = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class Source:
    """One configured source: where its threads live, what the model is told, how its
    requests are authenticated."""

    name: SourceName
    channel: str
    instruction: str
    check: Check


def sources_of(config: ConfigFile | None) -> dict[str, Source]:
    """The sources ``opsloop.yaml`` enables, by name (none without a file)."""
    if config is None:
        return {}
    alerts, found = config.alerts, {}
    if alerts.alertmanager is not None:
        token = alerts.alertmanager.token.get_secret_value()
        found["alertmanager"] = Source(
            "alertmanager",
            alerts.alertmanager.channel,
            alerts.alertmanager.instruction,
            lambda headers, body: check_bearer(token, headers),
        )
    pd = config.integrations.pagerduty
    if alerts.pagerduty is not None and pd is not None and pd.webhook_secret is not None:
        secret = pd.webhook_secret.get_secret_value()
        found["pagerduty"] = Source(
            "pagerduty",
            alerts.pagerduty.channel,
            alerts.pagerduty.instruction,
            lambda headers, body: check_pagerduty(secret, headers, body),
        )
    if alerts.generic is not None:
        key = alerts.generic.secret.get_secret_value()
        found["generic"] = Source(
            "generic",
            alerts.generic.channel,
            alerts.generic.instruction,
            lambda headers, body: check_generic(key, headers, body),
        )
    return found


# --- authentication -------------------------------------------------------------------


def check_bearer(token: str, headers: signing.Headers) -> str | None:
    """None if ``Authorization`` is ``Bearer <token>``; else why not."""
    try:
        given = signing.one_header(headers, "Authorization")
    except ValueError as exc:
        return str(exc)
    if not given:
        return "missing Authorization: Bearer <token>"
    scheme, _, credentials = given.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return "Authorization must be Bearer <token>"
    if not hmac.compare_digest(credentials.strip().encode(), token.encode()):
        return "bad token"
    return None


def pagerduty_signature(secret: str, body: bytes) -> str:
    """One ``X-PagerDuty-Signature`` entry for ``body``, as PagerDuty computes it."""
    return "v1=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def check_pagerduty(secret: str, headers: signing.Headers, body: bytes) -> str | None:
    """None if one of the header's ``v1=`` signatures is ``body``'s; else why not."""
    try:
        given = signing.one_header(headers, PAGERDUTY_HEADER)
    except ValueError as exc:
        return str(exc)
    if not given:
        return f"missing {PAGERDUTY_HEADER}"
    wanted = pagerduty_signature(secret, body).removeprefix("v1=").encode()
    ok = False
    for entry in given.split(",")[:10]:  # a handful while a secret rotates
        scheme, _, digest = entry.strip().partition("=")
        if scheme == "v1" and _HEX.fullmatch(digest):
            # Every entry is compared (no early exit): the time says nothing of which.
            ok |= hmac.compare_digest(digest.encode(), wanted)
    return None if ok else "bad signature"


def generic_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``X-Opsloop-Signature`` of ``body`` for ``POST /alerts/generic`` at ``timestamp``."""
    return signing.signature(secret, timestamp, body, version="v1", bound=(GENERIC_BOUND,))


def check_generic(secret: str, headers: signing.Headers, body: bytes) -> str | None:
    return signing.check(
        secret,
        headers,
        body,
        timestamp_header=TIMESTAMP_HEADER,
        signature_header=SIGNATURE_HEADER,
        version="v1",
        bound=(GENERIC_BOUND,),
    )


# --- the Slack team --------------------------------------------------------------------


class TeamUnknown(Exception):
    """Slack did not say which team the bot is in (``auth.test`` failed)."""


class SlackTeam:
    """The bot's team id, from ``auth.test`` once per process: an alert's thread is keyed
    in it, so replies in Slack find the thread."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._team: str | None = None
        self._lock = asyncio.Lock()

    async def __call__(self) -> str:
        if self._team is not None:
            return self._team
        async with self._lock:
            if self._team is None:
                try:
                    answer = await self.client.auth_test()
                except (SlackApiError, SlackClientError, OSError, TimeoutError) as exc:
                    raise TeamUnknown(f"auth.test failed: {type(exc).__name__}") from exc
                team = answer.get("team_id")
                if not isinstance(team, str) or not team:
                    raise TeamUnknown("auth.test named no team")
                self._team = team
        return self._team


# --- the route -------------------------------------------------------------------------


def _answer(status: int, **body: Any) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return web.json_response(body, status=status, headers=headers)


def add_alert_routes(
    app: web.Application,
    store: Store,
    config: ConfigFile | None,
    team: TeamOf,
    kick: Callable[[str], None],
) -> None:
    """Serve ``POST /alerts/{source}`` for the sources ``config`` enables (404 for any
    other); ``team`` names the Slack team, ``kick`` wakes the worker for a thread."""
    sources = sources_of(config)

    async def alert(request: web.Request) -> web.Response:
        name = request.match_info["source"]
        source = sources.get(name)
        if source is None:
            known = name in SOURCES
            why = (
                f"alerts from {name} are not enabled in opsloop.yaml" if known else "no such source"
            )
            return _answer(404, error=why)
        try:
            body = await read_body(request, MAX_BODY)
        except BodyTooLarge:
            log.info("alert refused source=%s: body over %d bytes", name, MAX_BODY)
            return _answer(413, error="body too large")
        if (unsigned := source.check(request.headers, body)) is not None:
            log.info("alert refused source=%s: %s", name, unsigned)
            return _answer(401, error=unsigned)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, too deep
            log.info("alert refused source=%s: the body is not JSON", name)
            return _answer(400, error="the body is not JSON")
        try:
            # A generic alert without an id is one delivery per signature (as /hooks).
            alerts = parse(source.name, data, delivery=request.headers.get(SIGNATURE_HEADER, ""))
        except (AlertProblem, RecursionError) as exc:
            bad = str(exc) if isinstance(exc, AlertProblem) else "the body is nested too deep"
            log.info("alert refused source=%s: %s", name, bad)
            return _answer(400, error=bad)
        if not alerts:
            return _answer(200, ok=True, alerts=[])  # an event type that is none of ours
        try:
            team_id = await team()
        except TeamUnknown as exc:
            log.warning("alert deferred source=%s: %s", name, exc)
            return _answer(503, error="Slack cannot be reached; try again")
        done: list[dict[str, str]] = []
        try:
            for parsed in alerts:
                event = parsed.event(channel=source.channel, instruction=source.instruction)
                result = await receive_alert(store, event, team=team_id)
                told = {"fingerprint": parsed.fingerprint}
                if isinstance(result, Accepted):
                    if not result.deduplicated:
                        kick(result.thread_id)
                    state = "duplicate" if result.deduplicated else "stored"
                    done.append(told | {"thread_id": result.thread_id, "result": state})
                else:
                    done.append(told | {"result": "ignored", "reason": result.reason})
        except StoreUnavailable as exc:
            # What was stored stays (a resend is a no-op for it): the sender retries all.
            log.warning("alert deferred source=%s: %s", name, exc)
            return _answer(503, error="the database cannot be reached; try again")
        counts = Counter(d["result"] for d in done)
        log.info(
            "alerts source=%s %s", name, " ".join(f"{k}={n}" for k, n in sorted(counts.items()))
        )
        return _answer(200, ok=True, alerts=done)

    app.router.add_post("/alerts/{source}", alert)
