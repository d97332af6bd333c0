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

Whether a failed request is lost or refused depends on where its error came from, not
on its code: the SDK raises ``MCPError`` both for an error response of the server and
for what it makes up itself (its dispatcher's "Connection closed" and "Request ...
timed out", and the HTTP transport's stand-ins for an SSE stream that ended without an
answer), and the codes overlap (-32000 and -32001 are also what TypeScript SDK servers
answer). So the wire is watched: over stdio, the error responses the read stream
delivers; over streamable HTTP, the JSON-RPC errors in the bodies the server sent
(``_AnswerNotingBody``). Only an error no server sent, of the SDK's lost kinds, means
the connection was lost; any other is the server refusing that one request, and the
session and every other request on it go on.

A streamable-HTTP request on an existing session answered with a 4xx (the server
restarted and forgot the session id: 404 from Python SDK servers, 400 from TypeScript
ones) drops the session; when no ``tools/call`` went out it is retried once on a new one.

A message the SDK cannot parse (a lone surrogate escape, which its JSON parser refuses;
a line that is not JSON) reaches us only as an exception on the session's message
handler (the stdio transport drops it otherwise, and the request it answered would wait
out its timeout). The request it answers fails at once as a server error; when it names
no request we can tell, every request waiting on the session fails the same way. Over
streamable HTTP the SDK itself answers such a response with a parse error.

A serving source learns that the server's tools may have changed
(``on_tools_changed``): from a ``notifications/tools/list_changed`` on a handshake-era
session, or from a ``subscriptions/listen`` stream the worker keeps open on a 2026-07-28
one whose server says it announces changes (reopened with backoff when it drops, and
counted as a change then: what happened meanwhile was not heard). ``on_session_ended``
says a session ended by itself (the server exited, restarted, or went away): its tools
may differ on the next one. ``up`` is whether the last exchange with the server worked.

Log lines name the thread whose call they are about, or none: the worker outlives the
call that started it, so it starts in a context of its own (it would otherwise keep the
log fields that call bound, and name that thread in every later line); what goes wrong
with one request is noted on it and logged by the task that made the request.

