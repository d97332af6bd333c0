"""Which approver entries that need a lookup hold a reviewer: the Slack user groups
(``S…``) they are in, and the ``oncall:<id>`` entries they are on call for now.

A group's members come from ``usergroups.users.list`` and are cached for ``ttl``
seconds per group, so a burst of clicks costs one call per group, and a change of
membership counts within a minute. Who is on call comes from PagerDuty
(:class:`bot.oncall.OnCall`, cached the same way). A failed lookup is not cached, and
never admits anyone: the click is refused, saying which lookup failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from bot.oncall import PREFIX, OnCall, OnCallUnavailable

log = logging.getLogger("opsloop.bot.reviewers")

DEFAULT_TTL_S = 60.0
# A click is answered within Slack's 3 s: a slow lookup gives up and says "try again".
LOOKUP_TIMEOUT_S = 1.5


class ReviewerLookupError(Exception):
    """No entry could say whether the user is in it: Slack or PagerDuty refused or was
    unreachable (``groups``, ``on_call``: the entries that failed), or an on-call entry
    was asked with no PagerDuty connected (``unconnected``)."""

    def __init__(
        self,
        message: str,
        *,
        groups: tuple[str, ...] = (),
        on_call: tuple[str, ...] = (),
        unconnected: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.groups = groups
        self.on_call = on_call
        self.unconnected = unconnected


class Reviewers:
    def __init__(
        self,
        client: AsyncWebClient,
        *,
        ttl: float = DEFAULT_TTL_S,
        timeout: float = LOOKUP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        on_call: OnCall | None = None,
    ) -> None:
        """``on_call``: who is on call, from PagerDuty (None: no PagerDuty here, so an
        ``oncall:`` entry can never be checked and a click that needs one is refused)."""
        self.client = client
        self.on_call = on_call
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
        """The entries among ``groups`` that hold ``user``: user groups (``S…``) they
        are in, ``oncall:<id>`` entries they are on call for now.

        When an entry cannot be read and the user is in none of the others, the answer
        is unknown: ``ReviewerLookupError``, so that the caller says "try again" (or
        that PagerDuty is not connected) instead of "you are not an approver".
        """
        found: set[str] = set()
        failed: list[str] = []
        unconnected: list[str] = []
        for entry in sorted(set(groups)):
            if entry.startswith(PREFIX) and self.on_call is None:
                unconnected.append(entry)
                continue
            try:
                if user in await asyncio.wait_for(self._holding(entry), self.timeout):
                    found.add(entry)
            except (
                SlackClientError,
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                OnCallUnavailable,
            ) as exc:
                what = "on-call" if entry.startswith(PREFIX) else "usergroups.users.list"
                log.warning("%s %s failed: %s", what, entry, _why(exc))
                failed.append(entry)
        if (failed or unconnected) and not found:
            raise ReviewerLookupError(
                f"could not read {', '.join(failed + unconnected)}",
                groups=tuple(f for f in failed if not f.startswith(PREFIX)),
                on_call=tuple(f for f in failed if f.startswith(PREFIX)),
                unconnected=tuple(unconnected),
            )
        return frozenset(found)

    async def _holding(self, entry: str) -> frozenset[str]:
        """The users ``entry`` holds now: a group's members, or who is on call."""
        if entry.startswith(PREFIX):
            assert self.on_call is not None  # groups_of asks only when it is connected
            return await self.on_call.users(entry)
        return await self.members(entry)


def _why(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or exc)
    return " ".join(str(exc).split()) or type(exc).__name__
