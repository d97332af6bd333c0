"""``GET /healthz``: 200 when the database answers, 503 when it does not; ``GET /metrics``.

/metrics is unauthenticated, as Prometheus endpoints usually are: it is served beside
/healthz, or alone (``make_metrics_app``) on ``OPSLOOP_METRICS_PORT``, off the public port.

Docker's HEALTHCHECK and load balancers call /healthz; it must answer quickly either
way, so the database ping is bounded by ``PING_TIMEOUT_S``. /metrics is the Prometheus
text format of this process's metrics (``engine.metrics``) plus threads by status and
the pending approvals, read from the database at each scrape in one bounded read; with
the database down it still answers, without those. Answers to Slack are timed where
they are given (``bot.runtime.Runtime.answering``). The MCP servers of a serving process
(``MCP_KEY``) are shown as this process holds them: up or down, tools offered, tools
redefined while it ran (``engine.metrics.mcp_families``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, get_args

from aiohttp import web
from prometheus_client.core import Metric

from engine import metrics
from engine.events import utcnow
from engine.state import Status
from engine.store import Store

if TYPE_CHECKING:
    from tools.mcp import McpSource

log = logging.getLogger("opsloop.health")

PING_TIMEOUT_S = 2.0
STORE_KEY: web.AppKey[Store] = web.AppKey("opsloop_store", Store)
MCP_KEY: web.AppKey[Sequence[McpSource]] = web.AppKey("opsloop_mcp_servers")
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
        families: list[Metric] = []
    else:
        families = metrics.store_families(counts, oldest, utcnow(), STATUSES)
    if servers := request.app.get(MCP_KEY, ()):  # as this process holds them: no I/O
        held = [(s.server_name, s.up, len(s.offered), len(s.redefined())) for s in servers]
        families += metrics.mcp_families(held)
    body = metrics.scrape(families)
    return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})


def make_health_app(
    store: Store, *, metrics: bool = True, mcp: Sequence[McpSource] = ()
) -> web.Application:
    """An aiohttp app serving ``GET /healthz`` and (unless ``metrics`` is false: they are
    served on a port of their own) ``GET /metrics`` for ``store`` and the MCP servers
    ``mcp``; others add their routes. /healthz is about the database alone: an MCP server
    that is down is a gauge of /metrics, not a process to restart."""
    app = web.Application()
    app[STORE_KEY] = store
    app[MCP_KEY] = mcp
    app.router.add_get("/healthz", healthz)
    if metrics:
        app.router.add_get("/metrics", metrics_page)
    return app


def make_metrics_app(store: Store, mcp: Sequence[McpSource] = ()) -> web.Application:
    """An aiohttp app serving ``GET /metrics`` alone, for the internal metrics port."""
    app = web.Application()
    app[STORE_KEY] = store
    app[MCP_KEY] = mcp
    app.router.add_get("/metrics", metrics_page)
    return app
