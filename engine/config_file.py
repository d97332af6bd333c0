"""The model of ``opsloop.yaml`` (DESIGN, "The configuration file"), read once at startup.

``load_config_file(path, env)`` reads the YAML (duplicate keys refused), replaces
``${VAR}`` in string values from ``env`` (``$${`` is a literal ``${``; done on parsed
strings, so a value cannot inject YAML), and validates it into a frozen
:class:`ConfigFile`. Every problem is one ``ConfigError`` whose message is one line:
``opsloop.yaml: policy[2].quorum: must be at least 1``.

Header and environment values are ``SecretStr`` (and an HTTP body or MCP args are kept
out of ``repr``), so a logged config shows no secret; ``plain_headers()`` /
``plain_env()`` give them to the code that sends them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.errors import ConfigError
from tools.schemas import compile_schema, is_valid

DEFAULT_PATH = "opsloop.yaml"
RulePolicy = Literal["run_now", "approve_before_run", "wait_for_external_event", "reject"]
LATER_SECTIONS = ("integrations", "alerts")

MAX_DURATION_S = 365 * 86400.0
MAX_QUORUM = 50
MAX_RULES = 1000
MAX_FILE_BYTES = 1024 * 1024
MAX_NESTING = 64
_DURATION = re.compile(r"^([1-9][0-9]*)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_APPROVER = re.compile(r"^(?:[UWS][A-Z0-9]{2,}|oncall:[A-Z0-9]{2,})$")
_CHANNEL = re.compile(r"^[CGD][A-Z0-9]{2,}$")
_HTTP_ACTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_MCP_SERVER_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_VARIABLE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{")
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class _At(ValueError):
    """A validator's problem at a key below the one it validates (``http.x.url``)."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        self.path = path
        super().__init__(message)


# --- value types --------------------------------------------------------------------------


def parse_duration(value: object) -> float:
    """``30s`` / ``10m`` / ``2h`` / ``1d`` in seconds, at most a year; anything else is an
    error (an unbounded one overflowed the clock arithmetic of every call it decided)."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"must be a duration such as 30s, 10m, 2h or 1d, not {value!r}")
    if len(match.group(1)) > 9 or int(match.group(1)) * _UNIT_S[match.group(2)] > MAX_DURATION_S:
        raise ValueError(f"must be at most a year (365d), not {value!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


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


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema opsloop can run safely (tools/schemas.py): refs inside it only,
    patterns the linear-time engine runs, no reference loop."""
    compile_schema(schema)  # SchemaProblem is a ValueError: one line at the key
    return schema


def _short(text: str, limit: int = 160) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


