"""A thin async client of PagerDuty's REST API v2, over aiohttp.

Why not the official ``pagerduty`` package: it is synchronous (``requests``). Called on
the event loop it would stop every thread, every delivery and every Slack ack for as
long as PagerDuty takes to answer; pushed to a thread (``asyncio.to_thread``) it could
not be cancelled at a click's deadline. The few endpoints opsloop uses are plain JSON,
so a client of our own is a page long and shares aiohttp with the rest of the process.

Every request carries ``Authorization: Token token=<token>`` and PagerDuty's v2
``Accept``; writes carry ``From: <from_email>`` (PagerDuty requires it with an account
API key; a user's own key may leave it out). Requests go to the configured ``api_url``
(EU accounts: ``https://api.eu.pagerduty.com``); redirects are not followed. The token
is never logged nor put in an error.

Errors, one tree::

    PagerDutyError            base; ``status`` is the HTTP status (None: no answer)
    +-- PagerDutyUnavailable  no answer, a timeout, 429 or 5xx: worth a retry
    +-- PagerDutyRefused      any other answer that is not a 2xx (a bad id, a scope)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp

from tools.http_actions import retry_after_seconds
from tools.integrations.config import PagerDutyConfig

ACCEPT = "application/vnd.pagerduty+json;version=2"
DEFAULT_TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # a page of on-calls with users is well under this
PAGE_LIMIT = 100  # PagerDuty's largest page
MAX_PAGES = 10  # of one listing: a paginator that never ends cannot hang a call
_EXCERPT = 200


class PagerDutyError(Exception):
    """PagerDuty did not do what was asked; ``str()`` is one line, without the token."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class PagerDutyUnavailable(PagerDutyError):
    """No answer (connection, timeout) or one saying "later" (429, 5xx)."""


class PagerDutyRefused(PagerDutyError):
    """An answer refusing the request (4xx other than 429): the same request fails again."""


