"""One Web API call of delivery, and what its failure means.

:func:`call` makes a call, waiting out 429s up to a bound; any other failure is logged
(where it happened, never the token) and raised as :class:`Stop`: delivering the thread
stops for now. :func:`refusal` says whether Slack refused for good, and
:func:`surely_not_done` whether the call surely did nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError

log = logging.getLogger("opsloop.delivery")

MAX_INLINE_RETRIES = 3  # 429s waited out within one call


class Stop(Exception):
    """Delivering this thread stops for now; a later pass goes on after ``retry_in``."""

    def __init__(self, why: str, retry_in: float | None = None) -> None:
        super().__init__(why)
        self.retry_in = retry_in


async def call(
    method: str,
    send: Callable[..., Awaitable[Any]],
    where: str,
    max_inline_wait: float,
    **kwargs: Any,
) -> Any:
    """One Web API call; 429s up to ``max_inline_wait`` are waited out, any other
    failure is logged (``where``: thread and event, never the token) as :class:`Stop`."""
    for attempt in range(MAX_INLINE_RETRIES + 1):
        try:
            return await send(**kwargs)
        except SlackApiError as exc:
            status = exc.response.status_code
            if status == 429:
                wait = retry_after(exc.response.headers)
                if wait <= max_inline_wait and attempt < MAX_INLINE_RETRIES:
                    log.info("rate limited method=%s %s wait=%.1fs", method, where, wait)
                    await asyncio.sleep(wait)
                    continue
                log.warning("rate limited method=%s %s retry_after=%.0fs", method, where, wait)
                raise Stop("ratelimited", retry_in=wait) from exc
            data = exc.response.data
            error = data.get("error") if isinstance(data, dict) else None
            log.warning("slack error method=%s %s status=%s error=%s", method, where, status, error)
            raise Stop(str(error or status)) from exc
        except (aiohttp.ClientError, TimeoutError, OSError, SlackClientError) as exc:
            log.warning("slack call failed method=%s %s error=%r", method, where, exc)
            raise Stop(type(exc).__name__) from exc
    raise AssertionError("unreachable")


def retry_after(headers: Any) -> float:
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
    return 1.0


def refusal(stop: Stop) -> str | None:
    """Slack's error when it refused a call for good (a 4xx or ``ok: false`` other than a
    rate limit: not in the channel, no such channel); None for anything worth a retry."""
    cause = stop.__cause__
    if not isinstance(cause, SlackApiError):
        return None
    status = cause.response.status_code
    if status == 429 or status >= 500:
        return None
    data = cause.response.data
    error = data.get("error") if isinstance(data, dict) else None
    return str(error or cause.response.status_code)


def surely_not_done(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` was surely not done: Slack said why (a 4xx or
    ``ok: false``), not a timeout, a lost connection, a 5xx or a cancellation."""
    cause = exc.__cause__ if isinstance(exc, Stop) else None
    return isinstance(cause, SlackApiError) and cause.response.status_code < 500
