"""Claude as the decision step: the ``Model`` port on the official ``anthropic`` SDK.

One call of ``next_step`` is one ``POST /v1/messages`` with the projected prompt as
given (system, tools, messages), ``tool_choice`` auto with parallel tool use disabled,
so a reply holds at most one tool call: one step per turn.

Decisions, checked against the SDK's source (anthropic 2.14):

- **No SDK retries** (``max_retries=0``, also forced on a client passed in). The SDK
  would otherwise retry 408/409/429/5xx (529 included) and connection errors twice,
  sleeping in-process, invisibly. We own every retry: a failure becomes a
  ``ModelError``; the runner turns a retryable one into a ``retry_scheduled`` event
  with its ``wake_at`` (in the trace, surviving restarts, no sleeps here) and a
  non-retryable one into an ``error`` event that fails the thread.
- **Retryable**: 408, 409, 429, every 5xx (529 ``overloaded_error`` included),
  timeouts and connection errors, with ``retry_after`` from the response's
  ``retry-after-ms`` or ``retry-after`` header (seconds, floats accepted; the SDK's
  order; an unparsable value is ignored). The API's ``x-should-retry`` header, which
  the SDK obeys, is obeyed too. A 429 for a spent *spend limit* (``error.details.
  error_code`` ``enforced_spend_limit_reached`` / ``contract_spend_limit_reached``) is
  not retryable: waiting minutes does not help; a human must act.
- **Not retryable**: 400, 401, 403, 404, 413, 422 and any other 4xx, with a message
  that says what to fix. Messages never carry the API key or request headers: the
  key is never put in one, and any text from the API is scrubbed of it anyway.
- **Replies**: the text blocks joined with a blank line; the first ``tool_use``
  block (parallel use is disabled, so there is at most one; were there more, the rest
  is dropped with a warning: only the kept call enters the log and the next prompt,
  so every ``tool_use`` sent back stays paired with its ``tool_result``);
  ``stop_reason`` verbatim (``max_tokens``, ``refusal``… are judged by the policy:
  a tool call cut at ``max_tokens`` is never executed); usage with cache tokens.

- **Streaming** (``on_text`` given): the same request through ``messages.stream``; a
  final answer's text goes to ``on_text`` as it arrives (``AnswerRelay``: the pieces
  join to exactly ``Decision.text``), and the ``Decision`` is built from the SDK's
  accumulated final message by the same code as a plain reply's, so the log records
  the same decision (same prompt hash, same cut-off rule). The sink is reset when the
  reply turns out not to be an answer (a tool call after some words, a stop other than
  ``end_turn`` / ``stop_sequence``) and when the request fails, so a retry (ours: the
  SDK has none) starts the text over. An ``error`` event inside the stream (HTTP 200)
  is judged by its type: ``overloaded_error``, ``api_error``, ``rate_limit_error`` and
  ``timeout_error`` are retryable.

The SDK sends the key as ``Authorization: Bearer <key>`` (its ``_api_key_auth``), and
``ANTHROPIC_BASE_URL`` is read by the SDK itself when no ``base_url`` is given.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import anthropic
from anthropic import AsyncAnthropic, omit

from engine import metrics
from engine.config import ModelSettings, load_settings
from engine.context import Prompt
from engine.errors import ConfigError
from engine.events import Usage
from engine.models.answer_relay import AnswerRelay, paired
from engine.models.base import Decision, ModelError, TextSink, ToolUse, is_answer

log = logging.getLogger("opsloop.models.anthropic")

# A current model id from the SDK's own list, ``anthropic.types.ModelParam`` (2.14),
# and not in its ``DEPRECATED_MODELS``. Override with OPSLOOP_MODEL.
DEFAULT_MODEL = "claude-sonnet-5-5"
DEFAULT_MAX_TOKENS = 4096
DEFAULT_TIMEOUT_S = 60.0

# One step per turn: the model may call at most one tool per reply.
TOOL_CHOICE: dict[str, Any] = {"type": "auto", "disable_parallel_tool_use": True}

_MAX_API_MESSAGE = 300
_SPEND_LIMITS = {"enforced_spend_limit_reached", "contract_spend_limit_reached"}
_KEY_LIKE = re.compile(r"sk-ant-[A-Za-z0-9_\-]{4,}")
_NO_AUTH = "Could not resolve authentication method"
# An ``error`` event in a streamed reply (its HTTP status was 200): the error types worth
# another try, by the name ``error_kind`` gives them.
_STREAM_KINDS = {
    "overloaded_error": "overloaded",
    "api_error": "server",
    "rate_limit_error": "rate_limited",
    "timeout_error": "timeout",
}
_STREAM_RETRYABLE = frozenset(_STREAM_KINDS)


class AnthropicModel:
    """The ``Model`` port on Claude. ``name`` is the model id requests are sent with."""

    def __init__(
        self,
        client: AsyncAnthropic | None = None,
        *,
        model: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """``client``: used with its own base URL, key and timeout (``timeout`` here is
        for the client built when none is given), but never with SDK retries."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
        if client is None:
            # Reads ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL itself.
            client = AsyncAnthropic(max_retries=0, timeout=timeout)
        elif client.max_retries != 0:
            client = client.with_options(max_retries=0)
        self.client = client
        self.name: str = model or DEFAULT_MODEL
        self.max_tokens = max_tokens
        self.timeout = timeout

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> AnthropicModel:
        """Built from the settings' key, base URL, model, max tokens and timeout;
        ``ConfigError`` (one line) when the key is missing."""
        if not settings.api_key.strip():
            raise ConfigError("ANTHROPIC_API_KEY is not set: the Anthropic model needs an API key")
        client = AsyncAnthropic(
            api_key=settings.api_key.strip(),
            base_url=(settings.base_url or "").strip() or None,
            max_retries=0,
            timeout=settings.timeout_s,
        )
        return cls(
            client,
            model=settings.name or DEFAULT_MODEL,
            max_tokens=settings.max_tokens,
            timeout=settings.timeout_s,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AnthropicModel:
        """As :meth:`from_settings`, with the settings of ``env`` (default: this process's
        environment, read by ``engine.config``, the one place that reads it)."""
        return cls.from_settings(load_settings(env).model)

    async def close(self) -> None:
        """Close the HTTP connections (the client's, also when it was passed in)."""
        await self.client.close()

    async def next_step(self, prompt: Prompt, *, on_text: TextSink | None = None) -> Decision:
        started = time.monotonic()
        relay = AnswerRelay(on_text) if on_text is not None else None
        try:
            reply, request_id = await self._send(prompt, relay)
            try:
                decision = self._decision(reply)
            except ModelError:
                metrics.MODEL_ERRORS.labels(kind="invalid_reply").inc()
                raise
        except Exception:
            if relay is not None:
                await relay.void()  # a retry starts the text over
            raise
        if relay is not None and not is_answer(decision):
            await relay.void()  # words before a tool call, a cut or refused reply
        log.info(
            "model step model=%s request_id=%s stop_reason=%s tool=%s in=%d out=%d "
            "cache_read=%d cache_write=%d %.2fs",
            decision.model,
            request_id,
            decision.stop_reason,
            decision.tool_use.name if decision.tool_use else None,
            decision.usage.input_tokens,
            decision.usage.output_tokens,
            decision.usage.cache_read_input_tokens,
            decision.usage.cache_creation_input_tokens,
            time.monotonic() - started,
        )
        return decision

    async def _send(
        self, prompt: Prompt, relay: AnswerRelay | None
    ) -> tuple[anthropic.types.Message, str | None]:
        """The reply to ``prompt`` and its request id; SDK failures become ``ModelError``."""
        params: dict[str, Any] = {
            "model": self.name,
            "max_tokens": self.max_tokens,
            "system": prompt.system if prompt.system else omit,
            "messages": prompt.messages,
            "tools": prompt.tools if prompt.tools else omit,
            "tool_choice": TOOL_CHOICE if prompt.tools else omit,
        }
        try:
            if relay is None:
                reply = await self.client.messages.create(**params)
                return reply, getattr(reply, "_request_id", None)
            return await self._streamed(params, relay)
        except anthropic.AnthropicError as exc:
            metrics.MODEL_ERRORS.labels(kind=error_kind(exc)).inc()
            raise self._model_error(exc) from None
        except TypeError as exc:
            # The SDK raises a bare TypeError, before sending, when it has no credential.
            if _NO_AUTH not in str(exc):
                raise
            metrics.MODEL_ERRORS.labels(kind="auth").inc()
            raise ModelError(
                "no Anthropic credentials: set ANTHROPIC_API_KEY", retryable=False
            ) from None

    async def _streamed(
        self, params: dict[str, Any], relay: AnswerRelay
    ) -> tuple[anthropic.types.Message, str | None]:
        """The reply, streamed: text deltas go to ``relay`` as they arrive; the SDK
        accumulates the same events into the whole message the decision is made from."""
        async with self.client.messages.stream(**params) as stream:
            events = aiter(stream)
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
                except (ValueError, RuntimeError) as exc:
                    # The SDK's accumulation refused the stream (tool input that is not
                    # JSON, events out of order, an event that is not JSON): as an
                    # unreadable plain reply. Caught here only: the sink's own failures
                    # are not the API's.
                    metrics.MODEL_ERRORS.labels(kind="invalid_reply").inc()
                    log.warning("unreadable streamed reply: %s", self._clean(str(exc))[:300])
                    raise ModelError(
                        "the Anthropic API streamed a reply we cannot read", retryable=True
                    ) from None
                if event.type == "content_block_start":
                    await relay.block_started(event.content_block.type)
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    await relay.text(event.delta.text)
                elif event.type == "content_block_stop":
                    await relay.block_stopped()
            return await stream.get_final_message(), stream.request_id

    # --- the reply --------------------------------------------------------------------

    def _decision(self, reply: anthropic.types.Message) -> Decision:
        texts: list[str] = []
        uses: list[ToolUse] = []
        for block in reply.content:
            if block.type == "text":
                # ``paired``: a streamed reply's text is its deltas joined, and a pair
                # split across two deltas would stay two halves (a no-op otherwise).
                text = paired(block.text).strip()
                if text:
                    texts.append(text)
            elif block.type == "tool_use":
                if not isinstance(block.input, Mapping):
                    raise ModelError(
                        f"the Anthropic API returned a malformed tool_use for {block.name!r} "
                        "(its input is not an object)",
                        retryable=True,
                    )
                uses.append(ToolUse(id=block.id, name=block.name, input=dict(block.input)))
        if len(uses) > 1:
            log.warning(
                "model returned %d tool_use blocks despite disable_parallel_tool_use; "
                "keeping the first (%s)",
                len(uses),
                uses[0].name,
            )
        u = reply.usage
        usage = Usage(
            input_tokens=u.input_tokens or 0,
            output_tokens=u.output_tokens or 0,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
        )
        return Decision(
            text="\n\n".join(texts),
            tool_use=uses[0] if uses else None,
            stop_reason=reply.stop_reason,
            usage=usage,
            model=reply.model or self.name,
        )

    # --- failures ---------------------------------------------------------------------

    def _model_error(self, exc: anthropic.AnthropicError) -> ModelError:
        if isinstance(exc, anthropic.APITimeoutError):
            return ModelError(
                f"the Anthropic API did not answer in time ({_describe_timeout(self.client)}) "
                f"at {_origin(exc.request.url)}",
                retryable=True,
            )
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__
            why = ""
            if cause is not None:
                detail = self._clean(str(cause)).strip()
                why = f" ({type(cause).__name__}{': ' + detail if detail else ''})"
            return ModelError(
                f"could not reach the Anthropic API at {_origin(exc.request.url)}{why}",
                retryable=True,
            )
        if isinstance(exc, anthropic.APIStatusError):
            return self._status_error(exc)
        if isinstance(exc, anthropic.APIResponseValidationError):
            return ModelError("the Anthropic API returned a reply we cannot read", retryable=True)
        if isinstance(exc, anthropic.CredentialsError):
            return ModelError(
                f"no usable Anthropic credentials ({self._clean(str(exc))}): set ANTHROPIC_API_KEY",
                retryable=False,
            )
        return ModelError(
            f"the Anthropic SDK failed: {type(exc).__name__}: {self._clean(str(exc))}",
            retryable=False,
        )

    def _status_error(self, exc: anthropic.APIStatusError) -> ModelError:
        status = exc.status_code
        headers = exc.response.headers
        etype = exc.type if isinstance(exc.type, str) else None
        code = f"{status} {etype}" if etype else str(status)
        said = self._api_message(exc)
        suffix = f" [request-id {exc.request_id}]" if exc.request_id else ""
        retry_after = parse_retry_after(headers)

        if status < 400:
            # An ``error`` event inside a streamed reply: the HTTP status was 200.
            kind = etype or "error"
            return ModelError(
                f"the Anthropic API failed mid-reply ({kind}){said}{suffix}",
                retryable=etype in _STREAM_RETRYABLE,
                retry_after=retry_after if etype in _STREAM_RETRYABLE else None,
            )

        if status == 429 and exc.error_code in _SPEND_LIMITS:
            msg = f"the Anthropic organization's spend limit is reached ({code}){said}"
            return ModelError(msg + suffix, retryable=False)

        if status == 401:
            # The API's own words are left out: nothing about the key goes in the log.
            msg = f"the Anthropic API rejected the API key ({code}): check ANTHROPIC_API_KEY"
        elif status == 403:
            msg = (
                f"the API key may not do this ({code}){said}: check the key's workspace "
                "and permissions"
            )
        elif status == 404:
            if etype is None:  # not the API's own answer: a proxy or a wrong path
                where = _origin(exc.request.url) + exc.request.url.path
                msg = f"no Anthropic Messages API at {where} ({code}): check ANTHROPIC_BASE_URL"
            else:
                msg = f"model {self.name!r} not found ({code}){said}: check OPSLOOP_MODEL"
        elif status == 413:
            msg = f"the request is too large for the Anthropic API ({code}){said}"
        elif status in (400, 422):
            msg = f"the request was rejected ({code}){said}"
        elif status == 429:
            msg = f"rate limited by the Anthropic API ({code}){said}"
        elif status == 529 or etype == "overloaded_error":
            msg = f"the Anthropic API is overloaded ({code}){said}"
        elif status >= 500:
            msg = f"the Anthropic API failed ({code}){said}"
        else:
            msg = f"the Anthropic API answered {code}{said}"

        retryable = status in (408, 409, 429) or status >= 500
        should_retry = headers.get("x-should-retry")
        if should_retry == "true":
            retryable = True
        elif should_retry == "false":
            retryable = False
        return ModelError(
            msg + suffix, retryable=retryable, retry_after=retry_after if retryable else None
        )

    def _api_message(self, exc: anthropic.APIStatusError) -> str:
        """': <the API's message, first line, at most 300 chars>', or ''."""
        text = exc.api_message if isinstance(exc.api_message, str) else None
        if text is None and isinstance(exc.body, str):
            text = exc.body  # not JSON: a proxy's page, say
        if not text or not text.strip():
            return ""
        first = self._clean(text.strip().splitlines()[0].strip())
        if len(first) > _MAX_API_MESSAGE:
            first = first[: _MAX_API_MESSAGE - 1] + "…"
        return f": {first}"

    def _clean(self, text: str) -> str:
        """``text`` without the API key (were an API or a library ever to echo it)."""
        for secret in (self.client.api_key, self.client.auth_token):
            if secret:
                text = text.replace(secret, "[redacted]")
        return _KEY_LIKE.sub("[redacted]", text)


def error_kind(exc: anthropic.AnthropicError) -> str:
    """A bounded name for what went wrong, the label of ``opsloop_model_errors_total``."""
    if isinstance(exc, anthropic.APITimeoutError):
        return "timeout"
    if isinstance(exc, anthropic.APIConnectionError):
        return "connection"
    if isinstance(exc, anthropic.APIResponseValidationError):
        return "invalid_reply"
    if isinstance(exc, anthropic.CredentialsError):
        return "auth"
    if not isinstance(exc, anthropic.APIStatusError):
        return "other"
    status = exc.status_code
    if status < 400:  # an error event inside a streamed reply
        return _STREAM_KINDS.get(exc.type or "", "other")
    if status == 429:
        return "spend_limit" if exc.error_code in _SPEND_LIMITS else "rate_limited"
    if status == 529 or exc.type == "overloaded_error":
        return "overloaded"
    by_status = {
        401: "auth",
        403: "permission",
        404: "not_found",
        408: "timeout",
        409: "conflict",
        413: "too_large",
    }
    if status in by_status:
        return by_status[status]
    if status >= 500:
        return "server"
    return "bad_request" if 400 <= status < 500 else "other"


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds, maybe a float),
    in the SDK's order; None when absent or unparsable."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw.strip()) / scale
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None


def _origin(url: Any) -> str:
    """scheme://host[:port] of ``url``, without any user info."""
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://{url.host}{port}"


def _describe_timeout(client: AsyncAnthropic) -> str:
    timeout = client.timeout
    seconds = getattr(timeout, "read", timeout)
    return f"timeout {seconds:g} s" if isinstance(seconds, int | float) else "timed out"