The client declares elicitation (form and url). A classic ``elicitation/create`` the
server sends while a tool call is in flight belongs to that call: over streamable HTTP
it arrives in the context of the request that posted the call (the SDK runs the
handler in its sender's context, so ``_serving`` names it); otherwise it is the one
tool call in flight on the session (with several, nobody can tell which asked, and it
is answered cancel). The call's caller then gets :class:`Asking` instead of a result:
the call waits, in flight, for a person; :meth:`McpConnection.resume` hands the answer
to the handler still waiting in this process and awaits the call again. A handler left
unanswered answers cancel itself after ``elicitation_timeout`` and a grace: the session
is never held open past that.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import re
import secrets
import sys
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Self, TextIO

import anyio
import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, PARSE_ERROR, REQUEST_TIMEOUT
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from tools.errors import OutcomeUnknown, ToolError
from tools.mcp.auth import (
    AuthorizationPending,
    MemoryRecords,
    OAuthRecords,
    auth_failure,
    provider,
)
from tools.mcp.config import CONNECT_TIMEOUT_S, McpServerConfig
from tools.mcp.errors import McpNotAuthorized, McpUnauthorized, McpUnavailable

log = logging.getLogger(__name__)

Op = Callable[[Client], Awaitable[Any]]

# The SDK's own defaults for MCP over HTTP: the read timeout is long because a server
# may hold a response stream open (mcp/shared/_httpx_utils.py).
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_CLOSE_TIMEOUT_S = 10.0  # stdio shutdown alone may take 2 s grace + 2 s SIGTERM + 2 s SIGKILL
_CLIENT_INFO = types.Implementation(name="opsloop", version="1")
_MAX_CHALLENGE = 500  # of a WWW-Authenticate header quoted in an error
_LISTEN_BACKOFF_S = (1.0, 60.0)  # a dropped change stream is reopened after 1, 2, 4… 60 s


@dataclass(eq=False)
class _Request:
    op: Op
    future: asyncio.Future[Any]
    call: str | None = None  # the server's tool name when this request runs a tool
    sent: bool = False  # its tools/call message was handed to the transport
    scope: anyio.CancelScope | None = None
    rpc_ids: set[types.RequestId] = field(default_factory=set)  # of the requests it sent
    warnings: list[tuple[Any, ...]] = field(default_factory=list)  # for the caller to log
    # (code, message) of each JSON-RPC error response the server itself sent it.
    answers: set[tuple[int, str]] = field(default_factory=set)
    stale_session: int | None = None  # the HTTP 4xx status a request on a session got
    retry: bool = True  # may it run again on a new session when its session is gone?
    unauthorized: str | None = None  # WWW-Authenticate of a 401 it got ("" without one)
    auth_error: BaseException | None = None  # why its OAuth (``auth:``) got no token
    # The server's elicitation/create requests of this call, for its caller to put to a
    # person (each one's handler awaits its answer).
    questions: asyncio.Queue[_Asked] = field(default_factory=asyncio.Queue)

    def warn(self, msg: str, *args: Any) -> None:
        """Note a warning about this request; ``McpConnection.request`` logs it in the
        caller's task, so it carries the caller's thread."""
        self.warnings.append((msg, *args))


@dataclass(eq=False)
class _Asked:
    """One ``elicitation/create`` of a tool call: its params, and the answer its
    handler (the SDK's elicitation callback, in the worker) awaits."""

    params: types.ElicitRequestParams
    answer: asyncio.Future[types.ElicitResult]


@dataclass(eq=False)
class _Live:
    """A question handed to a caller as :class:`Asking`, until it is answered."""

    req: _Request
    asked: _Asked
    until: float  # on the loop's clock: its handler has answered cancel by then


@dataclass(frozen=True)
class Asking:
    """What a tool call gives instead of its result while it waits, in flight, for a
    person to answer the server's question ``params``; ``ask_id`` names it for
    :meth:`McpConnection.resume` (in this process only)."""

    ask_id: str
    params: types.ElicitRequestParams


class QuestionGone(ToolError):
    """No question of that id waits in this process (it restarted, another process
    holds the session, or the session ended)."""


_ANSWER_GRACE_S = 60.0  # past the elicitation timeout, a handler answers cancel itself
_CANCEL = types.ElicitResult(action="cancel")


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
    draining: bool = False  # retired: the requests it has are let finish, not cancelled
    inflight: set[_Request] = field(default_factory=set)
    listening: anyio.CancelScope | None = None  # of its change stream, when it keeps one
    unauthorized: str | None = None  # WWW-Authenticate of a 401 it got ("" without one)
    auth_error: BaseException | None = None  # why its OAuth (``auth:``) got no token

    def stop(self) -> None:
        """End the session now, cancelling what runs on it."""
        self.broken, self.draining = True, False
        self.queue.put_nowait(None)

    def retire(self) -> None:
        """Take no new requests; end once the ones it has are done (they may still
        finish: a session the server forgot fails them by itself, and they retry)."""
        self.broken, self.draining = True, True
        if not self.inflight:
            self.queue.put_nowait(None)


class _SessionGone(McpUnavailable):
    """The server no longer knows the session; nothing of the request ran."""


class McpConnection:
    """Requests to one MCP server over one session, reconnecting after a failure."""

    def __init__(
        self,
        name: str,
        server: McpServerConfig,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        oauth: OAuthRecords | None = None,
    ) -> None:
        """``oauth``: where a server with ``auth:`` keeps its tokens (the store; in
        memory without one)."""
        self.name = name
        self.server = server
        self.oauth = oauth
        self.connect_timeout_s = connect_timeout_s
        self._current: _Worker | None = None
        self._workers: set[_Worker] = set()
        self._lock = asyncio.Lock()
        self._closed = False
        self.up = False  # did the last exchange with the server work?
        self.down_reason = "not connected yet"
        # Set by a serving source (see the module docstring); called on the worker's loop.
        self.on_tools_changed: Callable[[], None] | None = None
        self.on_session_ended: Callable[[], None] | None = None
        self._asking: dict[str, _Live] = {}  # questions handed out as Asking, by ask_id

    async def request(self, op: Op, *, call: str | None = None) -> Any:
        """Run ``op(client)`` on the session (connecting first when there is none).

        ``call`` names the server tool when ``op`` runs it: a failure after its
        ``tools/call`` went out is then ``OutcomeUnknown``, not ``McpUnavailable``.
        A request the server answered with "no such session" before any ``tools/call``
        went out runs once more, on a new session. A call whose server asks a question
        in the middle gives :class:`Asking` (see the module docstring).
        """
        try:
            return await self._request(op, call, retry=True)
        except _SessionGone:
            return await self._request(op, call, retry=False)

    async def _request(self, op: Op, call: str | None, *, retry: bool) -> Any:
        worker = await self._connected()
        req = _Request(op, asyncio.get_running_loop().create_future(), call=call, retry=retry)
        worker.queue.put_nowait(req)
        return await self._outcome(req)

    async def resume(self, ask_id: str, answer: types.ElicitResult) -> Any:
        """Hand ``answer`` to the question ``ask_id`` (an :class:`Asking` this process
        gave) and await its call again: its result, or :class:`Asking` for its next
        question. :class:`QuestionGone` when no such question waits here."""
        live = self._asking.pop(ask_id, None)
        if live is None:
            raise QuestionGone(f"MCP server {self.name!r}: the question is not waiting here")
        if not live.asked.answer.done():  # else its handler already answered cancel
            live.asked.answer.set_result(answer)
        return await self._outcome(live.req)

    async def _outcome(self, req: _Request) -> Any:
        """What ``req`` gives its caller: its result (or error), or :class:`Asking` when
        the server asks a question first."""
        try:
            got = await _first(req)
        except asyncio.CancelledError:
            # The caller gave up (the engine's tool timeout): stop the request too. Its
            # future is cancelled first, so that its end is not taken for the session's.
            req.future.cancel()
            if req.scope is not None:
                req.scope.cancel()
            raise
        finally:
            for warning in req.warnings:
                log.warning(*warning)
            req.warnings.clear()
        if not isinstance(got, _Asked):
            return got
        loop = asyncio.get_running_loop()
        now = loop.time()
        for stale in [k for k, v in self._asking.items() if v.until < now]:
            del self._asking[stale]  # answered cancel by its handler, never resumed
        ask_id = secrets.token_hex(8)
        until = now + self.server.elicitation_timeout + _ANSWER_GRACE_S
        self._asking[ask_id] = _Live(req, got, until)
        # Nobody may await it again (no answer comes): its error is not worth a log line.
        req.future.add_done_callback(_retrieved)
        return Asking(ask_id, got.params)

    async def close(self) -> None:
        """End every session (and subprocess); safe to call twice."""
        self._closed = True
        workers, self._workers, self._current = list(self._workers), set(), None
        for worker in workers:
            if not worker.broken or worker.draining:
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
            text = f"MCP server {self.name!r} did not answer within {self.connect_timeout_s:g}s"
            self.mark_down(text)
            raise McpUnavailable(text) from None
        return worker

    def mark_down(self, reason: str) -> None:
        """The server is down (so ``/metrics`` says), for ``reason``."""
        self.up, self.down_reason = False, reason

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
                self.up = True
                async with anyio.create_task_group() as tg:
                    if self.on_tools_changed is not None and _announces_changes(client):
                        tg.start_soon(self._listen, worker, client)
                    while (req := await worker.queue.get()) is not None:
                        tg.start_soon(self._serve, worker, client, req)
                    if not worker.draining:
                        tg.cancel_scope.cancel()
                    elif worker.listening is not None:
                        worker.listening.cancel()  # the stream never ends by itself
        except Exception as exc:  # the boundary: whatever the SDK raised ends this session
            error = exc
        finally:
            worker.broken = True
            reason = self._describe(error) if error is not None else "the session was closed"
            failed_auth = worker.auth_error or (auth_failure(error) if error else None)
            if failed_auth is not None:
                reason = self._auth_failed(failed_auth)
            elif worker.unauthorized is not None:
                reason = self._unauthorized(worker.unauthorized)
            opened = worker.ready.done()  # else whoever waits to connect says why not
            if error is not None:
                if opened:
                    log.warning("mcp session ended server=%s reason=%s", self.name, reason)
                self.mark_down(reason)
            if opened and not self._closed and self.on_session_ended is not None:
                self.on_session_ended()
            if not opened:
                kind: type[McpUnavailable] = McpUnavailable
                if failed_auth is not None:
                    kind = McpNotAuthorized
                elif worker.unauthorized is not None:
                    kind = McpUnauthorized
                worker.ready.set_exception(kind(reason))
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
            # A provider per session: each (re)connect reads the tokens the database has.
            oauth = None
            if server.auth is not None:
                oauth = _AuthNoting(
                    provider(self.name, server, self.oauth or MemoryRecords()), worker
                )
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=server.plain_headers(),
                    timeout=_HTTP_TIMEOUT,
                    auth=oauth,
                    event_hooks={
                        "response": [_watch_response, partial(_note_401, worker, server.url)]
                    },
                )
            )
            transport: Any = _watched(streamable_http_client(server.url, http_client=http))
        else:
            assert server.command is not None
            params = StdioServerParameters(
                command=server.command, args=list(server.args), env=server.plain_env() or None
            )
            # Everything the stdio read stream delivers was written by the server.
            transport = _watched(stdio_client(params, errlog=_errlog()), worker)

        async def on_message(message: Any) -> None:
            if isinstance(message, Exception):  # what the transport could not parse
                self._unreadable(worker, message)
            elif isinstance(message, types.ToolListChangedNotification):  # handshake era
                self._tools_changed()

        # No response cache: a definition check must see the server's tools as they are now.
        client = Client(
            transport,
            cache=None,
            client_info=_CLIENT_INFO,
            message_handler=on_message,
            elicitation_callback=partial(self._on_elicit, worker),
        )
        return await stack.enter_async_context(client)

    async def _on_elicit(
        self, worker: _Worker, context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        """The server asks a question (``elicitation/create``): hand it to the caller of
        the tool call it belongs to and await the person's answer, at most until the
        elicitation timeout and a grace have passed (then: cancel)."""
        req = _serving.get()
        if req is None or req.call is None:
            calls = [r for r in worker.inflight if r.call is not None and r.sent]
            req = calls[0] if len(calls) == 1 else None
        if req is None or req.future.done():
            log.warning(
                "mcp question answered cancel server=%s reason=%s",
                self.name,
                "it belongs to no single tool call in flight",
            )
            return _CANCEL
        asked = _Asked(params, asyncio.get_running_loop().create_future())
        req.questions.put_nowait(asked)
        try:
            async with asyncio.timeout(self.server.elicitation_timeout + _ANSWER_GRACE_S):
                return await asyncio.shield(asked.answer)
        except TimeoutError:
            log.warning("mcp question unanswered server=%s tool=%s", self.name, req.call)
            return _CANCEL
        finally:
            if not asked.answer.done():
                asked.answer.set_result(_CANCEL)  # so a late resume sees it answered

    def _tools_changed(self) -> None:
        if self.on_tools_changed is not None:
            self.on_tools_changed()

    async def _listen(self, worker: _Worker, client: Client) -> None:
        """Hear the server's tool list changes on a 2026-07-28 session, for as long as
        the session lasts: a stream that drops is reopened after a backoff, and its
        reopening counts as a change (events are not replayed)."""
        delay, reopened = _LISTEN_BACKOFF_S[0], False
        with anyio.CancelScope() as worker.listening:
            while True:
                try:
                    async with client.listen(tools_list_changed=True) as stream:
                        if reopened:
                            self._tools_changed()
                        async for _ in stream:
                            self._tools_changed()
                        delay = _LISTEN_BACKOFF_S[0]  # ended by the server, gracefully
                except Exception as exc:  # the stream only speeds things up: calls still check
                    reason = self._describe(exc)
                    log.info("mcp change stream lost server=%s reason=%s", self.name, reason)
                reopened = True
                await anyio.sleep(delay)
                delay = min(delay * 2, _LISTEN_BACKOFF_S[1])

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
            failed_auth = req.auth_error or auth_failure(exc)
            if failed_auth is not None:  # refused before it ran, as a 401 is
                mapped: ToolError = McpNotAuthorized(self._auth_failed(failed_auth))
                req.warn("mcp request unauthorized server=%s reason=%s", self.name, mapped)
                self.mark_down(str(mapped))
                worker.retire()
            elif req.unauthorized is not None:
                # Refused before it ran (so never an unknown outcome), and not a session
                # the server forgot: the next request reconnects and asks again.
                mapped = McpUnauthorized(self._unauthorized(req.unauthorized))
                req.warn("mcp request unauthorized server=%s", self.name)
                self.mark_down(str(mapped))
                worker.retire()
            elif req.stale_session is not None:
                mapped = self._session_gone(worker, req, exc)
            else:
                mapped = self._map(exc, req)
                if isinstance(mapped, McpUnavailable):
                    req.warn("mcp connection lost server=%s reason=%s", self.name, mapped)
                    self.mark_down(str(mapped))
                    worker.stop()
                    mapped = self._lost(req, mapped, exc)
            if not req.future.done():
                req.future.set_exception(mapped)
        finally:
            worker.inflight.discard(req)
            if worker.broken and not worker.inflight:
                worker.queue.put_nowait(None)  # a retired session ends with its last request
            if not req.future.done():
                # Cancelled by the session ending under it: mark the worker broken now,
                # before the caller can hand the same dying session its next request.
                worker.broken = True
                lost = McpUnavailable(f"MCP server {self.name!r}: the connection was lost")
                req.future.set_exception(self._lost(req, lost, None))

    def _session_gone(self, worker: _Worker, req: _Request, exc: Exception) -> ToolError:
        """A 4xx on an existing session: the server forgot it (a restart). The session
        is dropped; the request is retried once on a new one when nothing was run."""
        worker.retire()
        status = req.stale_session
        if req.call is not None and req.sent:
            # A 4xx answer says the request was not taken: the call did not run.
            req.warn("mcp session refused server=%s status=%s", self.name, status)
            text = self.server.redact(" ".join(str(exc).split()) or type(exc).__name__)
            return McpUnavailable(
                f"MCP server {self.name!r} refused the session (HTTP {status}: {text}); "
                f"{req.call} was not run"
            )
        if req.retry:
            req.warn("mcp session gone server=%s status=%s; retrying", self.name, status)
            return _SessionGone(f"MCP server {self.name!r} no longer knows the session")
        return self._map(exc, req)

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

    def _map(self, exc: Exception, req: _Request | None = None) -> ToolError:
        name = self.name
        if isinstance(exc, ToolError):
            return exc
        if isinstance(exc, MCPError):
            answered = req is not None and (exc.code, exc.message) in req.answers
            made_up = not answered and exc.message.startswith("Failed to parse")
            if exc.code == PARSE_ERROR and made_up:
                # The SDK's own stand-in for an answer it could not parse (HTTP transport).
                return self._unreadable_error(_parse_failure(exc.message))
            # Lost: the SDK's own failures (see the module docstring), never an answer.
            lost = not answered and (
                exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT)
                or (exc.code == INVALID_REQUEST and "terminated" in str(exc).lower())
            )
            text = self.server.redact(" ".join(str(exc).split()))
            if lost:
                return McpUnavailable(f"MCP server {name!r}: {text}")
            return ToolError(f"MCP server {name!r} refused the request: {text}")
        if isinstance(exc, OSError | httpx2.TransportError | anyio.BrokenResourceError):
            return McpUnavailable(self._describe(exc))
        return ToolError(self._describe(exc))

    def _unauthorized(self, challenge: str) -> str:
        said = f"WWW-Authenticate: {challenge}" if challenge else "no WWW-Authenticate header"
        text = f"401: this server needs authorization ({' '.join(said.split())})"
        return f"MCP server {self.name!r}: {self.server.redact(text)}"

    def _auth_failed(self, exc: BaseException) -> str:
        """One line on an OAuth flow that did not end in a token (its own words)."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, AuthorizationPending):
            text = f"OAuth: {text}"
        return f"MCP server {self.name!r}: not authorized: {self.server.redact(text)}"

    def _describe(self, exc: BaseException) -> str:
        leaf = _leaf(exc)
        detail = " ".join(str(leaf).split())
        text = type(leaf).__name__ + (f": {detail}" if detail else "")
        return f"MCP server {self.name!r}: {self.server.redact(text)}"


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _first(req: _Request) -> Any:
    """``req``'s result (or error), or the first question its server asks before it
    ends. A question still queued when the call has ended is moot: answered cancel."""
    getter = asyncio.ensure_future(req.questions.get())
    try:
        await asyncio.wait({req.future, getter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if not req.future.done():
        return getter.result()
    moot = [getter.result()] if getter.done() and not getter.cancelled() else []
    while not req.questions.empty():
        moot.append(req.questions.get_nowait())
    for asked in moot:
        if not asked.answer.done():
            asked.answer.set_result(_CANCEL)
    return req.future.result()


def _announces_changes(client: Client) -> bool:
    """Does this 2026-07-28 session's server announce tool list changes (then they come
    on a ``subscriptions/listen`` stream; a handshake-era server just sends them)?"""
    tools = client.server_capabilities.tools
    return (
        client.protocol_version in MODERN_PROTOCOL_VERSIONS
        and tools is not None
        and bool(tools.list_changed)
    )


def _timed_out(cause: BaseException | None) -> bool:
    leaf = _leaf(cause) if cause is not None else None
    if isinstance(leaf, MCPError):
        return leaf.code == REQUEST_TIMEOUT
    return isinstance(leaf, TimeoutError | httpx2.TimeoutException)


def _is_tool_call(item: Any) -> bool:
    message = getattr(item, "message", None)
    return isinstance(message, types.JSONRPCRequest) and message.method == "tools/call"


async def _note_401(worker: _Worker, url: str, response: httpx2.Response) -> None:
    """httpx response hook: a 401 from the server (or a 403 asking for a wider scope)
    means it wants authorization it did not get: the errors then say so instead of
    "unreachable", and a call so refused did not run. With ``auth:`` the OAuth provider
    answers a 401 itself, and the answer that follows clears the note. Only the MCP
    endpoint counts: not the authorization server's answers to the provider."""
    endpoint = httpx2.URL(url).copy_with(query=None, fragment=None)
    if response.request.url.copy_with(query=None, fragment=None) != endpoint:
        return
    challenge = response.headers.get("www-authenticate", "")[:_MAX_CHALLENGE]
    refused = response.status_code == 401 or (
        response.status_code == 403 and "insufficient_scope" in challenge
    )
    req = _serving.get()
    if refused:
        worker.unauthorized = challenge
        if req is not None:
            req.unauthorized = challenge
    elif response.is_success:
        worker.unauthorized = worker.auth_error = None
        if req is not None:
            req.unauthorized = None


