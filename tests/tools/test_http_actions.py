"""HTTP actions from config, against a local upstream on an ephemeral port."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from engine.models.scripted import call, say
from tests.support.approved import results, run_approved
from tests.support.servers import serve
from tools import RetryableToolError, ToolContext, ToolError, ToolLoadError
from tools.errors import OutcomeUnknown
from tools.http_actions import HttpActionLoadError, HttpActions, retry_after_seconds
from tools.http_config import HttpActionConfig
from tools.output import MAX_RESULT_BYTES, storable
from tools.registry import Tool

SECRET = "s3cr3t-platform-token-0042"
SERVICE = {
    "type": "object",
    "properties": {
        "service": {"type": "string"},
        "note": {"type": "string"},
        "count": {"type": "integer"},
        "reason": {"type": "string"},
    },
    "required": ["service"],
}

Answer = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes


async def _echo(request: web.Request) -> web.StreamResponse:
    return web.json_response(
        {"path": request.raw_path, "auth": request.headers.get("Authorization")}
    )


@dataclass
class Upstream:
    """A platform API stand-in: records every request, answers with ``answers`` in turn."""

    answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(
            Seen(request.method, request.raw_path, dict(request.headers), await request.read())
        )
        answer = self.answers.pop(0) if self.answers else _echo
        return await answer(request)


async def _serve(up: Upstream) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", up.handle)
    runner, up.port = await serve(app)
    return runner


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    runner = await _serve(up)
    try:
        yield up
    finally:
        up.release.set()  # lets a held answer (the timeout test) finish
        await runner.cleanup()


@pytest.fixture
async def other_upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    runner = await _serve(up)
    try:
        yield up
    finally:
        await runner.cleanup()


def _action(url: str, timeout_s: float | None = None, **kw: Any) -> HttpActionConfig:
    """``restart_service`` as the file would give it; ``timeout_s`` below the file's
    smallest duration (1s), for the timeout tests."""
    base: dict[str, Any] = {
        "description": "Restart one service through the platform API.",
        "method": "POST",
        "url": url,
        "arguments": SERVICE,
        "headers": {"Authorization": f"Bearer {SECRET}"},
    }
    action = HttpActionConfig.model_validate({**base, **kw})
    return action if timeout_s is None else action.model_copy(update={"timeout": timeout_s})


def _source(action: HttpActionConfig, allow: list[str]) -> HttpActions:
    return HttpActions({"restart_service": action}, allow)


def _ctx(attempt: int = 1) -> ToolContext:
    return ToolContext(
        thread_id="th_1", tool_call_id="tc_1", idempotency_key="th_1:tc_1", attempt=attempt
    )


@pytest.fixture
async def opened() -> AsyncIterator[Callable[..., Awaitable[Tool]]]:
    """``await opened(action, allow=[...])`` gives the action's tool; closed afterwards."""
    sources: list[HttpActions] = []

    async def make(action: HttpActionConfig, allow: list[str] | None = None) -> Tool:
        source = _source(action, allow if allow is not None else ["127.0.0.1"])
        sources.append(source)
        [tool] = await source.open()
        return tool

    yield make
    for source in sources:
        await source.close()


async def _run(tool: Tool, args: dict[str, Any], ctx: ToolContext | None = None) -> Any:
    return await tool.run(tool.parse_arguments(args), ctx or _ctx())


def _reply(status: int, body: str = "", **headers: str) -> Answer:
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text=body, headers=headers)

    return answer


async def _reset(request: web.Request) -> web.StreamResponse:
    """Read the request (Upstream.handle did), then reset the connection instead of answering."""
    assert request.transport is not None
    sock = request.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    request.transport.abort()
    return web.Response(text="never sent")


async def _cut_short(request: web.Request) -> web.StreamResponse:
    """Start a 2xx answer promising 100 bytes, send 10, and drop the connection."""
    resp = web.StreamResponse(headers={"Content-Length": "100"})
    await resp.prepare(request)
    await resp.write(b"0123456789")
    assert request.transport is not None
    request.transport.abort()
    return resp


KEYED = "Idempotency-Key"
UNKNOWN = "; whether restart_service took effect is unknown"


# --- what is sent ------------------------------------------------------------------------


