"""Slow senders (``bot.http_limits``): a request whose head or body trickles in is closed
after its time limit, a late body is answered 408, a client that leaves mid-body or
sends a broken request is one INFO line, and none of it is an ERROR or a traceback.

Clients are raw sockets (``asyncio.open_connection``) against the server ``opsloop
serve`` runs: in-process (``web_app`` under ``limited_runner``, limits of 1 s from the
settings) and, once, the real process. Nothing asserts that anything is fast: each
connection must close within a generous bound (30 s against limits of 1 s), which the
code before these limits never did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from bot.http_limits import limited_runner
from bot.runtime import start_runtime, web_app
from tests.bot.test_cli import ROOT, SECRETS, _free_port, fakes_in_a_thread
from tests.bot.test_runtime import settings_for
from tests.fakes.slack import SIGNING_SECRET, TOKEN

LIMITS = {"OPSLOOP_HEADER_TIMEOUT_SECONDS": "1", "OPSLOOP_BODY_TIMEOUT_SECONDS": "1"}
WITHIN = 30.0  # seconds a 1 s limit may take on a loaded machine
GAP = 0.25  # a trickler's pause between bytes
PADDING = 400  # bytes trickled: 100 s at GAP, far past WITHIN
HEAD = b"POST /hooks/wait-1 HTTP/1.1\r\nHost: opsloop\r\nX-Padding: " + b"a" * PADDING


def body_head(path: str) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: opsloop\r\nContent-Length: {PADDING}\r\n\r\n".encode()


async def slow_request(port: int, at_once: bytes, trickled: bytes = b"") -> bytes:
    """Send ``at_once``, then ``trickled`` a byte per ``GAP``; returns what the server
    sent until it closed the connection (a reset counts as closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        with contextlib.suppress(OSError):  # the server closed: the point of the test
            writer.write(at_once)
            for i in range(len(trickled)):
                await asyncio.sleep(GAP)
                writer.write(trickled[i : i + 1])
                await writer.drain()

    sending = asyncio.create_task(send())
    answer = b""
    try:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                answer += chunk
        return answer
    finally:
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sending
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def closed_within(*requests: asyncio.Task[bytes]) -> list[bytes]:
    return await asyncio.wait_for(asyncio.gather(*requests), WITHIN)


async def healthz(port: int) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/healthz") as resp,
    ):
        return resp.status


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name} {r.levelname} {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info
    ]


def infos(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "opsloop.http" and r.levelno == logging.INFO and text in r.getMessage()
    ]


async def logged(caplog: pytest.LogCaptureFixture, seen: Callable[[], object]) -> None:
    deadline = time.monotonic() + WITHIN
    while not seen():
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        await asyncio.sleep(0.05)


