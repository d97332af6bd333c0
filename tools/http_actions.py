"""HTTP actions from ``opsloop.yaml`` (``tools.http.<name>``): one request per tool call.

What an action may be is its model's to say (``tools/http_config.py``, whose rules the
file's reader applies too). Each action becomes a :class:`Tool` (``source="http"``,
approval before running, idempotent only with an ``idempotency_header``). What a call
sends:

- URL: ``{arg}`` placeholders only in the path and the query, every value URL-encoded
  with nothing kept (``/ ? # %`` and spaces too), so a value can neither change the host
  nor add a path segment; a value making a ``.``/``..`` segment, or an empty path value,
  is refused. The final URL's host is checked against ``tools.http_allow_hosts`` again.
- Headers: ``{arg}`` is replaced by the value; a header naming an argument the call did
  not give is left out, and a value with a line break is refused.
- Body: with a ``body`` template, its string leaves are filled in (a leaf that is exactly
  ``"{arg}"`` takes the argument with its JSON type; a member whose argument is absent is
  left out). Without one, the arguments not used in the URL go as a JSON object for
  POST/PUT/PATCH and as query parameters for GET/DELETE.
- The idempotency header, when configured, carries ``ctx.idempotency_key`` (the same on
  every attempt of one call). Redirects are not followed.

Values that are not strings are written as JSON (``true``, ``3``). A ``{name}`` in the URL
is always a required argument (the model refuses any other); in headers and the body
only names declared in the argument schema are placeholders, other braces stay as they are.

Answers: 2xx is ``{"status": ..., "body": <JSON or text>}``; any status not named below
raises :class:`ToolError` naming the status and host with a short excerpt. At most
``MAX_RESULT_BYTES`` (1 MiB) of an answer is read: the body of a longer one is
``{"cut": <note>, "head": <the text read>}``, the shape of any cut result
(``tools/output.py``, which the runner applies to every tool's result), without the
whole size and digest, which stay unknown: the rest is never read.

What a failure means depends on whether the request could have had its effect. Before
the request went out (connection refused, DNS, a connect timeout) nothing happened: that
is :class:`RetryableToolError`. After it went out, an action with an
``idempotency_header`` is retried too (the key makes a repeat safe): read timeouts,
connection resets, payload errors and 408/429/5xx are retryable. An action without one:

- 408, 429 and 503 stay retryable (honouring ``Retry-After``): each says the server
  refused the request before acting on it (timed out waiting for it, rate limit,
  unavailable), so a retry cannot repeat an effect.
- Any other 5xx (500, 502, 504 …), a read timeout, a connection reset or a broken
  answer raise :class:`OutcomeUnknown`: the server (or one behind a gateway) may have
  acted, so a person says whether it did instead of the engine retrying.

Connections are not reused (one call is one request after a human approval), so a reset
is never a stale pooled connection the server had already closed.

Header values may be secrets: they are never logged, never in a repr, and removed from
any answer text that echoes them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import aiohttp
import yarl
from multidict import CIMultiDict

from tools.context import ToolContext
from tools.errors import OutcomeUnknown, RetryableToolError, ToolError, ToolLoadError
from tools.http_config import (
    PLACEHOLDER,
    AllowedHosts,
    HttpActionConfig,
    has_dot_segment,
    host_of,
    unlisted,
)
from tools.output import HEAD_BYTES, MAX_RESULT_BYTES, cut_note, fit_text
from tools.registry import Tool
from tools.schema_tool import SchemaArguments, schema_tool

log = logging.getLogger(__name__)

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_LINE_BREAK = re.compile(r"[\r\n\x00]")
# Headers that never hold a credential, so answers echoing them are left alone.
_PLAIN_HEADERS = frozenset({"accept", "accept-language", "content-type", "user-agent"})
_MAX_BODY_BYTES = MAX_RESULT_BYTES  # read no more than a result may store
_EXCERPT_CHARS = 200
_REDACTED = "[redacted]"


class HttpActionLoadError(ToolLoadError):
    """HTTP actions cannot be loaded; str() is one line naming the config key."""

    def __init__(self, key: str, problem: str) -> None:
        # ToolLoadError's own message speaks of importing a module; say what is wrong here.
        ToolError.__init__(self, f"{key}: {problem}")
        self.module = key
        self.cause = ValueError(problem)


# --- filling in the templates ------------------------------------------------------------


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _fill(template: str, args: Mapping[str, Any], known: Iterable[str], encode: bool) -> str:
    names = set(known)

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in names:
            return m.group(0)
        value = _text(args.get(name, ""))
        return quote(value, safe="") if encode else value

    return PLACEHOLDER.sub(one, template)


def _used(template: str, known: Iterable[str]) -> set[str]:
    names = set(known)
    return {n for n in PLACEHOLDER.findall(template) if n in names}


_ABSENT = object()  # a whole-string placeholder whose argument the call did not give


def _fill_body(node: Any, args: Mapping[str, Any], known: set[str]) -> Any:
    """The body template with arguments in; ``_ABSENT`` for a whole-string missing one."""
    if isinstance(node, str):
        whole = PLACEHOLDER.fullmatch(node)
        if whole and whole.group(1) in known:
            return args.get(whole.group(1), _ABSENT)
        return _fill(node, args, known, encode=False)
    if isinstance(node, dict):
        filled = {k: _fill_body(v, args, known) for k, v in node.items()}
        return {k: v for k, v in filled.items() if v is not _ABSENT}
    if isinstance(node, list):
        return [None if (v := _fill_body(x, args, known)) is _ABSENT else v for x in node]
    return node


@dataclass(frozen=True)
class _Request:
    method: str
    url: str
    headers: CIMultiDict[str]
    data: bytes | None


def build_request(
    action: HttpActionConfig, args: Mapping[str, Any], idempotency_key: str
) -> _Request:
    """The request one call sends (pure); ``ToolError`` for arguments that cannot go in it."""
    known = set((action.arguments.get("properties") or {}).keys())
    parts = urlsplit(action.url)
    for name in _used(parts.path, known):
        if _text(args.get(name, "")) == "":
            raise ToolError(f"argument {name!r} may not be empty: it is part of the URL path")
    path = _fill(parts.path, args, known, encode=True)
    if has_dot_segment(path):
        raise ToolError("an argument may not be '.' or '..': it is part of the URL path")
    query = _fill(parts.query, args, known, encode=True)
    in_url = _used(parts.path + parts.query, known)
    rest = {k: v for k, v in args.items() if k not in in_url}
    method = action.method.upper()
    data: bytes | None = None
    headers: CIMultiDict[str] = CIMultiDict()  # a configured Content-Type replaces ours
    if action.body is not None:
        data = json.dumps(_fill_body(action.body, args, known), ensure_ascii=False).encode()
    elif method in _BODY_METHODS:
        data = json.dumps(rest, ensure_ascii=False).encode()
    elif rest:
        extra = urlencode(_query_pairs(rest), quote_via=quote, safe="")
        query = f"{query}&{extra}" if query else extra
    if data is not None:
        headers["Content-Type"] = "application/json"
    for name, template in action.plain_headers().items():
        used = _used(template, known)
        if any(n not in args for n in used):
            continue  # an optional argument the call did not give
        value = _fill(template, args, known, encode=False)
        if _LINE_BREAK.search(value):
            raise ToolError(f"header {name!r}: an argument in it holds a line break")
        headers[name] = value
    if action.idempotency_header:
        headers[action.idempotency_header] = idempotency_key
    url = urlunsplit((parts.scheme, parts.netloc, path, query, ""))
    return _Request(method=method, url=url, headers=headers, data=data)


def _query_pairs(args: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for key, value in args.items():
        for item in value if isinstance(value, list) else [value]:
            pairs.append((key, _text(item)))
    return pairs


# --- answers -----------------------------------------------------------------------------


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from ``now`` (epoch seconds): delay-seconds or an HTTP date."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def _secrets_of(action: HttpActionConfig) -> list[str]:
    """Configured header text that may be a credential (longest first, for redaction)."""
    found: set[str] = set()
    for name, template in action.plain_headers().items():
        if name.lower() in _PLAIN_HEADERS:
            continue
        if not PLACEHOLDER.search(template) and template.strip():
            found.add(template.strip())
        found.update(t for t in template.split() if len(t) >= 8 and "{" not in t)
    return sorted(found, key=len, reverse=True)


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _EXCERPT_CHARS else flat[:_EXCERPT_CHARS] + "…"


async def _read_text(resp: aiohttp.ClientResponse) -> tuple[str, bool]:
    """The body as text, cut at ``_MAX_BODY_BYTES``; True when it was cut."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_BODY_BYTES:
            break
    raw = b"".join(chunks)
    cut = len(raw) > _MAX_BODY_BYTES
    return raw[:_MAX_BODY_BYTES].decode(resp.charset or "utf-8", errors="replace"), cut


