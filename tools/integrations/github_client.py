"""A thin async client for the GitHub REST API: the endpoints the GitHub tools use.

Thin by choice: a dozen endpoints over the aiohttp the process already runs, instead of
an SDK whose generated models would cost startup time and memory for the hundreds of
endpoints we never call (README, "GitHub"). Requests carry the documented headers
(``Accept: application/vnd.github+json``, ``X-GitHub-Api-Version``); answers are plain
JSON (dicts and lists as GitHub sends them).

Authentication is a token (a fine-grained personal access token) or a GitHub App: a JWT
signed RS256 with the app's private key buys an installation token, kept until
``TOKEN_MARGIN_S`` before it expires
(https://docs.github.com/apps/creating-github-apps/authenticating-with-a-github-app).

Every failure is one :class:`GitHubError` (the boundary maps aiohttp's exceptions and
GitHub's error answers once): ``status`` (None: no answer), ``sent`` (the request may
have reached GitHub), ``retry_after`` (rate limits) and ``transient`` (worth retrying).
The token is never logged nor put in an error.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import jwt
import yarl
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from tools.integrations.config import GitHubConfig

log = logging.getLogger("opsloop.github")

API_VERSION = "2022-11-28"
ACCEPT = "application/vnd.github+json"
TOKEN_MARGIN_S = 300.0  # an installation token is renewed this long before it expires
_TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)
_MAX_JSON_BYTES = 8 * 1024 * 1024
_LOG_KEEP_BYTES = 256 * 1024  # of a job's log, only the end is kept while reading
_EXCERPT = 300


class GitHubError(Exception):
    """A GitHub request failed. ``status`` None: no answer came (``sent`` says whether
    the request may have reached GitHub all the same)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        sent: bool = True,
        retry_after: float | None = None,
        lasting: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.sent = sent
        self.retry_after = retry_after
        self.lasting = lasting  # ours to fix (a key that cannot sign): never retried

    @property
    def transient(self) -> bool:
        """A blip or a limit: the same request may succeed later."""
        if self.lasting:
            return False
        if self.status is None:
            return True
        return self.status in (408, 429) or self.status >= 500 or self.retry_after is not None


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # JSON, or None for an empty answer


def iso(moment: datetime) -> str:
    """GitHub's timestamp form, to the second, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """A GitHub timestamp (``2026-01-02T03:04:05Z``) as an aware datetime; None if absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def segment(value: str) -> str:
    """One path segment from a caller's value (a workflow file name): quoted, never a
    dot segment, so it stays inside the repository's path."""
    if value in ("", ".", ".."):
        raise ValueError(f"{value!r} cannot be part of a GitHub path")
    return quote(value, safe="")


def check_private_key(pem: str) -> None:
    """``ValueError`` unless ``pem`` is an RSA private key (PEM, no passphrase): what
    GitHub gives an app, and what signs its RS256 JWTs."""
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM private key ({type(exc).__name__})") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("not an RSA private key: give the .pem the GitHub App's page made")


