"""engine.logs: JSON lines and logfmt, the bound fields, and no secret in either."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from engine.config import load_settings
from engine.errors import ConfigError
from engine.logs import (
    JsonFormatter,
    KeyValueFormatter,
    bind,
    bound,
    configure_logging,
)

TOKEN = "xoxb-1234-5678-abcdefghijkl"
KEY = "sk-ant-api03-secretsecret"


def record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("opsloop.runner", logging.WARNING, __file__, 7, msg, args, exc_info)


def raised(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def test_a_json_line_has_the_time_level_logger_and_message() -> None:
    line = json.loads(JsonFormatter().format(record("tool failed %s", "deploy")))
    assert set(line) == {"ts", "level", "logger", "msg"}
    assert line["level"] == "WARNING" and line["logger"] == "opsloop.runner"
    assert line["msg"] == "tool failed deploy"
    assert line["ts"].endswith("Z") and line["ts"][10] == "T"


def test_bound_fields_are_keys_of_the_json_line_only_inside_the_block() -> None:
    formatter = JsonFormatter()
    with bind(thread_id="thr_1"):
        with bind(tool_call_id="toolu_9", event_id=None):  # None: not bound
            inner = json.loads(formatter.format(record("running")))
        outer = json.loads(formatter.format(record("between")))
    after = json.loads(formatter.format(record("after")))
    assert inner["thread_id"] == "thr_1" and inner["tool_call_id"] == "toolu_9"
    assert "event_id" not in inner
    assert outer["thread_id"] == "thr_1" and "tool_call_id" not in outer
    assert "thread_id" not in after and bound() == {}


def test_a_task_started_inside_a_binding_keeps_it_and_others_do_not_see_it() -> None:
    async def main() -> tuple[dict[str, str], dict[str, str]]:
        async def read() -> dict[str, str]:
            await asyncio.sleep(0)
            return dict(bound())

        with bind(thread_id="thr_a"):
            inside = asyncio.create_task(read())
        outside = asyncio.create_task(read())
        return await inside, await outside

    inside, outside = asyncio.run(main())
    assert inside == {"thread_id": "thr_a"} and outside == {}


def test_logfmt_appends_bound_fields_the_message_does_not_show() -> None:
    formatter = KeyValueFormatter()
    with bind(thread_id="thr_1", tool_call_id="toolu_2"):
        line = formatter.format(record("tool failed thread_id=%s", "thr_1"))
    assert line.endswith('msg="tool failed thread_id=thr_1" tool_call_id=toolu_2')
    assert line.count("thread_id=thr_1") == 1


def test_logfmt_without_bound_fields_is_unchanged() -> None:
    line = KeyValueFormatter().format(record("stopped"))
    assert line.startswith("time=") and line.endswith(
        "level=WARNING logger=opsloop.runner msg=stopped"
    )


@pytest.mark.parametrize("formatter_class", [JsonFormatter, KeyValueFormatter])
def test_a_secret_in_an_exception_message_is_masked(formatter_class: type) -> None:
    formatter = formatter_class(secrets=[TOKEN, KEY, ""])
    exc = raised(f"Slack said invalid_auth for token {TOKEN} (key {KEY})")
    with bind(thread_id=f"thr_{TOKEN}"):  # even a bound value
        text = formatter.format(record("delivery failed with %s", TOKEN, exc=exc))
    assert TOKEN not in text and KEY not in text
    assert "RuntimeError" in text and "***" in text
    if formatter_class is JsonFormatter:
        line = json.loads(text)
        assert "Traceback" in line["exc"] and "***" in line["exc"]


@pytest.fixture
def root_logger() -> Iterator[io.StringIO]:
    """The root logger as it was, after a test that configured it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield io.StringIO()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_configure_logging_json_writes_one_object_per_line(
    root_logger: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr", root_logger)
    configure_logging(logging.INFO, [TOKEN], "json")
    log = logging.getLogger("opsloop.test")
    with bind(thread_id="thr_x", event_id="ev_1"):
        log.info("posted with %s", TOKEN)
    log.debug("not at INFO")
    lines = [json.loads(line) for line in root_logger.getvalue().splitlines()]
    assert lines == [
        {
            "ts": lines[0]["ts"],
            "level": "INFO",
            "logger": "opsloop.test",
            "msg": "posted with ***",
            "thread_id": "thr_x",
            "event_id": "ev_1",
        }
    ]


def test_the_log_format_setting() -> None:
    assert load_settings({}).log_format == "logfmt"
    assert load_settings({"OPSLOOP_LOG_FORMAT": " JSON "}).log_format == "json"
    with pytest.raises(ConfigError) as caught:
        load_settings({"OPSLOOP_LOG_FORMAT": "yaml"})
    assert str(caught.value) == "OPSLOOP_LOG_FORMAT must be logfmt or json, not 'yaml'"