async def test_placeholders_are_url_encoded_into_the_path_and_query(upstream, opened) -> None:
    url = f"{upstream.base}/api/services/{{service}}/restart?note={{note}}"
    tool = await opened(_action(url, arguments={**SERVICE, "required": ["service", "note"]}))
    await _run(tool, {"service": "../admin/x?y#z w", "note": "a&b=c#d e"})
    [seen] = upstream.seen
    assert seen.raw_path == (
        "/api/services/..%2Fadmin%2Fx%3Fy%23z%20w/restart?note=a%26b%3Dc%23d%20e"
    )


@pytest.mark.parametrize("service", ["..", ".", ""])
async def test_a_value_that_would_move_in_the_path_is_refused(upstream, opened, service) -> None:
    tool = await opened(_action(f"{upstream.base}/api/services/{{service}}/restart"))
    with pytest.raises(ToolError) as info:
        await _run(tool, {"service": service})
    assert not isinstance(info.value, RetryableToolError)
    assert upstream.seen == []


async def test_header_and_body_templates_are_filled_keeping_json_types(upstream, opened) -> None:
    action = _action(
        f"{upstream.base}/api/restart",
        headers={"Authorization": f"Bearer {SECRET}", "X-Service": "svc-{service}"},
        body={
            "service": "{service}",
            "count": "{count}",
            "text": "restart {service} x{count}",
            "list": ["{count}", "{reason}"],
            "reason": "{reason}",
            "literal": "{not_an_argument}",
        },
    )
    tool = await opened(action)
    await _run(tool, {"service": "api", "count": 3})
    [seen] = upstream.seen
    assert seen.headers["X-Service"] == "svc-api"
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert json.loads(seen.body) == {
        "service": "api",
        "count": 3,
        "text": "restart api x3",
        "list": [3, None],
        "literal": "{not_an_argument}",
    }


async def test_a_header_naming_an_absent_argument_is_left_out(upstream, opened) -> None:
    tool = await opened(_action(f"{upstream.base}/x", headers={"X-Reason": "{reason}"}))
    await _run(tool, {"service": "api"})
    await _run(tool, {"service": "api", "reason": "deploy stuck"})
    assert "X-Reason" not in upstream.seen[0].headers
    assert upstream.seen[1].headers["X-Reason"] == "deploy stuck"


async def test_a_line_break_cannot_go_into_a_header(upstream, opened) -> None:
    tool = await opened(_action(f"{upstream.base}/x", headers={"X-Reason": "{reason}"}))
    with pytest.raises(ToolError, match="line break"):
        await _run(tool, {"service": "api", "reason": "a\r\nX-Admin: 1"})
    assert upstream.seen == []


async def test_without_a_body_template_post_sends_the_other_arguments_as_json(
    upstream, opened
) -> None:
    tool = await opened(_action(f"{upstream.base}/api/services/{{service}}/restart"))
    await _run(tool, {"service": "api", "count": 2, "note": "hi"})
    [seen] = upstream.seen
    assert seen.headers["Content-Type"] == "application/json"
    assert json.loads(seen.body) == {"count": 2, "note": "hi"}


async def test_a_configured_content_type_replaces_ours(upstream, opened) -> None:
    tool = await opened(
        _action(f"{upstream.base}/x", headers={"content-type": "application/vnd.acme+json"})
    )
    await _run(tool, {"service": "api"})
    [seen] = upstream.seen
    assert seen.headers["Content-Type"] == "application/vnd.acme+json"


async def test_without_a_body_template_get_sends_the_other_arguments_as_query(
    upstream, opened
) -> None:
    tool = await opened(_action(f"{upstream.base}/api/{{service}}?v=1", method="GET"))
    await _run(tool, {"service": "api", "count": 2, "note": "a b&c"})
    [seen] = upstream.seen
    assert seen.method == "GET" and seen.body == b""
    assert seen.raw_path == "/api/api?v=1&count=2&note=a%20b%26c"


async def test_the_idempotency_key_is_sent_and_the_same_on_a_retried_attempt(
    upstream, opened
) -> None:
    tool = await opened(_action(f"{upstream.base}/x", idempotency_header="Idempotency-Key"))
    assert tool.idempotent is True and tool.policy == "approve_before_run"
    assert tool.source == "http"
    upstream.answers.append(_reply(503, "busy"))
    with pytest.raises(RetryableToolError):
        await _run(tool, {"service": "api"}, _ctx(attempt=1))
    await _run(tool, {"service": "api"}, _ctx(attempt=2))
    assert [s.headers.get("Idempotency-Key") for s in upstream.seen] == ["th_1:tc_1"] * 2