class PagerDutyClient:
    """The REST API of one PagerDuty account. ``session``: an aiohttp session to use
    (its owner closes it); without one the client opens its own on first use, on the
    loop that uses it, and :meth:`close` closes it."""

    def __init__(
        self,
        config: PagerDutyConfig,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.api_url = config.api_url
        self.from_email = config.from_email
        self._token = config.token
        self.timeout = timeout
        self._session = session
        self._owned: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"PagerDutyClient({self.api_url!r})"

    async def close(self) -> None:
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()

    # --- the endpoints ------------------------------------------------------------------

    async def oncalls(
        self,
        *,
        schedule_ids: Sequence[str] = (),
        escalation_policy_ids: Sequence[str] = (),
    ) -> tuple[list[dict[str, Any]], bool]:
        """Who is on call now (``GET /oncalls``, users included, so their emails come
        with them), filtered by schedules and escalation policies; and whether more
        were left than ``MAX_PAGES`` pages."""
        params = [("include[]", "users")]
        params += [("schedule_ids[]", i) for i in schedule_ids]
        params += [("escalation_policy_ids[]", i) for i in escalation_policy_ids]
        return await self._pages("/oncalls", "oncalls", params)

    async def user(self, user_id: str) -> dict[str, Any]:
        """``GET /users/{id}``: a user (with ``email``)."""
        answer = await self._request("GET", f"/users/{_id(user_id)}")
        return _member(answer, "user")

    async def incidents(
        self,
        *,
        statuses: Iterable[str] = (),
        service_ids: Iterable[str] = (),
        limit: int = 25,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The latest incidents (``GET /incidents``, newest first) and whether there
        are more than ``limit``."""
        params = [("limit", str(limit)), ("sort_by", "created_at:desc")]
        params += [("statuses[]", s) for s in statuses]
        params += [("service_ids[]", _id(s)) for s in service_ids]
        answer = await self._request("GET", "/incidents", params=params)
        return _list(answer, "incidents"), bool(answer.get("more"))

    async def incident(self, incident_id: str) -> dict[str, Any]:
        """``GET /incidents/{id}``."""
        answer = await self._request("GET", f"/incidents/{_id(incident_id)}")
        return _member(answer, "incident")

    async def notes(self, incident_id: str) -> list[dict[str, Any]]:
        """``GET /incidents/{id}/notes``: every note of the incident (not paginated)."""
        answer = await self._request("GET", f"/incidents/{_id(incident_id)}/notes")
        return _list(answer, "notes")

    async def add_note(self, incident_id: str, content: str) -> dict[str, Any]:
        """``POST /incidents/{id}/notes``."""
        body = {"note": {"content": content}}
        answer = await self._request(
            "POST", f"/incidents/{_id(incident_id)}/notes", body=body, write=True
        )
        return _member(answer, "note")

    async def set_status(
        self, incident_id: str, status: str, *, resolution: str | None = None
    ) -> dict[str, Any]:
        """``PUT /incidents/{id}``: acknowledge or resolve (with a ``resolution`` note)."""
        incident: dict[str, Any] = {"type": "incident_reference", "status": status}
        if resolution:
            incident["resolution"] = resolution
        answer = await self._request(
            "PUT", f"/incidents/{_id(incident_id)}", body={"incident": incident}, write=True
        )
        return _member(answer, "incident")

    # --- the wire -------------------------------------------------------------------------

    async def _pages(
        self, path: str, key: str, params: list[tuple[str, str]]
    ) -> tuple[list[dict[str, Any]], bool]:
        found: list[dict[str, Any]] = []
        for page in range(MAX_PAGES):
            paged = [*params, ("limit", str(PAGE_LIMIT)), ("offset", str(page * PAGE_LIMIT))]
            answer = await self._request("GET", path, params=paged)
            found += _list(answer, key)
            if not answer.get("more"):
                return found, False
        return found, True

    def _client(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        if self._owned is None:
            self._owned = aiohttp.ClientSession()
        return self._owned

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        write: bool = False,
    ) -> dict[str, Any]:
        headers = {
            "Accept": ACCEPT,
            "Authorization": f"Token token={self._token.get_secret_value()}",
        }
        if write and self.from_email:
            headers["From"] = self.from_email
        what = f"PagerDuty {method} {path}"
        try:
            async with self._client().request(
                method,
                self.api_url + path,
                params=params,
                json=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
                status, retry = resp.status, resp.headers.get("Retry-After")
        except TimeoutError:
            raise PagerDutyUnavailable(f"{what}: no answer within {self.timeout:g}s") from None
        except aiohttp.ClientError as exc:  # only the type: the text may quote the URL
            raise PagerDutyUnavailable(f"{what}: {type(exc).__name__}") from None
        text = raw[:MAX_ANSWER_BYTES].decode("utf-8", errors="replace")
        answer = _json(text)
        if 200 <= status <= 299:
            if answer is None or len(raw) > MAX_ANSWER_BYTES:
                raise PagerDutyError(f"{what}: the answer is not JSON of a sane size")
            return answer
        message = f"{what}: HTTP {status}" + (f" ({why})" if (why := _why(answer, text)) else "")
        if status == 429 or status >= 500:
            wait = retry_after_seconds(retry, time.time())
            raise PagerDutyUnavailable(message, status=status, retry_after=wait)
        raise PagerDutyRefused(message, status=status)


def _id(value: str) -> str:
    """A PagerDuty id as a path segment: letters and digits only, so that no argument
    can reach another endpoint (``../``, ``?``)."""
    if not value.isascii() or not value.isalnum() or len(value) > 64:
        raise PagerDutyRefused(f"{value[:70]!r} is not a PagerDuty id")
    return value


def _json(text: str) -> dict[str, Any] | None:
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _list(answer: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = answer.get(key)
    if not isinstance(items, list):
        raise PagerDutyError(f"PagerDuty's answer has no {key!r} list")
    return [i for i in items if isinstance(i, dict)]


def _member(answer: dict[str, Any], key: str) -> dict[str, Any]:
    item = answer.get(key)
    if not isinstance(item, dict):
        raise PagerDutyError(f"PagerDuty's answer has no {key!r}")
    return item


def _why(answer: dict[str, Any] | None, text: str) -> str:
    """PagerDuty's error (``{"error": {"message", "errors"}}``), else an excerpt."""
    error = answer.get("error") if answer is not None else None
    if isinstance(error, dict):
        parts = [str(error.get("message") or "")]
        parts += [str(e) for e in error.get("errors") or () if isinstance(e, str)]
        said = "; ".join(p for p in parts if p)
    else:
        said = text
    flat = " ".join(said.split())
    return flat if len(flat) <= _EXCERPT else flat[:_EXCERPT] + "…"
