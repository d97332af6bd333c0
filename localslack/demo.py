"""What ``opsloop local`` brings of its own: its opsloop.yaml and the platform API it calls.

:func:`demo_config` reads ``localslack/opsloop.yaml`` (the service catalog MCP server,
the ``restart_service`` HTTP action, the local GitHub and PagerDuty, the page's alerts,
the rules) with the values only local mode knows: this interpreter, the catalog's file
beside the workspace's, the page's URL and the local fakes' credentials
(:mod:`localslack.integrations`). Local mode uses it unless ``OPSLOOP_CONFIG`` or
``./opsloop.yaml`` names another file.

:class:`DemoPlatform` is the endpoint that action calls, served on the page's own
port: ``POST /demo/api/services/{service}/restart``. It counts every request and
honours ``Idempotency-Key``: a request repeating a key restarts nothing again.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from engine.config_file import ConfigFile, parse_config
from localslack.integrations import config_values

DEMO_CONFIG = Path(__file__).with_name("opsloop.yaml")
SERVICES = ("api", "web", "worker")
RESTART_PATH = "/demo/api/services/{service}/restart"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def catalog_path(workspace_file: Path) -> Path:
    """The catalog MCP server's file, beside the workspace's (``opsloop.local.json`` ->
    ``opsloop.local.catalog.json``), so both live and go together."""
    return workspace_file.with_name(workspace_file.stem + ".catalog.json")


def local_values(url: str, workspace_file: Path, *, python: str = sys.executable) -> dict[str, str]:
    """The ``${OPSLOOP_LOCAL_*}`` values of a local run with the page at ``url``
    (``http://host:port/``) and its workspace in ``workspace_file``."""
    return {
        "OPSLOOP_LOCAL_PYTHON": python,
        "OPSLOOP_LOCAL_CATALOG": str(catalog_path(workspace_file)),
        "OPSLOOP_LOCAL_URL": url,
        "OPSLOOP_LOCAL_HOST": urlsplit(url).hostname or "127.0.0.1",
        **config_values(),
    }


def demo_config(url: str, workspace_file: Path, *, python: str = sys.executable) -> ConfigFile:
    """The bundled configuration, for the page at ``url`` (``http://host:port/``)."""
    values = local_values(url, workspace_file, python=python)
    return parse_config(DEMO_CONFIG.read_text(encoding="utf-8"), values, str(DEMO_CONFIG))


@dataclass
class DemoPlatform:
    """The local platform API: ``requests`` counts what arrived, ``restarts`` what ran."""

    requests: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # by service
    _done: dict[str, dict[str, Any]] = field(default_factory=dict)  # by idempotency key

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(RESTART_PATH, self.restart)

    async def restart(self, request: web.Request) -> web.Response:
        self.requests += 1
        service = request.match_info["service"]
        if service not in SERVICES:
            return web.json_response({"error": f"no service {service!r}"}, status=404)
        key = request.headers.get(IDEMPOTENCY_HEADER, "").strip()
        if not key:
            return web.json_response({"error": f"{IDEMPOTENCY_HEADER} is required"}, status=400)
        if key in self._done:
            return web.json_response({**self._done[key], "repeat": True})
        self.restarts[service] = self.restarts.get(service, 0) + 1
        done = {
            "service": service,
            "restart": self.restarts[service],
            "restarted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        self._done[key] = done
        return web.json_response(done)
