"""``opsloop local``: the production app and a local Slack workspace on one port.

The one module of ``bot/`` that knows :mod:`localslack`, and they meet where an app
meets Slack: the app gets the workspace's bot token, signing secret and Web API URL
(``SLACK_API_URL``), the workspace gets the app's request URL. One aiohttp app serves
what ``opsloop serve`` serves (``POST /slack/events``, ``GET /healthz``,
``POST /hooks/{wait_id}``, and ``/hooks/github`` and ``/alerts/{source}`` as its
opsloop.yaml enables them) and the workspace's routes (its Web API, the page, and the
GitHub and PagerDuty the bundled opsloop.yaml points at). The Bolt app, the runtime and
the worker are the production ones, built by :func:`bot.runtime.start_runtime`.

Order matters at both ends. Starting: the socket is bound first (so a busy port fails
before anything starts), then the runtime, then the page and the deliveries the last
run left. Stopping: the page stops taking input, the worker finishes what it runs while
the Web API it posts to is still up, then the port closes and the workspace is saved.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from aiohttp import web

from bot.http_limits import limited_runner
from bot.runtime import Runtime, start_runtime, web_app
from engine.config import ModelSettings, Settings
from engine.config_file import ConfigFile
from engine.errors import ConfigError
from engine.models.base import Model
from localslack.app_link import SLACK_RETRY_DELAYS, AppLink
from localslack.demo import DEMO_CONFIG, DemoPlatform, demo_config, local_values
from localslack.integrations import LocalIntegrations
from localslack.server import LocalSlack, page_url
from localslack.state_file import StateFile, state_path
from localslack.ui import LocalUi, ModelInfo
from localslack.workspace import Workspace

log = logging.getLogger("opsloop.local")

WEB_SHUTDOWN_S = 5.0


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
    integrations: LocalIntegrations | None = None

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
            if self.integrations is not None:  # its runs' clocks and webhooks under way
                await self.integrations.close()
            await self.state.save()


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
    given: local mode then uses its own (``localslack/opsloop.yaml``, see
    :func:`localslack.demo.demo_config`) unless ``bundled`` is false. The workspace is kept
    in ``state`` (default: beside the database, see :func:`localslack.state_file.state_path`)."""
    bound, port = sock.getsockname()[:2]
    where = {"OPSLOOP_LOCAL_STATE": settings.local_state or ""}
    path = state or state_path(settings.database_url, where)
    slack = LocalSlack(bound, port, path, retry_delays=retry_delays)
    if config is None and bundled:
        config = demo_config(slack.url, path)
    # The page's "Fire an alert" posts to /alerts/generic when the file enables it.
    generic = config.alerts.generic if config is not None else None
    slack.integrations.alert_channel = generic.channel if generic is not None else None
    # The bot's Slack is this workspace, as `opsloop serve`'s is the one it was installed in.
    settings = replace(settings, slack=replace(settings.slack, api_url=slack.api_url))
    runtime = await start_runtime(
        settings,
        token=slack.token,
        signing_secret=slack.signing_secret,
        config=config,
        make_model=make_model,
    )
    try:
        model = ModelInfo(model_kind, runtime.background.model.name, tuple(suggestions))
        app = web_app(runtime)
        ui = slack.serve(app, model, store=runtime.store, tools=lambda: list(runtime.tools))
        web_runner = limited_runner(
            app,
            settings.http,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=WEB_SHUTDOWN_S,
        )
        await web_runner.setup()
        await web.SockSite(web_runner, sock).start()
    except BaseException:
        await runtime.close(1)
        raise
    slack.start(slack.url + "slack/events")
    runtime.start()
    log.info("local workspace on %s (model: %s)", slack.url, model.name)
    return Local(
        slack.url,
        runtime,
        slack.workspace,
        slack.state,
        slack.link,
        ui,
        web_runner,
        slack.platform,
        slack.integrations,
    )


# --- what local mode loads, for the CLI beside it (bot/cli.py) ---------------------------


def workspace_file(settings: Settings) -> Path:
    """Where local mode keeps its workspace for these settings (``start_local``'s default)."""
    where = {"OPSLOOP_LOCAL_STATE": settings.local_state or ""}
    return state_path(settings.database_url, where)


def local_values_for(host: str, port: int, workspace: Path) -> dict[str, str]:
    """The ``${OPSLOOP_LOCAL_*}`` values of a run listening on ``host``:``port`` (the
    page's URL as :class:`LocalSlack` makes it) with its workspace in ``workspace``."""
    return local_values(page_url(host, port), workspace)


def bundled_config(url: str, workspace: Path) -> tuple[ConfigFile, Path]:
    """Local mode's own configuration for the page at ``url``, and its file."""
    return demo_config(url, workspace), DEMO_CONFIG


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
