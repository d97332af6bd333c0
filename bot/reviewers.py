"""Which Slack user groups (``S…``) a reviewer belongs to, for ``OPSLOOP_APPROVERS``.

A group's members come from ``usergroups.users.list`` and are cached for ``ttl``
seconds per group, so a burst of clicks costs one call per group, and a change of
membership counts within a minute. A failed lookup is not cached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("opsloop.bot.reviewers")

DEFAULT_TTL_S = 60.0
# A click is answered within Slack's 3 s: a slow lookup gives up and says "try again".
LOOKUP_TIMEOUT_S = 1.5


class ReviewerLookupError(Exception):
    """No group could say whether the user is in it (Slack refused or was unreachable)."""


class Reviewers:
    def __init__(
        self,
        client: AsyncWebClient,
        *,
        ttl: float = DEFAULT_TTL_S,
        timeout: float = LOOKUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.timeout = timeout
        self.clock = clock
        self._members: dict[str, tuple[float, frozenset[str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def members(self, group: str) -> frozenset[str]:
        """The user ids in ``group`` (cached); ``SlackClientError`` if Slack says no."""
        cached = self._members.get(group)
        if cached is not None and cached[0] > self.clock():
            return cached[1]
        lock = self._locks.setdefault(group, asyncio.Lock())
        async with lock:
            cached = self._members.get(group)
            if cached is not None and cached[0] > self.clock():
                return cached[1]
            response = await self.client.usergroups_users_list(usergroup=group)
            users = frozenset(str(u) for u in response.get("users") or ())
            self._members[group] = (self.clock() + self.ttl, users)
            return users

    async def groups_of(self, user: str, groups: Iterable[str]) -> frozenset[str]:
        """The groups among ``groups`` that contain ``user``.

        When a group cannot be read and the user is in none of the others, the answer is
        unknown: ``ReviewerLookupError``, so that the caller says "try again" instead of
        "you are not an approver".
        """
        found: set[str] = set()
        failed: list[str] = []
        wanted = sorted(set(groups))
        for group in wanted:
            try:
                if user in await asyncio.wait_for(self.members(group), self.timeout):
                    found.add(group)
            except (SlackClientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("usergroups.users.list %s failed: %s", group, _why(exc))
                failed.append(group)
        if failed and not found:
            raise ReviewerLookupError(f"could not read the user groups {', '.join(failed)}")
        return frozenset(found)


def _why(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or exc)
    return " ".join(str(exc).split()) or type(exc).__name__
