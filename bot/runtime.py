"""A serving process, assembled: store, tools, Claude, the worker, delivery, Slack.

``opsloop serve`` puts the Bolt app behind ``POST /slack/events``; ``opsloop socket``
connects the same app over Socket Mode. Both run the worker (runner, scheduler) and
show what happened in Slack after each run (``Delivery``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.web.async_client import AsyncWebClient

from bot.agent_surface import AgentSurface, FollowingDoor
from bot.alerts import SlackTeam, add_alert_routes
from bot.app import build_app, drain, handle_slack_request
from bot.configured import close_sources, load_tools_of, mcp_servers, open_serving, policy_set
from bot.delivery import Delivery
from bot.github_hooks import add_github_hook_route
from bot.health import make_health_app, make_metrics_app
from bot.hooks import add_hook_route
from bot.loop_thread import AnswersFirst, LoopThread
from bot.oauth_callback import add_oauth_callback_route
from bot.oauth_notice import post_authorization_link
from bot.oncall import OnCall
from bot.reviewers import Reviewers
from bot.slack_metrics import instrument
from bot.tool_list import serving_tools
from engine import metrics
from engine.config import Settings
from engine.config_file import ConfigFile, SlackConfig
from engine.events import utcnow
from engine.models.anthropic import AnthropicModel
from engine.models.base import Model
from engine.rules import PolicySet
from engine.runner import Runner, worker_id
from engine.scheduler import Worker
from engine.store import Store, open_store
from tools import ToolRegistry
from tools.integrations.config import PagerDutyConfig
from tools.integrations.pagerduty_client import PagerDutyClient
from tools.loader import close_tools
from tools.mcp import McpSource
from tools.mcp.progress import PROGRESS
from tools.sources import ToolSource

log = logging.getLogger("opsloop.runtime")

REDELIVER_WINDOW = timedelta(days=1)


@dataclass
class Background:
    """What runs on the worker loop: its own store, Claude, the worker and delivery,
    and what the tools opened there (their sources, their modules' resources)."""

    store: Store
    model: Model
    worker: Worker
    delivery: Delivery
    sources: Sequence[ToolSource] = ()
    modules: Sequence[str] = ()
    http: aiohttp.ClientSession | None = None  # delivery's connections to Slack
    catch_up: asyncio.Task[None] | None = None
    surface: AgentSurface | None = None  # the loading status and agent session

    def start(self) -> None:
        self.worker.start()
        since = utcnow() - REDELIVER_WINDOW
        self.catch_up = asyncio.create_task(self.delivery.deliver_recent(since))

    async def close(self, grace: float) -> None:
        if self.catch_up is not None:
            self.catch_up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.catch_up
        try:
            await asyncio.wait_for(self.worker.stop(), timeout=grace)
        except TimeoutError:
            log.warning("threads still running after %.0fs; left to resume", grace)
        await self.delivery.close()
        if self.surface is not None:
            await self.surface.close()
        await _close_model(self.model)
        # What the tools opened lives on this loop: closed here, after the worker.
        await close_sources(self.sources)
        await close_tools(self.modules)
        if self.http is not None:
            await self.http.close()
        await self.store.close()


_RECONNECTING: set[asyncio.Future[None]] = set()


def _log_refresh_failure(task: asyncio.Future[None]) -> None:
    _RECONNECTING.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.info("mcp reconnect after authorization failed: %s", " ".join(str(exc).split()))


async def _close_model(model: Model) -> None:
    """A model declares its shutdown with an ``async close()`` (Claude's HTTP client)."""
    close = getattr(model, "close", None)
    if close is not None:
        await close()


@dataclass
class Runtime:
    """The serving side (``store``, ``client``, ``bolt`` on the caller's loop) and the
    background (``background`` on ``thread``'s loop)."""

    store: Store
    client: AsyncWebClient
    bolt: AsyncApp
    thread: LoopThread
    background: Background
    priority: AnswersFirst
    kick: Callable[[str], None]  # wakes the worker for a thread, from any thread
    settings: Settings = field(default_factory=Settings)
    tools: ToolRegistry = field(default_factory=ToolRegistry)  # modules' and sources'
    http: aiohttp.ClientSession | None = None  # the listeners' connections to Slack
    config: ConfigFile | None = None  # the opsloop.yaml read at startup (its webhooks)

    @property
    def mcp_servers(self) -> list[McpSource]:
        """The MCP servers it serves (up or down), for ``/metrics`` and ``GET /tools``."""
        return mcp_servers(self.background.sources)

    def reconnect_mcp(self, server: str) -> None:
        """List ``server``'s tools now (an admin just authorized opsloop for it), on the
        worker loop where its source lives; a failure is the keeper's to retry."""
        found = [s for s in self.mcp_servers if s.server_name == server]

        def start() -> None:
            for source in found:
                task = asyncio.ensure_future(source.refresh())
                _RECONNECTING.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(_log_refresh_failure)

        if found:
            self.thread.call(start)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Around one answer to Slack (an HTTP request, a Socket Mode envelope): the
        worker holds back meanwhile (``AnswersFirst``) and the answer is timed."""
        started = time.monotonic()
        try:
            with self.priority.answering():
                yield
        finally:
            metrics.SLACK_ACK_SECONDS.observe(time.monotonic() - started)

    def start(self) -> None:
        """Start the worker (the scheduler's first sweep resumes what a dead process
        left) and complete posts a crash cut off (each looks in Slack first)."""
        # What startup built (modules, SDK models, schemas: most of the heap) lives as
        # long as the process. Frozen, a full collection no longer walks it: 2-7 ms
        # instead of ~170 ms, during which no ack goes out (measured, bench/slack_ack.py).
        gc.collect()
        gc.freeze()
        self.thread.call(self.background.start)

    async def close(self, grace: float = 20.0) -> None:
        """Let running threads reach a boundary for up to ``grace`` s, then close.

        A thread still running then is cancelled: its log is the truth, and the next
        process resumes it."""
        try:
            await self.thread.run(self.background.close(grace))
        finally:
            await self.thread.stop()
            await drain(self.bolt)  # ephemeral notes and the Home tab still in flight
            if self.http is not None:
                await self.http.close()
            await self.store.close()


async def _background(
    settings: Settings,
    token: str,
    owner: str,
    make_model: Callable[[], Model] | None,
    priority: AnswersFirst,
    tools: ToolRegistry,
    sources: Sequence[ToolSource],
    modules: Sequence[str],
    policy: PolicySet,
    pagerduty: PagerDutyConfig | None = None,
    plans: SlackConfig | None = None,
) -> Background:
    """Built on the worker loop (``LoopThread.run``): its clients and the tool sources
    belong to that loop. A source that cannot start is a ``ToolLoadError``, but for an
    MCP server: that one is served without, and retried in the background.
    ``pagerduty``: who is on call, for the ``oncall:`` approvers the cards show.
    ``plans``: how runs' plan messages show (opsloop.yaml's ``slack``)."""
    model = make_model() if make_model is not None else AnthropicModel.from_settings(settings.model)
    # One session for all of delivery's calls: slack_sdk opens (and closes) a session,
    # a connection and, on Slack, a TLS handshake per call when it is given none. Made
    # before the MCP servers connect: a new authorization link goes to their admins.
    http = aiohttp.ClientSession()
    client = AsyncWebClient(token=token, base_url=settings.slack.api_url, session=http)
    try:
        # The store first: an MCP server's OAuth keeps its tokens there (tools/mcp/auth.py).
        store = await open_store(settings.database_url, origin=owner)
        for server in mcp_servers(sources):
            server.keep_oauth_in(store, partial(post_authorization_link, client))
        try:
            await open_serving(sources, tools)
        except BaseException:
            await store.close()
            raise
    except BaseException:
        await _close_model(model)
        await close_tools(modules)
        await http.close()
        raise
    # Its own lease owner, for threads at rest; while the runner holds a thread, the
    # runner asks delivery to show it and appends the receipts itself.
    delivery = Delivery(
        store,
        client,
        owner=f"{owner}/delivery",
        reviewers=settings.reviewers,
        lease_ttl=settings.runner.lease_ttl_s,
        on_call=on_call(pagerduty, client, http),
        task_display_mode=(plans or SlackConfig()).task_display_mode,
        rotate_after=(plans or SlackConfig()).stream_rotate_after,
        progress=PROGRESS,  # an MCP call's progress in its task card's title
    )
    # The thread's loading status and agent session follow what delivery shows, each
    # model call and each thread at rest (so they clear when a run stops).
    surface = AgentSurface(client)
    door = FollowingDoor(delivery, surface, store)
    runner = Runner(
        store,
        model,
        tools,
        settings.runner,
        owner=owner,
        front_door=door,
        policy=policy,
        # Each step waits while Slack requests are being answered (as each run does):
        # under a burst of mentions the acks keep the interpreter to themselves.
        pace=priority.quiet,
    )
    # Registered under the runner's owner id, holding a lock the database (or the
    # kernel) drops when this process dies: a replacement takes its threads at once.
    worker = Worker(
        runner,
        interval=settings.sweep_seconds,
        after_run=door.deliver,
        gate=priority.quiet,
        presence=True,
    )
    background = Background(store, model, worker, delivery, sources, modules, http, surface=surface)
    try:
        await worker.register()
    except BaseException:
        await background.close(1)
        raise
    return background


def on_call(
    config: PagerDutyConfig | None, slack: AsyncWebClient, http: aiohttp.ClientSession
) -> OnCall | None:
    """Who is on call (``oncall:`` approvers), asked of PagerDuty over ``http`` (a
    session of the loop that uses it, closed with it); None without PagerDuty."""
    if config is None:
        return None
    return OnCall(PagerDutyClient(config, session=http), slack)


class _Kicks:
    """Kicks for the worker loop, handed over in batches: a burst of acks wakes the
    worker once, not once per ack (each wake-up is a hand-over of the interpreter)."""

    def __init__(self, thread: LoopThread, kick: Callable[[str], None]) -> None:
        self._thread = thread
        self._kick = kick
        self._lock = threading.Lock()
        self._pending: list[str] = []

    def add(self, thread_id: str) -> None:
        with self._lock:
            self._pending.append(thread_id)
            first = len(self._pending) == 1
        if first:
            self._thread.call(self._flush)

    def _flush(self) -> None:  # on the worker loop
        with self._lock:
            pending, self._pending = self._pending, []
        for thread_id in dict.fromkeys(pending):
            self._kick(thread_id)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, made before anything starts, so a taken port
    is one line (``OSError``) rather than a process that started and must stop again."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        if os.name == "posix":  # as asyncio's create_server does; a live listener still wins
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def start_runtime(
    settings: Settings,
    *,
    token: str,
    signing_secret: str,
    config: ConfigFile | None = None,
    make_model: Callable[[], Model] | None = None,
) -> Runtime:
    """Everything but the listening socket and the worker (``Runtime.start``); raises
    ConfigError / ToolLoadError / StoreUnavailable before anything runs. ``config``: the
    opsloop.yaml read at startup (its tool sources and policy). ``make_model`` (called
    on the worker loop) replaces Claude (``opsloop local``'s offline model)."""
    loaded = load_tools_of(settings, config)  # as `opsloop config check` loads them
    # This process's registry: the sources' tools join the modules' in it when opened.
    tools, sources, modules = loaded.tools, loaded.sources, loaded.modules
    policy = policy_set(settings, config)
    pagerduty = config.integrations.pagerduty if config is not None else None
    # The serving thread gets the interpreter within 1 ms of wanting it (default 5 ms)
    # while the worker thread computes: each database answer is such a hand-over.
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
    thread = LoopThread()
    priority = AnswersFirst(thread)
    owner = worker_id()
    try:
        background = await thread.run(
            _background(
                settings,
                token,
                owner,
                make_model,
                priority,
                tools,
                sources,
                modules,
                policy,
                pagerduty=pagerduty,
                plans=config.slack if config is not None else None,
            )
        )
    except BaseException:
        await thread.stop()
        raise
    try:
        # The worker's origin: what the listeners append, they kick it for (engine.store).
        store = await open_store(settings.database_url, origin=owner)
    except BaseException:
        await thread.run(background.close(1))
        await thread.stop()
        raise
    log.info(
        "tools: %s (%d); sources: %s; model: %s",
        ",".join(modules),
        len(tools),
        ",".join(s.name for s in sources) or "-",
        background.model.name,
    )
    if policy.policy_hash is not None:
        log.info("policy: %d rules (%s)", len(policy.rules), policy.policy_hash[:12])
    log.info("database: %s", store.config.display())
    http = aiohttp.ClientSession()  # as delivery's: one session, kept-alive connections
    client = instrument(AsyncWebClient(token=token, base_url=settings.slack.api_url, session=http))

    kicks = _Kicks(thread, background.worker.kick)

    def kick(thread_id: str) -> None:
        """Wake the worker for ``thread_id`` (callable from any thread)."""
        kicks.add(thread_id)

    bolt = build_app(
        store=store,
        token=token,
        signing_secret=signing_secret,
        client=client,
        reviewers=settings.reviewers,
        kick=kick,
        groups=Reviewers(client, on_call=on_call(pagerduty, client, http)),
        tools=tools,
        policy=policy,
    )
    return Runtime(
        store, client, bolt, thread, background, priority, kick, settings, tools, http, config
    )


def web_app(runtime: Runtime, *, metrics: bool = True) -> web.Application:
    """``GET /healthz``, ``POST /slack/events`` (Bolt), ``POST /alerts/{source}``,
    ``POST /hooks/github`` (with ``integrations.github``) and ``POST /hooks/{wait_id}``,
    and ``GET /metrics`` and ``GET /tools`` unless they have a port of their own
    (``metrics`` false: ``metrics_app``)."""
    app = make_health_app(runtime.store, metrics=metrics, mcp=runtime.mcp_servers)
    if metrics:
        add_tools_route(app, runtime)

    async def slack_events(request: web.Request) -> web.Response:
        return await handle_slack_request(runtime.bolt, request, runtime.answering)

    app.router.add_post("/slack/events", slack_events)
    github = runtime.config.integrations.github if runtime.config else None
    if github is not None:  # before /hooks/{wait_id}, which would match it too
        add_github_hook_route(app, runtime.store, github, runtime.kick)
    # 404 for a source opsloop.yaml does not enable; the team is Slack's auth.test.
    add_alert_routes(app, runtime.store, runtime.config, SlackTeam(runtime.client), runtime.kick)
    secret = runtime.settings.slack.webhook_secret or None
    add_hook_route(app, runtime.store, secret, runtime.kick)
    add_oauth_callback_route(app, runtime.store, runtime.reconnect_mcp)
    return app


def metrics_app(runtime: Runtime) -> web.Application:
    """``GET /metrics`` and ``GET /tools`` alone, for ``OPSLOOP_METRICS_PORT``."""
    app = make_metrics_app(runtime.store, runtime.mcp_servers)
    add_tools_route(app, runtime)
    return app


def add_tools_route(app: web.Application, runtime: Runtime) -> None:
    """``GET /tools``: the tools the running bot offers, and its MCP servers
    (``bot.tool_list.serving_tools``). Beside /metrics: it says as much as the scrape."""

    # Each answer lists every MCP server that is up: requests that arrive while one is
    # being made share it (one listing at a time, however many unauthenticated callers).
    flight: dict[str, asyncio.Task[Any]] = {}

    async def answer() -> Any:
        policy = runtime.background.worker.runner.policy or policy_set(
            runtime.settings, runtime.config
        )
        held = serving_tools(runtime.tools, policy, runtime.mcp_servers)
        return await runtime.thread.run(held)  # where the sources live

    async def tools(request: web.Request) -> web.Response:
        task = flight.get("now")
        if task is None or task.done():
            task = flight["now"] = asyncio.ensure_future(answer())
        return web.json_response(await asyncio.shield(task))

    app.router.add_get("/tools", tools)


def socket_mode_handler(runtime: Runtime, app_token: str) -> AsyncSocketModeHandler:
    """The Socket Mode connection for ``runtime``'s Bolt app and Web API client."""
    return _SocketModeHandler(runtime, app_token)


class _SocketModeHandler(AsyncSocketModeHandler):
    """Bolt's handler, each envelope answered as ``POST /slack/events`` is."""

    def __init__(self, runtime: Runtime, app_token: str) -> None:
        super().__init__(runtime.bolt, app_token, web_client=runtime.client)
        self._runtime = runtime

    async def handle(self, client: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        with self._runtime.answering():
            await super().handle(client, req)  # type: ignore[arg-type]
