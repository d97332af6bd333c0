"""The stored OAuth of one MCP server: the row of ``mcp_oauth`` as the store gives it
(``engine.store``) and tools/mcp/auth.py reads it. Its own small module, so that the
store names it without loading the MCP SDK."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class McpOAuthRecord:
    """``engine.tables.McpOAuthRow`` says what each field holds; the JSON stays text."""

    server: str
    binding: str
    tokens: str | None
    expires_at: datetime | None
    client_info: str | None
    pending_state: str | None
    pending_verifier: str | None
    pending_url: str | None
    pending_since: datetime | None
    code: str | None
    iss: str | None
    updated_at: datetime


# What the callback of an authorization brought, taken once: (code, iss, PKCE verifier).
TakenCode = tuple[str, str | None, str | None]
