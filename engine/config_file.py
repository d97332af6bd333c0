"""The model of ``opsloop.yaml`` (DESIGN, "The configuration file"), read once at startup.

Each tool source owns the model of its section (``tools.mcp``: ``tools/mcp/config.py``;
``tools.http`` and ``tools.http_allow_hosts``: ``tools/http_config.py``); this module
composes them with ``approvals`` and ``policy``, so the file is checked by one set of
rules whether ``opsloop config check`` or ``opsloop serve`` reads it.

``load_config_file(path, env)`` reads the YAML (duplicate keys refused), replaces
``${VAR}`` in string values from ``env`` (``$${`` is a literal ``${``; done on parsed
strings, so a value cannot inject YAML), and validates it into a frozen
:class:`ConfigFile`. Every problem is one ``ConfigError`` whose message is one line:
``opsloop.yaml: policy[2].quorum (rule 3): must be at least 1``.

Header and environment values are ``SecretStr`` (and an HTTP body or MCP args are kept
out of ``repr``), so a logged config shows no secret; ``plain_headers()`` /
``plain_env()`` give them to the code that sends them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.errors import ConfigError
from tools.config_model import Duration, JsonSchema
from tools.config_model import KeyProblem as _At
from tools.config_model import StrictModel as _Model
from tools.config_model import parse_duration as parse_duration  # re-exported: the CLI's
from tools.http_config import ActionName, AllowedHosts, AllowHostEntry, HttpActionConfig, unlisted
from tools.integrations.config import IntegrationsConfig
from tools.mcp.config import McpServerConfig, ServerName
from tools.schemas import compile_schema, is_valid

DEFAULT_PATH = "opsloop.yaml"
RulePolicy = Literal["run_now", "approve_before_run", "wait_for_external_event", "reject"]
LATER_SECTIONS: tuple[str, ...] = ()  # sections of DESIGN not acted on yet (none left)
# Rule keys of DESIGN that nothing acts on yet: a file that sets one is refused rather
# than promised something that never happens (none left in this release).
LATER_RULE_KEYS: tuple[str, ...] = ()

MAX_QUORUM = 50
MAX_RULES = 1000
MAX_FILE_BYTES = 1024 * 1024
MAX_NESTING = 64
_APPROVER = re.compile(r"^(?:[UWS][A-Z0-9]{2,}|oncall:[A-Z0-9]{2,})$")
_CHANNEL = re.compile(r"^[CGD][A-Z0-9]{2,}$")
_ESCALATION_CHANNEL = re.compile(r"^[CG][A-Z0-9]{2,}$")  # a channel an expiry is posted in
_VARIABLE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{")


def _approver(value: str) -> str:
    if not _APPROVER.match(value):
        raise ValueError(
            f"{value!r} is not an approver: use user ids (U…, W…), user-group ids (S…) "
            "or oncall:<schedule or escalation policy id>"
        )
    return value


def _channel(value: str) -> str:
    if not _CHANNEL.match(value):
        raise ValueError(f"{value!r} is not a channel id (C…, G… or D…)")
    return value


def _escalation(value: str) -> str:
    if not (_APPROVER.match(value) or _ESCALATION_CHANNEL.match(value)):
        raise ValueError(
            f"{value!r} is not someone to escalate to: use user ids (U…, W…), user-group "
            "ids (S…), oncall:<schedule or escalation policy id> or a channel id (C…)"
        )
    return value


def _short(text: str, limit: int = 160) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


Approver = Annotated[str, AfterValidator(_approver)]
Channel = Annotated[str, AfterValidator(_channel)]
EscalationTarget = Annotated[str, AfterValidator(_escalation)]


class ToolsConfig(_Model):
    """``tools:``, composed of the sections each tool source owns."""

    modules: list[str] = Field(default_factory=list)
    http_allow_hosts: list[AllowHostEntry] = Field(default_factory=list)
    mcp: dict[ServerName, McpServerConfig] = Field(default_factory=dict)
    http: dict[ActionName, HttpActionConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _hosts_listed(self) -> ToolsConfig:
        if (bad := unlisted(self.http, self.allowed_hosts)) is not None:
            name, problem = bad
            raise _At(("http", name, "url"), problem)
        return self

    @property
    def allowed_hosts(self) -> AllowedHosts:
        return AllowedHosts.parse(self.http_allow_hosts)


# --- approvals and policy -----------------------------------------------------------------


class ApprovalsConfig(_Model):
    """Defaults for every rule; a key left out falls back to the environment's setting."""

    approvers: list[Approver] | None = None
    allow_self: bool | None = None
    expires_in: Duration | None = None


