"""The model of ``tools.mcp.<name>`` in opsloop.yaml: where one MCP server is, and the
one rule for a server's name. The file's reader (``engine/config_file.py``) and
:class:`~tools.mcp.source.McpSource` both use these, so they refuse the same things."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, model_validator

from tools.config_model import KeyProblem, StrictModel, plain

# A server's tools are registered as mcp__<server>__<tool>, and Anthropic takes tool
# names of at most 64 characters: 64 - len("mcp__") - len("__") leaves 57 for the
# server and the tool, so a longer server name than 56 leaves no tool a name. Whether
# each of the server's own tool names fits is known only once it lists them (startup
# refuses a tool whose full name is too long, naming it).
MAX_SERVER_NAME = 64 - len("mcp__") - len("__") - 1
_SERVER_NAME = re.compile(rf"[a-zA-Z0-9_-]{{1,{MAX_SERVER_NAME}}}")
# Connecting (spawn + handshake, or the first HTTP round trip) gives up after this.
CONNECT_TIMEOUT_S = 20.0


def server_name(name: str) -> str:
    """``name`` if it can name an MCP server, else ``ValueError`` (one line)."""
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise ValueError(
            f"a server name is 1-{MAX_SERVER_NAME} letters, digits, _ or - (its tools are "
            "named mcp__<server>__<tool>, at most 64 characters)"
        )
    return name


ServerName = Annotated[str, AfterValidator(server_name)]


class McpServerConfig(StrictModel):
    """Where an MCP server is: ``url`` (streamable HTTP) or ``command`` (a stdio subprocess).

    ``headers`` and ``env`` hold secrets (tokens, kubeconfigs): they are ``SecretStr``,
    ``args`` stay out of ``repr``, and every message we build is scrubbed of their values
    (``redact``). ``tools``, when given, is the allowlist of the server's tool names.
    """

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

    def redact(self, text: str) -> str:
        """``text`` with every header and env value replaced by ``***``."""
        secrets = [v for v in (*self.plain_headers().values(), *self.plain_env().values()) if v]
        for value in sorted(secrets, key=len, reverse=True):
            text = text.replace(value, "***")
        return text
