"""``GET /healthz``: 200 when the database answers, 503 when it does not.

Docker's HEALTHCHECK and load balancers call it; it must answer quickly either way, so
the database ping is bounded by ``PING_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from engine.store import Store

log = logging.getLogger("opsloop.health")

PING_TIMEOUT_S = 2.0
STORE_KEY: web.AppKey[Store] = web.AppKey("opsloop_store", Store)


async def healthz(request: web.Request) -> web.Response:
    store = request.app[STORE_KEY]
    try:
        await asyncio.wait_for(store.ping(), timeout=PING_TIMEOUT_S)
    except Exception as exc:  # StoreUnavailable, a timeout, a disposed engine…
        log.warning("health check failed: %s", " ".join(str(exc).split()) or type(exc).__name__)
        return web.json_response({"status": "unavailable"}, status=503)
    return web.json_response({"status": "ok"})


def make_health_app(store: Store) -> web.Application:
    """An aiohttp app serving ``GET /healthz`` for ``store``; others add their routes."""
    app = web.Application()
    app[STORE_KEY] = store
    app.router.add_get("/healthz", healthz)
    return app
