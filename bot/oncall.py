"""Who is on call now, as Slack users, for ``oncall:<id>`` approvers (DESIGN,
"Integrations and alerts"): PagerDuty's on-calls for the id, each user's email, and
Slack's ``users.lookupByEmail`` for it.

A PagerDuty id does not say whether it names a schedule or an escalation policy, so
both are asked, in parallel: a schedule's on-call are the users on it now; an escalation
policy's are those of its first level on call now (who is paged first). The answer is
cached ``ttl`` seconds per id, as user groups are (``bot.reviewers``): a burst of clicks
costs one lookup, and a hand-over counts within a minute. A failure is not cached. A
PagerDuty user whose email no Slack user has is left out (and logged): nobody could
click as them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.render.oncall import PREFIX
from tools.integrations.pagerduty_client import PagerDutyClient, PagerDutyError, PagerDutyRefused

log = logging.getLogger("opsloop.bot.oncall")

DEFAULT_TTL_S = 60.0
# Posting a card waits this long for the on-call; the card says when it could not tell.
CARD_TIMEOUT_S = 3.0


class OnCallUnavailable(Exception):
    """PagerDuty or Slack could not say who is on call; ``str()`` says which, in a line."""


class OnCall:
    """The Slack users on call now for PagerDuty schedules and escalation policies."""

    def __init__(
        self,
        pagerduty: PagerDutyClient,
        slack: AsyncWebClient,
        *,
        ttl: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pagerduty = pagerduty
        self.slack = slack
        self.ttl = ttl
        self.clock = clock
        self._users: dict[str, tuple[float, frozenset[str]]] = {}
        self._emails: dict[str, tuple[float, str | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def users(self, entry: str) -> frozenset[str]:
        """The Slack user ids on call now for ``entry`` (``oncall:<id>``, or the bare
        id), cached; ``OnCallUnavailable`` when PagerDuty or Slack cannot say."""
        target = entry.removeprefix(PREFIX)
        cached = self._users.get(target)
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        async with self._locks.setdefault(target, asyncio.Lock()):
            cached = self._users.get(target)
            if cached is not None and cached[0] > self.clock():
                return cached[1]
            emails = await self._on_call_emails(target)
            ids = await asyncio.gather(*(self._slack_id(e) for e in sorted(emails)))
            users = frozenset(i for i in ids if i is not None)
            self._users[target] = (self.clock() + self.ttl, users)
            return users

    async def now(
        self, entries: Iterable[str], within: float = CARD_TIMEOUT_S
    ) -> dict[str, tuple[str, ...] | None]:
        """Each ``oncall:`` entry's users on call now, sorted, for a card or a reminder to
        show; None for one that could not be looked up ``within`` seconds (logged)."""
        wanted = sorted({e for e in entries if e.startswith(PREFIX)})

        async def one(entry: str) -> tuple[str, ...] | None:
            try:
                return tuple(sorted(await asyncio.wait_for(self.users(entry), within)))
            except (OnCallUnavailable, TimeoutError) as exc:
                log.warning("on-call lookup %s failed: %s", entry, str(exc) or "timed out")
                return None

        return dict(zip(wanted, await asyncio.gather(*(one(e) for e in wanted)), strict=True))

    async def _on_call_emails(self, target: str) -> set[str]:
        """The emails of the users on call now for ``target``."""
        asked = await asyncio.gather(
            self.pagerduty.oncalls(schedule_ids=[target]),
            self.pagerduty.oncalls(escalation_policy_ids=[target]),
            return_exceptions=True,
        )
        refused = [r for r in asked if isinstance(r, PagerDutyRefused)]
        if len(refused) == len(asked):  # neither a schedule nor a policy PagerDuty would read
            raise OnCallUnavailable(str(refused[0]))
        by_schedule, by_policy = (_oncalls(r) for r in asked)
        first = min((_level(o) for o in by_policy), default=0)
        oncalls = by_schedule + [o for o in by_policy if _level(o) == first]
        users = {str(u.get("id")): u for o in oncalls if isinstance(u := o.get("user"), dict)}
        emails: set[str] = set()
        for user_id, user in users.items():
            email = user.get("email")
            if not email:  # a reference without the user: ask for it
                try:
                    email = (await self.pagerduty.user(user_id)).get("email")
                except PagerDutyError as exc:
                    raise OnCallUnavailable(str(exc)) from None
            if isinstance(email, str) and email:
                emails.add(email)
        return emails

    async def _slack_id(self, email: str) -> str | None:
        """The Slack user of ``email`` (None: none, or deactivated), cached."""
        cached = self._emails.get(email)
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        try:
            response = await self.slack.users_lookupByEmail(email=email)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or exc.response.status_code)
            if error != "users_not_found":
                raise OnCallUnavailable(f"Slack users.lookupByEmail: {error}") from None
            log.warning("on call in PagerDuty but not found in Slack: %s", email)
            found = None
        except (SlackClientError, aiohttp.ClientError, OSError) as exc:
            raise OnCallUnavailable(f"Slack users.lookupByEmail: {type(exc).__name__}") from None
        else:
            user = response.get("user")
            active = isinstance(user, dict) and not user.get("deleted")
            found = str(user["id"]) if active and isinstance(user, dict) else None
        self._emails[email] = (self.clock() + self.ttl, found)
        return found


def _oncalls(result: object) -> list[dict[str, Any]]:
    """One of the two listings: its on-calls; none if PagerDuty refused it (the id is
    of the other kind); ``OnCallUnavailable`` if PagerDuty did not answer."""
    if isinstance(result, PagerDutyRefused):
        return []
    if isinstance(result, PagerDutyError):
        raise OnCallUnavailable(str(result))
    if isinstance(result, BaseException):
        raise result
    assert isinstance(result, tuple)
    return list(result[0])


def _level(oncall: dict[str, Any]) -> int:
    level = oncall.get("escalation_level")
    return level if isinstance(level, int) else 1
