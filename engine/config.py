"""One settings object for the whole process: read once, by the CLI, and passed down.

``load_settings(env)`` reads the environment variables of DESIGN.md into a frozen
:class:`Settings`. ``ENVIRONMENT`` is the one table of which variable sets which field,
and :func:`load_settings` is the one place a configuration file plugs in: the file's
values are the base, the variables that exist are laid over them ("environment
variables that exist win over the file").

Every problem is a ``ConfigError`` whose message is one line naming the variable, so a
process that cannot start says why and exits 2 instead of printing a traceback. Secrets
are kept out of ``repr`` so a logged settings object shows none of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.db import DEFAULT_DATABASE_URL, parse_database_url
from engine.errors import ConfigError
from engine.logs import LOG_FORMATS, LogFormat
from engine.reviewers import ReviewerRule

DEFAULT_SLACK_API_URL = "https://slack.com/api/"
DEFAULT_MODEL = "claude-sonnet-5-5"
DEFAULT_PORT = 3000
# Users (U…, W…), user groups (S…), and whoever is on call (oncall:<PagerDuty id>).
_SLACK_ID = re.compile(r"^(?:[UWS][A-Z0-9]{2,}|oncall:[A-Z0-9]{2,})$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


_YEAR_S = 365 * 86400.0


@dataclass(frozen=True)
class RunnerConfig:
    """How the runner paces and bounds a thread (``OPSLOOP_*`` numbers)."""

    lease_ttl_s: float = 30.0
    approval_ttl_s: float = 24 * 3600.0
    max_rejections: int = 3
    max_tool_attempts: int = 5
    max_model_attempts: int = 6
    retry_base_s: float = 2.0
    retry_max_s: float = 600.0
    max_decisions_per_input: int = 25
    tool_timeout_s: float = 600.0
    # Above this estimate the prompt's older turns are compacted into a summary, keeping
    # the recent ones within half of it.
    context_budget_tokens: int = 60_000

    def backoff(self, attempt: int) -> float:
        """Exponential backoff for the retry after failed attempt ``attempt`` (1-based)."""
        return min(self.retry_max_s, self.retry_base_s * 2 ** (attempt - 1))


@dataclass(frozen=True)
class SlackSettings:
    bot_token: str = field(default="", repr=False)
    signing_secret: str = field(default="", repr=False)
    app_token: str = field(default="", repr=False)
    api_url: str = DEFAULT_SLACK_API_URL
    webhook_secret: str = field(default="", repr=False)


@dataclass(frozen=True)
class ModelSettings:
    api_key: str = field(default="", repr=False)
    base_url: str | None = None
    name: str = DEFAULT_MODEL
    max_tokens: int = 4096
    timeout_s: float = 60.0


@dataclass(frozen=True)
class ToolSettings:
    """What tool modules get from ``configure(settings.tool)`` (see tools.loader)."""

    modules: tuple[str, ...] = ()
    docs_dir: str = "docs"
    tickets_url: str | None = None
    demo_url: str | None = None


@dataclass(frozen=True)
class HttpSettings:
    """How long the HTTP server waits for a request's parts (``bot.http_limits``): a
    sender slower than this is closed, not held."""

    # The request line and headers, from the connection or the previous answer (so an
    # idle keep-alive connection closes then too).
    header_timeout_s: float = 10.0
    # The whole body (up to 1 MB), from the end of the headers.
    body_timeout_s: float = 10.0


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    # serve, socket and local migrate an older schema at start instead of refusing.
    auto_migrate: bool = False
    # Who may decide a call no rule names reviewers for (OPSLOOP_APPROVERS, …).
    reviewers: ReviewerRule = field(default_factory=ReviewerRule)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    sweep_seconds: float = 1.0
    slack: SlackSettings = field(default_factory=SlackSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    tool: ToolSettings = field(default_factory=ToolSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    host: str | None = None  # None: the command's default (serve 0.0.0.0, local 127.0.0.1)
    port: int = DEFAULT_PORT
    # OPSLOOP_METRICS_PORT: `opsloop serve` answers /metrics there only (same host), so a
    # proxy in front of PORT never exposes it; None: /metrics beside /healthz on PORT.
    metrics_port: int | None = None
    local_state: str | None = None
    log_format: LogFormat = "logfmt"  # OPSLOOP_LOG_FORMAT: logfmt lines, or JSON lines

    @property
    def tools(self) -> str | None:
        """``OPSLOOP_TOOLS`` as written (comma-separated), None when empty."""
        return ",".join(self.tool.modules) or None


# --- the variables ------------------------------------------------------------------------


class _Environment(BaseModel):
    """The variables as pydantic validates them; aliases are the variable names."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    database_url: str = Field(DEFAULT_DATABASE_URL, alias="DATABASE_URL")
    tools: str = Field("", alias="OPSLOOP_TOOLS")
    approvers: str = Field("", alias="OPSLOOP_APPROVERS")
    allow_self: str = Field("false", alias="OPSLOOP_ALLOW_SELF_APPROVAL")
    auto_migrate: str = Field("false", alias="OPSLOOP_AUTO_MIGRATE")
    lease_s: float = Field(
        RunnerConfig.lease_ttl_s, ge=1, le=_YEAR_S, alias="OPSLOOP_LEASE_SECONDS"
    )
    # Bounded: a deadline past the calendar overflowed every decision that computed it.
    approval_ttl_s: float = Field(
        RunnerConfig.approval_ttl_s, ge=1, le=_YEAR_S, alias="OPSLOOP_APPROVAL_TTL_SECONDS"
    )
    max_rejections: int = Field(RunnerConfig.max_rejections, ge=1, alias="OPSLOOP_MAX_REJECTIONS")
    max_tool_attempts: int = Field(
        RunnerConfig.max_tool_attempts, ge=1, alias="OPSLOOP_MAX_TOOL_ATTEMPTS"
    )
    retry_base_s: float = Field(
        RunnerConfig.retry_base_s, ge=0.01, alias="OPSLOOP_RETRY_BASE_SECONDS"
    )
    tool_timeout_s: float = Field(
        RunnerConfig.tool_timeout_s, ge=1, alias="OPSLOOP_TOOL_TIMEOUT_SECONDS"
    )
    context_budget_tokens: int = Field(
        RunnerConfig.context_budget_tokens, ge=1000, alias="OPSLOOP_CONTEXT_BUDGET_TOKENS"
    )
    sweep_seconds: float = Field(1.0, ge=0.05, alias="OPSLOOP_SWEEP_SECONDS")
    slack_bot_token: str = Field("", alias="SLACK_BOT_TOKEN")
    slack_signing_secret: str = Field("", alias="SLACK_SIGNING_SECRET")
    slack_app_token: str = Field("", alias="SLACK_APP_TOKEN")
    slack_api_url: str = Field(DEFAULT_SLACK_API_URL, alias="SLACK_API_URL")
    webhook_secret: str = Field("", alias="OPSLOOP_WEBHOOK_SECRET")
    anthropic_api_key: str = Field("", alias="ANTHROPIC_API_KEY")
    anthropic_base_url: str | None = Field(None, alias="ANTHROPIC_BASE_URL")
    model: str = Field(DEFAULT_MODEL, alias="OPSLOOP_MODEL")
    max_tokens: int = Field(4096, ge=1, alias="OPSLOOP_MAX_TOKENS")
    model_timeout_s: float = Field(60.0, gt=0, alias="OPSLOOP_MODEL_TIMEOUT_SECONDS")
    docs_dir: str = Field("docs", alias="OPSLOOP_DOCS_DIR")
    tickets_url: str | None = Field(None, alias="OPSLOOP_TICKETS_URL")
    demo_url: str | None = Field(None, alias="OPSLOOP_DEMO_URL")
    host: str | None = Field(None, alias="OPSLOOP_HOST")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, alias="PORT")
    header_timeout_s: float = Field(
        HttpSettings.header_timeout_s, ge=0.1, alias="OPSLOOP_HEADER_TIMEOUT_SECONDS"
    )
    body_timeout_s: float = Field(
        HttpSettings.body_timeout_s, ge=0.1, alias="OPSLOOP_BODY_TIMEOUT_SECONDS"
    )
    metrics_port: int | None = Field(None, ge=1, le=65535, alias="OPSLOOP_METRICS_PORT")
    local_state: str | None = Field(None, alias="OPSLOOP_LOCAL_STATE")
    log_format: str = Field("logfmt", alias="OPSLOOP_LOG_FORMAT")

    @field_validator("approvers")
    @classmethod
    def _approver_ids(cls, raw: str) -> str:
        ids = [a.strip() for a in raw.split(",") if a.strip()]
        bad = [a for a in ids if not _SLACK_ID.match(a)]
        if bad:
            raise ValueError(
                f"holds {', '.join(map(repr, bad))}: use Slack user ids (U…, W…), "
                "user-group ids (S…) or oncall:<schedule id>, comma-separated"
            )
        return ",".join(ids)

    @field_validator("allow_self", "auto_migrate")
    @classmethod
    def _flag(cls, raw: str) -> str:
        flag = raw.strip().lower()
        if flag not in _TRUE + _FALSE:
            raise ValueError(f"must be true or false, not {raw!r}")
        return flag

    @field_validator("log_format")
    @classmethod
    def _log_format(cls, raw: str) -> str:
        fmt = raw.strip().lower()
        if fmt not in LOG_FORMATS:
            raise ValueError(f"must be {' or '.join(LOG_FORMATS)}, not {raw!r}")
        return fmt

    @field_validator("database_url")
    @classmethod
    def _database(cls, raw: str) -> str:
        parse_database_url(raw)  # ConfigError names the problem; re-raised by the caller
        return raw