class _AuthNoting(httpx2.Auth):
    """The OAuth provider (tools/mcp/auth.py), except that a flow that ends without a
    token ends with the server's own refusal, and why is noted on the request and the
    session (``auth_error``). Raised, the error would end the transport's task group
    and every request on the session with it; answered, the transport fails that one
    request as it fails any refused one, and our errors say why. (httpx hands on the
    last answer of a flow: when that was the authorization server's, the request goes
    once more as it is, without a token that works, so the answer is the server's.)"""

    def __init__(self, inner: httpx2.Auth, worker: _Worker) -> None:
        self._inner = inner
        self._worker = worker
        self.requires_request_body = inner.requires_request_body
        self.requires_response_body = inner.requires_response_body

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = self._inner.async_auth_flow(request)
        outgoing = request
        try:
            try:
                outgoing = await flow.__anext__()
                while True:
                    response = yield outgoing
                    outgoing = await flow.asend(response)
            except StopAsyncIteration:
                return
            except Exception as exc:
                if (found := auth_failure(exc)) is None:
                    raise
                self._worker.auth_error = found
                if (req := _serving.get()) is not None:
                    req.auth_error = found
            if outgoing is not request:
                yield request
        finally:
            await flow.aclose()


async def _watch_response(response: httpx2.Response) -> None:
    """httpx response hook, run in the task that sent the request: the transport posts
    each message in its sender's context, so ``_serving`` names our request."""
    req = _serving.get()
    if req is None:  # the standalone GET stream, the closing DELETE
        return
    if 400 <= response.status_code < 500 and response.request.headers.get("mcp-session-id"):
        req.stale_session = response.status_code
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in ("application/json", "text/event-stream"):
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        response.stream = _AnswerNotingBody(
            response.stream, req, sse=kind == "text/event-stream", encoding=encoding
        )


