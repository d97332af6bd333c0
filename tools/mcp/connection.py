"""One MCP session per server, owned by a dedicated task that serves requests from a queue.

The SDK's ``Client`` and its transports are anyio context managers holding task groups:
they must be entered and left by the same task, and a transport failure cancels the
task that entered them (a crashed HTTP server cancels whoever sits inside the context).
So a worker task owns them, and callers only put requests on its queue and await
futures. A broken session marks its worker broken; the next request starts a new one
(reconnects). Foreign errors are mapped here, once: connection trouble becomes
``McpUnavailable`` (retryable), a protocol error from the server a ``ToolError``.

A tool call is the exception to "retryable": once its ``tools/call`` message has been
handed to the transport, losing the connection (or the answer timing out) means the
server may have run it, so that failure is ``OutcomeUnknown`` and a person decides.
The transport's write stream is wrapped to note, per request, that the call went out
and under which JSON-RPC ids.

A message the SDK cannot parse (a lone surrogate escape, which its JSON parser refuses;
a line that is not JSON) reaches us only as an exception on the session's message
handler (the stdio transport drops it otherwise, and the request it answered would wait
out its timeout). The request it answers fails at once as a server error; when it names
no request we can tell, every request waiting on the session fails the same way. Over
streamable HTTP the SDK itself answers such a response with a parse error.

Log lines name the thread whose call they are about, or none: the worker outlives the
call that started it, so it starts in a context of its own (it would otherwise keep the
log fields that call bound, and name that thread in every later line); what goes wrong
with one request is noted on it and logged by the task that made the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, PARSE_ERROR, REQUEST_TIMEOUT
from pydantic import ValidationError

from tools.errors import OutcomeUnknown, ToolError
from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig
from tools.mcp.errors import McpUnavailable

log = logging.getLogger(__name__)

Op = Callable[[Client], Awaitable[Any]]

# The SDK's own defaults for MCP over HTTP: the read timeout is long because a server
# may hold a response stream open (mcp/shared/_httpx_utils.py).
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_CLOSE_TIMEOUT_S = 10.0  # stdio shutdown alone may take 2 s grace + 2 s SIGTERM + 2 s SIGKILL
_CLIENT_INFO = types.Implementation(name="opsloop", version="1")


@dataclass(eq=False)
class _Request:
    op: Op
    future: asyncio.Future[Any]
    call: str | None = None  # the server's tool name when this request runs a tool
    sent: bool = False  # its tools/call message was handed to the transport
    scope: anyio.CancelScope | None = None
    rpc_ids: set[types.RequestId] = field(default_factory=set)  # of the requests it sent
    warnings: list[tuple[Any, ...]] = field(default_factory=list)  # for the caller to log

    def warn(self, msg: str, *args: Any) -> None:
        """Note a warning about this request; ``McpConnection.request`` logs it in the
        caller's task, so it carries the caller's thread."""
        self.warnings.append((msg, *args))


# The request the current task is serving: the SDK writes a request in the task that
# sends it (JSONRPCDispatcher.send_raw_request), so the write stream can tell whose it is.
_serving: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "mcp_serving", default=None
)


@dataclass(eq=False)
class _Worker:
    queue: asyncio.Queue[_Request | None]
    ready: asyncio.Future[None]
    task: asyncio.Task[None] | None = None
    broken: bool = False
    inflight: set[_Request] = field(default_factory=set)

    def stop(self) -> None:
        self.broken = True
        self.queue.put_nowait(None)


class McpConnection:
    """Requests to one MCP server over one session, reconnecting after a failure."""

    def __init__(
        self, name: str, server: McpServerConfig, *, connect_timeout_s: float = CONNECT_TIMEOUT_S
    ) -> None:
        self.name = name
        self.server = server
        self.connect_timeout_s = connect_timeout_s
        self._current: _Worker | None = None
        self._workers: set[_Worker] = set()
        self._lock = asyncio.Lock()
        self._closed = False

    async def request(self, op: Op, *, call: str | None = None) -> Any:
        """Run ``op(client)`` on the session (connecting first when there is none).

        ``call`` names the server tool when ``op`` runs it: a failure after its
        ``tools/call`` went out is then ``OutcomeUnknown``, not ``McpUnavailable``.
        """
        worker = await self._connected()
        req = _Request(op, asyncio.get_running_loop().create_future(), call=call)
        worker.queue.put_nowait(req)
        try:
            return await req.future
        except asyncio.CancelledError:
            # The caller gave up (the engine's tool timeout): stop the request too.
            if req.scope is not None:
                req.scope.cancel()
            raise
        finally:
            for warning in req.warnings:
                log.warning(*warning)

    async def close(self) -> None:
        """End every session (and subprocess); safe to call twice."""
        self._closed = True
        workers, self._workers, self._current = list(self._workers), set(), None
        for worker in workers:
            if not worker.broken:
                worker.stop()
        for worker in workers:
            await self._join(worker)

    async def _connected(self) -> _Worker:
        async with self._lock:
            if self._closed:
                raise McpUnavailable(f"MCP server {self.name!r} is closed")
            worker = self._current
            if worker is None or worker.broken:
                worker = await self._start()
            return worker

    async def _start(self) -> _Worker:
        loop = asyncio.get_running_loop()
        worker = _Worker(queue=asyncio.Queue(), ready=loop.create_future())
        # A fresh context: the worker serves every later caller, not the one starting it.
        worker.task = asyncio.create_task(
            self._run(worker), name=f"mcp:{self.name}", context=contextvars.Context()
        )
        self._workers.add(worker)
        worker.task.add_done_callback(lambda _: self._workers.discard(worker))
        self._current = worker
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await asyncio.shield(worker.ready)
        except TimeoutError:
            worker.broken = True
            worker.task.cancel()
            await self._join(worker)
            raise McpUnavailable(
                f"MCP server {self.name!r} did not answer within {self.connect_timeout_s:g}s"
            ) from None
        return worker

    async def _join(self, worker: _Worker) -> None:
        assert worker.task is not None
        try:
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await asyncio.shield(worker.task)
        except TimeoutError:
            worker.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.task
        except asyncio.CancelledError:
            if not worker.task.cancelled():
                raise

    async def _run(self, worker: _Worker) -> None:
        """The worker: enter the session, serve requests, leave it, all in this task."""
        error: BaseException | None = None
        try:
            async with AsyncExitStack() as stack:
                client = await self._enter(stack, worker)
                worker.ready.set_result(None)
                async with anyio.create_task_group() as tg:
                    while (req := await worker.queue.get()) is not None:
                        tg.start_soon(self._serve, worker, client, req)
                    tg.cancel_scope.cancel()
        except Exception as exc:  # the boundary: whatever the SDK raised ends this session
            error = exc
        finally:
            worker.broken = True
            reason = self._describe(error) if error is not None else "the session was closed"
            if error is not None:
                log.warning("mcp session ended server=%s reason=%s", self.name, reason)
            if not worker.ready.done():
                worker.ready.set_exception(McpUnavailable(reason))
            pending = list(worker.inflight)
            while not worker.queue.empty():
                if (req := worker.queue.get_nowait()) is not None:
                    pending.append(req)
            for req in pending:
                if not req.future.done():
                    req.future.set_exception(self._lost(req, McpUnavailable(reason), error))

    async def _enter(self, stack: AsyncExitStack, worker: _Worker) -> Client:
        server = self.server
        if server.url is not None:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=server.plain_headers(), timeout=_HTTP_TIMEOUT)
            )
            transport: Any = streamable_http_client(server.url, http_client=http)
        else:
            assert server.command is not None
            params = StdioServerParameters(
                command=server.command, args=list(server.args), env=server.plain_env() or None
            )
            transport = stdio_client(params, errlog=_errlog())

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception):  # what the transport could not parse
                self._unreadable(worker, message)

        # No response cache: a definition check must see the server's tools as they are now.
        client = Client(
            _noting_calls_sent(transport),
            cache=None,
            client_info=_CLIENT_INFO,
            message_handler=on_message,
        )
        return await stack.enter_async_context(client)

    def _unreadable(self, worker: _Worker, exc: Exception) -> None:
        """Fail the request(s) a message the SDK could not parse may have answered."""
        message = _read_leniently(exc)
        if isinstance(message, dict) and "id" in message and message.keys() & {"result", "error"}:
            rid = message["id"]
            waiting = [
                r for r in worker.inflight if isinstance(rid, str | int) and rid in r.rpc_ids
            ]
        elif isinstance(message, dict):
            waiting = []  # a notification or a request of the server's: nobody waits on it
        else:  # not JSON: which request it answers cannot be told, so all of them fail
            waiting = [r for r in worker.inflight if r.rpc_ids]
        detail = _parse_failure(exc)
        log.warning(
            "mcp message unreadable server=%s reason=%s failed_requests=%d",
            self.name,
            detail,
            len(waiting),
        )
        for req in waiting:
            if not req.future.done():
                req.future.set_exception(self._unreadable_error(detail))
            if req.scope is not None:
                req.scope.cancel()  # it waits for an answer that has come and gone

    def _unreadable_error(self, detail: str) -> ToolError:
        text = f"MCP server {self.name!r} sent a message that could not be read ({detail})"
        return ToolError(self.server.redact(text))

    async def _serve(self, worker: _Worker, client: Client, req: _Request) -> None:
        if req.future.done():  # the caller already gave up
            return
        worker.inflight.add(req)
        _serving.set(req)  # this task serves only req (a task group task per request)
        try:
            with anyio.CancelScope() as req.scope:
                result = await req.op(client)
                if not req.future.done():
                    req.future.set_result(result)
        except Exception as exc:
            mapped = self._map(exc)
            if isinstance(mapped, McpUnavailable):
                req.warn("mcp connection lost server=%s reason=%s", self.name, mapped)
                worker.stop()
                mapped = self._lost(req, mapped, exc)
            if not req.future.done():
                req.future.set_exception(mapped)
        finally:
            worker.inflight.discard(req)
            if not req.future.done():
                # Cancelled by the session ending under it: mark the worker broken now,
                # before the caller can hand the same dying session its next request.
                worker.broken = True
                lost = McpUnavailable(f"MCP server {self.name!r}: the connection was lost")
                req.future.set_exception(self._lost(req, lost, None))

    def _lost(
        self, req: _Request, unavailable: McpUnavailable, cause: BaseException | None
    ) -> ToolError:
        """What a request gets when the session fails under it: ``unavailable`` unless
        it is a tool call that already went out, whose outcome nobody can know now."""
        if req.call is None or not req.sent:
            return unavailable
        name = self.name
        detail = str(unavailable).removeprefix(f"MCP server {name!r}: ")
        seen = (
            "did not answer the call in time" if _timed_out(cause) else "went away during the call"
        )
        req.warn("mcp call outcome unknown server=%s tool=%s reason=%s", name, req.call, detail)
        return OutcomeUnknown(
            f"MCP server {name!r} {seen} ({detail}); whether {req.call} ran is unknown"
        )

    def _map(self, exc: Exception) -> ToolError:
        name = self.name
        if isinstance(exc, ToolError):
            return exc
        if isinstance(exc, MCPError):
            if exc.code == PARSE_ERROR and exc.message.startswith("Failed to parse"):
                # The SDK's own stand-in for an answer it could not parse (HTTP transport).
                return self._unreadable_error(_parse_failure(exc.message))
            lost = exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or (
                exc.code == INVALID_REQUEST and "terminated" in str(exc).lower()
            )
            text = self.server.redact(" ".join(str(exc).split()))
            if lost:
                return McpUnavailable(f"MCP server {name!r}: {text}")
            return ToolError(f"MCP server {name!r} refused the request: {text}")
        if isinstance(exc, OSError | httpx2.TransportError | anyio.BrokenResourceError):
            return McpUnavailable(self._describe(exc))
        return ToolError(self._describe(exc))

    def _describe(self, exc: BaseException) -> str:
        leaf = _leaf(exc)
        detail = " ".join(str(leaf).split())
        text = type(leaf).__name__ + (f": {detail}" if detail else "")
        return f"MCP server {self.name!r}: {self.server.redact(text)}"


def _timed_out(cause: BaseException | None) -> bool:
    leaf = _leaf(cause) if cause is not None else None
    if isinstance(leaf, MCPError):
        return leaf.code == REQUEST_TIMEOUT
    return isinstance(leaf, TimeoutError | httpx2.TimeoutException)


def _is_tool_call(item: Any) -> bool:
    message = getattr(item, "message", None)
    return isinstance(message, types.JSONRPCRequest) and message.method == "tools/call"


class _CallNotingStream:
    """The transport's write stream; notes on the request being served that its
    ``tools/call`` went out. A write the closed stream refused did not go out."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: Any, /) -> None:
        req = _serving.get()
        message = getattr(item, "message", None)
        if req is not None and isinstance(message, types.JSONRPCRequest):
            req.rpc_ids.add(message.id)  # so that an unreadable answer finds its request
        if req is None or req.call is None or not _is_tool_call(item):
            await self._inner.send(item)
            return
        req.sent = True  # before the await: a cancelled send may still have delivered
        try:
            await self._inner.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            req.sent = False
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _CallNotingStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@asynccontextmanager
async def _noting_calls_sent(transport: Any) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield read_stream, _CallNotingStream(write_stream)


