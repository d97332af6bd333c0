"""The Anthropic adapter against the fake Messages API, through the real SDK."""

from __future__ import annotations

import os
import socket
import typing
from collections.abc import AsyncIterator
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from anthropic._data import DEPRECATED_MODELS
from anthropic.types import ModelParam

from engine.context import Prompt
from engine.errors import ConfigError
from engine.events import Usage
from engine.models.anthropic import DEFAULT_MODEL, AnthropicModel, parse_retry_after
from engine.models.base import ModelError, ToolUse
from tests.fakes.anthropic import FAKE_API_KEY, FakeAnthropic, Reply, check_request

SECRET_KEY = "sk-ant-api03-" + "S3cr3t" * 8

TOOLS = [
    {
        "name": "lookup",
        "description": "Look something up.",
        "input_schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "request_clarification",
        "description": "Ask a clarifying question.",
        "input_schema": {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        },
    },
]
HELLO = [{"role": "user", "content": [{"type": "text", "text": "[U_ALICE] is the db up?"}]}]


def prompt(system: str | list[dict] = "You are opsloop.", messages=HELLO, tools=TOOLS) -> Prompt:
    return Prompt(system=system, messages=messages, tools=tools)


async def step_error(model: AnthropicModel, request: Prompt | None = None) -> ModelError:
    """The ModelError that ``model.next_step`` raises (the test fails if it returns)."""
    with pytest.raises(ModelError) as caught:
        await model.next_step(request or prompt())
    return caught.value


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No ambient credentials, profile, base URL or model leak into these tests."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPSLOOP_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no SDK profile on disk either


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as f:
        yield f
    f.assert_clean()


@pytest.fixture
async def model(fake: FakeAnthropic) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel(
        AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=0, timeout=5)
    )
    yield m
    await m.close()


# --- replies ------------------------------------------------------------------------------


async def test_a_text_reply_is_a_final_decision(fake, model):
    fake.reply(
        Reply(
            content=[{"type": "text", "text": "  The db is up.  "}, {"type": "text", "text": "ok"}]
        )
    )
    decision = await model.next_step(prompt())
    assert decision.text == "The db is up.\n\nok"
    assert decision.tool_use is None
    assert decision.stop_reason == "end_turn"
    assert decision.model == DEFAULT_MODEL == model.name


async def test_a_tool_use_is_mapped_with_its_id_name_and_input(fake, model):
    fake.tool_use("lookup", {"name": "db"}, text="Let me check.", id="toolu_01abc")
    decision = await model.next_step(prompt())
    assert decision.tool_use == ToolUse(id="toolu_01abc", name="lookup", input={"name": "db"})
    assert decision.text == "Let me check."
    assert decision.stop_reason == "tool_use"


async def test_only_the_first_of_several_tool_uses_is_kept(fake, model):
    first = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"name": "a"}}
    second = {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"name": "b"}}
    fake.reply(Reply(content=[first, second], stop_reason="tool_use"))
    decision = await model.next_step(prompt())
    assert decision.tool_use == ToolUse("toolu_1", "lookup", {"name": "a"})


async def test_a_reply_cut_at_max_tokens_keeps_its_stop_reason(fake, model):
    fake.max_tokens_cut("lookup", {"name": "d"})
    decision = await model.next_step(prompt())
    assert decision.stop_reason == "max_tokens"  # the policy rejects it; nothing runs
    assert decision.tool_use is not None and decision.tool_use.input == {"name": "d"}


async def test_the_request_is_the_prompt_as_given_with_one_tool_per_turn(fake, model):
    fake.text("hi")
    p = prompt()
    await model.next_step(p)
    sent = fake.last_request
    assert sent["model"] == DEFAULT_MODEL
    assert sent["max_tokens"] == 4096
    assert sent["system"] == p.system
    assert sent["tools"] == p.tools
    assert sent["messages"] == p.messages
    assert sent["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "stream" not in sent
    headers = fake.request_headers[-1]
    assert headers["anthropic-version"]
    assert headers["x-stainless-retry-count"] == "0"


async def test_system_blocks_and_cache_breakpoints_pass_through(fake, model):
    system = [{"type": "text", "text": "You are opsloop.", "cache_control": {"type": "ephemeral"}}]
    fake.text("hi")
    await model.next_step(prompt(system=system))
    assert fake.last_request["system"] == system


async def test_usage_is_mapped_with_cache_tokens(fake, model):
    system = [
        {"type": "text", "text": "You are opsloop. " * 40, "cache_control": {"type": "ephemeral"}}
    ]
    fake.text("first").text("second")
    first = await model.next_step(prompt(system=system))
    second = await model.next_step(prompt(system=system))
    reported = [body["usage"] for status, body in fake.responses]
    for decision, usage in zip([first, second], reported, strict=True):
        assert decision.usage == Usage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            cache_read_input_tokens=usage["cache_read_input_tokens"],
            cache_creation_input_tokens=usage["cache_creation_input_tokens"],
        )
    assert first.usage.cache_creation_input_tokens > 0
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.output_tokens > 0 and second.usage.input_tokens > 0


