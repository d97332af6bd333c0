"""Display names of the people a message mentions, for ``source["names"]``.

Read with ``users.info``, cached per process for ``ttl`` seconds; the whole lookup is
bounded by ``timeout`` so that storing (and acknowledging) a message stays fast. A name
not found in time, or not at all, is left out: the id is still in the text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("opsloop.bot.names")

DEFAULT_TTL_S = 600.0
LOOKUP_TIMEOUT_S = 0.3
MAX_LOOKUPS = 10  # per message; more mentions than that keep their ids


class Names:
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
        self._cache: dict[str, tuple[float, str]] = {}

    async def of(self, users: Iterable[str]) -> dict[str, str]:
        """``{user id: display name}`` for those of ``users`` known in time."""
        now = self.clock()
        wanted = list(dict.fromkeys(users))[:MAX_LOOKUPS]
        missing = [u for u in wanted if not (u in self._cache and self._cache[u][0] > now)]
        if missing:
            tasks = [asyncio.ensure_future(self._lookup(u)) for u in missing]
            _done, late = await asyncio.wait(tasks, timeout=self.timeout)
            for task in late:
                task.cancel()
        found = {u: self._cache[u][1] for u in wanted if u in self._cache}
        return {u: name for u, name in found.items() if name}

    async def _lookup(self, user: str) -> None:
        try:
            response = await self.client.users_info(user=user)
        except Exception as exc:  # SlackApiError, a connection error: leave the id
            log.info("users.info %s failed: %s", user, type(exc).__name__)
            return
        record = response.get("user") or {}
        profile = record.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or record.get("name")
        self._cache[user] = (self.clock() + self.ttl, str(name or ""))