_MAX_NOTED = 1024 * 1024  # an error response is small; a body past this is not read for one


class _AnswerNotingBody(httpx2.AsyncByteStream):
    """A response body passed on unchanged, noting on ``req`` each JSON-RPC error
    response the server wrote in it (a JSON body, or the events of an SSE stream)."""

    def __init__(self, inner: Any, req: _Request, *, sse: bool, encoding: str) -> None:
        self._inner = inner
        self._req = req
        self._sse = sse
        self._pending = bytearray()  # the body (JSON), or the line being read (SSE)
        self._long = False  # the pending line went past _MAX_NOTED: not kept
        self._data: list[bytes] = []
        self._size = 0
        self._inflate = None if encoding == "identity" else _inflater(encoding)
        self._readable = encoding == "identity" or self._inflate is not None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._feed(chunk)
            yield chunk
        if self._readable and not self._sse:
            self._note(bytes(self._pending))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def _feed(self, chunk: bytes) -> None:
        if not self._readable:
            return
        try:
            data = self._inflate.decompress(chunk) if self._inflate is not None else chunk
        except zlib.error:
            self._readable = False
            return
        if not self._sse:
            self._pending += data
            self._readable = len(self._pending) <= _MAX_NOTED
            return
        while (cut := data.find(b"\n")) >= 0:
            self._keep(data[:cut])
            self._line(bytes(self._pending).rstrip(b"\r"), self._long)
            self._pending.clear()
            self._long, data = False, data[cut + 1 :]
        self._keep(data)

    def _keep(self, part: bytes) -> None:
        room = _MAX_NOTED - len(self._pending)
        if len(part) > room:  # keep its start (the field name), note it is too long
            self._long, part = True, part[: max(room, 0)]
        self._pending += part

    def _line(self, line: bytes, long: bool) -> None:
        if not line and not long:  # the end of an event
            if self._size <= _MAX_NOTED and self._data:
                self._note(b"\n".join(self._data))
            self._data, self._size = [], 0
        elif line.startswith(b"data:"):
            value = line[5:].removeprefix(b" ")
            self._size += _MAX_NOTED + 1 if long else len(value)
            if self._size <= _MAX_NOTED:
                self._data.append(value)

    def _note(self, body: bytes) -> None:
        try:
            message = json.loads(body)
        except ValueError:
            return
        error = message.get("error") if isinstance(message, dict) else None
        if isinstance(error, dict):
            code, text = error.get("code"), error.get("message")
            if isinstance(code, int) and isinstance(text, str):
                self._req.answers.add((code, text))