@pytest.fixture
async def served(
    sqlite_url: str, fakes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[tuple[int, web.AppRunner]]:
    """``opsloop serve``'s app on a free port, the limits at 1 s (from the settings)."""
    caplog.set_level(logging.INFO)
    settings = settings_for(
        sqlite_url, fakes, tmp_path, OPSLOOP_WEBHOOK_SECRET="hook-secret", **LIMITS
    )
    runtime = await start_runtime(settings, token=TOKEN, signing_secret=SIGNING_SECRET)
    runner = limited_runner(web_app(runtime), settings.http, access_log=None)
    try:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner.addresses[0][1], runner
    finally:
        await runner.cleanup()
        await runtime.close(5)


async def test_a_trickled_head_is_closed_while_another_connection_is_served(
    served: tuple[int, web.AppRunner], caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = served
    trickler = asyncio.create_task(slow_request(port, b"", HEAD))
    assert await healthz(port) == 200  # another connection meanwhile
    assert await closed_within(trickler) == [b""]  # closed, nothing answered
    await logged(caplog, lambda: infos(caplog, "request line and headers not complete"))
    assert tracebacks(caplog) == []


@pytest.mark.parametrize("path", ["/slack/events", "/hooks/wait-1"])
async def test_a_trickled_body_is_answered_408_and_closed(
    served: tuple[int, web.AppRunner], caplog: pytest.LogCaptureFixture, path: str
) -> None:
    port, _ = served
    [answer] = await closed_within(
        asyncio.create_task(slow_request(port, body_head(path), b"{" * PADDING))
    )
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"Connection: close" in answer
    assert infos(caplog, f"POST '{path}': body not complete after 1s")
    assert tracebacks(caplog) == []


async def test_a_client_leaving_mid_body_is_one_info_line_not_a_traceback(
    served: tuple[int, web.AppRunner], caplog: pytest.LogCaptureFixture
) -> None:
    port, _ = served
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(body_head("/slack/events") + b'{"type": ')
    await writer.drain()
    await asyncio.sleep(0.2)  # the handler is reading the body
    writer.close()
    await writer.wait_closed()
    # Either what we want or aiohttp's "Error handling request": whichever comes first.
    await logged(caplog, lambda: infos(caplog, "left during the body") or tracebacks(caplog))
    assert tracebacks(caplog) == []
    assert infos(caplog, "POST '/slack/events': the client left during the body")


@pytest.mark.parametrize(
    ("request_bytes", "said"),
    [
        (
            b"POST /hooks/wait-1 HTTP/1.1\r\nHost: o\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
            "refused a malformed request from 127.0.0.1: Invalid character in chunk size",
        ),
        (
            b"POST /slack/events HTTP/1.1\r\nHost: o\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: 9\r\n\r\nnot gzip!",
            "POST '/slack/events': malformed body: 400, message: Can not decode",
        ),
    ],
    ids=["broken-chunk", "not-gzip"],
)
async def test_a_broken_request_is_400_and_one_info_line(
    served: tuple[int, web.AppRunner],
    caplog: pytest.LogCaptureFixture,
    request_bytes: bytes,
    said: str,
) -> None:
    port, _ = served
    [answer] = await closed_within(asyncio.create_task(slow_request(port, request_bytes)))
    assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
    await logged(caplog, lambda: infos(caplog, said))
    assert tracebacks(caplog) == []


async def test_200_slow_connections_are_all_closed_and_health_keeps_answering(
    served: tuple[int, web.AppRunner], caplog: pytest.LogCaptureFixture
) -> None:
    port, runner = served
    heads = [asyncio.create_task(slow_request(port, b"", HEAD)) for _ in range(100)]
    bodies = [
        asyncio.create_task(slow_request(port, body_head(path), b"x" * PADDING))
        for path in ("/slack/events", "/hooks/wait-1") * 50
    ]
    assert await healthz(port) == 200
    answers = await closed_within(*heads, *bodies)
    assert answers[:100] == [b""] * 100
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers[100:])
    assert await healthz(port) == 200
    assert runner.server is not None
    deadline = time.monotonic() + WITHIN
    while runner.server.connections:  # the server let go of every one (its descriptors)
        assert time.monotonic() < deadline, len(runner.server.connections)
        await asyncio.sleep(0.05)
    assert len(infos(caplog, "body not complete")) == 100
    await logged(caplog, lambda: len(infos(caplog, "headers not complete")) == 100)
    assert tracebacks(caplog) == []


# --- the real process ----------------------------------------------------------------


@pytest.mark.slow
async def test_serve_closes_slow_senders_with_info_lines_and_no_traceback(
    tmp_path: Path,
) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    with fakes_in_a_thread() as (claude, slack), log.open("w") as err:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLACK_", "DATABASE_URL", "OPSLOOP_", "PORT", "ANTHROPIC_"))
        }
        env.update(
            {**SECRETS, **LIMITS},
            PYTHONPATH=str(ROOT),
            DATABASE_URL=f"sqlite:///{tmp_path / 'serve.db'}",
            ANTHROPIC_BASE_URL=claude.url,
            SLACK_API_URL=slack.url,
            OPSLOOP_WEBHOOK_SECRET="hook-secret",
            OPSLOOP_HOST="127.0.0.1",
            PORT=str(port),
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot.cli",
            "serve",
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            deadline = time.monotonic() + WITHIN
            while True:
                assert proc.returncode is None, log.read_text()
                with contextlib.suppress(OSError, aiohttp.ClientError):
                    if await healthz(port) == 200:
                        break
                assert time.monotonic() < deadline, "serve never answered /healthz"
                await asyncio.sleep(0.1)
            requests = [
                asyncio.create_task(slow_request(port, b"", HEAD)),
                asyncio.create_task(slow_request(port, body_head("/slack/events"), b"x" * PADDING)),
                asyncio.create_task(slow_request(port, body_head("/hooks/w"), b"x" * PADDING)),
                asyncio.create_task(slow_request(port, body_head("/hooks/w") + b"{")),
            ]
            await asyncio.sleep(0.2)
            requests[-1].cancel()  # this client leaves mid-body
            assert await healthz(port) == 200
            head, slack_body, hook_body = await closed_within(*requests[:3])
            assert head == b""
            assert slack_body.startswith(b"HTTP/1.1 408 ")
            assert hook_body.startswith(b"HTTP/1.1 408 ")
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), WITHIN)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "level=ERROR" not in output, output
    assert output.count("refused a slow request") == 3, output
    assert "the client left during the body" in output, output
