"""A fake Anthropic Messages API: an aiohttp app on an ephemeral 127.0.0.1 port.

It speaks the real wire format, so the real ``anthropic`` SDK (pointed at it through
``base_url`` or ``ANTHROPIC_BASE_URL``) does its real parsing, errors and headers::

    async with FakeAnthropic() as fake:
        client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=0)
        fake.tool_use("lookup", {"name": "db"}, text="Looking it up.")
        fake.text("Found it.")
        ...
        fake.assert_clean()

Every request is checked the way the real API checks it (headers, roles, content
blocks, tool_use/tool_result pairing, tool names and schemas, cache breakpoints). A
request that breaks a rule is answered ``400 invalid_request_error`` *and* recorded in
``violations``, which ``assert_clean()`` turns into a test failure: the code under test
must never send what the real API would refuse.

Replies are scripted: ``text``, ``tool_use``, ``max_tokens_cut``, ``error`` (or any
``Reply``) queue up, and ``responder(request_json) -> Reply`` answers when the queue
is empty. Usage is deterministic (about 4 characters a token) with a small model of
prompt caching: a prefix up to a ``cache_control`` breakpoint is written to the cache,
and a later request that starts with a written prefix reads it.

A request with ``"stream": true`` gets the same scripted reply as server-sent events,
in the order and shapes the Messages API streams (``message_start``, ``ping``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta`` with the stop reason
and usage, ``message_stop``), cut harder than the API cuts: text deltas of a few UTF-16
code units (a surrogate pair's halves in two deltas), tool input JSON cut inside its
escapes, and each event's bytes written in two pieces (inside a multi-byte character or
an escape). ``Reply.gap`` waits between events; ``Reply.break_after`` ends the stream
after that many events with an ``error`` event (``break_with``, e.g.
``overloaded_error``) or, with ``break_with="disconnect"``, by dropping the connection.
``FakeAnthropic(streaming=False)`` makes a streamed request a violation, ``True`` a
plain one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import re
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from anthropic.types import (
    TextBlockParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
)
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming

from tests.support.servers import serve

FAKE_API_KEY = "test-key"

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_CACHE_BREAKPOINTS = 4

# The fields the API knows, taken from the SDK's request types: anything else is
# "Extra inputs are not permitted", as the real API answers.
_BODY_KEYS = frozenset(
    MessageCreateParamsNonStreaming.__required_keys__
    | MessageCreateParamsNonStreaming.__optional_keys__
)
_TOOL_KEYS = frozenset(ToolParam.__required_keys__ | ToolParam.__optional_keys__)
_BLOCK_KEYS = {
    "text": frozenset(TextBlockParam.__required_keys__ | TextBlockParam.__optional_keys__),
    "tool_use": frozenset(
        ToolUseBlockParam.__required_keys__ | ToolUseBlockParam.__optional_keys__
    ),
    "tool_result": frozenset(
        ToolResultBlockParam.__required_keys__ | ToolResultBlockParam.__optional_keys__
    ),
}
_USER_BLOCKS = {"text", "image", "document", "search_result", "tool_result"}
_ASSISTANT_BLOCKS = {"text", "tool_use", "thinking", "redacted_thinking"}
_RESULT_INNER_BLOCKS = {"text", "image", "document", "search_result"}
_TOOL_CHOICES = {"auto", "any", "tool", "none"}


@dataclass
class Reply:
    """One scripted answer. ``status`` 200: a message; otherwise an API error."""

    status: int = 200
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str | None = "end_turn"
    error_type: str = ""
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering (timeouts)
    usage: dict[str, int] | None = None  # overrides the computed usage
    details: dict[str, Any] | None = None  # error.details, e.g. {"error_code": ...}
    raw: str | None = None  # an error body that is not the API's JSON (a proxy's page)
    # Streamed replies only: seconds between events, and a stream that fails after
    # ``break_after`` events with an ``error`` event of type ``break_with`` (or
    # ``"disconnect"``: the connection is dropped).
    gap: float = 0.0
    break_after: int | None = None
    break_with: str = "overloaded_error"

    @classmethod
    def text(cls, text: str, *, stop_reason: str = "end_turn", delay: float = 0.0) -> Reply:
        return cls(content=[{"type": "text", "text": text}], stop_reason=stop_reason, delay=delay)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: dict[str, Any],
        *,
        text: str = "",
        id: str | None = None,
        stop_reason: str = "tool_use",
        delay: float = 0.0,
    ) -> Reply:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content.append({"type": "tool_use", "id": id, "name": name, "input": input})
        return cls(content=content, stop_reason=stop_reason, delay=delay)

    @classmethod
    def error(
        cls,
        status: int,
        type: str,
        message: str,
        *,
        retry_after: float | str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
        raw: str | None = None,
        delay: float = 0.0,
    ) -> Reply:
        hdrs = dict(headers or {})
        if retry_after is not None:
            hdrs["retry-after"] = str(retry_after)
        return cls(
            status=status,
            error_type=type,
            message=message,
            headers=hdrs,
            details=details,
            raw=raw,
            delay=delay,
        )


Responder = Callable[[dict[str, Any]], Reply]


class FakeAnthropic:
    """``async with FakeAnthropic() as fake``: ``fake.url`` is the base URL to use."""

    def __init__(
        self,
        *,
        api_key: str = FAKE_API_KEY,
        models: Collection[str] | None = None,
        min_cache_tokens: int = 0,
        streaming: bool | None = None,
    ) -> None:
        """``streaming``: None takes plain and streamed requests; False makes a streamed
        request a violation, True a plain one (for tests that assert which was made)."""
        self.api_key = api_key
        self.streaming = streaming
        # time.time() when each streamed reply's first text delta was written.
        self.text_started: list[float] = []
        self.models = None if models is None else frozenset(models)  # None: any model
        self.min_cache_tokens = min_cache_tokens
        self.url = ""
        self.requests: list[dict[str, Any]] = []  # every request body received, in order
        self.request_headers: list[dict[str, str]] = []
        self.responses: list[tuple[int, dict[str, Any]]] = []  # (status, body) answered
        self.violations: list[str] = []
        self.model_lookups: list[str] = []  # GET /v1/models/{id}, in order
        self.responder: Responder | None = None
        self._queue: deque[Reply | Responder] = deque()
        self._cache: set[str] = set()
        self._ids = 0
        self._runner: web.AppRunner | None = None

    # --- scripting --------------------------------------------------------------------

    def reply(self, reply: Reply | Responder) -> FakeAnthropic:
        """Queue a reply (or a function of the request that makes one)."""
        self._queue.append(reply)
        return self

    def text(self, text: str, **kw: Any) -> FakeAnthropic:
        return self.reply(Reply.text(text, **kw))

    def tool_use(
        self, name: str, input: dict[str, Any], text: str = "", id: str | None = None, **kw: Any
    ) -> FakeAnthropic:
        return self.reply(Reply.tool_use(name, input, text=text, id=id, **kw))

    def max_tokens_cut(
        self, name: str, partial_input: dict[str, Any] | None = None, text: str = ""
    ) -> FakeAnthropic:
        """A tool call the API cut off at max_tokens: its input is partial."""
        return self.reply(
            Reply.tool_use(name, partial_input or {}, text=text, stop_reason="max_tokens")
        )

    def error(
        self, status: int, type: str, message: str, retry_after: float | str | None = None, **kw
    ) -> FakeAnthropic:
        return self.reply(Reply.error(status, type, message, retry_after=retry_after, **kw))

    @property
    def pending(self) -> int:
        """Queued replies not yet used."""
        return len(self._queue)

    @property
    def last_request(self) -> dict[str, Any]:
        return self.requests[-1]

    def assert_clean(self, *, all_replies_used: bool = True) -> None:
        """Fail if any request broke the API's rules (or a scripted reply went unused)."""
        assert not self.violations, "requests the real API would refuse:\n" + "\n".join(
            self.violations
        )
        if all_replies_used:
            assert not self._queue, f"{len(self._queue)} scripted replies were never requested"

    # --- server -----------------------------------------------------------------------

    async def __aenter__(self) -> FakeAnthropic:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models/{model_id}", self._model)
        app.router.add_route("*", "/{tail:.*}", self._unknown_path)
        # handler_cancellation: a client that gave up (a timeout) cancels the handler.
        self._runner, port = await serve(app, handler_cancellation=True, shutdown_timeout=1.0)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (``client.models.retrieve``): the cheap call that
        ``opsloop doctor`` checks the key with; a model outside ``models`` is 404."""
        model_id = request.match_info["model_id"]
        self.model_lookups.append(model_id)
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization", "")
        if key is None and bearer.lower().startswith("bearer "):  # as _messages reads it
            key = bearer[len("bearer ") :].strip()
        if key != self.api_key:
            return self._error(401, "authentication_error", "invalid x-api-key")
        if self.models is not None and model_id not in self.models:
            return self._error(404, "not_found_error", f"model: {model_id}")
        info = {
            "type": "model",
            "id": model_id,
            "display_name": model_id,
            "created_at": "2025-01-01T00:00:00Z",
            "lifecycle": "active",
        }
        return web.json_response(info, headers={"request-id": self._next_id("req")})

    async def _unknown_path(self, request: web.Request) -> web.Response:
        self.violations.append(f"{request.method} {request.path}: no such endpoint")
        return self._error(404, "not_found_error", f"Not found: {request.path}")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        n = len(self.requests) + 1
        raw = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(
            body if isinstance(body, dict) else {"_raw": raw.decode(errors="replace")}
        )
        self.request_headers.append(headers)

        key = headers.get("x-api-key")
        bearer = headers.get("authorization", "")
        if key is None and bearer.lower().startswith("bearer "):
            key = bearer[len("bearer ") :].strip()
        if not key:
            self.violations.append(f"request {n}: no x-api-key or Authorization header")
            return self._error(401, "authentication_error", "x-api-key header is required")
        if key != self.api_key:
            return self._error(401, "authentication_error", "invalid x-api-key")

        problems = check_headers(headers)
        if not isinstance(body, dict):
            problems.append("the request body must be a JSON object")
        else:
            problems += check_request(body)
            streamed = body.get("stream") is True
            if self.streaming is False and streamed:
                problems.append("stream: this test expects a plain (not streamed) request")
            elif self.streaming is True and not streamed:
                problems.append("stream: this test expects a streamed request")
        if problems:
            self.violations += [f"request {n}: {p}" for p in problems]
            return self._error(400, "invalid_request_error", problems[0])

        if self.models is not None and body["model"] not in self.models:
            return self._error(404, "not_found_error", f"model: {body['model']}")

        reply = self._next_reply(body, n)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            if reply.raw is not None:
                self.responses.append((reply.status, {"_raw": reply.raw}))
                return web.Response(
                    status=reply.status,
                    text=reply.raw,
                    content_type="text/html",
                    headers={**reply.headers},
                )
            return self._error(
                reply.status, reply.error_type, reply.message, reply.headers, reply.details
            )
        if body.get("stream") is True:
            return await self._stream(request, body, reply)
        return self._message(body, reply)

    def _next_reply(self, body: dict[str, Any], n: int) -> Reply:
        item: Reply | Responder | None = None
        if self._queue:
            item = self._queue.popleft()
        elif self.responder is not None:
            item = self.responder
        if item is None:
            self.violations.append(f"request {n}: no reply was scripted for it")
            return Reply.error(500, "api_error", "the fake has no reply scripted")
        return item(body) if callable(item) else item

    def _next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}_fake{self._ids:06d}"

    def _message(self, body: dict[str, Any], reply: Reply) -> web.Response:
        payload = self._payload(body, reply)
        return web.json_response(payload, headers={"request-id": self._next_id("req")})

    def _payload(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The whole message answering ``body`` (recorded in ``responses``)."""
        content = []
        for block in reply.content:
            block = dict(block)
            if block.get("type") == "tool_use" and not block.get("id"):
                block["id"] = self._next_id("toolu")
            content.append(block)
        usage = reply.usage or {
            **self._input_usage(body),
            "output_tokens": max(1, len(json.dumps(content)) // 4),
        }
        payload = {
            "id": self._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        self.responses.append((200, payload))
        return payload

    async def _stream(
        self, request: web.Request, body: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        """``reply`` as the Messages API streams it (server-sent events)."""
        message = self._payload(body, reply)
        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                "request-id": self._next_id("req"),
            }
        )
        await response.prepare(request)
        texts = 0  # text deltas written
        for n, (name, data) in enumerate(stream_events(message)):
            if reply.break_after is not None and n >= reply.break_after:
                if reply.break_with == "disconnect":
                    assert request.transport is not None
                    request.transport.close()  # no final chunk: the body is cut short
                    return response
                error = {"type": reply.break_with, "message": "the fake broke the stream"}
                await response.write(sse("error", {"type": "error", "error": error}))
                break
            if name == "content_block_delta" and data["delta"]["type"] == "text_delta":
                texts += 1
                if texts == 1:  # stamped as it leaves, before the client can have it
                    self.text_started.append(time.time())
            for piece in _cut(sse(name, data)):
                await response.write(piece)
            if reply.gap:
                await asyncio.sleep(reply.gap)
        await response.write_eof()
        return response

    def _error(
        self,
        status: int,
        etype: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> web.Response:
        error: dict[str, Any] = {"type": etype, "message": message}
        if details is not None:
            error["details"] = details
        payload = {"type": "error", "error": error}
        self.responses.append((status, payload))
        hdrs = {"request-id": self._next_id("req"), **(headers or {})}
        return web.json_response(payload, status=status, headers=hdrs)

    # --- usage and prompt caching -----------------------------------------------------

    def _input_usage(self, body: dict[str, Any]) -> dict[str, int]:
        """Tokens ~ characters / 4 over the prefix order tools, system, messages.

        Each block boundary has a prefix hash. The prefixes ending at ``cache_control``
        breakpoints are written to the cache; the longest prefix of this request found
        in the cache (at or before its last breakpoint) is read from it.
        """
        segments = _segments(body)
        digest = hashlib.sha256()
        hashes: list[str] = []
        chars: list[int] = []
        total = 0
        breakpoints: list[int] = []
        for i, (text, marked) in enumerate(segments):
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += len(text)
            chars.append(total)
            if marked:
                breakpoints.append(i)
        if body.get("cache_control") and segments:
            breakpoints.append(len(segments) - 1)  # top level: the last cacheable block
        all_tokens = max(1, total // 4)
        read = write = 0
        if breakpoints:
            last = max(breakpoints)
            hit = next((i for i in range(last, -1, -1) if hashes[i] in self._cache), None)
            if hit is not None:
                read = chars[hit] // 4
            if (hit is None or hit < last) and chars[last] // 4 >= self.min_cache_tokens:
                write = chars[last] // 4 - read
                self._cache.update(hashes[i] for i in breakpoints)
        return {
            "input_tokens": all_tokens - read - write,
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read,
        }


def _strip_cache_control(block: Any) -> Any:
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def _segments(body: dict[str, Any]) -> list[tuple[str, bool]]:
    """(canonical text, has a breakpoint) for every cacheable block, in prefix order."""
    out: list[tuple[str, bool]] = []

    def add(where: str, block: Any) -> None:
        marked = isinstance(block, dict) and "cache_control" in block
        canon = json.dumps(_strip_cache_control(block), sort_keys=True, ensure_ascii=False)
        out.append((f"{where}|{canon}\n", marked))

    for tool in body.get("tools") or []:
        add("tool", tool)
    system = body.get("system")
    if isinstance(system, str):
        add("system", system)
    elif isinstance(system, list):
        for block in system:
            add("system", block)
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        if isinstance(content, str):
            add(f"{i}:{message.get('role')}", content)
        else:
            for block in content or []:
                add(f"{i}:{message.get('role')}", block)
    return out


# --- streaming ---------------------------------------------------------------------------


def stream_events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events the Messages API streams for ``message``, in its order."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    yield (
        "message_start",
        {
            "type": "message_start",
            "message": {**start, "usage": {**usage, "output_tokens": 1}},
        },
    )
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield _block_start(index, {"type": "text", "text": ""})
            for piece in text_pieces(block["text"]):
                yield _delta(index, {"type": "text_delta", "text": piece})
        else:
            yield _block_start(index, {**block, "input": {}})
            yield _delta(index, {"type": "input_json_delta", "partial_json": ""})
            for piece in json_pieces(json.dumps(block["input"])):
                yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
        if index == 0:
            yield "ping", {"type": "ping"}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": block,
    }


def _delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def text_pieces(text: str, size: int = 3) -> list[str]:
    """``text`` in pieces of ``size`` UTF-16 code units at most, also cut after every
    quote, backslash and newline: a character outside the BMP is two halves, and a cut
    may fall between them (harsher than the API, which keeps characters whole)."""
    units = "".join(c if ord(c) <= 0xFFFF else _halves(ord(c) - 0x10000) for c in text)
    pieces, start = [], 0
    for i, c in enumerate(units, 1):
        if i - start >= size or c in '"\\\n':
            pieces.append(units[start:i])
            start = i
    if start < len(units):
        pieces.append(units[start:])
    return pieces


def _halves(offset: int) -> str:
    """A character outside the BMP (``offset`` past U+10000) as its two UTF-16 halves."""
    return chr(0xD800 + (offset >> 10)) + chr(0xDC00 + (offset & 0x3FF))


def json_pieces(raw: str, size: int = 4) -> list[str]:
    """``raw`` JSON cut every ``size`` characters and inside every escape (just after its
    backslash, or two characters in: inside a ``\\uXXXX``), as the API's ``partial_json``
    may be."""
    cuts = set(range(size, len(raw), size))
    escapes = [i for i, c in enumerate(raw) if c == "\\" and (i == 0 or raw[i - 1] != "\\")]
    for n, i in enumerate(escapes):
        cuts.add(i + 1 if n % 2 else i + 3)  # after the backslash, or two characters in
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(raw)), len(raw)]
    return [raw[a:b] for a, b in itertools.pairwise(bounds) if a < b]