class PolicyRule(_Model):
    """One rule: the first whose ``tool`` glob matches and whose ``when`` holds decides."""

    tool: str
    when: JsonSchema | None = None
    policy: RulePolicy
    reason: str | None = None
    approvers: list[Approver] | None = None
    quorum: int | None = Field(None, ge=1, le=MAX_QUORUM)
    allow_self: bool | None = None
    expires_in: Duration | None = None
    # A reminder in the thread this long after the card, while nobody decided; and whom
    # an expiry is posted to (people and groups mentioned in the thread, or a channel).
    remind_after: Duration | None = None
    escalate_to: list[EscalationTarget] | None = None
    # The longest standing grant ("Approve for 1 h") an approval may create; none: no grants.
    max_grant: Duration | None = None
    channels: list[Channel] | None = None
    idempotent: bool | None = None
    trust_hints: bool | None = None
    _when: Any = PrivateAttr(None)  # the compiled validator of ``when``

    @field_validator("tool")
    @classmethod
    def _glob(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a tool name or a glob such as mcp__grafana__*")
        return value

    @model_validator(mode="after")
    def _quorum_reachable(self) -> PolicyRule:
        people = self.approvers or []
        only_users = people and all(a[0] in "UW" for a in people)
        if self.quorum and only_users and len(set(people)) < self.quorum:
            raise _At(
                ("quorum",), f"is {self.quorum} but only {len(set(people))} approvers are listed"
            )
        if self.expires_in and self.remind_after and self.remind_after >= self.expires_in:
            raise _At(("remind_after",), "must be shorter than expires_in: it would never come")
        channels = [t for t in self.escalate_to or () if _ESCALATION_CHANNEL.match(t)]
        if len(channels) > 1:
            raise _At(("escalate_to",), "may name one channel, not several")
        return self

    def model_post_init(self, context: Any, /) -> None:
        if self.when is not None:
            self._when = compile_schema(self.when)

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Do ``arguments`` satisfy ``when`` (always, without one)? Raises
        ``tools.schemas.SchemaProblem`` when it cannot be evaluated for them."""
        return self._when is None or is_valid(self._when, dict(arguments))


# --- alerts -------------------------------------------------------------------------------


class AlertSourceConfig(_Model):
    """One source of ``alerts:``: the channel its alerts open threads in, and what the
    model is told to do with them (the first input of each such thread)."""

    channel: Channel
    instruction: str = Field(
        "Investigate with read-only tools and summarise. Do not act.", min_length=1
    )


class AlertmanagerConfig(AlertSourceConfig):
    token: SecretStr  # bearer token on POST /alerts/alertmanager


class GenericAlertConfig(AlertSourceConfig):
    secret: SecretStr  # POST /alerts/generic is signed like /hooks


class AlertsConfig(_Model):
    """``alerts:``; ``pagerduty`` is verified with ``integrations.pagerduty.webhook_secret``."""

    alertmanager: AlertmanagerConfig | None = None
    pagerduty: AlertSourceConfig | None = None
    generic: GenericAlertConfig | None = None


class SlackConfig(_Model):
    """``slack:``: how a run's plan message shows (DESIGN, "The thread as a live plan").
    ``task_display_mode``: ``plan`` (the tasks together) or ``timeline`` (in the order
    they came); ``stream_rotate_after``: how long one streamed segment lives before a
    new one continues the plan (Slack ends a stream after about five minutes)."""

    task_display_mode: Literal["plan", "timeline"] = "plan"
    stream_rotate_after: Duration = Field(default=240.0, ge=30, le=280)


# --- the file -----------------------------------------------------------------------------


class ConfigFile(_Model):
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    policy: list[PolicyRule] = Field(default_factory=list, max_length=MAX_RULES)
    integrations: IntegrationsConfig = Field(default_factory=IntegrationsConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    slack: SlackConfig = Field(default_factory=SlackConfig)

    @model_validator(mode="after")
    def _pagerduty_alerts_verifiable(self) -> ConfigFile:
        pd = self.integrations.pagerduty
        if self.alerts.pagerduty is not None and (pd is None or pd.webhook_secret is None):
            raise _At(
                ("alerts", "pagerduty"),
                "needs integrations.pagerduty.webhook_secret to verify what PagerDuty sends",
            )
        return self

    @model_validator(mode="after")
    def _quorums_reachable(self) -> ConfigFile:
        """A rule without its own approvers takes ``approvals.approvers``: a quorum above
        the number of users listed there could never be met either."""
        people = self.approvals.approvers or []
        if not people or not all(a[0] in "UW" for a in people):
            return self
        for index, rule in enumerate(self.policy):
            if rule.approvers is None and rule.quorum and rule.quorum > len(set(people)):
                raise _At(
                    ("policy", index, "quorum"),
                    f"is {rule.quorum} but approvals.approvers lists only "
                    f"{len(set(people))} approvers",
                )
        return self

    @model_validator(mode="after")
    def _reminders_before_expiry(self) -> ConfigFile:
        """A rule without its own ``expires_in`` takes ``approvals.expires_in``: a
        reminder at or after it would never come."""
        expires = self.approvals.expires_in
        for index, rule in enumerate(self.policy):
            if rule.expires_in is None and expires and (rule.remind_after or 0) >= expires:
                raise _At(
                    ("policy", index, "remind_after"),
                    "must be shorter than approvals.expires_in: it would never come",
                )
        return self

    @property
    def modules(self) -> tuple[str, ...]:
        """``tools.modules``; the full list is these plus ``OPSLOOP_TOOLS``: see
        :meth:`modules_with`."""
        return tuple(dict.fromkeys(self.tools.modules))

    def modules_with(self, env: Mapping[str, str]) -> tuple[str, ...]:
        """The file's modules, then those of ``OPSLOOP_TOOLS``, each once (a union: the
        environment adds to the file here rather than replacing it)."""
        extra = (m.strip() for m in env.get("OPSLOOP_TOOLS", "").split(","))
        return tuple(dict.fromkeys([*self.tools.modules, *(m for m in extra if m)]))

    def env_values(self) -> dict[str, str]:
        """The file's values for settings that have a variable, keyed by its name, for
        ``load_settings(env, file=...)``; only keys the file gives."""
        values: dict[str, str] = {}
        if self.tools.modules:
            values["OPSLOOP_TOOLS"] = ",".join(self.modules)
        a = self.approvals
        if a.approvers is not None:
            values["OPSLOOP_APPROVERS"] = ",".join(a.approvers)
        if a.allow_self is not None:
            values["OPSLOOP_ALLOW_SELF_APPROVAL"] = "true" if a.allow_self else "false"
        if a.expires_in is not None:
            values["OPSLOOP_APPROVAL_TTL_SECONDS"] = repr(a.expires_in)
        return values

    @property
    def policy_hash(self) -> str:
        """sha256 of the canonical JSON of ``approvals`` + ``policy`` (keys left out are
        left out, so a release adding an optional key keeps the hashes of old files)."""
        doc = {
            "approvals": self.approvals.model_dump(mode="json", exclude_none=True),
            "policy": [r.model_dump(mode="json", exclude_none=True) for r in self.policy],
        }
        canon = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canon.encode()).hexdigest()


# --- reading ------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (YAML keeps the last one silently),
    anchors and aliases (the file needs none, and nine aliases of nine anchors expand to
    millions of nodes before any validation), and nesting past ``MAX_NESTING`` (the
    composer recurses: a thousand levels was a RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not supported", event.start_mark
            )
        if self._depth >= MAX_NESTING:
            raise yaml.composer.ComposerError(
                None, None, f"is nested more than {MAX_NESTING} levels deep", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if not isinstance(key, str | int | float | bool):
                continue  # an unhashable key: the mapping's own check reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def rule_name(index: int) -> str:
    """The ``policy:`` entry at 0-based ``index`` as people count it: ``rule 3``. Cards,
    the trace, ``policy check`` and ``opsloop tools`` all say it so; an error about the
    file says both (:func:`_path`)."""
    return f"rule {index + 1}"


def _path(loc: tuple[Any, ...]) -> str:
    """``policy[2].quorum (rule 3)``: where in the file, and a rule as cards number it."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    if len(loc) > 1 and loc[0] == "policy" and isinstance(loc[1], int):
        out += f" ({rule_name(loc[1])})"
    return out or "(top level)"


