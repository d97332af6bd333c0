"""The model of ``tools.mcp.<name>`` in opsloop.yaml: where one MCP server is, the one
rule for a server's name, and how a server's tool names become names the model API
takes. The file's reader (``engine/config_file.py``) and
:class:`~tools.mcp.source.McpSource` both use these, so they refuse the same things."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, PrivateAttr, SecretStr, ValidationInfo, model_validator

from tools.config_model import KeyProblem, StrictModel, plain

# A server's tools are registered as mcp__<server>__<tool>, and Anthropic takes tool
# names of 1-64 characters of a-z A-Z 0-9 _ -. MCP allows more (``.``, ``/``, up to 128
# characters), so a tool's name is mapped (``registered_name``); a server name of at most
# 40 leaves every tool at least 8 characters of its own name before the hash suffix.
MAX_TOOL_NAME = 64
MAX_SERVER_NAME = 40
_SERVER_NAME = re.compile(rf"[a-zA-Z0-9_-]{{1,{MAX_SERVER_NAME}}}")
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
_SUFFIX = 8  # hex digits of sha256 after a cut name: collisions need 4 billion names
# Connecting (spawn + handshake, or the first HTTP round trip) gives up after this.
CONNECT_TIMEOUT_S = 20.0
# A secret shorter than this is not looked for in text: it would mask ordinary words.
MIN_SECRET = 4


def server_name(name: str) -> str:
    """``name`` if it can name an MCP server, else ``ValueError`` (one line)."""
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise ValueError(
            f"a server name is 1-{MAX_SERVER_NAME} letters, digits, _ or - (its tools are "
            f"named mcp__<server>__<tool>, at most {MAX_TOOL_NAME} characters)"
        )
    return name


def registered_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>`` in the model API's alphabet, the same for the same
    names every time: a character other than a-z A-Z 0-9 _ - becomes ``_``, and a name
    over 64 characters is cut, ending in ``_`` and 8 hex digits of the sha256 of the
    server's own tool name (so two long names that share a start stay apart)."""
    name = f"mcp__{server}__{_NOT_ALLOWED.sub('_', tool) or '_'}"
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:_SUFFIX]
    return f"{name[: MAX_TOOL_NAME - _SUFFIX - 1]}_{digest}"


ServerName = Annotated[str, AfterValidator(server_name)]


class McpServerConfig(StrictModel):
    """Where an MCP server is: ``url`` (streamable HTTP) or ``command`` (a stdio subprocess).

    ``headers`` and ``env`` may hold secrets (tokens, kubeconfigs): they are
    ``SecretStr`` and ``args`` stay out of ``repr``. Its secrets (:meth:`secrets`) are
    the header values and what ``${VAR}`` put in any of its values (the file's reader
    says which, through the validation context ``{"substituted": {value: "${VAR}"}}``);
    they are redacted from what its server answers and every message we build
    (``redact``). A plain ``env: {TZ_MODE: time}`` is no secret: it is in the file.
    ``tools``, when given, is the allowlist of the server's tool names.
    """

    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list, repr=False)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    tools: list[str] | None = None  # the allowlist; None: every tool the server lists
    _substituted: tuple[str, ...] = PrivateAttr(default=())  # what ${VAR} put in its values

    @model_validator(mode="after")
    def _note_substituted(self, info: ValidationInfo) -> McpServerConfig:
        filled: Any = (info.context or {}).get("substituted") or {}
        values = [
            *self.plain_headers().values(),
            *self.plain_env().values(),
            *self.args,
            self.url or "",
            self.command or "",
        ]
        self._substituted = tuple(v for v in filled if v and any(v in f for f in values))
        return self

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.url is not None and self.command is not None:
            raise ValueError("give either url or command, not both")
        if self.url is None and self.command is None:
            raise ValueError("give url (streamable HTTP) or command (stdio)")
        if self.url is not None:
            if urlsplit(self.url).scheme not in ("http", "https"):
                raise KeyProblem(("url",), f"must be an http or https URL, not {self.url!r}")
            if self.args or self.env:
                raise ValueError("args and env go with command, not url")
        elif self.headers:
            raise ValueError("headers go with url, not command")
        return self

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"

    def plain_headers(self) -> dict[str, str]:
        return plain(self.headers)

    def plain_env(self) -> dict[str, str]:
        return plain(self.env)

    def secrets(self) -> list[str]:
        """Every header value and every value ``${VAR}`` put in (what logs mask too)."""
        return sorted({v for v in (*self.plain_headers().values(), *self._substituted) if v})

    def redact(self, text: str) -> str:
        """``text`` with each secret of :meth:`secrets` (4 characters or more) as ``***``."""
        found = (v for v in self.secrets() if len(v) >= MIN_SECRET)
        for value in sorted(found, key=len, reverse=True):  # a secret holding another: whole
            text = text.replace(value, "***")
        return text
