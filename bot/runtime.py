"""A serving process, assembled: store, tools, Claude, the worker, delivery, Slack.

``opsloop serve`` puts the Bolt app behind ``POST /slack/events``; ``opsloop socket``
connects the same app over Socket Mode. Both run the worker (runner, scheduler) and
show what happened in Slack after each run (``Delivery``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from aiohttp import web
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.app import build_app, drain, handle_slack_request
from bot.delivery import Delivery
from bot.health import make_health_app
from bot.hooks import add_hook_route
from bot.loop_thread import AnswersFirst, LoopThread
from bot.reviewers import Reviewers
from engine.config import Settings
from engine.events import utcnow
from engine.models.anthropic import AnthropicModel
from engine.models.base import Model
from engine.runner import Runner, worker_id
from engine.scheduler import Worker
from engine.store import Store
from tools import REGISTRY, load_tools

log = logging.getLogger("opsloop.runtime")

SLACK_API_URL = "https://slack.com/api/"
REDELIVER_WINDOW = timedelta(days=1)
_TOOL_ENGINES = (
    ("tools.builtin.tickets", "dispose_ticket_engines"),
    ("tools.demo", "dispose_demo_engines"),
)


@dataclass
class Background:
    """What runs on the worker loop: its own store, Claude, the worker and delivery."""

    store: Store
    model: Model
    worker: Worker
    delivery: Delivery
    catch_up: asyncio.Task[None] | None = None

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
        close_model = getattr(self.model, "close", None)
        if close_model is not None:
            await close_model()
        # Tools' own database engines were made on this loop: closed here, after the
        # worker, and only for the tool modules that were loaded.
        for module, name in _TOOL_ENGINES:
            dispose = getattr(sys.modules.get(module), name, None)
            if dispose is not None:
                try:
                    await dispose()
                except Exception:
                    log.warning("closing %s failed", module, exc_info=True)
        await self.store.close()


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

    def start(self) -> None:
        """Start the worker (the scheduler's first sweep resumes what a dead process
        left) and complete posts a crash cut off (each looks in Slack first)."""
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
            await self.store.close()


async def _background(
    settings: Settings,
    token: str,
    owner: str,
    make_model: Callable[[], Model] | None,
    priority: AnswersFirst,
) -> Background:
    """Built on the worker loop (``LoopThread.run``): its clients belong to that loop."""
    model = make_model() if make_model is not None else AnthropicModel.from_env()
    try:
        store = await Store.open(settings.database_url)
    except BaseException:
        close_model = getattr(model, "close", None)
        if close_model is not None:
            await close_model()
        raise
    client = AsyncWebClient(token=token, base_url=slack_api_url())
    # Its own lease owner: delivery and the runner never end each other's lease.
    delivery = Delivery(
        store,
        client,
        owner=f"{owner}/delivery",
        approvers=sorted(settings.approvers.approvers),
        lease_ttl=settings.runner.lease_ttl_s,
    )
    runner = Runner(
        store,
        model,
        REGISTRY,
        settings.runner,
        owner=owner,
        before_tool=lambda thread_id: delivery.deliver(thread_id, under=owner),
    )
    worker = Worker(
        runner,
        interval=settings.sweep_seconds,
        after_run=delivery.deliver,
        gate=priority.quiet,
    )
    return Background(store, model, worker, delivery)


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


def slack_api_url() -> str:
    return os.environ.get("SLACK_API_URL") or SLACK_API_URL


async def start_runtime(
    settings: Settings,
    *,
    token: str,
    signing_secret: str,
    make_model: Callable[[], Model] | None = None,
) -> Runtime:
    """Everything but the listening socket and the worker (``Runtime.start``); raises
    ConfigError / StoreUnavailable before anything runs. ``make_model`` (called on the
    worker loop) replaces Claude from the environment (``opsloop local``'s offline model)."""
    modules = load_tools(settings.tools)
    # The serving thread gets the interpreter within 1 ms of wanting it (default 5 ms)
    # while the worker thread computes: each database answer is such a hand-over.
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
    thread = LoopThread()
    priority = AnswersFirst(thread)
    try:
        background = await thread.run(
            _background(settings, token, worker_id(), make_model, priority)
        )
    except BaseException:
        await thread.stop()
        raise
    try:
        store = await Store.open(settings.database_url)
    except BaseException:
        await thread.run(background.close(1))
        await thread.stop()
        raise
    log.info(
        "tools: %s (%d); model: %s", ",".join(modules), len(list(REGISTRY)), background.model.name
    )
    log.info("database: %s", store.config.display())
    client = AsyncWebClient(token=token, base_url=slack_api_url())

    def kick(thread_id: str) -> None:
        """Wake the worker for ``thread_id`` (callable from any thread)."""
        thread.call(background.worker.kick, thread_id)

    bolt = build_app(
        store=store,
        token=token,
        signing_secret=signing_secret,
        client=client,
        approvers=settings.approvers,
        kick=kick,
        groups=Reviewers(client),
    )
    return Runtime(store, client, bolt, thread, background, priority, kick)


def web_app(runtime: Runtime) -> web.Application:
    """``GET /healthz``, ``POST /slack/events`` (Bolt) and ``POST /hooks/{wait_id}``."""
    app = make_health_app(runtime.store)

    async def slack_events(request: web.Request) -> web.Response:
        with runtime.priority.answering():
            return await handle_slack_request(runtime.bolt, request)

    app.router.add_post("/slack/events", slack_events)
    add_hook_route(app, runtime.store, os.environ.get("OPSLOOP_WEBHOOK_SECRET"), runtime.kick)
    return app
