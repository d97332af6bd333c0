"""Counting the Slack Web API calls of a client: calls, errors and 429s, by method.

slack_sdk asks each of a client's retry handlers, in order, after every HTTP attempt
(a response or a connection error) whether to retry; the first that says yes gets the
retry. :class:`CallCounter` goes first and always says no, so it sees every attempt
and changes nothing about retries.
"""

from __future__ import annotations

import re
from typing import Any

from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

from engine import metrics

# Slack's method names (chat.postMessage) and error codes (channel_not_found) are
# bounded sets; anything else (a proxy's path, an odd body) is "other", never a label
# that grows with the traffic.
_METHOD = re.compile(r"^[a-z]+(?:\.[A-Za-z]+){1,3}$")
_ERROR = re.compile(r"^[a-z_]{1,48}$")


def method_of(url: str) -> str:
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name if _METHOD.match(name) else "other"


def error_of(response: HttpResponse | None, error: Exception | None) -> str | None:
    """None for a success; else Slack's error code, ``http_<status>`` or ``connection``."""
    if response is None:
        return "connection" if error is not None else None
    body: Any = response.body
    if response.status_code == 200 and not (isinstance(body, dict) and body.get("ok") is False):
        return None
    code = body.get("error") if isinstance(body, dict) else None
    if isinstance(code, str):
        return code if _ERROR.match(code) else "other"
    return f"http_{response.status_code}"


class CallCounter(AsyncRetryHandler):
    """Counts every attempt of the client's calls; never asks for a retry."""

    async def can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        method = method_of(request.url)
        metrics.SLACK_CALLS.labels(method=method).inc()
        failed = error_of(response, error)
        if failed is not None:
            metrics.SLACK_ERRORS.labels(method=method, error=failed).inc()
        if response is not None and response.status_code == 429:
            metrics.SLACK_RATELIMITED.labels(method=method).inc()
        return False


def instrument(client: AsyncWebClient) -> AsyncWebClient:
    """Count ``client``'s calls (once: a client instrumented already is left as it is)."""
    if not any(isinstance(h, CallCounter) for h in client.retry_handlers):
        client.retry_handlers = [CallCounter(), *client.retry_handlers]
    return client