def _answer(resp: aiohttp.ClientResponse, text: str, cut: bool) -> dict[str, Any]:
    """A 2xx answer as the tool's result; a body cut at the read limit says so first."""
    if cut:
        # What was read, fitted so that the result stays under the bound (no second cut).
        head = fit_text(text, HEAD_BYTES)
        note = cut_note(len(head.encode()), _MAX_BODY_BYTES, whole=False)
        return {"status": resp.status, "body": {"cut": note, "head": head}}
    if not text:
        return {"status": resp.status, "body": None}
    if resp.content_type == "application/json" or resp.content_type.endswith("+json"):
        try:
            return {"status": resp.status, "body": json.loads(text)}
        except ValueError:
            pass
    return {"status": resp.status, "body": text}


def _is_retryable(status: int) -> bool:
    return status in (408, 429) or 500 <= status <= 599


def _may_have_acted(status: int) -> bool:
    """A transient status after which the effect may have happened (see the docstring)."""
    return 500 <= status <= 599 and status != 503


# --- failures before or after the request went out ---------------------------------------


@dataclass
class _Progress:
    """How far one request got; set by the trace hook below."""

    sent: bool = False


async def _note_sent(
    session: aiohttp.ClientSession,
    trace: Any,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    # The headers are written once the connection is up: from here on the server may
    # have the request.
    if isinstance(progress := trace.trace_request_ctx, _Progress):
        progress.sent = True


def _exchange_failure(
    name: str,
    action: HttpActionConfig,
    host: str,
    exc: TimeoutError | aiohttp.ClientError,
    sent: bool,
) -> ToolError:
    """A request that got no (whole) answer: retryable, OutcomeUnknown or a ToolError."""
    kind = type(exc).__name__  # only the type: an exception's text may quote a header
    timed_out = isinstance(exc, TimeoutError)
    transient = timed_out or isinstance(
        exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError
    )
    if not sent:
        if timed_out:
            return RetryableToolError(f"cannot reach {host}: no connection within the timeout")
        if transient:
            return RetryableToolError(f"cannot reach {host}: {kind}")
        return ToolError(f"HTTP request to {host} failed: {kind}")
    if action.idempotency_header:
        if timed_out:
            return RetryableToolError(f"HTTP request to {host} timed out after {action.timeout:g}s")
        if transient:
            return RetryableToolError(f"the connection to {host} failed: {kind}")
        return ToolError(f"HTTP request to {host} failed: {kind}")
    seen = (
        f"no answer from {host} within {action.timeout:g}s"
        if timed_out
        else f"the connection to {host} failed ({kind})"
    )
    return OutcomeUnknown(f"{seen} after the request was sent; {_unknown(name)}")


def _unknown(name: str) -> str:
    return f"whether {name} took effect is unknown"


# --- the source --------------------------------------------------------------------------


class HttpActions:
    """The ``tools.http`` actions as a :class:`~tools.sources.ToolSource`."""

    name = "http"
    key = "tools.http"

    def __init__(self, actions: Mapping[str, HttpActionConfig], allow_hosts: Iterable[str]) -> None:
        """``actions`` by name and ``allow_hosts`` as ``tools.http`` and
        ``tools.http_allow_hosts`` give them (the file's reader has refused what the
        models refuse; an entry that is not a host is refused here too)."""
        self.actions = dict(actions)
        try:
            self.allow = AllowedHosts.parse(allow_hosts)
        except ValueError as exc:
            raise HttpActionLoadError("tools.http_allow_hosts", str(exc)) from None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HttpActions({list(self.actions)!r})"

    async def open(self) -> list[Tool]:
        """Check every action against the allowed hosts and build its tool."""
        if (bad := unlisted(self.actions, self.allow)) is not None:
            name, problem = bad
            raise HttpActionLoadError(f"tools.http.{name}.url", problem)
        tools = []
        for name, action in self.actions.items():
            try:
                tools.append(self._tool(name, action))
            except ToolError as exc:
                raise HttpActionLoadError(f"tools.http.{name}", str(exc)) from None
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_note_sent)
            # No cookie jar: one call's cookies must not ride along with the next. No
            # pooled connections: a reset must mean this request's connection failed.
            self._session = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(force_close=True),
                trace_configs=[trace],
            )
        return tools

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _tool(self, name: str, action: HttpActionConfig) -> Tool:
        secrets = _secrets_of(action)

        async def call(args: SchemaArguments, ctx: ToolContext) -> dict[str, Any]:
            return await self._call(name, action, secrets, args.as_dict(), ctx)

        return schema_tool(
            name=name,
            description=action.description,
            schema=dict(action.arguments),
            func=call,
            policy="approve_before_run",
            source="http",
            idempotent=action.idempotent,
        )

    async def _call(
        self,
        name: str,
        action: HttpActionConfig,
        secrets: list[str],
        args: dict[str, Any],
        ctx: ToolContext,
    ) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("HttpActions is not open")
        req = build_request(action, args, ctx.idempotency_key)
        host = host_of(req.url)
        if not self.allow.allows(req.url):  # cannot happen by construction; checked anyway
            raise ToolError(f"host {host!r} is not in tools.http_allow_hosts")
        progress = _Progress()
        try:
            async with self._session.request(
                req.method,
                yarl.URL(req.url, encoded=True),  # as built: no re-quoting, no '..' folding
                headers=req.headers,
                data=req.data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=action.timeout),
                trace_request_ctx=progress,
            ) as resp:
                text, cut = await _read_text(resp)
        except (TimeoutError, aiohttp.ClientError) as exc:
            error = _exchange_failure(name, action, host, exc, progress.sent)
            log.warning(
                "http action failed action=%s method=%s host=%s error=%s sent=%s "
                "thread_id=%s tool_call_id=%s attempt=%s",
                name,
                req.method,
                host,
                type(exc).__name__,
                progress.sent,
                ctx.thread_id,
                ctx.tool_call_id,
                ctx.attempt,
            )
            raise error from None
        text = _redact(text, secrets)
        log.info(
            "http action=%s method=%s host=%s status=%s thread_id=%s tool_call_id=%s attempt=%s",
            name,
            req.method,
            host,
            resp.status,
            ctx.thread_id,
            ctx.tool_call_id,
            ctx.attempt,
        )
        if 200 <= resp.status <= 299:
            return _answer(resp, text, cut)
        detail = _excerpt(text) or (resp.reason or "")
        message = f"HTTP {resp.status} from {host}" + (f": {detail}" if detail else "")
        if 300 <= resp.status <= 399:
            message += " (redirects are not followed)"
        if _is_retryable(resp.status):
            if not action.idempotency_header and _may_have_acted(resp.status):
                raise OutcomeUnknown(f"{message}; {_unknown(name)}")
            wait = retry_after_seconds(resp.headers.get("Retry-After"), time.time())
            raise RetryableToolError(message, retry_after=wait)
        raise ToolError(message)
