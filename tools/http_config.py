"""The model of ``tools.http`` and ``tools.http_allow_hosts`` in opsloop.yaml: what an
HTTP action is (:class:`HttpActionConfig`), the one reading of the allowed hosts
(:class:`AllowedHosts`, ``.allows(url)``), the one placeholder rule and the one list
of methods. ``tools/http_actions.py`` sends what this describes; the file's reader
(``engine/config_file.py``) and ``opsloop serve`` both refuse what it refuses.

Pure: no I/O here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from tools._checks import NAME_RE, RESERVED_NAMES
from tools.config_model import Duration, JsonSchema, KeyProblem, StrictModel, plain

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
METHODS: tuple[str, ...] = get_args(Method)
DEFAULT_TIMEOUT_S = 30.0
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DOT_SEGMENTS = frozenset({".", "..", "%2e", ".%2e", "%2e.", "%2e%2e"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)


def placeholders(template: str) -> list[str]:
    """The ``{argument}`` names in a URL or body template, in order."""
    return PLACEHOLDER.findall(template)


def has_dot_segment(path: str) -> bool:
    """Does ``path`` hold a ``.`` or ``..`` segment (plain or percent-encoded)?"""
    return any(seg.lower() in _DOT_SEGMENTS for seg in path.split("/"))


def action_name(name: str) -> str:
    """An action's name is its tool's name: Anthropic's rule, not the engine's own."""
    if not NAME_RE.fullmatch(name):
        raise ValueError("an action name is 1-64 letters, digits, _ or -")
    if name in RESERVED_NAMES:
        raise ValueError(f"{name!r} is the name of the engine's own control tool")
    return name


# --- allowed hosts -------------------------------------------------------------------------


def _host_key(host: str) -> str:
    """A host as compared: lower case, no trailing dot, an IP in its canonical form (so
    ``0:0:0:0:0:0:0:1``, ``[::1]`` and ``::1`` are one address)."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class AllowedHost:
    """One ``tools.http_allow_hosts`` entry: a host (any port) or ``host:port``."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> AllowedHost:
        """``host`` / ``1.2.3.4`` / ``::1`` / ``[::1]`` (any port) or ``host:port`` /
        ``[::1]:8443``; ``ValueError`` (one line) for anything else."""
        problem = ValueError(
            f"{entry!r} is not a host: give a host name or IP (any port) or host:port"
        )
        port: str | None
        if entry.startswith("["):
            host, closed, rest = entry[1:].partition("]")
            port = rest.removeprefix(":") if rest.startswith(":") else None
            if not closed or (rest and port is None):
                raise problem
        elif entry.count(":") == 1:
            host, port = entry.split(":")
        else:
            host, port = entry, None
        key = _host_key(host)
        if not (_is_ip(key) or _HOST_NAME.match(key)):
            raise problem
        if port is None:
            return cls(key)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise problem
        return cls(key, int(port))


@dataclass(frozen=True)
class AllowedHosts:
    """The hosts HTTP actions may reach."""

    entries: tuple[AllowedHost, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowedHosts:
        return cls(tuple(AllowedHost.parse(e) for e in entries))

    def allows(self, url: str) -> bool:
        """Does ``url`` (http or https) go to a listed host? For startup and again for
        each call once the arguments are in the URL. Anything odd is refused."""
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
        return any(e.host == host and e.port in (None, port) for e in self.entries)


def _allow_entry(entry: str) -> str:
    AllowedHost.parse(entry)
    return entry


AllowHostEntry = Annotated[str, AfterValidator(_allow_entry)]
ActionName = Annotated[str, AfterValidator(action_name)]


def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").rstrip(".")
    except ValueError:
        return ""


def unlisted(
    actions: Mapping[str, HttpActionConfig], allow: AllowedHosts
) -> tuple[str, str] | None:
    """The first action whose host ``allow`` does not list, with the problem; else None."""
    for name, action in actions.items():
        if not allow.allows(action.url):
            return name, f"host {host_of(action.url)!r} is not in tools.http_allow_hosts"
    return None


# --- an action ---------------------------------------------------------------------------


class HttpActionConfig(StrictModel):
    """One ``tools.http.<name>`` entry: a tool that sends one request, its arguments a
    JSON Schema. Header values are secrets; the body template stays out of ``repr``."""

    description: str
    method: Method = "POST"
    url: str
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    body: Any = Field(None, repr=False)  # a template: strings may hold {argument}
    idempotency_header: str | None = None
    timeout: Duration = DEFAULT_TIMEOUT_S
    arguments: JsonSchema = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) and value.upper() in METHODS else value

    @field_validator("description")
    @classmethod
    def _described(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must say what the action does (the model reads it)")
        return value

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name in value:
            if not _HEADER_NAME.match(name):
                raise KeyProblem((name,), f"{name!r} is not a header name")
        return value

    @field_validator("idempotency_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not _HEADER_NAME.match(value):
            raise ValueError(f"{value!r} is not a header name")
        return value

    @model_validator(mode="after")
    def _usable_url(self) -> HttpActionConfig:
        if self.arguments.get("type") != "object":
            raise KeyProblem(("arguments",), "must be a JSON Schema of type: object")
        problem = _url_problem(self.url, self.arguments)
        if problem is not None:
            raise KeyProblem(("url",), problem)
        return self

    @property
    def idempotent(self) -> bool:
        """An HTTP action may re-run after a crash only if it sends an idempotency key."""
        return self.idempotency_header is not None

    def plain_headers(self) -> dict[str, str]:
        return plain(self.headers)


def _url_problem(url: str, arguments: Mapping[str, Any]) -> str | None:
    """What makes ``url`` unusable for an action with ``arguments``, or None.

    A placeholder must name a *required* argument: an optional one may be missing when
    the action is called, and the URL would then be sent with a hole in it."""
    if any(c.isspace() or c == "\\" or ord(c) < 32 for c in url):
        return "must not hold spaces, control characters or backslashes"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        return f"{url!r} is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an absolute http:// or https:// URL"
    if "{" in parts.netloc or "}" in parts.netloc:
        return "placeholders may appear only in the url's path and query"
    if parts.username or parts.password:
        return "must not hold credentials; put them in headers"
    if parts.fragment:
        return "must not have a #fragment"
    known = arguments.get("properties") or {}
    required = set(arguments.get("required") or ())
    for name in placeholders(parts.path + "?" + parts.query):
        if name not in known:
            return f"{{{name}}} is not one of the arguments"
        if name not in required:
            return f"{{{name}}} must be a required argument (an optional one may be missing)"
    if has_dot_segment(PLACEHOLDER.sub("x", parts.path)):
        return "its path must not have '.' or '..' segments"
    return None
