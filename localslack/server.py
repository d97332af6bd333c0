"""The Slack side of ``opsloop local``: a workspace and everything an app sees of it.

:class:`LocalSlack` is to an app what a Slack workspace is, and no more: it makes up the
bot token and the signing secret (as installing an app does), serves the Web API the app
calls (``/api/{method}``), the page people use (``/``, ``/static/…``, ``/ui/…``), the
platform API the bundled HTTP action calls and the GitHub and PagerDuty the bundled
opsloop.yaml points at (``/github/…``, ``/pagerduty/…``), and sends the app's request
URL what people do, signed (and its ``/alerts/generic`` the alert the page fires). It
reaches the app only over HTTP; which app that is, and the port both share, is the
caller's business (``bot/local_mode.py`` for ``opsloop local``).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from engine.store import Store
from localslack.app_link import SLACK_RETRY_DELAYS, AppLink
from localslack.demo import DemoPlatform
from localslack.identity import CHANNELS, LOCAL, PEOPLE, USERGROUPS, user_record
from localslack.integrations import LocalIntegrations
from localslack.state_file import StateFile
from localslack.ui import LocalUi, ModelInfo
from localslack.web_api import WebApi
from localslack.workspace import Workspace

log = logging.getLogger("opsloop.local")

_WILDCARDS = ("", "0.0.0.0", "::")


class LocalWebApi(WebApi):
    """The Web API of the local workspace: what a method changed is saved before the
    bot hears back, so nothing Slack said it did is lost to a crash."""

    def __init__(self, workspace: Workspace, *, token: str, state: StateFile) -> None:
        super().__init__(workspace, token=token)
        self.state = state

    async def settle(self) -> None:
        await self.state.save()


class LocalSlack:
    """The workspace of the page served at ``host``:``port``, kept in the file ``path``.

    An app is configured with ``token``, ``signing_secret`` and ``api_url``; then
    :meth:`serve` adds the workspace's routes to the app's port and :meth:`start` begins
    sending to the app's request URL (what the last run left first)."""

    def __init__(
        self,
        host: str,
        port: int,
        path: Path,
        *,
        retry_delays: Sequence[float] = SLACK_RETRY_DELAYS,
    ) -> None:
        self.host = host
        self.url = page_url(host, port)
        self.workspace = local_workspace()
        self.state = StateFile(path, self.workspace)
        log.info("workspace: %s (%s)", path, "restored" if self.state.load() else "new")
        self.token = "xoxb-local-" + secrets.token_hex(12)
        self.signing_secret = secrets.token_hex(20)
        self.hosts = allowed_hosts(host, port)
        self.link = AppLink(
            self.workspace,
            signing_secret=self.signing_secret,
            retry_delays=retry_delays,
            before_send=self.state.save,
        )
        self.workspace.listen(self.link.feed)
        self.platform = DemoPlatform()
        self.integrations = LocalIntegrations(self.url)

    @property
    def api_url(self) -> str:
        """The Web API's base URL, for the app's ``SLACK_API_URL``."""
        return self.url + "api/"

    def serve(
        self,
        app: web.Application,
        model: ModelInfo,
        *,
        store: Store | None = None,
        tools: Callable[[], Iterable[Any]] = lambda: (),
    ) -> LocalUi:
        """Add the Web API, the page and the platform API to ``app``; the page's API.
        ``store`` and ``tools`` are the app's, for the page's trace and replay panes."""
        ui = LocalUi(
            self.workspace,
            self.link,
            PEOPLE,
            model,
            save=self.state.save,
            store=store,
            tools=tools,
            hosts=self.hosts,
            base_url=self.url,
            alerts=self.integrations,
        )
        LocalWebApi(self.workspace, token=self.token, state=self.state).add_routes(app)
        self.platform.add_routes(app)  # what the bundled restart_service action calls
        self.integrations.add_routes(app)  # the GitHub and PagerDuty of the bundled file
        ui.add_routes(app)
        return ui

    def start(self, request_url: str) -> None:
        """Send the app at ``request_url`` what people do."""
        self.link.start(request_url)
        if not _loopback(self.host):
            log.warning(
                "listening on %s: anyone who can reach it can act as anyone in the workspace "
                "(OPSLOOP_HOST=127.0.0.1 keeps it to this machine)",
                self.host,
            )


def local_workspace() -> Workspace:
    people = [user_record(LOCAL, p.id, p.name, p.real_name, email=p.email) for p in PEOPLE]
    return Workspace(LOCAL, people=people, channels=CHANNELS, usergroups=USERGROUPS)


def page_url(host: str, port: int) -> str:
    """The URL to open: a wildcard address is opened on the loopback one."""
    if host in _WILDCARDS:
        host = "127.0.0.1" if host != "::" else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def allowed_hosts(host: str, port: int) -> frozenset[str] | None:
    """The ``Host`` headers the page accepts (None: listening everywhere, any)."""
    if host in _WILDCARDS:
        return None
    names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    hosts = {f"{n}:{port}" for n in names}
    if port == 80:
        hosts |= names
    return frozenset(h.lower() for h in hosts)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
