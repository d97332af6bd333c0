"""Settings read from the environment, validated once at startup.

Every problem is a ``ConfigError`` whose message is one line naming the variable, so a
process that cannot start says why and exits 2 instead of printing a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine.db import DEFAULT_DATABASE_URL, parse_database_url
from engine.errors import ConfigError
from engine.policy import ApproverPolicy
from engine.runner import RunnerConfig

_SLACK_ID = re.compile(r"^[UWS][A-Z0-9]{2,}$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    database_url: str
    tools: str | None
    approvers: ApproverPolicy
    runner: RunnerConfig
    sweep_seconds: float


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, not {raw!r}")
    return value


def approver_policy(env: Mapping[str, str]) -> ApproverPolicy:
    ids = [a.strip() for a in env.get("OPSLOOP_APPROVERS", "").split(",") if a.strip()]
    bad = [a for a in ids if not _SLACK_ID.match(a)]
    if bad:
        raise ConfigError(
            f"OPSLOOP_APPROVERS holds {', '.join(map(repr, bad))}: use Slack user ids "
            "(U…, W…) or user-group ids (S…), comma-separated"
        )
    flag = env.get("OPSLOOP_ALLOW_SELF_APPROVAL", "").strip().lower()
    if flag not in _TRUE + _FALSE:
        raise ConfigError(f"OPSLOOP_ALLOW_SELF_APPROVAL must be true or false, not {flag!r}")
    return ApproverPolicy(frozenset(ids), flag in _TRUE)


def runner_config(env: Mapping[str, str]) -> RunnerConfig:
    base = RunnerConfig()
    return RunnerConfig(
        lease_ttl_s=_number(env, "OPSLOOP_LEASE_SECONDS", base.lease_ttl_s, minimum=1),
        approval_ttl_s=_number(env, "OPSLOOP_APPROVAL_TTL_SECONDS", base.approval_ttl_s, minimum=1),
        max_rejections=int(_number(env, "OPSLOOP_MAX_REJECTIONS", base.max_rejections, minimum=1)),
        max_tool_attempts=int(
            _number(env, "OPSLOOP_MAX_TOOL_ATTEMPTS", base.max_tool_attempts, minimum=1)
        ),
        retry_base_s=_number(env, "OPSLOOP_RETRY_BASE_SECONDS", base.retry_base_s, minimum=0.01),
        tool_timeout_s=_number(env, "OPSLOOP_TOOL_TIMEOUT_SECONDS", base.tool_timeout_s, minimum=1),
        context_budget_tokens=int(
            _number(env, "OPSLOOP_CONTEXT_BUDGET_TOKENS", base.context_budget_tokens, minimum=1000)
        ),
    )


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    url = env.get("DATABASE_URL", "").strip() or DEFAULT_DATABASE_URL
    parse_database_url(url)  # fail early, in one line
    return Settings(
        database_url=url,
        tools=env.get("OPSLOOP_TOOLS") or None,
        approvers=approver_policy(env),
        runner=runner_config(env),
        sweep_seconds=_number(env, "OPSLOOP_SWEEP_SECONDS", 1.0, minimum=0.05),
    )
