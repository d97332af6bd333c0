"""One MCP server as configured under ``tools.mcp`` in opsloop.yaml."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_SERVER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,40}")


@dataclass(frozen=True)
class McpServer:
    """Where an MCP server is: ``url`` (streamable HTTP) or ``command`` (a stdio subprocess).

    ``headers`` and ``env`` hold secrets (tokens, kubeconfigs): they are left out of
    ``repr`` and every message we build is scrubbed of their values (``redact``).
    ``tools``, when given, is the allowlist of the server's tool names to load.
    """

    name: str
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    tools: tuple[str, ...] | None = None
    # Connecting (spawn + handshake, or the first HTTP round trip) gives up after this.
    connect_timeout_s: float = 20.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SERVER_NAME.fullmatch(self.name):
            raise ValueError(
                f"MCP server name {self.name!r} must be 1-40 characters of a-z A-Z 0-9 _ -"
            )
        if (self.url is None) == (self.command is None):
            raise ValueError(f"MCP server {self.name!r} needs exactly one of url or command")
        object.__setattr__(self, "args", tuple(self.args))
        if self.tools is not None:
            object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"

    def redact(self, text: str) -> str:
        """``text`` with every header and env value replaced by ``***``."""
        secrets = [v for v in (*self.headers.values(), *self.env.values()) if v]
        for value in sorted(secrets, key=len, reverse=True):
            text = text.replace(value, "***")
        return text