def substitute(
    data: Any,
    env: Mapping[str, str],
    loc: tuple[Any, ...] = (),
    used: dict[str, str] | None = None,
    filled: list[tuple[Any, ...]] | None = None,
) -> Any:
    """``data`` with ``${VAR}`` in every string value replaced from ``env``; ``used``
    collects what was put in (value -> name) so an error message can hide it again, and
    ``filled`` where (the keys of the values that held a variable)."""
    used = {} if used is None else used
    if isinstance(data, dict):
        return {k: substitute(v, env, (*loc, k), used, filled) for k, v in data.items()}
    if isinstance(data, list):
        return [substitute(v, env, (*loc, i), used, filled) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data
    if filled is not None:
        filled.append(loc)

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if name is None:
            raise _At(loc, "${ must be followed by a variable name and } (write $${ for ${)")
        if not env.get(name):
            raise _At(loc, f"${{{name}}} is not set")
        used[env[name]] = f"${{{name}}}"
        return env[name]

    return _VARIABLE.sub(one, data)


def _message(error: Any) -> tuple[tuple[Any, ...], str]:
    loc, kind, given = tuple(error["loc"]), error["type"], error.get("input")
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), _At):
        return (*loc, *ctx["error"].path), str(ctx["error"])
    if kind == "extra_forbidden":
        if len(loc) == 1 and loc[0] in LATER_SECTIONS:
            return loc, "is not supported by this release"
        if len(loc) == 3 and loc[0] == "policy" and loc[2] in LATER_RULE_KEYS:
            return loc, "is not supported by this release"
        return loc, "is not a known key"
    messages = {
        "missing": "is required",
        "string_type": f"must be a string, not {given!r}",
        "bool_type": f"must be true or false, not {given!r}",
        "int_type": f"must be a whole number, not {given!r}",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "model_attributes_type": "must be a mapping",
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "too_long": f"may hold at most {ctx.get('max_length')} entries",
        "literal_error": f"must be one of {ctx.get('expected')}, not {given!r}",
    }
    if kind in messages:
        return loc, messages[kind]
    return loc, str(error["msg"]).removeprefix("Value error, ")