async def test_missing_cache_fields_count_as_zero(fake, model):
    fake.reply(
        Reply(
            content=[{"type": "text", "text": "hi"}],
            usage={"input_tokens": 12, "output_tokens": 3},
        )
    )
    decision = await model.next_step(prompt())
    assert decision.usage == Usage(input_tokens=12, output_tokens=3)


# --- failures -----------------------------------------------------------------------------

ERRORS = [
    # status, type, headers, retryable, retry_after, words in the message
    (429, "rate_limit_error", {"retry-after": "7"}, True, 7.0, "rate limited"),
    (429, "rate_limit_error", {"retry-after": "1.5"}, True, 1.5, "429 rate_limit_error"),
    (429, "rate_limit_error", {"retry-after-ms": "250"}, True, 0.25, "rate limited"),
    (429, "rate_limit_error", {"retry-after": "soon"}, True, None, "rate limited"),
    (529, "overloaded_error", {"retry-after": "1"}, True, 1.0, "overloaded (529"),
    (529, "overloaded_error", {}, True, None, "overloaded"),
    (500, "api_error", {}, True, None, "failed (500 api_error)"),
    (503, "api_error", {}, True, None, "503"),
    (408, "timeout_error", {}, True, None, "408"),
    (409, "conflict_error", {}, True, None, "409"),
    (400, "invalid_request_error", {}, False, None, "rejected (400 invalid_request_error)"),
    (403, "permission_error", {}, False, None, "may not do this (403 permission_error)"),
    (413, "request_too_large", {}, False, None, "too large"),
    (422, "invalid_request_error", {}, False, None, "rejected (422"),
    (402, "billing_error", {}, False, None, "402 billing_error"),
    (500, "api_error", {"x-should-retry": "false"}, False, None, "500"),
]


@pytest.mark.parametrize(("status", "etype", "headers", "retryable", "after", "words"), ERRORS)
async def test_api_errors_are_mapped(fake, model, status, etype, headers, retryable, after, words):
    fake.error(status, etype, "Something happened.", headers=headers)
    error = await step_error(model)
    err = error
    assert err.retryable is retryable
    assert err.retry_after == after
    assert words in str(err)
    assert "Something happened." in str(err)
    assert "[request-id req_" in str(err)
    assert len(fake.requests) == 1  # no SDK retry: every retry is ours, in the log


async def test_bad_request_carries_the_first_line_of_the_api_message_truncated(fake, model):
    fake.error(400, "invalid_request_error", "messages.1: " + "x" * 400 + "\nsecond line")
    error = await step_error(model)
    text = str(error)
    assert text.startswith("the request was rejected (400 invalid_request_error): messages.1: x")
    assert "second line" not in text
    api_part = text.split(": ", 1)[1].split(" [request-id")[0]
    assert len(api_part) == 300


async def test_unknown_model_is_not_retryable_and_names_the_setting():
    async with FakeAnthropic(models={"claude-sonnet-5-5"}) as strict:
        client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=strict.url, max_retries=0)
        model = AnthropicModel(client, model="claude-nope-1")
        try:
            error = await step_error(model)
        finally:
            await model.close()
        strict.assert_clean()
    assert error.retryable is False
    assert "model 'claude-nope-1' not found (404 not_found_error)" in str(error)
    assert "OPSLOOP_MODEL" in str(error)


async def test_a_404_that_is_not_the_api_points_at_the_base_url(fake, model):
    fake.error(404, "", "", raw="<html><body>Not Found</body></html>")
    error = await step_error(model)
    assert error.retryable is False
    assert f"no Anthropic Messages API at {fake.url}/v1/messages (404)" in str(error)
    assert "ANTHROPIC_BASE_URL" in str(error)


async def test_a_proxy_page_on_502_is_retryable(fake, model):
    fake.error(502, "", "", raw="Bad Gateway\n<html>…</html>")
    error = await step_error(model)
    assert error.retryable is True
    assert "failed (502): Bad Gateway" in str(error)


async def test_a_spent_spend_limit_is_not_retried(fake, model):
    fake.error(
        429,
        "rate_limit_error",
        "You have reached your monthly spend limit.",
        retry_after=60,
        details={"error_code": "enforced_spend_limit_reached"},
    )
    error = await step_error(model)
    assert error.retryable is False
    assert error.retry_after is None
    assert "spend limit" in str(error)