def sse(name: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: UTF-8 as the API writes it, escaped only where UTF-8
    cannot hold the text (a surrogate pair's half)."""
    try:
        line = json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        line = json.dumps(data).encode()
    return b"event: " + name.encode() + b"\ndata: " + line + b"\n\n"


def _cut(event: bytes) -> list[bytes]:
    """``event`` in two writes, cut inside a multi-byte character or an escape if it has
    one (where a reader that decodes each read on its own would break)."""
    at = next((i + 1 for i, b in enumerate(event) if b >= 0xC0 or b == 0x5C), len(event) // 2)
    return [event[:at], event[at:]] if 0 < at < len(event) else [event]


# --- the checks the real API makes ------------------------------------------------------


def check_headers(headers: dict[str, str]) -> list[str]:
    problems = []
    if not headers.get("anthropic-version"):
        problems.append("anthropic-version: header is required")
    if not headers.get("content-type", "").startswith("application/json"):
        problems.append("content-type: must be application/json")
    return problems


def check_request(body: dict[str, Any]) -> list[str]:
    """Every reason the real Messages API would answer 400 to ``body`` (empty: fine)."""
    p: list[str] = []
    for key in sorted(set(body) - _BODY_KEYS):
        p.append(f"{key}: Extra inputs are not permitted")
    if not isinstance(body.get("model"), str) or not body.get("model"):
        p.append("model: Field required")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        p.append("max_tokens: Field required")
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        p.append(f"max_tokens: must be a positive integer, not {max_tokens!r}")
    if "stream" in body and not isinstance(body["stream"], bool):
        p.append("stream: Input should be a valid boolean")
    p += _check_system(body.get("system"))
    names, tool_problems = _check_tools(body.get("tools"))
    p += tool_problems
    p += _check_tool_choice(body.get("tool_choice"), names, "tools" in body)
    p += _check_messages(body.get("messages"))
    p += _check_cache_breakpoints(body)
    return p


def _check_cache_control(where: str, block: Any) -> list[str]:
    if not isinstance(block, dict) or "cache_control" not in block:
        return []
    cc = block["cache_control"]
    if cc is None:
        return []
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        return [f"{where}.cache_control: type must be 'ephemeral'"]
    if set(cc) - {"type", "ttl"}:
        return [f"{where}.cache_control: Extra inputs are not permitted"]
    if "ttl" in cc and cc["ttl"] not in ("5m", "1h"):
        return [f"{where}.cache_control.ttl: must be '5m' or '1h'"]
    return []


def _check_text_block(where: str, block: dict[str, Any]) -> list[str]:
    p = _extra_keys(where, block, _BLOCK_KEYS["text"])
    text = block.get("text")
    if not isinstance(text, str):
        p.append(f"{where}.text: Field required")
    elif not text:
        p.append(f"{where}: text content blocks must be non-empty")
    elif not text.strip():
        p.append(f"{where}: text content blocks must contain non-whitespace text")
    return p + _check_cache_control(where, block)


def _extra_keys(where: str, block: dict[str, Any], known: frozenset[str]) -> list[str]:
    return [f"{where}.{k}: Extra inputs are not permitted" for k in sorted(set(block) - known)]


def _check_system(system: Any) -> list[str]:
    if system is None or isinstance(system, str):
        return []
    if not isinstance(system, list):
        return ["system: Input should be a valid string or a list of text blocks"]
    p: list[str] = []
    for i, block in enumerate(system):
        where = f"system.{i}"
        if not isinstance(block, dict) or block.get("type") != "text":
            p.append(f"{where}: system blocks must be of type 'text'")
        else:
            p += _check_text_block(where, block)
    return p


def _check_tools(tools: Any) -> tuple[set[str], list[str]]:
    if tools is None:
        return set(), []
    if not isinstance(tools, list):
        return set(), ["tools: Input should be a valid list"]
    p: list[str] = []
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            p.append(f"{where}: Input should be an object")
            continue
        if tool.get("type", "custom") != "custom":
            p.append(f"{where}.type: the fake knows only custom tools, not {tool.get('type')!r}")
        p += _extra_keys(where, tool, _TOOL_KEYS)
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            p.append(f"{where}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
        elif name in names:
            p.append(f"tools: Tool names must be unique (duplicate {name!r})")
        else:
            names.add(name)
        if "description" in tool and not isinstance(tool["description"], str):
            p.append(f"{where}.custom.description: Input should be a valid string")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            p.append(f"{where}.custom.input_schema: Field required")
        elif schema.get("type") != "object":
            p.append(f"{where}.custom.input_schema.type: Input should be 'object'")
        elif "properties" in schema and not isinstance(schema["properties"], dict):
            p.append(f"{where}.custom.input_schema.properties: Input should be an object")
        p += _check_cache_control(where, tool)
    return names, p


def _check_tool_choice(choice: Any, names: set[str], has_tools: bool) -> list[str]:
    if choice is None:
        return []
    if not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES:
        return [f"tool_choice: type must be one of {sorted(_TOOL_CHOICES)}"]
    p: list[str] = []
    if not has_tools and choice["type"] != "none":
        p.append("tool_choice: may only be specified while providing tools")
    if choice["type"] == "tool" and choice.get("name") not in names:
        p.append(f"tool_choice.name: no tool named {choice.get('name')!r}")
    dptu = choice.get("disable_parallel_tool_use")
    if dptu is not None and not isinstance(dptu, bool):
        p.append("tool_choice.disable_parallel_tool_use: Input should be a valid boolean")
    known = {"type", "name", "disable_parallel_tool_use"}
    p += [f"tool_choice.{k}: Extra inputs are not permitted" for k in sorted(set(choice) - known)]
    return p


def _check_messages(messages: Any) -> list[str]:
    if not isinstance(messages, list):
        return ["messages: Field required"]
    if not messages:
        return ["messages: at least one message is required"]
    p: list[str] = []
    seen_ids: set[Any] = set()
    prev_role: str | None = None
    prev_uses: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict):
            p.append(f"{where}: Input should be an object")
            prev_role, prev_uses = None, []
            continue
        p += _extra_keys(where, message, frozenset({"role", "content"}))
        role = message.get("role")
        if role not in ("user", "assistant"):
            p.append(f"{where}.role: must be 'user' or 'assistant' (the fake has no {role!r})")
        if i == 0 and role != "user":
            p.append('messages: first message must use the "user" role')
        if prev_role is not None and role == prev_role:
            p.append(
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row (at {where})'
            )
        content = message.get("content")
        blocks: list[Any]
        if isinstance(content, str):
            if not content:
                p.append(f"{where}: text content blocks must be non-empty")
            blocks = []
        elif isinstance(content, list):
            if not content:
                p.append(f"{where}: all messages must have non-empty content")
            blocks = content
        else:
            p.append(f"{where}.content: Field required")
            blocks = []
        allowed = _ASSISTANT_BLOCKS if role == "assistant" else _USER_BLOCKS
        for j, block in enumerate(blocks):
            p += _check_block(f"{where}.content.{j}", block, allowed)

        # tool_use / tool_result pairing
        results = [
            (j, b)
            for j, b in enumerate(blocks)
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if prev_uses:
            answered = set()
            leading = True
            for j, block in enumerate(blocks):
                is_result = isinstance(block, dict) and block.get("type") == "tool_result"
                if is_result and not leading:
                    p.append(
                        f"{where}.content.{j}: tool_result blocks must come first in the "
                        "content of the user message that answers a tool_use"
                    )
                if not is_result:
                    leading = False
                elif block.get("tool_use_id") in answered:
                    p.append(
                        f"{where}.content.{j}: duplicate tool_result for {block['tool_use_id']}"
                    )
                elif is_result:
                    answered.add(block.get("tool_use_id"))
            missing = [u for u in prev_uses if u not in answered]
            if role != "user" or missing:
                ids = ", ".join(missing or prev_uses)
                p.append(
                    f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {ids}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message."
                )
        for j, block in results:
            if block.get("tool_use_id") not in prev_uses:
                p.append(
                    f"{where}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
        uses = [
            b.get("id")
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "tool_use" and role == "assistant"
        ]
        for use_id in uses:
            if use_id in seen_ids:
                p.append(f"{where}: `tool_use` ids must be unique ({use_id} is repeated)")
            seen_ids.add(use_id)
        prev_role, prev_uses = role, [u for u in uses if isinstance(u, str)]
    if prev_uses:
        p.append(
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {', '.join(prev_uses)}. Each `tool_use` block must "
            "have a corresponding `tool_result` block in the next message."
        )
    if isinstance(messages[-1], dict) and messages[-1].get("role") != "user":
        p.append("messages: the last message must be from the user (no assistant prefill here)")
    return p


def _check_block(where: str, block: Any, allowed: set[str]) -> list[str]:
    if not isinstance(block, dict):
        return [f"{where}: Input should be an object"]
    btype = block.get("type")
    if btype not in allowed:
        return [
            f"{where}: Input tag {btype!r} found using 'type' does not match any of the "
            f"expected tags: {', '.join(sorted(allowed))}"
        ]
    if btype == "text":
        return _check_text_block(where, block)
    if btype == "image":
        return _check_image_block(where, block)
    if btype == "tool_use":
        p = _extra_keys(where, block, _BLOCK_KEYS["tool_use"])
        if not isinstance(block.get("id"), str) or not TOOL_USE_ID.match(block["id"]):
            p.append(f"{where}.id: String should match pattern '^[a-zA-Z0-9_-]+$'")
        if not isinstance(block.get("name"), str) or not TOOL_NAME.match(block["name"]):
            p.append(f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
        if not isinstance(block.get("input"), dict):
            p.append(f"{where}.input: Input should be a valid dictionary")
        return p + _check_cache_control(where, block)
    if btype == "tool_result":
        p = _extra_keys(where, block, _BLOCK_KEYS["tool_result"])
        if not isinstance(block.get("tool_use_id"), str):
            p.append(f"{where}.tool_use_id: Field required")
        if "is_error" in block and not isinstance(block["is_error"], bool):
            p.append(f"{where}.is_error: Input should be a valid boolean")
        content = block.get("content")
        if isinstance(content, list):
            for k, inner in enumerate(content):
                p += _check_block(f"{where}.content.{k}", inner, _RESULT_INNER_BLOCKS)
        elif content is not None and not isinstance(content, str):
            p.append(f"{where}.content: Input should be a string or a list of blocks")
        return p + _check_cache_control(where, block)
    return _check_cache_control(where, block)


_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the API's bound on one image


def _check_image_block(where: str, block: dict[str, Any]) -> list[str]:
    """A base64 image as the API takes it: a known media type, data that decodes."""
    p = _extra_keys(where, block, frozenset({"type", "source", "cache_control"}))
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        return [*p, f"{where}.source: Input should be a base64 image source"]
    p += _extra_keys(f"{where}.source", source, frozenset({"type", "media_type", "data"}))
    if source.get("media_type") not in _IMAGE_TYPES:
        p.append(f"{where}.source.media_type: Input should be {', '.join(_IMAGE_TYPES)}")
    try:
        data = base64.b64decode(str(source.get("data")), validate=True)
    except ValueError:
        return [*p, f"{where}.source.data: The image data is not valid base64"]
    if len(data) > _MAX_IMAGE_BYTES:
        p.append(f"{where}.source.data: image exceeds 5 MB maximum")
    return p + _check_cache_control(where, block)


def _check_cache_breakpoints(body: dict[str, Any]) -> list[str]:
    count = 1 if body.get("cache_control") else 0
    system = body.get("system")
    blocks: list[Any] = [*(system if isinstance(system, list) else [])]
    blocks += [t for t in body.get("tools") or [] if isinstance(t, dict)]
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            blocks.append(block)
            inner = block.get("content") if isinstance(block, dict) else None
            blocks += inner if isinstance(inner, list) else []
    count += sum(1 for b in blocks if isinstance(b, dict) and b.get("cache_control"))
    if count > MAX_CACHE_BREAKPOINTS:
        return [
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {count}."
        ]
    return []