class GitHubClient:
    """The REST endpoints the tools and ``POST /hooks/github`` need, for one
    ``integrations.github`` configuration. Open lazily; ``close()`` on shutdown."""

    def __init__(
        self,
        config: GitHubConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.base = config.api_url.rstrip("/")
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._installation: tuple[str, float] | None = None  # (token, expires at)
        self._token_lock = asyncio.Lock()
        self._login: str | None = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No cookie jar: GitHub's API sets none we want to send back.
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    # --- authentication --------------------------------------------------------------

    def app_jwt(self) -> str:
        """The app's JWT: issued a minute in the past against clock drift, valid 9 min
        (GitHub allows at most 10)."""
        cfg = self.config
        assert cfg.app_id is not None and cfg.private_key is not None
        now = int(self._clock())
        claims = {"iat": now - 60, "exp": now + 540, "iss": str(cfg.app_id)}
        try:
            return jwt.encode(claims, cfg.private_key.get_secret_value(), algorithm="RS256")
        except (ValueError, TypeError, jwt.PyJWTError) as exc:
            raise GitHubError(
                f"integrations.github.private_key cannot sign a JWT ({type(exc).__name__})",
                sent=False,
                lasting=True,
            ) from None

    async def _authorization(self) -> str:
        if self.config.token is not None:
            return f"Bearer {self.config.token.get_secret_value()}"
        async with self._token_lock:  # one renewal for concurrent calls, not one each
            cached = self._installation
            if cached is None or self._clock() >= cached[1] - TOKEN_MARGIN_S:
                cached = await self._installation_token()
                self._installation = cached
            return f"Bearer {cached[0]}"

    async def _installation_token(self) -> tuple[str, float]:
        path = f"/app/installations/{self.config.installation_id}/access_tokens"
        answer = await self._send("POST", path, authorization=f"Bearer {self.app_jwt()}")
        body = answer.body if isinstance(answer.body, dict) else {}
        token, expires = body.get("token"), parse_time(body.get("expires_at"))
        if not isinstance(token, str) or expires is None:
            raise GitHubError("GitHub answered the installation token request without one")
        return token, expires.timestamp()

    async def login(self) -> str | None:
        """Whom our runs and issues are by: the token's user, or ``<app slug>[bot]``;
        None when GitHub will not say (the caller then correlates without it)."""
        if self._login is None:
            try:
                if self.config.token is not None:
                    me = (await self.request("GET", "/user")).body
                    self._login = me.get("login") if isinstance(me, dict) else None
                else:
                    app = (
                        await self._send("GET", "/app", authorization=f"Bearer {self.app_jwt()}")
                    ).body
                    slug = app.get("slug") if isinstance(app, dict) else None
                    self._login = f"{slug}[bot]" if slug else None
            except GitHubError as exc:
                log.warning("github: cannot tell whom the credentials are for: %s", exc)
        return self._login

    # --- requests --------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Answer:
        """One authenticated request; ``GitHubError`` for anything but a 2xx."""
        authorization = await self._authorization()
        try:
            return await self._send(
                method, path, params=params, body=body, authorization=authorization
            )
        except GitHubError as exc:
            if exc.status == 401 and self._installation is not None:
                self._installation = None  # revoked or expired early: renew next time
            raise

    async def _send(
        self,
        method: str,
        path: str,
        *,
        authorization: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
    ) -> Answer:
        headers = {
            "Accept": ACCEPT,
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "opsloop",
            "Authorization": authorization,
        }
        try:
            async with self._open().request(
                method,
                self.base + path,
                params={k: str(v) for k, v in (params or {}).items() if v is not None},
                json=body,
                headers=headers,
                timeout=_TIMEOUT,
                allow_redirects=False,
            ) as resp:
                raw = await _read(resp, _MAX_JSON_BYTES)
                status, resp_headers = resp.status, resp.headers
        except (TimeoutError, aiohttp.ClientError) as exc:
            # A refused or unresolved connection never carried the request; anything
            # later (a reset, a read timeout) may have.
            sent = not isinstance(
                exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError
            )
            raise GitHubError(f"no answer from GitHub ({type(exc).__name__})", sent=sent) from None
        if 200 <= status <= 299:
            return Answer(status, _json_or_none(raw))
        raise _error_of(method, path, status, resp_headers, raw, self._clock())

    # --- Actions -----------------------------------------------------------------------

    async def dispatch_workflow(
        self,
        repo: str,
        workflow: str,
        ref: str,
        inputs: Mapping[str, Any],
        *,
        run_details: bool = True,
    ) -> dict[str, Any] | None:
        """Create a ``workflow_dispatch`` event. With ``run_details`` GitHub answers 200
        with ``workflow_run_id``, ``run_url`` and ``html_url`` (since February 2026;
        https://github.blog/changelog/2026-02-19-workflow-dispatch-api-now-returns-run-ids);
        without, or on a server that predates it, 204 and no body: None."""
        payload: dict[str, Any] = {"ref": ref}
        if inputs:
            payload["inputs"] = dict(inputs)
        if run_details:
            payload["return_run_details"] = True
        path = f"/repos/{repo}/actions/workflows/{segment(workflow)}/dispatches"
        answer = await self.request("POST", path, body=payload)
        return answer.body if isinstance(answer.body, dict) else None

    async def workflow_runs(
        self,
        repo: str,
        workflow: str | None = None,
        *,
        event: str | None = None,
        created_since: datetime | None = None,
        branch: str | None = None,
        status: str | None = None,
        actor: str | None = None,
        per_page: int = 30,
    ) -> list[dict[str, Any]]:
        """Runs newest first, of one workflow or of the repository."""
        where = f"/workflows/{segment(workflow)}" if workflow else ""
        params = {
            "event": event,
            "created": f">={iso(created_since)}" if created_since else None,
            "branch": branch,
            "status": status,
            "actor": actor,
            "per_page": per_page,
        }
        answer = await self.request("GET", f"/repos/{repo}/actions{where}/runs", params=params)
        runs = answer.body.get("workflow_runs") if isinstance(answer.body, dict) else None
        return [r for r in runs or [] if isinstance(r, dict)]

    async def run(self, repo: str, run_id: int) -> dict[str, Any]:
        answer = await self.request("GET", f"/repos/{repo}/actions/runs/{int(run_id)}")
        return answer.body if isinstance(answer.body, dict) else {}

    async def run_jobs(self, repo: str, run_id: int) -> list[dict[str, Any]]:
        """The jobs of the run's latest attempt (up to 100)."""
        answer = await self.request(
            "GET",
            f"/repos/{repo}/actions/runs/{int(run_id)}/jobs",
            params={"filter": "latest", "per_page": 100},
        )
        jobs = answer.body.get("jobs") if isinstance(answer.body, dict) else None
        return [j for j in jobs or [] if isinstance(j, dict)]

    async def job_log_tail(self, repo: str, job_id: int, lines: int) -> tuple[list[str], int]:
        """The last ``lines`` lines of a job's log and how many lines it has in all.

        GitHub answers with a redirect to a short-lived download URL; that URL is
        followed without our ``Authorization`` header (it is signed on its own, and a
        token must never reach a storage host). Only the end of the log is kept while
        reading: a log of hundreds of megabytes costs no more memory than a short one.
        """
        path = f"/repos/{repo}/actions/jobs/{int(job_id)}/logs"
        headers = {
            "Accept": ACCEPT,
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "opsloop",
            "Authorization": await self._authorization(),
        }
        url = self.base + path
        try:
            for _ in range(2):  # the API's answer, then at most the download it points to
                async with self._open().get(
                    url, headers=headers, timeout=_TIMEOUT, allow_redirects=False
                ) as resp:
                    if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                        url = str(resp.url.join(yarl.URL(resp.headers["Location"])))
                        headers = {"User-Agent": "opsloop"}
                        continue
                    if not 200 <= resp.status <= 299:
                        raw = await _read(resp, _MAX_JSON_BYTES)
                        raise _error_of("GET", path, resp.status, resp.headers, raw, self._clock())
                    return await _tail(resp, lines)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise GitHubError(f"no answer from GitHub ({type(exc).__name__})") from None
        raise GitHubError("GitHub redirected the log download more than once", status=302)

    # --- issues and comments ---------------------------------------------------------

    async def create_issue(
        self, repo: str, title: str, body: str, labels: list[str]
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"title": title, "body": body}
        if labels:
            payload["labels"] = labels
        answer = await self.request("POST", f"/repos/{repo}/issues", body=payload)
        return answer.body if isinstance(answer.body, dict) else {}

    async def issues_since(self, repo: str, creator: str | None, since: datetime) -> list[dict]:
        """Issues (and pull requests) updated since ``since``, newest first, by
        ``creator`` when known: the list endpoint, which is consistent at once, where
        the search index may lag a freshly created issue by a minute."""
        params = {
            "state": "all",
            "since": iso(since),
            "creator": creator,
            "sort": "created",
            "direction": "desc",
            "per_page": 100,
        }
        answer = await self.request("GET", f"/repos/{repo}/issues", params=params)
        return [i for i in answer.body or [] if isinstance(i, dict)]

    async def create_comment(self, repo: str, number: int, body: str) -> dict[str, Any]:
        answer = await self.request(
            "POST", f"/repos/{repo}/issues/{int(number)}/comments", body={"body": body}
        )
        return answer.body if isinstance(answer.body, dict) else {}

    async def comments_since(self, repo: str, number: int, since: datetime) -> list[dict]:
        answer = await self.request(
            "GET",
            f"/repos/{repo}/issues/{int(number)}/comments",
            params={"since": iso(since), "per_page": 100},
        )
        return [c for c in answer.body or [] if isinstance(c, dict)]


# --- answers ---------------------------------------------------------------------------


async def _read(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, however it arrives; ``GitHubError`` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise GitHubError(f"GitHub's answer is over {limit} bytes", status=resp.status)
        chunks.append(chunk)
    return b"".join(chunks)


def _json_or_none(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw.decode("utf-8", errors="replace")


def _error_of(
    method: str,
    path: str,
    status: int,
    headers: Mapping[str, str],
    raw: bytes,
    now: float,
) -> GitHubError:
    """GitHub's error answer as one line: its ``message`` and any ``errors`` detail."""
    body = _json_or_none(raw)
    detail = ""
    if isinstance(body, dict):
        detail = str(body.get("message") or "")
        errors = body.get("errors")
        if isinstance(errors, list) and errors:
            parts = [
                str(e.get("message") or e.get("code") or e) if isinstance(e, dict) else str(e)
                for e in errors[:3]
            ]
            detail += " (" + "; ".join(parts) + ")"
    elif isinstance(body, str):
        detail = body
    detail = " ".join(detail.split())[:_EXCERPT]
    retry_after = _retry_after(status, headers, now)
    what = f"GitHub answered {status} to {method} {path.split('?')[0]}"
    return GitHubError(
        what + (f": {detail}" if detail else ""), status=status, retry_after=retry_after
    )


def _retry_after(status: int, headers: Mapping[str, str], now: float) -> float | None:
    """Seconds to wait for a rate limit: ``Retry-After`` (secondary limits), or the
    primary limit's reset time when none remain
    (https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api)."""
    if status not in (403, 429):
        return None
    if (after := headers.get("Retry-After")) is not None:
        try:
            return max(0.0, float(after))
        except ValueError:
            return 60.0
    if headers.get("X-RateLimit-Remaining") == "0":
        try:
            return max(0.0, float(headers.get("X-RateLimit-Reset", "")) - now)
        except ValueError:
            return 60.0
    return 60.0 if status == 429 else None


async def _tail(resp: aiohttp.ClientResponse, lines: int) -> tuple[list[str], int]:
    """The last ``lines`` lines of the body, and how many it has in all."""
    kept: collections.deque[bytes] = collections.deque()
    size = count = 0
    last = b""
    async for chunk in resp.content.iter_chunked(64 * 1024):
        count += chunk.count(b"\n")
        last = chunk[-1:] or last
        kept.append(chunk)
        size += len(chunk)
        while size - len(kept[0]) >= _LOG_KEEP_BYTES:
            size -= len(kept.popleft())
    if last and last != b"\n":
        count += 1  # a last line without its newline
    text = b"".join(kept).decode(resp.charset or "utf-8", errors="replace")
    tail = text.splitlines()[-lines:] if lines > 0 else []
    return tail, count