async def test_an_invalid_key_is_not_retryable_and_never_shown(fake):
    client = AsyncAnthropic(api_key=SECRET_KEY, base_url=fake.url, max_retries=0)
    model = AnthropicModel(client)
    try:
        error = await step_error(model)
    finally:
        await model.close()
    err = error
    assert err.retryable is False
    text = f"{err} {err!r} {err.args}"
    assert "S3cr3t" not in text and "sk-ant" not in text
    assert text.startswith("the Anthropic API rejected the API key (401 authentication_error)")
    assert "check ANTHROPIC_API_KEY" in text
    assert fake.responses[-1][0] == 401


async def test_a_key_echoed_back_by_the_api_is_scrubbed():
    async with FakeAnthropic(api_key=SECRET_KEY) as fake:
        model = AnthropicModel(AsyncAnthropic(api_key=SECRET_KEY, base_url=fake.url))
        fake.error(403, "permission_error", f"key {SECRET_KEY} may not use this model")
        try:
            error = await step_error(model)
        finally:
            await model.close()
        fake.assert_clean()
    assert "S3cr3t" not in str(error)
    assert "key [redacted] may not use this model" in str(error)


async def test_connection_refused_is_retryable():
    with socket.socket() as s:  # a port nobody listens on any more
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = AsyncAnthropic(
        api_key=FAKE_API_KEY, base_url=f"http://127.0.0.1:{port}", max_retries=0
    )
    model = AnthropicModel(client)
    try:
        error = await step_error(model)
    finally:
        await model.close()
    assert error.retryable is True
    assert error.retry_after is None
    assert f"could not reach the Anthropic API at http://127.0.0.1:{port}" in str(error)


async def test_a_timeout_is_retryable(fake):
    client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=0, timeout=0.2)
    model = AnthropicModel(client)
    fake.text("too late", delay=2.0)
    try:
        error = await step_error(model)
    finally:
        await model.close()
    assert error.retryable is True
    assert "did not answer in time (timeout 0.2 s)" in str(error)


async def test_sdk_retries_are_off_even_on_a_client_that_has_them(fake):
    client = AsyncAnthropic(api_key=FAKE_API_KEY, base_url=fake.url, max_retries=2)
    model = AnthropicModel(client)
    fake.error(529, "overloaded_error", "Overloaded", retry_after=0)
    try:
        with pytest.raises(ModelError):
            await model.next_step(prompt())
    finally:
        await model.close()  # the copy shares the client's connections
    assert model.client.max_retries == 0
    assert len(fake.requests) == 1  # a second attempt would find no reply: a violation


async def test_no_credentials_at_all_is_a_clear_error(fake):
    model = AnthropicModel(AsyncAnthropic(base_url=fake.url, max_retries=0))
    try:
        error = await step_error(model)
    finally:
        await model.close()
    assert error.retryable is False
    assert "ANTHROPIC_API_KEY" in str(error)
    assert fake.requests == []


def test_retry_after_parsing():
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": " 2.5 "}) == 2.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "x", "retry-after": "9"}) == 9.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert parse_retry_after({"retry-after": "-1"}) is None
    assert parse_retry_after({"retry-after": "nan"}) is None
    assert parse_retry_after({}) is None


# --- configuration ------------------------------------------------------------------------


def test_the_default_model_is_a_current_one_from_the_sdk_list():
    literal = typing.get_args(ModelParam)[0]
    assert DEFAULT_MODEL in typing.get_args(literal)
    assert DEFAULT_MODEL not in DEPRECATED_MODELS


def test_from_env_without_a_key_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        AnthropicModel.from_env()
    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("OPSLOOP_MAX_TOKENS", "lots"), ("OPSLOOP_MAX_TOKENS", "0"), ("OPSLOOP_MAX_TOKENS", "1.5")],
)
def test_from_env_rejects_bad_numbers(monkeypatch, name, value):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        AnthropicModel.from_env()


