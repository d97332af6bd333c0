"""What the listeners share: the store, the approver policy, the tools and the rules (for
edits), the worker's kick, Slack lookups, and the background tasks that outlive a
request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from slack_bolt.context.async_context import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot import payloads as p
from bot.names import Names
from bot.reviewers import Reviewers
from engine.inputs import Decider, Org
from engine.reviewers import ReviewerRule
from engine.rules import PolicySet
from engine.store import Store
from tools import ToolRegistry

log = logging.getLogger("opsloop.bot")

Kick = Callable[[str], None]
CONTEXT_KEY = "opsloop"


class SlackUnavailable(Exception):
    """Slack's Web API refused a call a listener cannot do without (auth.test)."""


class Background:
    """Tasks that outlive a request (ephemerals, modals, Home): kept referenced, their
    failures logged, awaited by ``bot.app.drain`` on shutdown."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, what: str, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(what, work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @staticmethod
    async def _run(what: str, work: Coroutine[Any, Any, Any]) -> None:
        try:
            await work
        except SlackApiError as exc:
            log.warning("%s failed: %s", what, exc.response.get("error") or exc)
        except Exception:
            log.exception("%s failed", what)


@dataclass
class Identity:
    """The bot's auth.test, checked before Bolt's own authorisation.

    Bolt answers a failed auth.test with HTTP 200 and a user-facing message: an event
    arriving then would be acknowledged and lost. Raising instead makes Bolt answer 500,
    so Slack delivers it again. Checked once per process (until it succeeds).
    """

    url: str | None = None
    checked: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def ensure(self, client: AsyncWebClient) -> None:
        if self.checked:
            return
        async with self.lock:
            if self.checked:
                return
            try:
                response = await client.auth_test()
            except SlackApiError as exc:
                error = exc.response.get("error") or exc
                raise SlackUnavailable(f"auth.test failed ({error}); Slack will retry") from exc
            self.url = response.get("url")
            self.checked = True


@dataclass
class Deps:
    store: Store
    reviewers: ReviewerRule  # the process's: for calls that record none
    kick: Kick
    groups: Reviewers | None
    names: Names
    background: Background
    identity: Identity
    # What an edit of a call's arguments is checked against: the tools' schemas and the
    # rules (None: no tools here, so no edits; no policy, so an edit keeps the call's rule).
    tools: ToolRegistry | None = None
    policy: PolicySet | None = None

    @staticmethod
    def of(context: AsyncBoltContext) -> Deps:
        deps = context[CONTEXT_KEY]
        assert isinstance(deps, Deps)
        return deps

    def wake(self, thread_id: str) -> None:
        try:
            self.kick(thread_id)
        except Exception:  # stored already: the worker's sweep finds it anyway
            log.exception("kick %s failed", thread_id)

    async def decider(self, user: str, org: Org | None) -> Decider:
        """Who clicks; the engine asks ``resolve`` for exactly the user groups and
        on-call entries of the call's reviewer rule (a rule's, or the process's), and
        only when that can matter: at each click, so an on-call hand-over since the card
        counts. A lookup that fails raises ``ReviewerLookupError``: the refusal says
        "try again" (or that PagerDuty is not connected), never lets the click through."""

        async def resolve(groups: frozenset[str]) -> frozenset[str]:
            if self.groups is None:
                return frozenset()
            return await self.groups.groups_of(user, groups)

        return Decider(user, frozenset(), org, resolve=resolve)

    def notify(
        self, client: AsyncWebClient, _context: AsyncBoltContext, body: dict[str, Any], text: str
    ) -> None:
        """Tell the clicker, and only them, what happened (in the background)."""
        clicked = p.parse_click(body)
        if not isinstance(clicked, p.Click) or not clicked.channel:
            log.info("cannot tell the clicker: %s", text)
            return
        self.background.spawn(
            "chat.postEphemeral",
            client.chat_postEphemeral(
                channel=clicked.channel,
                user=clicked.user,
                text=text,
                thread_ts=clicked.thread_ts,
            ),
        )
