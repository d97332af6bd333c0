"""Time limits on reading a request: a slow sender is closed, not held.

aiohttp waits for a request's head and body as long as the client keeps the connection
open (its keep-alive timer, 3630 s by default, is the only bound and it has no header
timeout), so a client sending a byte every few seconds holds a connection, a file
descriptor and, during the body, a handler, without any secret. :func:`limited_runner`
serves an app under ``HttpSettings`` (``OPSLOOP_HEADER_TIMEOUT_SECONDS``,
``OPSLOOP_BODY_TIMEOUT_SECONDS``):

- the request line and headers must be complete within ``header_timeout_s`` of the
  connection opening or of the previous answer: aiohttp's keep-alive timer, set to it,
  closes a connection still waiting for a whole head (an idle one as well);
- the body must be complete within ``body_timeout_s`` of the handler starting (right
  after the headers): the read then raises :class:`BodyTooSlow`, answered 408 and the
  connection closed; aiohttp's lingering read of a body no handler read gets as long;
- a client that leaves mid-body makes the read raise the ``ConnectionResetError``
  aiohttp puts on the body stream; aiohttp would log it as an ERROR with a traceback
  ("Error handling request"), one per client: here it is one INFO line;
- a request aiohttp's parser refuses (a bad request line, header or chunk) or a body it
  cannot decode is answered 400 with one INFO line too, where aiohttp logs an ERROR
  traceback.

Each refused request is one INFO line, never a traceback. aiohttp has no setting for the
head or for the log lines, so :class:`_Connection` subclasses its ``RequestHandler`` and
reads a little of its state (``_waiter``, ``_force_close``, ``_process_keepalive``),
checked against aiohttp 3.14; ``tests/bot/test_http_limits.py`` fails if that changes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from engine.config import HttpSettings

log = logging.getLogger("opsloop.http")


class BodyTooSlow(TimeoutError):
    """The body was not complete in time (raised by the read waiting for more)."""


def limited_runner(app: web.Application, limits: HttpSettings, **kwargs: Any) -> web.AppRunner:
    """aiohttp's ``AppRunner`` for ``app`` (not yet set up: the body deadline is added
    as its outermost middleware), its connections held to ``limits``; ``kwargs`` as for
    ``AppRunner``."""
    app.middlewares.insert(0, body_deadline(limits.body_timeout_s))
    return _Runner(
        app,
        header_timeout_s=limits.header_timeout_s,
        keepalive_timeout=limits.header_timeout_s,
        lingering_time=limits.body_timeout_s,
        **kwargs,
    )


def body_deadline(timeout_s: float) -> Middleware:
    """A middleware: the body must be complete within ``timeout_s`` of the handler's
    start (408 if not); a body the client stopped sending is one INFO line."""

    @web.middleware
    async def deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = request.content
        if request.transport is None and not body.is_eof():
            # Gone before its handler started: aiohttp set no error on the body, and a
            # read would raise RuntimeError("Connection closed."), an ERROR traceback.
            return _refused(request, ConnectionResetError("Connection lost"), timeout_s)
        timer = None
        if not body.is_eof():
            timer = asyncio.get_running_loop().call_later(timeout_s, _too_slow, body)
        try:
            return await handler(request)
        except Exception as exc:
            if exc is not body.exception():  # not the body's: someone else's to handle
                raise
            return _refused(request, exc, timeout_s)
        finally:
            if timer is not None:
                timer.cancel()

    return deadline


def _too_slow(body: StreamReader) -> None:
    if not body.is_eof():  # a read waiting for more wakes up with this
        body.set_exception(BodyTooSlow())


def _refused(request: web.Request, exc: Exception, timeout_s: float) -> web.StreamResponse:
    what = f"{request.method} {request.path[:200]!r}"  # the sender's: kept short
    if isinstance(exc, BodyTooSlow):
        log.info("refused a slow request: %s: body not complete after %gs", what, timeout_s)
        response = web.json_response({"error": "request body too slow"}, status=408)
    elif isinstance(exc, ConnectionError):  # nobody is left to read an answer
        log.info("request abandoned: %s: the client left during the body", what)
        response = web.json_response({"error": "connection lost"}, status=400)
    else:  # RequestPayloadError: a body that breaks its own framing
        why = " ".join(str(exc).split())[:200]
        log.info("refused a request: %s: malformed body: %s", what, why)
        response = web.json_response({"error": "malformed body"}, status=400)
    response.force_close()
    # Over for us: aiohttp's lingering read of the rest after the answer would raise the
    # body's error again, as an ERROR traceback ("Unhandled exception").
    request.content.feed_eof()
    return response


class _Connection(RequestHandler):
    """aiohttp's connection handler, saying why it closed a connection whose head was
    late. Closing it is aiohttp's own keep-alive timer (``_process_keepalive``: a
    connection still waiting for a complete head when it fires is closed)."""

    __slots__ = ("_head_started", "_header_timeout_s", "_peer")

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._head_started = False
        self._peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")  # gone with the transport once closed
        self._peer = str(peer[0]) if isinstance(peer, tuple) else str(peer)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if data:  # b"" is aiohttp re-reading its buffer
            # While start() waits for a request, bytes that did not complete one are
            # the start of a head; body bytes arrive while no one waits.
            waiter = self._waiter
            self._head_started = waiter is not None and not waiter.done()

    def _process_keepalive(self) -> None:
        closed = self._force_close
        super()._process_keepalive()
        if self._force_close and not closed and self._head_started:
            log.info(
                "refused a slow request from %s: request line and headers not complete after %gs",
                self._peer,
                self._header_timeout_s,
            )

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp's parser refused (400: a bad request line, header or chunk)
        is the sender's error: one INFO line, where aiohttp logs an ERROR traceback."""
        if not isinstance(exc, HttpProcessingError) or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        why = " ".join(str(exc.message).split())[:200]
        # Not HTTP at all (TLS, scanners) is as common on a public port as aiohttp says.
        level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
        log.log(level, "refused a malformed request from %s: %s", self._peer, why)
        response = web.Response(status=status, text=message, content_type="text/plain")
        response.force_close()  # as aiohttp's: the parser cannot go on after an error
        return response


class _Server(web.Server):
    """aiohttp's low-level server as the app made it, making :class:`_Connection`s."""

    def __init__(self, made: web.Server, header_timeout_s: float) -> None:
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
        self.header_timeout_s = header_timeout_s

    def __call__(self) -> RequestHandler:  # as aiohttp's, with our handler class
        return _Connection(
            self, loop=self._loop, header_timeout_s=self.header_timeout_s, **self._kwargs
        )


class _Runner(web.AppRunner):
    __slots__ = ("_header_timeout_s",)

    def __init__(self, app: web.Application, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen, as usual
        return _Server(made, self._header_timeout_s)
