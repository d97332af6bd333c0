"""Errors of MCP tool sources, fitted into the tree of tools/errors.py.

Tree::

    ToolLoadError
    +-- McpLoadError          startup: unreachable server, bad tool name, missing tool
    ToolError
    +-- DefinitionChanged     the tool's definition is not the one the call was approved under
    RetryableToolError
    +-- McpUnavailable        the server is down or the connection dropped before a tool call
                              went out (connecting, the definition check); the next call reconnects
        +-- McpUnauthorized   the server answered 401: it needs authorization
            +-- McpNotAuthorized  its OAuth (``auth:``) got no token: an admin has yet
                                  to authorize opsloop, or the authorization server refused

A tool call whose ``tools/call`` went out before the connection dropped (or its answer
timed out) raises ``tools.errors.OutcomeUnknown`` instead: the server may have run it.
"""

from __future__ import annotations

from tools.errors import RetryableToolError, ToolError, ToolLoadError


class McpLoadError(ToolLoadError):
    """One line naming the server (and the tool, when one is at fault)."""

    def __init__(self, server: str, message: str, cause: BaseException | None = None) -> None:
        # ToolLoadError's own wording is about importing a module; keep its fields only.
        ToolError.__init__(self, " ".join(message.split()))
        self.module = f"mcp:{server}"
        self.cause = cause if cause is not None else self
        self.server = server


class DefinitionChanged(ToolError):
    """Raised instead of running a call whose tool changed since it was approved."""


class McpUnavailable(RetryableToolError):
    """The MCP server cannot be reached now (down, crashed, connection dropped) and no
    tool call was sent: retrying cannot repeat an effect."""


class McpUnauthorized(McpUnavailable):
    """The server answered HTTP 401: it wants authorization opsloop does not give (no
    ``auth:``; a ``headers:`` token it refuses). The message quotes its
    ``WWW-Authenticate``. Nothing ran; a later try asks again (a token may be fixed)."""


class McpNotAuthorized(McpUnauthorized):
    """The server's OAuth (``auth:``, tools/mcp/auth.py) ended without a token: an admin
    has yet to authorize opsloop, or the authorization server refused (its words). Nothing
    ran; a later try asks again."""
