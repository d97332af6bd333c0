"""Structured logs: logfmt by default, JSON lines with ``OPSLOOP_LOG_FORMAT=json``.

``bind(thread_id=…, tool_call_id=…)`` puts fields in a context variable for the code
it wraps (the runner binds the thread around a run and the call around a tool call);
every record logged meanwhile carries them: as keys of the JSON object, or appended as
``key=value`` to a logfmt line (unless the message says the same already). Tasks
started inside inherit the fields; other threads and tasks do not see them.

Secrets never reach the output: each formatter masks the configured secret values
(tokens, keys, header values) wherever they appear, tracebacks included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Literal

LogFormat = Literal["logfmt", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("logfmt", "json")
BOUND_KEYS = ("thread_id", "event_id", "tool_call_id")
MASK = "***"
_MIN_SECRET = 4  # shorter values would mask ordinary words

_BOUND: ContextVar[Mapping[str, str]] = ContextVar(
    "opsloop_log_fields", default=MappingProxyType({})
)


@contextlib.contextmanager
def bind(**fields: str | None) -> Iterator[None]:
    """Add ``fields`` (None: left out) to every record logged inside the block."""
    token = _BOUND.set({**_BOUND.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _BOUND.reset(token)


def bound() -> Mapping[str, str]:
    """The fields bound here and now."""
    return _BOUND.get()


def _timestamp(record: logging.LogRecord) -> str:
    when = datetime.fromtimestamp(record.created, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n\r\t'):
        return text
    return json.dumps(text, ensure_ascii=False)


class _Masking(logging.Formatter):
    def __init__(self, secrets: Sequence[str] = ()) -> None:
        super().__init__()
        # Longest first: a secret containing another is masked whole.
        self.secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def fields(self, record: logging.LogRecord, time_key: str) -> dict[str, str]:
        """The record's fields, in output order, secrets masked."""
        parts = {
            time_key: _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in bound().items():
            parts.setdefault(key, value)
        if record.exc_info:
            parts["exc"] = self.formatException(record.exc_info)
        return {k: self.mask(str(v)) for k, v in parts.items()}


class KeyValueFormatter(_Masking):
    """``time=… level=… logger=… msg=…`` on one line, then the bound fields that the
    message does not show already; secrets masked."""

    def format(self, record: logging.LogRecord) -> str:
        parts = self.fields(record, "time")
        msg = parts["msg"]
        return " ".join(
            f"{k}={_logfmt_value(v)}"
            for k, v in parts.items()
            if k not in BOUND_KEYS or f"{k}={v}" not in msg
        )


class JsonFormatter(_Masking):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the bound
    ``thread_id`` / ``event_id`` / ``tool_call_id``, and ``exc`` with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.fields(record, "ts"), ensure_ascii=False)


def formatter(fmt: LogFormat = "logfmt", secrets: Sequence[str] = ()) -> logging.Formatter:
    return JsonFormatter(secrets) if fmt == "json" else KeyValueFormatter(secrets)


def configure_logging(level: int, secrets: Sequence[str] = (), fmt: LogFormat = "logfmt") -> None:
    """The root logger writes ``fmt`` lines to stderr at ``level``, masking ``secrets``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # APScheduler logs every run of the one-second sweep at INFO: keep its warnings only.
    logging.getLogger("apscheduler").setLevel(max(level, logging.WARNING))
    # Alembic narrates every step at INFO; we log what a migration did, once.
    logging.getLogger("alembic").setLevel(max(level, logging.WARNING))
