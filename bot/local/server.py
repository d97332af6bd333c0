"""``opsloop local``, assembled: the bot, its worker and a Slack workspace on one port.

One aiohttp app serves what ``opsloop serve`` serves (``POST /slack/events``,
``GET /healthz``, ``POST /hooks/{wait_id}``), the Slack Web API the bot calls
(``/api/{method}``: its ``SLACK_API_URL`` points here) and the page (``/``,
``/static/…``, ``/ui/…``). The Bolt app, the runtime and the worker are the production
ones, built by :func:`bot.runtime.start_runtime`; only Slack is local, with a bot token
and a signing secret made up at each start.

Order matters at both ends. Starting: the socket is bound first (so a busy port fails
before anything starts), then the runtime, then the page and the deliveries the last
run left. Stopping: the page stops taking input, the worker finishes what it runs while
the Web API it posts to is still up, then the port closes and the workspace is saved.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from aiohttp import web

from bot.local.app_link import SLACK_RETRY_DELAYS, AppLink
from bot.local.demo import DemoPlatform, demo_config
from bot.local.identity import CHANNELS, LOCAL, PEOPLE, USERGROUPS, user_record
from bot.local.state_file import StateFile, state_path
from bot.local.ui import LocalUi, ModelInfo
from bot.local.web_api import WebApi
from bot.local.workspace import Workspace
from bot.runtime import Runtime, start_runtime, web_app
from engine.config import ModelSettings, Settings
from engine.config_file import ConfigFile
from engine.errors import ConfigError
from engine.models.base import Model

log = logging.getLogger("opsloop.local")

WEB_SHUTDOWN_S = 5.0
_WILDCARDS = ("", "0.0.0.0", "::")


class LocalWebApi(WebApi):
    """The Web API of the local workspace: what a method changed is saved before the
    bot hears back, so nothing Slack said it did is lost to a crash."""

    def __init__(self, workspace: Workspace, *, token: str, state: StateFile) -> None:
        super().__init__(workspace, token=token)
        self.state = state

    async def settle(self) -> None:
        await self.state.save()


@dataclass
class Local:
    """A running local workspace: ``url`` is the page."""

    url: str
    runtime: Runtime
    workspace: Workspace
    state: StateFile
    link: AppLink
    ui: LocalUi
    web_runner: web.AppRunner
    platform: DemoPlatform = field(default_factory=DemoPlatform)

    async def close(self, grace: float = 20.0) -> None:
        """Stop taking input, let the worker reach a boundary (it still posts here), then
        close the port and save the workspace."""
        await self.ui.close()
        await self.link.close()  # what the app has not taken stays in the outbox
        try:
            await self.runtime.close(grace)
        finally:
            with contextlib.suppress(Exception):
                await self.web_runner.cleanup()
            await self.state.save()


def local_workspace() -> Workspace:
    people = [user_record(LOCAL, p.id, p.name, p.real_name) for p in PEOPLE]
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


async def start_local(
    settings: Settings,
    sock: socket.socket,
    *,
    config: ConfigFile | None = None,
    make_model: Callable[[], Model] | None = None,
    model_kind: Literal["claude", "offline", "other"] = "claude",
    suggestions: Sequence[tuple[str, str]] = (),
    state: Path | None = None,
    retry_delays: Sequence[float] = SLACK_RETRY_DELAYS,
    bundled: bool = True,
) -> Local:
    """Start everything on the bound ``sock``; ``config`` and ``make_model`` as for
    ``start_runtime`` (None: Claude from the settings). ``config`` None means no file was
    given: local mode then uses its own (``bot/local/opsloop.yaml``, see
    :func:`bot.local.demo.demo_config`) unless ``bundled`` is false. The workspace is kept
    in ``state`` (default: beside the database, see :func:`bot.local.state_file.state_path`)."""
    bound, port = sock.getsockname()[:2]
    url = page_url(bound, port)
    workspace = local_workspace()
    where = {"OPSLOOP_LOCAL_STATE": settings.local_state or ""}
    saved = StateFile(state or state_path(settings.database_url, where), workspace)
    if saved.load():
        log.info("workspace: %s (restored)", saved.path)
    else:
        log.info("workspace: %s (new)", saved.path)
    if config is None and bundled:
        config = demo_config(url, saved.path)
    token = "xoxb-local-" + secrets.token_hex(12)
    secret = secrets.token_hex(20)
    # The bot's Web API is this workspace's.
    settings = replace(settings, slack=replace(settings.slack, api_url=url + "api/"))
    runtime = await start_runtime(
        settings, token=token, signing_secret=secret, config=config, make_model=make_model
    )
    try:
        link = AppLink(
            workspace, signing_secret=secret, retry_delays=retry_delays, before_send=saved.save
        )
        workspace.listen(link.feed)
        model = ModelInfo(model_kind, runtime.background.model.name, tuple(suggestions))
        ui = LocalUi(
            workspace,
            link,
            PEOPLE,
            model,
            save=saved.save,
            store=runtime.store,
            tools=lambda: list(runtime.tools),
            hosts=allowed_hosts(bound, port),
            base_url=url,
        )
        app = web_app(runtime)
        LocalWebApi(workspace, token=token, state=saved).add_routes(app)
        platform = DemoPlatform()
        platform.add_routes(app)  # what the bundled restart_service action calls
        ui.add_routes(app)
        web_runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=WEB_SHUTDOWN_S
        )
        await web_runner.setup()
        await web.SockSite(web_runner, sock).start()
    except BaseException:
        await runtime.close(1)
        raise
    link.start(url + "slack/events")
    runtime.start()
    log.info("local workspace on %s (model: %s)", url, model.name)
    if not _loopback(bound):
        log.warning(
            "listening on %s: anyone who can reach it can act as anyone in the workspace "
            "(OPSLOOP_HOST=127.0.0.1 keeps it to this machine)",
            bound,
        )
    return Local(url, runtime, workspace, saved, link, ui, web_runner, platform)


# --- the model ------------------------------------------------------------------------------


def choose_model(
    settings: ModelSettings,
) -> tuple[Callable[[], Model], Literal["claude", "offline"], tuple[tuple[str, str], ...]]:
    """Claude when the settings hold an API key (``ANTHROPIC_API_KEY``), else the
    offline phrasebook model, and the phrases the page suggests."""
    if settings.api_key.strip():
        from engine.models.anthropic import AnthropicModel

        return lambda: AnthropicModel.from_settings(settings), "claude", ()
    try:
        from engine.models.phrasebook import PHRASEBOOK, PhrasebookModel
    except ImportError as exc:
        raise ConfigError(
            f"the offline model is not available ({exc}): set ANTHROPIC_API_KEY to use Claude"
        ) from None
    phrases = tuple((str(p), str(d)) for p, d in PHRASEBOOK)
    return PhrasebookModel, "offline", phrases