def _read_leniently(exc: Exception) -> Any:
    """The message the SDK failed to parse, read by Python's ``json`` (which takes lone
    surrogates); None when it was not JSON at all or cannot be recovered."""
    if not isinstance(exc, ValidationError):
        return None
    for error in exc.errors():
        raw = error.get("input")
        if error["type"] == "json_invalid" and isinstance(raw, str | bytes):  # the whole line
            try:
                return json.loads(raw)
            except ValueError:
                return None
        if isinstance(raw, dict) and "jsonrpc" in raw:  # valid JSON of the wrong shape
            return raw
    return None


_PYDANTIC_LINE = re.compile(r"^\s+(.+?) \[type=", re.MULTILINE)


def _parse_failure(exc: BaseException | str) -> str:
    """One short line on why a message could not be parsed, without the message itself."""
    if isinstance(exc, ValidationError) and exc.errors():
        text = str(exc.errors()[0].get("msg", ""))
    elif found := _PYDANTIC_LINE.search(str(exc)):
        text = found.group(1)
    else:
        text = (str(exc).splitlines() or [type(exc).__name__])[0]
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:200] + "…"


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _errlog() -> TextIO:
    """Where the server's stderr goes: ours, when it is a real file (not a test's buffer)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    raise RuntimeError("no stderr to hand to the MCP server process")