Duration = Annotated[float, BeforeValidator(parse_duration)]
Approver = Annotated[str, AfterValidator(_approver)]
Channel = Annotated[str, AfterValidator(_channel)]
JsonSchema = Annotated[dict[str, Any], AfterValidator(_json_schema)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- hosts --------------------------------------------------------------------------------


def _host_key(host: str) -> str:
    """A host as compared: lower case, no trailing dot, an IP in its canonical form."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _split_entry(entry: str) -> tuple[str, int | None]:
    """``host`` / ``1.2.3.4`` / ``::1`` / ``[::1]`` (any port) or ``host:port`` / ``[::1]:8443``."""
    if entry.startswith("["):
        host, closed, rest = entry[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else None
        if not closed or (rest and port is None):
            raise ValueError
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:
        host, port = entry, None
    key = _host_key(host)
    if not (_is_ip(key) or _HOST_NAME.match(key)):
        raise ValueError
    if port is None:
        return key, None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError
    return key, int(port)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _allow_entry(entry: str) -> str:
    try:
        _split_entry(entry)
    except ValueError:
        raise ValueError(
            f"{entry!r} is not a host: give a host name or IP (any port) or host:port"
        ) from None
    return entry


def host_allowed(url: str, allow_hosts: list[str] | tuple[str, ...]) -> bool:
    """Does ``url`` (http or https) go to a host in ``allow_hosts``? Pure; for startup and
    for the HTTP tool once the arguments are in the URL. Anything odd is refused."""
    if any(c.isspace() or c == "\\" or ord(c) < 32 for c in url):
        return False  # parsers disagree on these (WHATWG reads "\" as "/"): refuse
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return False
    host = _host_key(parts.hostname)
    for entry in allow_hosts:
        try:
            allowed, allowed_port = _split_entry(entry)
        except ValueError:
            continue
        if allowed == host and allowed_port in (None, port):
            return True
    return False


# --- tools --------------------------------------------------------------------------------


class McpServerConfig(_Model):
    """One MCP server: streamable HTTP (``url``) or a stdio subprocess (``command``)."""

    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list, repr=False)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    tools: list[str] | None = None  # the allowlist; None: every tool the server lists

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.url is not None and self.command is not None:
            raise ValueError("give either url or command, not both")
        if self.url is None and self.command is None:
            raise ValueError("give url (streamable HTTP) or command (stdio)")
        if self.url is not None:
            if urlsplit(self.url).scheme not in ("http", "https"):
                raise _At(("url",), f"must be an http or https URL, not {self.url!r}")
            if self.args or self.env:
                raise ValueError("args and env go with command, not url")
        elif self.headers:
            raise ValueError("headers go with url, not command")
        return self

    def plain_headers(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.headers.items()}

    def plain_env(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.env.items()}


class HttpActionConfig(_Model):
    """One HTTP action: a tool that sends one request, its arguments a JSON Schema."""

    description: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    body: Any = Field(None, repr=False)  # a template: strings may hold {argument}
    idempotency_header: str | None = None
    timeout: Duration | None = None
    arguments: JsonSchema = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) and value.upper() in _METHODS else value

    @field_validator("description")
    @classmethod
    def _described(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must say what the action does (the model reads it)")
        return value

    @field_validator("idempotency_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not _HEADER_NAME.match(value):
            raise ValueError(f"{value!r} is not a header name")
        return value

    @model_validator(mode="after")
    def _placeholders_are_arguments(self) -> HttpActionConfig:
        if self.arguments.get("type") != "object":
            raise _At(("arguments",), "must be a JSON Schema of type: object")
        known = set(self.arguments.get("properties") or {})
        for name in placeholders(self.url):
            if name not in known:
                raise _At(("url",), f"{{{name}}} is not one of the arguments")
        return self

    @property
    def idempotent(self) -> bool:
        """An HTTP action may re-run after a crash only if it sends an idempotency key."""
        return self.idempotency_header is not None

    def plain_headers(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.headers.items()}


def placeholders(template: str) -> list[str]:
    """The ``{argument}`` names in a URL or body template, in order."""
    return _PLACEHOLDER.findall(template)


class ToolsConfig(_Model):
    modules: list[str] = Field(default_factory=list)
    http_allow_hosts: list[Annotated[str, AfterValidator(_allow_entry)]] = Field(
        default_factory=list
    )
    mcp: dict[str, McpServerConfig] = Field(default_factory=dict)
    http: dict[str, HttpActionConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_and_hosts(self) -> ToolsConfig:
        for name in self.mcp:
            if not _MCP_SERVER_NAME.match(name):
                raise _At(("mcp", name), "a server name may hold only letters, digits, _ and -")
        for name, action in self.http.items():
            if not _HTTP_ACTION_NAME.match(name):
                raise _At(("http", name), "an action name is 1-64 letters, digits, _ or -")
            if not host_allowed(action.url, self.http_allow_hosts):
                host = urlsplit(action.url).netloc or action.url
                raise _At(("http", name, "url"), f"host {host!r} is not in tools.http_allow_hosts")
        return self


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
    remind_after: Duration | None = None
    escalate_to: list[Approver] | None = None
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
        return self

    def model_post_init(self, context: Any, /) -> None:
        if self.when is not None:
            self._when = compile_schema(self.when)

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Do ``arguments`` satisfy ``when`` (always, without one)? Raises
        ``tools.schemas.SchemaProblem`` when it cannot be evaluated for them."""
        return self._when is None or is_valid(self._when, dict(arguments))


# --- the file -----------------------------------------------------------------------------


class ConfigFile(_Model):
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    approvals: ApprovalsConfig = Field(default_factory=ApprovalsConfig)
    policy: list[PolicyRule] = Field(default_factory=list, max_length=MAX_RULES)

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


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def substitute(
    data: Any,
    env: Mapping[str, str],
    loc: tuple[Any, ...] = (),
    used: dict[str, str] | None = None,
) -> Any:
    """``data`` with ``${VAR}`` in every string value replaced from ``env``; ``used``
    collects what was put in (value -> name) so an error message can hide it again."""
    used = {} if used is None else used
    if isinstance(data, dict):
        return {k: substitute(v, env, (*loc, k), used) for k, v in data.items()}
    if isinstance(data, list):
        return [substitute(v, env, (*loc, i), used) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data

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
    used: dict[str, str] = {}
    try:
        return ConfigFile.model_validate(substitute(data, env, used=used))
    except _At as exc:
        raise ConfigError(f"{name}: {_path(exc.path)}: {_short(str(exc))}") from None
    except ValidationError as exc:
        loc, message = _message(exc.errors(include_url=False)[0])
        raise ConfigError(f"{name}: {_path(loc)}: {_short(_hide(message, used))}") from None


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
    named = path or env.get("OPSLOOP_CONFIG", "").strip() or None
    if named is None and not os.path.exists(DEFAULT_PATH):
        return None
    file = Path(named or DEFAULT_PATH)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        via = "" if path else " (named by OPSLOOP_CONFIG)"
        raise ConfigError(f"{file}: no such file{via}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{file}: cannot be read: {_short(reason)}") from None
    return parse_config(text, env, str(file))