async def test_without_an_idempotency_header_the_tool_is_not_idempotent(upstream, opened) -> None:
    tool = await opened(_action(f"{upstream.base}/x"))
    assert tool.idempotent is False
    await _run(tool, {"service": "api"})
    assert "th_1:tc_1" not in upstream.seen[0].headers.values()


# --- answers -----------------------------------------------------------------------------


async def test_a_2xx_json_answer_is_parsed_and_keeps_its_status(upstream, opened) -> None:
    upstream.answers.append(lambda r: _json(202, {"job": 7}))
    tool = await opened(_action(f"{upstream.base}/x"))
    assert await _run(tool, {"service": "api"}) == {"status": 202, "body": {"job": 7}}


async def _json(status: int, value: Any) -> web.StreamResponse:
    return web.json_response(value, status=status)


async def test_a_2xx_text_answer_is_text(upstream, opened) -> None:
    upstream.answers.append(_reply(200, "restarted"))
    tool = await opened(_action(f"{upstream.base}/x"))
    assert await _run(tool, {"service": "api"}) == {"status": 200, "body": "restarted"}


@pytest.mark.parametrize("header", [None, KEYED])
async def test_an_answer_with_a_lone_surrogate_is_stored_replaced_after_one_request(
    store, upstream, opened, header
) -> None:
    # Valid JSON that Python decodes to a lone surrogate, which neither UTF-8 nor jsonb
    # can hold: it used to fail the append after the call (unknown outcome, or a re-send).
    upstream.answers.append(
        _reply(200, '{"x": "lone \\ud800"}', **{"Content-Type": "application/json"})
    )
    tool = await opened(_action(f"{upstream.base}/x", idempotency_header=header))
    events, model = await run_approved(store, [tool], [call(tool.name, service="api"), say("ok")])
    [result] = results(events)
    assert result.ok and result.output == {"status": 200, "body": {"x": "lone \ufffd"}}
    assert len(upstream.seen) == 1
    assert "lone \ufffd" in model.last_prompt_text()


async def test_an_answer_past_the_read_limit_is_cut_and_says_so_first(upstream, opened) -> None:
    upstream.answers.append(_reply(200, "y" * (3 * MAX_RESULT_BYTES)))
    tool = await opened(_action(f"{upstream.base}/x"))
    answer = await _run(tool, {"service": "api"})
    head = answer["body"]["head"]
    assert set(head) == {"y"} and len(head) < MAX_RESULT_BYTES
    assert answer["body"]["cut"] == (
        f"[cut: more than {MAX_RESULT_BYTES:,} bytes; showing the first {len(head):,} bytes]"
    )
    # Under the bound already: the runner's own cut leaves it as it is.
    assert storable(answer) is answer


async def test_a_404_is_an_error_the_model_sees(upstream, opened) -> None:
    upstream.answers.append(_reply(404, "no such\n service 'db'"))
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(ToolError) as info:
        await _run(tool, {"service": "db"})
    assert not isinstance(info.value, RetryableToolError)
    assert str(info.value) == "HTTP 404 from 127.0.0.1: no such service 'db'"


async def test_a_503_with_retry_after_seconds_is_retryable_with_that_delay(
    upstream, opened
) -> None:
    upstream.answers.append(_reply(503, "maintenance", **{"Retry-After": "7"}))
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(RetryableToolError) as info:
        await _run(tool, {"service": "api"})
    assert info.value.retry_after == 7
    assert "HTTP 503 from 127.0.0.1" in str(info.value)


async def test_a_429_with_an_http_date_is_retryable_until_that_date(upstream, opened) -> None:
    when = formatdate(time.time() + 120, usegmt=True)
    upstream.answers.append(_reply(429, "slow down", **{"Retry-After": when}))
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(RetryableToolError) as info:
        await _run(tool, {"service": "api"})
    assert info.value.retry_after is not None and 110 < info.value.retry_after <= 120


def test_retry_after_reads_seconds_dates_and_ignores_garbage() -> None:
    now = 1_700_000_000.0
    assert retry_after_seconds("3", now) == 3
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now) == 30
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now) == 0
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds(None, now) is None


