"""An MCP ``CallToolResult`` as the JSON-able value (or the error) a tool call gives back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types

from tools.errors import ToolError


def tool_output(
    result: types.CallToolResult, redact: Callable[[str], str] = lambda text: text
) -> dict[str, Any]:
    """``{"text": …, "structured": …, "attachments": […]}`` with the keys that apply.

    Text blocks are joined; structured content is kept as sent; images, audio and
    resources are summarised (kind, type, size, uri), never inlined: base64 in the
    model's context costs tokens and tells it nothing. Every string of it goes through
    ``redact`` first (the server's configured secrets: a server may echo its token),
    since what is returned is stored, shown to the model and posted to Slack.

    Raises ToolError with the server's text when the result is an error (``isError``).
    """
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if result.is_error:
        raise ToolError(redact("\n".join(texts).strip()) or "the MCP tool reported an error")
    return _redacted(_output(result, texts), redact)


def _output(result: types.CallToolResult, texts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if texts:
        out["text"] = "\n".join(texts)
    if result.structured_content is not None:
        out["structured"] = result.structured_content
    attachments = [
        _summary(block) for block in result.content if not isinstance(block, types.TextContent)
    ]
    if attachments:
        out["attachments"] = attachments
    return out


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, redact) for v in value]
    return value


def _summary(block: Any) -> dict[str, Any]:
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "bytes": len(block.data) * 3 // 4}
    if isinstance(block, types.ResourceLink):
        return {"type": "resource_link", "uri": block.uri, "name": block.name}
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        size = (
            len(res.text) if isinstance(res, types.TextResourceContents) else len(res.blob) * 3 // 4
        )
        return {"type": "resource", "uri": str(res.uri), "mime_type": res.mime_type, "bytes": size}
    return {"type": getattr(block, "type", "unknown")}
