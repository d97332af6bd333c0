"""``GET /healthz``: 200 when the database answers, 503 when it does not; ``GET /metrics``.

Docker's HEALTHCHECK and load balancers call /healthz; it must answer quickly either
way, so the database ping is bounded by ``PING_TIMEOUT_S``. /metrics is the Prometheus
text format of this process's metrics (``engine.metrics``) plus threads by status and
the pending approvals, read from the database at each scrape in one bounded read; with
the database down it still answers, without those. The app also times every answer to
``POST /slack/events`` (Slack's ack deadline is 3 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import get_args

from aiohttp import web

from engine import metrics
from engine.events import utcnow
from engine.state import Status
from engine.store import Store

log = logging.getLogger("opsloop.health")

PING_TIMEOUT_S = 2.0
STORE_KEY: web.AppKey[Store] = web.AppKey("opsloop_store", Store)
SLACK_EVENTS_PATH = "/slack/events"
STATUSES: tuple[str, ...] = get_args(Status)


async def healthz(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    try:
        await asyncio.wait_for(store.ping(), timeout=PING_TIMEOUT_S)
    except Exception as exc:  # StoreUnavailable, a timeout, a disposed engine…
        log.warning("health check failed: %s", " ".join(str(exc).split()) or type(exc).__name__)
        return web.json_response({"status": "unavailable"}, status=503)
    return web.json_response({"status": "ok"})


async def metrics_page(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    try:
        counts, oldest = await asyncio.wait_for(store.status_counts(), timeout=PING_TIMEOUT_S)
    except Exception as exc:  # the process's own metrics are still worth a scrape
        log.warning(
            "metrics: database not read: %s", " ".join(str(exc).split()) or type(exc).__name__
        )
        families = []
    else:
        families = metrics.store_families(counts, oldest, utcnow(), STATUSES)
    body = metrics.scrape(families)
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def time_slack_acks(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Observe how long each answer to Slack took (``opsloop_slack_ack_seconds``)."""
    if request.path != SLACK_EVENTS_PATH:
        return await handler(request)
    started = time.monotonic()
    try:
        return await handler(request)
    finally:
        metrics.SLACK_ACK_SECONDS.observe(time.monotonic() - started)


def make_health_app(store: Store) -> web.Application:
    """An aiohttp app serving ``GET /healthz`` and ``GET /metrics`` for ``store``; others
    add their routes (the answers to ``POST /slack/events`` are timed)."""
    app = web.Application(middlewares=[time_slack_acks])
    app[STORE_KEY] = store
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)
    return app