@pytest.mark.parametrize("status", [408, 429, 503])
async def test_a_refusal_before_acting_is_retryable_without_an_idempotency_header(
    upstream, opened, status
) -> None:
    upstream.answers.append(_reply(status, "not now", **{"Retry-After": "5"}))
    tool = await opened(_action(f"{upstream.base}/x"))
    assert tool.idempotent is False
    with pytest.raises(RetryableToolError) as info:
        await _run(tool, {"service": "api"})
    assert info.value.retry_after == 5


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_a_server_error_without_an_idempotency_header_is_outcome_unknown(
    upstream, opened, status
) -> None:
    upstream.answers.append(_reply(status, "upstream\nfailed"))
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(OutcomeUnknown) as info:
        await _run(tool, {"service": "api"})
    assert str(info.value) == f"HTTP {status} from 127.0.0.1: upstream failed{UNKNOWN}"
    assert len(upstream.seen) == 1


@pytest.mark.parametrize("status", [500, 502, 504])
async def test_a_server_error_with_an_idempotency_header_is_retryable(
    upstream, opened, status
) -> None:
    upstream.answers.append(_reply(status, "bad gateway", **{"Retry-After": "2"}))
    tool = await opened(_action(f"{upstream.base}/x", idempotency_header=KEYED))
    with pytest.raises(RetryableToolError) as info:
        await _run(tool, {"service": "api"})
    assert info.value.retry_after == 2
    assert str(info.value) == f"HTTP {status} from 127.0.0.1: bad gateway"


@pytest.mark.parametrize("header", [None, KEYED])
async def test_connection_refused_is_retryable_with_or_without_the_header(opened, header) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tool = await opened(_action(f"http://127.0.0.1:{port}/x", idempotency_header=header))
    with pytest.raises(RetryableToolError, match=r"^cannot reach 127\.0\.0\.1: "):
        await _run(tool, {"service": "api"})


async def test_a_reset_after_the_request_was_read_is_outcome_unknown_without_the_header(
    upstream, opened
) -> None:
    upstream.answers.append(_reset)
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(OutcomeUnknown) as info:
        await _run(tool, {"service": "api"})
    text = str(info.value)
    assert text.startswith("the connection to 127.0.0.1 failed (")
    assert text.endswith(f") after the request was sent{UNKNOWN}")
    assert SECRET not in text and "\n" not in text
    [seen] = upstream.seen  # the server had the request: it may have acted
    assert json.loads(seen.body) == {"service": "api"}


async def test_a_reset_after_the_request_was_read_is_retryable_with_the_header(
    upstream, opened
) -> None:
    upstream.answers.append(_reset)
    tool = await opened(_action(f"{upstream.base}/x", idempotency_header=KEYED))
    with pytest.raises(RetryableToolError, match=r"^the connection to 127\.0\.0\.1 failed: "):
        await _run(tool, {"service": "api"})
    assert (await _run(tool, {"service": "api"}, _ctx(attempt=2)))["status"] == 200
    assert [s.headers[KEYED] for s in upstream.seen] == ["th_1:tc_1"] * 2


async def test_an_answer_cut_short_is_outcome_unknown_without_the_header(upstream, opened) -> None:
    upstream.answers.append(_cut_short)
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(OutcomeUnknown, match=r"^the connection to 127\.0\.0\.1 failed \("):
        await _run(tool, {"service": "api"})


async def _hold(upstream: Upstream) -> Answer:
    async def hold(request: web.Request) -> web.StreamResponse:
        await upstream.release.wait()
        return web.Response(text="late")

    return hold


async def test_a_timeout_after_sending_is_outcome_unknown_without_the_header(
    upstream, opened
) -> None:
    upstream.answers.append(await _hold(upstream))
    tool = await opened(_action(f"{upstream.base}/x", timeout_s=0.2))
    with pytest.raises(OutcomeUnknown) as info:
        await _run(tool, {"service": "api"})
    assert str(info.value) == (
        f"no answer from 127.0.0.1 within 0.2s after the request was sent{UNKNOWN}"
    )