def parse_config(text: str, env: Mapping[str, str], name: str = DEFAULT_PATH) -> ConfigFile:
    """Validate the text of a configuration file; ``name`` heads every error."""
    data = _read_yaml(text, name)
    used: dict[str, str] = {}
    try:
        filled = substitute(data, env, used=used)
        # Which values came from the environment: an MCP server's secrets (redacted from
        # what it answers, masked in logs), beside its header values.
        return ConfigFile.model_validate(filled, context={"substituted": used})
    except _At as exc:
        raise ConfigError(f"{name}: {_path(exc.path)}: {_short(str(exc))}") from None
    except ValidationError as exc:
        loc, message = _message(exc.errors(include_url=False)[0])
        raise ConfigError(f"{name}: {_path(loc)}: {_short(_hide(message, used))}") from None


def _read_yaml(text: str, name: str) -> dict[str, Any]:
    """The file's YAML as data, before variables and validation."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"{name}: is over {MAX_FILE_BYTES // 1024} KiB; opsloop reads no more")
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{name}: {where}{_short(str(exc.problem or exc))}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: {_short(str(exc))}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: must be a mapping (tools:, approvals:, policy:)")
    return data


# --- the shape alone (``opsloop config check --no-env``) -----------------------------------


@dataclass(frozen=True)
class Shape:
    """What can be told of a file without the environment: every ``${VAR}`` stands for a
    placeholder, and a key whose check fails only because of one is not judged."""

    config: ConfigFile | None  # None: some key could be checked only with a variable's value
    needs: tuple[str, ...]  # every ${VAR} the file names, in order
    unchecked: tuple[str, ...]  # the keys only the variables' values can tell, as ``_path``


def placeholder(name: str) -> str:
    """What ``${name}`` stands for in a shape check: valid as a word, a header value or a
    host name, so most keys that hold a variable are checked all the same."""
    return "opsloop-unset-" + name.lower().replace("_", "-")


def variables(data: Any) -> tuple[str, ...]:
    """The names of every ``${VAR}`` in the string values of ``data``, in order."""
    found: dict[str, None] = {}
    if isinstance(data, dict):
        for value in data.values():
            found.update(dict.fromkeys(variables(value)))
    elif isinstance(data, list):
        for value in data:
            found.update(dict.fromkeys(variables(value)))
    elif isinstance(data, str):
        found.update(dict.fromkeys(m.group(1) for m in _VARIABLE.finditer(data) if m.group(1)))
    return tuple(found)


def _under(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Is one of the two keys at or under the other?"""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def parse_shape(text: str, name: str = DEFAULT_PATH) -> Shape:
    """Check the file as :func:`parse_config` does, with no variable set. A problem found
    at a key that holds a variable, or by a check that reads one (a section's own check,
    such as hosts against ``http_allow_hosts``), is left to the values: its key is in
    ``unchecked``. Any other problem is the same ``ConfigError`` as at startup."""
    data = _read_yaml(text, name)
    needs = variables(data)
    filled: list[tuple[Any, ...]] = []
    try:
        data = substitute(data, {n: placeholder(n) for n in needs}, filled=filled)
    except _At as exc:
        raise ConfigError(f"{name}: {_path(exc.path)}: {_short(str(exc))}") from None
    try:
        return Shape(ConfigFile.model_validate(data), needs, ())
    except ValidationError as exc:
        unchecked: list[str] = []
        for error in exc.errors(include_url=False):
            loc, message = _message(error)
            # Where the check ran: the key itself, or the section whose own check it is.
            scope = tuple(p for p in error["loc"] if p != "[key]")
            at = tuple(p for p in loc if p != "[key]")
            if any(_under(scope, f) or _under(at, f) for f in filled):
                unchecked.append(_path(loc))
                continue
            raise ConfigError(f"{name}: {_path(loc)}: {_short(message)}") from None
        return Shape(None, needs, tuple(dict.fromkeys(unchecked)))