# Variables read by name elsewhere only for a test's sake (fault injection) are not here.
ENVIRONMENT: tuple[str, ...] = tuple(
    str(f.alias) for f in _Environment.model_fields.values() if f.alias
)


def _present(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that are set to something: an empty one counts as unset."""
    return {k: v.strip() for k, v in env.items() if k in ENVIRONMENT and v.strip()}


def _is_number(value: object) -> bool:
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _one_line(exc: ValidationError) -> str:
    """``OPSLOOP_LEASE_SECONDS must be at least 1, not '0'``: the first problem, named."""
    error = exc.errors(include_url=False)[0]
    name = str(error["loc"][0]) if error["loc"] else "the settings"
    given, ctx, kind = error.get("input"), error.get("ctx") or {}, error["type"]
    if kind == "int_from_float" or (kind.startswith("int_") and _is_number(given)):
        message = f"must be a whole number, not {given!r}"
    elif kind.endswith("_parsing") or kind.endswith("_type"):
        message = f"must be a number, not {given!r}"
    elif kind in ("greater_than_equal", "greater_than"):
        message = f"must be at least {ctx.get('ge', ctx.get('gt'))}, not {given!r}"
    elif kind in ("less_than_equal", "less_than"):
        message = f"must be at most {ctx.get('le', ctx.get('lt'))}, not {given!r}"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return " ".join(f"{name} {message}".split())


def load_settings(
    env: Mapping[str, str] | None = None, *, file: Mapping[str, str] | None = None
) -> Settings:
    """The process's settings from ``env`` (default ``os.environ``).

    ``file`` holds values taken from a configuration file, keyed by the same variable
    names; a variable that is set wins over it.
    """
    given, from_file = _present(os.environ if env is None else env), _present(file or {})
    values = {**from_file, **given}
    # Tool modules add up: the file's ``tools.modules`` plus OPSLOOP_TOOLS.
    values["OPSLOOP_TOOLS"] = ",".join(
        m for m in (from_file.get("OPSLOOP_TOOLS"), given.get("OPSLOOP_TOOLS")) if m
    )
    try:
        raw = _Environment.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    if raw.metrics_port is not None and raw.metrics_port == raw.port:
        raise ConfigError(f"OPSLOOP_METRICS_PORT must differ from PORT, not {raw.port}")
    return _settings(raw)


def _settings(raw: _Environment) -> Settings:
    modules = tuple(dict.fromkeys(m.strip() for m in raw.tools.split(",") if m.strip()))
    return Settings(
        database_url=raw.database_url,
        auto_migrate=raw.auto_migrate in _TRUE,
        reviewers=ReviewerRule(
            approvers=frozenset(a for a in raw.approvers.split(",") if a),
            allow_self=raw.allow_self in _TRUE,
        ),
        runner=RunnerConfig(
            lease_ttl_s=raw.lease_s,
            approval_ttl_s=raw.approval_ttl_s,
            max_rejections=raw.max_rejections,
            max_tool_attempts=raw.max_tool_attempts,
            retry_base_s=raw.retry_base_s,
            tool_timeout_s=raw.tool_timeout_s,
            context_budget_tokens=raw.context_budget_tokens,
        ),
        sweep_seconds=raw.sweep_seconds,
        slack=SlackSettings(
            bot_token=raw.slack_bot_token,
            signing_secret=raw.slack_signing_secret,
            app_token=raw.slack_app_token,
            api_url=raw.slack_api_url,
            webhook_secret=raw.webhook_secret,
        ),
        model=ModelSettings(
            api_key=raw.anthropic_api_key,
            base_url=raw.anthropic_base_url,
            name=raw.model,
            max_tokens=raw.max_tokens,
            timeout_s=raw.model_timeout_s,
        ),
        tool=ToolSettings(
            modules=modules,
            docs_dir=raw.docs_dir,
            # The tools' own tables live in opsloop's database unless told otherwise.
            tickets_url=raw.tickets_url or raw.database_url,
            demo_url=raw.demo_url or raw.database_url,
        ),
        http=HttpSettings(header_timeout_s=raw.header_timeout_s, body_timeout_s=raw.body_timeout_s),
        host=raw.host,
        port=raw.port,
        metrics_port=raw.metrics_port,
        local_state=raw.local_state,
        log_format=cast(LogFormat, raw.log_format),
    )


def with_overrides(settings: Settings, **changes: Any) -> Settings:
    """A copy of ``settings`` with top-level fields replaced (local mode, tests)."""
    return replace(settings, **changes)