async def test_a_timeout_is_retryable_with_the_header(upstream, opened) -> None:
    upstream.answers.append(await _hold(upstream))
    tool = await opened(_action(f"{upstream.base}/x", timeout_s=0.2, idempotency_header=KEYED))
    with pytest.raises(RetryableToolError, match=r"timed out after 0\.2s"):
        await _run(tool, {"service": "api"})


async def test_a_redirect_to_another_host_is_not_followed(upstream, other_upstream, opened) -> None:
    where = f"http://localhost:{other_upstream.port}/steal"
    upstream.answers.append(_reply(302, "", Location=where))
    tool = await opened(_action(f"{upstream.base}/x"))
    with pytest.raises(ToolError, match=r"HTTP 302 from 127\.0\.0\.1.*not followed") as info:
        await _run(tool, {"service": "api"})
    assert not isinstance(info.value, RetryableToolError)
    assert other_upstream.seen == [] and len(upstream.seen) == 1


# --- allowed hosts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allow", "needle"),
    [
        ("https://evil.example/x", ["platform.internal"], "host 'evil.example' is not in"),
        ("https://platform.internal:8443/x", ["platform.internal:443"], "is not in"),
    ],
)
async def test_startup_refuses_an_unlisted_host_in_one_line_naming_it(url, allow, needle) -> None:
    source = _source(_action(url), allow)
    with pytest.raises(HttpActionLoadError) as info:
        await source.open()
    text = str(info.value)
    assert isinstance(info.value, ToolLoadError)
    assert text.startswith("tools.http.restart_service.url: ") and needle in text
    assert "\n" not in text and SECRET not in text
    await source.close()


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("https://{tenant}.platform.internal/x", "only in the url's path"),
        ("https://platform.internal/{nope}", "{nope} is not one of the arguments"),
        ("https://platform.internal/{note}", "{note} must be a required argument"),
        ("https://u:p@platform.internal/x", "must not hold credentials"),
        ("ftp://platform.internal/x", "http:// or https://"),
    ],
)
def test_an_unusable_url_is_refused_by_the_model(url, needle) -> None:
    # The model the file's reader uses: `config check` and `serve` refuse it alike.
    with pytest.raises(ValidationError, match=re.escape(needle)) as info:
        _action(url)
    assert SECRET not in str(info.value)


async def test_an_allowed_host_with_a_port_allows_only_that_port(upstream) -> None:
    action = _action(f"{upstream.base}/x")
    source = _source(action, [f"127.0.0.1:{upstream.port}"])
    assert len(await source.open()) == 1
    await source.close()
    with pytest.raises(HttpActionLoadError, match=r"is not in tools\.http_allow_hosts"):
        await _source(action, [f"127.0.0.1:{upstream.port + 1}"]).open()


def test_a_bad_allowed_host_entry_is_one_line() -> None:
    with pytest.raises(HttpActionLoadError) as info:
        _source(_action("https://platform.internal/x"), ["https://platform.internal"])
    assert str(info.value) == (
        "tools.http_allow_hosts: 'https://platform.internal' is not a host: give a host name"
        " or IP (any port) or host:port"
    )


# --- secrets -----------------------------------------------------------------------------


async def test_secrets_stay_out_of_errors_results_reprs_and_logs(upstream, opened, caplog) -> None:
    caplog.set_level(logging.DEBUG)

    async def echo_auth(status: int) -> Answer:
        async def answer(request: web.Request) -> web.StreamResponse:
            return web.Response(status=status, text=f"bad token {request.headers['Authorization']}")

        return answer

    upstream.answers += [await echo_auth(401), await echo_auth(500), await echo_auth(200)]
    action = _action(f"{upstream.base}/x")
    tool = await opened(action)
    texts = []
    for _ in range(2):
        with pytest.raises(ToolError) as info:
            await _run(tool, {"service": "api"})
        texts.append(str(info.value))
    texts.append(json.dumps(await _run(tool, {"service": "api"})))
    texts += [repr(action), repr(_source(action, [])), repr(tool), caplog.text]
    assert upstream.seen[0].headers["Authorization"] == f"Bearer {SECRET}"
    assert "[redacted]" in texts[0] and "[redacted]" in texts[2]
    assert not [t for t in texts if SECRET in t]


async def test_close_is_safe_twice(upstream) -> None:
    source = _source(_action(f"{upstream.base}/x"), ["127.0.0.1"])
    await source.open()
    await source.close()
    await source.close()