async def test_from_env_reads_key_base_url_and_model(fake, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    monkeypatch.setenv("OPSLOOP_MODEL", "claude-haiku-5-5")
    monkeypatch.setenv("OPSLOOP_MAX_TOKENS", "1024")
    model = AnthropicModel.from_env()
    fake.text("hi")
    try:
        decision = await model.next_step(prompt())
    finally:
        await model.close()
    assert model.name == decision.model == "claude-haiku-5-5"
    assert fake.last_request["model"] == "claude-haiku-5-5"
    assert fake.last_request["max_tokens"] == 1024


async def test_without_a_client_the_sdk_reads_the_environment(fake, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    model = AnthropicModel(timeout=3)
    fake.text("hi")
    try:
        assert (await model.next_step(prompt())).text == "hi"
    finally:
        await model.close()
    assert model.client.max_retries == 0
    assert model.name == DEFAULT_MODEL


# --- the fake refuses what the real API refuses --------------------------------------------


def _text(t: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": t, **extra}


USE = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"name": "db"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{}"}
GOOD_MESSAGES = [
    {"role": "user", "content": [_text("hi")]},
    {"role": "assistant", "content": [_text("Looking."), USE]},
    {"role": "user", "content": [RESULT, _text("[U_ALICE] also this")]},
]
CC = {"cache_control": {"type": "ephemeral"}}


def body(**changes: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "max_tokens": 100,
        "system": "s",
        "tools": TOOLS,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": GOOD_MESSAGES,
    }
    b.update(changes)
    return {k: v for k, v in b.items() if v is not None}


def test_a_well_formed_conversation_passes_the_checks():
    assert check_request(body()) == []
    assert check_request(body(system=[_text("s", **CC)])) == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"model": None}, "model: Field required"),
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"max_tokens": 0}, "max_tokens: must be a positive integer"),
        ({"max_tokens": "10"}, "max_tokens: must be a positive integer"),
        ({"messages": []}, "at least one message"),
        ({"messages": [GOOD_MESSAGES[1], GOOD_MESSAGES[2]]}, "first message must use"),
        (
            {"messages": [GOOD_MESSAGES[0], {"role": "user", "content": [_text("again")]}]},
            "roles must alternate",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "blob"}]}]}, "Input tag 'blob'"),
        ({"messages": [{"role": "user", "content": [_text("")]}]}, "must be non-empty"),
        ({"messages": [{"role": "user", "content": [_text("  ")]}]}, "non-whitespace"),
        ({"messages": GOOD_MESSAGES[:2]}, "without `tool_result` blocks immediately after"),
        (
            {"messages": [*GOOD_MESSAGES[:2], {"role": "user", "content": [_text("x"), RESULT]}]},
            "tool_result blocks must come first",
        ),
        (
            {
                "messages": [
                    *GOOD_MESSAGES[:2],
                    {"role": "user", "content": [RESULT, {**RESULT, "tool_use_id": "toolu_9"}]},
                ]
            },
            "unexpected `tool_use_id`",
        ),
        (
            {"messages": [{"role": "user", "content": [RESULT]}]},
            "unexpected `tool_use_id`",
        ),
        (
            {"messages": [GOOD_MESSAGES[0], {"role": "assistant", "content": [_text("Sure")]}]},
            "last message must be from",
        ),
        ({"tools": [{**TOOLS[0], "name": "no spaces allowed"}]}, "String should match pattern"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "Tool names must be unique"),
        ({"tools": [{**TOOLS[0], "input_schema": {"type": "array"}}]}, "Input should be 'object'"),
        ({"tools": [{**TOOLS[0], "policy": "run_now"}]}, "policy: Extra inputs"),
        ({"tools": None}, "tool_choice: may only be specified while providing tools"),
        (
            {"system": [_text("a", **CC), _text("b", **CC)], "tools": [{**t, **CC} for t in TOOLS]}
            | {"messages": [{"role": "user", "content": [_text("hi", **CC)]}]},
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
        ({"temperature_of_soup": 3}, "temperature_of_soup: Extra inputs are not permitted"),
    ],
)
def test_the_fake_refuses_what_the_api_refuses(changes, problem):
    problems = check_request(body(**changes))
    assert any(problem in p for p in problems), problems


async def test_a_refused_request_is_a_400_and_a_recorded_violation(fake, model):
    bad = prompt(messages=[{"role": "assistant", "content": [_text("I start")]}])
    error = await step_error(model, bad)
    assert error.retryable is False
    assert "rejected (400 invalid_request_error): messages: first message" in str(error)
    assert fake.violations and "first message must use" in fake.violations[0]
    with pytest.raises(AssertionError, match="requests the real API would refuse"):
        fake.assert_clean()
    fake.violations.clear()  # seen; the fixture's own check must pass


def test_the_fake_models_prompt_caching():
    fake = FakeAnthropic()
    turn1 = [{"role": "user", "content": [_text("hello " * 50, **CC)]}]
    first = fake._input_usage(body(messages=turn1, tools=None, tool_choice=None))
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] > 0
    turn2 = [
        {"role": "user", "content": [_text("hello " * 50)]},
        {"role": "assistant", "content": [_text("hi")]},
        {"role": "user", "content": [_text("more " * 50, **CC)]},
    ]
    second = fake._input_usage(body(messages=turn2, tools=None, tool_choice=None))
    # The breakpoint moved to the end; the prefix written before is found and read.
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] > 0
    plain = fake._input_usage(body(messages=[{"role": "user", "content": "x"}], tools=None))
    assert plain["cache_read_input_tokens"] == plain["cache_creation_input_tokens"] == 0