def read_shape(path: str | None, env: Mapping[str, str]) -> tuple[str, Shape] | None:
    """The file :func:`load_config_file` would read (``env`` only locates it:
    ``OPSLOOP_CONFIG``), its name and :func:`parse_shape`; None when there is none."""
    file = _locate(path, env)
    if file is None:
        return None
    return str(file), parse_shape(_read(file, path), str(file))


def _hide(message: str, used: Mapping[str, str]) -> str:
    """An error may quote a value: show a substituted one as its ``${VAR}``, since the
    environment is where secrets come from."""
    for value in sorted(used, key=len, reverse=True):
        if len(value) >= 4:
            message = message.replace(value, used[value])
    return message


def load_config_file(path: str | None, env: Mapping[str, str]) -> ConfigFile | None:
    """The configuration file: ``path``, else ``OPSLOOP_CONFIG``, else ``./opsloop.yaml``
    when present, else None (the environment variables alone). A file that is named but
    missing is an error."""
    file = _locate(path, env)
    if file is None:
        return None
    return parse_config(_read(file, path), env, str(file))


def _locate(path: str | None, env: Mapping[str, str]) -> Path | None:
    named = path or env.get("OPSLOOP_CONFIG", "").strip() or None
    if named is None and not os.path.exists(DEFAULT_PATH):
        return None
    return Path(named or DEFAULT_PATH)


def _read(file: Path, path: str | None) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        via = "" if path else " (named by OPSLOOP_CONFIG)"
        raise ConfigError(f"{file}: no such file{via}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{file}: cannot be read: {_short(reason)}") from None