def _inflater(encoding: str) -> Any:
    """A decompressor for a gzip or deflate body; None for one we cannot read (its
    errors are then not noted: they count as the SDK's own)."""
    if encoding in ("gzip", "x-gzip", "deflate"):
        return zlib.decompressobj(zlib.MAX_WBITS | 32)  # either header
    return None


class _Delegating:
    """A transport stream wrapped to note something as messages pass; everything else
    is the wrapped stream's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._inner.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _CallNotingStream(_Delegating):
    """The transport's write stream; notes on the request being served that its
    ``tools/call`` went out. A write the closed stream refused did not go out."""

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


class _AnswerNotingStream(_Delegating):
    """The stdio transport's read stream; notes each error response on the request
    that sent its id (everything on it was written by the server)."""

    def __init__(self, inner: Any, worker: _Worker) -> None:
        super().__init__(inner)
        self._worker = worker

    def _note(self, item: Any) -> Any:
        message = getattr(item, "message", None)
        if isinstance(message, types.JSONRPCError) and message.id is not None:
            rid = str(message.id)
            for req in self._worker.inflight:
                if any(str(i) == rid for i in req.rpc_ids):
                    req.answers.add((message.error.code, message.error.message))
        return item

    def __aiter__(self) -> _AnswerNotingStream:
        return self

    async def __anext__(self) -> Any:
        return self._note(await self._inner.__anext__())

    async def receive(self) -> Any:
        return self._note(await self._inner.receive())


@asynccontextmanager
async def _watched(transport: Any, worker: _Worker | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """The transport's streams, watched: calls sent; over stdio (``worker``), answers."""
    async with transport as (read_stream, write_stream):
        reading = read_stream if worker is None else _AnswerNotingStream(read_stream, worker)
        yield reading, _CallNotingStream(write_stream)


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
